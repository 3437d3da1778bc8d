"""Unit tests of shardstore.writing.commit_queue: update arithmetic and the per-shard CommitQueue.

The queue is driven with a fake ``commit`` that records each call and waits on a
gate the test opens, so every assertion is about counts and order, never timings.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from shardstore import sync_bridge
from shardstore.errors import SyncCallError
from shardstore.inner.locks import process_lock
from shardstore.tasks import lasting_loop
from shardstore.writing.commit_queue import CommitQueue, outcome
from shardstore.writing.updates import Splice, Update, apply_updates, independent_of_old, merge_updates

from .helpers import turns_until, within

PATIENCE_S = 60.0
"""How long the tests on two event loops wait for each other: what a loaded machine may need,
never what the test relies on (each wait ends as soon as its event comes)."""

Updates = dict[int, list[Update]]


async def spin(turns: int) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


class FakeCommit:
    """Records ``(key, target, updates)`` per call; each call waits for ``gate``."""

    def __init__(self, errors: list[BaseException] | None = None) -> None:
        self.calls: list[tuple[str, Any, Updates]] = []
        self.gate = asyncio.Event()
        self.errors = list(errors or [])  # raised by the first calls, in order
        self.in_flight: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()
        self.finished = 0

    @property
    def keys(self) -> list[str]:
        return [key for key, _, _ in self.calls]

    @property
    def updates(self) -> list[Updates]:
        return [ups for _, _, ups in self.calls]

    async def __call__(self, key: str, target: Any, updates: Updates) -> None:
        self.calls.append((key, target, {pos: list(ups) for pos, ups in updates.items()}))
        self.in_flight[key] += 1
        self.max_in_flight[key] = max(self.max_in_flight[key], self.in_flight[key])
        try:
            await self.gate.wait()
            if self.errors:
                raise self.errors.pop(0)
        finally:
            self.in_flight[key] -= 1
        self.finished += 1


def never_ready(target: Any, updates: Updates) -> bool:
    return False


def make_queue(
    commit: FakeCommit,
    ready: Callable[[Any, Updates], bool] = never_ready,
    slots: int = 100,
    linger_s: float = 0.005,
) -> CommitQueue[Any]:
    return CommitQueue(commit, ready, lambda: slots, linger_s=linger_s)


def start(queue: CommitQueue[Any], key: str, updates: Mapping[int, list[Update]], target: Any = "t") -> Any:
    return asyncio.ensure_future(queue.submit(key, target, updates))


# -- apply_updates, independent_of_old, merge_updates, Splice -------------------------


def test_apply_updates_full_values_replace_and_none_erases() -> None:
    """A full value replaces the chunk, None erases it, no updates keep the old value."""
    assert apply_updates(b"old", []) == b"old"
    assert apply_updates(None, []) is None
    assert apply_updates(b"old", [b"new"]) == b"new"
    assert apply_updates(b"old", [b"one", b"two"]) == b"two"
    assert apply_updates(b"old", [None]) is None
    assert apply_updates(b"old", [None, b"back"]) == b"back"


def test_apply_updates_splices_overwrite_in_order() -> None:
    """Splices overwrite bytes from their start, one after another, onto the old value."""
    assert apply_updates(b"abcdef", [Splice(1, b"XY")]) == b"aXYdef"
    assert apply_updates(b"abcdef", [Splice(1, b"XY"), Splice(2, b"Q")]) == b"aXQdef"
    assert apply_updates(b"abc", [Splice(2, b"XYZ")]) == b"abXYZ"  # runs past the end: grows
    assert apply_updates(b"abc", [Splice(3, b"!")]) == b"abc!"  # at the end: appends
    assert apply_updates(None, [Splice(0, b"new")]) == b"new"
    assert apply_updates(b"old", [b"full", Splice(0, b"F")]) == b"Full"
    assert apply_updates(b"old", [None, Splice(0, b"re")]) == b"re"


def test_apply_updates_splice_past_the_end_lands_at_its_start() -> None:
    """A splice's bytes land at ``start`` even past the chunk's end, the gap zero-filled
    (as a file written past its end)."""
    assert apply_updates(None, [Splice(2, b"ab")]) == b"\x00\x00ab"
    assert apply_updates(b"abcd", [Splice(6, b"XY")]) == b"abcd\x00\x00XY"


def test_splice_is_a_frozen_value() -> None:
    """Splices compare by value and cannot be changed."""
    assert Splice(1, b"x") == Splice(1, b"x")
    assert Splice(1, b"x") != Splice(2, b"x")
    with pytest.raises(AttributeError):
        Splice(1, b"x").start = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("updates", "expected"),
    [
        ([], False),
        ([b"x"], True),
        ([None], True),
        ([b"x", Splice(0, b"y")], True),
        ([None, Splice(0, b"y")], True),
        ([Splice(0, b"y")], False),
        ([Splice(0, b"y"), Splice(1, b"z")], False),
    ],
)
def test_independent_of_old(updates: list[Update], expected: bool) -> None:
    """Only updates that start with a full value (or an erase) need no old value."""
    assert independent_of_old(updates) is expected


def test_merge_updates_full_value_replaces_and_splice_stacks() -> None:
    """Later full values replace queued updates; later splices go after them."""
    into: Updates = {0: [b"a"], 1: [b"b"], 2: [Splice(0, b"c")], 3: [b"d"]}
    merge_updates(
        into,
        {0: [b"A"], 1: [Splice(1, b"B")], 2: [Splice(1, b"C")], 4: [Splice(0, b"e")], 5: [None]},
    )
    assert into == {
        0: [b"A"],
        1: [b"b", Splice(1, b"B")],
        2: [Splice(0, b"c"), Splice(1, b"C")],
        3: [b"d"],  # untouched
        4: [Splice(0, b"e")],
        5: [None],
    }
    merge_updates(into, {1: [None]})
    assert into[1] == [None]


def test_merge_updates_does_not_alias_the_callers_lists() -> None:
    """The merged lists are the queue's own: later merges never change the caller's lists."""
    first: list[Update] = [b"a"]
    spliced: list[Update] = [Splice(0, b"s")]
    into: Updates = {}
    merge_updates(into, {0: first, 1: spliced})
    merge_updates(into, {0: [Splice(0, b"x")], 1: [Splice(1, b"y")]})
    assert first == [b"a"]
    assert spliced == [Splice(0, b"s")]
    assert apply_updates(None, into[0]) == b"x"
    assert apply_updates(None, into[1]) == b"sy"


# -- outcome ---------------------------------------------------------------------------


async def test_outcome_returns_and_raises_what_the_future_holds() -> None:
    """outcome waits for the shared future: its result returns, its exception raises."""
    ok: concurrent.futures.Future[None] = concurrent.futures.Future()
    waiter = asyncio.ensure_future(outcome(ok))
    await spin(3)
    assert not waiter.done()
    ok.set_result(None)
    await waiter
    assert waiter.exception() is None

    failed: concurrent.futures.Future[None] = concurrent.futures.Future()
    failed.set_exception(OSError("disk"))
    with pytest.raises(OSError, match="disk"):
        await outcome(failed)


async def test_cancelling_one_outcome_waiter_leaves_the_shared_future_alone() -> None:
    """Cancelling one waiter must not cancel the future every other waiter shares."""
    shared: concurrent.futures.Future[None] = concurrent.futures.Future()
    first = asyncio.ensure_future(outcome(shared))
    second = asyncio.ensure_future(outcome(shared))
    await spin(3)
    first.cancel()
    await spin(3)
    assert first.cancelled()
    assert not shared.cancelled()
    shared.set_result(None)  # would raise InvalidStateError had it been cancelled
    await second
    assert second.exception() is None


# -- CommitQueue -------------------------------------------------------------------------


async def test_updates_during_a_commit_merge_into_one_next_commit() -> None:
    """One commit in flight per shard; writes arriving meanwhile become one next commit."""
    commit = FakeCommit()
    queue = make_queue(commit)
    first = start(queue, "k", {0: [b"a"]}, target="t1")
    await turns_until(lambda: len(commit.calls) == 1)

    later = [
        start(queue, "k", {1: [b"b"]}, target="t2"),
        start(queue, "k", {2: [Splice(0, b"c")]}, target="t3"),
        start(queue, "k", {0: [b"d"]}, target="t4"),
        start(queue, "k", {2: [Splice(1, b"C")]}, target="t5"),
    ]
    await spin(10)
    assert len(commit.calls) == 1  # the next batch waits for the commit in flight
    assert not first.done() and not any(w.done() for w in later)

    commit.gate.set()
    await within(asyncio.gather(first, *later))
    assert commit.keys == ["k", "k"]
    assert commit.updates == [
        {0: [b"a"]},
        {1: [b"b"], 2: [Splice(0, b"c"), Splice(1, b"C")], 0: [b"d"]},
    ]
    assert commit.calls[1][1] == "t5"  # the batch commits with its latest writer's target
    assert commit.max_in_flight["k"] == 1


async def test_different_shards_commit_independently() -> None:
    """Only commits to the same shard are serialised: two shards commit at once."""
    commit = FakeCommit()
    queue = make_queue(commit, ready=lambda target, updates: True)
    writers = [start(queue, "k1", {0: [b"a"]}), start(queue, "k2", {0: [b"b"]})]
    await turns_until(lambda: len(commit.calls) == 2)
    assert sorted(commit.keys) == ["k1", "k2"]
    assert commit.finished == 0  # both in flight together
    commit.gate.set()
    await within(asyncio.gather(*writers))
    assert commit.finished == 2


async def test_a_failed_commit_fails_every_writer_of_its_batch_and_not_the_next() -> None:
    """A commit's exception reaches each writer of that batch; the batch behind it still commits."""
    commit = FakeCommit(errors=[OSError("inner store down")])
    queue = make_queue(commit, slots=2)  # both writers waiting: the batch goes
    batch_one = [start(queue, "k", {0: [b"a"]}), start(queue, "k", {1: [b"b"]})]
    await turns_until(lambda: len(commit.calls) == 1)
    batch_two = start(queue, "k", {2: [b"c"]})
    await spin(5)

    commit.gate.set()
    results = await within(asyncio.gather(*batch_one, return_exceptions=True))
    assert [type(r) for r in results] == [OSError, OSError]
    assert all("inner store down" in str(r) for r in results)
    assert await within(batch_two) is None
    assert commit.updates == [{0: [b"a"], 1: [b"b"]}, {2: [b"c"]}]

    after = start(queue, "k", {3: [b"d"]})  # the failure left nothing stuck behind
    assert await within(after) is None
    assert commit.updates[-1] == {3: [b"d"]}


