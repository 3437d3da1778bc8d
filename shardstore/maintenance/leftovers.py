"""Leftovers: the hidden files writers keep beside objects (journals, locks,
temporary files) and the stale shard files of an interrupted resize, described."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardstore.keys import join_path
from shardstore.sync_bridge import blocking

if TYPE_CHECKING:
    from shardstore.store import ShardingStore

LEFTOVERS = {
    "appending": "append journal of {obj!r}: an append to it is running, or crashed; shardstore "
    "serves the shard as committed and the next write to it repairs it",
    "lock": "lock file of {obj!r}: a writer of it is running, or died holding it (perhaps with part "
    "of the new version it was writing, never read); the next writer takes it over and removes it",
    "partial": "temporary file of a write to {obj!r} that is running, or died before its rename: "
    "never read; delete it when no writer runs",
}

STALE_SHARD = (
    "shard file outside the directory its array's metadata names: left by a resize that "
    "renumbered the array's chunks and was interrupted (or ran beside another one); never "
    "read; delete it when no resize of the array runs"
)

__all__ = ["LEFTOVERS", "STALE_SHARD", "leftovers", "leftovers_async", "owner"]


def owner(hidden: str) -> tuple[str, str]:
    """(object key, kind) of one of the hidden files beside objects: ``.<name>.appending``,
    ``.<name>.lock``, ``.<name>.<32 hex>.partial``."""
    folder, _, name = hidden.rpartition("/")
    stem, _, kind = name.rpartition(".")
    if kind == "partial":
        stem = stem.rpartition(".")[0]
    return join_path(folder, stem[1:]), kind


async def leftovers_async(store: ShardingStore, prefix: str = "") -> dict[str, str]:
    """Hidden files writers keep beside objects under ``prefix`` (local directories),
    key -> what it is. Running writers have them too; what a crash leaves stays until
    the object's next write (a partial write until deleted). Never damage by itself."""
    found = await store.internals.raw.temporary_files(prefix)
    hidden = {key: LEFTOVERS[kind].format(obj=obj) for key in found for obj, kind in [owner(key)]}
    stale = await store.internals.stale_shard_files(prefix)
    return hidden | {key: STALE_SHARD for key in stale}


leftovers = blocking(leftovers_async)
