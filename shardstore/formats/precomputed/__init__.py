"""The neuroglancer precomputed sharded format (``neuroglancer_uint64_sharded_v1``): its
binary layout and its id math, pure. The core knows it only through
:mod:`shardstore.formats` (the registry and the ``ShardFormat`` interface); the
key-value store, volumes and tools of neuroglancer data are a wing of their own,
:mod:`shardstore.neuroglancer`.

- ``params``: the parameters the id math and the file layout read;
- ``sharding``: the ``sharding`` JSON object, checked, as a ``ShardFormat``;
- ``ids``: chunk ids to shards and minishards, shard file names, Morton codes;
- ``shard_file``: the binary layout of a shard file (build, parse, split, check).

Imports only ``shardstore.errors`` and ``shardstore.formats``.
"""

from shardstore.formats.precomputed import ids, shard_file, sharding
from shardstore.formats.precomputed.ids import *  # noqa: F403  (the pure modules' names, re-exported)
from shardstore.formats.precomputed.params import ShardingParams
from shardstore.formats.precomputed.shard_file import *  # noqa: F403
from shardstore.formats.precomputed.sharding import *  # noqa: F403

__all__ = [*sharding.__all__, "ShardingParams", *ids.__all__, *shard_file.__all__]