async def test_a_ready_batch_goes_without_lingering() -> None:
    """A batch lingers for more writers until ``ready`` says it covers the shard, then goes."""
    seen: list[set[int]] = []

    def ready(target: Any, updates: Updates) -> bool:
        seen.append(set(updates))
        return set(updates) == {0, 1, 2, 3}

    commit = FakeCommit()
    commit.gate.set()
    queue = make_queue(commit, ready=ready, linger_s=30)  # lingering would outlast the test
    first = [start(queue, "k", {0: [b"a"]}), start(queue, "k", {1: [b"b"]})]
    await spin(20)
    assert commit.calls == []  # two writers, not ready: lingering for more
    rest = [start(queue, "k", {2: [b"c"]}), start(queue, "k", {3: [b"d"]})]
    turns = await turns_until(lambda: len(commit.calls) == 1, limit=20)
    assert turns < 20
    await within(asyncio.gather(*first, *rest))
    assert commit.updates == [{0: [b"a"], 1: [b"b"], 2: [b"c"], 3: [b"d"]}]
    assert {0, 1, 2, 3} in seen


async def test_a_batch_ready_at_once_goes_at_once() -> None:
    """``ready`` true from the start: even a batch of several writers goes in a few turns."""
    commit = FakeCommit()
    commit.gate.set()
    queue = make_queue(commit, ready=lambda target, updates: True, linger_s=30)
    writers = [start(queue, "k", {i: [bytes([i])]}) for i in range(3)]
    turns = await turns_until(lambda: len(commit.calls) == 1, limit=10)
    assert turns < 10
    await within(asyncio.gather(*writers))
    assert commit.updates == [{0: [b"\x00"], 1: [b"\x01"], 2: [b"\x02"]}]


