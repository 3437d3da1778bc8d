"""Copying a whole hierarchy into another store: re-sharded, un-sharded, or into
the other layout — on threads or on a dask cluster, resumable.

A copy of logical keys between two ShardingStores: the source shows zarr's
view (plain chunk keys, whatever its sharding), the destination applies its
own ``chunks_per_shard``, layout and index options. Chunk bytes are copied as
zarr wrote them, never decoded.

Order matters. Every metadata document is first written through a scratch
in-memory store with the destination's options: that checks every array's
config before anything is written, and gives the documents exactly as the
destination gets them. Then the array documents are written, then the chunks,
then group documents, attributes and consolidated metadata (written last, so
that a hierarchy that opens is a complete one).

The chunks are copied in *units*, one writer each: the source chunks that make
one destination shard (for an unsharded destination array, a block of its
chunks). A unit reads its chunks in one batch and writes them in one
``store.batch()``, so each shard is written once, without being read. Units run
on threads, or as tasks on a ``dask.distributed`` cluster where each task opens
its own stores (a ``ShardingStore`` pickles as its URL and options).

Resuming: a destination that holds an interrupted conversion of the same source
with the same options (every metadata document in it is the one this
conversion writes) is resumed. A unit is skipped when its destination shard's
index lists exactly the chunks the source has for it, with the same sizes (an
existing shard is not enough: a partial or damaged one is rewritten); plain
chunks, each written atomically, are skipped when they exist.
"""

from __future__ import annotations

import concurrent.futures
import pickle
import threading
import time
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TextIO

from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.sync import sync

import shardstore.progress as bars
from shardstore.addressing import ShardAddress, locate
from shardstore.cores import available_cores
from shardstore.errors import ShardFormatError, ShardingConfigError, ShardStoreError
from shardstore.formats.base import ChunkTable, table_entry
from shardstore.metadata import (
    ARRAY_DOC_NAMES,
    ROOT_DOCUMENTS,
    V3_NAME,
    ArrayInfo,
    is_metadata_key,
    load_document,
)
from shardstore.sync_bridge import in_a_thread
from shardstore.tasks import gather

if TYPE_CHECKING:
    from distributed import Client

    from shardstore.store import ShardingStore

__all__ = [
    "ConvertReport",
    "Progress",
    "Unit",
    "convert",
    "convert_async",
    "copy_unit",
    "default_workers",
    "terminal_progress",
]

_INDEX_BATCH = 512
"""Shard indices read per inner batch while planning."""
_SIZE_BATCH = 1024
"""Object sizes asked for at once while counting objects and bytes."""
_BLOCK_CHUNKS = 256
"""Chunks per unit of an unsharded destination array."""

Progress = Callable[[int, int], None]
"""Called after each unit with (bytes copied so far, bytes to copy in all)."""


def default_workers() -> int:
    """Threads copying units at once by default: one per core this process may use, at
    most 8."""
    return min(8, available_cores())


