"""Compaction: intact shards with dead bytes (left by appends) rewritten compact."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardstore.errors import ReadOnlyError
from shardstore.maintenance.common import Progress
from shardstore.maintenance.survey import ShardReport, Surveyed, survey
from shardstore.sync_bridge import blocking
from shardstore.tasks import gather

__all__ = ["compact", "compact_async"]

if TYPE_CHECKING:
    from shardstore.store import ShardingStore


async def compact_async(
    store: ShardingStore, prefix: str = "", *, min_dead_bytes: int = 1, progress: Progress | None = None
) -> list[ShardReport]:
    """Rewrite every intact shard under ``prefix`` with at least ``min_dead_bytes`` dead bytes.

    Returns the reports of the shards rewritten, as they were before, and of the
    damaged shards, left as they are (``damage`` set): rewriting one would keep
    only what its broken index points at. ``progress`` is told of the bytes of the
    shards rewritten (stage "shards"), as each is done.
    """
    if store.read_only:  # before surveying: as any write would
        raise ReadOnlyError(f"store was opened in read-only mode and does not support writing: {store!r}")
    shards, _ = await store.internals.shards_under(prefix)
    surveyed = await survey(store, shards)
    doomed = [s for s in surveyed if s.index is not None and s.report.dead_bytes >= min_dead_bytes]
    total, done = sum(s.report.nbytes for s in doomed), 0

    async def rewrite(surveyed: Surveyed) -> None:
        nonlocal done
        await store.internals.compact_shard(surveyed.shard)
        done += surveyed.report.nbytes
        if progress is not None:
            progress("shards", done, total)

    await gather(*(rewrite(s) for s in doomed))
    return [s.report for s in doomed] + [s.report for s in surveyed if s.index is None]


compact = blocking(compact_async)
