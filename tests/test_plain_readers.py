"""zarr without shardstore fails loudly, naming shardstore, on transformer-layout data.

zarr-python 3.1 refuses a non-empty ``storage_transformers`` only in ``open_array``
(and ignores the key in a v2 ``.zarray``): group access and xarray would decode shard
objects as chunks. The marker the store records beside its config (a codec in v3, a
filter in v2, named ``shardstore.sharding``) makes every read path fail where zarr
parses the array's metadata, while zarr above a ShardingStore never sees it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.core.common import ZarrFormat
from zarr.storage import LocalStore

from shardstore import ShardingStore
from shardstore.layouts import switch_layout

MARKER = b"shardstore.sharding"
DATA = np.arange(64, dtype="f4").reshape(8, 8)
COORD = np.arange(8)
FORMATS = [
    pytest.param(fmt, consolidated, id=f"v{fmt}-{'consolidated' if consolidated else 'unconsolidated'}")
    for fmt in (2, 3)
    for consolidated in (False, True)
]

Reader = Callable[[LocalStore, ZarrFormat], object]
PLAIN_READERS: dict[str, Reader] = {
    "open_array": lambda s, fmt: zarr.open_array(s, path="temp", zarr_format=fmt)[:],
    "open_group": lambda s, fmt: zarr.open_group(s, mode="r", zarr_format=fmt)["temp"][:],  # type: ignore[index]
    "open_group-unconsolidated": lambda s, fmt: zarr.open_group(
        s, mode="r", zarr_format=fmt, use_consolidated=False
    )["temp"][:],  # type: ignore[index]
    "open": lambda s, fmt: zarr.open(s, mode="r", zarr_format=fmt)["temp"][:],  # type: ignore[index]
    "open_consolidated": lambda s, fmt: zarr.open_consolidated(s, mode="r", zarr_format=fmt)["temp"][:],  # type: ignore[index]
}


def _write(root: Path, zarr_format: ZarrFormat, consolidated: bool, **options: Any) -> ShardingStore:
    """A 2-d sharded variable ``temp`` and a 1-d unsharded coordinate ``x``, as xarray
    would find them; ``temp`` grown once, so zarr has rewritten its metadata."""
    store = ShardingStore(str(root), (2, 2), **options)
    group = zarr.open_group(store, mode="w", zarr_format=zarr_format)

    def dims(*names: str) -> dict[str, Any]:
        if zarr_format == 3:
            return {"dimension_names": names}
        return {"attributes": {"_ARRAY_DIMENSIONS": list(names)}}

    temp = group.create_array(
        "temp", shape=(6, 8), chunks=(2, 2), dtype="f4", fill_value=-1, **dims("y", "x")
    )
    temp[:] = DATA[:6]
    temp.resize((8, 8))
    temp[6:] = DATA[6:]
    group.create_array("x", shape=(8,), chunks=(8,), dtype="i8", fill_value=-1, **dims("x"))[:] = COORD
    if consolidated:
        zarr.consolidate_metadata(store)
    return store


def _documents(zarr_format: int) -> tuple[str, str]:
    """The array document of ``temp`` and the group document that consolidates it."""
    return ("temp/zarr.json", "zarr.json") if zarr_format == 3 else ("temp/.zarray", ".zmetadata")


def _plain(root: Path) -> LocalStore:
    return LocalStore(root, read_only=True)


@pytest.mark.parametrize(
    ("reader", "zarr_format", "consolidated"),
    [
        pytest.param(reader, *form.values, id=f"{reader}-{form.id}")
        for reader in sorted(PLAIN_READERS)
        for form in FORMATS
        if form.values[1] or reader != "open_consolidated"  # nothing consolidated to open
    ],
)
def test_plain_zarr_fails_naming_shardstore(
    tmp_path: Path, reader: str, zarr_format: ZarrFormat, consolidated: bool
) -> None:
    _write(tmp_path, zarr_format, consolidated)
    with pytest.raises(ValueError, match="shardstore"):
        PLAIN_READERS[reader](_plain(tmp_path), zarr_format)


@pytest.mark.parametrize(("zarr_format", "consolidated"), FORMATS)
def test_plain_xarray_fails_naming_shardstore(
    tmp_path: Path, zarr_format: ZarrFormat, consolidated: bool
) -> None:
    xr = pytest.importorskip("xarray")
    _write(tmp_path, zarr_format, consolidated)
    with pytest.raises(ValueError, match="shardstore"):
        xr.open_zarr(_plain(tmp_path), consolidated=consolidated, zarr_format=zarr_format).load()
    seen = xr.open_zarr(ShardingStore(str(tmp_path)), consolidated=consolidated, zarr_format=zarr_format)
    np.testing.assert_array_equal(seen["temp"].values, DATA)
    np.testing.assert_array_equal(seen["x"].values, COORD)


@pytest.mark.parametrize(("zarr_format", "consolidated"), FORMATS)
def test_sharding_store_reads_everything_and_never_shows_the_marker(
    tmp_path: Path, zarr_format: ZarrFormat, consolidated: bool
) -> None:
    _write(tmp_path, zarr_format, consolidated)
    store = ShardingStore(str(tmp_path))
    group = zarr.open_group(store, zarr_format=zarr_format, use_consolidated=consolidated)
    np.testing.assert_array_equal(group["temp"][:], DATA)  # type: ignore[index]
    np.testing.assert_array_equal(group["x"][:], COORD)  # type: ignore[index]
    array_doc, group_doc = _documents(zarr_format)
    stored = [(tmp_path / array_doc).read_bytes()]
    seen = [store.get_sync(array_doc).to_bytes()]  # type: ignore[union-attr]
    if consolidated:
        stored.append((tmp_path / group_doc).read_bytes())
        seen.append(store.get_sync(group_doc).to_bytes())  # type: ignore[union-attr]
    assert [raw.count(MARKER) for raw in stored] == [1] * len(stored)  # temp only: x is unsharded
    assert not any(MARKER in raw for raw in seen)
    if zarr_format == 2:
        assert json.loads(seen[0])["filters"] is None  # exactly what zarr wrote


def test_codec_layout_carries_no_marker(tmp_path: Path) -> None:
    """Standard sharding metadata is meant for plain readers."""
    _write(tmp_path, 3, True, layout="codec")
    assert not any(MARKER in p.read_bytes() for p in tmp_path.rglob("zarr.json"))
    np.testing.assert_array_equal(zarr.open_consolidated(_plain(tmp_path), mode="r")["temp"][:], DATA)  # type: ignore[index]


def test_layout_switches_remove_and_restore_the_marker(tmp_path: Path) -> None:
    store = _write(tmp_path, 3, True)
    docs = [tmp_path / d for d in _documents(3)]
    before = [p.read_bytes() for p in docs]

    assert switch_layout(store, "temp", "codec")
    assert not any(MARKER in p.read_bytes() for p in docs)
    np.testing.assert_array_equal(zarr.open_consolidated(_plain(tmp_path), mode="r")["temp"][:], DATA)  # type: ignore[index]

    assert switch_layout(store, "temp", "transformer")
    assert [json.loads(p.read_bytes()) for p in docs] == [json.loads(raw) for raw in before]
    with pytest.raises(ValueError, match="shardstore"):
        zarr.open_consolidated(_plain(tmp_path), mode="r")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_metadata_of_the_previous_version_is_read_and_marked_on_the_next_write(
    tmp_path: Path, zarr_format: ZarrFormat
) -> None:
    """Before the marker, shardstore stored what zarr wrote plus its entry, the index
    checksum spelled ``index_checksum``: read as it is, marked when zarr next writes."""
    store = _write(tmp_path, zarr_format, True, index_checksum=True)
    array_doc, group_doc = _documents(zarr_format)
    old_entry = {
        "name": "sharding",
        "configuration": {
            "type": "indexed",
            "chunks_per_shard": [2, 2],
            "index_location": "end",
            "index_checksum": True,
        },
    }
    plain = json.loads(store.get_sync(array_doc).to_bytes())  # type: ignore[union-attr]
    group = json.loads(store.get_sync(group_doc).to_bytes())  # type: ignore[union-attr]
    consolidated = (
        group["consolidated_metadata"]["metadata"]["temp"]
        if zarr_format == 3
        else group["metadata"][array_doc]
    )
    for doc in (plain, consolidated):
        doc["storage_transformers"] = [old_entry]
    (tmp_path / array_doc).write_text(json.dumps(plain))
    (tmp_path / group_doc).write_text(json.dumps(group))

    for use_consolidated in (True, False):
        reopened = zarr.open_group(ShardingStore(str(tmp_path)), use_consolidated=use_consolidated)
        np.testing.assert_array_equal(reopened["temp"][:], DATA)  # type: ignore[index]
    assert MARKER not in (tmp_path / array_doc).read_bytes()  # reading changes nothing

    later = ShardingStore(str(tmp_path))
    zarr.open_array(later, path="temp").resize((8, 8))
    zarr.consolidate_metadata(later)
    for name in (array_doc, group_doc):
        raw = (tmp_path / name).read_bytes()
        assert raw.count(MARKER) == 1 and b"index_codecs" in raw and b"index_checksum" not in raw
    with pytest.raises(ValueError, match="shardstore"):
        zarr.open_group(_plain(tmp_path), mode="r", use_consolidated=False)["temp"]
    np.testing.assert_array_equal(zarr.open_consolidated(later)["temp"][:], DATA)  # type: ignore[index]