async def test_a_lone_write_does_not_linger() -> None:
    """A single write with nothing else under way commits within a few loop turns."""
    commit = FakeCommit()
    commit.gate.set()
    queue = make_queue(commit, linger_s=30)  # lingering would outlast the test
    writer = start(queue, "k", {0: [b"a"]})
    turns = await turns_until(lambda: len(commit.calls) == 1, limit=10)
    assert turns < 10
    await within(writer)
    assert commit.updates == [{0: [b"a"]}]

    again = start(queue, "k", {1: [b"b"]})  # and again once the queue is idle
    await turns_until(lambda: len(commit.calls) == 2, limit=10)
    await within(again)


async def test_when_every_slot_is_waiting_the_fullest_batch_goes_first() -> None:
    """With every writer a caller may have waiting, the batch with most writers commits first."""
    commit = FakeCommit()
    commit.gate.set()
    queue = make_queue(commit, slots=3, linger_s=0.02)
    writers = [
        start(queue, "small", {0: [b"s"]}),  # submitted first, but alone in its batch
        start(queue, "big", {0: [b"b0"]}),
        start(queue, "big", {1: [b"b1"]}),
    ]
    await within(asyncio.gather(*writers))
    assert commit.keys == ["big", "small"]
    assert commit.updates[0] == {0: [b"b0"], 1: [b"b1"]}


