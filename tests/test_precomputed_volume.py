"""PrecomputedVolume: neuroglancer precomputed volumes written by tensorstore's
``neuroglancer_precomputed`` driver read back chunk by chunk, equal to what
tensorstore reads (axes [x, y, z, channel], absolute coordinates, clipped edge
chunks, 0 for absent chunks), and malformed info files and damaged chunks refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from shardstore import PrecomputedShardedStore, ShardFormatError, ShardingConfigError
from shardstore.neuroglancer.volume import PrecomputedScale, PrecomputedVolume

from .helpers import sharding as sharding_json

ts = pytest.importorskip("tensorstore")


def sharding(
    hash: str = "identity",
    preshift: int = 0,
    minishard: int = 1,
    shard: int = 1,
    index: str = "raw",
    data: str = "raw",
) -> dict[str, Any]:
    """``helpers.sharding`` with this file's order (the hash first) and defaults (every
    argument has one: one minishard bit, one shard bit)."""
    return sharding_json(preshift, minishard, shard, hash, index, data)


def open_ts(root: Path, dtype: str, channels: int, scale: dict[str, Any], create: bool = True) -> Any:
    spec = {
        "driver": "neuroglancer_precomputed",
        "kvstore": {"driver": "file", "path": str(root)},
        "scale_metadata": {"encoding": "raw", **scale},
        "multiscale_metadata": {"data_type": dtype, "num_channels": channels, "type": "image"},
    }
    return ts.open(spec, create=create).result()


def random_data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "float32":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(1, np.iinfo(dtype).max, size=shape, dtype=dtype)  # never 0: every chunk is stored


def reopen(root: Path, scale_index: int) -> Any:
    spec = {"driver": "neuroglancer_precomputed", "kvstore": {"driver": "file", "path": str(root)}}
    return ts.open({**spec, "scale_index": scale_index}).result()


# two scales each: (size, voxel_offset, chunk_size, sharding) — sizes not multiples of the chunk size
CASES = {
    "u16-1ch-identity-raw": (
        "uint16",
        1,
        [
            ((21, 10, 7), (0, 0, 0), (4, 4, 3), sharding()),
            ((11, 5, 4), (3, -2, 1), (4, 2, 2), sharding(minishard=0, shard=0)),
        ],
    ),
    "u8-2ch-murmur-gzip": (
        "uint8",
        2,
        [
            ((13, 9, 10), (5, 7, -3), (3, 4, 4), sharding("murmurhash3_x86_128", 1, 2, 2, "gzip", "gzip")),
            ((7, 5, 5), (2, 3, -2), (8, 8, 8), sharding("murmurhash3_x86_128", 0, 0, 1, "gzip", "raw")),
        ],
    ),
    "f32-2ch-mixed": (
        "float32",
        2,
        [
            ((9, 14, 6), (-4, 0, 2), (2, 5, 4), sharding("identity", 2, 3, 2, "raw", "gzip")),
            ((5, 7, 3), (-2, 0, 1), (2, 3, 2), sharding("murmurhash3_x86_128", 1, 1, 3, "gzip", "gzip")),
        ],
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def volume(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A two-scale volume: scale 0 written only in part (chunks left absent), scale 1 whole."""
    dtype, channels, scales = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    rng = np.random.default_rng(len(request.param))
    for i, (size, offset, chunk, shards) in enumerate(scales):
        t = open_ts(
            root,
            dtype,
            channels,
            {
                "size": list(size),
                "voxel_offset": list(offset),
                "chunk_size": list(chunk),
                "resolution": [2**i, 2**i, 2**i],
                "sharding": shards,
            },
        )
        if i == 0:  # the upper part only: the lower chunks stay absent, one straddles the cut
            lo = [o + s // 3 for o, s in zip(offset, size, strict=True)]
            region = t[lo[0] :, lo[1] :, lo[2] :, :]
            region.write(random_data(rng, region.shape, dtype)).result()
        else:
            t.write(random_data(rng, t.shape, dtype)).result()
    return root, request.param


def test_info_and_scales(volume: tuple[Path, str]) -> None:
    root, name = volume
    dtype, channels, scales = CASES[name]
    v = PrecomputedVolume(root)
    assert v.info == json.loads((root / "info").read_text())
    assert v.dtype == np.dtype(dtype) and v.num_channels == channels
    assert len(v.scale_keys) == 2
    for i, (size, offset, chunk, shards) in enumerate(scales):
        s = v.scale(i)
        assert s is v.scale(s.key) is v.scale(i - 2)
        assert (s.size, s.voxel_offset, s.chunk_size) == (size, offset, chunk)
        assert s.dtype == np.dtype(dtype) and s.num_channels == channels and s.encoding == "raw"
        assert s.sharding is not None and s.sharding.to_json() == shards
        assert s.grid_shape == tuple(-(-a // b) for a, b in zip(size, chunk, strict=True))
        t = reopen(root, i)
        assert s.shape == tuple(t.shape)
        assert [tuple(b) for b in s.bounds] == list(
            zip(t.domain.inclusive_min[:3], t.domain.exclusive_max[:3], strict=True)
        )


def test_whole_scales_equal_tensorstore(volume: tuple[Path, str]) -> None:
    root, _ = volume
    v = PrecomputedVolume(root)
    for i in range(2):
        expected = reopen(root, i).read().result()
        got = v.scale(i).read()
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    assert (v.scale(0).read() == 0).any()  # the unwritten chunks: filled with 0


def test_regions_equal_tensorstore(volume: tuple[Path, str]) -> None:
    root, _ = volume
    v = PrecomputedVolume(root)
    rng = np.random.default_rng(7)
    for i in range(2):
        s, t = v.scale(i), reopen(root, i)
        for _ in range(12):
            ends = [sorted(rng.integers(lo, hi + 1, size=2).tolist()) for lo, hi in s.bounds]
            region = (slice(*ends[0]), slice(*ends[1]), slice(*ends[2]))
            np.testing.assert_array_equal(s.read(region), t[region].read().result())
        (x0, _), (y0, _), _ = s.bounds
        region = (slice(x0 + 1, None), slice(None, y0 + 2), slice(None))  # open ends: the bounds
        np.testing.assert_array_equal(s.read(region), t[region].read().result())


def test_chunks_clipped_at_the_edge_and_absent(volume: tuple[Path, str]) -> None:
    root, _ = volume
    v = PrecomputedVolume(root)
    for i in range(2):
        s, t = v.scale(i), reopen(root, i)
        assert s.store is not None
        positions = [
            (x, y, z)
            for x in range(s.grid_shape[0])
            for y in range(s.grid_shape[1])
            for z in range(s.grid_shape[2])
        ]
        chunks = asyncio.run(s.read_chunks(positions))
        stored = set(s.store)
        for position, chunk in zip(positions, chunks, strict=True):
            start, stop = s.chunk_bounds(position)
            region = tuple(slice(a, b) for a, b in zip(start, stop, strict=True))
            if chunk is None:
                assert s.chunk_id(position) not in stored
                assert not t[region].read().result().any()
                continue
            assert s.chunk_id(position) in stored
            assert chunk.shape == (*(b - a for a, b in zip(start, stop, strict=True)), s.num_channels)
            np.testing.assert_array_equal(chunk, t[region].read().result())
        assert i == 1 or None in chunks  # scale 0 was written in part
        last = tuple(g - 1 for g in s.grid_shape)
        edge = asyncio.run(s.read_chunks(np.array([last])))[0]
        assert edge is not None
        expected = [(n - 1) % c + 1 for n, c in zip(s.size, s.chunk_size, strict=True)]
        assert list(edge.shape[:3]) == expected  # smaller than a chunk where the size is not a multiple
        assert asyncio.run(s.read_chunks([])) == []


def test_other_inner_stores(volume: tuple[Path, str], tmp_path: Path) -> None:
    root, _ = volume
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    expected = [reopen(root, i).read().result() for i in range(2)]
    mapper = fsspec.get_mapper(f"memory://{tmp_path.name}-volume")
    mapper.update(files)
    try:
        for inner in (dict(files), mapper, f"file://{root}"):
            v = PrecomputedVolume(inner)
            for i in range(2):
                np.testing.assert_array_equal(v.scale(i).read(), expected[i])
    finally:
        mapper.clear()


def test_chunk_ids_are_compressed_morton_codes(tmp_path: Path) -> None:
    t = open_ts(
        tmp_path,
        "uint8",
        1,
        {
            "key": "nested/level",
            "size": [16, 8, 3],
            "chunk_size": [2, 2, 2],
            "resolution": [1, 1, 1],
            "sharding": sharding(),
        },
    )
    data = random_data(np.random.default_rng(3), (16, 8, 3, 1), "uint8")
    t.write(data).result()
    s = PrecomputedVolume(tmp_path).scale(0)
    assert s.key == "nested/level" and (tmp_path / "nested/level/0.shard").is_file()
    np.testing.assert_array_equal(s.read(), data)  # a scale key with slashes: a nested directory
    assert s.grid_shape == (8, 4, 2)
    assert [s.chunk_id(p) for p in [(3, 2, 1), (7, 0, 1), (0, 3, 0), (5, 1, 1)]] == [29, 45, 18, 39]
    with pytest.raises(IndexError, match=r"\(8, 0, 0\) is outside the grid"):
        s.chunk_id((8, 0, 0))


def test_unsharded_scale(tmp_path: Path) -> None:
    t = open_ts(
        tmp_path,
        "uint16",
        2,
        {
            "key": "s0",
            "size": [10, 7, 5],
            "voxel_offset": [3, -2, 1],
            "chunk_size": [4, 4, 2],
            "resolution": [1, 1, 1],
        },
    )
    data = random_data(np.random.default_rng(1), (10, 7, 5, 2), "uint16")
    t[3:11, :, :, :].write(data[:8]).result()  # chunks of x in [11, 13) stay absent
    s = PrecomputedVolume(tmp_path).scale("s0")
    assert s.sharding is None and s.store is None
    assert s.chunk_file((2, 1, 2)) == "s0/11-13_2-5_5-6"
    assert (tmp_path / s.chunk_file((1, 1, 2))).is_file()
    assert not (tmp_path / s.chunk_file((2, 1, 2))).exists()
    np.testing.assert_array_equal(s.read(), t.read().result())
    region = (slice(4, 12), slice(0, 5), slice(2, 6))
    np.testing.assert_array_equal(s.read(region), t[region].read().result())
    edge = asyncio.run(s.read_chunks([(1, 1, 2), (2, 0, 0)]))
    assert edge[0] is not None and edge[0].shape == (4, 3, 1, 2) and edge[1] is None
    (tmp_path / s.chunk_file((1, 1, 2))).write_bytes(b"\0" * 10)
    with pytest.raises(ShardFormatError, match=r"chunk file 's0/7-11_2-5_5-6'.*10 bytes, expected 48"):
        s.read()


def test_region_errors(volume: tuple[Path, str]) -> None:
    s = PrecomputedVolume(volume[0]).scale(1)
    (x0, x1), _, _ = s.bounds
    with pytest.raises(IndexError, match=r"region x \[.*not within"):
        s.read((slice(x0 - 1, x1), slice(None), slice(None)))
    with pytest.raises(IndexError, match="region x"):
        s.read((slice(x0, x1 + 1), slice(None), slice(None)))
    with pytest.raises(ValueError, match="step 2"):
        s.read((slice(None, None, 2), slice(None), slice(None)))
    with pytest.raises(TypeError):
        s.read((slice(None), slice(None)))  # type: ignore[arg-type]
    assert s.read((slice(x0, x0), slice(None), slice(None))).shape == (0, *s.shape[1:])
    with pytest.raises(KeyError, match="no scale with key 'nope'"):
        PrecomputedVolume(volume[0]).scale("nope")
    with pytest.raises(IndexError):
        PrecomputedVolume(volume[0]).scale(2)


# -- damage ----------------------------------------------------------------------------


@pytest.mark.parametrize("change", ["short", "full-size edge", "long"])
def test_damaged_chunk(tmp_path: Path, change: str) -> None:
    shards = sharding("murmurhash3_x86_128", 0, 1, 2, "gzip", "gzip")
    t = open_ts(
        tmp_path,
        "uint16",
        2,
        {"key": "k", "size": [6, 5, 3], "chunk_size": [4, 4, 2], "resolution": [1, 1, 1], "sharding": shards},
    )
    t.write(random_data(np.random.default_rng(2), (6, 5, 3, 2), "uint16")).result()
    s = PrecomputedVolume(tmp_path).scale("k")
    position = (1, 1, 1)  # the corner chunk: [2, 1, 1] x, y, z voxels, 2 channels
    chunk_id = s.chunk_id(position)
    store = PrecomputedShardedStore(tmp_path / "k", shards)
    assert len(store[chunk_id]) == 2 * 1 * 1 * 2 * 2
    nbytes = {"short": 6, "full-size edge": 4 * 4 * 2 * 2 * 2, "long": 10}[change]
    store[chunk_id] = b"\1" * nbytes
    shard = "k/" + store.shard_key(chunk_id)
    with pytest.raises(
        ShardFormatError, match=rf"chunk {chunk_id} in shard '{shard}'.*{nbytes} bytes, expected 8"
    ):
        s.read()
    with pytest.raises(ShardFormatError, match=f"chunk {chunk_id}"):
        asyncio.run(s.read_chunks([position]))
    np.testing.assert_array_equal(  # the other chunks still read
        s.read((slice(0, 4), slice(None), slice(None))), t[0:4].read().result()
    )
    with pytest.raises(ValueError, match="chunk length"):  # tensorstore refuses it too
        reopen(tmp_path, 0).read().result()


# -- the info file -----------------------------------------------------------------------


def test_unsupported_encodings(tmp_path: Path) -> None:
    t = open_ts(
        tmp_path,
        "uint8",
        1,
        {"key": "raw", "size": [8, 8, 2], "chunk_size": [4, 4, 2], "resolution": [1, 1, 1]},
    )
    t.write(np.full(t.shape, 5, dtype="uint8")).result()
    open_ts(
        tmp_path,
        "uint8",
        1,
        {"key": "j", "size": [4, 4, 1], "chunk_size": [4, 4, 1], "resolution": [2, 2, 2], "encoding": "jpeg"},
    )
    info = json.loads((tmp_path / "info").read_text())
    info["scales"].append({**info["scales"][0], "key": "cseg", "encoding": "compressed_segmentation"})
    info["scales"].append({**info["scales"][0], "key": "odd", "encoding": "webp"})
    (tmp_path / "info").write_text(json.dumps(info))
    v = PrecomputedVolume(tmp_path)  # the volume opens: its raw scale reads
    assert (v.scale("raw").read() == 5).all()
    for key, encoding in [("j", "jpeg"), ("cseg", "compressed_segmentation"), ("odd", "webp")]:
        with pytest.raises(ShardingConfigError, match=rf"scale '{key}': field 'encoding' is '{encoding}'"):
            v.scale(key)


def _good_info() -> dict[str, Any]:
    return {
        "@type": "neuroglancer_multiscale_volume",
        "data_type": "uint16",
        "num_channels": 1,
        "type": "image",
        "scales": [
            {
                "key": "s0",
                "size": [10, 7, 5],
                "voxel_offset": [0, 0, 0],
                "chunk_sizes": [[4, 4, 2]],
                "encoding": "raw",
                "resolution": [1.0, 1.0, 1.0],
                "sharding": sharding(),
            }
        ],
    }


def _set(path: str, value: Any) -> Any:
    def change(info: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        obj: Any = info
        for p in parents:
            obj = obj[int(p)] if isinstance(obj, list) else obj[p]
        if value is _DELETE:
            del obj[last]
        else:
            obj[last] = value

    return change


_DELETE = object()
BAD_INFOS = {
    "type name": (_set("@type", "neuroglancer_volume"), "'@type'"),
    "no data_type": (_set("data_type", _DELETE), "'data_type' is missing"),
    "bad data_type": (_set("data_type", "complex64"), "'data_type' is 'complex64'"),
    "no num_channels": (_set("num_channels", _DELETE), "'num_channels' is missing"),
    "zero channels": (_set("num_channels", 0), "'num_channels' is 0"),
    "bool channels": (_set("num_channels", True), "'num_channels' is True"),
    "no type": (_set("type", _DELETE), "'type' is missing"),
    "scales not a list": (_set("scales", {}), "'scales' is {}"),
    "scale not an object": (_set("scales", [3]), r"scales\[0\] is 3"),
    "no key": (_set("scales.0.key", _DELETE), r"scales\[0\]: field 'key' is missing"),
    "escaping key": (_set("scales.0.key", "../x"), "field 'key' is '../x'"),
    "no size": (_set("scales.0.size", _DELETE), "scale 's0': field 'size' is missing"),
    "short size": (_set("scales.0.size", [10, 7]), "field 'size' is \\[10, 7\\]"),
    "float offset": (_set("scales.0.voxel_offset", [0, 0.5, 0]), "field 'voxel_offset'"),
    "no chunk_sizes": (_set("scales.0.chunk_sizes", _DELETE), "'chunk_sizes' is missing"),
    "empty chunk_sizes": (_set("scales.0.chunk_sizes", []), "'chunk_sizes' is \\[\\]"),
    "zero chunk size": (_set("scales.0.chunk_sizes", [[4, 0, 2]]), r"chunk_sizes\[0\]"),
    "two sharded chunk sizes": (_set("scales.0.chunk_sizes", [[4, 4, 2], [2, 2, 2]]), "has 2 chunk shapes"),
    "no encoding": (_set("scales.0.encoding", _DELETE), "'encoding' is missing"),
    "no resolution": (_set("scales.0.resolution", _DELETE), "'resolution' is missing"),
    "bad hash": (_set("scales.0.sharding.hash", "md5"), "field 'sharding': field 'hash' is 'md5'"),
    "sharding bits": (_set("scales.0.sharding.shard_bits", -1), "field 'shard_bits' is -1"),
    "ids beyond 64 bits": (
        _set("scales.0.size", [2**30, 2**30, 2**30]),
        "needs chunk ids of 85 bits",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INFOS))
def test_malformed_info(tmp_path: Path, case: str) -> None:
    change, message = BAD_INFOS[case]
    info = _good_info()
    PrecomputedVolume({"info": json.dumps(info).encode()})  # the unchanged one is fine
    change(info)
    with pytest.raises(ShardingConfigError, match=message):
        PrecomputedVolume({"info": json.dumps(info).encode()})


def test_info_not_json_or_missing(tmp_path: Path) -> None:
    with pytest.raises(ShardingConfigError, match="not a JSON document"):
        PrecomputedVolume({"info": b"{nope"})
    with pytest.raises(ShardingConfigError, match="is not a JSON object"):
        PrecomputedVolume({"info": b"[1]"})
    with pytest.raises(ShardingConfigError, match="'info' is missing"):
        PrecomputedVolume(tmp_path)


def test_scale_without_sharding_or_offset_defaults() -> None:
    info = _good_info()
    del info["scales"][0]["voxel_offset"]
    info["scales"][0]["sharding"] = None  # null: unsharded, as tensorstore reads it
    s: PrecomputedScale = PrecomputedVolume({"info": json.dumps(info).encode()}).scale(0)
    assert s.voxel_offset == (0, 0, 0) and s.sharding is None
    assert not s.read().any()  # no chunks: all fill
