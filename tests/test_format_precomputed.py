"""The neuroglancer precomputed sharded format: hashing, naming, Morton codes, byte
layout checked against tensorstore both ways, and damaged shards."""

from __future__ import annotations

import gzip
import itertools
import os
import struct
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from shardstore.errors import ShardFormatError, ShardingConfigError
from shardstore.formats.precomputed import (
    TYPE_NAME,
    PrecomputedSharding,
    build_shard,
    chunk_hash,
    compressed_morton_code,
    decode_chunk,
    decode_minishard_index,
    decode_shard_index,
    locate_ids,
    murmurhash3_x86_128_64,
    parse_shard,
    shard_file_name,
    shard_number_of_name,
    shard_problems,
    split_shard,
)

from .helpers import sharding as sharding_json

ts = pytest.importorskip("tensorstore")

U64_MAX = 2**64 - 1


def sharding(
    preshift: int, minishard: int, shard: int, hash: str = "identity", index: str = "raw", data: str = "raw"
) -> PrecomputedSharding:
    """``helpers.sharding``, parsed: the format functions here take the object, not its JSON."""
    return PrecomputedSharding.from_json(sharding_json(preshift, minishard, shard, hash, index, data))


# -- MurmurHash3_x86_128 ------------------------------------------------------------------


def _murmur_reference(value: int) -> int:
    """Textbook MurmurHash3_x86_128 (seed 0) over 8 little-endian bytes, scalar."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def fmix(h: int) -> int:
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & mask
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & mask
        return h ^ (h >> 16)

    c1, c2, c3, c4 = 0x239B961B, 0xAB0E9789, 0x38B34AE5, 0xA1E38B93
    data = value.to_bytes(8, "little")
    h1 = h2 = h3 = h4 = 0
    # no 16-byte blocks; the tail holds 8 bytes: k2 from bytes 4..7, k1 from bytes 0..3
    k2 = int.from_bytes(data[4:8], "little")
    h2 ^= (rotl((k2 * c2) & mask, 16) * c3) & mask
    k1 = int.from_bytes(data[0:4], "little")
    h1 ^= (rotl((k1 * c1) & mask, 15) * c2) & mask
    assert c4  # used only by blocks 3 and 4 of the tail, absent with 8 bytes
    h1, h2, h3, h4 = h1 ^ 8, h2 ^ 8, h3 ^ 8, h4 ^ 8
    h1 = (h1 + h2 + h3 + h4) & mask
    h2, h3, h4 = (h2 + h1) & mask, (h3 + h1) & mask, (h4 + h1) & mask
    h1, h2, h3, h4 = fmix(h1), fmix(h2), fmix(h3), fmix(h4)
    h1 = (h1 + h2 + h3 + h4) & mask
    h2 = (h2 + h1) & mask
    return h1 | (h2 << 32)


def test_murmurhash_known_vectors() -> None:
    # tensorstore's murmurhash3_test.cc (computed with pymmh3), seed 0: (h[0], h[1])
    vectors = {0: (0xE028AE41, 0x4772B084), 1: (0x16D4CE9A, 0xE8BD67D6), 42: (0x5119F47A, 0xC20B94F9)}
    got = murmurhash3_x86_128_64(np.array(list(vectors), dtype=np.uint64))
    assert got.tolist() == [lo | (hi << 32) for lo, hi in vectors.values()]


@given(st.lists(st.integers(0, U64_MAX), max_size=20))
def test_murmurhash_matches_scalar_reference(values: list[int]) -> None:
    got = murmurhash3_x86_128_64(np.array(values, dtype=np.uint64))
    assert got.tolist() == [_murmur_reference(v) for v in values]


def test_murmurhash_keeps_shape_and_hashes_after_preshift() -> None:
    ids = np.arange(12, dtype=np.uint64).reshape(3, 4)
    assert murmurhash3_x86_128_64(ids).shape == (3, 4)
    spec = sharding(2, 3, 4, "murmurhash3_x86_128")
    assert chunk_hash(spec, ids).tolist() == murmurhash3_x86_128_64(ids >> np.uint64(2)).tolist()
    assert chunk_hash(sharding(64, 0, 0), np.array([U64_MAX], np.uint64)).tolist() == [0]


def test_ids_that_would_wrap_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        locate_ids(sharding(0, 1, 1), np.array([1, -1]))
    with pytest.raises(ValueError, match="unsigned"):
        locate_ids(sharding(0, 1, 1), np.array([1.5]))


# -- shard numbers and names ----------------------------------------------------------------


def test_locate_ids_splits_the_hash_into_minishard_then_shard() -> None:
    spec = sharding(1, 2, 3)
    shards, minishards = locate_ids(spec, np.array([0b1_011_10_1, 2**63 + 7], dtype=np.uint64))
    assert shards.tolist() == [0b011, 0]
    assert minishards.tolist() == [0b10, 0b11]


@pytest.mark.parametrize(
    ("shard_bits", "shard", "name"),
    [(0, 0, "0.shard"), (1, 1, "1.shard"), (4, 15, "f.shard"), (5, 10, "0a.shard"), (9, 0x1AB, "1ab.shard")],
)
def test_shard_file_names(shard_bits: int, shard: int, name: str) -> None:
    spec = sharding(0, 2, shard_bits)
    assert shard_file_name(spec, shard) == name
    assert shard_number_of_name(spec, name) == shard


@pytest.mark.parametrize(
    "name", ["0A.shard", "a.shard", "00a.shard", "100.shard", "x0.shard", "0a.shard.tmp", "0a"]
)
def test_names_that_are_not_shards_of_this_sharding(name: str) -> None:
    spec = sharding(0, 0, 8)  # two digits, shards 00..ff
    assert shard_number_of_name(spec, name) is None


def test_shard_numbers_outside_the_sharding_have_no_name() -> None:
    with pytest.raises(ValueError, match="outside"):
        shard_file_name(sharding(0, 0, 3), 8)


@given(st.integers(0, 24), st.data())
def test_shard_names_roundtrip(shard_bits: int, data: st.DataObject) -> None:
    spec = sharding(0, 0, shard_bits)
    shard = data.draw(st.integers(0, 2**shard_bits - 1))
    name = shard_file_name(spec, shard)
    assert len(name) == max(1, -(-shard_bits // 4)) + len(".shard")
    assert shard_number_of_name(spec, name) == shard


# -- compressed Morton codes -----------------------------------------------------------------


def test_compressed_morton_code_examples() -> None:
    positions = np.array([(3, 2, 1), (7, 0, 1), (0, 3, 0), (5, 1, 1)])
    assert compressed_morton_code(positions, (8, 4, 2)).tolist() == [29, 45, 18, 39]


@given(st.lists(st.integers(1, 9), min_size=1, max_size=4))
def test_compressed_morton_code_is_a_bijection_onto_the_grid(grid: list[int]) -> None:
    positions = np.array(list(itertools.product(*(range(s) for s in grid))), dtype=np.int64)
    codes = compressed_morton_code(positions, grid)
    bits = sum((s - 1).bit_length() for s in grid)
    assert len(set(codes.tolist())) == len(positions)
    assert int(codes.max()) < 2**bits


def test_compressed_morton_code_refuses_positions_outside_the_grid() -> None:
    with pytest.raises(ValueError, match="inside the grid"):
        compressed_morton_code(np.array([(8, 0, 0)]), (8, 4, 2))
    with pytest.raises(ValueError, match="shape"):
        compressed_morton_code(np.array([(1, 0)]), (8, 4, 2))


def test_compressed_morton_code_matches_tensorstore_volumes(tmp_path: Path) -> None:
    """tensorstore's sharded volume stores chunk (x, y, z) under the id we compute."""
    grid = (8, 4, 2)
    store = ts.open(
        {
            "driver": "neuroglancer_precomputed",
            "kvstore": {"driver": "file", "path": f"{tmp_path}/"},
            "multiscale_metadata": {"data_type": "uint8", "num_channels": 1, "type": "image"},
            "scale_metadata": {
                "size": [2 * g for g in grid],
                "chunk_size": [2, 2, 2],
                "resolution": [1, 1, 1],
                "encoding": "raw",
                "sharding": sharding(0, 0, 0).to_json(),
            },
            "create": True,
        }
    ).result()
    cells = np.indices(grid).reshape(3, -1).T
    values = np.zeros([2 * g for g in grid] + [1], dtype=np.uint8)
    for x, y, z in cells:
        values[2 * x : 2 * x + 2, 2 * y : 2 * y + 2, 2 * z : 2 * z + 2] = 1 + x + 8 * y + 32 * z
    store.write(values).result()
    (shard_path,) = (
        Path(root) / f for root, _, files in os.walk(tmp_path) for f in files if f.endswith(".shard")
    )
    chunks = split_shard(sharding(0, 0, 0), shard_path.read_bytes(), str(shard_path))
    codes = compressed_morton_code(cells, grid).tolist()
    assert {chunk_id: data[0] for chunk_id, data in chunks.items()} == {
        code: 1 + x + 8 * y + 32 * z for code, (x, y, z) in zip(codes, cells.tolist(), strict=True)
    }


