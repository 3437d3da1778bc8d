"""Icechunk benchmark: a whole write with its commit, and a whole read, of one
array in an Icechunk repository on local storage, through shardstore against
zarr's own ShardingCodec, unsharded zarr and zarrs-python's Rust pipeline, all
over the same kind of repository, in one run.

Data: --size x --size float32 (default 4096: 64 MiB; 1024 with --quick),
chunks 64 x 64 (16 KiB), 8 x 8 chunks per shard, zstd (zarr's default
"auto" compressors), random values (each repeat writes the same array).

Rows (variants): "unsharded" (zarr, one Icechunk chunk per zarr chunk);
"codec" (zarr's ShardingCodec, ``shards=``); "zarrs" (the codec array through
``codec_pipeline.path = "zarrs.ZarrsCodecPipeline"``); "shardstore"
(ShardingStore over the session's store, default options). tensorstore has no
Icechunk driver, so it has no row.

Workloads: "write + commit" creates the array afresh in a new session (not timed),
then times ``arr[:] = data`` and ``session.commit``; "whole read" times
``arr[:]`` through a new read-only session of that commit. Columns: seconds
(best of --repeats; default 3, 1 with --quick), ratios to the codec and to
zarrs, and the objects the array's chunks became in the repository.

    python benchmarks/over_icechunk.py [--quick] [--size N] [--repeats N]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import icechunk
import numpy as np
import zarr
from zarr.core.sync import sync

from shardstore import ShardingStore

CHUNK = 64
CPS = 8
VARIANTS = ("unsharded", "codec", "zarrs", "shardstore")


@dataclass
class Row:
    variant: str
    write_s: float
    read_s: float
    objects: int


@contextlib.contextmanager
def pipeline(variant: str) -> Iterator[None]:
    """zarrs' pipeline for the "zarrs" row; zarr's configuration as it is otherwise."""
    if variant != "zarrs":
        yield
        return
    with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
        yield


def store_of(variant: str, session: Any) -> Any:
    return ShardingStore(session.store, (CPS, CPS)) if variant == "shardstore" else session.store


def create(variant: str, session: Any, size: int) -> zarr.Array[Any]:
    shards = None if variant in ("unsharded", "shardstore") else (CHUNK * CPS, CHUNK * CPS)
    return zarr.create_array(
        store_of(variant, session),
        name="a",
        shape=(size, size),
        chunks=(CHUNK, CHUNK),
        shards=shards,
        dtype="f4",
        overwrite=True,
    )


async def _count(store: Any) -> int:
    return len([k async for k in store.list_prefix("a/") if "/c/" in k])


def best(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


def measure(variant: str, data: np.ndarray, repeats: int) -> Row:
    root = tempfile.mkdtemp(prefix=f"icechunk-bench-{variant}-")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(root))
    snapshot = ""

    def write() -> float:
        nonlocal snapshot
        session = repo.writable_session("main")
        with pipeline(variant):
            arr = create(variant, session, data.shape[0])
            started = time.perf_counter()
            arr[:] = data
            snapshot = session.commit(f"{variant} write")
        return time.perf_counter() - started

    def read() -> float:
        session = repo.readonly_session(snapshot_id=snapshot)
        with pipeline(variant):
            arr = zarr.open_array(store_of(variant, session), path="a", mode="r")
            started = time.perf_counter()
            got = arr[:]
            elapsed = time.perf_counter() - started
        if not np.array_equal(got, data):
            raise AssertionError(f"{variant}: the read differs from what was written")
        return elapsed

    write_s = best(repeats, write)
    read_s = best(repeats, read)
    objects = sync(_count(repo.readonly_session(snapshot_id=snapshot).store))
    return Row(variant, write_s, read_s, objects)


def report(rows: list[Row], size: int, repeats: int) -> None:
    by = {r.variant: r for r in rows}
    mib = size * size * 4 / 2**20
    print(
        f"Icechunk, local storage: {size}x{size} float32 ({mib:.0f} MiB), chunks {CHUNK}x{CHUNK}, "
        f"{CPS}x{CPS} per shard, zstd; best of {repeats}; "
        f"icechunk {icechunk.__version__}, zarr {zarr.__version__}"
    )
    print(f"{'variant':<12} {'workload':<16} {'seconds':>9} {'vs codec':>9} {'vs zarrs':>9} {'objects':>8}")
    for workload, attr in (("write + commit", "write_s"), ("whole read", "read_s")):
        for row in rows:
            t = getattr(row, attr)
            vs_codec = t / getattr(by["codec"], attr)
            vs_zarrs = t / getattr(by["zarrs"], attr) if "zarrs" in by else float("nan")
            ratios = f"{vs_codec:>8.2f}x {vs_zarrs:>8.2f}x"
            print(f"{row.variant:<12} {workload:<16} {t:>9.3f} {ratios} {row.objects:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1024 x 1024 (4 MiB), one repeat")
    parser.add_argument("--size", type=int, default=None, help="side of the array (default 4096)")
    parser.add_argument("--repeats", type=int, default=None, help="best of this many (default 3)")
    args = parser.parse_args()
    size = args.size or (1024 if args.quick else 4096)
    repeats = args.repeats or (1 if args.quick else 3)
    icechunk.set_logs_filter("error")  # (its warning that local storage suits one committer)
    data = np.random.default_rng(0).random((size, size), dtype="f4")
    variants = [v for v in VARIANTS if v != "zarrs" or _has_zarrs()]
    report([measure(v, data, repeats) for v in variants], size, repeats)


def _has_zarrs() -> bool:
    try:
        import zarrs  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
