"""Unmodified zarr arrays stored in the neuroglancer precomputed sharded format: a
storage transformer of ``type: neuroglancer_uint64_sharded_v1`` maps each chunk's
grid position to its compressed Morton code, the id the format shards by."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
import zarr

from shardstore import PrecomputedShardedStore, ShardingConfigError, ShardingStore
from shardstore.formats.precomputed import PrecomputedSharding, compressed_morton_code, locate_ids

SHARDINGS = [
    PrecomputedSharding(0, "identity", 2, 1, "raw", "raw"),
    PrecomputedSharding(1, "murmurhash3_x86_128", 3, 2, "gzip", "raw"),
    PrecomputedSharding(0, "murmurhash3_x86_128", 0, 0),
]
DATA = np.random.default_rng(7).integers(0, 2**16, (40, 30, 20), dtype="u2")


def _keys(store: ShardingStore, prefix: str) -> list[str]:
    async def collect() -> list[str]:
        return sorted([k async for k in store.list_prefix(prefix)])

    return asyncio.run(collect())


@pytest.mark.parametrize("sharding", SHARDINGS, ids=lambda s: f"{s.hash}-{s.minishard_bits}-{s.shard_bits}")
@pytest.mark.parametrize("inner", ["dir", "dict", "memory"])
def test_a_zarr_array_round_trips_and_its_shards_are_named_as_the_format_says(
    tmp_path: Path, sharding: PrecomputedSharding, inner: str
) -> None:
    backing: Any = {"dir": str(tmp_path), "dict": {}, "memory": zarr.storage.MemoryStore()}[inner]
    store = ShardingStore(backing, chunks_per_shard=sharding)
    arr = zarr.create_array(store, name="vol", shape=DATA.shape, chunks=(8, 8, 8), dtype="u2")
    arr[:] = DATA
    again = zarr.open_array(ShardingStore(backing), path="vol")
    np.testing.assert_array_equal(again[:], DATA)
    np.testing.assert_array_equal(again[3:17, 5:9, 1:19], DATA[3:17, 5:9, 1:19])
    grid = (5, 4, 3)
    positions = np.indices(grid).reshape(3, -1).T
    shards = {int(s) for s in locate_ids(sharding, compressed_morton_code(positions, grid))[0]}
    listed = _keys(ShardingStore(backing, read_strategy="chunk"), "vol/")
    assert listed == sorted(["vol/zarr.json", *(f"vol/c/{i}/{j}/{k}" for i, j, k in positions.tolist())])
    if inner == "dir":
        files = sorted(p.name for p in (tmp_path / "vol" / "c").iterdir())
        assert files == sorted(f"{s:0{(sharding.shard_bits + 3) // 4}x}.shard" for s in shards)


def test_chunk_ids_are_compressed_morton_codes_readable_by_tensorstore(tmp_path: Path) -> None:
    sharding = SHARDINGS[1]
    store = ShardingStore(str(tmp_path), chunks_per_shard=sharding)
    arr = zarr.create_array(
        store, name="vol", shape=DATA.shape, chunks=(8, 8, 8), dtype="u2", compressors=None
    )
    arr[:] = DATA
    kv = ts.KvStore.open(
        {
            "driver": "neuroglancer_uint64_sharded",
            "base": {"driver": "file", "path": str(tmp_path / "vol" / "c") + "/"},
            "metadata": sharding.to_json(),
        }
    ).result()
    for position in [(0, 0, 0), (4, 3, 2), (2, 1, 0)]:
        chunk_id = int(compressed_morton_code(np.array([position]), (5, 4, 3))[0])
        raw = kv.read(chunk_id.to_bytes(8, "big")).result().value
        block = np.frombuffer(raw, dtype="<u2").reshape(8, 8, 8)  # zarr's bytes codec, no compression
        lo = [p * 8 for p in position]
        want = np.zeros((8, 8, 8), dtype="u2")
        part = DATA[lo[0] : lo[0] + 8, lo[1] : lo[1] + 8, lo[2] : lo[2] + 8]
        want[: part.shape[0], : part.shape[1], : part.shape[2]] = part
        np.testing.assert_array_equal(block, want)
    # and the same shards as a key-value store of ours
    assert len(PrecomputedShardedStore(str(tmp_path / "vol" / "c"), sharding)) == 5 * 4 * 3


def test_the_transformer_entry_names_the_format_and_plain_zarr_refuses_it(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path), chunks_per_shard=SHARDINGS[0])
    zarr.create_array(store, name="vol", shape=(16, 16), chunks=(4, 4), dtype="u1")[:] = 3
    doc = json.loads((tmp_path / "vol" / "zarr.json").read_text())
    (entry,) = doc["storage_transformers"]
    assert entry["configuration"]["type"] == "neuroglancer_uint64_sharded_v1"
    assert PrecomputedSharding.from_config(entry["configuration"], "t") == SHARDINGS[0]
    with pytest.raises(Exception, match="shardstore"):
        zarr.open_array(str(tmp_path), path="vol")[:]


def test_listing_erasing_and_partial_writes_go_through_the_shards(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path), chunks_per_shard=SHARDINGS[1])
    arr = zarr.create_array(store, name="vol", shape=(40, 30, 20), chunks=(8, 8, 8), dtype="u2")
    arr[:16] = DATA[:16]
    keys = _keys(store, "vol/")
    assert len(keys) == 1 + 2 * 4 * 3 and "vol/c/1/3/2" in keys and "vol/c/2/0/0" not in keys
    asyncio.run(store.erase_prefix("vol/c/0/"))
    assert len(_keys(store, "vol/")) == 1 + 4 * 3
    again = zarr.open_array(ShardingStore(str(tmp_path)), path="vol")
    np.testing.assert_array_equal(again[8:16], DATA[8:16])
    assert (again[:8] == 0).all()


def test_a_gzip_data_encoding_is_refused_for_zarr_arrays_naming_the_array() -> None:
    store = ShardingStore({}, chunks_per_shard=PrecomputedSharding(0, "identity", 1, 1, "raw", "gzip"))
    with pytest.raises(ShardingConfigError, match=r"'vol'.*data_encoding"):
        zarr.create_array(store, name="vol", shape=(8, 8), chunks=(4, 4), dtype="u1")


def test_the_codec_layout_cannot_describe_the_format() -> None:
    store = ShardingStore({}, chunks_per_shard=SHARDINGS[0], layout="codec")
    arr = zarr.create_array(store, name="vol", shape=(8, 8), chunks=(4, 4), dtype="u1")
    arr[:] = 5  # the format is recorded as a transformer, which is the only way to describe it
    assert (zarr.open_array(ShardingStore(store.inner), path="vol")[:] == 5).all()


def test_the_command_line_sees_the_chunks_and_their_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardstore.cli import main

    store = ShardingStore(str(tmp_path), chunks_per_shard=SHARDINGS[0])
    arr = zarr.create_array(store, name="vol", shape=(40, 30, 20), chunks=(8, 8, 8), dtype="u2")
    arr[:] = DATA
    assert main(["ls", str(tmp_path), "vol"]) == 0
    listed = capsys.readouterr().out.split()
    assert len([k for k in listed if k.startswith("vol/c/")]) == 5 * 4 * 3
    assert main(["verify", str(tmp_path)]) == 0
    capsys.readouterr()
    shard = tmp_path / "vol" / "c" / "1.shard"
    shard.write_bytes(shard.read_bytes()[:-5])
    assert main(["verify", str(tmp_path)]) == 1
    assert "vol/c/1.shard" in capsys.readouterr().out


def test_a_chunk_read_reads_its_minishard_not_the_whole_shard(tmp_path: Path) -> None:
    from shardstore.instrument import CountingInner

    store = ShardingStore(str(tmp_path), chunks_per_shard=SHARDINGS[1])
    written = zarr.create_array(
        store, name="vol", shape=DATA.shape, chunks=(8, 8, 8), dtype="u2", compressors=None
    )
    written[:] = DATA
    counted = CountingInner(str(tmp_path))
    arr = zarr.open_array(ShardingStore(counted, read_strategy="chunk"), path="vol")
    counted.counts.reset()
    np.testing.assert_array_equal(arr[0:8, 0:8, 0:8], DATA[0:8, 0:8, 0:8])
    cold = counted.counts
    assert cold.reads == 3  # shard index entry, minishard index, the chunk
    assert cold.bytes_read < 2 * 8 * 8 * 8 * 2  # about one chunk: not the shard
    counted.counts.reset()
    np.testing.assert_array_equal(arr[8:16, 0:8, 0:8], DATA[8:16, 0:8, 0:8])
    assert counted.counts.reads <= 3  # another minishard, perhaps: never the whole shard
    counted.counts.reset()
    np.testing.assert_array_equal(arr[0:8, 0:8, 0:8], DATA[0:8, 0:8, 0:8])
    assert counted.counts.reads == 1  # warm: the cached minishard index locates it


def test_a_write_through_the_store_is_seen_by_its_next_read(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path), chunks_per_shard=SHARDINGS[1], index_cache="trust")
    arr = zarr.create_array(store, name="vol", shape=(32, 32), chunks=(8, 8), dtype="u1")
    arr[:] = 1
    assert (arr[:8, :8] == 1).all()  # minishard indices cached (trusted)
    arr[:8, :8] = 2
    assert (arr[:8, :8] == 2).all() and (arr[8:, :] == 1).all()


def test_a_sharding_object_as_chunks_per_shard_is_the_format_not_a_mapping_of_paths(tmp_path: Path) -> None:
    sharding = {
        "@type": "neuroglancer_uint64_sharded_v1",
        "preshift_bits": 1,
        "hash": "identity",
        "minishard_bits": 2,
        "shard_bits": 2,
    }
    for name, cps in (("a", sharding), ("b", {"b": sharding})):
        arr = zarr.create_array(
            ShardingStore(str(tmp_path), chunks_per_shard=cps),
            name=name,
            shape=(64, 64),
            chunks=(16, 16),
            dtype="i4",
        )
        arr[:] = 3
        assert sorted(p.name for p in (tmp_path / name / "c").iterdir()) == ["0.shard", "1.shard"]
        np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path)), path=name)[:], 3)
    with pytest.raises(ShardingConfigError, match="chunks_per_shard: field 'preshift_bits' is missing"):
        ShardingStore(
            str(tmp_path), chunks_per_shard={k: v for k, v in sharding.items() if k != "preshift_bits"}
        )
