"""The ``shard::`` fsspec protocol: zarr and xarray open sharded stores by URL alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pytest
import zarr

from shardstore import ShardingStore
from shardstore.fsspec_protocol import ShardFileSystem

DATA = np.arange(64 * 64, dtype="f4").reshape(64, 64)
OPTIONS = {"shard": {"chunks_per_shard": [4, 4]}}


def _write(root: Path) -> str:
    url = f"shard::file://{root}/x.zarr"
    arr = zarr.create_array(
        url, name="a", shape=DATA.shape, chunks=(8, 8), dtype="f4", storage_options=OPTIONS
    )
    arr[:] = DATA
    return url


def test_zarr_writes_and_reads_through_a_shard_url(tmp_path: Path) -> None:
    url = _write(tmp_path)
    shards = sorted(
        p.relative_to(tmp_path / "x.zarr" / "a") for p in (tmp_path / "x.zarr" / "a").rglob("c/*/*")
    )
    assert [str(p) for p in shards] == ["c/0/0", "c/0/1", "c/1/0", "c/1/1"]  # 4 shards, not 64 chunks
    np.testing.assert_array_equal(zarr.open_array(url, path="a", mode="r")[:], DATA)
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "x.zarr")), path="a")[:], DATA)


def test_the_protocol_needs_no_import(tmp_path: Path) -> None:
    url = _write(tmp_path)
    code = (
        "import sys, zarr; "
        f"a = zarr.open_array({url!r}, path='a', mode='r'); "
        "print(float(a[:].sum())); assert 'shardstore' in sys.modules  # loaded by fsspec"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) == float(DATA.sum())


def test_xarray_round_trip_through_a_shard_url(tmp_path: Path) -> None:
    xr = pytest.importorskip("xarray")
    pytest.importorskip("dask")
    url = f"shard::file://{tmp_path}/ds.zarr"
    ds = xr.Dataset({"v": (("y", "x"), DATA)}).chunk({"y": 8, "x": 8})
    ds.to_zarr(url, storage_options=OPTIONS, zarr_format=3)  # consolidated metadata too
    assert sorted(p.name for p in (tmp_path / "ds.zarr" / "v" / "c").iterdir()) == ["0", "1"]
    back = xr.open_zarr(url)
    np.testing.assert_array_equal(back.v.values, DATA)


def test_a_hierarchy_at_the_urls_root_is_overwritten(tmp_path: Path) -> None:
    """zarr and xarray empty the root to overwrite it (``rm(root, recursive=True)``):
    the root is a directory, not a key to delete after its contents (that failed
    with everything already deleted)."""
    url = f"shard::file://{tmp_path}/root.zarr"
    for value in (1, 2):
        arr = zarr.create_array(
            url, shape=(16, 16), chunks=(8, 8), dtype="u1", storage_options=OPTIONS, overwrite=True
        )
        arr[:] = value
        assert (zarr.open_array(url, mode="r")[:] == value).all()
    xr = pytest.importorskip("xarray")
    pytest.importorskip("dask")
    url = f"shard::file://{tmp_path}/ds.zarr"
    for offset in (0, 1):
        ds = xr.Dataset({"v": (("y", "x"), DATA + offset)}).chunk({"y": 8, "x": 8})
        ds.to_zarr(url, storage_options=OPTIONS, mode="w")
        np.testing.assert_array_equal(xr.open_zarr(url).v.values, DATA + offset)


def test_file_system_operations_are_on_logical_keys(tmp_path: Path) -> None:
    _write(tmp_path)
    fs = fsspec.filesystem("shard", fo=f"file://{tmp_path}/x.zarr")
    assert isinstance(fs, ShardFileSystem)
    assert fs.exists("a/c/7/7") and not fs.exists("a/c/8/0")
    assert fs.info("a")["type"] == "directory" and fs.info("a/c/0/0")["type"] == "file"
    assert len(fs.find("a/c")) == 64 and "a/zarr.json" in fs.find("")
    assert sorted(fs.ls("a/c/0", detail=False))[:2] == ["a/c/0/0", "a/c/0/1"]
    chunk = fs.cat_file("a/c/1/2")
    assert fs.cat_file("a/c/1/2", start=2, end=6) == chunk[2:6]
    ranges = fs.cat_ranges(["a/c/1/2", "a/c/9/9"], [0, 0], [4, 4])
    assert ranges[0] == chunk[:4] and isinstance(ranges[1], FileNotFoundError)
    fs.rm_file("a/c/1/2")
    assert not fs.exists("a/c/1/2") and fs.exists("a/c/1/3")
    with pytest.raises(FileNotFoundError):
        fs.cat_file("a/c/1/2")
    fs.rm("a", recursive=True)
    assert not fs.exists("a/zarr.json") and fs.find("") == ["zarr.json"]
