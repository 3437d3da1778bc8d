"""shardstore: a ZEP 2 sharding storage transformer for zarr.

Wrap any fsspec mapper, zarr store or mapping in :class:`ShardingStore` and
unmodified zarr arrays write many chunks into each shard object.

The public API is exactly the names in ``__all__`` (with the ``shardstore``
command and ``shard::`` URLs); every other module is internal.
"""

from shardstore import errors
from shardstore._version import __version__
from shardstore.errors import *  # noqa: F403  (the error classes are part of the public API)
from shardstore.formats.precomputed import PrecomputedSharding
from shardstore.layouts import switch_layout
from shardstore.maintenance import ArrayReport, ShardReport, compact, info, verify
from shardstore.neuroglancer.store import PrecomputedShardedStore
from shardstore.neuroglancer.volume import PrecomputedScale, PrecomputedVolume
from shardstore.pipeline import PIPELINE_PATH, ShardAwarePipeline
from shardstore.rechunk import rechunk_to_shards, shard_shape
from shardstore.store import ShardingStore

__all__ = [
    "PIPELINE_PATH",
    "ArrayReport",
    "PrecomputedScale",
    "PrecomputedShardedStore",
    "PrecomputedSharding",
    "PrecomputedVolume",
    "ShardAwarePipeline",
    "ShardReport",
    "ShardingStore",
    "__version__",
    "compact",
    "info",
    "rechunk_to_shards",
    "shard_shape",
    "switch_layout",
    "verify",
    *errors.__all__,
]
