"""Round trips through unmodified zarr: what goes in comes out, on every inner store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zarr

from shardstore import ShardingStore
from shardstore.formats.indexed import IndexedFormat

from .helpers import inner_get, inner_keys, logical_keys, sample, shard_chunks

V3_ENCODINGS = [
    {"name": "default", "separator": "/"},
    {"name": "default", "separator": "."},
    {"name": "v2", "separator": "."},
    {"name": "v2", "separator": "/"},
]


def _create(
    store: Any, zarr_format: int = 3, encoding: dict[str, str] | None = None, **kwargs: Any
) -> zarr.Array:
    if encoding is not None:
        kwargs["chunk_key_encoding"] = encoding
    return zarr.create_array(store, zarr_format=zarr_format, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("encoding", V3_ENCODINGS, ids=lambda e: f"{e['name']}{e['separator']}")
def test_v3_encodings_roundtrip_and_shard_keys(
    make_store: Callable[..., ShardingStore], encoding: dict[str, str]
) -> None:
    store = make_store((2, 3))
    data = sample((9, 13), "i4")
    arr = _create(store, encoding=encoding, name="g/a", shape=data.shape, chunks=(2, 2), dtype="i4")
    arr[:] = data
    np.testing.assert_array_equal(zarr.open_array(store, path="g/a")[:], data)

    sep = encoding["separator"]
    prefix = "c" + sep if encoding["name"] == "default" else ""
    # chunk grid 5 x 7 -> shard grid 3 x 3, keys in the array's own encoding
    expected_shards = {f"g/a/{prefix}{i}{sep}{j}" for i in range(3) for j in range(3)}
    stored = {k for k in inner_keys(store) if not k.endswith("zarr.json")}
    assert stored == expected_shards
    expected_chunks = {f"g/a/{prefix}{i}{sep}{j}" for i in range(5) for j in range(7)}
    assert {k for k in logical_keys(store, "g/a/") if not k.endswith("zarr.json")} == expected_chunks


@pytest.mark.parametrize("separator", [".", "/"])
def test_v2_arrays_roundtrip(make_store: Callable[..., ShardingStore], separator: str) -> None:
    store = make_store((3,))
    zarr.create_group(store, zarr_format=2)
    data = sample((20,), "f8")
    arr = _create(
        store,
        zarr_format=2,
        name="v2",
        shape=data.shape,
        chunks=(3,),
        dtype="f8",
        chunk_key_encoding={"name": "v2", "separator": separator},
    )
    arr[:] = data
    reopened = ShardingStore(store.inner)  # no config: read back from .zarray
    np.testing.assert_array_equal(zarr.open_array(reopened, path="v2", zarr_format=2)[:], data)
    assert sorted(
        k for k in inner_keys(store) if k.startswith("v2/") and not k.split("/")[-1].startswith(".")
    ) == ["v2/0", "v2/1", "v2/2"]
    assert len([k for k in logical_keys(reopened, "v2/") if not k.split("/")[-1].startswith(".")]) == 7


@pytest.mark.parametrize("dtype", ["bool", "i1", "u2", "i4", "u8", "f2", "f4", "f8", "c8", "c16", "S5", "U4"])
def test_dtypes(dtype: str) -> None:
    store = ShardingStore({}, chunks_per_shard=(2, 2))
    data = sample((7, 5), dtype)
    arr = zarr.create_array(store, name="x", shape=data.shape, chunks=(2, 2), dtype=data.dtype)
    arr[:] = data
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(store.inner), path="x")[:], data)


@pytest.mark.parametrize("fill_value", [0, 7, -3.5, np.nan])
def test_fill_values_and_write_empty_chunks(fill_value: float) -> None:
    store = ShardingStore({}, chunks_per_shard=(2, 2))
    arr = zarr.create_array(
        store,
        name="x",
        shape=(8, 8),
        chunks=(2, 2),
        dtype="f4",
        fill_value=fill_value,
        config={"write_empty_chunks": False},
    )
    arr[0:2, 0:2] = 1.0
    arr[2:4, 2:4] = fill_value  # all fill: zarr deletes (never writes) this chunk
    expected = np.full((8, 8), fill_value, dtype="f4")
    expected[0:2, 0:2] = 1.0
    np.testing.assert_array_equal(zarr.open_array(store, path="x")[:], expected)
    assert [k for k in logical_keys(store) if "/c/" in k] == ["x/c/0/0"]
    assert [k for k in inner_keys(store) if "/c/" in k] == ["x/c/0/0"]
    arr[0:2, 0:2] = fill_value  # the only chunk becomes fill: the shard object goes
    assert [k for k in inner_keys(store) if "/c/" in k] == []


@pytest.mark.parametrize(
    ("shape", "chunks", "cps"),
    [
        ((5,), (2,), (2,)),
        ((7, 9), (3, 2), (2, 3)),
        ((5, 6, 7), (2, 3, 4), (2, 2, 2)),
        ((3, 4, 5, 6), (2, 2, 2, 2), (1, 2, 1, 2)),
        ((10, 10), (10, 10), (4, 4)),  # one chunk in a big shard
    ],
)
def test_ranks_and_ragged_edges(
    shape: tuple[int, ...], chunks: tuple[int, ...], cps: tuple[int, ...]
) -> None:
    store = ShardingStore({}, chunks_per_shard=cps)
    data = sample(shape, "u2")
    arr = zarr.create_array(store, name="x", shape=shape, chunks=chunks, dtype="u2")
    arr[...] = data
    np.testing.assert_array_equal(arr[...], data)
    grid = [-(-s // c) for s, c in zip(shape, chunks, strict=True)]
    shards = [-(-g // p) for g, p in zip(grid, cps, strict=True)]
    assert len([k for k in inner_keys(store) if "/c/" in k]) == int(np.prod(shards))
    assert len([k for k in logical_keys(store) if "/c/" in k]) == int(np.prod(grid))


def test_zero_d_array_stays_unsharded() -> None:
    store = ShardingStore({}, chunks_per_shard=(2, 2))
    arr = zarr.create_array(store, name="s", shape=(), dtype="f8")
    arr[...] = 4.5
    assert zarr.open_array(store, path="s")[...] == 4.5
    assert "s/c" in inner_keys(store)  # plain zarr chunk key: nothing to shard


def test_zero_length_dimension() -> None:
    store = ShardingStore({}, chunks_per_shard=(2, 2))
    arr = zarr.create_array(store, name="z", shape=(0, 5), chunks=(1, 2), dtype="i2")
    assert arr[:].shape == (0, 5)
    arr.resize((3, 5))
    arr[:] = 1
    np.testing.assert_array_equal(arr[:], np.ones((3, 5), "i2"))


def test_resize_append_into_new_shards(make_store: Callable[..., ShardingStore]) -> None:
    store = make_store((2, 2))
    arr = zarr.create_array(store, name="t", shape=(4, 4), chunks=(2, 2), dtype="i4")
    arr[:] = 1
    arr.append(np.full((6, 4), 2, dtype="i4"), axis=0)
    assert arr.shape == (10, 4)
    expected = np.concatenate([np.ones((4, 4), "i4"), np.full((6, 4), 2, "i4")])
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(store.inner), path="t")[:], expected)
    arr.resize((3, 4))  # shrink: zarr deletes the chunks outside the new grid
    assert sorted(k for k in logical_keys(store) if "/c/" in k) == [
        "t/c/0/0",
        "t/c/0/1",
        "t/c/1/0",
        "t/c/1/1",
    ]
    arr.resize((10, 4))  # grow back: the old rows must read as fill value, not stale data
    np.testing.assert_array_equal(arr[4:], np.zeros((6, 4), "i4"))


def test_partial_overwrite_of_existing_shard(make_store: Callable[..., ShardingStore]) -> None:
    store = make_store((4, 4))
    data = sample((16, 16), "f4")
    arr = zarr.create_array(store, name="p", shape=data.shape, chunks=(2, 2), dtype="f4")
    arr[:] = data
    arr[3:6, 1:2] = -1.0  # touches chunks of one shard, partly
    data[3:6, 1:2] = -1.0
    arr[7:9, 7:9] = 5.0  # one element in each of four shards
    data[7:9, 7:9] = 5.0
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(store.inner), path="p")[:], data)


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_chunk_bytes_equal_unsharded_zarr(codec: str) -> None:
    """Inside a shard, each chunk's bytes are exactly what zarr writes without sharding."""
    data = sample((12, 10), "f4")
    compressors = None if codec == "none" else "auto"
    plain = zarr.storage.MemoryStore()
    sharded = ShardingStore({}, chunks_per_shard=(2, 2))
    for store in (plain, sharded):
        arr = zarr.create_array(
            store, name="b", shape=data.shape, chunks=(3, 4), dtype="f4", compressors=compressors
        )
        arr[:] = data
    layout = IndexedFormat((2, 2))
    for i in range(4):
        for j in range(3):
            expected = plain._store_dict[f"b/c/{i}/{j}"].to_bytes()
            chunks = shard_chunks(sharded, f"b/c/{i // 2}/{j // 2}", layout)
            assert chunks[(i % 2) * 2 + (j % 2)] == expected


