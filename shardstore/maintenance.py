"""Looking after shards: what they hold, how much of them is dead, and compaction.

Appending (``write_strategy="append"``) leaves replaced chunk bytes and old
indices in a shard as dead bytes; :func:`compact` rewrites the shards that
carry any as compact objects.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.core.sync import sync

from shardstore.errors import ShardFormatError
from shardstore.format import MISSING, ShardIndex, ShardLayout, split_shard
from shardstore.keys import join_path

if TYPE_CHECKING:
    from shardstore.addressing import ShardAddress
    from shardstore.store import ShardingStore

__all__ = [
    "ArrayReport",
    "ShardReport",
    "compact",
    "compact_async",
    "info",
    "info_async",
    "shard_reports",
    "shard_reports_async",
    "verify",
    "verify_async",
]


@dataclass(frozen=True)
class ShardReport:
    key: str
    array: str
    nbytes: int
    """Size of the shard object."""
    chunks: int
    """Chunks present in its index."""
    live_bytes: int
    """Bytes its index points at (shared ranges counted once)."""
    dead_bytes: int
    """Bytes neither index nor live chunk: replaced chunks, old indices."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def live_bytes(index: ShardIndex) -> int:
    """Bytes covered by the index's chunk ranges, overlaps counted once."""
    present = index[index[:, 0] != MISSING]
    if len(present) == 0:
        return 0
    order = np.argsort(present[:, 0])
    starts = present[order, 0].astype(np.int64)
    ends = starts + present[order, 1].astype(np.int64)
    reach = np.maximum.accumulate(ends)
    # a range starts a new run where it begins past everything before it
    new_run = np.concatenate([[True], starts[1:] > reach[:-1]])
    run_ends = np.maximum.reduceat(ends, np.flatnonzero(new_run))
    return int((run_ends - starts[new_run]).sum())


def _report(key: str, array: str, layout: ShardLayout, index: ShardIndex, nbytes: int) -> ShardReport:
    live = live_bytes(index)
    chunks = int((index[:, 0] != MISSING).sum())
    return ShardReport(key, array, nbytes, chunks, live, max(nbytes - layout.index_nbytes - live, 0))


async def _survey(store: ShardingStore, prefix: str) -> list[tuple[ShardAddress, ShardReport]]:
    shards, _ = await store._scan(prefix)
    indices, sizes = await asyncio.gather(
        store._reader.read_indices(shards), asyncio.gather(*(store._inner.getsize(s.key) for s in shards))
    )
    return [
        (s, _report(s.key, s.info.path, s.layout, index, size))
        for s, index, size in zip(shards, indices, sizes, strict=True)
        if index is not None and size is not None
    ]


async def shard_reports_async(store: ShardingStore, prefix: str = "") -> list[ShardReport]:
    """One report per shard object under ``prefix``."""
    return [report for _, report in await _survey(store, prefix)]


async def compact_async(
    store: ShardingStore, prefix: str = "", *, min_dead_bytes: int = 1
) -> list[ShardReport]:
    """Rewrite every shard under ``prefix`` with at least ``min_dead_bytes`` dead bytes.

    Returns the reports of the shards rewritten, as they were before.
    """
    store._check_writable()
    doomed = [(s, r) for s, r in await _survey(store, prefix) if r.dead_bytes >= min_dead_bytes]
    await asyncio.gather(*(store._writer.compact(s) for s, _ in doomed))
    return [r for _, r in doomed]


def shard_reports(store: ShardingStore, prefix: str = "") -> list[ShardReport]:
    return sync(shard_reports_async(store, prefix))


def compact(store: ShardingStore, prefix: str = "", *, min_dead_bytes: int = 1) -> list[ShardReport]:
    return sync(compact_async(store, prefix, min_dead_bytes=min_dead_bytes))


@dataclass(frozen=True)
class ArrayReport:
    path: str
    sharded: bool
    chunks_per_shard: list[int] | None
    grid_chunks: int
    """Chunks in the array's chunk grid."""
    chunks: int
    """Chunks present (in shard indices, or as objects for an unsharded array)."""
    shards: int
    stored_bytes: int
    dead_bytes: int

    @property
    def fill_ratio(self) -> float:
        return self.chunks / self.grid_chunks if self.grid_chunks else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fill_ratio": self.fill_ratio}


async def info_async(store: ShardingStore, prefix: str = "") -> list[ArrayReport]:
    """Per array under ``prefix``: shards, chunks present, fill ratio, stored and dead bytes."""
    keys = [k async for k in store.list_prefix(prefix)]
    arrays = sorted({k.rpartition("/")[0] for k in keys if k.rpartition("/")[2] in ("zarr.json", ".zarray")})
    survey = await _survey(store, prefix)
    reports = []
    for path in arrays:
        info = await store._catalog.lookup(path)
        if info is None:
            continue
        mine = [r for s, r in survey if s.info.path == path]
        chunk_keys = [k for k in keys if info.coords(k) is not None]
        sizes = [r.nbytes for r in mine] if info.layout else [await store.getsize(k) for k in chunk_keys]
        reports.append(
            ArrayReport(
                path=path,
                sharded=info.layout is not None,
                chunks_per_shard=list(info.layout.chunks_per_shard) if info.layout else None,
                grid_chunks=int(np.prod(info.grid_shape)),
                chunks=len(chunk_keys),
                shards=len(mine),
                stored_bytes=int(sum(sizes)),
                dead_bytes=sum(r.dead_bytes for r in mine),
            )
        )
    return reports


async def verify_async(store: ShardingStore, prefix: str = "", *, decode: bool = False) -> dict[str, str]:
    """Check every shard's index and chunk ranges (and, with ``decode``, decode every
    chunk through zarr). Returns damaged key -> what is wrong (empty: all is well)."""
    damaged: dict[str, str] = {}
    shards, _ = await store._scan(prefix)
    for shard in shards:
        blob = await store._inner.get(shard.key)
        try:
            split_shard(shard.layout, blob or b"", shard.key)
        except ShardFormatError as exc:
            damaged[shard.key] = str(exc)
    if decode:
        import zarr

        for report in await info_async(store, prefix):
            arr = await zarr.api.asynchronous.open_array(store=store, path=report.path, mode="r")
            array = await store._catalog.lookup(report.path)
            async for key in store.list_prefix(join_path(report.path, "")):
                coords = None if array is None else array.coords(key)
                if coords is None:
                    continue
                region = tuple(slice(c * n, (c + 1) * n) for c, n in zip(coords, arr.chunks, strict=True))
                try:
                    await arr.getitem(region)
                except Exception as exc:
                    damaged.setdefault(key, f"chunk {key!r} does not decode: {type(exc).__name__}: {exc}")
    return damaged


def info(store: ShardingStore, prefix: str = "") -> list[ArrayReport]:
    return sync(info_async(store, prefix))


def verify(store: ShardingStore, prefix: str = "", *, decode: bool = False) -> dict[str, str]:
    return sync(verify_async(store, prefix, decode=decode))
