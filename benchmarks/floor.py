"""Floor benchmark: what each workload costs through shardstore against zarr's own
ShardingCodec, unsharded zarr and tensorstore, on the same data, in one run.

Backends: a local directory, and an S3 API (moto_server on 127.0.0.1 behind a
counting proxy, shardstore.testing.s3) with --latency-ms added to every request
(default 20; 0 allowed). The proxy runs in a process of its own, as a real object
store does: in the benchmark's process its threads took turns at the GIL with the
Python clients (s3fs under shardstore and zarr) and not with tensorstore, which
runs without it (a 16 MiB whole read: about 20 ms more for shardstore, 2 ms for
tensorstore). Data: float32 (tiny: uint8).

  main   --size x --size (2048; 1024 with --quick; a multiple of 512), chunks
         64 x 64, 8 x 8 chunks per shard, zstd (zarr's default "auto"
         compressors): every workload.
  big    chunks 256 x 512 (512 KiB), 4 x 4 chunks per shard (8 MiB shards),
         uncompressed: the cold and warm chunk rows only. A shard is 16 chunks, so
         "MiB read/op" of a cold chunk shows whether a whole shard is downloaded
         to serve one chunk (0.5 MiB: the chunk; 8 MiB: its shard).
  raw    as main, uncompressed: whole read, whole write and overwrite, where
         codec cost is least and per-chunk machinery shows most.
  cube   3-d, (size/8)^3 (64 MiB; 8 MiB with --quick), chunks 64^3 (1 MiB),
         2 x 2 x 2 per shard, zstd: whole read and write, where decoding
         dominates.
  tiny   local only: 2048 x 2048 uint8 (1024 with --quick), chunks 8 x 8 (64
         bytes: 65,536 chunks; 16,384 with --quick), 8 x 8 per shard,
         uncompressed: whole read and write, where per-chunk machinery is all
         there is.

Workloads (each through a newly opened store unless said otherwise):

  cold chunk         N random single-chunk reads, each through a newly opened
                     store and array (cold caches; the open is in the time)
  warm chunk         the same reads again through one open array, after reading
                     them once (tensorstore: with a 256 MiB cache pool)
  slab               one chunk row across the whole array
  whole read         arr[:]
  1-chunk update     M random single-chunk writes, each a new value for one whole
                     chunk, into an existing array (the one "whole write" wrote)
  whole write        arr[:] = data on a new array (its creation not timed)
  overwrite          arr[:] = data again, over the array "whole write" wrote
  whole write batch  the same inside `with store.batch():` (ShardingStore only;
                     "-" for the others; its "vs codec" is against the codec's
                     whole write)

Variants (rows): "zarr per-chunk" (zarr's own per-chunk cost, the floor every
unmodified zarr array pays: the unsharded array through a pipeline that only
iterates the chunks zarr hands it, reading and writing nothing; slab, whole
read and whole write); "unsharded" zarr; "codec" (zarr's ShardingCodec, `shards=`);
"zarr fused" (the codec copy through zarr 3.4's `FusedCodecPipeline`; its
requests are not counted);
"zarrs" (the codec copy through zarrs-python's Rust pipeline,
`codec_pipeline.path = "zarrs.ZarrsCodecPipeline"`); "tensorstore" (zarr3
driver on the codec copy; its writes go to a zarr3 sharded array created by
zarr); "shardstore" (ShardingStore, default options: shardstore's pipeline,
which importing shardstore makes zarr's); "ss revalidate"
(index_cache="revalidate", reads only); "ss zarr pipe" (ShardingStore under
zarr's own batched pipeline: what `SHARDSTORE_DEFAULT_PIPELINE=0` gives);
"python floor" (local only: plain Python on the shardstore copy's files, no
zarr — each shard file read with one read() and its chunks decoded with numcodecs
in a loop on one thread; writes encode in a loop and write each shard file with
one write(): what a Python program that knows the layout costs at least);
"ss obstore" (S3 only: ShardingStore over ObstoreInner, obstore's Rust client,
with the same options as the s3fs the URL gets: what the client library costs).

Columns: seconds (per read for cold/warm chunk, per update for 1-chunk update,
else per operation; the median of --repeats: default 3 locally, 1 on S3, 1 with
--quick; each after a full garbage collection, so that no variant pays for the
garbage the setup and checks before it left, and locally after a sync(), so that
no variant is throttled by the writeback of the pages others wrote), the best of
them, the median's ratios to the codec's, zarrs' and tensorstore's medians,
requests, MiB read and MiB written per operation (from the last repeat), "peak
MiB" (the most the process's resident memory grew during the operation, sampled
every 2 ms in one more, untimed repeat; it includes the array a read returns),
and on S3 with latency the time in round trips (seconds / latency). Local counts come from
wrappers: CountingStore around zarr's LocalStore, CountingInner around
ShardingStore's inner store (shardstore.instrument), and tensorstore's own
/tensorstore/kvstore/file/ metrics ("-" if unavailable). On S3 the proxy counts
every request and every body byte (bytes down = read, up = written) for every
tool alike. Each read is checked against the data, each write read back; a cell
that fails says so instead of a number.

    python benchmarks/floor.py                  # a few minutes
    python benchmarks/floor.py --quick          # under ~2 minutes
    python benchmarks/floor.py --only s3 --latency-ms 0 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import itertools
import json
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import google_crc32c
import numcodecs
import numpy as np
import zarr
from zarr.core.codec_pipeline import BatchedCodecPipeline
from zarr.registry import register_pipeline
from zarr.storage import FsspecStore, LocalStore

from shardstore import ShardingStore
from shardstore.default_pipeline import ZARR_DEFAULT_PATH
from shardstore.inner import LocalInner
from shardstore.instrument import CountingInner, CountingStore
from shardstore.testing.s3 import ApartS3, apart_s3

tensorstore: Any
try:
    import tensorstore
except ImportError:  # a test extra only
    tensorstore = None
zarrs: Any
try:
    import zarrs
except ImportError:  # a test extra only
    zarrs = None
try:
    from shardstore.inner import ObstoreInner
except ImportError:  # the obstore extra
    ObstoreInner = None  # type: ignore[assignment, misc]
ZARRS_PATH = "zarrs.ZarrsCodecPipeline"
FUSED_PATH = "zarr.core.codec_pipeline.FusedCodecPipeline"  # zarr 3.4+


class IterateOnlyPipeline(BatchedCodecPipeline):
    """zarr's own per-chunk cost: a pipeline that touches each chunk zarr hands it once
    (indexer, StorePath, chunk spec all made) and reads, decodes, encodes and writes
    nothing. What an unmodified zarr array pays before any pipeline works."""

    async def read(self, batch_info: Any, out: Any, drop_axes: tuple[int, ...] = ()) -> Any:
        for _ in batch_info:
            pass
        return ()

    async def write(self, batch_info: Any, value: Any, drop_axes: tuple[int, ...] = ()) -> None:
        for _ in batch_info:
            pass


register_pipeline(IterateOnlyPipeline)
ITERATE_PATH = f"{IterateOnlyPipeline.__module__}.{IterateOnlyPipeline.__qualname__}"

MiB = 2**20
Counts = tuple[int, int, int]  # requests, bytes read, bytes written
Sel = tuple[slice, slice]


@dataclass(frozen=True)
class Dataset:
    """An array to measure: 2-d for every workload, any rank for whole reads and writes."""

    name: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    cps: tuple[int, ...]
    compressors: Any
    workloads: tuple[str, ...]
    dtype: str = "f4"

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def sample(self, seed: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Random values of the dataset's type (of its shape, unless ``shape`` is given)."""
        rng = np.random.default_rng(seed)
        shape = self.shape if shape is None else shape
        if np.dtype(self.dtype).kind == "f":
            return rng.standard_normal(shape).astype(self.dtype)
        return rng.integers(0, 256, shape).astype(self.dtype)

    @property
    def shard(self) -> tuple[int, ...]:
        return tuple(c * p for c, p in zip(self.chunks, self.cps, strict=True))

    def describe(self) -> str:
        def dims(t: tuple[int, ...]) -> str:
            return "x".join(map(str, t))

        chunk = math.prod(self.chunks) * self.itemsize
        size = f"{chunk // 1024} KiB" if chunk >= 1024 else f"{chunk} bytes"
        return (
            f"{self.name}: {dims(self.shape)} {np.dtype(self.dtype).name} "
            f"({math.prod(self.shape) * self.itemsize / MiB:g} MiB), chunks {dims(self.chunks)} ({size}, "
            f"{math.prod(self.shape) // math.prod(self.chunks)} chunks), {dims(self.cps)} chunks/shard "
            f"({chunk * math.prod(self.cps) / MiB:g} MiB), {'zstd' if self.compressors else 'none'}"
        )

    def chunk(self, i: int, j: int) -> Sel:
        a, b = self.chunks
        return slice(i * a, (i + 1) * a), slice(j * b, (j + 1) * b)

    def picks(self, n: int, seed: int) -> list[Sel]:
        rng = np.random.default_rng(seed)
        grid = (self.shape[0] // self.chunks[0], self.shape[1] // self.chunks[1])
        return [self.chunk(int(rng.integers(grid[0])), int(rng.integers(grid[1]))) for _ in range(n)]


READS = ("cold chunk", "warm chunk", "slab", "whole read")
WRITES = ("whole write", "overwrite", "whole write batch", "1-chunk update")  # run in this order
NEW_ARRAY_WRITES = ("whole write", "whole write batch")


@dataclass(frozen=True)
class Variant:
    name: str
    layout: str  # the copy it reads and the layout it writes: unsharded, codec, shardstore
    tool: str = "zarr"
    options: dict[str, Any] = field(default_factory=dict)
    pipeline: str | None = None  # zarr's codec_pipeline.path around it (None: as configured)
    writes: bool = True

    def context(self) -> contextlib.AbstractContextManager[Any]:
        if self.pipeline is not None:
            return zarr.config.set({"codec_pipeline.path": self.pipeline})  # type: ignore[no-any-return]
        return contextlib.nullcontext()


def variants() -> list[Variant]:
    out = [Variant("zarr per-chunk", "unsharded", tool="iterate", pipeline=ITERATE_PATH)]
    out += [Variant("unsharded", "unsharded"), Variant("codec", "codec")]
    if hasattr(zarr.core.codec_pipeline, "FusedCodecPipeline"):
        out.append(Variant("zarr fused", "codec", pipeline=FUSED_PATH))
    if zarrs is not None:
        out.append(Variant("zarrs", "codec", tool="zarrs", pipeline=ZARRS_PATH))
    if tensorstore is not None:
        out.append(Variant("tensorstore", "codec", tool="tensorstore"))
    out += [
        Variant("shardstore", "shardstore"),  # as users get it: shardstore's pipeline
        Variant("ss revalidate", "shardstore", options={"index_cache": "revalidate"}, writes=False),
        Variant("ss zarr pipe", "shardstore", pipeline=ZARR_DEFAULT_PATH),  # opted out
        Variant("python floor", "shardstore", tool="floor"),
    ]
    if ObstoreInner is not None:  # S3 only: the same store over a Rust client instead of s3fs
        out.append(Variant("ss obstore", "shardstore", tool="obstore"))
    return out


class FloorArray:
    """The plain-Python floor over a ShardingStore copy's files (indexed format, index at
    the end): whole shard files in, numcodecs in a loop, numpy out; one thread."""

    MISSING = 2**64 - 1

    def __init__(self, root: str, ds: Dataset) -> None:
        self.root, self.ds = os.path.join(root, "a"), ds
        with open(os.path.join(self.root, "zarr.json")) as f:
            config = json.load(f)["storage_transformers"][0]["configuration"]
        self.checksum = len(config["index_codecs"]) > 1  # [bytes, crc32c]
        self.codec = numcodecs.Zstd(level=0) if ds.compressors else None
        self.n = math.prod(ds.cps)

    def _shards(self, rows: slice) -> Iterator[tuple[int, ...]]:
        """Shard grid positions whose rows meet ``rows`` (a slice of axis 0, step 1)."""
        first, stop, _ = rows.indices(self.ds.shape[0])
        grid = [s // h for s, h in zip(self.ds.shape, self.ds.shard, strict=True)]
        lead = range(first // self.ds.shard[0], -(-stop // self.ds.shard[0]))
        return itertools.product(lead, *(range(g) for g in grid[1:]))

    def _chunks(self, shard: tuple[int, ...]) -> Iterator[tuple[int, tuple[slice, ...]]]:
        """Each chunk of a shard: its place in the index and its region of the array."""
        for k, inner in enumerate(np.ndindex(*self.ds.cps)):
            origin = [
                (s * p + i) * c for s, p, i, c in zip(shard, self.ds.cps, inner, self.ds.chunks, strict=True)
            ]
            yield k, tuple(slice(o, o + c) for o, c in zip(origin, self.ds.chunks, strict=True))

    def _path(self, shard: tuple[int, ...]) -> str:
        return os.path.join(self.root, "c", *map(str, shard))

    def __getitem__(self, sel: Any) -> np.ndarray:
        rows = sel[0] if isinstance(sel, tuple) else sel
        first, stop, _ = rows.indices(self.ds.shape[0])
        out = np.zeros((stop - first, *self.ds.shape[1:]), dtype=self.ds.dtype)
        for shard in self._shards(rows):
            with open(self._path(shard), "rb") as f:
                raw = f.read()
            end = len(raw) - (4 if self.checksum else 0)
            index = np.frombuffer(raw, "<u8", count=2 * self.n, offset=end - 16 * self.n).reshape(-1, 2)
            for k, region in self._chunks(shard):
                lo, hi = max(region[0].start, first), min(region[0].stop, stop)
                offset, nbytes = (int(x) for x in index[k])
                if lo >= hi or offset == self.MISSING:
                    continue
                data = raw[offset : offset + nbytes]
                chunk = np.frombuffer(self.codec.decode(data) if self.codec else data, self.ds.dtype)
                chunk = chunk.reshape(self.ds.chunks)[lo - region[0].start : hi - region[0].start]
                out[(slice(lo - first, hi - first), *region[1:])] = chunk
        return out

    def __setitem__(self, sel: Any, value: np.ndarray) -> None:
        assert sel == slice(None), "the floor writes whole arrays"
        for shard in self._shards(slice(None)):
            parts, index, offset = [], np.full((self.n, 2), self.MISSING, dtype="<u8"), 0
            for k, region in self._chunks(shard):
                chunk = np.ascontiguousarray(value[region])
                encoded = bytes(self.codec.encode(chunk)) if self.codec else chunk.tobytes()
                index[k] = offset, len(encoded)
                parts.append(encoded)
                offset += len(encoded)
            blob = b"".join(parts) + index.tobytes()
            if self.checksum:
                blob += google_crc32c.value(index.tobytes()).to_bytes(4, "little")
            path = self._path(shard)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".floor-tmp", "wb") as f:
                f.write(blob)
            os.replace(path + ".floor-tmp", path)


FLOOR_WORKLOADS = ("slab", "whole read", "whole write", "overwrite")
ITERATE_WORKLOADS = ("slab", "whole read", "whole write")


class PeakMemory:
    """How much the resident memory of this process grew at most while inside the block
    (sampled from /proc every 2 ms; None where /proc is missing). Memory freed before
    is handed back to the system first (glibc's malloc_trim), so that growth is not
    hidden by reused free memory."""

    def __init__(self) -> None:
        self.grew: float | None = None

    @staticmethod
    def _rss() -> int | None:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def __enter__(self) -> PeakMemory:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        self._start, self._peak = self._rss(), self._rss()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.002):
            now = self._rss()
            if now is not None and self._peak is not None:
                self._peak = max(self._peak, now)

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        now = self._rss()
        if self._start is not None and self._peak is not None and now is not None:
            self.grew = max(self._peak, now) - self._start


def _ts_file_counts() -> Counts:
    found = tensorstore.experimental_collect_matching_metrics("/tensorstore/kvstore/file/")
    m = {x["name"].rsplit("/", 1)[1]: x["values"][0].get("value", 0) for x in found if x["values"]}
    requests = sum(int(m.get(k, 0)) for k in ("read", "write", "delete_range", "list"))
    return requests, int(m.get("bytes_read", 0)), int(m.get("bytes_written", 0))


class LocalBackend:
    """Directories under ``root``; one counting wrapper per copy, shared by every open."""

    title = "local directory"
    latency_s = 0.0

    def __init__(self, root: str) -> None:
        self.root = root
        self.counted: dict[str, CountingStore | CountingInner] = {}

    def _counted(self, layout: str, path: str) -> Any:
        if path not in self.counted:
            where = os.path.join(self.root, path)
            self.counted[path] = (
                CountingInner(LocalInner(where))
                if layout == "shardstore"
                else CountingStore(LocalStore(where))
            )
        return self.counted[path]

    def store(
        self, layout: str, path: str, cps: tuple[int, ...], options: dict[str, Any], counted: bool = True
    ) -> Any:
        if not counted:  # zarrs runs its Rust I/O only on zarr's own LocalStore
            return LocalStore(os.path.join(self.root, path))
        inner = self._counted(layout, path)
        return ShardingStore(inner, cps, **options) if layout == "shardstore" else inner

    def kvstore(self, path: str) -> dict[str, Any]:
        return {"driver": "file", "path": os.path.join(self.root, path, "a") + "/"}

    def meter(self, v: Variant, path: str) -> Callable[[], Counts] | None:
        if v.tool == "tensorstore":
            return _ts_file_counts if hasattr(tensorstore, "experimental_collect_matching_metrics") else None
        if v.tool in ("zarrs", "floor", "iterate") or v.pipeline == FUSED_PATH:
            return None  # (zarr's fused pipeline reads and writes by get_sync/set_sync: not counted)

        def counts() -> Counts:
            c = self._counted(v.layout, path).counts
            return c.reads + c.writes + c.deletes + c.lists + c.sizes, c.bytes_read, c.bytes_written

        return counts

    def untimed(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def settle(self) -> None:
        """Write back every dirty page before a timed operation: past a few hundred MiB
        of them the kernel throttles whoever writes next to the disk's pace, so the
        variants run after others' writes would pay for those."""
        os.sync()

    def discard(self, path: str) -> None:
        """Delete an array no workload reads any more, with its page cache: here a
        write's copies into the page cache slow down as it grows (a plain loop of
        64 MiB file writes went from 26 to 150 ms over 16 repeats), so the variants
        run after others' writes would pay for those."""
        shutil.rmtree(os.path.join(self.root, path), ignore_errors=True)
        self.counted.pop(path, None)


class S3Backend:
    """Keys in the moto bucket; the proxy counts every tool's requests and bytes."""

    def __init__(self, s3: ApartS3, latency_s: float) -> None:
        self.s3, self.latency_s = s3, latency_s
        self.title = f"S3 API (moto, +{latency_s * 1000:g} ms/request)"

    def store(
        self, layout: str, path: str, cps: tuple[int, ...], options: dict[str, Any], counted: bool = True
    ) -> Any:
        url, so = self.s3.url(path), self.s3.storage_options
        if layout == "shardstore":
            return ShardingStore(url, cps, storage_options=so, **options)
        return FsspecStore.from_url(url, storage_options=so)

    def obstore_store(self, path: str, cps: tuple[int, ...], options: dict[str, Any]) -> ShardingStore:
        """A ShardingStore over obstore's client, with the options s3fs gets."""
        return ShardingStore(
            ObstoreInner.from_url(self.s3.url(path), self.s3.storage_options), cps, **options
        )

    def kvstore(self, path: str) -> dict[str, Any]:
        return {
            "driver": "s3",
            "bucket": self.s3.bucket,
            "path": f"{path}/a/",
            "endpoint": self.s3.endpoint_url,
            "aws_region": "us-east-1",
            "aws_credentials": {"type": "environment"},  # moto's dummy keys, set in main()
        }

    def meter(self, v: Variant, path: str) -> Callable[[], Counts]:
        return lambda: (self.s3.requests, self.s3.bytes_down, self.s3.bytes_up)

    def settle(self) -> None:
        """(moto keeps objects in memory: nothing waits to be written back.)"""

    def discard(self, path: str) -> None:
        """(Kept: moto's memory is no page cache.)"""

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """Setup and checks without the added latency."""
        self.s3.latency_s = 0.0
        try:
            yield
        finally:
            self.s3.latency_s = self.latency_s


Backend = LocalBackend | S3Backend


class TsArray:
    """A tensorstore with numpy-style reads and writes, as zarr arrays have."""

    def __init__(self, t: Any) -> None:
        self.t = t

    def __getitem__(self, sel: Sel) -> np.ndarray:
        return np.asarray(self.t[sel].read().result())

    def __setitem__(self, sel: Any, value: np.ndarray) -> None:
        self.t[sel].write(value).result()


def _store(b: Backend, v: Variant, ds: Dataset, path: str) -> Any:
    """The store ``v`` opens at ``path`` (obstore's runs only on S3: see :func:`applies`)."""
    if v.tool == "obstore":
        assert isinstance(b, S3Backend)
        return b.obstore_store(path, ds.cps, v.options)
    return b.store(v.layout, path, ds.cps, v.options, counted=v.tool != "zarrs")


def open_array(b: Backend, v: Variant, ds: Dataset, path: str, warm: bool = False) -> tuple[Any, Any]:
    """(array, store) of the array at ``path``, through a newly opened store."""
    if v.tool == "floor":
        assert isinstance(b, LocalBackend)
        return FloorArray(os.path.join(b.root, path), ds), None
    if v.tool == "tensorstore":
        spec: dict[str, Any] = {"driver": "zarr3", "kvstore": b.kvstore(path)}
        if warm:
            spec["context"] = {"cache_pool": {"total_bytes_limit": 2**28}}
        return TsArray(tensorstore.open(spec).result()), None
    store = _store(b, v, ds, path)
    return zarr.open_array(store, path="a"), store


def create_array(b: Backend, v: Variant, ds: Dataset, path: str) -> tuple[Any, Any]:
    """A new empty array at ``path`` in ``v``'s layout (tensorstore's made by zarr)."""
    store = _store(b, v, ds, path)
    arr = zarr.create_array(
        store,
        name="a",
        shape=ds.shape,
        chunks=ds.chunks,
        shards=ds.shard if v.layout == "codec" else None,
        dtype=ds.dtype,
        compressors=ds.compressors,
    )
    return open_array(b, v, ds, path) if v.tool in ("tensorstore", "floor") else (arr, store)


def reference(v: Variant) -> Variant:
    """The plain zarr reader of what ``v`` wrote, to check it independently."""
    return Variant(v.layout, v.layout)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    if not np.array_equal(got, want):
        raise AssertionError("wrong data")


@dataclass
class Cell:
    workload: str
    variant: str
    seconds: float | None = None  # the median of the repeats
    best: float | None = None
    counts: tuple[float, float, float] | None = None
    peak: float | None = None  # bytes the resident memory grew at most (last repeat)
    note: str = ""


@dataclass
class Job:
    """What a workload needs: the backend, the dataset, its data and copies."""

    b: Backend
    ds: Dataset
    data: np.ndarray
    copies: dict[str, str]
    picks: list[Sel]
    updates: list[Sel]
    written: dict[str, str] = field(default_factory=dict)  # variant -> path of its "whole write"


@dataclass
class Timed:
    action: Callable[[], None]
    ops: int
    path: str  # the array it touches (whose counters to read)
    check: Callable[[], None] | None = None  # run after the timing


def setup(job: Job, v: Variant, workload: str) -> Timed:
    """Untimed preparation of one repeat of ``workload``."""
    b, ds, data = job.b, job.ds, job.data
    copy = job.copies[v.layout]
    if workload == "cold chunk":

        def cold() -> None:
            for sel in job.picks:
                _same(open_array(b, v, ds, copy)[0][sel], data[sel])

        return Timed(cold, len(job.picks), copy)
    if workload == "warm chunk":
        arr = open_array(b, v, ds, copy, warm=True)[0]
        for sel in job.picks:
            arr[sel]

        def warm() -> None:
            for sel in job.picks:
                _same(arr[sel], data[sel])

        return Timed(warm, len(job.picks), copy)
    if workload in ("slab", "whole read"):
        arr = open_array(b, v, ds, copy)[0]
        rows = ds.chunk(ds.shape[0] // ds.chunks[0] // 2, 0)[0] if workload == "slab" else slice(None)
        if v.tool == "iterate":  # it reads nothing: there is nothing to check
            return Timed(lambda: arr[rows], 1, copy)
        return Timed(lambda: _same(arr[rows], data[rows]), 1, copy)

    def check(path: str, want: np.ndarray) -> Callable[[], None]:
        def read_back() -> None:
            with b.untimed():
                _same(open_array(b, reference(v), ds, path)[0][:], want)

        return read_back

    if workload == "overwrite":
        if v.name not in job.written:
            raise RuntimeError("no array to overwrite: its whole write failed")
        path = job.written[v.name]
        arr = open_array(b, v, ds, path)[0]

        def overwrite() -> None:
            arr[:] = data

        return Timed(overwrite, 1, path, check(path, data))
    if workload == "1-chunk update":
        if v.name not in job.written:
            raise RuntimeError("no array to update: its whole write failed")
        path = job.written[v.name]
        arr = open_array(b, v, ds, path)[0]
        values = ds.sample(3, (len(job.updates), *ds.chunks))
        want = data.copy()
        for sel, value in zip(job.updates, values, strict=True):
            want[sel] = value

        def update() -> None:
            for sel, value in zip(job.updates, values, strict=True):
                arr[sel] = value

        return Timed(update, len(job.updates), path, check(path, want))
    path = f"{ds.name}/{v.name.replace(' ', '-')}-{uuid.uuid4().hex[:8]}"
    with b.untimed():
        arr, store = create_array(b, v, ds, path)
    if workload == "whole write":
        job.written[v.name] = path

    def write() -> None:
        with store.batch() if workload == "whole write batch" else contextlib.nullcontext():
            arr[:] = data

    return Timed(write, 1, path, None if v.tool == "iterate" else check(path, data))


def applies(b: Backend, v: Variant, workload: str) -> bool:
    if v.tool == "iterate":
        return workload in ITERATE_WORKLOADS
    if v.tool == "floor":
        return isinstance(b, LocalBackend) and workload in FLOOR_WORKLOADS
    if v.tool == "obstore" and not isinstance(b, S3Backend):
        return False
    if workload == "whole write batch":
        return v.layout == "shardstore" and v.writes
    return v.writes or workload in READS


def measure(job: Job, v: Variant, workload: str, repeats: int) -> Cell:
    """Best time per operation of ``repeats``; counts per operation from the last; the
    peak memory from one more, untimed: its sampling thread takes the GIL every 2 ms
    and the heap is trimmed first, which slowed shardstore's zstd writes by 10-15 %."""
    cell = Cell(workload, v.name)
    if not applies(job.b, v, workload):
        return cell
    try:
        with v.context():  # around open and operation alike
            times: list[float] = []
            made: list[str] = []  # the new arrays its repeats wrote
            for _ in range(repeats):
                timed = setup(job, v, workload)
                job.b.settle()
                # (a full collection took 73-106 ms here, botocore's service models among
                # what it walks: one set off inside a Python client's S3 write doubled it)
                gc.collect()
                meter = job.b.meter(v, timed.path)
                before = meter() if meter else None
                t0 = time.perf_counter()
                timed.action()
                times.append((time.perf_counter() - t0) / timed.ops)
                if meter is not None and before is not None:
                    (r1, b1, w1), (r0, b0, w0) = meter(), before
                    cell.counts = ((r1 - r0) / timed.ops, (b1 - b0) / timed.ops, (w1 - w0) / timed.ops)
                if timed.check:
                    timed.check()
                _discard_spent(job, v, workload, made, timed.path)
            cell.seconds, cell.best = statistics.median(times), min(times)
            timed = setup(job, v, workload)
            with PeakMemory() as memory:
                timed.action()
            cell.peak = memory.grew
            _discard_spent(job, v, workload, made, timed.path)
    except Exception as e:  # a failing cell is reported, the run goes on
        cell.seconds, cell.counts = None, None
        cell.note = f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:70]}"
        traceback.print_exc(limit=-3)
    return cell


def _discard_spent(job: Job, v: Variant, workload: str, made: list[str], path: str) -> None:
    """After a repeat of a write to a new array at ``path``: delete the arrays ``made``
    so far that no workload reads (all but the whole write the overwrite and the
    updates use; see :meth:`LocalBackend.discard`)."""
    if workload not in NEW_ARRAY_WRITES:
        return
    made.append(path)
    kept = job.written.get(v.name)
    for spent in [p for p in made if p != kept]:
        job.b.discard(spent)
    made[:] = [p for p in made if p == kept]


def write_copies(b: Backend, ds: Dataset, data: np.ndarray) -> dict[str, str]:
    """The copies the reads read: unsharded, codec, shardstore (written in a batch)."""
    copies = {}
    with b.untimed():
        for layout in ("unsharded", "codec", "shardstore"):
            path = copies[layout] = f"{ds.name}/{layout}"
            arr, store = create_array(b, Variant(layout, layout), ds, path)
            with store.batch() if layout == "shardstore" else contextlib.nullcontext():
                arr[:] = data
    return copies


def run(b: Backend, ds: Dataset, n_reads: int, n_updates: int, repeats: int) -> list[Cell]:
    data = ds.sample(0)
    job = Job(b, ds, data, write_copies(b, ds, data), ds.picks(n_reads, 1), ds.picks(n_updates, 2))
    return [measure(job, v, w, repeats) for w in ds.workloads for v in variants()]


def report(b: Backend, ds: Dataset, cells: list[Cell], n_reads: int, n_updates: int, repeats: int) -> None:
    latency = b.latency_s if isinstance(b, S3Backend) else 0.0
    print(f"\n## {b.title} · {ds.describe()}")
    notes = [f"seconds: median of {repeats}", f"cold/warm chunk: per read ({n_reads} reads)"]
    if "1-chunk update" in ds.workloads:
        notes += [
            f"1-chunk update: per update ({n_updates})",
            "whole write batch: vs the codec's whole write",
        ]
    print("   " + "; ".join(notes))
    head = (
        f"{'workload':<18} {'variant':<14} {'seconds':>9} {'best':>9}"
        f" {'vs codec':>8} {'vs zarrs':>8} {'vs ts':>8} {'requests/op':>11}"
    )
    head += f" {'MiB read/op':>11} {'MiB written/op':>14} {'peak MiB':>8}"
    head += f" {'round trips':>11}" if latency else ""
    print(head)
    bases = []
    for variant in ("codec", "zarrs", "tensorstore"):  # the ratio columns
        base = {c.workload: c.seconds for c in cells if c.variant == variant}
        base["whole write batch"] = base.get("whole write")
        bases.append(base)
    previous = None
    for c in cells:
        if previous and c.workload != previous:
            print()
        previous = c.workload
        label = f"{c.workload:<18} {c.variant:<14}"
        if c.seconds is None:
            print(f"{label} {c.note or '-':>9}")
            continue
        ratio = " ".join(
            f"{c.seconds / base:8.2f}" if base else f"{'-':>8}"
            for base in (times.get(c.workload) for times in bases)
        )
        if c.counts is None:
            counts = f"{'-':>11} {'-':>11} {'-':>14}"
        else:
            requests, read, written = c.counts
            counts = f"{requests:11.2f} {read / MiB:11.4f} {written / MiB:14.4f}"
        peak = f" {c.peak / MiB:8.1f}" if c.peak is not None else f" {'-':>8}"
        trips = f" {c.seconds / latency:11.1f}" if latency else ""
        best = f"{c.best:9.5f}" if c.best is not None else f"{'-':>9}"
        print(f"{label} {c.seconds:9.5f} {best} {ratio} {counts}{peak}{trips}")


DATASETS = ("main", "big", "raw", "cube", "tiny")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller arrays and fewer operations")
    parser.add_argument("--only", choices=("local", "s3"), help="run one backend only")
    parser.add_argument(
        "--latency-ms", type=float, default=20.0, help="added to every S3 request (0 allowed)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="median of (default: 3 local, 1 on S3; 1 with --quick)"
    )
    parser.add_argument("--size", type=int, default=None, help="side of the main array (default 2048)")
    parser.add_argument(
        "--datasets",
        default=",".join(DATASETS),
        help=f"which datasets to run, comma-separated (default: all of {','.join(DATASETS)})",
    )
    args = parser.parse_args()
    chosen = set(args.datasets.split(","))
    if not chosen <= set(DATASETS):
        parser.error(f"--datasets: unknown {sorted(chosen - set(DATASETS))}; choose from {DATASETS}")
    if args.size is not None and (args.size <= 0 or args.size % 512):
        parser.error("--size must be a positive multiple of 512 (a shard of the main array)")
    repeats = args.repeats or (1 if args.quick else 3)
    s3_repeats = args.repeats or 1  # S3 times are mostly the added latency, which does not vary
    side = args.size or (1024 if args.quick else 2048)
    main_ds = Dataset("main", (side, side), (64, 64), (8, 8), "auto", READS + WRITES)
    big_shape = (1024, 4096) if args.quick else (2048, 4096)
    big_ds = Dataset("big", big_shape, (256, 512), (4, 4), None, ("cold chunk", "warm chunk"))
    raw_ds = Dataset("raw", (side, side), (64, 64), (8, 8), None, ("whole read", "whole write", "overwrite"))
    cube = (side // 8,) * 3  # 1 MiB chunks, 8 MiB shards: 8 MiB with --quick, 64 MiB else
    cube_ds = Dataset("cube", cube, (64, 64, 64), (2, 2, 2), "auto", ("whole read", "whole write"))
    # (dataset, reads local, updates local, reads S3, updates S3)
    plan = [(main_ds, 50, 20, 12, 8), (big_ds, 20, 0, 8, 0), (raw_ds, 0, 0, 0, 0), (cube_ds, 0, 0, 0, 0)]
    if not args.quick:
        plan = [
            (main_ds, 200, 50, 30, 16),
            (big_ds, 50, 0, 16, 0),
            (raw_ds, 0, 0, 0, 0),
            (cube_ds, 0, 0, 0, 0),
        ]
    # 64-byte chunks (65,536 of them; 16,384 with --quick), where per-chunk machinery is
    # all there is: local files only (on S3, one request per unsharded chunk is minutes)
    tiny = (1024, 1024) if args.quick else (2048, 2048)
    tiny_ds = Dataset("tiny", tiny, (8, 8), (8, 8), None, ("whole read", "whole write"), dtype="u1")
    print(
        f"# floor benchmark: zarr {zarr.__version__} (async.concurrency "
        f"{zarr.config.get('async.concurrency')}), tensorstore {'yes' if tensorstore else 'not installed'}"
    )
    t0 = time.perf_counter()
    if args.only != "s3":
        with tempfile.TemporaryDirectory() as tmp:
            local = LocalBackend(tmp)
            for ds, n, m, _, _ in [*plan, (tiny_ds, 0, 0, 0, 0)]:
                if ds.name not in chosen:
                    continue
                report(local, ds, run(local, ds, n, m, repeats), n, m, repeats)
    if args.only != "local":
        os.environ["AWS_ACCESS_KEY_ID"] = os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"  # moto's
        with apart_s3() as s3:
            remote = S3Backend(s3, args.latency_ms / 1000)
            s3.latency_s = remote.latency_s
            for ds, _, _, n, m in plan:
                if ds.name not in chosen:
                    continue
                report(remote, ds, run(remote, ds, n, m, s3_repeats), n, m, s3_repeats)
    print(f"\n# total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
