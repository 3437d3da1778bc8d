"""shardstore: a ZEP 2 sharding storage transformer for zarr.

Wrap any fsspec mapper, zarr store or mapping in :class:`ShardingStore` and
unmodified zarr arrays write many chunks into each shard object.
"""

from shardstore.errors import (
    ChunkKeyError,
    InnerStoreError,
    InvalidKeyError,
    ShardFormatError,
    ShardingConfigError,
    ShardStoreError,
)
from shardstore.store import ShardingStore

__all__ = [
    "ChunkKeyError",
    "InnerStoreError",
    "InvalidKeyError",
    "ShardFormatError",
    "ShardStoreError",
    "ShardingConfigError",
    "ShardingStore",
]