@dataclass(frozen=True)
class ConvertReport:
    """What one conversion did."""

    arrays: int
    chunks: int
    """Chunks the source holds (all of them in the destination now)."""
    bytes: int
    """Chunk bytes copied by this run."""
    chunks_copied: int = 0
    """Chunks copied by this run (fewer than ``chunks`` when resuming)."""
    shards_written: int = 0
    shards_skipped: int = 0
    """Destination shards found complete (by their index) and not written again."""
    blocks_written: int = 0
    """Blocks of plain chunks (unsharded destination arrays) copied."""
    blocks_skipped: int = 0
    """Blocks whose chunks were all in the destination already."""
    objects_before: int = 0
    """Objects in the source store (shards, chunks and metadata documents)."""
    objects_after: int = 0
    """Objects in the destination store when done."""
    bytes_before: int = 0
    """Bytes of those source objects."""
    bytes_after: int = 0
    """Bytes of those destination objects."""
    seconds: float = 0.0
    """Wall-clock time of the whole conversion."""

    @property
    def bytes_per_second(self) -> float:
        """Chunk bytes copied per second of the whole conversion."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> list[str]:
        """The lines ``shardstore convert`` prints."""
        units = f"{self.shards_written:,} shard(s) written, {self.shards_skipped:,} already complete"
        if self.blocks_written or self.blocks_skipped:
            units += (
                f"; {self.blocks_written:,} block(s) of plain chunks written, "
                f"{self.blocks_skipped:,} already there"
            )
        return [
            f"{self.arrays} array(s), {self.chunks:,} chunks: {units}",
            f"objects {self.objects_before:,} -> {self.objects_after:,}, "
            f"bytes {self.bytes_before:,} -> {self.bytes_after:,}",
            f"{self.chunks_copied:,} chunks, {self.bytes:,} bytes copied in {self.seconds:.2f} s "
            f"({self.bytes_per_second / 2**20:.1f} MiB/s)",
        ]


@dataclass(frozen=True)
class Unit:
    """One writer's work: the source chunks that make one destination shard (or a
    block of plain chunks), copied together."""

    name: str
    """The destination shard key, or a block's first chunk key."""
    sharded: bool
    keys: tuple[str, ...]
    """Source chunk keys (the same keys in the destination)."""
    sizes: tuple[int, ...]
    """Their stored bytes in the source."""
    rewrite: bool = False
    """The destination shard exists but is incomplete or damaged: removed first."""

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)


@dataclass(frozen=True)
class _Chunk:
    key: str
    array: str | None
    """The source array's path (None: a key of no array, copied as it is)."""
    nbytes: int


@dataclass(frozen=True)
class _Objects:
    """The objects of a store as its inner store holds them."""

    shards: list[ShardAddress]
    plain: list[str]
    sizes: dict[str, int]

    @property
    def count(self) -> int:
        return len(self.shards) + len(self.plain)

    @property
    def nbytes(self) -> int:
        return sum(self.sizes.values())


def _is_array_document(name: str, raw: bytes) -> bool:
    if name not in ARRAY_DOC_NAMES:
        return False
    doc = load_document(raw)
    return doc is not None and (name != V3_NAME or doc.get("node_type") == "array")


def _where(store: ShardingStore) -> str:
    return repr(store.inner) if isinstance(store.inner, str) else repr(store)


async def _objects(store: ShardingStore) -> _Objects:
    shards, plain = await store.internals.shards_under("")
    keys = [s.key for s in shards] + plain
    sizes: dict[str, int] = {}
    for start in range(0, len(keys), _SIZE_BATCH):
        part = keys[start : start + _SIZE_BATCH]
        found = await gather(*(store.internals.raw.getsize(k) for k in part))
        sizes.update((k, n) for k, n in zip(part, found, strict=True) if n is not None)
    return _Objects(shards, plain, sizes)


async def _indices(store: ShardingStore, shards: list[ShardAddress]) -> list[ChunkTable | None]:
    """The shards' indices, read in batches (None: absent)."""
    tables: list[ChunkTable | None] = []
    for start in range(0, len(shards), _INDEX_BATCH):
        tables.extend(await store.internals.read_indices(shards[start : start + _INDEX_BATCH]))
    return tables


def _present(shard: ShardAddress, table: ChunkTable) -> dict[str, int]:
    """Chunk key -> stored bytes of the chunks a shard's index lists."""
    found = {}
    for place, key in shard.present_keys(table):
        entry = table_entry(table, place)
        assert entry is not None  # listed as present
        found[key] = entry[1]
    return found


async def _source_chunks(src: ShardingStore, objects: _Objects) -> list[_Chunk]:
    chunks = []
    for key in objects.plain:
        if not is_metadata_key(key):
            info = await src.internals.array_of_key(key)
            chunks.append(_Chunk(key, None if info is None else info.path, objects.sizes.get(key, 0)))
    tables = await _indices(src, objects.shards)
    for shard, table in zip(objects.shards, tables, strict=True):
        if table is not None:
            chunks.extend(_Chunk(k, shard.info.path, n) for k, n in _present(shard, table).items())
    return chunks


