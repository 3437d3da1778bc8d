"""The write path: chunk updates become shard commits, by the chosen strategy.

``rewrite`` (the default) writes every commit as one compact shard object:
read the old shard (unless the updates cover it), merge, write. ``append``
(for inner stores that can append, i.e. local files) writes only the new
chunk bytes and a new index at the end of the shard, leaving the old bytes
dead until :func:`shardstore.maintenance.compact`. Either way a commit is
all-or-nothing: the previous shard stays readable if it fails.

Commits go through a :class:`~shardstore.writing.commit_queue.CommitQueue` (one in flight
per shard, concurrent updates merged); inside ``store.batch()`` they are
first held in a :class:`~shardstore.writing.batch_buffer.WriteBuffer`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeAlias, TypeVar, cast

import zarr
from zarr.core.sync import sync

from shardstore.addressing import ChunkAddress, ShardAddress
from shardstore.choices import WriteStrategy
from shardstore.errors import BatchCommitError, PartialShardWriteError, ShardStoreError
from shardstore.formats.base import EMPTIED, Change
from shardstore.inner import InnerStore
from shardstore.inner.base import DEFAULT_ATTEMPTS, failure
from shardstore.inner.base import Change as ObjectChange
from shardstore.tasks import gather, spawn
from shardstore.writing.batch_buffer import Held, WriteBuffer
from shardstore.writing.commit_queue import CommitQueue, outcome
from shardstore.writing.updates import (
    BuiltShard,
    ShardToBuild,
    ShardUpdates,
    Update,
    apply_updates,
    covers_shard,
    independent_of_old,
    rebuilt_pieces,
    rebuilt_shard,
    replaces_shard,
)

__all__ = ["DEFAULT_BATCH_BYTES", "BatchScope", "ShardChanges", "ShardWriter"]

log = logging.getLogger(__name__)

DEFAULT_BATCH_BYTES = 512 * 2**20

ShardChanges: TypeAlias = ShardUpdates | BuiltShard | ShardToBuild
"""What a write gives one shard: updates to its chunks, or the shard built whole, or to
build (see :class:`ShardToBuild`)."""


def _zarr_slots() -> int:
    """How many chunk writes one zarr operation has in flight at once."""
    return int(zarr.config.get("async.concurrency") or 10)


@dataclass(frozen=True)
class _Job:
    shard: ShardAddress
    compact: bool = False


def _deleted(old: bytes | None) -> None:
    return None


def _built(blob: memoryview, as_bytes: bool, old: bytes | None) -> bytes:
    """A shard built whole (:class:`BuiltShard`), as the inner store takes it: as it
    is where the store writes any buffer (``Capabilities.writes_buffers``)."""
    return bytes(blob) if as_bytes else cast(bytes, blob)


def _rebuilt(
    shard: ShardAddress, updates: ShardUpdates, keep_empty: bool, as_pieces: bool, old: bytes | None
) -> bytes | None:
    """:func:`rebuilt_shard`, as the inner store takes it: as pieces, not joined, where
    the store writes any buffers (``Capabilities.writes_buffers``)."""
    fmt, key = shard.shard_format, shard.key
    if as_pieces:
        return cast(bytes | None, rebuilt_pieces(fmt, key, old, updates, keep_empty=keep_empty))
    return rebuilt_shard(fmt, key, old, updates, keep_empty=keep_empty)


class _EncodingFailed(ShardStoreError):
    """What a shard's encoding in its commit raised (``error``), carried past the inner
    store's wrapping of its own failures, to be raised as it is, as it would be by an
    encoding before the commit."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _built_now(
    shard: ShardAddress, build: ShardToBuild, keep_empty: bool, as_is: bool, old: bytes | None
) -> bytes | None:
    """A shard encoded by its commit (:class:`ShardToBuild`), as :func:`_built` or
    :func:`_rebuilt` gives it."""
    try:
        built = build.updates()
    except Exception as exc:
        raise _EncodingFailed(exc) from exc
    if isinstance(built, BuiltShard):
        return _built(built.blob, not as_is, old)
    return _rebuilt(shard, built, keep_empty, as_is, old)


