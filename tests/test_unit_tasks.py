"""Nothing a call starts outlives it: shardstore.tasks.gather, spawn, at_work and
settle, and calls hopped to an async file system's home loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardstore import tasks
from shardstore.tasks import at_work, gather, in_flight, settle, spawn


async def test_gather_returns_results_in_order() -> None:
    async def after(delay: float, value: int) -> int:
        await asyncio.sleep(delay)
        return value

    assert await gather(after(0.02, 1), after(0.0, 2), after(0.01, 3)) == [1, 2, 3]


async def test_gather_cancels_and_awaits_the_rest_when_one_fails() -> None:
    ended: list[str] = []

    async def slow(name: str) -> None:
        try:
            await asyncio.sleep(10)
        finally:
            ended.append(name)

    async def failing() -> None:
        await asyncio.sleep(0)
        raise OSError("boom")

    with pytest.raises(OSError, match="boom"):
        await gather(slow("a"), failing(), slow("b"))
    assert sorted(ended) == ["a", "b"]  # both had ended when gather raised


async def test_gather_notes_the_other_errors() -> None:
    async def failing(message: str) -> None:
        raise OSError(message)

    with pytest.raises(OSError) as raised:
        await gather(failing("first"), failing("second"))
    assert any("second" in note for note in raised.value.__notes__)


def test_a_cancelled_call_on_a_home_loop_ends_there_and_leaves_no_error_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An async file system's call runs on its home loop; cancelling the caller cancels
    it there, and its failure is never left for asyncio to report as never retrieved."""
    import gc
    import threading

    from shardstore.inner.fsspec_fs import _hop

    home = asyncio.new_event_loop()
    thread = threading.Thread(target=home.run_forever, daemon=True)
    thread.start()
    ended: list[str] = []
    started = threading.Event()

    async def failing_read() -> None:
        started.set()
        try:
            await asyncio.sleep(60)  # (a request that takes its time: cancelled long before)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        raise OSError("Forbidden")

    async def caller() -> None:
        call = asyncio.ensure_future(_hop(failing_read(), home))
        assert await asyncio.to_thread(started.wait, 30)  # under way on its home loop
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    try:
        asyncio.run(caller())
        gc.collect()
    finally:
        home.call_soon_threadsafe(home.stop)
        thread.join()
        home.close()
    assert ended == ["cancelled"]
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


class _LoopInAThread:
    """An event loop running in a thread of its own, as zarr's and fsspec's do."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


def test_settle_cancels_what_is_in_flight_on_a_loop_that_still_runs_and_waits_for_it() -> None:
    """What runs at exit, before zarr stops its loop: a spawned task and a task waiting on
    storage (inside ``at_work``), both abandoned by their callers, are cancelled on their
    own loop, and each has ended when ``settle`` returns."""
    home = _LoopInAThread()
    ended: list[str] = []
    waiting = threading.Event()

    async def background() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            ended.append("spawned")

    async def storage_call() -> None:
        with at_work():
            waiting.set()
            try:
                await asyncio.sleep(60)
            finally:
                ended.append("at work")

    async def start() -> list[asyncio.Task[None]]:
        return [spawn(background()), asyncio.ensure_future(storage_call())]

    try:
        tasks = home.run(start())
        assert waiting.wait(30)
        assert set(tasks) <= set(in_flight())
        settle()
        assert sorted(ended) == ["at work", "spawned"]
        assert all(t.cancelled() for t in tasks)
        assert not set(tasks) & set(in_flight())
    finally:
        home.close()


async def test_at_work_records_the_task_until_the_outermost_block_ends() -> None:
    me = asyncio.current_task()
    with at_work():
        with at_work():
            assert me in in_flight()
        assert me in in_flight()
    assert me not in in_flight()


def test_settle_leaves_the_callers_own_loop_alone() -> None:
    """Nothing can wait for a task on the loop the caller runs on: it is not touched."""

    async def scenario() -> bool:
        task = spawn(asyncio.sleep(60))
        settle(timeout_s=0.5)
        alive = not task.done()
        task.cancel()
        return alive

    assert asyncio.run(scenario())


def test_in_threads_shares_the_work_out_and_raises_only_once_every_item_begun_has_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread per core takes one item at a time; a failing item's error is raised
    after the items other threads began have ended (nothing runs on after the call),
    and every item is worked on exactly once."""
    monkeypatch.setattr(tasks, "available_cores", lambda: 2)
    parts: list[range] = []
    asyncio.run(tasks.in_threads(parts.append, 7))
    assert sorted(parts, key=lambda r: r.start) == [range(k, k + 1) for k in range(7)]

    begun, failed, ended = threading.Event(), threading.Event(), threading.Event()

    def failing(part: range) -> None:
        if 0 in part:
            assert begun.wait(timeout=30)
            failed.set()
            raise OSError("item 0 failed")
        begun.set()
        assert failed.wait(timeout=30)
        ended.set()

    with pytest.raises(OSError, match="item 0"):
        asyncio.run(tasks.in_threads(failing, 2))
    assert ended.is_set()