async def test_cancelling_a_writer_does_not_cancel_the_commit_in_flight() -> None:
    """Regression: a cancelled writer leaves its batch's commit and the other writers alone."""
    commit = FakeCommit()
    queue = make_queue(commit, slots=2)  # both writers waiting: the batch goes
    a = start(queue, "k", {0: [b"a"]})
    b = start(queue, "k", {1: [b"b"]})
    await turns_until(lambda: len(commit.calls) == 1)
    a.cancel()
    await spin(5)
    assert a.cancelled()
    commit.gate.set()
    assert await within(b) is None
    assert commit.finished == 1
    assert commit.updates == [{0: [b"a"], 1: [b"b"]}]


async def test_cancelling_a_queued_writer_does_not_cancel_its_batch() -> None:
    """A writer cancelled while its batch waits behind a commit: that batch still commits,
    and its other writers (and later batches) succeed."""
    commit = FakeCommit()
    queue = make_queue(commit)
    first = start(queue, "k", {0: [b"a"]})
    await turns_until(lambda: len(commit.calls) == 1)
    c = start(queue, "k", {1: [b"c"]})
    d = start(queue, "k", {2: [b"d"]})
    await spin(5)
    c.cancel()
    await spin(5)
    commit.gate.set()
    assert await within(first) is None
    assert await within(d) is None
    assert c.cancelled()
    assert commit.updates == [{0: [b"a"]}, {1: [b"c"], 2: [b"d"]}]  # c's update was merged already
    assert commit.finished == 2
    assert await within(start(queue, "k", {3: [b"e"]})) is None


def _run_in_thread(pool: concurrent.futures.ThreadPoolExecutor, coro: Callable[[], Any]) -> Any:
    return pool.submit(asyncio.run, coro())


def test_writers_on_two_event_loops_are_serialised_and_merged() -> None:
    """Writers on different event loops (threads) share one queue: one commit at a time
    per shard, and a batch merges writes made from both loops."""
    lock = threading.Lock()
    calls: list[tuple[int, Updates]] = []
    in_flight = max_in_flight = 0
    gate, b_joined, c_joined = threading.Event(), threading.Event(), threading.Event()

    async def commit(key: str, target: Any, updates: Updates) -> None:
        nonlocal in_flight, max_in_flight
        with lock:
            calls.append((threading.get_ident(), {p: list(u) for p, u in updates.items()}))
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)
        await asyncio.to_thread(gate.wait, PATIENCE_S)
        with lock:
            in_flight -= 1

    queue: CommitQueue[Any] = CommitQueue(commit, never_ready, lambda: 100, linger_s=0.005)

    async def loop_one() -> int:
        await asyncio.gather(
            queue.submit("k", "t", {0: [b"a"]}), _c_joins_batch_two(queue, b_joined, c_joined)
        )
        return threading.get_ident()

    async def loop_two() -> int:
        assert await asyncio.to_thread(lambda: _wait_for(lambda: len(calls) == 1))
        b = asyncio.ensure_future(queue.submit("k", "t", {1: [b"b"]}))
        await spin(2)
        b_joined.set()
        await b
        return threading.get_ident()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        one = _run_in_thread(pool, loop_one)
        two = _run_in_thread(pool, loop_two)
        assert c_joined.wait(PATIENCE_S)
        assert len(calls) == 1  # the second batch waits for the first commit
        gate.set()
        thread_one, thread_two = one.result(PATIENCE_S), two.result(PATIENCE_S)

    assert [ups for _, ups in calls] == [{0: [b"a"]}, {1: [b"b"], 2: [b"c"]}]
    # batch one on its loop; batch two, which writers on both loops wait for, in the lasting loop
    assert calls[0][0] == thread_one and calls[1][0] not in (thread_one, thread_two)
    assert max_in_flight == 1


