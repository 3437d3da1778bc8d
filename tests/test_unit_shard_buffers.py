"""ShardBuffers: memory for shards built in place, handed out again only when nothing
refers to it any more."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from shardstore import shard_buffers
from shardstore.shard_buffers import ShardBuffers


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


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


def test_fewer_rows_come_from_a_longer_idle_array_and_other_lengths_from_new_ones() -> None:
    buffers = ShardBuffers()
    where = _address(buffers.empty(4, 32))
    fewer = buffers.empty(2, 32)  # (the last group of a write is smaller)
    assert fewer.shape == (2, 32) and _address(fewer) == where
    del fewer
    longer_rows = buffers.empty(2, 48)
    assert longer_rows.shape == (2, 48) and _address(longer_rows) != where
    more = buffers.empty(5, 32)  # more rows than the idle array holds
    assert more.shape == (5, 32) and _address(more) != where
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


def test_where_no_reference_count_tells_every_array_is_new(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyPy and free-threaded builds: no count to trust, so no memory handed out twice."""
    monkeypatch.setattr(shard_buffers, "_COUNTED", False)
    buffers = ShardBuffers()
    buffers.empty(2, 64)  # let go at once
    again = buffers.empty(2, 64)
    assert again.shape == (2, 64) and again.base is None  # its own memory, not rows of a kept one
    assert buffers.allocated == 2