async def _destination_documents(
    src: ShardingStore, dst: ShardingStore, keys: list[str]
) -> tuple[dict[str, bytes], list[str], ShardingStore]:
    """Every metadata document as the destination gets it (written through a scratch
    in-memory store with the destination's options: every config is checked, and
    sharding recorded, before anything is written), the array documents' keys, and
    the scratch store (which knows the destination's arrays)."""
    values = await src.get_partial_values(default_buffer_prototype(), [(k, None) for k in keys])
    docs: dict[str, Buffer] = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
    arrays = [k for k, v in docs.items() if _is_array_document(k.rpartition("/")[2], v.to_bytes())]
    state = dst.__getstate__()
    state.update(inner={}, storage_options=None, read_only=False)
    scratch = type(dst)(**state)
    for key in arrays:  # every config checked before anything is written
        scratch.internals.check_new_array(key, docs[key].to_bytes())
    for key in arrays:
        await scratch.set(key, docs[key])
    for key in docs:
        if key not in arrays:
            await scratch.set(key, docs[key])
    written = {}
    for key in docs:
        raw = await scratch.internals.raw.get(key)
        assert raw is not None
        written[key] = raw
    return written, arrays, scratch


async def _plan(scratch: ShardingStore, chunks: list[_Chunk]) -> tuple[list[Unit], dict[str, ShardAddress]]:
    """The units, in key order, and the destination shard of each sharded unit."""
    infos: dict[str, ArrayInfo | None] = {}
    shards: dict[str, ShardAddress] = {}
    by_shard: dict[str, list[_Chunk]] = {}
    plain: dict[str, list[_Chunk]] = {}
    for chunk in chunks:
        path = chunk.array
        if path is not None and path not in infos:
            infos[path] = await scratch.internals.array_at(path)
        info = None if path is None else infos[path]
        sharded = info is not None and info.shard_format is not None and not info.codec_sharded
        coords = info.coords(chunk.key) if sharded and info is not None else None
        if info is None or coords is None:
            plain.setdefault(path or "", []).append(chunk)
            continue
        if not info.in_grid(coords):
            raise ShardStoreError(
                f"source chunk {chunk.key!r} lies outside the chunk grid of array {info.path or '/'!r} "
                "(no reader sees it); delete it from the source to convert"
            )
        shard = locate(info, chunk.key, coords).shard
        shards[shard.key] = shard
        by_shard.setdefault(shard.key, []).append(chunk)
    units = []
    for key in sorted(by_shard):
        members = sorted(by_shard[key], key=lambda c: c.key)
        units.append(Unit(key, True, tuple(c.key for c in members), tuple(c.nbytes for c in members)))
    for path in sorted(plain):
        members = sorted(plain[path], key=lambda c: c.key)
        for start in range(0, len(members), _BLOCK_CHUNKS):
            block = members[start : start + _BLOCK_CHUNKS]
            units.append(
                Unit(block[0].key, False, tuple(c.key for c in block), tuple(c.nbytes for c in block))
            )
    return units, shards


async def _check_resumable(
    dst: ShardingStore, found: _Objects, written: dict[str, bytes], arrays: list[str]
) -> None:
    """Refuse a destination that is not an interrupted conversion of this source with
    these options: one of its documents is not the one this conversion writes, or it
    holds chunks without every array document (those are written first)."""
    present = [k for k in found.plain if is_metadata_key(k)]
    raws = await gather(*(dst.internals.raw.get(k) for k in present))
    differing = [k for k, raw in zip(present, raws, strict=True) if written.get(k) != raw]
    chunks_there = found.shards or len(present) < len(found.plain)
    missing = [k for k in arrays if k not in present] if chunks_there else []
    if differing or missing:
        key = (differing or missing)[0]
        why = (
            "is not in the source"
            if key not in written
            else "differs from what this conversion writes (another source, or other options)"
            if key in differing
            else "is missing although chunks are there"
        )
        raise ShardingConfigError(
            f"destination {dst!r} is not empty and holds no interrupted conversion of this source with "
            f"these options ({key!r} {why}): convert writes into an empty store, or resumes its own "
            "conversion"
        )


