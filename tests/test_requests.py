"""What the store asks of the inner store: counted, because counts are stable."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import zarr
from zarr.core.buffer import cpu, default_buffer_prototype

from shardstore import ShardFormatError, ShardingStore
from shardstore.inner import LocalInner
from shardstore.instrument import CountingInner


def _setup(root: Path, cps: tuple[int, ...] = (4, 4)) -> tuple[ShardingStore, CountingInner, zarr.Array]:
    # a local directory: range reads there are checked against their index's version
    # (in memory, where they cannot be, shards are read whole)
    counted = CountingInner(LocalInner(str(root)))
    store = ShardingStore(counted, chunks_per_shard=cps)
    arr = zarr.create_array(store, name="a", shape=(16, 16), chunks=(2, 2), dtype="u2", compressors=None)
    return store, counted, arr


async def test_writes_covering_a_whole_shard_do_not_read_it() -> None:
    counted = CountingInner({})
    store = ShardingStore(counted, chunks_per_shard=(4, 4))
    await zarr.api.asynchronous.create_array(store, name="a", shape=(16, 16), chunks=(2, 2), dtype="u2")
    counted.counts.reset()
    chunk = cpu.Buffer.from_bytes(b"12345678")
    await asyncio.gather(*(store.set(f"a/c/{i}/{j}", chunk) for i in range(4) for j in range(4)))
    assert counted.counts.reads == 0
    assert counted.counts.writes == 1
    assert counted.counts.bytes_written == 16 * 8 + 16 * 16


async def test_a_write_of_every_in_array_chunk_of_an_edge_shard_still_reads_it() -> None:
    """Another process may have grown the array and written chunks past the edge this
    store knows: a shard made without reading the old one would drop them."""
    counted = CountingInner({})
    store = ShardingStore(counted, chunks_per_shard=(4,))
    await zarr.api.asynchronous.create_array(store, name="e", shape=(10,), chunks=(2,), dtype="u2")
    counted.counts.reset()
    await store.set("e/c/4", cpu.Buffer.from_bytes(b"abcd"))  # the last shard holds one in-grid chunk
    assert counted.counts.reads == 1 and counted.counts.writes == 1
    counted.counts.reset()
    await store.set_many([(f"e/c/{i}", b"abcd") for i in range(4)])  # a whole shard inside: no read
    assert counted.counts.reads == 0 and counted.counts.writes == 1


def test_chunk_read_is_two_ranged_requests(tmp_path: Path) -> None:
    _store, counted, arr = _setup(tmp_path)
    arr[:] = np.arange(256, dtype="u2").reshape(16, 16)
    counted.counts.reset()
    assert arr[3, 5] == 3 * 16 + 5
    assert counted.counts.reads == 2  # index (a suffix read), then the chunk's range
    assert counted.counts.read_batches == 2
    assert not counted.counts.unranged_reads
    assert counted.counts.bytes_read == 16 * 16 + 2 * 2 * 2  # a 16-entry index, one 8-byte chunk


def test_get_partial_values_is_two_rounds_across_shards(tmp_path: Path) -> None:
    store, counted, arr = _setup(tmp_path)
    arr[:] = 7
    counted.counts.reset()
    keys = [(f"a/c/{i}/{j}", None) for i in (0, 1, 4, 5) for j in (0, 4)]  # 2 of 16 chunks in 4 shards
    values = asyncio.run(store.get_partial_values(default_buffer_prototype(), keys))
    assert all(v is not None and len(v) == 8 for v in values)
    assert counted.counts.read_batches == 2
    assert counted.counts.reads == 4 + 4  # four indices, then each shard's 2 ranges as one


def test_get_partial_values_wanting_most_of_each_shard_fetches_them_whole(tmp_path: Path) -> None:
    store, counted, arr = _setup(tmp_path)
    arr[:] = 7
    counted.counts.reset()
    keys = [(f"a/c/{i}/{j}", None) for i in range(8) for j in range(8)]
    values = asyncio.run(store.get_partial_values(default_buffer_prototype(), keys))
    assert all(v is not None and len(v) == 8 for v in values)
    assert counted.counts.read_batches == 1
    assert counted.counts.reads == 4  # each shard one request, its index parsed from its tail


def test_erasing_a_whole_array_reads_no_shard(tmp_path: Path) -> None:
    store, counted, arr = _setup(tmp_path)
    arr[:] = 1
    counted.counts.reset()
    asyncio.run(store.delete_dir("a"))
    assert not any("/c/" in k for k in counted.counts.read_keys)
    assert counted.counts.deletes == 4 + 1  # four shards, then the metadata


def test_geometry_follows_another_store_instance() -> None:
    """Another instance grows the array; this one's cached geometry must follow."""
    counted = CountingInner({})
    first = ShardingStore(counted, chunks_per_shard=(2,))
    arr = zarr.create_array(first, name="g", shape=(4,), chunks=(1,), dtype="u1", compressors=None)
    arr[:] = 1
    second = ShardingStore(counted)
    other = zarr.open_array(second, path="g")
    other.resize((8,))
    # ``first`` cached a 4-chunk grid; a write at chunk 6 refreshes it instead of failing
    asyncio.run(first.set("g/c/6", cpu.Buffer.from_bytes(b"\x09")))
    np.testing.assert_array_equal(zarr.open_array(first, path="g")[:], [1, 1, 1, 1, 0, 0, 9, 0])