async def _c_joins_batch_two(
    queue: CommitQueue[Any], b_joined: threading.Event, c_joined: threading.Event
) -> None:
    """Writer c, on this loop, joins batch two once b has opened it on the other loop."""
    await asyncio.to_thread(b_joined.wait, PATIENCE_S)
    c = asyncio.ensure_future(queue.submit("k", "t", {2: [b"c"]}))
    await spin(2)
    c_joined.set()
    await c


def _wait_for(condition: Callable[[], bool], timeout: float = PATIENCE_S) -> bool:
    event = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if condition():
            return True
        event.wait(0.005)
    return False


def test_cancelled_writer_on_another_loop_does_not_cancel_the_shared_commit() -> None:
    """A writer on loop 1 that joined a batch opened on loop 2 still commits when the
    loop-2 writer is cancelled and its loop ends (the commit goes on in the lasting
    loop; before, loop 1's writer got a CancelledError and its write was never made)."""
    lock = threading.Lock()
    calls: list[Updates] = []
    gate, b_joined, c_joined = threading.Event(), threading.Event(), threading.Event()

    async def commit(key: str, target: Any, updates: Updates) -> None:
        with lock:
            calls.append({p: list(u) for p, u in updates.items()})
        await asyncio.to_thread(gate.wait, PATIENCE_S)

    queue: CommitQueue[Any] = CommitQueue(commit, never_ready, lambda: 100, linger_s=0.005)

    async def loop_one() -> list[BaseException | None]:
        a = queue.submit("k", "t", {0: [b"a"]})
        return list(
            await asyncio.gather(a, _c_joins_batch_two(queue, b_joined, c_joined), return_exceptions=True)
        )

    async def loop_two() -> None:
        # the lost batch leaves a "Future exception was never retrieved" behind: keep it quiet
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        assert await asyncio.to_thread(lambda: _wait_for(lambda: len(calls) == 1))
        b = asyncio.ensure_future(queue.submit("k", "t", {1: [b"b"]}))  # opens batch two here
        await spin(2)
        b_joined.set()
        await asyncio.to_thread(c_joined.wait, PATIENCE_S)
        b.cancel()  # then this loop ends (asyncio.run cancels what is left on it)
        await asyncio.gather(b, return_exceptions=True)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        one = _run_in_thread(pool, loop_one)
        two = _run_in_thread(pool, loop_two)
        two.result(PATIENCE_S)
        gate.set()
        a_result, c_result = one.result(PATIENCE_S)
    assert a_result is None
    assert c_result is None  # not the CancelledError of a writer on loop 2
    assert calls == [{0: [b"a"]}, {1: [b"b"], 2: [b"c"]}]  # batch two committed, b's update too


def test_a_commit_waited_for_on_another_loop_is_not_cut_off_by_the_end_of_its_own() -> None:
    """Batch two (b, opened on loop 2, joined by c from loop 1) commits in the lasting
    loop: b's cancellation and loop 2's end while it commits do not cut it off."""
    lock = threading.Lock()
    calls: list[Updates] = []
    first_ends, second_ends, b_joined, c_joined = (threading.Event() for _ in range(4))

    async def commit(key: str, target: Any, updates: Updates) -> None:
        with lock:
            calls.append({p: list(u) for p, u in updates.items()})
            gate = first_ends if len(calls) == 1 else second_ends
        while not gate.is_set():  # (not in a thread: loop 2's end would wait for that thread)
            await asyncio.sleep(0.001)

    queue: CommitQueue[Any] = CommitQueue(commit, never_ready, lambda: 100, linger_s=0.005)

    async def loop_one() -> list[BaseException | None]:
        return list(
            await asyncio.gather(
                queue.submit("k", "t", {0: [b"a"]}),
                _c_joins_batch_two(queue, b_joined, c_joined),
                return_exceptions=True,
            )
        )

    async def loop_two() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        assert await asyncio.to_thread(lambda: _wait_for(lambda: len(calls) == 1))
        b = asyncio.ensure_future(queue.submit("k", "t", {1: [b"b"]}))
        await spin(2)
        b_joined.set()
        assert await asyncio.to_thread(lambda: _wait_for(lambda: len(calls) == 2))  # batch two commits
        b.cancel()  # then this loop ends while batch two's commit is under way
        await asyncio.gather(b, return_exceptions=True)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        one = _run_in_thread(pool, loop_one)
        two = _run_in_thread(pool, loop_two)
        assert c_joined.wait(PATIENCE_S)
        first_ends.set()
        two.result(PATIENCE_S)
        second_ends.set()
        assert one.result(PATIENCE_S) == [None, None]
    assert calls == [{0: [b"a"]}, {1: [b"b"], 2: [b"c"]}]  # each batch committed once


