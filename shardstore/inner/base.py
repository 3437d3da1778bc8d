"""The interface every inner-store adapter implements, and what they share."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from shardstore.errors import InnerStoreError, ShardConflictError, ShardStoreError
from shardstore.inner.locks import process_lock
from shardstore.tasks import at_work, gather, handed_to_threads

T = TypeVar("T")

log = logging.getLogger(__name__)

AppendBuilder = Callable[[int, Callable[[int, int], bytes]], bytes | None]
UNCHANGED = b"<unchanged>"
"""Returned by an update's change function: leave the object as it is (compared by identity)."""
Change = Callable[[bytes | None], bytes | None]
"""An update's change: the old bytes (None: no object) to the new ones (None: delete
it). Where the store says ``Capabilities.writes_buffers``, the new value may also be
any buffer or a list of them: a wrapper that looks at it measures it with
:func:`written_nbytes` (or joins a list)."""
STALE = b"<stale>"
"""A versioned read of an object that has changed since (compared by identity)."""
NOT_MODIFIED = b"<not modified>"
"""A conditional read of an object still at the version the reader has (compared by identity)."""
DEFAULT_ATTEMPTS = 20
"""Conditional writes one update tries before giving up (``write_attempts``)."""
ANY_VERSION = "<any>"
"""A version that ``write_if`` does not check: the write replaces whatever is there."""
_TEMPORARY = re.compile(r"\..+\.(?:[0-9a-f]{32}\.partial|appending|lock)")


Written: TypeAlias = bytes | memoryview | list[bytes | memoryview]
"""A new value a change gives: bytes, or where the store says ``Capabilities.writes_buffers``
any buffer, or a list of them to write one after another."""


def written_nbytes(value: Written) -> int:
    """The bytes of a new value a change gives (a list: its pieces, one after another;
    see ``Capabilities.writes_buffers``)."""
    if isinstance(value, list):
        return sum(memoryview(piece).nbytes for piece in value)
    return memoryview(value).nbytes


def is_temporary(name: str) -> bool:
    """Whether a file name is one of our own temporary files beside objects in a
    directory (``.<name>.<uuid>.partial``, ``.<name>.appending``, ``.<name>.lock``):
    never a key."""
    return _TEMPORARY.fullmatch(name) is not None


@contextlib.contextmanager
def failure(op: str, key: str) -> Iterator[None]:
    """Turn a storage failure into an InnerStoreError naming the operation and key
    (our own errors, a damaged shard met on the way say so themselves).

    Cancelling or closing a coroutine is no failure: ``CancelledError``,
    ``GeneratorExit`` and ``KeyboardInterrupt`` pass through untouched, and so do
    they when the client library, interrupted by one of them, raised something else
    on the way out (aiohttp's "no running event loop" when an abandoned read is
    closed after its loop ended): the interruption is raised, not a store error.

    The running task counts as waiting on storage meanwhile (:func:`~shardstore.tasks.at_work`):
    a call zarr abandons is cancelled at exit rather than destroyed pending."""
    try:
        with at_work():
            yield
    except ShardStoreError:
        raise
    except Exception as exc:
        interrupted = _interruption(exc)
        if interrupted is not None:
            raise interrupted from None
        raise storage_error(op, key, exc) from exc


def storage_error(op: str, key: str, exc: Exception) -> InnerStoreError:
    """The error naming the operation and key that failed (``exc``: its cause)."""
    return InnerStoreError(f"inner store failed to {op} {key!r}: {type(exc).__name__}: {exc}")


_INTERRUPTIONS = (asyncio.CancelledError, GeneratorExit, KeyboardInterrupt)


def _interruption(exc: BaseException) -> BaseException | None:
    """The cancellation or close that ``exc`` was raised while handling, if any."""
    seen: set[int] = set()
    cause: BaseException | None = exc.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, _INTERRUPTIONS):
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return None


ChunkBytes: TypeAlias = bytes | memoryview
"""A chunk's bytes as read: a view into its shard where served from a whole shard."""