async def _pending(
    dst: ShardingStore, units: list[Unit], shards: dict[str, ShardAddress], found: _Objects
) -> list[Unit]:
    """The units still to write, each marked ``rewrite`` where an incomplete or damaged shard
    is in the way; blocks of plain chunks reduced to the chunks missing."""
    sharded = [u for u in units if u.sharded]
    addresses = [shards[u.name] for u in sharded]
    tables: dict[str, ChunkTable | ShardFormatError | None] = {}
    existing = {s.key for s in found.shards}
    to_read = [a for a in addresses if a.key in existing]
    for start in range(0, len(to_read), _INDEX_BATCH):
        part = to_read[start : start + _INDEX_BATCH]
        try:
            tables.update(zip([a.key for a in part], await dst.internals.read_indices(part), strict=True))
        except ShardFormatError:  # a damaged shard among them: one at a time
            for shard in part:
                try:
                    tables[shard.key] = (await dst.internals.read_indices([shard]))[0]
                except ShardFormatError as exc:
                    tables[shard.key] = exc
    plain = set(found.plain)
    pending = []
    for unit in units:
        if unit.sharded:
            table = tables.get(unit.name)
            if table is None:
                pending.append(unit)
            elif isinstance(table, ShardFormatError) or _present(shards[unit.name], table) != dict(
                zip(unit.keys, unit.sizes, strict=True)
            ):
                pending.append(replace(unit, rewrite=True))
        else:
            missing = [(k, n) for k, n in zip(unit.keys, unit.sizes, strict=True) if k not in plain]
            if missing:
                pending.append(
                    replace(unit, keys=tuple(k for k, _ in missing), sizes=tuple(n for _, n in missing))
                )
    return pending


# -- copying units ------------------------------------------------------------------


async def _copy_unit_async(src: ShardingStore, dst: ShardingStore, unit: Unit) -> tuple[int, int]:
    values = await src.get_partial_values(default_buffer_prototype(), [(k, None) for k in unit.keys])
    if unit.rewrite:  # an incomplete or damaged shard: nothing of it is kept
        await dst.internals.raw.delete(unit.name)
    copied = [(k, v) for k, v in zip(unit.keys, values, strict=True) if v is not None]
    async with dst.batch():
        await gather(*(dst.set(k, v) for k, v in copied))
    return len(copied), sum(len(v) for _, v in copied)


def copy_unit(src: ShardingStore, dst: ShardingStore, unit: Unit) -> tuple[int, int]:
    """Copy one unit (its shard written once); (chunks, bytes) copied."""
    result: tuple[int, int] = sync(_copy_unit_async(src, dst, unit))
    return result


_WORKER_STORES: dict[tuple[str, int], tuple[ShardingStore, ShardingStore]] = {}
_WORKER_LOCK = threading.Lock()


def _copy_unit_task(unit: Unit, stores: bytes, run: str) -> tuple[int, int]:
    """A dask task: ``stores`` is the pickled (source, destination) pair, opened once
    per worker thread for the conversion ``run`` and kept for its next tasks (a
    later conversion opens them afresh: the source may have changed since)."""
    key = (run, threading.get_ident())
    with _WORKER_LOCK:
        pair = _WORKER_STORES.get(key)
    if pair is None:
        pair = pickle.loads(stores)
        with _WORKER_LOCK:
            while len(_WORKER_STORES) >= 64:
                del _WORKER_STORES[next(iter(_WORKER_STORES))]
            _WORKER_STORES[key] = pair
    return copy_unit(pair[0], pair[1], unit)


