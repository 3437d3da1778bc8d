"""Read benchmark: ShardingStore against zarr's ShardingCodec, unsharded zarr and
tensorstore, on the same data in the same run.

float32, 64 x 64 chunks, 8 x 8 chunks per shard, zstd and uncompressed; a local
directory and an S3 API (moto_server on 127.0.0.1 behind a counting proxy that
can add latency per request, --latency-ms). Scenarios:

  whole   arr[:]
  cold    N random single-chunk reads, each through a newly opened array
  warm    the same N reads again through one open array
  slab    one chunk row across the whole array (crosses every shard of a row)

Readers: unsharded zarr, zarr's ShardingCodec, ShardingStore with its default
read_strategy="auto" and with "chunk" / "shard" (and index_cache="trust" on
S3), and tensorstore's zarr3 driver reading the codec copy (if installed; a
benchmark extra). Each cold read and the slab go through a newly opened store.

Printed: wall time (per read for cold/warm), ratio to the codec's, inner
requests per operation (local: counted by wrappers; S3: by the proxy, for
tensorstore too) and, with --latency-ms, the time in round trips.

    python benchmarks/read.py                 # 64 MiB, 1000 reads (100 on S3)
    python benchmarks/read.py --quick         # 4 MiB, 100 reads (20 on S3)
    python benchmarks/read.py --latency-ms 20 # S3 with 20 ms added per request
    python benchmarks/read.py --concurrency 64  # zarr's async.concurrency
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
from zarr.core.buffer import Buffer, cpu
from zarr.storage import FsspecStore, LocalStore, MemoryStore

from shardstore import ShardingStore
from shardstore.inner import LocalInner
from shardstore.instrument import CountingInner, CountingStore
from shardstore.testing.s3 import ApartS3, apart_s3

CHUNKS = (64, 64)
CPS = (8, 8)
SHARD = (CHUNKS[0] * CPS[0], CHUNKS[1] * CPS[1])

tensorstore: Any
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


def _write_copies(root: str, s3: ApartS3 | None, data: np.ndarray, compressors: Any) -> dict[str, Any]:
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


def _in_memory(root: str) -> dict[str, Buffer]:
    """Every file below ``root`` as a MemoryStore's contents."""
    out: dict[str, Buffer] = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root).replace(os.sep, "/")] = cpu.Buffer.from_bytes(f.read())
    return out


def _readers(copies: dict[str, Any], s3: ApartS3 | None) -> list[Reader]:
    if s3 is not None:
        so = s3.storage_options

        def zarr_s3(name: str) -> Reader:
            return Reader(
                name,
                lambda: FsspecStore.from_url(copies[name], storage_options=so, read_only=True),
                lambda: s3.requests,
            )

        def ours_s3(name: str, **options: Any) -> Reader:
            return Reader(
                name,
                lambda: ShardingStore(copies["shardstore"], storage_options=so, **options),
                lambda: s3.requests,
            )

        return [
            zarr_s3("unsharded"),
            zarr_s3("codec"),
            ours_s3("shardstore"),  # read_strategy="auto": whole shards on S3
            ours_s3("ss chunk", read_strategy="chunk"),
            ours_s3("ss chunk+trust", read_strategy="chunk", index_cache="trust"),
            ours_s3("ss shard+trust", read_strategy="shard", index_cache="trust"),
        ]

    def local_zarr(name: str) -> Reader:
        counted = CountingStore(LocalStore(copies[name], read_only=True))  # zarr's stores cache nothing
        return Reader(name, lambda: counted, lambda: counted.counts.reads)

    def ours_local(name: str, **options: Any) -> Reader:
        counted = CountingInner(LocalInner(copies["shardstore"]))
        # each open is a new ShardingStore (cold caches) over the same counted inner store
        return Reader(name, lambda: ShardingStore(counted, **options), lambda: counted.counts.reads)

    memory = CountingStore(MemoryStore(_in_memory(copies["unsharded"])))
    return [
        Reader("zarr in memory", lambda: memory, lambda: memory.counts.reads),  # the floor under zarr
        local_zarr("unsharded"),
        local_zarr("codec"),
        ours_local("shardstore"),  # read_strategy="auto": whole shards once read again and again
        ours_local("ss chunk", read_strategy="chunk"),
        ours_local("ss shard", read_strategy="shard"),
    ]


