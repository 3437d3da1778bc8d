"""The shard-index cache: fewer requests, never stale data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardstore import ShardingStore
from shardstore.inner import LocalInner
from shardstore.instrument import CountingInner
from shardstore.reading import reader


def _write(store: ShardingStore, value: float = 1.0, **kwargs: Any) -> zarr.Array:
    arr = zarr.create_array(
        store, name="a", shape=(64, 64), chunks=(8, 8), dtype="f4", overwrite=True, **kwargs
    )
    arr[:] = value
    return arr


def test_warm_chunk_read_is_one_request_on_local_files(tmp_path: Path) -> None:
    counted = CountingInner(LocalInner(tmp_path))
    # index_cache="auto": validated for free here; "chunk": always ranges
    store = ShardingStore(counted, chunks_per_shard=(4, 4), read_strategy="chunk")
    arr = _write(store)
    assert arr[3, 3] == 1  # cold: index, then chunk
    counted.counts.reset()
    assert arr[5, 6] == 1 and arr[20, 20] == 1  # warm (both in shard (0, 0)): one read each
    assert counted.counts.reads == 2


def test_auto_fetches_a_repeatedly_read_local_shard_whole_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "REPEAT_WINDOW", 3600.0)  # "again and again" however slow the machine
    counted = CountingInner(LocalInner(tmp_path))
    store = ShardingStore(counted, chunks_per_shard=(4, 4))
    arr = _write(store)
    assert arr[3, 3] == 1 and arr[5, 6] == 1  # cold: index, then chunk; warm: chunk
    counted.counts.reset()
    assert arr[10, 6] == 1  # read again and again: the whole shard, in one request
    assert arr[20, 20] == 1 and arr[30, 1] == 1  # then from memory, its version checked by a stat
    assert counted.counts.reads == 1 and counted.counts.read_keys["a/c/0/0"] == 1


def test_trust_mode_caches_on_any_inner_store() -> None:
    counted = CountingInner({})
    store = ShardingStore(counted, chunks_per_shard=(4, 4), index_cache="trust")
    arr = _write(store)
    assert arr[0, 0] == 1
    counted.counts.reset()
    assert arr[1, 1] == 1
    assert counted.counts.reads == 0  # in memory shards are read whole: trusted, it is kept


def test_auto_mode_does_not_cache_where_it_cannot_validate() -> None:
    counted = CountingInner({})
    store = ShardingStore(counted, chunks_per_shard=(4, 4))
    arr = _write(store)
    assert arr[0, 0] == 1
    counted.counts.reset()
    assert arr[1, 1] == 1
    assert counted.counts.reads == 1  # the whole shard (one consistent read), every time


@pytest.mark.parametrize("mode", ["auto", "trust"])
def test_read_after_own_write_is_fresh(tmp_path: Path, mode: str) -> None:
    store = ShardingStore(LocalInner(tmp_path), chunks_per_shard=(4, 4), index_cache=mode)  # type: ignore[arg-type]
    arr = _write(store)
    for value in range(5):
        arr[0:8, 0:8] = value
        assert arr[3, 3] == value and arr[9, 9] == 1


@pytest.mark.parametrize("strategy", ["rewrite", "append"])
def test_another_writer_is_detected_never_garbage(tmp_path: Path, strategy: str) -> None:
    reader = ShardingStore(str(tmp_path), chunks_per_shard=(4, 4))
    writer = ShardingStore(str(tmp_path), chunks_per_shard=(4, 4), write_strategy=strategy)  # type: ignore[arg-type]
    _write(writer, compressors=None)
    arr = zarr.open_array(reader, path="a")
    assert arr[0, 0] == 1  # the reader caches shard (0, 0)'s index
    other = zarr.open_array(writer, path="a")
    rng = np.random.default_rng(0)
    for _ in range(5):
        new = rng.standard_normal((8, 8)).astype("f4")
        other[8:16, 0:8] = new  # rewrites (or appends to) the same shard
        np.testing.assert_array_equal(arr[8:16, 0:8], new)


def test_cache_stays_within_its_bound(tmp_path: Path) -> None:
    store = ShardingStore(LocalInner(tmp_path), chunks_per_shard=(2, 2), index_cache_bytes=4 * 64)
    arr = _write(store)
    _ = arr[:]  # 16 shards, each a 64-byte index
    entries, nbytes = store.internals.cache_usage()["indices"]
    assert nbytes <= 4 * 64
    assert entries == 4


def test_a_chunk_another_writer_adds_is_seen_at_once_on_local_files(tmp_path: Path) -> None:
    """An "absent" from a cached index is checked by a stat: a chunk added since is read."""
    counted = CountingInner(LocalInner(tmp_path))
    reader = ShardingStore(counted, chunks_per_shard=(4, 4), read_strategy="chunk")
    writer = ShardingStore(str(tmp_path), chunks_per_shard=(4, 4))
    zarr.create_array(writer, name="a", shape=(64, 64), chunks=(8, 8), dtype="f4")[0:8, 0:8] = 1
    arr = zarr.open_array(reader, path="a")
    assert arr[0, 0] == 1 and arr[8, 8] == 0  # shard (0, 0) indexed: chunk (1, 1) absent
    counted.counts.reset()
    assert arr[9, 9] == 0
    assert counted.counts.reads == 0  # unchanged shard: the cached index answers
    zarr.open_array(writer, path="a")[8:16, 8:16] = 2
    assert arr[9, 9] == 2
