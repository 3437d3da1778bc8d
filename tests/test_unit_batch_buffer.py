"""Unit tests of shardstore.writing.batch_buffer.WriteBuffer: the buffer behind ``store.batch()``."""

from __future__ import annotations

from typing import Any

import pytest

from shardstore.writing.batch_buffer import Held, WriteBuffer
from shardstore.writing.updates import Splice, Update

Updates = dict[int, list[Update]]


def full_when(positions: int) -> Any:
    """A ``ready`` that calls a shard due once it holds full values for ``positions`` chunks."""

    def ready(target: Any, updates: Updates) -> bool:
        return len(updates) >= positions and all(not isinstance(u[0], Splice) for u in updates.values())

    return ready


def never(target: Any, updates: Updates) -> bool:
    return False


def keys(helds: list[Held[Any]] | None) -> list[str]:
    assert helds is not None
    return [h.shard_key for h in helds]


def test_a_new_buffer_is_empty() -> None:
    """Nothing buffered, nothing in flight, no bytes, no failures."""
    buffer: WriteBuffer[Any] = WriteBuffer(100, never)
    assert buffer.empty
    assert buffer.in_flight() == []
    assert buffer.nbytes == 0
    assert buffer.failures == []
    assert buffer.updates_for("k", 0) is None


def test_add_holds_updates_until_the_shard_is_ready() -> None:
    """Updates are held per shard; the shard is returned due once ``ready`` says so."""
    targets: list[Any] = []

    def ready(target: Any, updates: Updates) -> bool:
        targets.append(target)
        return set(updates) == {0, 1}

    buffer: WriteBuffer[Any] = WriteBuffer(1000, ready)
    assert buffer.add("k", "t1", {0: [b"aa"]}) == []
    assert not buffer.empty
    assert buffer.in_flight() == []
    due = buffer.add("k", "t2", {1: [b"bbb"]})
    assert keys(due) == ["k"]
    assert due is not None
    (held,) = due
    assert held.updates == {0: [b"aa"], 1: [b"bbb"]}
    assert held.target == "t2"  # the latest target
    assert held.nbytes == 5
    assert targets == ["t1", "t2"]
    assert buffer.nbytes == 5  # still counted until its commit has finished
    assert buffer.in_flight() == [held.done]
    assert not held.done.done()


def test_a_shard_added_after_it_went_due_starts_a_new_held_entry() -> None:
    """Once a shard is taken for commit, later updates to it are held anew."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, full_when(1))
    first = buffer.add("k", "t", {0: [b"a"]})
    second = buffer.add("k", "t", {1: [b"b"]})
    assert first is not None and second is not None
    assert first[0] is not second[0]
    assert second[0].updates == {1: [b"b"]}
    assert buffer.in_flight() == [first[0].done, second[0].done]


def test_sizes_count_full_values_and_splice_data() -> None:
    """nbytes counts full values and splice data; an erase counts nothing."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, never)
    buffer.add("k", "t", {0: [b"abcd"], 1: [Splice(3, b"xy")], 2: [None]})
    assert buffer.nbytes == 6
    buffer.add("j", "t", {0: [b"z"]})
    assert buffer.nbytes == 7


def test_over_max_bytes_the_fullest_shards_go_early_down_to_half() -> None:
    """Past max_bytes, the fullest open shards are committed until at most half is left."""
    buffer: WriteBuffer[Any] = WriteBuffer(100, never)
    assert buffer.add("a", "t", {0: [b"x" * 40]}) == []
    assert buffer.add("b", "t", {0: [b"x" * 30]}) == []
    assert buffer.add("c", "t", {0: [b"x" * 20]}) == []
    assert buffer.nbytes == 90
    due = buffer.add("d", "t", {0: [b"x" * 21]})  # 111 bytes: take 40 and 30, leaving 41 <= 50
    assert keys(due) == ["a", "b"]
    assert buffer.nbytes == 111
    assert buffer.updates_for("c", 0) == [b"x" * 20]  # still open
    assert len(buffer.in_flight()) == 2