def test_a_batch_whose_loop_ended_before_its_first_step_is_carried_on_for_a_later_writer() -> None:
    """The loop that opened a batch ends in that very turn (its commit's task never
    starts); a writer from another loop that joins it later still gets it committed."""
    calls: list[Updates] = []

    async def commit(key: str, target: Any, updates: Updates) -> None:
        calls.append({p: list(u) for p, u in updates.items()})

    queue: CommitQueue[Any] = CommitQueue(commit, never_ready, lambda: 100, linger_s=0.005)

    left: list[asyncio.Future[None]] = []

    async def opens_and_ends() -> None:
        left.append(asyncio.ensure_future(queue.submit("k", "t", {0: [b"a"]})))  # cancelled at once

    asyncio.run(opens_and_ends())

    async def later() -> None:
        await within(queue.submit("k", "t", {1: [b"c"]}), PATIENCE_S)

    asyncio.run(later())
    assert calls[-1] == {1: [b"c"]} or calls[-1] == {0: [b"a"], 1: [b"c"]}


def test_a_shard_whose_batch_ended_with_its_loop_takes_later_writes() -> None:
    """A batch abandoned while lingering (its loop ended, no writer elsewhere) fails its
    own writers only: later writes to the shard, from other loops, are committed."""
    calls: list[Updates] = []

    async def commit(key: str, target: Any, updates: Updates) -> None:
        calls.append({p: list(u) for p, u in updates.items()})

    queue: CommitQueue[Any] = CommitQueue(commit, never_ready, lambda: 100, linger_s=PATIENCE_S)

    left: list[asyncio.Future[None]] = []

    async def opens_and_ends() -> None:
        left.extend(asyncio.ensure_future(queue.submit("k", "t", {n: [b"a"]})) for n in range(2))
        await spin(2)  # (two writers: the batch lingers, until this loop ends)

    asyncio.run(opens_and_ends())
    for n in range(3):
        asyncio.run(within(queue.submit("k", "t", {2: [b"%d" % n]}), PATIENCE_S))
    assert calls == [{2: [b"0"]}, {2: [b"1"]}, {2: [b"2"]}]


def test_a_batch_behind_one_whose_loop_ended_is_committed_for_its_living_writer() -> None:
    """Batch one (b, on loop 2) fails with a CancelledError when loop 2 ends before it
    commits; batch two, opened behind it by c on loop 1, which nobody cancelled, is
    committed, not failed with batch one's CancelledError."""
    calls: list[Updates] = []
    c_submitted = threading.Event()
    left: list[asyncio.Future[None]] = []

    async def commit(key: str, target: Any, updates: Updates) -> None:
        calls.append({p: list(u) for p, u in updates.items()})

    queue: CommitQueue[Any] = CommitQueue(commit, never_ready, lambda: 100, linger_s=PATIENCE_S)

    async def loop_two() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        left.extend(asyncio.ensure_future(queue.submit("k", "t", {n: [b"a"]})) for n in range(2))
        await spin(2)  # (two writers: batch one lingers, until this loop ends)
        await asyncio.to_thread(c_submitted.wait, PATIENCE_S)

    async def loop_one() -> None:
        assert await asyncio.to_thread(lambda: _wait_for(lambda: "k" in queue._pending))
        queue._pending.pop("k")  # (as a commit starting would: c opens batch two behind it)
        c = asyncio.ensure_future(queue.submit("k", "t", {2: [b"c"]}))
        await spin(2)
        c_submitted.set()
        await within(c, PATIENCE_S)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        one = _run_in_thread(pool, loop_one)
        two = _run_in_thread(pool, loop_two)
        two.result(PATIENCE_S)
        assert one.result(PATIENCE_S) is None
    assert calls == [{2: [b"c"]}]


