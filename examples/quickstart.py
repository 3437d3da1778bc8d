"""Quickstart: shard a zarr array on a local directory, re-open it, and write in a batch.

Shows that ``ShardingStore(directory, chunks_per_shard=(8, 8))`` stores 256 zarr
chunks as 4 shard objects, that a fresh store re-opens the array with no
configuration (it is recorded in the array's metadata), and that
``store.batch()`` and shardstore's zarr codec pipeline (``ShardAwarePipeline``,
chosen by zarr configuration) write each shard once, without reading it.

Run: python examples/quickstart.py   (writes into a temporary directory it removes)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import zarr

from shardstore import PIPELINE_PATH, ShardingStore
from shardstore.instrument import CountingInner
from shardstore.maintenance import list_keys


def files_under(root: Path) -> list[str]:
    """Every file below ``root`` (hidden lock files excluded), relative to it."""
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")
    )


def main(directory: Path) -> None:
    root = directory / "quickstart.zarr"
    data = np.arange(512 * 512, dtype="f4").reshape(512, 512)

    # 1. Create and write: a 16 x 16 grid of 32 x 32 chunks, 8 x 8 chunks per shard.
    store = ShardingStore(str(root), chunks_per_shard=(8, 8))
    arr = zarr.create_array(store, name="temperature", shape=data.shape, chunks=(32, 32), dtype="f4")
    arr[:] = data
    chunks = len(list_keys(store, "temperature/c/")[0])  # logical chunk keys, as zarr sees them
    on_disk = files_under(root)
    print(f"zarr wrote {chunks} chunks; {len(on_disk)} objects on disk:", *on_disk, sep="\n  ")

    # 2. Read back through the same store, and through a fresh one with no config.
    print("read back equal:", np.array_equal(arr[:], data))
    again = zarr.open_array(ShardingStore(str(root)), path="temperature", mode="r")
    region_equal = np.array_equal(again[100:300, 50:450], data[100:300, 50:450])
    print(f"fresh store, no config: chunks {again.chunks}, region [100:300, 50:450] equal: {region_equal}")
    recorded = json.loads((root / "temperature" / "zarr.json").read_text())["storage_transformers"]
    print("config recorded in temperature/zarr.json:", json.dumps(recorded[0]["configuration"]))

    # 3. store.batch(): count the requests that reach the directory.
    counted = CountingInner(str(root))
    batched = ShardingStore(counted, chunks_per_shard=(8, 8))
    pressure = zarr.create_array(batched, name="pressure", shape=data.shape, chunks=(32, 32), dtype="f4")
    c = counted.counts
    c.reset()
    pressure[:] = data  # default: zarr's chunk-by-chunk writes reach each shard in several commits
    print(f"default write: {c.writes} shard writes, {c.reads} reads, {c.bytes_written:,} bytes written")
    c.reset()
    with batched.batch():  # buffered per shard: each complete shard is written once, nothing read
        pressure[:] = data * 2
    print(f"batch():       {c.writes} shard writes, {c.reads} reads, {c.bytes_written:,} bytes written")
    fresh = zarr.open_array(ShardingStore(str(root)), path="pressure", mode="r")
    print("batch() read back equal:", np.array_equal(fresh[:], data * 2))

    # 4. The pipeline: zarr hands it the whole selection, it commits each shard once.
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):  # before opening the array
        piped = zarr.open_array(batched, path="pressure")
        c.reset()
        piped[:] = data * 3
        print(f"pipeline:      {c.writes} shard writes, {c.reads} reads, {c.bytes_written:,} bytes written")
        c.reset()
        equal = np.array_equal(piped[:], data * 3)
        print(f"pipeline read back equal: {equal} | {c.reads} reads in {c.read_batches} batch")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="shardstore-quickstart-") as tmp:
        main(Path(tmp))