def _cut_off(shard_key: str) -> ShardStoreError:
    """What a batch reports for a shard whose commit was cancelled with its event loop."""
    return ShardStoreError(
        f"{shard_key!r}: its commit was cancelled with the event loop it ran on (that loop's "
        "asyncio.run ended first); the shard holds its previous contents or the batch's writes "
        "to it, whole"
    )


def _describe(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


R = TypeVar("R")


class BatchScope(Generic[R]):
    """``with store.batch():`` / ``async with store.batch():``: ``writer`` buffers
    up to ``max_bytes`` until the block ends; entering gives ``result``."""

    def __init__(self, writer: ShardWriter, max_bytes: int, result: R) -> None:
        self._writer = writer
        self._max_bytes = max_bytes
        self._result = result

    def __enter__(self) -> R:
        self._writer.begin_batch(self._max_bytes)
        return self._result

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        sync(self._writer.end_batch(exc))

    async def __aenter__(self) -> R:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._writer.end_batch(exc)


class ShardWriter:
    """Turns chunk updates into shard commits on ``inner``: by ``strategy``, each
    commit tried up to ``attempts`` times against other writers, ``on_commit(key)``
    told of every shard key committed to (or attempted), so readers drop it."""

    def __init__(
        self,
        inner: InnerStore,
        strategy: WriteStrategy,
        on_commit: Callable[[str], None],
        attempts: int = DEFAULT_ATTEMPTS,
        confirm_place: Callable[[ShardAddress], Awaitable[None]] | None = None,
    ) -> None:
        self._inner = inner
        self._confirm_place = confirm_place
        """Raises StaleArrayError if the array's stored metadata no longer keeps its
        chunk ids where ``shard`` does: asked before each commit to a shard keyed by
        chunk ids (a renumbering resize elsewhere moves them)."""
        self.strategy: WriteStrategy = strategy if inner.capabilities.append else "rewrite"
        """The strategy in effect: "append" only where the inner store can append."""
        self._attempts = attempts  # conditional writes of one commit before ShardConflictError
        self._on_commit = on_commit  # told of every shard key committed to (or attempted)
        self._queue: CommitQueue[_Job] = CommitQueue(
            self._commit, lambda job, updates: covers_shard(job.shard, updates), _zarr_slots
        )
        self._lock = threading.Lock()
        self._buffer: WriteBuffer[_Job] | None = None
        self._depth = 0

    # -- writing ------------------------------------------------------------------

    async def write(self, shard: ShardAddress, updates: ShardUpdates) -> None:
        """Apply updates to one shard: committed before returning, or buffered in a batch."""
        buffer = self._buffer
        due = None if buffer is None else buffer.add(shard.key, _Job(shard), updates)
        if buffer is None or due is None:
            await self._queue.submit(shard.key, _Job(shard), updates)
            return
        for held in due:
            self._start(buffer, held)
        while buffer.nbytes > buffer.max_bytes and (flying := buffer.in_flight()):
            await _first_settled(flying)

    async def compact(self, shard: ShardAddress) -> None:
        """Rewrite a shard compactly, whatever the strategy (drops dead bytes)."""
        await self._queue.submit(shard.key, _Job(shard, compact=True), {})

    async def delete_shard(self, shard_key: str) -> None:
        """Delete a whole shard without reading it, ordered against its other writers."""
        try:
            await self._inner.update(shard_key, _deleted, read_old=False, attempts=self._attempts)
        finally:
            self._on_commit(shard_key)

    async def write_all(self, by_shard: Mapping[str, tuple[ShardAddress, ShardChanges]]) -> None:
        """Updates to several shards (or shards built whole, or to build), one commit
        each, concurrently. Outside a batch the shards the updates replace whole, and
        that no commit of this store is pending for, are committed together
        (:meth:`_replace_all`); the others go through the commit queue, behind what
        is pending (a shard to build built first, on a worker thread)."""
        whole = (
            []
            if self._buffer is not None
            else [
                s.key
                for s, ups in by_shard.values()
                if isinstance(ups, BuiltShard | ShardToBuild) or self._replaced(s, ups)
            ]
        )
        free, release = self._queue.reserve(whole)
        reserved = set(free)
        together = [by_shard[key] for key in free]
        queued = [self._queued(shard, ups) for key, (shard, ups) in by_shard.items() if key not in reserved]
        await gather(*([self._replace_all(together, release)] if together else []), *queued)

    async def _queued(self, shard: ShardAddress, ups: ShardChanges) -> None:
        if isinstance(ups, ShardToBuild):
            ups = await asyncio.to_thread(ups.updates)
        await self.write(shard, ups.updates() if isinstance(ups, BuiltShard) else ups)

    def _replaced(self, shard: ShardAddress, updates: ShardUpdates) -> bool:
        """Whether updates decide every chunk of the shard and leave it one, or the inner
        store orders deletes (elsewhere a shard emptied is read, then kept empty: see
        ``Capabilities.ordered_deletes``)."""
        return replaces_shard(shard, updates) and (
            self._inner.capabilities.ordered_deletes or any(ups[-1] is not None for ups in updates.values())
        )

    def pending(self, chunk: ChunkAddress) -> list[Update] | None:
        """Buffered updates to a chunk that are not in the inner store yet."""
        buffer = self._buffer
        return None if buffer is None else buffer.updates_for(chunk.shard.key, chunk.position)

    @property
    def buffering(self) -> bool:
        """Whether a ``batch()`` is open: reads must then see what it holds (:meth:`pending`)."""
        return self._buffer is not None

    def batch(self, max_bytes: int, result: R) -> BatchScope[R]:
        """A ``with`` / ``async with`` block whose writes are buffered (see
        :meth:`~shardstore.store.ShardingStore.batch`); entering it gives ``result``."""
        return BatchScope(self, max_bytes, result)

    # -- batches ------------------------------------------------------------------

    def begin_batch(self, max_bytes: int) -> None:
        with self._lock:
            if self._depth == 0:
                self._buffer = WriteBuffer(max_bytes, lambda job, updates: covers_shard(job.shard, updates))
            self._depth += 1

    async def end_batch(self, error: BaseException | None) -> None:
        """Commit what the batch holds (or, after an error, drop it and say what)."""
        with self._lock:
            self._depth -= 1
            if self._depth > 0 or self._buffer is None:
                return
            buffer = self._buffer
        try:
            dropped: list[Held[_Job]] = []
            if error is None:
                for held in buffer.take_all():
                    self._start(buffer, held)
            else:
                dropped = buffer.discard_open()
            await self._settle(buffer)
        finally:
            with self._lock:
                if self._depth == 0:
                    self._buffer = None
                    buffer.close()
        if error is not None and dropped:
            intact = [h.shard_key for h in dropped if h.shard_key not in buffer.committed]
            earlier = [h.shard_key for h in dropped if h.shard_key in buffer.committed]
            said = [
                f"{len(keys)} shard(s) {what}: {_describe(keys)}"
                for keys, what in (
                    (intact, "with buffered writes were not written, their previous contents are intact"),
                    (
                        earlier,
                        "were committed earlier in the block (each once the batch held all its chunks, "
                        "or past its byte limit); their writes since were not written",
                    ),
                )
                if keys
            ]
            note = f"shardstore: the batch ended with an error; {'; '.join(said)}"
            error.add_note(note)
            log.warning(note)
        if buffer.failures:
            failed = {held.shard_key: exc for held, exc in buffer.failures}

            def summary(others: str) -> str:
                return (
                    f"{len(failed)} shard(s) of the batch could not be committed (each holds its "
                    f"previous contents, whole, unless its error says otherwise{others}): "
                    f"{_describe(list(failed))}; first error: {buffer.failures[0][1]}"
                )

            if error is not None:  # the block's own error goes on, this said on it
                error.add_note(f"shardstore: also, {summary('')}")
                return
            first = buffer.failures[0][1]
            raise BatchCommitError(summary("; every other shard was written"), failed) from first

    async def drain(self) -> None:
        """Commit everything a batch holds now (before a listing, say); the batch stays open."""
        buffer = self._buffer
        if buffer is None or buffer.empty:
            return
        for held in buffer.take_all():
            self._start(buffer, held)
        await self._settle(buffer)

    def _start(self, buffer: WriteBuffer[_Job], held: Held[_Job]) -> None:
        """Commit a shard the batch held, as a task of the running loop. However it ends,
        even cancelled with its loop (before its first step, too), the batch hears of
        it: its end waits for every shard it started."""

        def ended(task: asyncio.Task[None]) -> None:
            buffer.finished(held, _cut_off(held.shard_key) if task.cancelled() else task.exception())

        spawn(self._queue.submit(held.shard_key, held.target, held.updates)).add_done_callback(ended)

    @staticmethod
    async def _settle(buffer: WriteBuffer[_Job]) -> None:
        while flying := buffer.in_flight():
            for future in flying:
                with contextlib.suppress(Exception):  # recorded in buffer.failures
                    await outcome(future)

    # -- commits ------------------------------------------------------------------

    async def _commit(self, shard_key: str, job: _Job, updates: ShardUpdates) -> None:
        log.debug("commit %r: %d chunk(s)%s", shard_key, len(updates), " (compact)" if job.compact else "")
        try:
            with failure("commit", shard_key):  # an inner store of the user's own may raise anything
                await self._commit_by_strategy(job, updates)
        except Exception as exc:
            log.debug("commit %r failed: %s", shard_key, exc)
            raise
        finally:
            self._on_commit(shard_key)

    def _replace_all(
        self, shards: list[tuple[ShardAddress, ShardChanges]], release: Callable[[], None]
    ) -> Awaitable[None]:
        """Commit shards whose every chunk the updates decide, in one
        :meth:`InnerStore.update_many`: nothing to read, merge or append, so no turn in
        the commit queue either. The queue holds them reserved until the commit has
        ended (``release``), so that a later write of this store waits for it; the
        inner store orders it against every other writer, as it does a queued commit.
        Like a queued commit, it goes on if the caller is cancelled: it is started
        here, not by a coroutine that a cancelled caller might never begin (its
        reservation would never be released), and the shards it is to encode are told
        so (:meth:`ShardToBuild.handed`)."""
        task = spawn(self._commit_replaced(shards))
        task.add_done_callback(lambda _: release())  # (also if the task never ran)
        for _, ups in shards:
            if isinstance(ups, ShardToBuild):
                ups.handed()
        return outcome(task)

    async def _commit_replaced(self, shards: list[tuple[ShardAddress, ShardChanges]]) -> None:
        if log.isEnabledFor(logging.DEBUG):
            for shard, ups in shards:
                what = (
                    "built whole"
                    if isinstance(ups, BuiltShard)
                    else "built by its commit"
                    if isinstance(ups, ShardToBuild)
                    else f"{len(ups)} chunk(s), replaced whole"
                )
                log.debug("commit %r: %s", shard.key, what)
        keep_empty = not self._inner.capabilities.ordered_deletes
        as_is = self._inner.capabilities.writes_buffers
        changes: list[tuple[str, ObjectChange]] = [
            (
                shard.key,
                functools.partial(_built, ups.blob, not as_is)
                if isinstance(ups, BuiltShard)
                else functools.partial(_built_now, shard, ups, keep_empty, as_is)
                if isinstance(ups, ShardToBuild)
                else functools.partial(_rebuilt, shard, ups, keep_empty, as_is),
            )
            for shard, ups in shards
        ]
        try:
            errors = await self._inner.update_many(changes, read_old=False, attempts=self._attempts)
            # let go of the shards now, not when a worker thread that held them does:
            # a write's later groups are built in their memory (see ShardBuffers)
            changes.clear()
        finally:
            for shard, _ in shards:
                self._on_commit(shard.key)
        failed = [exc.error if isinstance(exc, _EncodingFailed) else exc for exc in errors if exc is not None]
        if failed:
            for other in failed[1:]:
                failed[0].add_note(f"also failed at the same time: {type(other).__name__}: {other}")
            raise failed[0]

    async def _commit_by_strategy(self, job: _Job, updates: ShardUpdates) -> None:
        shard = job.shard
        if self._inner.capabilities.merged_by_key:
            _refuse_unless_replaced(self._inner, job, updates)
            await self._rewrite(shard, updates, read_old=False)
            return
        whole = covers_shard(shard, updates)  # every chunk new: the old shard need not be read
        appendable = (
            self.strategy == "append"
            and not job.compact
            and shard.shard_format.appendable
            and not whole  # a whole new shard is written compact
        )
        if not appendable or not await self._append(shard, updates):
            await self._rewrite(shard, updates, read_old=not whole)

    async def _rewrite(self, shard: ShardAddress, updates: ShardUpdates, *, read_old: bool) -> None:
        """One compact object for the whole shard, from the old one (``read_old``) or, where
        the updates cover the shard, from the updates alone."""
        if shard.shard_format.places_follow_grid and self._confirm_place is not None:
            await self._confirm_place(shard)  # chunk ids: the array may have been renumbered elsewhere

        capabilities = self._inner.capabilities
        change = functools.partial(
            _rebuilt, shard, updates, not capabilities.ordered_deletes, capabilities.writes_buffers
        )
        # Either way the inner store orders this against other writers of the shard
        # (locks, conditional writes).
        await self._inner.update(shard.key, change, read_old=read_old, attempts=self._attempts)

    async def _append(self, shard: ShardAddress, updates: ShardUpdates) -> bool:
        """New chunk bytes and a new index after the old ones; False if there is no shard yet."""
        changes: dict[int, Change] = {
            pos: (not independent_of_old(ups), functools.partial(apply_updates, updates=ups))
            for pos, ups in updates.items()
        }
        emptied = False

        def build(size: int, read: Any) -> bytes | None:
            nonlocal emptied
            added = shard.shard_format.append_after(size, read, changes, shard.key)
            emptied = added is EMPTIED
            return None if emptied else added

        if not await self._inner.append(shard.key, build):
            return False
        if emptied:  # deleted under the same lock as any rewrite, re-reading the shard
            await self._rewrite(shard, updates, read_old=True)
        return True


def _refuse_unless_replaced(inner: InnerStore, job: _Job, updates: ShardUpdates) -> None:
    """Where writes are merged object by object later (an Icechunk fork), refuse a
    commit that would keep any chunk of the old shard: merged over another writer's
    version of the shard, those old chunks would replace that writer's new ones."""
    shard = job.shard
    if not job.compact and replaces_shard(shard, updates, cut_by_edge=True):
        return
    places = shard.places_in_grid()
    block = shard.shard_format.grid_block
    if job.compact:
        what = "compacting it would rewrite chunks that other writers may have replaced"
    elif places is None:
        what = "this format spreads a shard's chunks over the array, so no write covers a shard"
    else:
        decided = sum(1 for pos in places if independent_of_old(updates.get(pos) or []))
        what = (
            f"this write decides {decided} of the {len(places)} chunks it holds, and keeps the rest as read"
        )
    align = (
        f"regions aligned to the shard grid ({block} chunks per shard; shardstore.rechunk_to_shards "
        "gives dask and xarray such blocks), a shard's chunks in one call or in one store.batch(); or "
        if block is not None
        else ""
    )
    raise PartialShardWriteError(
        f"shard {shard.key!r} of array {shard.info.path!r} was not written through {inner!r}: {what}. "
        "Icechunk merges forks object by object, so this shard would replace the chunks any other "
        f"fork writes to it. Write whole shards from each fork: {align}write this array from the "
        "session itself, on threads"
    )


async def _first_settled(futures: list[concurrent.futures.Future[None]]) -> None:
    """Wait until one of the commits ``futures`` has settled, however (its own writers
    get its outcome); the waits on the others end here, their outcomes retrieved."""
    waits = [asyncio.ensure_future(outcome(f)) for f in futures]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()  # (the commits go on: outcome() shields them)
        await asyncio.gather(*waits, return_exceptions=True)
