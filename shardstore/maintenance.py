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

from shardstore.format import MISSING, ShardIndex, ShardLayout

if TYPE_CHECKING:
    from shardstore.addressing import ShardAddress
    from shardstore.store import ShardingStore

__all__ = ["ShardReport", "compact", "compact_async", "shard_reports", "shard_reports_async"]


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
        store._read_indices(shards), asyncio.gather(*(store._inner.getsize(s.key) for s in shards))
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