def test_at_max_bytes_nothing_goes_early() -> None:
    """Exactly max_bytes is not over the limit."""
    buffer: WriteBuffer[Any] = WriteBuffer(10, never)
    assert buffer.add("a", "t", {0: [b"x" * 6]}) == []
    assert buffer.add("b", "t", {0: [b"x" * 4]}) == []
    assert buffer.in_flight() == []


def test_a_ready_shard_counts_towards_the_bytes_freed() -> None:
    """A shard due because it is ready also counts when committing down to half."""
    buffer: WriteBuffer[Any] = WriteBuffer(100, lambda target, updates: target == "full")
    buffer.add("a", "t", {0: [b"x" * 30]})
    buffer.add("b", "t", {0: [b"x" * 20]})
    due = buffer.add("c", "full", {0: [b"x" * 60]})  # 110 > 100; c (60) leaves 50 <= 50
    assert keys(due) == ["c"]


def test_bytes_of_commits_in_flight_keep_counting_until_finished() -> None:
    """Bytes in flight count towards the limit, so more shards go early; finished frees them."""
    buffer: WriteBuffer[Any] = WriteBuffer(100, never)
    buffer.add("a", "t", {0: [b"x" * 80]})
    (a,) = buffer.add("b", "t", {0: [b"x" * 30]}) or []
    assert a.shard_key == "a"
    due = buffer.add("c", "t", {0: [b"x" * 5]})  # 115 in all, 80 of it in flight
    assert keys(due) == ["b", "c"]  # every open shard goes, fullest first
    for held in [a, *(due or [])]:
        buffer.finished(held, None)
    assert buffer.nbytes == 0
    assert buffer.add("d", "t", {0: [b"x" * 60]}) == []


def test_add_after_close_returns_none_and_buffers_nothing() -> None:
    """A closed buffer refuses updates: the caller must write directly."""
    buffer: WriteBuffer[Any] = WriteBuffer(100, full_when(1))
    buffer.close()
    assert buffer.add("k", "t", {0: [b"abc"]}) is None
    assert buffer.nbytes == 0
    assert buffer.empty
    assert buffer.updates_for("k", 0) is None


def test_updates_for_sees_open_updates_in_order() -> None:
    """Open updates read back merged: a full value replaces, a splice stacks."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, never)
    buffer.add("k", "t", {0: [b"abc"]})
    buffer.add("k", "t", {0: [Splice(1, b"X")]})
    assert buffer.updates_for("k", 0) == [b"abc", Splice(1, b"X")]
    buffer.add("k", "t", {0: [b"new"]})
    assert buffer.updates_for("k", 0) == [b"new"]
    assert buffer.updates_for("k", 1) is None
    assert buffer.updates_for("other", 0) is None


def test_updates_for_sees_committing_then_open_updates_in_order() -> None:
    """Updates still committing come first, then newer ones, each commit in the order taken."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, lambda target, updates: target == "go")
    buffer.add("k", "go", {0: [b"first"], 1: [b"one"]})
    buffer.add("k", "go", {0: [Splice(0, b"S")]})
    buffer.add("k", "t", {0: [Splice(1, b"T")], 1: [None]})
    assert len(buffer.in_flight()) == 2
    assert buffer.updates_for("k", 0) == [b"first", Splice(0, b"S"), Splice(1, b"T")]
    assert buffer.updates_for("k", 1) == [None]  # an erase is an update too

    buffer.add("k", "t", {0: [b"last"]})  # a full value hides everything before it
    assert buffer.updates_for("k", 0) == [b"last"]


