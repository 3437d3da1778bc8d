"""The sharding config lives in each array's metadata; zarr never sees it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import zarr

from shardstore import ShardFormatError, ShardingConfigError, ShardingStore

from .helpers import inner_get, inner_keys

BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
CRC32C = {"name": "crc32c"}


def _stored(backing: dict[str, Any], key: str) -> dict[str, Any]:
    return json.loads(backing[key])


def _set_index_config(backing: dict[str, Any], key: str, index: dict[str, Any]) -> None:
    """Spell the index of the stored transformer config as ``index`` says, by hand."""
    doc = _stored(backing, key)
    config = doc["storage_transformers"][0]["configuration"]
    for name in ("index_codecs", "index_checksum"):
        config.pop(name, None)
    config.update(index)
    backing[key] = json.dumps(doc).encode()


def test_config_recorded_in_v3_metadata_and_hidden_from_zarr() -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=[2, 4], index_location="start", index_checksum=True)
    zarr.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="u1")[:] = 3
    stored = _stored(backing, "a/zarr.json")
    assert stored["storage_transformers"] == [
        {
            "name": "sharding",
            "configuration": {
                "type": "indexed",
                "chunks_per_shard": [2, 4],
                "index_location": "start",
                "index_codecs": [
                    {"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "crc32c"},
                ],
            },
        }
    ]
    assert stored["codecs"][-1] == {"name": "shardstore.sharding"}  # makes plain zarr fail
    seen = json.loads(store.get_sync("a/zarr.json").to_bytes())  # type: ignore[union-attr]
    assert seen["storage_transformers"] == []
    assert seen["codecs"] == stored["codecs"][:-1]
    # Re-opened with no config, with other options passed: the recorded ones win.
    again = ShardingStore(backing, chunks_per_shard=[4, 4], index_location="end")
    assert zarr.open_array(again, path="a")[:].sum() == 3 * 64
    assert sorted(k for k in backing if "/c/" in k) == ["a/c/0/0", "a/c/1/0"]


def test_existing_array_keeps_config_through_resize_and_attrs() -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=[2])
    arr = zarr.create_array(store, name="a", shape=(8,), chunks=(2,), dtype="u1")
    arr[:] = 1
    other = ShardingStore(backing, chunks_per_shard=[3])  # a different config must not apply
    a2 = zarr.open_array(other, path="a")
    a2.resize((12,))
    a2.attrs["x"] = 1
    a2[8:] = 2
    config = _stored(backing, "a/zarr.json")["storage_transformers"][0]["configuration"]
    assert config["chunks_per_shard"] == [2]
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(backing), path="a")[:], [1] * 8 + [2] * 4)


def test_existing_unsharded_array_is_never_sharded_later() -> None:
    backing: dict[str, Any] = {}
    zarr.create_array(ShardingStore(backing), name="u", shape=(8,), chunks=(2,), dtype="u1")[:] = 5
    store = ShardingStore(backing, chunks_per_shard=[2])
    arr = zarr.open_array(store, path="u")
    arr.resize((10,))
    arr[8:] = 6
    assert "storage_transformers" not in str(
        _stored(backing, "u/zarr.json").get("storage_transformers") or ""
    )
    assert sorted(k for k in backing if "/c/" in k) == [f"u/c/{i}" for i in range(5)]
    np.testing.assert_array_equal(arr[:], [5] * 8 + [6] * 2)


def test_v2_zarray_config_restored_after_zarr_rewrites_it() -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=[2, 2])
    arr = zarr.create_array(store, name="v", shape=(4, 4), chunks=(1, 1), dtype="i2", zarr_format=2)
    arr[:] = 7
    assert _stored(backing, "v/.zarray")["storage_transformers"][0]["name"] == "sharding"
    arr.attrs["k"] = "v"
    arr.resize((6, 4))  # zarr drops unknown keys on its next write: the store puts it back
    assert _stored(backing, "v/.zarray")["storage_transformers"][0]["configuration"]["chunks_per_shard"] == [
        2,
        2,
    ]
    seen = zarr.open_array(ShardingStore(backing), path="v", zarr_format=2)
    np.testing.assert_array_equal(seen[:4], np.full((4, 4), 7))
    assert "storage_transformers" not in json.loads(
        store.get_sync("v/.zarray").to_bytes()  # type: ignore[union-attr]
    )


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_consolidated_metadata_stripped_and_restored(zarr_format: int) -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard={"g/a": [2, 2]})
    root = zarr.open_group(store, mode="w", zarr_format=zarr_format)
    root.create_group("g").create_array("a", shape=(4, 4), chunks=(1, 1), dtype="u1")[:] = 1
    root.create_array("b", shape=(4,), chunks=(1,), dtype="u1")[:] = 2
    zarr.consolidate_metadata(store)
    raw = backing[".zmetadata" if zarr_format == 2 else "zarr.json"]
    assert raw.count(b'"chunks_per_shard"') == 1  # recorded for g/a only, in the stored document
    opened = zarr.open_consolidated(ShardingStore(backing), zarr_format=zarr_format)
    np.testing.assert_array_equal(opened["g/a"][:], np.ones((4, 4)))
    np.testing.assert_array_equal(opened["b"][:], [2] * 4)
    key = ".zmetadata" if zarr_format == 2 else "zarr.json"
    assert b"chunks_per_shard" not in store.get_sync(key).to_bytes()  # type: ignore[union-attr]


def test_zep2_draft_form_is_read() -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=[2])
    zarr.create_array(store, name="d", shape=(8,), chunks=(2,), dtype="u1")[:] = np.arange(8)
    meta = _stored(backing, "d/zarr.json")
    meta["storage_transformers"] = [
        {
            "extension": "https://purl.org/zarr/spec/extensions/storage_transformers/sharding/1.0",
            "type": "indexed",
            "configuration": {"chunks_per_shard": [2]},
        }
    ]
    backing["d/zarr.json"] = json.dumps(meta).encode()
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(backing), path="d")[:], np.arange(8))


def test_zarr_sharding_codec_arrays_pass_through_untouched() -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=[2])
    arr = zarr.create_array(store, name="z", shape=(8,), chunks=(2,), shards=(4,), dtype="u1")
    arr[:] = np.arange(8)
    assert _stored(backing, "z/zarr.json")["storage_transformers"] == []
    assert sorted(k for k in backing if "/c/" in k) == ["z/c/0", "z/c/1"]  # zarr's own shards, as written
    np.testing.assert_array_equal(
        zarr.open_array(
            zarr.storage.MemoryStore(
                {k: zarr.core.buffer.cpu.Buffer.from_bytes(v) for k, v in backing.items()}
            ),
            path="z",
        )[:],
        np.arange(8),
    )


def test_sequence_config_applies_to_its_rank_only() -> None:
    """xarray writes 1-d coordinates beside n-d variables: they stay unsharded."""
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=(2, 2))
    zarr.create_array(store, name="var", shape=(4, 4), chunks=(1, 1), dtype="f4")[:] = 1
    zarr.create_array(store, name="x", shape=(4,), chunks=(1,), dtype="f4")[:] = 1
    assert "storage_transformers" in json.dumps(_stored(backing, "var/zarr.json"))
    assert _stored(backing, "x/zarr.json")["storage_transformers"] == []
    assert len([k for k in backing if k.startswith("x/c/")]) == 4


def test_callable_config_gets_path_and_metadata() -> None:
    seen: list[tuple[str, int]] = []

    def choose(path: str, meta: dict[str, Any]) -> list[int] | None:
        seen.append((path, meta["zarr_format"]))
        return [2] if path.endswith("big") else None

    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=choose)
    zarr.create_array(store, name="g/big", shape=(8,), chunks=(1,), dtype="u1")[:] = 1
    zarr.create_array(store, name="g/small", shape=(8,), chunks=(1,), dtype="u1")[:] = 1
    assert ("g/big", 3) in seen and ("g/small", 3) in seen
    assert len([k for k in inner_keys(store) if k.startswith("g/big/c/")]) == 4
    assert len([k for k in inner_keys(store) if k.startswith("g/small/c/")]) == 8


def test_non_json_metadata_names_pass_through_untouched() -> None:
    store = ShardingStore({}, chunks_per_shard=[2])
    store.set_sync("foo/zarr.json", zarr.core.buffer.cpu.Buffer.from_bytes(b"\x00not json"))
    assert inner_get(store, "foo/zarr.json") == b"\x00not json"
    assert store.get_sync("foo/zarr.json").to_bytes() == b"\x00not json"  # type: ignore[union-attr]


# -- the index described by the codec spec's names (index_codecs), index_checksum a shorthand ----


@pytest.mark.parametrize(
    "index",
    [
        pytest.param({"index_codecs": [BYTES, CRC32C]}, id="index_codecs"),
        pytest.param({"index_checksum": True}, id="index_checksum-as-older-shardstore-wrote"),
        pytest.param({"index_codecs": [{"name": "bytes"}, "crc32c"], "index_checksum": True}, id="both"),
    ],
)
def test_an_index_checksum_is_read_in_either_spelling(index: dict[str, Any]) -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=[2, 2], index_checksum=True)
    data = np.arange(16, dtype="u1").reshape(4, 4)
    zarr.create_array(store, name="a", shape=(4, 4), chunks=(1, 1), dtype="u1")[:] = data
    _set_index_config(backing, "a/zarr.json", index)
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(backing), path="a")[:], data)
    shard = bytearray(backing["a/c/0/0"])
    shard[-5] ^= 0xFF  # the index's last byte, just before its crc32c
    backing["a/c/0/0"] = bytes(shard)
    with pytest.raises(ShardFormatError, match=r"a/c/0/0.*checksum"):
        zarr.open_array(ShardingStore(backing), path="a")[0, 0]


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("checksum", [False, True])
def test_written_configs_spell_the_index_by_the_codec_spec(zarr_format: int, checksum: bool) -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=[2], index_location="start", index_checksum=checksum)
    zarr.create_array(store, name="a", shape=(4,), chunks=(1,), dtype="u1", zarr_format=zarr_format)
    key = "a/zarr.json" if zarr_format == 3 else "a/.zarray"
    assert _stored(backing, key)["storage_transformers"][0]["configuration"] == {
        "type": "indexed",
        "chunks_per_shard": [2],
        "index_location": "start",
        "index_codecs": [BYTES, CRC32C] if checksum else [BYTES],
    }


@pytest.mark.parametrize(
    ("index", "reason"),
    [
        ({"index_codecs": [BYTES, CRC32C], "index_checksum": False}, "contradicts"),
        ({"index_codecs": [BYTES], "index_checksum": True}, "contradicts"),
        ({"index_codecs": [{"name": "bytes", "configuration": {"endian": "big"}}]}, "unsupported"),
        ({"index_codecs": [CRC32C]}, "unsupported"),
        ({"index_codecs": [BYTES, {"name": "zstd"}]}, "unsupported"),
        ({"index_codecs": None}, "unsupported"),
        ({"index_checksum": "yes"}, "true or false"),
    ],
)
def test_an_index_config_that_cannot_be_read_is_refused(index: dict[str, Any], reason: str) -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=[2])
    zarr.create_array(store, name="g/a", shape=(4,), chunks=(1,), dtype="u1")[:] = 1
    _set_index_config(backing, "g/a/zarr.json", index)
    with pytest.raises(ShardingConfigError, match=rf"array 'g/a'.*{reason}"):
        zarr.open_array(ShardingStore(backing), path="g/a")