def _keys(it: Any) -> list[str]:
    async def collect() -> list[str]:
        return sorted([k async for k in it])

    return asyncio.run(collect())


def test_listing_reads_only_indices(tmp_path: Path) -> None:
    store, counted, arr = _setup(tmp_path)
    arr[0:2, 0:2] = 1
    arr[10:12, 14:16] = 1
    counted.counts.reset()
    assert _keys(store.list_prefix("a/")) == ["a/c/0/0", "a/c/5/7", "a/zarr.json"]
    assert counted.counts.reads == 2  # metadata known from zarr's own writes: just the 2 indices
    assert counted.counts.bytes_read <= 2 * 16 * 16 + 2000


async def test_concurrent_gets_of_a_whole_shard_are_one_request() -> None:
    counted = CountingInner({})
    store = ShardingStore(counted, chunks_per_shard=(4, 4))
    arr = await zarr.api.asynchronous.create_array(store, name="a", shape=(16, 16), chunks=(2, 2), dtype="u2")
    await arr.setitem(slice(None), np.arange(256, dtype="u2").reshape(16, 16))
    counted.counts.reset()
    proto = default_buffer_prototype()
    keys = [f"a/c/{i}/{j}" for i in range(4) for j in range(4)]  # all 16 chunks of shard (0, 0)
    values = await asyncio.gather(*(store.get(k, proto) for k in keys))
    assert all(v is not None for v in values)
    assert counted.counts.read_keys["a/c/0/0"] == 1  # the whole shard in one request
    assert counted.counts.read_batches == 1


async def test_a_corrupt_shard_fails_only_its_own_reads() -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=(2, 2))
    arr = await zarr.api.asynchronous.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="u1")
    await arr.setitem(slice(None), 1)
    backing["a/c/1/1"] = b"garbage"
    proto = default_buffer_prototype()
    results = await asyncio.gather(
        store.get("a/c/0/0", proto),
        store.get("a/c/2/2", proto),
        store.get("a/c/1/0", proto),
        return_exceptions=True,
    )
    assert results[0] is not None and results[2] is not None
    assert isinstance(results[1], ShardFormatError) and "a/c/1/1" in str(results[1])


async def test_a_warm_read_sends_no_empty_batch_to_the_inner_store(tmp_path: Path) -> None:
    """Cached indices: the read goes straight to its ranges, no empty calls (each is a
    task and, on local files, a thread hop)."""
    from shardstore.inner import LocalInner
    from shardstore.inner.delegating import DelegatingInner

    class Calls(DelegatingInner):
        sizes: ClassVar[list[int]] = []

        async def get_many_versioned(self, requests: Any, expected: Any) -> Any:
            self.sizes.append(len(requests))
            return await self.inner.get_many_versioned(requests, expected)

    inner = Calls(LocalInner(tmp_path))
    store = ShardingStore(inner, chunks_per_shard=(4, 4), read_strategy="chunk")
    arr = await zarr.api.asynchronous.create_array(store, name="a", shape=(16, 16), chunks=(2, 2), dtype="u1")
    await arr.setitem(slice(None), 7)
    await arr.getitem((slice(0, 2), slice(0, 2)))  # the index is read and cached
    inner.sizes.clear()
    await arr.getitem((slice(2, 4), slice(0, 2)))
    assert inner.sizes and 0 not in inner.sizes