def test_updates_for_returns_a_copy() -> None:
    """Changing the returned list does not change what the buffer holds."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, never)
    buffer.add("k", "t", {0: [b"a"]})
    got = buffer.updates_for("k", 0)
    assert got is not None
    got.append(b"b")
    assert buffer.updates_for("k", 0) == [b"a"]


def test_finished_without_error_resolves_and_forgets_the_commit() -> None:
    """A finished commit is no longer in flight or readable, its bytes are freed and its
    future resolves."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, full_when(1))
    (held,) = buffer.add("k", "t", {0: [b"abc"]}) or []
    assert not buffer.empty
    buffer.finished(held, None)
    assert held.done.result(0) is None
    assert buffer.in_flight() == []
    assert buffer.updates_for("k", 0) is None
    assert buffer.nbytes == 0
    assert buffer.failures == []
    assert buffer.empty


def test_finished_with_an_error_records_the_failure_and_raises_to_waiters() -> None:
    """A failed commit is recorded in ``failures`` and its future carries the error."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, full_when(1))
    (bad,) = buffer.add("k", "t", {0: [b"abc"]}) or []
    (good,) = buffer.add("j", "t", {0: [b"xy"]}) or []
    error = OSError("inner store down")
    buffer.finished(bad, error)
    assert buffer.failures == [(bad, error)]
    with pytest.raises(OSError, match="inner store down"):
        bad.done.result(0)
    assert buffer.in_flight() == [good.done]
    assert buffer.nbytes == 2
    buffer.finished(good, None)
    assert buffer.failures == [(bad, error)]
    assert buffer.empty


def test_finished_out_of_order_for_one_shard() -> None:
    """Two commits of one shard may finish in any order; each is forgotten on its own."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, never)
    buffer.add("k", "t", {0: [b"a"]})
    (first,) = buffer.take_all()
    buffer.add("k", "t", {0: [Splice(0, b"b")], 1: [b"c"]})
    (second,) = buffer.take_all()
    assert buffer.updates_for("k", 0) == [b"a", Splice(0, b"b")]
    buffer.finished(second, None)
    assert buffer.updates_for("k", 0) == [b"a"]
    assert buffer.updates_for("k", 1) is None
    assert buffer.in_flight() == [first.done]
    buffer.finished(first, None)
    assert buffer.empty


def test_take_all_moves_every_open_shard_to_committing() -> None:
    """take_all hands over every open shard; they stay readable until finished."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, never)
    buffer.add("a", "t", {0: [b"a"]})
    buffer.add("b", "t", {0: [b"b"]})
    taken = buffer.take_all()
    assert sorted(keys(taken)) == ["a", "b"]
    assert buffer.take_all() == []
    assert len(buffer.in_flight()) == 2
    assert buffer.updates_for("a", 0) == [b"a"]
    assert buffer.add("a", "t", {1: [b"x"]}) == []  # a new open entry for "a"
    assert buffer.updates_for("a", 1) == [b"x"]


def test_discard_open_drops_open_shards_only() -> None:
    """discard_open returns and forgets the open shards (and their bytes); commits
    already under way stay in flight and readable."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, lambda target, updates: target == "go")
    (committing,) = buffer.add("a", "go", {0: [b"aaaa"]}) or []
    buffer.add("a", "t", {1: [b"bb"]})
    buffer.add("c", "t", {0: [b"c"]})
    assert buffer.nbytes == 7

    dropped = buffer.discard_open()
    assert sorted(keys(dropped)) == ["a", "c"]
    assert committing not in dropped
    assert buffer.nbytes == 4
    assert buffer.updates_for("a", 1) is None
    assert buffer.updates_for("c", 0) is None
    assert buffer.updates_for("a", 0) == [b"aaaa"]
    assert buffer.in_flight() == [committing.done]
    assert not buffer.empty
    assert buffer.discard_open() == []

    buffer.finished(committing, None)
    assert buffer.empty
    assert buffer.nbytes == 0


def test_empty_tracks_open_and_committing_shards() -> None:
    """empty is false while anything is open or committing."""
    buffer: WriteBuffer[Any] = WriteBuffer(1000, never)
    buffer.add("k", "t", {0: [b"a"]})
    assert not buffer.empty
    (held,) = buffer.take_all()
    assert not buffer.empty
    buffer.finished(held, OSError("x"))
    assert buffer.empty