def test_shard_is_codec_binary_format() -> None:
    """A shard object decodes with zarr's own sharding codec reading the same bytes."""
    data = sample((8, 8), "i2")
    sharded = ShardingStore({}, chunks_per_shard=(2, 2))
    zarr.create_array(sharded, name="s", shape=data.shape, chunks=(2, 2), dtype="i2", compressors=None)[:] = (
        data
    )
    codec_store = zarr.storage.MemoryStore()
    codec_arr = zarr.create_array(
        codec_store, name="s", shape=data.shape, chunks=(2, 2), shards=(4, 4), dtype="i2", compressors=None
    )
    # zarr's codec assumes a crc32c index unless told otherwise: rewrite its metadata to ours
    meta = codec_arr.metadata.to_dict()
    meta["codecs"][0]["configuration"]["index_codecs"] = [
        {"name": "bytes", "configuration": {"endian": "little"}}
    ]
    import json

    from zarr.core.buffer import cpu

    codec_store._store_dict["s/zarr.json"] = cpu.Buffer.from_bytes(json.dumps(meta).encode())
    for i in range(2):
        for j in range(2):
            raw = inner_get(sharded, f"s/c/{i}/{j}")
            assert raw is not None
            codec_store._store_dict[f"s/c/{i}/{j}"] = cpu.Buffer.from_bytes(raw)
    np.testing.assert_array_equal(zarr.open_array(codec_store, path="s")[:], data)


def test_group_hierarchy_and_reopen(make_store: Callable[..., ShardingStore]) -> None:
    store = make_store({"g/a": [2, 2], "g/sub/b": [3]})
    root = zarr.open_group(store, mode="w")
    g = root.create_group("g")
    a = g.create_array("a", shape=(6, 6), chunks=(2, 2), dtype="u1")
    b = g.create_group("sub").create_array("b", shape=(10,), chunks=(2,), dtype="u1")
    c = g.create_array("c", shape=(6,), chunks=(2,), dtype="u1")  # not in the mapping: unsharded
    a[:] = 1
    b[:] = 2
    c[:] = 3
    again = zarr.open_group(ShardingStore(store.inner), mode="r")
    assert sorted(n for n, _ in again["g"].members(max_depth=None)) == ["a", "c", "sub", "sub/b"]
    assert again["g/a"][:].sum() == 36 and again["g/sub/b"][:].sum() == 20 and again["g/c"][:].sum() == 18
    stored = inner_keys(store)
    assert "g/c/c/2" in stored  # unsharded chunk, as zarr wrote it
    assert [k for k in stored if k.startswith("g/sub/b/c/")] == ["g/sub/b/c/0", "g/sub/b/c/1"]
