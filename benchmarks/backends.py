"""Backend benchmark: ShardingStore over S3 through s3fs (S3Inner) and through
obstore (ObstoreInner), on the same moto_server in the same run.

float32, 64 x 64 chunks, 8 x 8 chunks per shard, zstd. The S3 API is
moto_server on 127.0.0.1 behind the counting proxy of shardstore.testing.s3,
which counts requests and bytes and can add latency per request
(--latency-ms). Scenarios, each backend on its own copy of the same data:

  write   arr[:] = data on a new array inside store.batch() (one PUT per shard; the
          array is created before the clock starts)
  whole   arr[:] through a newly opened store
  cold    N single-chunk reads, each through a newly opened store (s3fs: fsspec
          hands every store its cached S3FileSystem; obstore: ObstoreInner.from_url
          its cached client; "cold, new client": a new obstore S3Store each time)
  warm    the same N reads again through one open array
  update  N single-chunk updates through one open array (a GET and a PUT each)

Printed per scenario and backend: wall time (best of --repeats; per read or
update for cold/warm/update), requests and MiB down/up per operation (exact),
and the ratio obstore / s3fs of the times.

    python benchmarks/backends.py --quick                  # 1024^2, 20 reads, 10 updates
    python benchmarks/backends.py --quick --latency-ms 20  # + 20 ms per request
    python benchmarks/backends.py                          # 4096^2, 100 reads, 50 updates
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from shardstore import ShardingStore
from shardstore.inner import ObstoreInner
from shardstore.inner.obstore import _open
from shardstore.testing.s3 import ApartS3, apart_s3

CHUNKS = (64, 64)
CPS = (8, 8)
SCENARIOS = ("write", "whole", "cold", "cold, new client", "warm", "update")


@dataclass
class Result:
    seconds: float
    requests: float
    down: float
    up: float


class Backend:
    """Opens ShardingStores over one S3 path through one client library."""

    def __init__(self, name: str, s3: ApartS3, path: str) -> None:
        self.name, self.s3, self.url = name, s3, s3.url(path)

    def store(self, new_client: bool = False) -> ShardingStore:
        if self.name == "s3fs":
            return ShardingStore(self.url, CPS, storage_options=self.s3.storage_options)
        if new_client:
            return ShardingStore(ObstoreInner(_open(self.url, self.s3.storage_options)), CPS)
        return ShardingStore(ObstoreInner.from_url(self.url, self.s3.storage_options), CPS)

    def array(self, new_client: bool = False) -> Any:
        return zarr.open_array(self.store(new_client), path="a", mode="r+", zarr_format=3)


def _timed(
    s3: ApartS3, fn: Callable[[], None], ops: int, repeats: int, setup: Callable[[], None] | None = None
) -> Result:
    """Best time of ``repeats`` runs (each after ``setup``, untimed and uncounted);
    requests and bytes of the last (they are exact)."""
    best = float("inf")
    for _ in range(repeats):
        if setup is not None:
            setup()
        s3.reset()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    mib = 2**20 * ops
    return Result(best / ops, s3.requests / ops, s3.bytes_down / mib, s3.bytes_up / mib)


def measure(
    backend: Backend, data: np.ndarray, picks: list[tuple[int, int]], updates: int, repeats: int
) -> dict[str, Result]:
    s3, out = backend.s3, {}
    new: list[tuple[ShardingStore, Any]] = []

    def create() -> None:
        store = backend.store()
        arr = zarr.create_array(store, name="a", shape=data.shape, chunks=CHUNKS, dtype="f4", overwrite=True)
        new[:] = [(store, arr)]

    def write() -> None:
        [(store, arr)] = new
        with store.batch():
            arr[:] = data

    out["write"] = _timed(s3, write, 1, repeats, setup=create)
    out["whole"] = _timed(s3, lambda: np.testing.assert_array_equal(backend.array()[:], data), 1, repeats)

    def cold(new_client: bool) -> None:
        for i, j in picks:
            value = backend.array(new_client)[i * CHUNKS[0], j * CHUNKS[1]]
            assert value == data[i * CHUNKS[0], j * CHUNKS[1]]

    out["cold"] = _timed(s3, lambda: cold(False), len(picks), repeats)
    if backend.name == "obstore":
        out["cold, new client"] = _timed(s3, lambda: cold(True), len(picks), repeats)
    warm = backend.array()
    for i, j in picks:
        warm[i * CHUNKS[0], j * CHUNKS[1]]

    def warm_reads() -> None:
        for i, j in picks:
            warm[i * CHUNKS[0], j * CHUNKS[1]]

    out["warm"] = _timed(s3, warm_reads, len(picks), repeats)
    arr = backend.array()

    def update() -> None:
        for n, (i, j) in enumerate(picks[:updates]):
            arr[i * CHUNKS[0] : (i + 1) * CHUNKS[0], j * CHUNKS[1] : (j + 1) * CHUNKS[1]] = n

    out["update"] = _timed(s3, update, updates, repeats)
    return out


def report(results: dict[str, dict[str, Result]], latency_ms: float) -> None:
    print(f"\n## S3 API (moto, +{latency_ms:g} ms/request)")
    print(
        f"{'scenario':<20} {'backend':<8} {'seconds':>10} {'obstore/s3fs':>13} "
        f"{'requests':>9} {'MiB down':>9} {'MiB up':>8}"
    )
    for scenario in SCENARIOS:
        base = results["s3fs"].get(scenario) or results["s3fs"]["cold"]
        for name, scenarios in results.items():
            r = scenarios.get(scenario)
            if r is None:
                continue
            ratio = f"{r.seconds / base.seconds:>13.2f}" if name == "obstore" else f"{'':>13}"
            unit = "" if scenario in ("write", "whole") else " /op"
            print(
                f"{scenario:<20} {name:<8} {r.seconds:>10.4f} {ratio} "
                f"{r.requests:>9.2f} {r.down:>9.3f} {r.up:>8.3f}{unit}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every S3 request")
    parser.add_argument("--repeats", type=int, default=3, help="timings are the best of this many runs")
    args = parser.parse_args()
    side, n, updates = (1024, 20, 10) if args.quick else (4096, 100, 50)
    data = np.random.default_rng(0).standard_normal((side, side)).astype("f4")
    rng = np.random.default_rng(2)
    grid = side // CHUNKS[0]
    picks = [(int(rng.integers(0, grid)), int(rng.integers(0, grid))) for _ in range(n)]
    import obstore
    import s3fs

    print(
        f"# backend benchmark: {side}x{side} float32, chunks {CHUNKS}, chunks_per_shard {CPS}, zstd; "
        f"s3fs {s3fs.__version__}, obstore {obstore.__version__}, zarr {zarr.__version__}"
    )
    with apart_s3(latency_s=args.latency_ms / 1000) as s3:
        results: dict[str, dict[str, Result]] = {}
        for name in ("s3fs", "obstore"):
            results[name] = measure(Backend(name, s3, f"{name}.zarr"), data, picks, updates, args.repeats)
        report(results, args.latency_ms)


if __name__ == "__main__":
    main()