ReadInto: TypeAlias = Callable[[int], memoryview]
"""Writable memory of so many bytes to read an object into (see
:meth:`InnerStore.get_many_into`)."""

ReadThen: TypeAlias = Callable[[int, ChunkBytes | None, Hashable | None], None]
"""What takes each value of a batch read as soon as it is read: its place in the batch,
the value and its version (see :meth:`InnerStore.get_many_into`)."""


_Bytes = TypeVar("_Bytes", bytes, memoryview)


def slice_range(value: _Bytes, byte_range: ByteRequest | None) -> _Bytes:
    """Apply a byte request to a whole value (short data past the end, like zarr's stores)."""
    if byte_range is None:
        return value
    if isinstance(byte_range, RangeByteRequest):
        return value[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return value[byte_range.offset :]
    if isinstance(byte_range, SuffixByteRequest):
        return value[max(len(value) - byte_range.suffix, 0) :]
    raise TypeError(f"Unexpected byte_range, got {byte_range}")


def names_under(keys: Iterator[str] | list[str], prefix: str) -> list[str]:
    """First path segments below ``prefix`` (which is "" or ends with "/")."""
    return sorted({k[len(prefix) :].split("/", 1)[0] for k in keys if k.startswith(prefix) and k != prefix})


@dataclass(frozen=True)
class Capabilities:
    """What an inner store can do beyond get/set/delete/list; the read and write
    paths choose by these, never by the adapter's type."""

    remote: bool = False
    """Each request costs a network round trip (object stores, HTTP): then one
    whole-shard request beats several small ones."""
    versions: bool = False
    """Reads report, and can check, the version of the object read, cheaply and in
    the same request (:meth:`InnerStore.version`): the index cache validates itself
    for free."""
    versioned_ranges: bool = False
    """A range read can be checked against the version of the object its index was
    read from (local files by stat, S3 by If-Match). Elsewhere an index and a range
    read later may come from two different versions of a shard."""
    conditional_writes: bool = False
    """:meth:`InnerStore.write_if` checks the version: several processes may then
    write one object (S3 ``If-Match``); otherwise only this process's writers take
    turns."""
    append: bool = False
    """:meth:`InnerStore.append` adds bytes to an object in place, and suffix and
    whole reads see an append whole or not at all (never a torn tail)."""
    conditional_deletes: bool = False
    """``write_if(key, None, version)`` checks the version too (S3: ``If-Match`` on
    the DELETE)."""
    writes_buffers: bool = False
    """The new value a change gives :meth:`InnerStore.update` may be any contiguous
    bytes-like object (a ``memoryview``), or a list of them to write one after
    another (:func:`written_nbytes`), written as it is: a shard built in place, or
    an index and its chunks, then need no copy into one ``bytes`` (local files; S3
    copies them once into the body it sends). Elsewhere it is always ``bytes``."""
    hands_as_read: bool = False
    """:meth:`InnerStore.get_many_into` hands each value to ``then`` on a worker thread
    as soon as it is read, the call ending only once every ``then`` has. Local files
    are read by a thread per core (a batch of several) and each value handed on the
    thread that read it: work done there shares the cores and finds the object still
    in the CPU's cache. Object stores hand each response to a thread per core at most
    while the others are still awaited: the work is done during the round trips.
    Elsewhere ``then`` runs on the caller's thread once the batch is read."""
    changes_in_threads: bool = False
    """:meth:`InnerStore.update` and :meth:`InnerStore.update_many` call each change on
    a worker thread (local files: ``update_many`` shares its commits out over a thread
    per core and one more from the first big or slow one), so a change may do work
    that lets go of the GIL, a shard's
    encoding, right before its object is written (see
    :class:`~shardstore.writing.updates.ShardToBuild`). Elsewhere a change may run on
    the event loop's thread, and must be quick."""
    merged_by_key: bool = False
    """Writes here are merged with other writers' later, object by object, the last
    one winning (a forked Icechunk session and ``Session.merge``): nothing orders a
    read-modify-write against another writer of the object, so only writes that
    replace an object whole are safe (:meth:`InnerStore.update` without ``read_old``)."""
    changes_unseen: bool = False
    """What is stored here changes without a write through any store and without a
    version to tell it by (an Icechunk session: ``merge``, ``rebase`` and
    ``discard_changes`` replace what it serves): a shard cached by one zarr call is
    not served to the next, whose read-modify-write would put the old chunks back."""

    @property
    def ordered_deletes(self) -> bool:
        """A delete in :meth:`InnerStore.update` is ordered against other writers: by
        this process's locks (stores without conditional writes) or by a conditional
        delete. Elsewhere an update that empties a shard writes an empty shard
        instead, since an unchecked delete could remove another process's update
        made in between."""
        return self.conditional_deletes or not self.conditional_writes

    @property
    def in_memory(self) -> bool:
        """Neither remote nor able to check a range read's version: a range read could
        meet a newer shard than its index came from, while one whole read is one
        consistent snapshot and costs no more. Readers read such shards whole."""
        return not (self.versioned_ranges or self.remote)


async def backoff(attempt: int) -> None:
    """The pause before trying again what other writers got in the way of ``attempt``
    (from 0) times: jittered, doubling, at most half a second."""
    await asyncio.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))


