"""The interface every inner-store adapter implements, and what they share."""

from __future__ import annotations

import asyncio
import contextlib
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Sequence

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from shardstore.errors import InnerStoreError

AppendBuilder = Callable[[int, Callable[[int, int], bytes]], bytes | None]
UNCHANGED = b"<unchanged>"
"""Returned by an update's change function: leave the object as it is (compared by identity)."""
Change = Callable[[bytes | None], bytes | None]
STALE = b"<stale>"
"""A versioned read of an object that has changed since (compared by identity)."""
_TEMPORARY = re.compile(r"\..+\.(?:[0-9a-f]{32}\.partial|appending)")


def is_temporary(name: str) -> bool:
    """Whether a file name is one of our own temporary files beside objects in a
    directory (``.<name>.<uuid>.partial``, ``.<name>.appending``): never a key."""
    return _TEMPORARY.fullmatch(name) is not None


@contextlib.contextmanager
def failure(op: str, key: str) -> Iterator[None]:
    """Turn a storage failure into an InnerStoreError naming the operation and key."""
    try:
        yield
    except InnerStoreError:
        raise
    except Exception as exc:
        raise InnerStoreError(f"inner store failed to {op} {key!r}: {type(exc).__name__}: {exc}") from exc


def slice_range(value: bytes, byte_range: ByteRequest | None) -> bytes:
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


class InnerStore(ABC):
    """The wrapped storage as seen by the sharding layer."""

    @abstractmethod
    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None: ...

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        """Several reads in one batch; adapters with a batched range API override this."""
        return list(await asyncio.gather(*(self.get(k, r) for k, r in requests)))

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

    async def update(self, key: str, change: Change) -> None:
        """Read-modify-write one object: ``change(old)`` returns the new bytes, None to
        delete, or ``UNCHANGED``. Adapters that can do it in one step override this."""
        old = await self.get(key)
        new = change(old)
        if new is None:
            if old is not None:
                await self.delete(key)
        elif new is not UNCHANGED:
            await self.set(key, new)

    remote = False
    """Whether each request costs a network round trip (object stores, HTTP): then
    one whole-shard request beats several small ones."""

    supports_versions = False
    """Whether reads can report, and check, the version of the object read (cheaply,
    in the same request): what lets the index cache validate itself for free."""

    def version(self, key: str) -> Hashable | None:
        """The object's current version, cheaply (None: absent). Only stores that
        ``supports_versions`` implement it."""
        raise NotImplementedError(f"{type(self).__name__} cannot tell versions")

    async def get_many_versioned(
        self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        """Reads with each object's version; where ``expected`` is given and the object
        is at another version, that read returns ``STALE`` and reads nothing."""
        return [(value, None) for value in await self.get_many(requests)]

    supports_append = False

    async def append(self, key: str, build: AppendBuilder) -> bool:
        """Append ``build(size, read)`` to an existing object, holding it exclusively.

        ``build`` gets the object's size and a ``read(start, stop)`` function and
        returns the bytes to append (None: nothing). Returns False, doing nothing,
        if there is no such object. Only stores that can append implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot append")
