"""dask and xarray on a LocalCluster (worker processes): blocks smaller than shards lose nothing.

Each worker unpickles its own ShardingStore, so several processes write the
same shards at once; local files order them by file locks, S3 by
conditional writes. ``rechunk_to_shards`` gives one block per shard instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardstore import ShardingStore
from shardstore.rechunk import rechunk_to_shards, shard_shape

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
xr = pytest.importorskip("xarray")

SHAPE, CHUNKS, CPS, BLOCKS = (512, 512), (32, 32), (8, 8), (64, 64)  # 4 shards of 64 chunks


@pytest.fixture(scope="module")
def dask_threads_per_worker() -> int:
    """Two threads in each worker process of conftest's ``client``: several threads of one
    process write the same shards as well as several processes."""
    return 2


def _two_d(path: str, metadata: dict[str, Any]) -> list[int] | None:
    return [8, 8] if len(metadata["shape"]) == 2 else None


def _data() -> np.ndarray[Any, Any]:
    return np.arange(SHAPE[0] * SHAPE[1], dtype="i4").reshape(SHAPE) + 1


def _check_dask_store(client: Any, url: str, storage_options: dict[str, Any] | None) -> None:
    store = ShardingStore(url, chunks_per_shard=CPS, storage_options=storage_options)
    target = zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4")
    x = da.from_array(_data(), chunks=BLOCKS)  # 16 blocks per shard, on both workers
    da.to_zarr(x, target, compute=True)
    back = zarr.open_array(ShardingStore(url, storage_options=storage_options), path="a")[:]
    lost = int((back.reshape(16, 32, 16, 32) == 0).all(axis=(1, 3)).sum())
    assert lost == 0, f"{lost} chunks lost"
    np.testing.assert_array_equal(back, _data())


def test_dask_to_zarr_with_blocks_smaller_than_shards_local(client: Any, tmp_path: Path) -> None:
    _check_dask_store(client, f"file://{tmp_path}/d.zarr", None)


def test_dask_to_zarr_with_blocks_smaller_than_shards_s3(client: Any, s3: Any) -> None:
    _check_dask_store(client, s3.url("dask.zarr"), s3.storage_options)


def test_xarray_to_zarr_by_url_on_worker_processes(client: Any, tmp_path: Path) -> None:
    url = f"shard::file://{tmp_path}/x.zarr"
    ds = xr.Dataset({"t": (("y", "x"), _data().astype("f4"))}, coords={"y": np.arange(SHAPE[0])})
    ds.chunk({"y": 64, "x": 64}).to_zarr(
        url,
        storage_options={"shard": {"chunks_per_shard": [8, 8]}},
        encoding={"t": {"chunks": CHUNKS}},
        zarr_format=3,
        consolidated=False,
    )
    back = xr.open_zarr(url, consolidated=False).load()
    assert int(np.isnan(back.t.values).sum()) == 0
    xr.testing.assert_equal(back, ds)


def test_rechunk_to_shards_gives_one_block_per_shard(client: Any, tmp_path: Path) -> None:
    store = ShardingStore(f"file://{tmp_path}/r.zarr", chunks_per_shard=CPS)
    target = zarr.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4")
    assert shard_shape(target) == (256, 256)
    x = rechunk_to_shards(da.from_array(_data(), chunks=BLOCKS), target)
    assert x.chunks == ((256, 256), (256, 256))
    da.to_zarr(x, target)
    np.testing.assert_array_equal(
        zarr.open_array(ShardingStore(f"file://{tmp_path}/r.zarr"), path="a")[:], _data()
    )


def test_rechunk_to_shards_for_a_dataset(client: Any, tmp_path: Path) -> None:
    store = ShardingStore(f"file://{tmp_path}/ds.zarr", chunks_per_shard=_two_d)
    ds = xr.Dataset(
        {"t": (("y", "x"), _data().astype("f4")), "v": ("y", np.arange(SHAPE[0], dtype="f4"))},
        coords={"y": np.arange(SHAPE[0])},
    ).chunk({"y": 32, "x": 32})
    aligned = rechunk_to_shards(ds, store)
    assert aligned.t.chunks == ((256, 256), (256, 256)) and aligned.t.encoding["chunks"] == CHUNKS
    assert aligned.v.chunks == ds.v.chunks  # unsharded: unchanged
    aligned.to_zarr(store, zarr_format=3, consolidated=False, compute=True)
    back = xr.open_zarr(ShardingStore(f"file://{tmp_path}/ds.zarr"), consolidated=False)
    assert back.t.encoding["chunks"] == CHUNKS
    xr.testing.assert_equal(back.load(), ds.load())


def _pipelines_on_a_worker(url: str, plain: str) -> tuple[str, str]:
    ours = zarr.open_array(ShardingStore(url), path="a")
    theirs = zarr.open_array(zarr.storage.LocalStore(plain))
    return type(ours._async_array.codec_pipeline).__name__, type(theirs._async_array.codec_pipeline).__name__


def test_worker_processes_open_arrays_with_shardstores_pipeline_and_others_with_zarrs(
    client: Any, tmp_path: Path
) -> None:
    """No configuration travels to the workers: importing shardstore there is enough."""
    url = str(tmp_path / "s")
    zarr.create_array(ShardingStore(url, CPS), name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4")
    zarr.create_array(zarr.storage.LocalStore(tmp_path / "p"), shape=SHAPE, chunks=CHUNKS, dtype="i4")
    got = client.run(_pipelines_on_a_worker, url, str(tmp_path / "p"))
    assert len(got) == 2
    assert set(got.values()) == {("ShardAwarePipeline", "BatchedCodecPipeline")}