# -- configuration ----------------------------------------------------------------------------


def test_json_roundtrip_and_defaults() -> None:
    obj = {
        "@type": TYPE_NAME,
        "preshift_bits": 9,
        "hash": "murmurhash3_x86_128",
        "minishard_bits": 6,
        "shard_bits": 15,
    }
    spec = PrecomputedSharding.from_json(obj)
    assert spec.minishard_index_encoding == spec.data_encoding == "raw"
    assert spec.shard_index_nbytes == 16 * 64
    assert spec.to_json() == {**obj, "minishard_index_encoding": "raw", "data_encoding": "raw"}
    assert PrecomputedSharding.from_json(spec.to_json()) == spec


def test_json_is_what_tensorstore_writes(tmp_path: Path) -> None:
    spec = sharding(2, 3, 4, "murmurhash3_x86_128", "gzip", "raw")
    kv = _kvstore(tmp_path, spec)
    assert kv.spec().to_json()["metadata"] == spec.to_json()


VALID = {"@type": TYPE_NAME, "preshift_bits": 0, "hash": "identity", "minishard_bits": 2, "shard_bits": 3}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"@type": "neuroglancer_uint64_sharded_v2"}, "neuroglancer_uint64_sharded_v2"),
        ({"@type": None}, "'@type'"),
        ({"preshift_bits": True}, "preshift_bits' is True"),
        ({"preshift_bits": -1}, "preshift_bits' is -1"),
        ({"shard_bits": 65}, "shard_bits' is 65"),
        ({"minishard_bits": 2.0}, "minishard_bits' is 2.0"),
        ({"minishard_bits": "2"}, "minishard_bits' is '2'"),
        ({"minishard_bits": 33, "shard_bits": 0}, "minishard_bits' is 33"),
        ({"preshift_bits": 30, "minishard_bits": 20, "shard_bits": 20}, "30 + 20 + 20 = 70"),
        ({"hash": "murmurhash3_x64_128"}, "hash' is 'murmurhash3_x64_128'"),
        ({"hash": None}, "'hash'"),
        ({"data_encoding": "zlib"}, "data_encoding' is 'zlib'"),
        ({"minishard_index_encoding": "GZIP"}, "minishard_index_encoding' is 'GZIP'"),
        ({"chunk_size": 64}, "'chunk_size' (value 64)"),
    ],
)
def test_bad_sharding_json_is_refused_naming_field_and_value(change: dict[str, Any], named: str) -> None:
    obj = {k: v for k, v in {**VALID, **change}.items() if v is not None}
    with pytest.raises(ShardingConfigError, match=r"^scale 0: ") as info:
        PrecomputedSharding.from_json(obj, where="scale 0")
    assert named in str(info.value)


