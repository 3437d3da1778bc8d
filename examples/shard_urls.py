"""Sharded stores by URL: the ``shard::`` fsspec protocol, with zarr, fsspec and xarray.

Shows that ``shard::file:///.../x.zarr`` opens a ShardingStore over the chained
URL with no shardstore import (the protocol is registered through the
package's ``fsspec.specs`` entry point): store options travel as the ``shard``
layer's storage options, ``{"shard": {"chunks_per_shard": [4, 4]}}``. zarr
writes and reads a group through the URL, ``fsspec.filesystem("shard", ...)``
lists the logical chunk keys zarr sees while the directory holds only shards,
and xarray round-trips a Dataset through another ``shard::`` URL.

Run: python examples/shard_urls.py   (writes into a temporary directory it removes)
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import xarray as xr
import zarr

OPTIONS: dict[str, Any] = {
    "shard": {"chunks_per_shard": [4, 4]}
}  # the target's own options would go under "file"


def files_under(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")
    )


def main(directory: Path) -> None:
    url = f"shard::file://{directory}/x.zarr"
    data = np.arange(128 * 128, dtype="i4").reshape(128, 128)

    # 1. zarr, by URL alone: a group and an array of 8 x 8 chunks of 16 x 16, 4 x 4 chunks per shard.
    group = zarr.open_group(url, mode="w", storage_options=OPTIONS)
    arr = group.create_array("a", shape=data.shape, chunks=(16, 16), dtype="i4")
    arr[:] = data
    store = group.store
    assert isinstance(store, zarr.storage.FsspecStore)
    print("zarr store behind the URL:", type(store).__name__, "over", type(store.fs).__name__)

    back = zarr.open_array(url, path="a", mode="r")  # reading needs no options: the config is recorded
    print("zarr.open_array(url) read back equal:", np.array_equal(back[:], data))

    # 2. The shard file system: logical keys above, shards below.
    fs = fsspec.filesystem("shard", fo=f"file://{directory}/x.zarr")
    chunk_keys = fs.find("a/c")
    print(f"fsspec 'shard' file system: {len(chunk_keys)} chunk keys, e.g. {chunk_keys[:3]}")
    chunk = fs.cat_file("a/c/5/6")  # one chunk's encoded bytes, read out of shard a/c/1/1
    print(f"  fs.cat_file('a/c/5/6'): {len(chunk)} encoded bytes (fs.info size {fs.info('a/c/5/6')['size']})")
    on_disk = files_under(directory / "x.zarr")
    print(f"on disk: {len(on_disk)} objects:", *on_disk, sep="\n  ")

    # 3. xarray: to_zarr and open_zarr on a shard:: URL.
    ds_url = f"shard::file://{directory}/ds.zarr"
    ds = xr.Dataset({"v": (("y", "x"), data.astype("f4"))}, coords={"y": np.arange(128), "x": np.arange(128)})
    with warnings.catch_warnings():  # the 1-d coordinates stay unsharded, as intended (said once per rank)
        warnings.filterwarnings("ignore", message=r".*stays unsharded")
        ds.to_zarr(
            ds_url,
            storage_options=OPTIONS,
            encoding={"v": {"chunks": (16, 16)}},
            zarr_format=3,
            consolidated=False,
        )
    opened = xr.open_zarr(ds_url, consolidated=False)
    xr.testing.assert_identical(opened.load(), ds)
    shards = [f for f in files_under(directory / "ds.zarr") if f.startswith("v/c/")]
    print(f"xarray round trip through {ds_url.split('://')[0]}://...: equal: True; v stored in {shards}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="shardstore-urls-") as tmp:
        main(Path(tmp))