def test_in_threads_runs_extra_threads_beyond_the_cores_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``extra``: so many threads more than the cores work at once (a barrier only so
    many parties pass), and no more: a thread per core is the default."""
    monkeypatch.setattr(tasks, "available_cores", lambda: 2)
    for extra in (0, 1):
        together = threading.Barrier(2 + extra, timeout=30)
        threads: set[int] = set()

        def work(part: range, together: threading.Barrier = together, threads: set[int] = threads) -> None:
            threads.add(threading.get_ident())
            together.wait()

        asyncio.run(tasks.in_threads(work, 2 + extra, extra=extra))
        assert len(threads) == 2 + extra


def test_a_thread_held_up_leaves_the_items_it_has_not_begun_to_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first item ends only once all the others have: with a fixed slice per thread,
    the second item would wait behind the first on its thread, forever."""
    monkeypatch.setattr(tasks, "available_cores", lambda: 2)
    done: list[int] = []
    rest = threading.Event()

    def work(part: range) -> None:
        if part.start == 0:
            assert rest.wait(timeout=30), f"the other items were left behind: only {done} done"
        done.append(part.start)
        if len(done) == 3:
            rest.set()

    asyncio.run(tasks.in_threads(work, 4))
    assert done[-1] == 0 and sorted(done) == [0, 1, 2, 3]


