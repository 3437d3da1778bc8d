"""Concurrent writers never lose a chunk, and writes to one shard are merged."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.core.buffer import cpu, default_buffer_prototype
from zarr.testing.store import LatencyStore

from shardstore import ShardingStore
from shardstore.errors import BatchCommitError

from .helpers import quiesce, sample


class CountingMemory(zarr.storage.MemoryStore):
    """A MemoryStore that counts object writes (thread-safe enough for counting)."""

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    async def set(self, key: str, value: Any, byte_range: Any = None) -> None:
        self.sets += 1
        await asyncio.sleep(0.001)  # a little latency, so commits overlap with new writes
        await super().set(key, value)


@pytest.mark.parametrize("concurrency", [10, 128])
def test_whole_array_write_at_zarr_concurrency(concurrency: int) -> None:
    inner = CountingMemory()
    store = ShardingStore(inner, chunks_per_shard=(8, 8))
    data = sample((256, 256), "f4")
    with zarr.config.set({"async.concurrency": concurrency}):
        arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(16, 16), dtype="f4")
        arr[:] = data
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(inner), path="a")[:], data)
    # 256 chunks in 4 shards: merged into far fewer than one shard write per chunk
    chunk_writes = inner.sets - 2  # minus the group and array metadata
    assert chunk_writes < 256 / 2, chunk_writes


def test_threads_writing_regions_that_share_shards() -> None:
    store = ShardingStore(
        LatencyStore(zarr.storage.MemoryStore(), set_latency=0.0005), chunks_per_shard=(4, 4)
    )
    arr = zarr.create_array(store, name="t", shape=(64, 64), chunks=(4, 4), dtype="i4")
    expected = np.zeros((64, 64), dtype="i4")

    def writer(i: int) -> None:
        # thread i writes columns i::8 in 4-wide chunk columns: every shard is shared by several threads
        block = np.full((64, 4), i + 1, dtype="i4")
        arr[:, i * 4 : i * 4 + 4] = block
        arr[i * 4 : i * 4 + 4, 32:] = block[:4, :].repeat(8, axis=1)[:, :32]

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        expected[:, i * 4 : i * 4 + 4] = i + 1
    for i in range(8):
        expected[i * 4 : i * 4 + 4, 32:] = i + 1
    got = zarr.open_array(ShardingStore(store.inner), path="t")[:]
    np.testing.assert_array_equal(got[:, :32], expected[:, :32])
    np.testing.assert_array_equal(got[:32, 32:], expected[:32, 32:])


def test_writers_on_separate_event_loops_share_one_shard() -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=(16,))
    zarr.create_array(store, name="l", shape=(16,), chunks=(1,), dtype="u1", compressors=None)

    failures: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            asyncio.run(store.set(f"l/c/{i}", cpu.Buffer.from_bytes(bytes([i]))))
        except BaseException as exc:  # a thread's exception would only be a warning
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert sorted(k for k in backing if k.startswith("l/c/")) == ["l/c/0"]
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(backing), path="l")[:], np.arange(16))


async def test_concurrent_sets_to_one_shard_are_merged() -> None:
    inner = CountingMemory()
    store = ShardingStore(inner, chunks_per_shard=(64,))
    await zarr.api.asynchronous.create_array(store, name="m", shape=(64,), chunks=(1,), dtype="u1")
    before = inner.sets
    await asyncio.gather(*(store.set(f"m/c/{i}", cpu.Buffer.from_bytes(bytes([i]))) for i in range(64)))
    assert inner.sets - before <= 2  # one commit, perhaps one more for stragglers
    got = await store.get_partial_values(default_buffer_prototype(), [(f"m/c/{i}", None) for i in range(64)])
    assert [g.to_bytes() for g in got if g is not None] == [bytes([i]) for i in range(64)]


async def test_interleaved_writes_and_deletes_in_one_shard() -> None:
    store = ShardingStore(LatencyStore(zarr.storage.MemoryStore(), set_latency=0.001), chunks_per_shard=(8,))
    await zarr.api.asynchronous.create_array(store, name="d", shape=(8,), chunks=(1,), dtype="u1")
    await asyncio.gather(*(store.set(f"d/c/{i}", cpu.Buffer.from_bytes(b"x")) for i in range(8)))
    await asyncio.gather(
        *(store.delete(f"d/c/{i}") for i in range(0, 8, 2)),
        *(store.set(f"d/c/{i}", cpu.Buffer.from_bytes(b"y")) for i in range(1, 8, 2)),
    )
    assert sorted([k async for k in store.list_prefix("d/c/")]) == [f"d/c/{i}" for i in range(1, 8, 2)]
    got = await store.get("d/c/3", default_buffer_prototype())
    assert got is not None and got.to_bytes() == b"y"


def test_failed_commit_keeps_acknowledged_chunks() -> None:
    """zarr keeps writing other chunks after one fails: each shard commit is all-or-nothing."""

    class FailOnce(zarr.storage.MemoryStore):
        armed = False

        async def set(self, key: str, value: Any, byte_range: Any = None) -> None:
            if self.armed and key == "f/c/1":
                raise OSError("injected failure")
            await super().set(key, value)

    inner = FailOnce()
    store = ShardingStore(inner, chunks_per_shard=(4,))
    arr = zarr.create_array(store, name="f", shape=(16,), chunks=(1,), dtype="i2")
    arr[:] = 1
    inner.armed = True
    with pytest.raises(Exception, match="injected failure"):
        arr[:] = 2
    # zarr raises on the first failure while the call's other chunk writes keep running:
    # once they have landed, every other shard holds the new data.
    quiesce()
    got = zarr.open_array(ShardingStore(inner), path="f")[:]
    np.testing.assert_array_equal(got[4:8], [1] * 4)  # the failed shard: old data, whole
    assert set(got[:4]) == {2} and set(got[8:]) == {2}


def test_a_batch_whose_shard_commit_ended_with_a_writers_loop_says_so_at_its_end(tmp_path: Any) -> None:
    """``store.batch()`` is open here; a thread writes a whole shard with its own
    ``asyncio.run``, which ends as soon as the (buffered) write returns and so cancels
    the shard's commit it started. The batch's end reports that shard, whole either
    way, or finds it written; before, it waited for that commit forever."""
    store = ShardingStore(str(tmp_path / "s"), chunks_per_shard=(4, 4))
    zarr.create_array(store, name="a", shape=(4, 8), chunks=(1, 1), dtype="i4", fill_value=-1)

    async def write() -> None:
        arr = await zarr.api.asynchronous.open_array(store=store, path="a")
        await arr.setitem((slice(0, 4), slice(0, 4)), np.full((4, 4), 7, "i4"))

    outcome: list[BaseException | None] = []

    def in_a_batch() -> None:
        try:
            with store.batch():
                thread = threading.Thread(target=asyncio.run, args=(write(),))
                thread.start()
                thread.join()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    batch = threading.Thread(target=in_a_batch, daemon=True)
    batch.start()
    batch.join(60)
    assert outcome, "the batch's end waits for a commit that will never end"
    got = zarr.open_array(store, path="a", mode="r")[:, :4]
    if outcome[0] is None:
        assert (got == 7).all()
    else:
        assert isinstance(outcome[0], BatchCommitError) and set(outcome[0].failed) == {"a/c/0/0"}
        assert "cancelled with the event loop" in str(outcome[0])
        assert (got == 7).all() or (got == -1).all()  # whole, either way
