"""Interoperability: the codec layout, foreign sharded arrays, index options, layout switches.

Every cell of the interop matrix in docs/guide/interoperability.md (writer x reader x
index options) is one of these tests.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, TransposeCodec, ZstdCodec
from zarr.storage import LocalStore

from shardstore import ShardFormatError, ShardingConfigError, ShardingPassthroughWarning, ShardingStore
from shardstore.cli import main as cli
from shardstore.formats.indexed import IndexedFormat
from shardstore.layouts import switch_layout

ts = pytest.importorskip("tensorstore")

SHAPE = (45, 37)  # ragged: 5 x 4 chunks of 10 x 10, 3 x 2 shards of 2 x 2 chunks
CHUNKS = (10, 10)
CPS = (2, 2)
SHARD = (20, 20)
INDEX_OPTIONS = [
    pytest.param(location, checksum, id=f"{location}-{'crc32c' if checksum else 'plain'}")
    for location in ("end", "start")
    for checksum in (False, True)
]


def _expected() -> np.ndarray:
    """Chunks (0..2, 1..3) written, the rest missing (fill value -1)."""
    out = np.full(SHAPE, -1, dtype="i4")
    out[0:30, 10:37] = np.arange(30 * 27, dtype="i4").reshape(30, 27)
    return out


def _fill(arr: Any) -> None:
    arr[0:30, 10:37] = _expected()[0:30, 10:37]


def _shard_files(root: Path, array: str = "a") -> dict[str, bytes]:
    base = root / array
    return {
        str(p.relative_to(base)): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and p.name != "zarr.json"
    }


def _tensorstore(root: Path, array: str = "a") -> Any:
    return ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{root}/{array}/"}}).result()


# -- shardstore writes the codec layout; plain zarr and tensorstore read it ----------------------


@pytest.mark.parametrize(("location", "checksum"), INDEX_OPTIONS)
def test_codec_layout_is_standard_sharding_metadata(tmp_path: Path, location: str, checksum: bool) -> None:
    store = ShardingStore(
        str(tmp_path), CPS, layout="codec", index_location=location, index_checksum=checksum
    )
    arr = zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=-1)
    assert arr.chunks == CHUNKS and arr.shards is None  # zarr above the store sees plain chunks
    _fill(arr)
    doc = json.loads((tmp_path / "a" / "zarr.json").read_text())
    assert doc["chunk_grid"]["configuration"]["chunk_shape"] == list(SHARD)
    (codec,) = doc["codecs"]
    assert codec["name"] == "sharding_indexed"
    assert codec["configuration"]["chunk_shape"] == list(CHUNKS)
    assert codec["configuration"]["index_location"] == location
    names = [c["name"] for c in codec["configuration"]["index_codecs"]]
    assert names == (["bytes", "crc32c"] if checksum else ["bytes"])
    assert not doc.get("storage_transformers")

    plain = zarr.open_array(LocalStore(tmp_path), path="a")  # no shardstore involved
    assert plain.shards == SHARD and plain.chunks == CHUNKS
    np.testing.assert_array_equal(plain[:], _expected())
    np.testing.assert_array_equal(_tensorstore(tmp_path).read().result(), _expected())
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path)), path="a")[:], _expected())


def test_codec_layout_keeps_its_form_through_resize_and_attributes(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path), CPS, layout="codec")
    arr = zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=-1)
    _fill(arr)
    arr.resize((60, 37))
    arr.attrs["note"] = "kept"
    reopened = zarr.open_array(ShardingStore(str(tmp_path)), path="a")  # another instance: no config
    reopened[50:60, 0:10] = 5
    plain = zarr.open_array(LocalStore(tmp_path), path="a")
    assert plain.shape == (60, 37) and plain.shards == SHARD and plain.attrs["note"] == "kept"
    expected = np.full((60, 37), -1, dtype="i4")
    expected[:45] = _expected()
    expected[50:60, 0:10] = 5
    np.testing.assert_array_equal(plain[:], expected)


def test_codec_layout_with_consolidated_metadata(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path), CPS, layout="codec")
    root = zarr.open_group(store, mode="w")
    arr = root.create_array("a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=-1)
    _fill(arr)
    zarr.consolidate_metadata(store)
    plain = zarr.open_consolidated(LocalStore(tmp_path))
    assert plain["a"].shards == SHARD  # type: ignore[union-attr]
    np.testing.assert_array_equal(plain["a"][:], _expected())  # type: ignore[index]
    ours = zarr.open_consolidated(ShardingStore(str(tmp_path)))
    assert ours["a"].chunks == CHUNKS and ours["a"].shards is None  # type: ignore[union-attr]


def test_codec_layout_on_a_zarr_v2_array_is_a_config_error(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path), CPS, layout="codec")
    with pytest.raises(ShardingConfigError, match="zarr v2"):
        zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4", zarr_format=2)
    assert not (tmp_path / "a" / ".zarray").exists()


# -- other tools write sharded arrays; ShardingStore serves their inner chunks -------------------


@pytest.mark.parametrize(("location", "checksum"), INDEX_OPTIONS)
def test_zarr_sharding_codec_arrays_are_served_as_plain_chunks(
    tmp_path: Path, location: str, checksum: bool
) -> None:
    codec = ShardingCodec(
        chunk_shape=CHUNKS,
        codecs=[BytesCodec(), ZstdCodec()],
        index_codecs=[BytesCodec(), Crc32cCodec()] if checksum else [BytesCodec()],
        index_location=location,  # type: ignore[arg-type]
    )
    written = zarr.create_array(
        LocalStore(tmp_path), name="a", shape=SHAPE, chunks=SHARD, serializer=codec,
        compressors=None, dtype="i4", fill_value=-1,
    )  # fmt: skip
    _fill(written)
    before = _shard_files(tmp_path)
    store = ShardingStore(str(tmp_path))
    served = zarr.open_array(store, path="a")
    assert served.chunks == CHUNKS and served.shards is None
    np.testing.assert_array_equal(served[:], _expected())
    served[40:45, 0:10] = 3  # a write keeps the array readable by zarr itself
    expected = _expected()
    expected[40:45, 0:10] = 3
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path), path="a")[:], expected)
    assert set(_shard_files(tmp_path)) == set(before) | {"c/2/0"}


def test_zarr_default_shards_are_served_by_a_later_store_instance(tmp_path: Path) -> None:
    """Created by zarr with ``shards=`` through a store: that instance passes it through
    (zarr shards it itself); a store opened later serves its inner chunks."""
    first = ShardingStore(str(tmp_path), CPS)
    arr = zarr.create_array(
        first, name="a", shape=SHAPE, chunks=CHUNKS, shards=SHARD, dtype="i4", fill_value=-1
    )
    _fill(arr)
    assert sorted(_shard_files(tmp_path)) == ["c/0/0", "c/0/1", "c/1/0", "c/1/1"]
    assert zarr.open_array(first, path="a").shards == SHARD
    later = zarr.open_array(ShardingStore(str(tmp_path)), path="a")
    assert later.chunks == CHUNKS and later.shards is None
    np.testing.assert_array_equal(later[:], _expected())


@pytest.mark.parametrize(("location", "checksum"), INDEX_OPTIONS)
def test_tensorstore_sharded_arrays_are_served(tmp_path: Path, location: str, checksum: bool) -> None:
    index_codecs: list[Any] = [{"name": "bytes", "configuration": {"endian": "little"}}]  # bytes: also inner
    if checksum:
        index_codecs.append({"name": "crc32c"})
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": f"{tmp_path}/a/"},
        "metadata": {
            "shape": list(SHAPE),
            "data_type": "int32",
            "fill_value": -1,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(SHARD)}},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": list(CHUNKS),
                        "codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "zstd"},
                        ],
                        "index_codecs": index_codecs,
                        "index_location": location,
                    },
                }
            ],
        },
        "create": True,
    }
    t = ts.open(spec).result()
    t[0:30, 10:37].write(_expected()[0:30, 10:37]).result()
    served = zarr.open_array(ShardingStore(str(tmp_path)), path="a")
    assert served.chunks == CHUNKS
    np.testing.assert_array_equal(served[:], _expected())
    served[0:10, 0:10] = 9
    expected = _expected()
    expected[0:10, 0:10] = 9
    np.testing.assert_array_equal(_tensorstore(tmp_path).read().result(), expected)


def test_listing_a_served_array_lists_its_inner_chunks(tmp_path: Path) -> None:
    written = zarr.create_array(
        LocalStore(tmp_path), name="a", shape=SHAPE, chunks=CHUNKS, shards=SHARD, dtype="i4", fill_value=-1
    )
    _fill(written)
    import asyncio

    async def keys() -> list[str]:
        return sorted([k async for k in ShardingStore(str(tmp_path)).list_prefix("a/c/")])

    expected = sorted(f"a/c/{i}/{j}" for i in range(3) for j in range(1, 4))
    assert asyncio.run(keys()) == expected


@pytest.mark.parametrize(
    ("variant", "reason"),
    [
        ("transpose", "only codec"),
        ("compressed shards", "only codec"),
        ("nested", "nested sharding"),
        ("crc32c only", "index_codecs"),
    ],
)
def test_arrays_that_cannot_be_served_pass_through_untouched(
    tmp_path: Path, variant: str, reason: str
) -> None:
    inner: list[Any] = [BytesCodec()]
    index: list[Any] = [BytesCodec()]
    filters: Any = None
    compressors: Any = None
    if variant == "transpose":
        filters = [TransposeCodec(order=(1, 0))]
    elif variant == "compressed shards":
        compressors = [ZstdCodec()]
    elif variant == "nested":
        inner = [ShardingCodec(chunk_shape=(5, 5), codecs=[BytesCodec()], index_codecs=[BytesCodec()])]
    codec = ShardingCodec(chunk_shape=CHUNKS, codecs=inner, index_codecs=index)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = zarr.create_array(
            LocalStore(tmp_path), name="a", shape=SHAPE, chunks=SHARD, serializer=codec,
            filters=filters, compressors=compressors, dtype="i4", fill_value=-1,
        )  # fmt: skip
        _fill(written)
    if variant == "crc32c only":  # an index format we do not read: rewrite the metadata only
        doc = json.loads((tmp_path / "a" / "zarr.json").read_text())
        twice = [{"name": "bytes"}, {"name": "crc32c"}, {"name": "crc32c"}]
        doc["codecs"][0]["configuration"]["index_codecs"] = twice
        (tmp_path / "a" / "zarr.json").write_text(json.dumps(doc))
    store = ShardingStore(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seen = zarr.open_array(store, path="a")
        if variant != "crc32c only":  # (zarr itself cannot decode that one either)
            np.testing.assert_array_equal(seen[:], _expected())
    # zarr sees the array as it is stored: its own sharding codec applies
    assert seen.metadata.chunk_grid.chunk_shape == SHARD  # type: ignore[union-attr]
    with pytest.raises(ShardingConfigError, match=reason):
        switch_layout(store, "a", "transformer")
    asked = ShardingStore(str(tmp_path), {"a": [2, 2]})  # sharding asked for by path: say why not
    with pytest.warns(ShardingPassthroughWarning, match=reason):
        zarr.open_array(asked, path="a")


# -- index options and checksums ---------------------------------------------------------------


@pytest.mark.parametrize("form", ["transformer", "codec"])
def test_a_corrupt_index_checksum_is_a_format_error(tmp_path: Path, form: str) -> None:
    store = ShardingStore(str(tmp_path), CPS, layout=form, index_checksum=True)  # type: ignore[arg-type]
    arr = zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=-1)
    _fill(arr)
    shard = tmp_path / "a" / "c" / "0" / "1"
    raw = bytearray(shard.read_bytes())
    raw[-8] ^= 0xFF  # an index byte (the index and its checksum are the last 68 bytes)
    shard.write_bytes(bytes(raw))
    with pytest.raises(ShardFormatError, match=r"a/c/0/1.*checksum"):
        zarr.open_array(ShardingStore(str(tmp_path), read_strategy="chunk"), path="a")[0, 20]
    with pytest.raises(ShardFormatError, match=r"a/c/0/1.*checksum"):
        zarr.open_array(ShardingStore(str(tmp_path), read_strategy="shard"), path="a")[0, 20]


@pytest.mark.parametrize(("location", "checksum"), INDEX_OPTIONS)
def test_transformer_layout_records_index_options(tmp_path: Path, location: str, checksum: bool) -> None:
    store = ShardingStore(str(tmp_path), CPS, index_location=location, index_checksum=checksum)
    arr = zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=-1)
    _fill(arr)
    doc = json.loads((tmp_path / "a" / "zarr.json").read_text())
    config = doc["storage_transformers"][0]["configuration"]
    names = [c["name"] for c in config["index_codecs"]]
    assert (config["index_location"], names) == (location, ["bytes", "crc32c"] if checksum else ["bytes"])
    layout = IndexedFormat(CPS, location, checksum)  # type: ignore[arg-type]
    raw = (tmp_path / "a" / "c" / "0" / "1").read_bytes()
    layout.decode_index(raw[layout.index_slice(len(raw))], "a/c/0/1")
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path)), path="a")[:], _expected())


# -- switching layouts rewrites metadata only --------------------------------------------------


@pytest.mark.parametrize(("location", "checksum"), INDEX_OPTIONS)
def test_layout_switch_round_trip_leaves_shards_byte_identical(
    tmp_path: Path, location: str, checksum: bool
) -> None:
    store = ShardingStore(str(tmp_path), CPS, index_location=location, index_checksum=checksum)
    arr = zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=-1)
    _fill(arr)
    shards = _shard_files(tmp_path)
    original = (tmp_path / "a" / "zarr.json").read_text()
    with pytest.raises(ValueError, match="shardstore"):
        zarr.open_array(LocalStore(tmp_path), path="a")  # plain zarr refuses the transformer layout
    with pytest.raises(ValueError, match=r"shardstore\.sharding.* is not registered"):
        _tensorstore(tmp_path)  # and so does tensorstore: loudly, never misreading shards as chunks

    assert switch_layout(store, "a", "codec")
    assert _shard_files(tmp_path) == shards
    plain = zarr.open_array(LocalStore(tmp_path), path="a")
    np.testing.assert_array_equal(plain[:], _expected())
    np.testing.assert_array_equal(_tensorstore(tmp_path).read().result(), _expected())
    np.testing.assert_array_equal(zarr.open_array(store, path="a")[:], _expected())
    assert not switch_layout(store, "a", "codec")  # already there

    assert switch_layout(ShardingStore(str(tmp_path)), "a", "transformer")
    assert _shard_files(tmp_path) == shards
    assert json.loads((tmp_path / "a" / "zarr.json").read_text()) == json.loads(original)


def test_layout_switch_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ShardingStore(str(tmp_path), CPS)
    _fill(zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=-1))
    assert cli(["layout", str(tmp_path), "a", "--to", "codec"]) == 0
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path), path="a")[:], _expected())
    assert cli(["layout", str(tmp_path), "missing", "--to", "codec"]) == 2
    assert "no zarr v3 array" in capsys.readouterr().err


def test_layout_switch_refuses_what_it_cannot_describe(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path), CPS)
    zarr.create_array(store, name="v2", shape=SHAPE, chunks=CHUNKS, dtype="i4", zarr_format=2)
    zarr.create_array(ShardingStore(str(tmp_path)), name="plain", shape=SHAPE, chunks=CHUNKS, dtype="i4")
    with pytest.raises(ShardingConfigError, match="zarr v2"):
        switch_layout(store, "v2", "codec")
    with pytest.raises(ShardingConfigError, match="not sharded"):
        switch_layout(store, "plain", "codec")
    with pytest.raises(ShardingConfigError, match="layout must be"):
        switch_layout(store, "v2", "zip")  # type: ignore[arg-type]


def test_layout_switch_updates_consolidated_metadata(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path), CPS)
    root = zarr.open_group(store, mode="w")
    _fill(root.create_array("g/a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=-1))
    zarr.consolidate_metadata(store)
    switch_layout(store, "g/a", "codec")
    plain = zarr.open_consolidated(LocalStore(tmp_path))
    np.testing.assert_array_equal(plain["g/a"][:], _expected())  # type: ignore[index]


# -- the ZEP 2 draft as zarr-python 2.18 wrote it ------------------------------------------------

FIXTURE = Path(__file__).parent / "fixtures" / "zarr218_draft_sharding"


def test_reads_shards_written_by_zarr_218s_sharding_storage_transformer() -> None:
    """``meta/root/g/arr.array.json`` with the draft's transformer entry, chunks under
    ``data/root/g/arr/`` in the draft's ``c1/2`` encoding (see the fixture's script)."""
    import asyncio

    from zarr.core.buffer import default_buffer_prototype

    expected = np.full((10, 8), -1, dtype="i4")  # the grid of 5 x 4 chunks of 2 x 2, padded
    expected[0:6, 2:7] = np.arange(30, dtype="i4").reshape(6, 5)
    store = ShardingStore(str(FIXTURE), read_only=True)
    keys = [f"data/root/g/arr/c{i}/{j}" for i in range(5) for j in range(4)]

    async def read() -> tuple[list[Any], list[str]]:
        values = await store.get_partial_values(default_buffer_prototype(), [(k, None) for k in keys])
        return values, sorted([k async for k in store.list_prefix("data/root/g/arr/")])

    values, listed = asyncio.run(read())
    present = [k for k, v in zip(keys, values, strict=True) if v is not None]
    assert (
        listed
        == sorted(present)
        == sorted(f"data/root/g/arr/c{i}/{j}" for i in range(3) for j in range(1, 4))
    )
    for key, value in zip(keys, values, strict=True):
        if value is not None:
            i, j = map(int, key.rsplit("/c", 1)[1].split("/"))
            block = expected[2 * i : 2 * i + 2, 2 * j : 2 * j + 2]
            np.testing.assert_array_equal(np.frombuffer(value.to_bytes(), "<i4").reshape(2, 2), block)
    # the shard objects themselves stay hidden: shard (0, 1) holds chunk (1, 3) ...
    assert asyncio.run(store.exists("data/root/g/arr/c1/3"))
    # ... and a key the draft's encoding would never write is not a chunk
    assert not asyncio.run(store.exists("data/root/g/arr/c/1/3"))