@given(n=st.integers(0, 200), ways=st.integers(1, 9), asks=st.lists(st.integers(0, 8), max_size=400))
def test_each_thread_works_through_a_stretch_of_its_own_then_takes_the_ends_of_others(
    n: int, ways: int, asks: list[int]
) -> None:
    """Threads work far apart (neighbouring items are often neighbouring memory: see
    _Cursor): each takes its own stretch of the items in order, then the last items
    of the stretch with most left; every item exactly once, and none after a stop.
    Stretches differ by one item at most: with no fewer items than threads, every
    thread has one."""
    cursor = tasks._Cursor(n, ways)
    left = {w: list(range(w * n // ways, (w + 1) * n // ways)) for w in range(ways)}
    taken: list[int] = []
    for way in [a % ways for a in asks] + [0] * (n + 1):
        item = cursor.take(way)
        own = left[way]
        richest = max(left.values(), key=len)
        want = own.pop(0) if own else (richest.pop() if richest else None)
        assert item == want
        if item is not None:
            taken.append(item)
    assert sorted(taken) == list(range(n))
    if n >= ways:
        assert all(len(range(*left)) in (n // ways, -(-n // ways)) for left in tasks._Cursor(n, ways)._left)
    stopped = tasks._Cursor(n, ways)
    stopped.stop()
    assert stopped.take(0) is None


class _HeldItems:
    """Work whose items, once begun, wait for ``release``: to stop a call while its two
    threads are at work (``both_begun``) and see what they did."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(tasks, "available_cores", lambda: 2)
        self.done: list[int] = []
        self.running: list[int] = []
        self.release = threading.Event()
        self._begun = threading.Semaphore(0)

    def __call__(self, part: range) -> None:
        self.running.append(part.start)
        self._begun.release()
        assert self.release.wait(timeout=30)
        self.running.remove(part.start)
        self.done.append(part.start)

    async def both_begun(self) -> None:
        for _ in range(2):
            assert await asyncio.to_thread(self._begun.acquire, timeout=30)


def test_a_cancelled_call_begins_no_more_items_and_returns_once_those_begun_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    work = _HeldItems(monkeypatch)

    async def cancelled() -> None:
        call = asyncio.ensure_future(tasks.in_threads(work, 10))
        await work.both_begun()
        call.cancel()
        await asyncio.sleep(0)  # (one turn of the loop: the call runs its cancellation)
        work.release.set()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert sorted(work.done) == [0, 5]  # (the first of each thread's stretch)

    asyncio.run(cancelled())


@pytest.mark.parametrize("how", ["cancelled twice", "asyncio.run ends"])
def test_a_call_never_unwinds_while_its_threads_still_work(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Cancelled again while it waits for its threads, or cancelled with every other
    task as ``asyncio.run`` ends, the call still waits for the items begun: they
    write into the caller's buffers."""
    work = _HeldItems(monkeypatch)
    unwound: list[list[int]] = []

    async def call() -> None:
        try:
            await tasks.in_threads(work, 4)
        finally:
            unwound.append(list(work.running))

    async def main() -> None:
        task = asyncio.ensure_future(call())
        await work.both_begun()
        if how == "asyncio.run ends":
            stopped = threading.Event()  # (the call has heard it is cancelled)
            stop = tasks._Cursor.stop
            monkeypatch.setattr(tasks._Cursor, "stop", lambda self: (stop(self), stopped.set()))
            threading.Thread(target=lambda: (stopped.wait(30), work.release.set()), daemon=True).start()
            return  # (asyncio.run cancels the task, and waits for it)
        for _ in range(2):
            task.cancel()
            await asyncio.sleep(0)  # (one turn of the loop: the call hears it)
        done, _ = await asyncio.wait([task], timeout=0.2)
        assert not done  # (the threads are still held)
        work.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert unwound == [[]]


def test_a_call_closed_unawaited_hands_out_no_more_items(monkeypatch: pytest.MonkeyPatch) -> None:
    """A coroutine closed where it waits (its loop gone) cannot wait for its threads,
    but closes quietly, and they take no new item after the one each has begun."""
    work = _HeldItems(monkeypatch)

    async def main() -> None:
        call = tasks.in_threads(work, 10)
        call.send(None)  # (to its first wait)
        await work.both_begun()
        call.close()
        work.release.set()

    asyncio.run(main())  # (its end waits for the executor's threads)
    assert sorted(work.done) == [0, 5]  # (the first of each thread's stretch)


def test_in_threads_does_small_work_on_the_callers_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below ALONE_BELOW_BYTES (or one item below SHARED_FROM_BYTES, or any work below it
    on two cores) the work is one piece on the caller's thread; from SHARED_FROM_BYTES
    on (or unsaid), a thread per core taking an item at a time, the caller's thread free."""
    monkeypatch.setattr(tasks, "available_cores", lambda: 2)
    seen: list[tuple[range, threading.Thread]] = []

    def work(part: range) -> None:
        seen.append((part, threading.current_thread()))

    async def run(n: int, nbytes: int | None) -> threading.Thread:
        await tasks.in_threads(work, n, nbytes=nbytes)
        return threading.current_thread()

    for n, small in (
        (6, tasks.ALONE_BELOW_BYTES - 1),
        (1, tasks.SHARED_FROM_BYTES - 1),
        (6, tasks.SHARED_FROM_BYTES - 1),
    ):
        seen.clear()
        caller = asyncio.run(run(n, small))
        assert seen == [(range(n), caller)]
    for nbytes in (tasks.SHARED_FROM_BYTES, None):  # (None: the caller cannot tell)
        seen.clear()
        caller = asyncio.run(run(6, nbytes))
        assert sorted((part for part, _ in seen), key=lambda r: r.start) == [
            range(k, k + 1) for k in range(6)
        ]
        assert all(thread is not caller for _, thread in seen)
    monkeypatch.setattr(tasks, "available_cores", lambda: 3)  # (SHARED_FROM_CORES: shared, a slice a core)
    seen.clear()
    asyncio.run(run(6, tasks.SHARED_FROM_BYTES - 1))
    assert sorted((part for part, _ in seen), key=lambda r: r.start) == [
        range(0, 2),
        range(2, 4),
        range(4, 6),
    ]


def test_in_threads_shares_middling_work_with_a_helper_and_never_waits_on_a_busy_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between ALONE_BELOW_BYTES and SHARED_FROM_BYTES the caller's thread does the first
    slice and a helper thread the other, the call returning once both have ended; with
    every helper busy elsewhere, the caller's thread does the other slice itself
    instead of waiting; a helper's error is raised once every slice has ended."""
    monkeypatch.setattr(tasks, "available_cores", lambda: 2)
    monkeypatch.setattr(tasks, "SHARED_FROM_CORES", 2)  # (shared as on more cores)
    monkeypatch.setattr(tasks, "_helpers", None)
    middling = tasks.SHARED_FROM_BYTES - 1
    seen: list[tuple[range, threading.Thread]] = []
    second = threading.Event()

    def work(part: range) -> None:
        seen.append((part, threading.current_thread()))
        if part.start == 0:  # the first slice waits until the helper has taken the other
            assert second.wait(timeout=30)
        else:
            second.set()

    async def run(job: Callable[[range], None]) -> threading.Thread:
        await tasks.in_threads(job, 6, nbytes=middling)
        return threading.current_thread()

    caller = asyncio.run(run(work))
    assert sorted(seen, key=lambda s: s[0].start)[0] == (range(0, 3), caller)
    helper = sorted(seen, key=lambda s: s[0].start)[1]
    assert helper[0] == range(3, 6) and helper[1] is not caller

    assert tasks._helpers is not None
    release = threading.Event()
    busy = tasks._helpers.submit(release.wait, 30)  # another caller's share holds the helper
    seen.clear()
    try:
        caller = asyncio.run(run(lambda part: seen.append((part, threading.current_thread()))))
        assert seen == [(range(0, 3), caller), (range(3, 6), caller)]
    finally:
        release.set()
        busy.result(timeout=30)

    ended = threading.Event()
    second.clear()

    def failing(part: range) -> None:
        if part.start:
            second.set()
            raise OSError("the helper's slice failed")
        assert second.wait(timeout=30)
        ended.set()

    with pytest.raises(OSError, match="helper's slice"):
        asyncio.run(run(failing))
    assert ended.is_set()
    tasks._helpers.shutdown()


class _Work:
    """Work that records the threads of its calls, to be watched with a weak reference."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def __call__(self, part: range) -> None:
        self.threads.append(threading.current_thread())


@pytest.mark.parametrize("busy_helper", [False, True])
def test_in_threads_lets_go_of_the_work_before_it_returns(
    monkeypatch: pytest.MonkeyPatch, busy_helper: bool
) -> None:
    """Once the call returns, no thread of a pool refers to the work any more (nor to
    what it refers to): memory handed out again once nothing refers to it (see
    ShardBuffers) is free at the call's end, not some moment after, also where a busy
    helper's share was taken back and waits in its queue."""
    monkeypatch.setattr(tasks, "available_cores", lambda: 2)
    monkeypatch.setattr(tasks, "SHARED_FROM_CORES", 2)  # (shared as on more cores)
    monkeypatch.setattr(tasks, "_helpers", None)
    release = threading.Event()
    busy = tasks._helper_pool().submit(release.wait, 30) if busy_helper else None
    try:
        for nbytes in (tasks.SHARED_FROM_BYTES - 1, tasks.SHARED_FROM_BYTES):
            work = _Work()
            gone = weakref.ref(work)
            asyncio.run(tasks.in_threads(work, 6, nbytes=nbytes))
            assert len(work.threads) == (2 if nbytes < tasks.SHARED_FROM_BYTES else 6)  # (slices; items)
            del work
            assert gone() is None, nbytes
    finally:
        release.set()
        if busy is not None:
            busy.result(timeout=30)
        tasks._helper_pool().shutdown()


def test_in_threads_never_raises_while_a_helpers_slice_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted while it waits for a helper (Ctrl-C in ``result()``), the call still
    waits for that slice to end before raising: the helper writes into the caller's
    buffers."""
    monkeypatch.setattr(tasks, "available_cores", lambda: 2)
    monkeypatch.setattr(tasks, "SHARED_FROM_CORES", 2)  # (shared as on more cores)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    started, interrupted, ended = threading.Event(), threading.Event(), threading.Event()

    def submit(work: Callable[..., None], *args: Any) -> concurrent.futures.Future[None]:
        share = pool.submit(work, *args)

        def result(timeout: float | None = None) -> None:
            interrupted.set()
            raise KeyboardInterrupt

        share.result = result  # type: ignore[method-assign]
        return share

    monkeypatch.setattr(tasks, "_helper_pool", lambda: SimpleNamespace(submit=submit))

    def work(part: range) -> None:
        if part.start == 0:
            assert started.wait(timeout=30)  # (so that the helper's slice cannot be taken back)
            return
        started.set()
        assert interrupted.wait(timeout=30)
        ended.set()

    try:
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(tasks.in_threads(work, 2, nbytes=tasks.SHARED_FROM_BYTES - 1))
        assert ended.is_set()
    finally:
        pool.shutdown()


def test_in_threads_does_every_slice_itself_when_the_helpers_take_no_more_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At interpreter exit the helper pool refuses new work: the caller's thread then
    does it all, as it did below ALONE_BELOW_BYTES."""
    monkeypatch.setattr(tasks, "available_cores", lambda: 2)
    monkeypatch.setattr(tasks, "SHARED_FROM_CORES", 2)  # (shared as on more cores)
    closed = concurrent.futures.ThreadPoolExecutor(1)
    closed.shutdown()
    monkeypatch.setattr(tasks, "_helper_pool", lambda: closed)
    seen: list[tuple[range, threading.Thread]] = []

    def work(part: range) -> None:
        seen.append((part, threading.current_thread()))

    async def run() -> threading.Thread:
        await tasks.in_threads(work, 6, nbytes=tasks.SHARED_FROM_BYTES - 1)
        return threading.current_thread()

    caller = asyncio.run(run())
    assert seen == [(range(0, 3), caller), (range(3, 6), caller)]


async def test_items_handed_to_threads_are_worked_on_by_a_thread_per_core_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each item goes to a worker thread as it is handed, two at once on two cores, the
    third only once one of those is done; all are done when the block is left."""
    monkeypatch.setattr(tasks, "available_cores", lambda: 2)
    lock, release, two = threading.Lock(), threading.Event(), threading.Event()
    running, most, done, threads = [0], [0], [], set()

    def work(item: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            if running[0] == 2:
                two.set()
        release.wait(10)
        with lock:
            running[0] -= 1
            done.append(item)
            threads.add(threading.get_ident())

    async with tasks.handed_to_threads(work) as hand:
        for item in range(5):
            hand(item)
        assert await asyncio.to_thread(two.wait, 10)
        for _ in range(20):  # (a count of loop turns, not a time)
            await asyncio.sleep(0)
        assert not done and running[0] == 2
        release.set()
    assert sorted(done) == [0, 1, 2, 3, 4] and most[0] == 2
    assert threading.get_ident() not in threads


class _HeldWork:
    """Work on handed items, on ``cores`` threads at most: each, once begun, waits for
    ``release`` (``began`` is set as the first begins; ``done`` lists those ended),
    but those in ``failing``, which raise at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cores: int, failing: tuple[int, ...] = ()) -> None:
        monkeypatch.setattr(tasks, "available_cores", lambda: cores)
        self.began, self.release, self.failing = threading.Event(), threading.Event(), failing
        self.done: list[int] = []

    def __call__(self, item: int) -> None:
        if item in self.failing:
            raise ValueError(f"item {item}")
        self.began.set()
        self.release.wait(10)
        self.done.append(item)


async def _still_running(call: asyncio.Future[None]) -> bool:
    for _ in range(50):  # (a count of loop turns, not a time)
        await asyncio.sleep(0)
    return not call.done()


async def test_what_work_handed_to_threads_raises_is_raised_once_no_item_runs_any_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    work = _HeldWork(monkeypatch, cores=2, failing=(1,))

    async def block() -> None:
        async with tasks.handed_to_threads(work) as hand:
            hand(2)
            assert await asyncio.to_thread(work.began.wait, 10)
            hand(1)

    call = asyncio.ensure_future(block())
    assert await _still_running(call)  # item 2 still runs
    work.release.set()
    with pytest.raises(ValueError, match="item 1"):
        await call
    assert work.done == [2]


async def test_a_block_that_raises_drops_the_items_not_begun_and_waits_for_those_begun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    work = _HeldWork(monkeypatch, cores=1)

    async def block() -> None:
        async with tasks.handed_to_threads(work) as hand:
            hand(1)
            hand(2)
            assert await asyncio.to_thread(work.began.wait, 10)
            raise KeyError("the block's own")

    call = asyncio.ensure_future(block())
    assert await _still_running(call)  # item 1 still runs
    work.release.set()
    with pytest.raises(KeyError, match="the block's own"):
        await call
    assert work.done == [1]


def test_a_handing_block_closed_unawaited_closes_quietly_and_begins_no_more_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A coroutine closed where it waits (its loop gone) cannot wait for its threads: it
    closes without awaiting, and the items not begun are dropped."""
    work = _HeldWork(monkeypatch, cores=1)

    async def block() -> None:
        async with tasks.handed_to_threads(work) as hand:
            hand(1)
            hand(2)
            await asyncio.Event().wait()  # (a request awaited)

    async def main() -> None:
        call = block()
        call.send(None)  # (to its first wait)
        assert await asyncio.to_thread(work.began.wait, 10)
        call.close()  # (no "coroutine ignored GeneratorExit")
        work.release.set()

    asyncio.run(main())  # (its end waits for the executor's threads)
    assert work.done == [1]
