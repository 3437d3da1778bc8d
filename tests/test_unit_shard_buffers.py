"""ShardBuffers: memory for shards built in place or read whole, handed out again only
when nothing refers to it any more, and kept for the next call up to SPARE_BYTES."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

from shardstore import shard_buffers
from shardstore.shard_buffers import ShardBuffers


def _address(array: np.ndarray | memoryview) -> int:
    return int(np.frombuffer(array, dtype=np.uint8).__array_interface__["data"][0])


@pytest.fixture(autouse=True)
def _no_spare(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no memory an earlier call left, and hands out again
    arrays of any size."""
    monkeypatch.setattr(shard_buffers, "_SPARE", shard_buffers._Spare())
    monkeypatch.setattr(shard_buffers, "TRACKED_FROM", 0)
    yield


def test_memory_is_handed_out_again_once_nothing_refers_to_it() -> None:
    buffers = ShardBuffers()
    first = buffers.empty(3, 100)
    assert first.shape == (3, 100) and first.dtype == np.uint8
    where = _address(first)
    second = buffers.empty(3, 100)  # the first is still held
    assert not np.shares_memory(first, second)
    del first
    third = buffers.empty(3, 100)
    assert _address(third) == where
    assert buffers.allocated == 2


def test_a_view_of_a_row_keeps_its_memory_from_being_handed_out() -> None:
    """A shard object is a memoryview of one row: while a commit, a batch or a chunk
    holds it (or a slice of it), the rows it shares memory with stay untouched."""
    buffers = ShardBuffers()
    rows = buffers.empty(2, 64)
    rows[1] = 7
    chunk = memoryview(rows[1])[8:16]
    del rows
    other = buffers.empty(2, 64)
    other[:] = 0
    assert bytes(chunk) == bytes([7] * 8)
    assert buffers.allocated == 2
    del chunk, other
    buffers.empty(2, 64)
    assert buffers.allocated == 2


def test_a_shard_read_into_memory_keeps_it_while_a_chunk_of_it_is_held() -> None:
    """A shard read whole is a memoryview of flat memory; a chunk served from it (a
    slice, an array over it) keeps all of it from being read into again."""
    buffers = ShardBuffers()
    shard = buffers.flat(100)
    shard[:] = bytes(range(100))
    chunk = np.frombuffer(memoryview(shard)[10:20], dtype=np.uint8)
    del shard
    other = buffers.flat(100)
    other[:] = bytes(100)
    assert chunk.tolist() == list(range(10, 20))
    del chunk, other
    again = buffers.flat(90)
    assert len(again) == 90 and buffers.allocated == 2


def test_the_smallest_idle_array_that_holds_a_request_serves_it() -> None:
    """Rows of any length and flat memory come from one stock: the smallest idle array
    big enough (a later group of a write is smaller; shards read whole differ a little
    in size); a new one holds a little more than asked, for a slightly bigger shard."""
    buffers = ShardBuffers()
    small, large = buffers.flat(1000), buffers.flat(4000)
    where_small, where_large = _address(small), _address(large)
    del small, large
    fewer = buffers.empty(2, 48)  # 96 bytes: the small one, not the large
    assert fewer.shape == (2, 48) and _address(fewer) == where_small
    bigger = buffers.flat(1000 + 1000 // shard_buffers.ROOM)  # within the room a new one has
    assert _address(bigger) == where_large  # (the small one is still held by ``fewer``)
    del fewer, bigger
    assert _address(buffers.flat(1001)) == where_small
    assert buffers.allocated == 2
    buffers.flat(5000)  # more than any holds
    assert buffers.allocated == 3


def test_threads_asking_at_once_never_share_memory() -> None:
    buffers = ShardBuffers()
    for _ in range(2):
        buffers.empty(1, 16)  # idle ones to hand out
    start = threading.Barrier(8)
    got: list[np.ndarray] = []
    lock = threading.Lock()

    def ask() -> None:
        start.wait()
        for _ in range(50):
            rows = buffers.empty(1, 16)
            with lock:
                got.append(rows)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({_address(rows) for rows in got}) == len(got) == 400  # all held: each its own


def test_idle_memory_is_kept_for_the_next_call_and_held_memory_is_not() -> None:
    """When a call ends, what nothing refers to is kept for the next call; what a
    caller still holds stays the caller's, never handed out while held."""
    with ShardBuffers() as first:
        idle = first.flat(1000)
        held = first.empty(2, 500)
        where_idle, where_held = _address(idle), _address(held)
        held[:] = 5
        del idle
    with ShardBuffers() as second:
        a, b = second.flat(1000), second.flat(1000)
        assert _address(a) == where_idle and where_held not in (_address(a), _address(b))
        assert second.allocated == 1
    assert (held == 5).all()


def test_the_memory_kept_between_calls_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_buffers, "SPARE_BYTES", 2500)
    with ShardBuffers() as first:
        arrays = [first.flat(1000) for _ in range(3)]
        del arrays  # three idle arrays at the end
    with ShardBuffers() as second:
        [second.flat(1000) for _ in range(3)]
        assert second.allocated == 1  # two of 1,031 bytes were kept, not three


def test_the_smallest_kept_array_that_holds_a_request_is_taken_from_what_was_kept() -> None:
    with ShardBuffers() as first:
        arrays = [first.flat(n) for n in (3000, 1000, 2000)]
        where = {len(a): _address(a) for a in arrays}
        del arrays
    with ShardBuffers() as second:
        taken = [second.flat(n) for n in (1500, 900, 1100)]  # (all held)
        assert [_address(a) for a in taken] == [where[2000], where[1000], where[3000]]
        assert second.allocated == 0
        second.flat(1100)
        assert second.allocated == 1


def test_small_arrays_are_always_new_and_never_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below TRACKED_FROM, malloc's heap uses memory again by itself: no array is
    tracked, so a read of a thousand small shards never scans a thousand arrays."""
    monkeypatch.setattr(shard_buffers, "TRACKED_FROM", 1000)
    with ShardBuffers() as buffers:
        for _ in range(50):
            buffers.flat(999)
            buffers.empty(9, 111)
        assert buffers.allocated == 100 and len(buffers._held) == 1
        buffers.flat(1000)  # (let go at once: idle)
        buffers.flat(1000)
        assert buffers.allocated == 101
    with ShardBuffers() as later:
        later.flat(900)
        later.flat(1000)
        assert later.allocated == 1  # the 1,000 bytes kept; nothing smaller was


def test_where_no_reference_count_tells_every_array_is_new(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyPy and free-threaded builds: no count to trust, so no memory handed out twice,
    and none kept for the next call."""
    monkeypatch.setattr(shard_buffers, "_COUNTED", False)
    with ShardBuffers() as buffers:
        buffers.empty(2, 64)  # let go at once
        assert buffers.empty(2, 64).shape == (2, 64)
        assert buffers.allocated == 2
    with ShardBuffers() as later:
        later.flat(128)
        assert later.allocated == 1