OnDone = Callable[[Unit, tuple[int, int]], None]


def _run_on_threads(
    src: ShardingStore, dst: ShardingStore, units: list[Unit], workers: int, on_done: OnDone
) -> None:
    """Each thread copies with its own store instances (a batch is per instance)."""
    local = threading.local()

    def run(unit: Unit) -> tuple[int, int]:
        pair = getattr(local, "stores", None)
        if pair is None:
            pair = local.stores = (src.with_read_only(src.read_only), dst.with_read_only(False))
        return copy_unit(pair[0], pair[1], unit)

    with concurrent.futures.ThreadPoolExecutor(
        max(1, workers), thread_name_prefix="shardstore-convert"
    ) as pool:
        futures = {pool.submit(run, unit): unit for unit in units}
        try:
            for future in concurrent.futures.as_completed(futures):
                on_done(futures[future], future.result())
        except BaseException:
            for future in futures:  # units running finish (each shard is whole or not written)
                future.cancel()
            raise


def _in_memory(store: ShardingStore) -> bool:
    """Whether the store's data lives in this process only (no worker can reach it)."""
    inner = store.inner
    if isinstance(inner, str):
        return inner.startswith("memory:")
    protocol = getattr(getattr(inner, "fs", None), "protocol", None)
    if protocol is not None:
        return "memory" in ((protocol,) if isinstance(protocol, str) else tuple(protocol))
    return isinstance(inner, MutableMapping) or type(inner).__name__ == "MemoryStore"


def _has_session(store: ShardingStore) -> bool:
    """Whether the store is an Icechunk session's or fork's, whose changes reach the
    repository only through this process's commit."""
    try:
        store.session  # noqa: B018
    except AttributeError:
        return False
    return True


def _run_on_cluster(
    client: Client, src: ShardingStore, dst: ShardingStore, units: list[Unit], on_done: OnDone
) -> None:
    """One task per unit; each worker thread opens the stores once.

    The results are awaited on ``client``'s own event loop: ``as_completed`` otherwise
    uses the loop of the process's default client, and a program holding two clients
    (the command line's, beside one a notebook or a test made first) would then gather
    one client's futures on the other's loop, which may hang for ever (dask/distributed
    #4357)."""
    import distributed

    dask: Any = distributed  # untyped
    cluster: Any = client
    stores = pickle.dumps((src, dst))
    futures = cluster.map(_copy_unit_task, units, stores=stores, run=uuid.uuid4().hex, pure=False)
    by_key = {future.key: unit for future, unit in zip(futures, units, strict=True)}
    try:
        for future, result in dask.as_completed(futures, with_results=True, loop=cluster.loop):
            on_done(by_key[future.key], result)
    except BaseException:
        cluster.cancel(futures)  # tasks running finish (each shard is whole or not written)
        raise


# -- the conversion -------------------------------------------------------------------


