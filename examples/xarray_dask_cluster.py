"""xarray + dask on a LocalCluster (two worker processes) writing into a ShardingStore.

Shows a dask-backed xarray Dataset written with ``to_zarr`` into
``ShardingStore(directory, chunks_per_shard=(8, 8))`` by two worker processes,
after ``shardstore.rechunk.rechunk_to_shards`` has turned its dask blocks into
whole shards (one task per shard, no shard shared between workers) while
keeping zarr's small chunks; then reads it back with ``xr.open_zarr`` and
checks equality.

Run: python examples/xarray_dask_cluster.py   (writes into a temporary directory it removes)
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path

import dask
import numpy as np
import xarray as xr
from dask.distributed import Client, LocalCluster

from shardstore import ShardingStore, UnshardedArrayWarning
from shardstore.rechunk import rechunk_to_shards

SHAPE = (512, 512)
CHUNKS = (32, 32)  # zarr's chunks: a 16 x 16 grid per variable
CHUNKS_PER_SHARD = (8, 8)  # every 2-d variable: 2 x 2 shards of 256 x 256; 1-d coordinates unsharded


def make_dataset() -> xr.Dataset:
    y, x = np.arange(SHAPE[0], dtype="f8"), np.arange(SHAPE[1], dtype="f8")
    temperature = 15 + 10 * np.sin(y[:, None] / 40) * np.cos(x[None, :] / 60)
    pressure = 1000 + (y[:, None] - x[None, :]) / 10
    ds = xr.Dataset(
        {
            "temperature": (("y", "x"), temperature.astype("f4"), {"units": "degC"}),
            "pressure": (("y", "x"), pressure.astype("f4"), {"units": "hPa"}),
        },
        coords={"y": y, "x": x},
        attrs={"title": "shardstore example"},
    )
    return ds.chunk(dict(zip(("y", "x"), CHUNKS, strict=True)))  # dask blocks = zarr chunks


def blocks(ds: xr.Dataset, name: str) -> str:
    chunks = ds[name].chunks or ()
    return f"{'x'.join(str(len(c)) for c in chunks)} dask blocks of {'x'.join(str(c[0]) for c in chunks)}"


def files_under(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")
    )


def main(directory: Path) -> None:
    root = directory / "cluster.zarr"
    ds = make_dataset()
    store = ShardingStore(str(root), chunks_per_shard=CHUNKS_PER_SHARD)
    # The 1-d coordinates y and x stay unsharded, as intended here; shardstore says so once per rank.
    warnings.filterwarnings("ignore", category=UnshardedArrayWarning)

    aligned = rechunk_to_shards(ds, store)  # blocks become whole shards; encoding["chunks"] keeps zarr's
    print("before rechunk_to_shards:", blocks(ds, "temperature"))
    print(
        "after rechunk_to_shards: ",
        blocks(aligned, "temperature"),
        "| zarr chunks kept:",
        aligned["temperature"].encoding["chunks"],
    )

    with (
        dask.config.set({"temporary-directory": str(directory)}),  # dask's scratch space goes here too
        LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,  # type: ignore[no-untyped-call]
    ):
        print("cluster:", len(client.scheduler_info()["workers"]), "worker processes")
        start = time.perf_counter()
        aligned.to_zarr(store, mode="w", zarr_format=3, consolidated=False)  # each worker unpickles the store
        print(f"to_zarr on the cluster: {time.perf_counter() - start:.2f} s")

        back = xr.open_zarr(ShardingStore(str(root)), consolidated=False)  # a fresh store: no config
        print("xr.open_zarr: zarr chunks", back["temperature"].encoding["chunks"], "read by the workers")
        xr.testing.assert_identical(back.compute(), ds.compute())
        print("xr.open_zarr(...) equals the original Dataset: True")

    on_disk = files_under(root)
    shards = [f for f in on_disk if "/c/" in f and f.split("/")[0] in ("temperature", "pressure")]
    print(
        f"{len(on_disk)} objects on disk; {len(shards)} shards for 2 x {16 * 16} chunks:", *shards, sep="\n  "
    )


if __name__ == "__main__":  # worker processes are spawned and re-import this module
    with tempfile.TemporaryDirectory(prefix="shardstore-dask-") as tmp:
        main(Path(tmp))
