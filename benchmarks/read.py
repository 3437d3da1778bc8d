"""Read benchmark: ShardingStore against zarr's ShardingCodec, unsharded zarr and
tensorstore, on the same data in the same run.

float32, 64 x 64 chunks, 8 x 8 chunks per shard, zstd and uncompressed; a local
directory and an S3 API (moto_server on 127.0.0.1 behind a counting proxy that
can add latency per request, --latency-ms). Scenarios:

  whole   arr[:]
  cold    N random single-chunk reads, each through a newly opened array
  warm    the same N reads again through one open array
  slab    one chunk row across the whole array (crosses every shard of a row)

Printed: wall time (per read for cold/warm), ratio to the codec's, and inner
requests per operation (local: counted by wrappers; S3: by the proxy).

    python benchmarks/read.py                 # 64 MiB, 1000 reads
    python benchmarks/read.py --quick         # 4 MiB, 100 reads, under a minute
    python benchmarks/read.py --latency-ms 20 # S3 with 20 ms added per request
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

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

try:
    import tensorstore
except ImportError:  # a test/benchmark extra only
    tensorstore = None


class Reader:
    """Opens one layout's copy of the data and counts its requests."""

    def __init__(self, name: str, open_store: Callable[[], Any], counter: Callable[[], int] | None) -> None:
        self.name, self.open_store, self.counter = name, open_store, counter

    def array(self) -> Any:
        return zarr.open_array(self.open_store(), path="a", mode="r")


def _write_copies(root: str, s3: LocalS3 | None, data: np.ndarray, compressors: Any) -> dict[str, Any]:
    """Write unsharded, codec and ShardingStore copies; return how to open each."""
    stores: dict[str, Any] = {}
    for layout in ("unsharded", "codec", "shardstore"):
        if s3 is None:
            where = os.path.join(root, layout)
            store: Any = (
                ShardingStore(LocalInner(where), CPS) if layout == "shardstore" else LocalStore(where)
            )
        else:
            url = s3.url(f"{root}/{layout}")
            so = s3.storage_options
            store = (
                ShardingStore(url, CPS, storage_options=so)
                if layout == "shardstore"
                else (FsspecStore.from_url(url, storage_options=so))
            )
        arr = zarr.create_array(
            store,
            name="a",
            shape=data.shape,
            chunks=CHUNKS,
            dtype="f4",
            shards=SHARD if layout == "codec" else None,
            compressors=compressors,
        )
        if layout == "shardstore":
            with store.batch():
                arr[:] = data
        else:
            arr[:] = data
        stores[layout] = where if s3 is None else url
    return stores


def _readers(copies: dict[str, Any], s3: LocalS3 | None) -> list[Reader]:
    if s3 is not None:
        so = s3.storage_options

        def zarr_s3(name: str) -> Reader:
            return Reader(
                name,
                lambda: FsspecStore.from_url(copies[name], storage_options=so, read_only=True),
                lambda: s3.requests,
            )

        return [
            zarr_s3("unsharded"),
            zarr_s3("codec"),
            Reader(
                "shardstore",
                lambda: ShardingStore(copies["shardstore"], storage_options=so),
                lambda: s3.requests,
            ),
            Reader(
                "shardstore-trust",
                lambda: ShardingStore(copies["shardstore"], storage_options=so, index_cache="trust"),
                lambda: s3.requests,
            ),
        ]

    def local_zarr(name: str) -> Reader:
        counted = CountingStore(LocalStore(copies[name], read_only=True))  # zarr's stores cache nothing
        return Reader(name, lambda: counted, lambda: counted.counts.reads)

    counted = CountingInner(LocalInner(copies["shardstore"]))
    # each open is a new ShardingStore (cold index cache) over the same counted inner store
    ours = Reader("shardstore", lambda: ShardingStore(counted), lambda: counted.counts.reads)
    return [local_zarr("unsharded"), local_zarr("codec"), ours]