def _measure(
    reader: Reader, data: np.ndarray, picks: list[tuple[int, int]], s3: ApartS3 | None
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

    def warm_reads() -> None:
        for i, j in picks:
            warm[i * CHUNKS[0], j * CHUNKS[1]]

    out["warm"] = run(warm_reads, len(picks))
    row = data.shape[0] // 2
    fresh = reader.array()
    if s3 is not None:
        s3.reset()
    rows = slice(row, row + CHUNKS[0])
    out["slab"] = run(lambda: np.testing.assert_array_equal(fresh[rows, :], data[rows, :]), 1)
    return out


def _tensorstore(
    kvstore: dict[str, Any], data: np.ndarray, picks: list[tuple[int, int]], s3: ApartS3 | None
) -> dict[str, tuple[float, float]]:
    """The same scenarios through tensorstore's zarr3 driver (its cache pool on for
    the warm reads, as the warm scenario is about caches)."""
    assert tensorstore is not None
    spec = {"driver": "zarr3", "kvstore": kvstore}
    out = {}

    def run(fn: Callable[[], None], ops: int) -> tuple[float, float]:
        before = s3.requests if s3 else 0
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
        return seconds / ops, ((s3.requests - before) / ops if s3 else float("nan"))

    t = tensorstore.open(spec).result()
    out["whole"] = run(lambda: np.testing.assert_array_equal(t.read().result(), data), 1)

    def cold() -> None:
        for i, j in picks:
            tensorstore.open(spec).result()[i * CHUNKS[0], j * CHUNKS[1]].read().result()

    out["cold"] = run(cold, len(picks))
    warm = tensorstore.open({**spec, "context": {"cache_pool": {"total_bytes_limit": 2**28}}}).result()
    for i, j in picks:
        warm[i * CHUNKS[0], j * CHUNKS[1]].read().result()

    def warm_reads() -> None:
        for i, j in picks:
            warm[i * CHUNKS[0], j * CHUNKS[1]].read().result()

    out["warm"] = run(warm_reads, len(picks))
    row = data.shape[0] // 2
    fresh = tensorstore.open(spec).result()
    out["slab"] = run(
        lambda: np.testing.assert_array_equal(
            fresh[row : row + CHUNKS[0], :].read().result(), data[row : row + CHUNKS[0], :]
        ),
        1,
    )
    return out


def report(title: str, results: dict[str, dict[str, tuple[float, float]]], latency_s: float = 0.0) -> None:
    """One table: seconds (per read for cold/warm), ratio to the codec, inner requests
    per operation and, with added latency, the time in round trips."""
    print(f"\n## {title}")
    trips = f"{'round trips':>12}" if latency_s else ""
    print(f"{'scenario':<7} {'reader':<16} {'seconds':>10} {'vs codec':>9} {'requests/op':>12}{trips}")
    for scenario in ("whole", "cold", "warm", "slab"):
        codec = results["codec"][scenario][0]
        for name, scenarios in results.items():
            seconds, requests = scenarios[scenario]
            unit = " /read" if scenario in ("cold", "warm") else ""
            req = "-" if requests != requests else f"{requests:.2f}"
            rt = f"{seconds / latency_s:>12.1f}" if latency_s else ""
            print(f"{scenario:<7} {name:<16} {seconds:>10.5f} {seconds / codec:>9.2f} {req:>12}{rt}{unit}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--no-local", action="store_true")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every S3 request")
    parser.add_argument("--concurrency", type=int, help="zarr's async.concurrency (default 10)")
    args = parser.parse_args()
    if args.concurrency:
        zarr.config.set({"async.concurrency": args.concurrency})
    side, n = (1024, 100) if args.quick else (4096, 1000)
    data = np.random.default_rng(0).standard_normal((side, side)).astype("f4")
    rng = np.random.default_rng(2)
    grid = side // CHUNKS[0]
    picks = [(int(rng.integers(0, grid)), int(rng.integers(0, grid))) for _ in range(n)]
    print(
        f"# read benchmark: {side}x{side} float32, chunks {CHUNKS}, chunks_per_shard {CPS}, "
        f"zarr {zarr.__version__} (async.concurrency {zarr.config.get('async.concurrency')}), "
        f"tensorstore {'yes' if tensorstore else 'not installed'}"
    )
    for compressor, compressors in (("zstd", "auto"), ("none", None)):
        if args.no_local:
            break
        with tempfile.TemporaryDirectory() as tmp:
            copies = _write_copies(tmp, None, data, compressors)
            results = {r.name: _measure(r, data, picks, None) for r in _readers(copies, None)}
            if tensorstore is not None:
                kvstore = {"driver": "file", "path": copies["codec"] + "/a/"}
                results["tensorstore"] = _tensorstore(kvstore, data, picks, None)
            report(f"local directory, {compressor}", results)
    if not args.no_s3:
        # tensorstore takes S3 credentials from the environment
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        with apart_s3() as s3:
            for compressor, compressors in (("zstd", "auto"), ("none", None)):
                copies = _write_copies(compressor, s3, data, compressors)
                s3.latency_s = args.latency_ms / 1000
                few = picks[: max(n // 10, 20)]
                results = {r.name: _measure(r, data, few, s3) for r in _readers(copies, s3)}
                if tensorstore is not None:
                    kvstore = {
                        "driver": "s3",
                        "bucket": s3.bucket,
                        "path": f"{compressor}/codec/a/",
                        "endpoint": s3.endpoint_url,
                        "aws_region": "us-east-1",
                    }
                    results["tensorstore"] = _tensorstore(kvstore, data, few, s3)
                s3.latency_s = 0.0
                title = f"S3 API (moto, +{args.latency_ms:g} ms/request), {compressor}"
                report(title, results, args.latency_ms / 1000)


if __name__ == "__main__":
    main()
