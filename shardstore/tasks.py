"""Structured concurrency: every coroutine a call starts has ended when the call
returns or raises, and nothing shardstore runs outlives the interpreter's exit.

``asyncio.gather`` leaves the other awaitables running (or, for coroutines not
yet started, suspended) when one fails: they finish later, or are closed when
garbage-collected, perhaps after their event loop has ended, which prints
"Task was destroyed but it is pending!" or a store error about a loop that is
gone. :func:`gather` cancels them and waits for them instead, then raises the
first error, with what the others raised as notes.

Calls zarr abandons are another matter: zarr gathers several metadata reads,
raises the first error and leaves the others running on its I/O loop, which it
stops and closes at exit. So shardstore keeps two records: the background tasks
it starts (:func:`spawn`: coalesced reads, shard commits) and the tasks waiting
on storage (:func:`at_work`, entered by every inner operation). At exit, before
zarr's loop stops, :func:`settle` cancels what is still in flight on each loop
that still runs and waits for it to end; then the steps given to
:func:`run_at_exit` run (closing HTTP sessions on their loops).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import functools
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, Generic, TypeVar

from shardstore.cores import available_cores

__all__ = [
    "at_work",
    "gather",
    "handed_to_threads",
    "in_flight",
    "in_threads",
    "lasting_loop",
    "run_at_exit",
    "settle",
    "spawn",
]

T = TypeVar("T")

_SETTLE_TIMEOUT_S = 2.0
"""How long the exit waits, in all, for cancelled work to end."""

_lock = threading.Lock()
_spawned: set[asyncio.Task[Any]] = set()
"""Background tasks started by :func:`spawn`, until they end (also what keeps them
referenced: a task no one references may be collected while it runs)."""
_working: dict[asyncio.Task[Any], int] = {}
"""Tasks inside an inner storage operation, with how many they are nested in."""
_exit_steps: list[Callable[[], None]] = []
_armed = False


async def gather(*awaitables: Awaitable[T]) -> list[T]:
    """The results of ``awaitables``, run concurrently, in order. If one fails, or this
    call is cancelled, the rest are cancelled and awaited before the first error is
    raised (the others' errors added to it as notes)."""
    if len(awaitables) == 1:  # the common case needs no task
        return [await awaitables[0]]
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except GeneratorExit:  # closed, not cancelled: its loop is gone, nothing can be awaited
        raise
    except BaseException as first:
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for other in outcomes:
            if isinstance(other, Exception) and other is not first:
                first.add_note(f"also failed at the same time: {type(other).__name__}: {other}")
        raise


ALONE_BELOW_BYTES = 256 << 10
"""Work on fewer bytes than this (see :func:`in_threads`) is done on the caller's
thread in one piece: handing a share to another core (about 15 µs) would save less."""
SHARED_FROM_BYTES = 2 << 20
"""Work on this many bytes or more goes to a thread per core, the caller's thread (zarr's
one event loop, which every thread's reads share) free meanwhile: for the next group's
reads to go out while this one decodes. Below it the caller's thread takes a share
and waits for the others: a hop to the threads of asyncio and back (about 0.2 ms)
costs more than freeing the loop saves (a row of sixty-four 16 KiB zstd chunks decodes
in about 1 ms). Measured with four threads reading rows of 0.5-2 MiB at once, keeping
the work on that loop was as fast or faster."""
SHARED_FROM_CORES = 3
"""Middling work (see SHARED_FROM_BYTES) is shared on machines of this many cores or more;
with two, the caller's thread does it alone: its one helper cost as much as it saved. A
slab of sixty-four 16 KiB zstd chunks (1 MiB), alternated in one process, 60 rounds of
5: 5.66 against 4.94 ms, and 6.15 against 5.61 ms in another run (zarrs 3.7-3.8 ms);
later, with nothing but the decoding shared, 1.51 against 1.37 ms for it. Linux ran the
woken helper on the caller's own core while the other stayed idle (``perf sched``: 1.2
ms of it), and the caller's thread, its share decoded in 0.18 ms, went on only as the
helper ended: such work is over before the scheduler moves a thread. Two threads long
at work decoding the same shards take 0.60-1.0 ms against 0.88-1.25 for one."""

_helpers: concurrent.futures.ThreadPoolExecutor | None = None
"""Threads that take a share of work the caller's thread waits for (one per other core)."""


async def in_threads(
    work: Callable[[range], None],
    n: int,
    *,
    nbytes: int | None = None,
    at_most: int | None = None,
    extra: int = 0,
) -> None:
    """``work`` over ``range(n)`` by a thread per core (for work that releases the GIL:
    codecs, system calls); all of it begun has ended when this returns or raises (the
    first error), also when the call is cancelled: a thread cannot be stopped, so what
    it has begun ends before the call unwinds. By ``nbytes``, where the caller says: a
    worker thread per core, each taking an item as it is done with one, from a stretch
    of its own first (SHARED_FROM_BYTES or more, or unsaid; see :func:`_pulling` and
    :class:`_Cursor`), a slice per core, the caller's thread doing the first and
    waiting for the others (less, on SHARED_FROM_CORES or more), or the caller's
    thread doing all of it (less than ALONE_BELOW_BYTES, or than SHARED_FROM_BYTES on
    fewer cores). ``at_most``: so many threads at most, where the caller says; ``extra``:
    so many worker threads more than that, for work that waits in the kernel part of
    its time (commits to local files), so that the cores are kept busy meanwhile."""
    if n == 0:
        return
    size = SHARED_FROM_BYTES if nbytes is None else nbytes
    shared = size < SHARED_FROM_BYTES
    cores = available_cores() if at_most is None else min(available_cores(), at_most)
    if shared and (n == 1 or size < ALONE_BELOW_BYTES or cores < SHARED_FROM_CORES):
        work(range(n))
        return
    if shared:
        step = -(-n // cores)
        _shared(work, [range(i, min(i + step, n)) for i in range(0, n, step)])
        return
    ways = min(n, cores + extra)
    cursor = _Cursor(n, ways)
    loop = asyncio.get_running_loop()
    # (futures, not tasks: asyncio.run's teardown cancels every task, and a cancelled
    # task that waits on a thread ends while the thread runs on)
    threads = asyncio.gather(
        *(
            loop.run_in_executor(
                None, functools.partial(contextvars.copy_context().run, _pulling, [work], cursor, way)
            )
            for way in range(ways)
        ),
        return_exceptions=True,
    )
    try:
        outcomes = await asyncio.shield(threads)
    except BaseException as stopped:
        cursor.stop()  # (what no thread has begun is not wanted any more)
        # (cancelled again meanwhile, the threads still run; closed, nothing can be awaited)
        while not threads.done() and not isinstance(stopped, GeneratorExit):
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(threads)
        raise
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


def _shared(work: Callable[[range], None], slices: list[range]) -> None:
    """``work`` over ``slices``: the first on this thread, the others by helper threads;
    a slice no helper has started by the time this thread is free it does itself (it
    never waits on work queued behind another caller's). The first error is raised
    once no slice runs any more (the slices not started then are dropped), also on
    Ctrl-C: a thread cannot be stopped, and the caller's buffers are in its hands."""
    shares: list[concurrent.futures.Future[None]] = []
    handed = [[work] for _ in slices[1:]]
    try:
        with contextlib.suppress(RuntimeError):  # the pool takes no more work once the interpreter exits
            for part, held in zip(slices[1:], handed, strict=True):
                shares.append(_helper_pool().submit(_let_go, held, part))
        for part in [slices[0], *slices[1 + len(shares) :]]:
            work(part)
        for part, share, held in zip(slices[1:], shares, handed, strict=False):
            if share.cancel():
                held.clear()  # (the cancelled item waits in the pool's queue)
                work(part)
            else:
                share.result()
    finally:
        for share, held in zip(shares, handed, strict=False):
            if share.cancel():
                held.clear()
        while not all(share.done() for share in shares):
            with contextlib.suppress(BaseException):  # (another Ctrl-C: the wait goes on)
                concurrent.futures.wait(shares)


def _let_go(held: list[Callable[[range], None]], part: range) -> None:
    """``held[0](part)``, the work let go of before the caller hears that it ended: a
    pool's thread holds the function it was given until it takes the next one, and
    memory the work refers to is used again only once nothing refers to it (see
    :mod:`~shardstore.shard_buffers`): a read's last group was held a moment past its
    end, too late to be kept for the next read, in 8 reads of 20."""
    held.pop()(part)


class _Cursor:
    """The items ``range(n)`` handed out one at a time to the ``ways`` threads that share
    them: each way its own stretch of ``range(n)`` (split as evenly as can be), in
    order, then the last items of the stretch with most left; none after one has
    failed or the call was cancelled.

    Why stretches: items next to each other are often memory next to each other, and
    threads in stretches of their own work far apart (on many cores the stretches are
    short, and neighbours meet again at their ends). Neighbouring shards' blocks of
    the array a read decodes into share its huge pages, which the kernel zeroes on
    first touch, and two threads that touch a new one at once each zero it (one copy
    is dropped). A 64 MiB read of 1 MiB zstd shards, alternated, 80 rounds: 33 page
    faults against 48 with the items handed out in order (its output is 32 huge
    pages), 230 against 246 ms of CPU, 170 against 175 ms."""

    def __init__(self, n: int, ways: int) -> None:
        self._left = [[way * n // ways, (way + 1) * n // ways] for way in range(ways)]
        """Each way's items not yet handed out: ``range(*left[way])``."""
        self._stopped = False
        self._lock = threading.Lock()

    def take(self, way: int) -> int | None:
        with self._lock:
            if self._stopped:
                return None
            own = self._left[way]
            if own[0] < own[1]:
                own[0] += 1
                return own[0] - 1
            richest = max(self._left, key=lambda left: left[1] - left[0])
            if richest[0] == richest[1]:
                return None
            richest[1] -= 1  # (from its end: far from where its own thread works)
            return richest[1]

    def stop(self) -> None:
        with self._lock:
            self._stopped = True


def _pulling(held: list[Callable[[range], None]], cursor: _Cursor, way: int) -> None:
    """``held[0]`` over the items ``cursor`` hands this thread (``way``), one at a time,
    let go of as :func:`_let_go` does. Not a fixed slice per thread: a thread held up (a
    page fault that waits for the kernel to free or compact memory: tens of
    milliseconds on a busy machine) leaves what it has not started to the others, who
    would otherwise wait for it. A 64 MiB zstd read stalled so in about one run of three."""
    work = held.pop()
    try:
        while (k := cursor.take(way)) is not None:
            work(range(k, k + 1))
    except BaseException:
        cursor.stop()
        raise


@contextlib.asynccontextmanager
async def handed_to_threads(work: Callable[[T], None]) -> AsyncIterator[Callable[[T], None]]:
    """A function that hands an item to ``work`` on a worker thread, a thread per core
    at most, each taking the next item handed as it is done with one: for items that
    come one at a time on the loop's thread (responses of a batch of requests), each
    worked on while the others are still awaited. All of it begun has ended when the
    block is left: the first error ``work`` raised is raised then; if the block
    raises or is cancelled, items not begun are dropped, and those begun end first."""
    handoff = _Handoff(work, available_cores())
    try:
        yield handoff.hand
    except GeneratorExit:  # closed, not cancelled: its loop is gone, nothing can be awaited
        handoff.drop()
        raise
    except BaseException:
        await handoff.ended(stop=True)
        raise
    await handoff.ended(stop=False)


class _Handoff(Generic[T]):
    """The items :func:`handed_to_threads` has been handed and not yet begun, and the
    threads working on them: a thread is started for an item while fewer than
    ``limit`` run, and ends once none is left (no thread waits while requests do)."""

    def __init__(self, work: Callable[[T], None], limit: int) -> None:
        self._work, self._limit = work, limit
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._items: deque[T] = deque()
        self._running = 0
        self._stopped = False
        self._threads: list[asyncio.Future[None]] = []

    def hand(self, item: T) -> None:
        with self._lock:
            if self._stopped:
                return
            self._items.append(item)
            if self._running >= self._limit:
                return  # (a running thread takes it: it looks for more before it ends)
            self._running += 1
        self._threads.append(
            self._loop.run_in_executor(None, functools.partial(contextvars.copy_context().run, self._drain))
        )

    def _drain(self) -> None:
        while True:
            with self._lock:
                if self._stopped or not self._items:
                    self._running -= 1
                    return
                item = self._items.popleft()
            try:
                self._work(item)
            except BaseException:
                self.drop()
                with self._lock:
                    self._running -= 1
                raise

    async def ended(self, *, stop: bool) -> None:
        """Once every thread has ended (items not begun dropped first where ``stop``,
        or where this is cancelled meanwhile); the first error a thread raised is
        raised unless ``stop`` (the caller has an error of its own)."""
        if stop:
            self.drop()
        # (futures, not tasks, as in in_threads: a cancelled task ends while its thread runs on)
        threads = asyncio.gather(*self._threads, return_exceptions=True)
        try:
            outcomes = await asyncio.shield(threads)
        except BaseException as stopped:
            self.drop()
            while not threads.done() and not isinstance(stopped, GeneratorExit):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(threads)
            raise
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not stop:
                raise outcome

    def drop(self) -> None:
        """Take no more items; those handed and not begun are dropped."""
        with self._lock:
            self._stopped = True
            self._items.clear()


def _helper_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The helper threads, one per core but this one's, started on first use."""
    global _helpers
    if _helpers is None:
        with _lock:
            if _helpers is None:
                _helpers = concurrent.futures.ThreadPoolExecutor(
                    max(1, available_cores() - 1), thread_name_prefix="shardstore-share"
                )
    return _helpers


def spawn(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Start ``coro`` as a task of the running loop, kept until it ends and settled at
    exit. For work that serves several callers (a batch of reads, a shard commit),
    which each wait for its outcome through a future of their own."""
    task = asyncio.get_running_loop().create_task(coro)
    _arm()
    with _lock:
        _spawned.add(task)
    task.add_done_callback(_forget_spawned)
    return task


def _forget_spawned(task: asyncio.Task[Any]) -> None:
    with _lock:
        _spawned.discard(task)


_lasting: asyncio.AbstractEventLoop | None = None
_exiting = False


def lasting_loop() -> asyncio.AbstractEventLoop | None:
    """An event loop of shardstore's own, running in a daemon thread until exit, for
    work that must not end with the loop that started it (its ``asyncio.run`` over):
    a shard commit that writers on other loops wait for. None at exit, when what is
    left is cancelled, not carried on."""
    global _lasting
    with _lock:
        if _exiting:
            return None
        if _lasting is None:
            _lasting = asyncio.new_event_loop()
            threading.Thread(target=_lasting.run_forever, name="shardstore-lasting", daemon=True).start()
        return _lasting


@contextlib.contextmanager
def at_work() -> Iterator[None]:
    """Record the running task as waiting on storage until the block ends (nothing
    outside a task, or outside an event loop, is recorded)."""
    task = asyncio.current_task() if asyncio._get_running_loop() is not None else None
    if task is None:
        yield
        return
    _arm()
    with _lock:
        _working[task] = _working.get(task, 0) + 1
    try:
        yield
    finally:
        with _lock:
            left = _working.pop(task) - 1
            if left:
                _working[task] = left


def in_flight() -> list[asyncio.Task[Any]]:
    """The recorded tasks that have not ended."""
    with _lock:
        return [task for task in {*_spawned, *_working} if not task.done()]


def settle(timeout_s: float = _SETTLE_TIMEOUT_S) -> None:
    """Cancel every recorded task still in flight and wait, at most ``timeout_s`` in
    all, for each to end on its own loop (a loop running in another thread, or one
    stopped but not closed); loops closed, or running in this thread, are left."""
    deadline = time.monotonic() + timeout_s
    here = asyncio._get_running_loop()
    skipped: set[asyncio.Task[Any]] = set()
    while (left := deadline - time.monotonic()) > 0:
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Task[Any]]] = {}
        for task in in_flight():
            if task not in skipped:
                by_loop.setdefault(task.get_loop(), []).append(task)
        if not by_loop:
            return
        for loop, tasks in by_loop.items():
            left = deadline - time.monotonic()
            if loop.is_closed() or loop is here or left <= 0:
                skipped.update(tasks)
                continue
            with contextlib.suppress(Exception):  # at exit, with what there is: best effort
                if loop.is_running():
                    asyncio.run_coroutine_threadsafe(_cancelled(tasks, left), loop).result(left)
                else:
                    loop.run_until_complete(_cancelled(tasks, left))
            skipped.update(task for task in tasks if not task.done())


async def _cancelled(tasks: list[asyncio.Task[Any]], timeout_s: float) -> None:
    for task in tasks:
        task.cancel()
    done, _ = await asyncio.wait(tasks, timeout=timeout_s)
    for task in done:  # nobody else will ask now: never "exception was never retrieved"
        if not task.cancelled():
            task.exception()


def run_at_exit(step: Callable[[], None]) -> None:
    """Run ``step`` (once) at interpreter exit, after :func:`settle`."""
    _arm()
    with _lock:
        if step not in _exit_steps:
            _exit_steps.append(step)


def _at_exit() -> None:
    global _exiting
    _exiting = True
    settle()
    with _lock:
        steps = list(_exit_steps)
    for step in steps:
        with contextlib.suppress(Exception):
            step()


def _arm() -> None:
    """Register the exit hook, once, so that it runs before zarr's (which stops and
    closes zarr's loop) and weakref's (which runs the file systems' finalizers):
    atexit runs the last registered first, and weakref registers its hook with the
    first finalizer made in the process, so one is made first."""
    global _armed
    if _armed:
        return
    with _lock:
        if _armed:
            return
        _armed = True
    weakref.finalize(_arm, _nothing)
    atexit.register(_at_exit)


def _nothing() -> None:
    """(A finalizer that does nothing, see :func:`_arm`.)"""


def _forget_after_fork() -> None:
    """A forked child has none of its parent's loops running: their tasks are not its
    own; nor has it the parent's helper threads or lasting loop."""
    global _lock, _helpers, _lasting
    _lock = threading.Lock()
    _helpers = _lasting = None
    _spawned.clear()
    _working.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