class InnerStore(ABC):
    """The wrapped storage as seen by the sharding layer."""

    capabilities: Capabilities = Capabilities()
    """Set per adapter class, or per instance where it depends on the backend."""

    @property
    def read_only(self) -> bool:
        """The storage itself refuses writes (an Icechunk read-only session): the
        store over it is then read-only too, and says so naming the key."""
        return False

    @abstractmethod
    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None: ...

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        """Several reads in one batch; adapters with a batched range API override this."""
        return list(await gather(*(self.get(k, r) for k, r in requests)))

    @abstractmethod
    async def set(self, key: str, value: bytes) -> None: ...

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""

    @abstractmethod
    async def getsize(self, key: str) -> int | None: ...

    async def exists(self, key: str) -> bool:
        return await self.getsize(key) is not None

    @abstractmethod
    def list_prefix(self, prefix: str) -> AsyncIterator[str]: ...

    @abstractmethod
    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        """Names directly below ``prefix`` ("" or ending in "/") that hold at least one key."""

    async def temporary_files(self, prefix: str) -> list[str]:
        """Our own hidden files under ``prefix``, by key (see :func:`is_temporary`), so
        that maintenance can report what crashed writers left: none on most stores."""
        return []

    async def update(
        self, key: str, change: Change, *, read_old: bool = True, attempts: int = DEFAULT_ATTEMPTS
    ) -> None:
        """Read-modify-write one object, never losing another writer's update.

        ``change(old)`` returns the new bytes, None to delete, or ``UNCHANGED``;
        it may be called again with newer bytes, so it must be pure. Without
        ``read_old`` it gets None and its result replaces the object whatever
        it holds. Writers in this process take turns on the object; another
        process's write between our read and our write is a conflict: the
        object is re-read and ``change`` re-applied, up to ``attempts`` times
        with jittered backoff, then :class:`ShardConflictError`. Stores that
        cannot see such a write (no conditional write) are for one writing
        process per object."""
        async with process_lock(self.lock_scope, key):
            for attempt in range(attempts):
                old, version = await self.read_for_update(key) if read_old else (None, ANY_VERSION)
                new = change(old)
                if new is UNCHANGED or (new is None and old is None and read_old):
                    return
                if await self.write_if(key, new, version):
                    return
                log.debug(
                    "update %r: another writer got there first (attempt %d/%d)", key, attempt + 1, attempts
                )
                await backoff(attempt)
        log.warning("update %r: gave up after %d conflicting attempts", key, attempts)
        raise ShardConflictError(
            f"{key!r} was changed by other writers during each of {attempts} attempts to update it; "
            "this update was not applied and the object holds the other writers' data"
        )

    @property
    def lock_scope(self) -> Hashable:
        """Names the storage location, so store instances over it share locks."""
        return repr(self)

    async def update_many(
        self,
        changes: Sequence[tuple[str, Change]],
        *,
        read_old: bool = True,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> list[Exception | None]:
        """:meth:`update` of several objects, each on its own terms, concurrently: what
        each one raised (a ShardStoreError naming its key; None: done), every one
        settled when this returns. Adapters for which one call for many is cheaper
        override it (a local directory: a thread hop per core, not per object). Nothing
        of ``changes`` is kept once this returns: the caller lets go of them then, and
        the memory of the values they gave is used again."""

        async def one(key: str, change: Change) -> Exception | None:
            try:
                with failure("update", key):
                    await self.update(key, change, read_old=read_old, attempts=attempts)
            except Exception as exc:
                return exc
            return None

        return await gather(*(one(key, change) for key, change in changes))

    async def read_for_update(self, key: str) -> tuple[bytes | None, Hashable]:
        """The object's bytes and a version that :meth:`write_if` can check."""
        return await self.get(key), ANY_VERSION

    async def write_if(self, key: str, value: bytes | None, version: Hashable) -> bool:
        """Write (None: delete) unless the object is no longer at ``version`` (then
        False, nothing written). Without conditional writes: write, True."""
        if value is None:
            await self.delete(key)
        else:
            await self.set(key, value)
        return True

    def version(self, key: str) -> Hashable | None:
        """The object's current version, cheaply (None: absent). Only stores with the
        ``versions`` capability implement it."""
        raise NotImplementedError(f"{type(self).__name__} cannot tell versions")

    async def get_many_if_modified(
        self, requests: Sequence[tuple[str, Hashable]]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        """Whole objects, each unless it is still at the version given (then
        ``NOT_MODIFIED``, nothing downloaded). Without conditional reads: whole reads."""
        return await self.get_many_versioned([(key, None) for key, _ in requests], [None] * len(requests))

    def object_size(self, version: Hashable | None) -> int | None:
        """The object's size as a version read with it tells (None: it does not), so
        that an index can be checked against it before its ranges are requested."""
        return None

    async def get_many_versioned(
        self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        """Reads with each object's version; where ``expected`` is given and the object
        is at another version, that read returns ``STALE`` and reads nothing."""
        return [(value, None) for value in await self.get_many(requests)]

    async def get_many_into(
        self,
        requests: Sequence[tuple[str, ByteRequest | None]],
        expected: Sequence[Hashable | None],
        into: ReadInto,
        then: ReadThen | None = None,
    ) -> list[tuple[ChunkBytes | None, Hashable | None]]:
        """:meth:`get_many_versioned`; a store that reads into memory it is given
        (local files) reads each value into ``into(size)`` and returns that, so that a
        caller reading many objects in turn can give the same memory again rather
        than have new memory faulted in for each. With ``then``, each value goes to
        ``then(k, value, version)`` instead, as soon as it is read where the store
        ``hands_as_read``, and the list holds ``(None, version)``: nothing holds
        the memory a value was read into once ``then`` is done with it."""
        got: list[tuple[ChunkBytes | None, Hashable | None]] = list(
            await self.get_many_versioned(requests, expected)
        )
        return got if then is None else _handed(got, then)

    async def append(self, key: str, build: AppendBuilder) -> bool:
        """Append ``build(size, read)`` to an existing object, holding it exclusively.

        ``build`` gets the object's size and a ``read(start, stop)`` function and
        returns the bytes to append (None: nothing). Returns False, doing nothing,
        if there is no such object. Only stores that can append implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot append")


def _handed(
    got: list[tuple[ChunkBytes | None, Hashable | None]], then: ReadThen
) -> list[tuple[ChunkBytes | None, Hashable | None]]:
    """Each value of a batch read handed to ``then``, in order; the versions kept."""
    for k, read in enumerate(got):
        took(got, k, read, then)
    return got


def took(
    got: list[tuple[ChunkBytes | None, Hashable | None]],
    k: int,
    read: tuple[ChunkBytes | None, Hashable | None],
    then: ReadThen | None,
) -> None:
    """The ``k``-th read of a batch kept in ``got``, or handed to ``then`` (its version
    kept): see :meth:`InnerStore.get_many_into`."""
    if then is None:
        got[k] = read
        return
    got[k] = (None, read[1])
    then(k, *read)


def handing_as_read(store: InnerStore, capabilities: Capabilities, reads: Callable[..., Any]) -> Capabilities:
    """``capabilities`` of ``store``, without ``hands_as_read`` where its class's
    ``get_many_versioned`` is not ``reads`` (a subclass that adds faults or delays): its
    ``get_many_into`` reads through that, and hands values on after the batch."""
    if type(store).get_many_versioned is reads:
        return capabilities
    return dataclasses.replace(capabilities, hands_as_read=False)


CONDITIONAL = Capabilities(
    remote=True, versioned_ranges=True, conditional_writes=True, conditional_deletes=True, hands_as_read=True
)
"""What an object store with conditional writes, deletes and reads offers (S3, GCS, Azure)."""

_IN_FLIGHT = 64
"""Requests of one batch in flight at once (as s3fs bounds its own ``cat_ranges``)."""


async def bounded(requests: Iterable[Awaitable[T]]) -> list[T]:
    """The results of ``requests``, at most ``_IN_FLIGHT`` of them under way at once."""
    gate = asyncio.Semaphore(_IN_FLIGHT)

    async def gated(request: Awaitable[T]) -> T:
        async with gate:
            return await request

    return list(await gather(*(gated(r) for r in requests)))


class VersionedReads(InnerStore):
    """The reads of an adapter whose one read, ``_get_tagged``, returns the object's
    version with its bytes and takes the conditions: ``expected`` (refused: STALE,
    nothing read) and ``unless`` (unchanged: NOT_MODIFIED). Batches run at most 64
    reads at once; the read for an update is one such read."""

    @abstractmethod
    async def _get_tagged(
        self, key: str, byte_range: ByteRequest | None, expected: Hashable | None, unless: Hashable = None
    ) -> tuple[bytes | None, Hashable | None]: ...

    async def get_many_versioned(
        self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        """A chunk range located by an index read earlier is refused (STALE) if the shard
        was replaced since, rather than read from the new object."""
        return await bounded(self._get_tagged(k, r, e) for (k, r), e in zip(requests, expected, strict=True))

    async def get_many_into(
        self,
        requests: Sequence[tuple[str, ByteRequest | None]],
        expected: Sequence[Hashable | None],
        into: ReadInto,
        then: ReadThen | None = None,
    ) -> list[tuple[ChunkBytes | None, Hashable | None]]:
        if then is None or type(self).get_many_versioned is not VersionedReads.get_many_versioned:
            # (a subclass that changes reads, faults or delays, sees these too)
            return await super().get_many_into(requests, expected, into, then)
        got: list[tuple[ChunkBytes | None, Hashable | None]] = [(None, None)] * len(requests)

        def handed(read: tuple[int, ChunkBytes | None, Hashable | None]) -> None:
            then(*read)

        async with handed_to_threads(handed) as hand:

            async def read(k: int) -> None:
                key, byte_range = requests[k]
                value, version = await self._get_tagged(key, byte_range, expected[k])
                got[k] = (None, version)
                hand((k, value, version))

            await bounded(read(k) for k in range(len(requests)))
        return got

    async def get_many_if_modified(
        self, requests: Sequence[tuple[str, Hashable]]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        return await bounded(self._get_tagged(k, None, None, unless=v) for k, v in requests)

    async def read_for_update(self, key: str) -> tuple[bytes | None, Hashable]:
        return await self._get_tagged(key, None, None)


class TaggedReadsOnly(VersionedReads):
    """Plain reads through ``_get_tagged`` too (where the client library's own reads
    fall short: adlfs on empty blobs; obstore has no other)."""

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        value, _ = await self._get_tagged(key, byte_range, None)
        return value

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        return [v for v, _ in await bounded(self._get_tagged(k, r, None) for k, r in requests)]