def _measure(
    reader: Reader, data: np.ndarray, picks: list[tuple[int, int]], s3: LocalS3 | None
) -> dict[str, tuple[float, float]]:
    """scenario -> (seconds, requests per operation)."""
    out: dict[str, tuple[float, float]] = {}

    def run(fn: Callable[[], None], ops: int) -> tuple[float, float]:
        before = reader.counter() if reader.counter else 0
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
        after = reader.counter() if reader.counter else 0
        return seconds / ops, (after - before) / ops

    arr = reader.array()
    out["whole"] = run(lambda: np.testing.assert_array_equal(arr[:], data), 1)

    def cold() -> None:
        for i, j in picks:
            fresh = reader.array()
            fresh[i * CHUNKS[0], j * CHUNKS[1]]

    if s3 is not None:
        s3.reset()
    out["cold"] = run(cold, len(picks))
    warm = reader.array()
    for i, j in picks:
        warm[i * CHUNKS[0], j * CHUNKS[1]]
    out["warm"] = run(lambda: [warm[i * CHUNKS[0], j * CHUNKS[1]] for i, j in picks] and None, len(picks))
    row = data.shape[0] // 2
    out["slab"] = run(
        lambda: np.testing.assert_array_equal(warm[row : row + CHUNKS[0], :], data[row : row + CHUNKS[0], :]),
        1,
    )
    return out


def _tensorstore(path: str, data: np.ndarray, picks: list[tuple[int, int]]) -> dict[str, tuple[float, float]]:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path + "/a"}}
    out = {}
    t = tensorstore.open(spec).result()
    t0 = time.perf_counter()
    np.testing.assert_array_equal(t.read().result(), data)
    out["whole"] = (time.perf_counter() - t0, float("nan"))
    t0 = time.perf_counter()
    for i, j in picks:
        tensorstore.open(spec).result()[i * CHUNKS[0], j * CHUNKS[1]].read().result()
    out["cold"] = ((time.perf_counter() - t0) / len(picks), float("nan"))
    warm = tensorstore.open({**spec, "context": {"cache_pool": {"total_bytes_limit": 2**28}}}).result()
    for i, j in picks:
        warm[i * CHUNKS[0], j * CHUNKS[1]].read().result()
    t0 = time.perf_counter()
    for i, j in picks:
        warm[i * CHUNKS[0], j * CHUNKS[1]].read().result()
    out["warm"] = ((time.perf_counter() - t0) / len(picks), float("nan"))
    row = data.shape[0] // 2
    t0 = time.perf_counter()
    warm[row : row + CHUNKS[0], :].read().result()
    out["slab"] = (time.perf_counter() - t0, float("nan"))
    return out


def report(title: str, results: dict[str, dict[str, tuple[float, float]]]) -> None:
    print(f"\n## {title}")
    print(f"{'scenario':<7} {'reader':<17} {'seconds':>10} {'vs codec':>9} {'requests/op':>12}")
    for scenario in ("whole", "cold", "warm", "slab"):
        codec = results["codec"][scenario][0]
        for name, scenarios in results.items():
            seconds, requests = scenarios[scenario]
            unit = " /read" if scenario in ("cold", "warm") else ""
            req = "-" if requests != requests else f"{requests:.2f}"
            print(f"{scenario:<7} {name:<17} {seconds:>10.5f} {seconds / codec:>9.2f} {req:>12}{unit}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every S3 request")
    args = parser.parse_args()
    side, n = (1024, 100) if args.quick else (4096, 1000)
    data = np.random.default_rng(0).standard_normal((side, side)).astype("f4")
    rng = np.random.default_rng(2)
    grid = side // CHUNKS[0]
    picks = [(int(rng.integers(0, grid)), int(rng.integers(0, grid))) for _ in range(n)]
    print(
        f"# read benchmark: {side}x{side} float32, chunks {CHUNKS}, chunks_per_shard {CPS}, "
        f"zarr {zarr.__version__}"
    )
    for compressor, compressors in (("zstd", "auto"), ("none", None)):
        with tempfile.TemporaryDirectory() as tmp:
            copies = _write_copies(tmp, None, data, compressors)
            results = {r.name: _measure(r, data, picks, None) for r in _readers(copies, None)}
            if tensorstore is not None:
                results["tensorstore"] = _tensorstore(copies["codec"], data, picks)
            report(f"local directory, {compressor}", results)
    if not args.no_s3:
        with local_s3() as s3:
            for compressor, compressors in (("zstd", "auto"), ("none", None)):
                copies = _write_copies(compressor, s3, data, compressors)
                s3.latency_s = args.latency_ms / 1000
                results = {
                    r.name: _measure(r, data, picks[: max(n // 10, 20)], s3) for r in _readers(copies, s3)
                }
                s3.latency_s = 0.0
                report(f"S3 API (moto, +{args.latency_ms:g} ms/request), {compressor}", results)


if __name__ == "__main__":
    main()