def test_a_commit_whose_writers_all_ended_with_their_loop_is_not_carried_on() -> None:
    """Nothing outlives the call when no writer on another loop waits: the lasting loop
    is given nothing."""
    started = threading.Event()

    async def commit(key: str, target: Any, updates: Updates) -> None:
        started.set()
        await asyncio.sleep(PATIENCE_S)  # cancelled with its loop

    queue: CommitQueue[Any] = CommitQueue(commit, never_ready, lambda: 100, linger_s=0.005)

    async def writer() -> None:
        write = asyncio.ensure_future(queue.submit("k", "t", {0: [b"a"]}))
        await asyncio.to_thread(started.wait, PATIENCE_S)
        write.cancel()
        await asyncio.gather(write, return_exceptions=True)

    asyncio.run(writer())

    async def commits_in_the_lasting_loop() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if "CommitQueue._run" in repr(t.get_coro())]

    # (anything handed over was scheduled before asyncio.run returned, so before this)
    assert (
        asyncio.run_coroutine_threadsafe(commits_in_the_lasting_loop(), lasting_loop()).result(PATIENCE_S)
        == []
    )


def test_an_abandoned_batch_hands_its_shard_back_to_the_batch_ahead_before_failing() -> None:
    """Batch Y, queued behind X (committing on loop A), is abandoned when loop B ends: by
    the time Y's writers hear of it, the shard's next writer queues behind X again,
    never beside it."""
    gate = threading.Event()

    async def commit(key: str, target: Any, updates: Updates) -> None:
        while not gate.is_set():
            await asyncio.sleep(0.001)

    queue: CommitQueue[Any] = CommitQueue(commit, never_ready, lambda: 100, linger_s=0.005)
    seen: list[Any] = []

    async def behind() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        left = asyncio.ensure_future(queue.submit("k", "t", {1: [b"y"]}))
        await spin(2)
        queue._pending["k"].done.add_done_callback(lambda _: seen.append(queue._tail.get("k")))
        seen.append(left)  # (kept: this loop ends with it pending)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ahead = _run_in_thread(pool, lambda: queue.submit("k", "t", {0: [b"x"]}))
        try:
            assert _wait_for(lambda: "k" in queue._tail and "k" not in queue._pending)  # X commits
            x = queue._tail["k"]
            asyncio.run(behind())
        finally:
            gate.set()
        ahead.result(PATIENCE_S)
    assert seen[1] is x  # when Y failed, the shard was X's again
    assert "k" not in queue._tail and queue._busy == 0


def test_a_sync_call_whose_commit_moved_to_the_lasting_loop_still_refuses_to_wait_on_its_loop() -> None:
    """Loop L holds the shard's process lock and makes a synchronous write (a bridge
    serves it); a writer on loop M joins that batch, so it commits in the lasting loop.
    The commit needs L's lock: both get SyncCallError, as L alone does, not a hang."""
    m_joined = threading.Event()

    async def commit(key: str, target: Any, updates: Updates) -> None:
        if key == "other":  # (under way until M has joined: "k"'s batch is no lone write)
            while not m_joined.is_set():
                await asyncio.sleep(0.001)
            return
        async with process_lock("scope", key):
            pass

    def both(target: Any, updates: Updates) -> bool:
        return {1, 2} <= set(updates)

    queue: CommitQueue[Any] = CommitQueue(commit, both, lambda: 100, linger_s=PATIENCE_S)
    got: dict[str, str] = {}
    other_open = threading.Event()

    async def loop_l() -> None:
        await asyncio.to_thread(other_open.wait, PATIENCE_S)
        async with process_lock("scope", "k"):
            try:
                sync_bridge.run(queue.submit("k", "t", {1: [b"L"]}))  # blocks L
                got["L"] = "ok"
            except SyncCallError:
                got["L"] = "SyncCallError"

    async def loop_m() -> None:
        other = asyncio.ensure_future(queue.submit("other", "t", {1: [b"x"]}))
        assert await asyncio.to_thread(lambda: _wait_for(lambda: queue._committing == 1))
        other_open.set()
        assert await asyncio.to_thread(lambda: _wait_for(lambda: "k" in queue._pending))
        join = asyncio.ensure_future(queue.submit("k", "t", {2: [b"M"]}))  # L's batch: both
        await spin(2)
        m_joined.set()
        try:
            await join
            got["M"] = "ok"
        except SyncCallError:
            got["M"] = "SyncCallError"
        await other

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        one = _run_in_thread(pool, loop_l)
        two = _run_in_thread(pool, loop_m)
        one.result(PATIENCE_S)
        two.result(PATIENCE_S)
    assert got == {"L": "SyncCallError", "M": "SyncCallError"}