def convert(
    src: ShardingStore,
    dst: ShardingStore,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
    client: Client | None = None,
    resume: bool = True,
) -> ConvertReport:
    """Copy every key of ``src`` into ``dst``, re-sharded by ``dst``'s options.

    ``dst`` must be empty, or (with ``resume``, the default) hold an interrupted
    conversion of the same source with the same options: then the shards already
    complete are skipped. The units (one per destination shard) run on
    ``workers`` threads (default :func:`default_workers`), or as tasks on the
    ``dask.distributed`` ``client``'s cluster (both stores must be reachable from
    its workers: URLs, not memory). ``progress(done, total)`` is called after
    each unit with the bytes copied so far; an exception it raises stops the
    conversion (units running finish), which a later call resumes.
    """
    started = time.perf_counter()
    for store, what in ((src, "source"), (dst, "destination")) if client is not None else ():
        if _in_memory(store):
            raise ShardStoreError(
                f"the {what} {store!r} is held in this process's memory: a dask cluster's workers cannot "
                "reach it; convert without a client (on threads)"
            )
    if client is not None and _has_session(dst):
        raise ShardStoreError(
            f"the destination {dst!r} is an Icechunk session: a dask cluster's workers would each write "
            "into a copy of it that never reaches this session's commit; convert without a client (on "
            "threads), then commit"
        )
    before = sync(_objects(src))
    metadata = [k for k in before.plain if is_metadata_key(k)]
    if not any(k.rpartition("/")[2] in ROOT_DOCUMENTS for k in metadata):
        raise ShardStoreError(
            f"no zarr hierarchy at {_where(src)} (no zarr.json, .zgroup or .zarray in it): nothing to convert"
        )
    unreadable = sync(src.internals.unreadable_documents(metadata))
    if unreadable:  # (its shards would be copied as chunks, or its chunks as shards)
        raise ShardingConfigError(f"cannot convert {_where(src)}: " + "; ".join(unreadable.values()))
    written, arrays, scratch = sync(_destination_documents(src, dst, sorted(metadata)))
    chunks = sync(_source_chunks(src, before))
    units, shards = sync(_plan(scratch, chunks))
    found = sync(_objects(dst))
    fresh = not (found.shards or found.plain)
    if not fresh and not resume:
        raise ShardingConfigError(
            f"destination {dst!r} is not empty: convert writes into an empty store (or, resuming, "
            "completes its own interrupted conversion)"
        )
    if not fresh:
        sync(_check_resumable(dst, found, written, arrays))
    pending = units if fresh else sync(_pending(dst, units, shards, found))
    there = set(found.plain)

    async def write_documents(keys: list[str]) -> None:
        await gather(*(dst.internals.metadata_written(k, written[k]) for k in keys if k not in there))

    sync(write_documents(arrays))
    total = sum(u.nbytes for u in pending)
    counts = {"chunks": 0, "bytes": 0, "progress": 0, "shards": 0, "blocks": 0}

    def on_done(unit: Unit, result: tuple[int, int]) -> None:
        counts["chunks"] += result[0]
        counts["bytes"] += result[1]
        counts["progress"] += unit.nbytes
        counts["shards" if unit.sharded else "blocks"] += 1
        if progress is not None:
            progress(counts["progress"], total)

    if client is not None:
        _run_on_cluster(client, src, dst, pending, on_done)
    else:
        _run_on_threads(src, dst, pending, default_workers() if workers is None else workers, on_done)
    sync(write_documents([k for k in sorted(written) if k not in arrays]))
    after = sync(_objects(dst))
    n_shards = sum(1 for u in units if u.sharded)
    return ConvertReport(
        arrays=len(arrays),
        chunks=len(chunks),
        bytes=counts["bytes"],
        chunks_copied=counts["chunks"],
        shards_written=counts["shards"],
        shards_skipped=n_shards - sum(1 for u in pending if u.sharded),
        blocks_written=counts["blocks"],
        blocks_skipped=len(units) - n_shards - sum(1 for u in pending if not u.sharded),
        objects_before=before.count,
        objects_after=after.count,
        bytes_before=before.nbytes,
        bytes_after=after.nbytes,
        seconds=time.perf_counter() - started,
    )


convert_async = in_a_thread(convert)


@contextmanager
def terminal_progress(enabled: bool | None = None, file: TextIO | None = None) -> Iterator[Progress | None]:
    """A bar of the bytes copied (:func:`shardstore.progress.progress`), for
    :func:`convert`'s ``progress``: drawn on ``file`` (default stderr) when
    ``enabled``, or by default when it is a terminal; None (nothing written, no
    counters in pipes or logs) otherwise or without tqdm."""
    if not bars.wanted(enabled, file):
        yield None
        return
    with bars.progress(None, "converting", enabled, file=file) as bar:
        shown = 0

        def update(done: int, total: int) -> None:
            nonlocal shown
            bar.set_total(total)
            bar.update(done - shown)
            shown = done

        yield update
