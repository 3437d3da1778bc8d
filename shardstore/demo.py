"""The demo: one array written through ShardingStore and, beside it, by plain zarr."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import fsspec
import numpy as np
import zarr

from shardstore.store import ShardingStore

SHAPE = (2048, 2048)
CHUNKS = (64, 64)
CHUNKS_PER_SHARD = (8, 8)


def _tree_stats(root: Path) -> tuple[int, int]:
    files = [Path(d, f) for d, _, names in os.walk(root) for f in names]
    return len(files), sum(f.stat().st_size for f in files)


def _write_and_read(store: object, data: np.ndarray) -> tuple[float, float, bool]:
    t0 = time.perf_counter()
    arr = zarr.create_array(store, name="data", shape=data.shape, chunks=CHUNKS, dtype=data.dtype)
    arr[:] = data
    t1 = time.perf_counter()
    back = zarr.open_array(store, path="data", mode="r")[:]
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, bool(np.array_equal(back, data))


def run_demo(directory: str | None = None) -> int:
    base = Path(directory or tempfile.mkdtemp(prefix="shardstore-demo-"))
    rng = np.random.default_rng(0)
    data = (rng.standard_normal(SHAPE) * 10).round(1).astype("float32")  # compressible
    print(
        f"array {SHAPE} float32 ({data.nbytes / 2**20:.0f} MiB), chunks {CHUNKS}, "
        f"chunks_per_shard {CHUNKS_PER_SHARD}, written under {base}\n"
    )

    sharded = ShardingStore(
        fsspec.get_mapper(f"file://{base}/sharded.zarr"), chunks_per_shard=CHUNKS_PER_SHARD
    )
    plain = zarr.storage.LocalStore(base / "plain.zarr")
    rows = []
    ok = True
    for label, store, root in (
        ("zarr, unsharded", plain, base / "plain.zarr"),
        ("ShardingStore", sharded, base / "sharded.zarr"),
    ):
        write_s, read_s, equal = _write_and_read(store, data)
        objects, nbytes = _tree_stats(root)
        rows.append((label, objects, nbytes, write_s, read_s, equal))
        ok &= equal
    print(f"{'':<16} {'objects':>8} {'bytes':>12} {'write s':>8} {'read s':>8}  read-back")
    for label, objects, nbytes, write_s, read_s, equal in rows:
        check = "equal" if equal else "DIFFERENT"
        print(f"{label:<16} {objects:>8} {nbytes:>12,} {write_s:>8.3f} {read_s:>8.3f}  {check}")
    reopened = zarr.open_array(ShardingStore(fsspec.get_mapper(f"file://{base}/sharded.zarr")), path="data")
    ok &= bool(np.array_equal(reopened[100:200, 1000:1100], data[100:200, 1000:1100]))
    print(
        f"\nobjects: {rows[0][1]} -> {rows[1][1]} ({rows[0][1] / rows[1][1]:.0f}x fewer); "
        f"re-opened without config: {'ok' if ok else 'FAILED'}"
    )
    return 0 if ok else 1