@pytest.mark.skipif(sys.version_info < (3, 12), reason="asyncio.eager_task_factory is new in Python 3.12")
def test_a_loop_with_eager_tasks_commits() -> None:
    """An eager task runs its first step when made: the batch's task is made once the
    queue's lock is released (it takes that lock itself)."""
    calls: list[Updates] = []

    async def commit(key: str, target: Any, updates: Updates) -> None:
        calls.append(dict(updates))

    queue: CommitQueue[Any] = CommitQueue(commit, never_ready, lambda: 100)

    async def main() -> None:
        asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined,unused-ignore]
        await within(queue.submit("k", "t", {1: [b"x"]}), PATIENCE_S)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, main()).result(PATIENCE_S)
    assert calls == [{1: [b"x"]}]


async def test_waking_a_batch_whose_loop_has_closed_is_harmless() -> None:
    """A writer wakes batches after leaving the queue's lock; by then the batch may be
    committed and the loop it lingered on closed (its writer's ``asyncio.run`` over)."""
    from shardstore.writing.commit_queue import _Batch

    closed = asyncio.new_event_loop()
    batch: _Batch[str] = _Batch("target", closed)
    batch.grew = asyncio.Event()
    closed.close()
    batch.wake()  # from another, running loop: nothing to wake, no error
    assert not batch.grew.is_set()


async def test_a_commit_failing_after_its_waiter_was_cancelled_leaves_no_error_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One call writing two shards: the first commit fails, so the call's wait for the
    second is cancelled; the second commit fails later. Its error is still taken when
    it comes (asyncio would otherwise log "Future exception was never retrieved")."""
    import gc

    from shardstore.tasks import gather

    second_may_fail = asyncio.Event()
    finished: list[str] = []

    async def commit(key: str, target: Any, updates: Updates) -> None:
        try:
            if key == "s2":
                await second_may_fail.wait()
            raise ValueError(key)
        finally:
            finished.append(key)

    # (no lingering: a batch lingers for a time, which loop turns do not measure)
    queue: CommitQueue[Any] = CommitQueue(commit, never_ready, lambda: 100, linger_s=0.0)
    with pytest.raises(ValueError, match="s1"):
        await gather(queue.submit("s1", "t", {0: [b"x"]}), queue.submit("s2", "t", {0: [b"y"]}))
    second_may_fail.set()
    await turns_until(lambda: finished == ["s1", "s2"])
    await spin(5)
    gc.collect()
    await spin(5)
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


# -- reservations: commits made outside the queue ------------------------------------------


def test_a_reserved_shard_commits_later_writes_only_after_release_and_busy_ones_are_not_reserved() -> None:
    """A commit made outside the queue (a whole-shard write) reserves its shards: a write
    submitted to one of them afterwards waits until the reservation is released, as it
    waits for a queued commit; a shard with a batch pending or committing is not reserved
    (its writer must queue behind it)."""

    async def main() -> None:
        commit = FakeCommit()
        queue = make_queue(commit)
        first = start(queue, "busy", {0: [b"a"]})
        await turns_until(lambda: commit.keys == ["busy"])  # committing, held at the gate
        free, release = queue.reserve(["busy", "whole", "other"])
        assert free == ["whole", "other"]
        commit.gate.set()
        await first
        later = start(queue, "whole", {0: [b"b"]})
        await spin(50)
        assert commit.keys == ["busy"] and not later.done()  # behind the reservation
        release()
        await later
        assert commit.keys == ["busy", "whole"]
        free, release = queue.reserve(["whole"])  # released, and nothing pending: free again
        assert free == ["whole"]
        release()

    asyncio.run(main())
