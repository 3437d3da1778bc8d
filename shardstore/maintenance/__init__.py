"""Looking after the shards of zarr arrays: what they hold, how much of them is dead,
whether they are intact, what writers left beside them, and compaction.

One module per subject (``survey``, ``info``, ``verify``, ``compact``,
``leftovers``, and ``common`` for what they share), each with one async
implementation and its synchronous front door made by
:func:`shardstore.sync_bridge.blocking`. Appending (``write_strategy="append"``)
leaves replaced chunk bytes and old indices in a shard as dead bytes;
:func:`compact` rewrites the shards that carry any as compact objects.

Every tool goes on past a damaged shard and says which it was: figures are taken
only from indices that are consistent (with themselves and with the object's
size), so none is ever garbage. :func:`verify` states every problem of every
shard, where reads stop at the first. The tools use only the store's internal
API (``store.internals``); the neuroglancer format's own tools are in its wing
(:mod:`shardstore.neuroglancer.tools`).

May import: ``errors``, ``choices``, ``formats`` (the interface), ``addressing``,
``metadata``, ``keys``, ``inner``, ``sync_bridge``, ``tasks``, and the store only for
its type and its ``internals``.
"""

from shardstore.maintenance.common import Progress
from shardstore.maintenance.compact import compact, compact_async
from shardstore.maintenance.info import ArrayReport, info, info_async
from shardstore.maintenance.leftovers import leftovers, leftovers_async
from shardstore.maintenance.survey import (
    ShardReport,
    list_keys,
    list_keys_async,
    shard_reports,
    shard_reports_async,
)
from shardstore.maintenance.verify import verify, verify_async

__all__ = [
    "ArrayReport",
    "Progress",
    "ShardReport",
    "compact",
    "compact_async",
    "info",
    "info_async",
    "leftovers",
    "leftovers_async",
    "list_keys",
    "list_keys_async",
    "shard_reports",
    "shard_reports_async",
    "verify",
    "verify_async",
]