def test_non_objects_and_direct_construction_are_checked() -> None:
    with pytest.raises(ShardingConfigError, match="not a JSON object"):
        PrecomputedSharding.from_json([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ShardingConfigError, match="shard_bits' is 70"):
        PrecomputedSharding(0, "identity", 0, 70)
    with pytest.raises(ShardingConfigError, match="hash' is 'md5'"):
        PrecomputedSharding(0, "md5", 0, 0)  # type: ignore[arg-type]


# -- interop with tensorstore ----------------------------------------------------------------

SETTINGS = [
    sharding(0, 0, 0),
    sharding(0, 0, 0, "murmurhash3_x86_128", "gzip", "gzip"),
    sharding(1, 2, 3, "identity", "gzip", "gzip"),
    sharding(0, 3, 2, "murmurhash3_x86_128", "raw", "gzip"),
    sharding(2, 0, 5, "murmurhash3_x86_128", "gzip", "raw"),
    sharding(0, 4, 0, "identity", "raw", "raw"),
    sharding(3, 2, 9, "identity", "raw", "gzip"),
    sharding(9, 6, 6, "murmurhash3_x86_128", "raw", "raw"),
]
SETTING_IDS = [
    f"{s.hash[:8]}-p{s.preshift_bits}m{s.minishard_bits}s{s.shard_bits}-{s.minishard_index_encoding}-{s.data_encoding}"
    for s in SETTINGS
]


def _kvstore(path: Path, spec: PrecomputedSharding) -> Any:
    return ts.KvStore.open(
        {
            "driver": "neuroglancer_uint64_sharded",
            "base": {"driver": "file", "path": f"{path}/"},
            "metadata": spec.to_json(),
        }
    ).result()


def _key(chunk_id: int) -> bytes:
    return struct.pack(">Q", chunk_id)  # tensorstore's keys: the id as 8 big-endian bytes


def _chunks(seed: int) -> dict[int, bytes]:
    rng = np.random.default_rng(seed)
    ids = {0, 1, 2, 3, 511, 512, 4096, 2**32, 2**63, U64_MAX, *rng.integers(0, 2**63, 40).tolist()}
    ids |= set(rng.integers(0, 5000, 40).tolist())
    sizes = rng.integers(0, 300, len(ids))
    return {
        int(i): (b"" if n == 0 else bytes(rng.integers(0, 4, int(n), dtype=np.uint8)))
        for i, n in zip(sorted(ids), sizes, strict=True)
    }


def _by_shard(spec: PrecomputedSharding, chunks: dict[int, bytes]) -> dict[int, dict[int, bytes]]:
    ids = np.array(list(chunks), dtype=np.uint64)
    shards, _ = locate_ids(spec, ids)
    grouped: dict[int, dict[int, bytes]] = defaultdict(dict)
    for chunk_id, shard in zip(ids.tolist(), shards.tolist(), strict=True):
        grouped[shard][chunk_id] = chunks[chunk_id]
    return grouped


def _layout(spec: PrecomputedSharding, blob: bytes) -> list[tuple[str, int]]:
    """What lies where in a shard file, in file order, checking it leaves no gaps: the
    layout without the sizes (tensorstore's deflate, not zlib's, makes other gzip bytes)."""
    table = decode_shard_index(spec, blob[: spec.shard_index_nbytes], "k")
    regions = [
        (int(start), int(end), "index", m) for m, (start, end) in enumerate(table.tolist()) if end > start
    ]
    for start, end, _, _ in regions[:]:
        absolute = blob[spec.shard_index_nbytes + start : spec.shard_index_nbytes + end]
        rows = decode_minishard_index(spec, absolute, "k") - np.array(
            [0, spec.shard_index_nbytes, 0], np.uint64
        )
        regions += [
            (int(offset), int(offset + nbytes), "chunk", int(i)) for i, offset, nbytes in rows.tolist()
        ]
    regions.sort()
    assert [start for start, *_ in regions] == [0, *(end for _, end, *_ in regions[:-1])]
    assert spec.shard_index_nbytes + regions[-1][1] == len(blob)
    return [(kind, ident) for *_, kind, ident in regions]


@pytest.mark.parametrize("spec", SETTINGS, ids=SETTING_IDS)
def test_shards_tensorstore_writes_are_read_and_rebuilt_byte_for_byte(
    tmp_path: Path, spec: PrecomputedSharding
) -> None:
    chunks = _chunks(spec.shard_bits)
    kv = _kvstore(tmp_path, spec)
    with ts.Transaction() as txn:
        for chunk_id, data in chunks.items():
            kv.with_transaction(txn).write(_key(chunk_id), data).result()
    assert sorted(kv.list().result()) == sorted(map(_key, chunks))  # big-endian keys list in id order
    expected = _by_shard(spec, chunks)
    files = sorted(os.listdir(tmp_path))
    assert files == sorted(shard_file_name(spec, shard) for shard in expected)
    for name in files:
        blob = (tmp_path / name).read_bytes()
        shard = shard_number_of_name(spec, name)
        assert shard is not None
        assert split_shard(spec, blob, name) == expected[shard]
        assert shard_problems(spec, blob, name) == []
        ours = build_shard(spec, expected[shard])
        assert _layout(spec, ours) == _layout(spec, blob)
        if spec.data_encoding == spec.minishard_index_encoding == "raw":
            assert ours == blob


@pytest.mark.parametrize("spec", SETTINGS, ids=SETTING_IDS)
def test_shards_we_build_are_read_by_tensorstore(tmp_path: Path, spec: PrecomputedSharding) -> None:
    chunks = _chunks(100 + spec.shard_bits)
    for shard, members in _by_shard(spec, chunks).items():
        (tmp_path / shard_file_name(spec, shard)).write_bytes(build_shard(spec, members))
    kv = _kvstore(tmp_path, spec)
    reads = {chunk_id: kv.read(_key(chunk_id)) for chunk_id in chunks}
    assert {chunk_id: future.result().value for chunk_id, future in reads.items()} == chunks
    assert sorted(kv.list().result()) == sorted(map(_key, chunks))
    absent = kv.read(_key(123456789)).result()
    assert absent.state == "missing"


def test_tensorstore_keys_are_big_endian_ids(tmp_path: Path) -> None:
    spec = sharding(0, 0, 0)
    kv = _kvstore(tmp_path, spec)
    kv.write(struct.pack(">Q", 0x0102), b"big").result()
    assert split_shard(spec, (tmp_path / "0.shard").read_bytes(), "0.shard") == {0x0102: b"big"}


def test_murmurhash_places_ids_where_tensorstore_does(tmp_path: Path) -> None:
    spec = sharding(0, 2, 4, "murmurhash3_x86_128")
    ids = [0, 1, 42, 1000, 2**40 + 3, U64_MAX]
    kv = _kvstore(tmp_path, spec)
    for chunk_id in ids:
        kv.write(_key(chunk_id), b"x").result()
    shards, minishards = locate_ids(spec, np.array(ids, dtype=np.uint64))
    for chunk_id, shard, minishard in zip(ids, shards.tolist(), minishards.tolist(), strict=True):
        blob = (tmp_path / shard_file_name(spec, shard)).read_bytes()
        offset, _ = parse_shard(spec, blob, "k")[chunk_id]
        # the chunk sits in the data of the minishard whose index follows it
        table = decode_shard_index(spec, blob[: spec.shard_index_nbytes], "k")
        first_after = min(
            int(end)
            for start, end in table.tolist()
            if start != end and start + spec.shard_index_nbytes > offset
        )
        assert int(table[minishard, 1]) == first_after


def test_offsets_delta_encode_against_the_previous_chunk_end_modulo_2_64(tmp_path: Path) -> None:
    """Chunks stored out of id order (a negative offset delta, wrapped in uint64): read as
    tensorstore reads them."""
    spec = sharding(0, 0, 0)
    data = b"AAAA" + b"BBBBBB"  # chunk 7 first, chunk 3 after it
    starts = [4, 0]  # chunk 3 at [4, 10), chunk 7 at [0, 4), relative to the shard index end
    table = np.array([[3, 4], [starts[0], (starts[1] - (starts[0] + 6)) % 2**64], [6, 4]], dtype="<u8")
    index = table.tobytes()
    blob = np.array([len(data), len(data) + len(index)], dtype="<u8").tobytes() + data + index
    assert split_shard(spec, blob, "0.shard") == {3: b"BBBBBB", 7: b"AAAA"}
    rows = decode_minishard_index(spec, index, "k")
    assert rows.tolist() == [[3, 20, 6], [7, 16, 4]]
    (tmp_path / "0.shard").write_bytes(blob)
    kv = _kvstore(tmp_path, spec)
    assert kv.read(_key(3)).result().value == b"BBBBBB"
    assert kv.read(_key(7)).result().value == b"AAAA"


# -- building ------------------------------------------------------------------------------------


def test_build_layout_minishards_in_order_ids_sorted() -> None:
    spec = sharding(0, 1, 0)
    blob = build_shard(spec, {5: b"e", 2: b"bb", 3: b"ccc", 4: b"d"})
    # minishard 0: chunks 2, 4 then its index; minishard 1: chunks 3, 5 then its index
    assert decode_shard_index(spec, blob[:32], "k").tolist() == [[3, 3 + 48], [55, 55 + 48]]
    assert blob[32:35] == b"bbd"
    assert np.frombuffer(blob[35:83], "<u8").tolist() == [2, 2, 0, 0, 2, 1]
    assert blob[83:87] == b"ccce"
    assert np.frombuffer(blob[87:135], "<u8").tolist() == [3, 2, 51, 0, 3, 1]
    assert len(blob) == 135
    assert parse_shard(spec, blob, "k") == {2: (32, 2), 4: (34, 1), 3: (83, 3), 5: (86, 1)}


def test_gzip_is_one_gzip_member_as_tensorstore_writes() -> None:
    spec = sharding(0, 0, 0, "identity", "gzip", "gzip")
    blob = build_shard(spec, {1: b"hello" * 10})
    ((offset, nbytes),) = parse_shard(spec, blob, "k").values()
    stored = blob[offset : offset + nbytes]
    assert stored[:4] == b"\x1f\x8b\x08\x00" and stored[8] == 2  # gzip header, mtime 0, level 9
    assert gzip.decompress(stored) == b"hello" * 10
    assert decode_chunk(spec, gzip.compress(b"other", mtime=0), "k") == b"other"  # any gzip header
    for bad, why in [
        (zlib.compress(b"hello"), "not a valid gzip"),
        (stored + stored, "follow the gzip stream"),
        (stored[:-3], "truncated"),
        (stored[:-5] + bytes([stored[-5] ^ 1]) + stored[-4:], "not a valid gzip"),
    ]:
        with pytest.raises(ShardFormatError, match=why) as info:
            decode_chunk(spec, bad, "some/0.shard")
        assert "some/0.shard" in str(info.value)


def test_gzip_output_is_bounded() -> None:
    spec = sharding(0, 0, 0, "identity", "raw", "gzip")
    blob = build_shard(spec, {1: bytes(10_000)})
    with pytest.raises(ShardFormatError, match="more than 1000 bytes"):
        split_shard(spec, blob, "k", max_nbytes=1000)
    assert split_shard(spec, blob, "k", max_nbytes=10_000) == {1: bytes(10_000)}
    assert any("more than 1000" in p for p in shard_problems(spec, blob, "k", max_nbytes=1000))


def test_build_refuses_chunks_of_several_shards_and_bad_ids() -> None:
    spec = sharding(0, 1, 2)
    assert build_shard(spec, {}) == b""  # not a shard: callers delete the object
    with pytest.raises(ValueError, match="different shards"):
        build_shard(spec, {0: b"a", 2: b"b"})
    with pytest.raises(ValueError, match="not a uint64"):
        build_shard(spec, {-1: b"a"})
    with pytest.raises(ValueError, match="not a uint64"):
        build_shard(spec, {2**64: b"a"})


@given(
    st.sampled_from(SETTINGS),
    st.dictionaries(st.integers(0, U64_MAX), st.binary(max_size=30), max_size=12),
)
def test_build_then_split_roundtrip(spec: PrecomputedSharding, chunks: dict[int, bytes]) -> None:
    for shard, members in _by_shard(spec, chunks).items():
        name = shard_file_name(spec, shard)
        blob = build_shard(spec, members)
        assert split_shard(spec, blob, name) == members
        assert shard_problems(spec, blob, name) == []


# -- damaged shards ------------------------------------------------------------------------------


def test_empty_and_truncated_objects() -> None:
    spec = sharding(0, 2, 0)
    with pytest.raises(ShardFormatError, match="'a/b': empty object"):
        parse_shard(spec, b"", "a/b")
    blob = build_shard(spec, {1: b"one", 2: b"two"})
    with pytest.raises(ShardFormatError, match="'k': truncated: 40 bytes, fewer than the 64-byte"):
        parse_shard(spec, blob[:40], "k")
    with pytest.raises(ShardFormatError, match="'k': truncated: minishard indices past the end"):
        parse_shard(spec, blob[:-1], "k")


def test_shard_index_checks() -> None:
    spec = sharding(0, 1, 0)
    with pytest.raises(ShardFormatError, match="'k': expected a shard index of 32 bytes, found 16"):
        decode_shard_index(spec, bytes(16), "k")
    backwards = np.array([[0, 0], [10, 5]], "<u8").tobytes()
    with pytest.raises(ShardFormatError, match="ending before they start: minishard 1"):
        decode_shard_index(spec, backwards, "k")
    absurd = np.array([[0, 2**60], [0, 0]], "<u8").tobytes()
    with pytest.raises(ShardFormatError, match="beyond"):
        decode_shard_index(spec, absurd, "k")
    with pytest.raises(ShardFormatError, match="beyond"):
        parse_shard(spec, absurd + bytes(100), "k")


def test_minishard_index_checks() -> None:
    spec = sharding(0, 0, 0)

    def index(*rows: list[int]) -> bytes:
        return np.array(rows, dtype="<u8").T.copy().tobytes()

    assert decode_minishard_index(spec, index([5, 0, 1], [2, 1, 0]), "k").tolist() == [[5, 16, 1], [7, 18, 0]]
    with pytest.raises(ShardFormatError, match="'k': minishard index: decoded length 23"):
        decode_minishard_index(spec, bytes(23), "k")
    with pytest.raises(ShardFormatError, match="not strictly increasing"):
        decode_minishard_index(spec, index([5, 0, 1], [0, 0, 1]), "k")
    with pytest.raises(ShardFormatError, match="not strictly increasing"):  # ids wrapping around
        decode_minishard_index(spec, index([5, 0, 1], [U64_MAX, 0, 1]), "k")
    with pytest.raises(ShardFormatError, match="impossible byte range"):
        decode_minishard_index(spec, index([5, 2**62, 1]), "k")
    with pytest.raises(ShardFormatError, match="impossible byte range"):
        decode_minishard_index(spec, index([5, 0, U64_MAX]), "k")
    with pytest.raises(ShardFormatError, match="impossible byte range"):  # an offset wrapping below zero
        decode_minishard_index(spec, index([5, 2**64 - 20, 1]), "k")


def test_chunks_in_the_wrong_place_are_found() -> None:
    spec = sharding(0, 1, 2)
    blob = build_shard(spec, {1: b"a", 9: b"b"})  # shard 0, minishard 1
    assert parse_shard(spec, blob, "0.shard") == parse_shard(spec, blob, "x")
    with pytest.raises(ShardFormatError, match=r"'data/2\.shard': chunks of another shard than 2: chunk 1"):
        parse_shard(spec, blob, "data/2.shard")
    with pytest.raises(ShardFormatError, match="another shard than 3"):
        parse_shard(spec, blob, "x", shard=3)
    other = sharding(0, 1, 2, "murmurhash3_x86_128")
    problems = shard_problems(other, blob, "k")
    assert any("wrong minishard" in p or "another shard" in p for p in problems)


def test_overlapping_ranges_are_found() -> None:
    spec = sharding(0, 1, 0)
    blob = bytearray(build_shard(spec, {0: b"aa", 1: b"bb"}))
    # point minishard 1's index at minishard 0's
    blob[16:32] = blob[0:16]
    problems = shard_problems(spec, bytes(blob), "k")
    assert problems == [
        "chunks listed in the wrong minishard: chunk 0 [32, 34) in minishard 1, hashes to 0",
        "overlapping byte ranges: chunk 0 [32, 34) and chunk 0 [32, 34), "
        "minishard 0 index [34, 58) and minishard 1 index [34, 58)",
    ]
    with pytest.raises(ShardFormatError, match=r"overlapping|wrong minishard"):
        parse_shard(spec, bytes(blob), "k")


def _fuzz_bases() -> list[tuple[PrecomputedSharding, str, bytes]]:
    bases = []
    for spec in SETTINGS:
        for shard, members in sorted(_by_shard(spec, _chunks(7)).items())[:2]:
            small = dict(itertools.islice(sorted(members.items()), 6))
            bases.append((spec, shard_file_name(spec, shard), build_shard(spec, small)))
    return bases


FUZZ_BASES = _fuzz_bases()


@st.composite
def damaged_shards(draw: st.DrawFn) -> tuple[PrecomputedSharding, str, bytes]:
    spec, name, blob = draw(st.sampled_from(FUZZ_BASES))
    kind = draw(st.sampled_from(["truncate", "flip", "random", "uint64", "extend", "delete"]))
    if kind == "truncate":
        blob = blob[: draw(st.integers(0, len(blob) - 1))]
    elif kind == "flip":
        mutable = bytearray(blob)
        for position in draw(st.lists(st.integers(0, len(blob) - 1), min_size=1, max_size=4)):
            mutable[position] ^= draw(st.integers(1, 255))
        blob = bytes(mutable)
    elif kind == "random":
        blob = draw(st.binary(max_size=400))
    elif kind == "uint64":
        position = draw(st.integers(0, len(blob) - 8))
        value = draw(st.one_of(st.integers(0, U64_MAX), st.sampled_from([0, 1, len(blob), 2**63, U64_MAX])))
        blob = blob[:position] + value.to_bytes(8, "little") + blob[position + 8 :]
    elif kind == "extend":
        blob = blob + draw(st.binary(min_size=1, max_size=40))
    else:
        start = draw(st.integers(0, len(blob) - 1))
        blob = blob[:start] + blob[start + draw(st.integers(1, 16)) :]
    return spec, name, blob


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_shards())
def test_damaged_shards_raise_only_shard_format_errors(case: tuple[PrecomputedSharding, str, bytes]) -> None:
    spec, name, blob = case
    try:
        ranges = parse_shard(spec, blob, name)
    except ShardFormatError as e:
        assert repr(name) in str(e)
        ranges = None
    try:
        chunks = split_shard(spec, blob, name)
    except ShardFormatError as e:
        assert repr(name) in str(e)
        chunks = None
    problems = shard_problems(spec, blob, name)
    assert (chunks is not None) == (problems == [])
    if ranges is not None:
        assert all(offset >= 0 and offset + nbytes <= len(blob) for offset, nbytes in ranges.values())
    if chunks is not None:
        assert ranges is not None and set(chunks) == set(ranges)


def test_problems_list_every_kind_found() -> None:
    spec = sharding(0, 1, 0, "identity", "raw", "gzip")
    blob = bytearray(build_shard(spec, {0: b"zero" * 5, 1: b"one" * 5}))
    ranges = parse_shard(spec, bytes(blob), "k")
    offset, _ = ranges[1]
    blob[offset + 12] ^= 0xFF  # damage chunk 1's deflate data
    blob[0:16] = np.array([5, 1], "<u8").tobytes()  # minishard 0: backwards entry
    problems = shard_problems(spec, bytes(blob), "k")
    assert problems[0].startswith("shard index entries ending before they start: minishard 0 [5, 1)")
    assert problems[-1].startswith("chunk data that does not decode: chunk 1")
    assert shard_problems(spec, b"", "k") == [
        "empty object: not a shard (a shard without chunks is deleted, not written)"
    ]
