"""Per-shard commit queue: concurrent chunk updates to one shard become one commit.

zarr writes the chunks of an array as many concurrent ``set()`` calls, each
of which returns only once its bytes are in the inner store. Each shard has
at most one commit in flight; updates arriving meanwhile gather in the
shard's next batch, which starts when the previous commit ends. So no update
can be lost to an interleaved read-modify-write, and a burst of writes to
one shard costs a few shard writes rather than one per chunk.

A batch that starts while other writers are about lingers briefly for more
updates to its shard, and stops lingering as soon as it covers the whole
shard, or as soon as every writer zarr can have in flight is waiting here
(``async.concurrency``): nothing more can arrive then, so the fullest batch
goes first. A lone write never lingers.

Batches are signalled with thread-safe futures, so writers on different
event loops (or threads) are ordered and merged just the same. A batch's
commit runs on the loop of the writer that opened it, unless writers on other
loops wait for it too: then in shardstore's lasting loop, so that the end of
the opener's loop (its ``asyncio.run`` cancels what is left) cuts nothing off.
A batch whose loop ends before its commit begins goes on there for such
writers, or fails its own. A synchronous
write made inside a running loop cannot wait for a batch that runs on that
loop: it raises :class:`~shardstore.errors.SyncCallError` instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias, TypeVar

from shardstore.sync_bridge import context_serving, refuse_to_wait, serving
from shardstore.tasks import lasting_loop, spawn
from shardstore.writing.updates import ShardUpdates, Update, merge_updates

__all__ = ["CommitQueue", "outcome"]


T = TypeVar("T")


async def outcome(future: concurrent.futures.Future[None] | asyncio.Future[None]) -> None:
    """Wait for a future (or task) that other waiters share, or that must outlive its
    caller: cancelling this waiter must not cancel the future itself
    (asyncio.wrap_future would), or every other writer of the shard would lose its
    write. A waiter cancelled meanwhile (a sibling write of its caller failed first)
    still takes the outcome when it comes, or asyncio would report an error that
    nobody retrieved."""
    waiter = asyncio.wrap_future(future)
    try:
        await asyncio.shield(waiter)
    except asyncio.CancelledError:
        waiter.add_done_callback(_retrieved)
        raise


def _retrieved(waiter: asyncio.Future[None]) -> None:
    if not waiter.cancelled():
        waiter.exception()  # (its own writers have it; here it is only marked as seen)


@dataclass(eq=False)
class _Batch(Generic[T]):
    target: T
    loop: asyncio.AbstractEventLoop
    updates: ShardUpdates = field(default_factory=dict)
    writers: int = 0
    done: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    grew: asyncio.Event | None = None
    waiting: Counter[asyncio.AbstractEventLoop] = field(default_factory=Counter)
    """Writers still waiting for ``done``, by their loop."""
    serving: set[asyncio.AbstractEventLoop] = field(default_factory=set)
    """The loops whose synchronous calls its writers serve (see sync_bridge): a commit
    moved to the lasting loop serves them all, so that it still refuses to wait on one."""

    def wake(self) -> None:
        """Tell a lingering batch it grew. Called outside the queue's lock, so the
        batch may have been committed since, and its loop closed: nothing lingers
        on a closed loop, so there is nobody to wake."""
        if self.grew is None:
            return
        if asyncio.get_running_loop() is self.loop:
            self.grew.set()
            return
        with contextlib.suppress(RuntimeError):  # "Event loop is closed"
            self.loop.call_soon_threadsafe(self.grew.set)


Commit: TypeAlias = Callable[[str, T, ShardUpdates], Awaitable[None]]
Ready: TypeAlias = Callable[[T, ShardUpdates], bool]


class CommitQueue(Generic[T]):
    """Serialises and merges commits per shard key.

    ``commit(key, target, updates)`` writes one shard; ``ready(target, updates)``
    says a batch cannot usefully grow (it covers the shard); ``slots()`` is how
    many writers a caller may have in flight at once; a batch that starts while
    others are about lingers up to ``linger_s`` for more updates (see above).
    """

    def __init__(
        self,
        commit: Commit[T],
        ready: Ready[T],
        slots: Callable[[], int],
        *,
        linger_s: float = 0.005,
    ) -> None:
        self._commit = commit
        self._ready = ready
        self._slots = slots
        self._linger_s = linger_s
        self._lock = threading.Lock()
        self._pending: dict[str, _Batch[T]] = {}
        self._tail: dict[str, _Batch[T]] = {}  # the shard's newest batch, until committed
        self._lingering: set[_Batch[T]] = set()
        self._busy = 0  # batches lingering, queued or committing
        self._committing = 0  # batches whose commit is under way

    async def submit(self, shard_key: str, target: T, updates: Mapping[int, list[Update]]) -> None:
        """Apply ``updates`` (position -> updates in order) to a shard; returns once committed."""
        loop = asyncio.get_running_loop()
        opened: tuple[_Batch[T], _Batch[T] | None] | None = None
        with self._lock:
            batch = self._pending.get(shard_key)
            if batch is None:
                previous = self._tail.get(shard_key)
                if previous is not None:
                    refuse_to_wait(previous.loop, shard_key, "the commit of an earlier write to its shard")
                batch = self._pending[shard_key] = _Batch(target, loop)
                self._tail[shard_key] = batch
                self._busy += 1
                opened = batch, previous
            else:
                refuse_to_wait(batch.loop, shard_key, "a pending write to its shard")
            batch.target = target
            batch.writers += 1
            batch.waiting[loop] += 1
            batch.serving.update(serving())
            merge_updates(batch.updates, updates)
            to_wake = [batch, *self._fullest_if_all_waiting()]
        if opened is not None:  # (outside the lock: an eager task factory runs its first step at once)
            self._start(shard_key, *opened)
        for b in to_wake:
            b.wake()
        try:
            await outcome(batch.done)
        finally:
            with self._lock:
                batch.waiting[loop] -= 1

    def reserve(self, shard_keys: Sequence[str]) -> tuple[list[str], Callable[[], None]]:
        """Reserve, for one commit made outside the queue, those of ``shard_keys`` that
        have no batch pending or committing here; a batch submitted to them later waits
        until ``release()`` (so a later write never lands before it). Returns the keys
        reserved and ``release``. The others must go through :meth:`submit`, behind
        what they wait for."""
        marker: _Batch[Any] = _Batch(None, asyncio.get_running_loop())
        with self._lock:
            free = [key for key in shard_keys if key not in self._tail]
            self._tail.update(dict.fromkeys(free, marker))

        def release() -> None:
            with self._lock:
                for key in free:
                    if self._tail.get(key) is marker:
                        del self._tail[key]
            if not marker.done.done():
                marker.done.set_result(None)

        return free, release

    def _fullest_if_all_waiting(self) -> list[_Batch[T]]:
        """The fullest lingering batch, once every writer a caller can have is waiting
        here and no commit under way will free any: nothing more can arrive."""
        if not self._lingering or self._committing:
            return []
        if sum(b.writers for b in self._pending.values()) < self._slots():
            return []
        return [max(self._lingering, key=lambda b: b.writers)]

    def _may_go(self, batch: _Batch[T]) -> bool:
        if self._ready(batch.target, batch.updates):
            return True
        if self._busy == 1 and batch.writers == 1:
            return True  # a lone write: nobody else is about to join
        return self._fullest_if_all_waiting()[:1] == [batch]

    async def _linger(self, batch: _Batch[T]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10 * self._linger_s
        with self._lock:
            self._lingering.add(batch)
        try:
            await asyncio.sleep(0)  # one loop turn: writers already under way join
            while True:
                with self._lock:
                    if self._may_go(batch):
                        return
                    batch.grew = asyncio.Event()
                timeout = min(self._linger_s, deadline - loop.time())
                if timeout <= 0:
                    return
                try:
                    await asyncio.wait_for(batch.grew.wait(), timeout)
                except TimeoutError:
                    if not self._committing:  # quiet, and no commit will release writers
                        return
        finally:
            with self._lock:
                self._lingering.discard(batch)

    def _start(
        self, shard_key: str, batch: _Batch[T], previous: _Batch[T] | None, resumed: bool = False
    ) -> None:
        """Run :meth:`_run` as a task of the running loop. A task cancelled before its
        first step (its loop ended at once) never runs its body: it is abandoned here."""
        began = False

        async def run() -> None:
            nonlocal began
            began = True
            await self._run(shard_key, batch, previous, resumed=resumed)

        def ended(task: asyncio.Task[None]) -> None:
            if not began:
                self._abandoned(shard_key, batch, previous)

        spawn(run()).add_done_callback(ended)

    async def _run(
        self, shard_key: str, batch: _Batch[T], previous: _Batch[T] | None, *, resumed: bool
    ) -> None:
        """Commit ``batch`` once ``previous`` is committed; a first batch lingers first,
        unless ``resumed`` in the lasting loop (see :meth:`_abandoned`). A commit that
        writers on another loop wait for is made in the lasting loop, whose end they
        need not fear; made here, it ends with this loop, as do all its writers."""
        try:
            if previous is not None:
                await _behind(previous)
            elif not resumed:
                await self._linger(batch)
        except asyncio.CancelledError:
            self._abandoned(shard_key, batch, previous)
            raise
        with self._lock:
            if self._pending.get(shard_key) is batch:
                del self._pending[shard_key]  # from now on, writers start the next batch
            heir = _heir(batch)
        if heir is None:
            await self._commit_and_tell(shard_key, batch, previous)
        else:
            heir.call_soon_threadsafe(
                lambda: spawn(self._commit_and_tell(shard_key, batch, previous)),
                context=context_serving(batch.serving),
            )

    async def _commit_and_tell(self, shard_key: str, batch: _Batch[T], previous: _Batch[T] | None) -> None:
        with self._lock:
            self._committing += 1
        try:
            await self._commit(shard_key, batch.target, batch.updates)
        except BaseException as exc:
            batch.done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            batch.done.set_result(None)
        finally:
            with self._lock:
                self._committing -= 1
            self._forget(shard_key, batch, previous)

    def _abandoned(self, shard_key: str, batch: _Batch[T], previous: _Batch[T] | None) -> None:
        """The loop running ``batch`` ended (its ``asyncio.run`` over) before the commit
        began. While a writer on another loop waits for it, it goes on in the lasting
        loop; otherwise it fails with CancelledError (its writers were all on this
        loop) and nobody joins it any more."""
        with self._lock:
            heir = _heir(batch)
            if heir is None:
                self._forget_locked(shard_key, batch, previous)  # (before done is set: see there)
        if heir is not None:
            heir.call_soon_threadsafe(
                lambda: self._start(shard_key, batch, previous, resumed=True),
                context=context_serving(batch.serving),
            )
            return
        batch.done.set_exception(asyncio.CancelledError())

    def _forget(self, shard_key: str, batch: _Batch[T], previous: _Batch[T] | None) -> None:
        with self._lock:
            self._forget_locked(shard_key, batch, previous)

    def _forget_locked(self, shard_key: str, batch: _Batch[T], previous: _Batch[T] | None) -> None:
        """``batch`` is over: the shard's next batch waits no more for it, but still for
        ``previous`` if this one ended first (so done before ``batch.done`` is set where
        ``previous`` may be under way, or a writer could slip in behind it alone)."""
        self._busy -= 1
        if self._pending.get(shard_key) is batch:
            del self._pending[shard_key]
        if self._tail.get(shard_key) is batch:
            if previous is not None and not previous.done.done():
                self._tail[shard_key] = previous
            else:
                del self._tail[shard_key]


def _heir(batch: _Batch[Any]) -> asyncio.AbstractEventLoop | None:
    """The lasting loop, where ``batch`` goes on from now on (it becomes its ``loop``,
    for refuse_to_wait), when a writer on another loop than the running one waits for
    it; None when none does, when running there already, or once exit has begun.
    Called under the queue's lock."""
    here = asyncio.get_running_loop()
    if not any(n > 0 for loop, n in batch.waiting.items() if loop is not here):
        return None
    heir = lasting_loop()
    if heir is None or heir is here:
        return None
    batch.loop = heir
    return heir


async def _behind(previous: _Batch[Any]) -> None:
    """Wait until the shard's previous batch is over, whatever its outcome (its own
    writers get its error), including the CancelledError of a batch whose loop ended,
    which is no cancellation of this one."""
    try:
        await outcome(previous.done)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
    except Exception:
        pass
