"""A transparent layer under xarray and dask: no code of theirs knows it is there."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from shardstore import ShardingStore

from .helpers import inner_keys

xr = pytest.importorskip("xarray")
da = pytest.importorskip("dask.array")


def per_variable(path: str, metadata: dict[str, Any]) -> list[int] | None:
    """Shard the 2-d data variables, leave coordinates alone (module level: picklable)."""
    return [4, 4] if len(metadata["shape"]) == 2 else None


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_xarray_to_zarr_and_open_zarr(tmp_path: Path, zarr_format: int) -> None:
    ds = xr.Dataset(
        {"temp": (("y", "x"), np.random.default_rng(0).random((40, 30)).astype("f4"))},
        coords={"y": np.arange(40), "x": np.arange(30) * 0.5},
    )
    store = ShardingStore(fsspec.get_mapper(f"file://{tmp_path}/ds.zarr"), chunks_per_shard=per_variable)
    ds.chunk({"y": 5, "x": 5}).to_zarr(store, zarr_format=zarr_format, consolidated=True)
    back = xr.open_zarr(ShardingStore(fsspec.get_mapper(f"file://{tmp_path}/ds.zarr")), consolidated=True)
    xr.testing.assert_identical(back.load(), ds)
    temp_objects = [k for k in inner_keys(store) if k.startswith("temp/") and k.split("/")[-1][0] not in ".z"]
    assert len(temp_objects) == 2 * 2  # 8 x 6 chunks in 4 x 4 shards


def test_dask_writes_in_parallel_through_a_pickled_store(tmp_path: Path) -> None:
    import zarr

    store = ShardingStore(f"file://{tmp_path}/d.zarr", chunks_per_shard=(4, 4))
    assert pickle.loads(pickle.dumps(store)) == store
    target = zarr.create_array(store, name="d", shape=(64, 64), chunks=(8, 8), dtype="i8")
    data = da.arange(64 * 64, chunks=1024).reshape(64, 64).rechunk((32, 32))  # dask chunks = shards
    da.store(data, target, lock=False, scheduler="threads")
    np.testing.assert_array_equal(zarr.open_array(store, path="d")[:], np.arange(64 * 64).reshape(64, 64))
    assert len([k for k in inner_keys(store) if k.startswith("d/c/")]) == 4
