"""Write benchmark: ShardingStore against zarr's own ShardingCodec and unsharded zarr.

Same data, same run: float32, 64 x 64 chunks, 8 x 8 chunks per shard, zstd and
uncompressed, on a local directory and on an S3 API (moto_server on 127.0.0.1
behind a counting proxy). Scenarios:

  whole    arr[:] = data on a new array
  regions  shard-aligned region writes, one shard after another (what dask does)
  updates  N random single-chunk updates into an existing array

Printed per row: wall time, its ratio to the codec's, write amplification
(bytes written / bytes finally stored; for updates, bytes written / chunk bytes
updated) and requests (reads, writes; on S3 GET, PUT, HEAD). Timings are the
best of --repeats runs; counts are exact.

    python benchmarks/write.py            # 64 MiB array, 200 updates
    python benchmarks/write.py --quick    # 4 MiB array, 50 updates, under a minute
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import zarr
from zarr.storage import FsspecStore, LocalStore

from shardstore import ShardingStore
from shardstore.inner import LocalInner
from shardstore.instrument import CountingInner, CountingStore
from shardstore.testing.s3 import LocalS3, local_s3

CHUNKS = (64, 64)
CPS = (8, 8)
SHARD = (CHUNKS[0] * CPS[0], CHUNKS[1] * CPS[1])
VARIANTS = ["unsharded", "codec", "default", "batch", "append"]


@dataclass
class Row:
    scenario: str
    variant: str
    seconds: float
    amplification: float
    requests: str


class Backend:
    """Makes fresh stores of each variant and reads their counters."""

    def __init__(self, name: str, root: str, s3: LocalS3 | None) -> None:
        self.name, self.root, self.s3 = name, root, s3
        self.counters: dict[str, Any] = {}

    def store(self, variant: str, path: str) -> Any:
        if self.s3 is None:
            directory = os.path.join(self.root, path)
            if variant in ("unsharded", "codec"):
                counted = CountingStore(LocalStore(directory))
                self.counters[path] = counted
                return counted
            inner = CountingInner(LocalInner(directory))
            self.counters[path] = inner
            return ShardingStore(inner, CPS, write_strategy="append" if variant == "append" else "rewrite")
        url = self.s3.url(path)
        if variant in ("unsharded", "codec"):
            return FsspecStore.from_url(url, storage_options=self.s3.storage_options)
        return ShardingStore(url, CPS, storage_options=self.s3.storage_options)

    def reset(self, path: str) -> None:
        if self.s3 is not None:
            self.s3.reset()
        else:
            self.counters[path].counts.reset()

    def counts(self, path: str) -> tuple[int, str]:
        """(bytes written, request summary)."""
        if self.s3 is not None:
            c = self.s3.counts
            return (
                self.s3.bytes_up,
                f"GET {c['GET']} PUT {c['PUT']} HEAD {c['HEAD']} other {c['POST'] + c['DELETE']}",
            )
        c = self.counters[path].counts
        return c.bytes_written, f"reads {c.reads} writes {c.writes}"

    def stored_bytes(self, path: str) -> int:
        if self.s3 is not None:
            fs = fsspec.filesystem("s3", **self.s3.storage_options)
            return int(sum(fs.du(self.s3.url(path) + "/a/c", total=False).values()))
        top = os.path.join(self.root, path, "a", "c")
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(top) for f in fs)


def _array(store: Any, variant: str, data: np.ndarray, compressor: str) -> zarr.Array[Any]:
    return zarr.create_array(
        store,
        name="a",
        shape=data.shape,
        chunks=CHUNKS,
        shards=SHARD if variant == "codec" else None,
        dtype="f4",
        compressors=None if compressor == "none" else "auto",
    )


@contextlib.contextmanager
def _maybe_batch(store: Any, variant: str) -> Iterator[None]:
    if variant == "batch":
        with store.batch():
            yield
    else:
        yield


def _write(store: Any, arr: zarr.Array[Any], variant: str, scenario: str, data: np.ndarray) -> None:
    with _maybe_batch(store, variant):
        if scenario == "whole":
            arr[:] = data
            return
        for i in range(0, data.shape[0], SHARD[0]):
            for j in range(0, data.shape[1], SHARD[1]):
                arr[i : i + SHARD[0], j : j + SHARD[1]] = data[i : i + SHARD[0], j : j + SHARD[1]]


def _measure_write(
    backend: Backend, variant: str, scenario: str, data: np.ndarray, compressor: str, repeats: int
) -> tuple[Row, str, zarr.Array[Any]]:
    """Best time of ``repeats`` fresh arrays; counts (creation included) from the last."""
    best = float("inf")
    for _ in range(repeats):
        path = f"{scenario}-{variant}-{compressor}-{uuid.uuid4().hex[:8]}"
        store = backend.store(variant, path)
        backend.reset(path)
        arr = _array(store, variant, data, compressor)
        t0 = time.perf_counter()
        _write(store, arr, variant, scenario, data)
        best = min(best, time.perf_counter() - t0)
    written, summary = backend.counts(path)
    return Row(scenario, variant, best, written / backend.stored_bytes(path), summary), path, arr


def _measure_updates(backend: Backend, path: str, arr: zarr.Array[Any], variant: str, n: int) -> Row:
    rng = np.random.default_rng(1)
    grid = (arr.shape[0] // CHUNKS[0], arr.shape[1] // CHUNKS[1])
    picks = [(int(rng.integers(0, grid[0])), int(rng.integers(0, grid[1]))) for _ in range(n)]
    values = rng.standard_normal((n, *CHUNKS)).astype("f4")
    chunk_bytes = backend.stored_bytes(path) / (grid[0] * grid[1])
    backend.reset(path)
    t0 = time.perf_counter()
    for (i, j), value in zip(picks, values, strict=True):
        arr[i * CHUNKS[0] : (i + 1) * CHUNKS[0], j * CHUNKS[1] : (j + 1) * CHUNKS[1]] = value
    per_update = (time.perf_counter() - t0) / n
    written, summary = backend.counts(path)
    return Row("updates", variant, per_update, written / (chunk_bytes * n), f"{summary} ({n} updates)")


def run_backend(
    backend: Backend, data: np.ndarray, compressor: str, n_updates: int, repeats: int
) -> list[Row]:
    rows: list[Row] = []
    for variant in VARIANTS:
        if variant == "append" and backend.s3 is not None:
            continue  # S3 cannot append
        for scenario in ("whole", "regions"):
            row, path, arr = _measure_write(backend, variant, scenario, data, compressor, repeats)
            rows.append(row)
        rows.append(_measure_updates(backend, path, arr, variant, n_updates))  # into the last array
    return rows


def report(title: str, rows: list[Row]) -> None:
    print(f"\n## {title}")
    print(f"{'scenario':<9} {'variant':<10} {'seconds':>9} {'vs codec':>9} {'amplif.':>8}  requests")
    codec = {r.scenario: r.seconds for r in rows if r.variant == "codec"}
    for r in rows:
        unit = "s/update" if r.scenario == "updates" else "s"
        ratio = r.seconds / codec[r.scenario]
        print(
            f"{r.scenario:<9} {r.variant:<10} {r.seconds:>8.4f}{unit[0]} {ratio:>9.2f} "
            f"{r.amplification:>8.2f}  {r.requests}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small array, fewer updates (under a minute)")
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 API runs")
    parser.add_argument("--repeats", type=int, default=None, help="timing repeats (best of)")
    args = parser.parse_args()
    side, n_updates = (1024, 50) if args.quick else (4096, 200)
    repeats = args.repeats or (1 if args.quick else 3)
    data = np.random.default_rng(0).standard_normal((side, side)).astype("f4")
    print(
        f"# write benchmark: {side}x{side} float32 ({data.nbytes / 2**20:.0f} MiB), chunks {CHUNKS}, "
        f"chunks_per_shard {CPS}, zarr {zarr.__version__}, "
        f"async.concurrency {zarr.config.get('async.concurrency')}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for compressor in ("zstd", "none"):
            backend = Backend("local", tmp, None)
            report(
                f"local directory, {compressor}", run_backend(backend, data, compressor, n_updates, repeats)
            )
    if not args.no_s3:
        with local_s3() as s3:
            for compressor in ("zstd", "none"):
                backend = Backend("s3", "", s3)
                report(f"S3 API (moto), {compressor}", run_backend(backend, data, compressor, n_updates, 1))


if __name__ == "__main__":
    main()
