"""The neuroglancer precomputed sharded format (``neuroglancer_uint64_sharded_v1``): one wing.

What knows this format lives here, and nothing here is known to the rest of the
package but through :mod:`shardstore.formats` (the registry and the
``ShardFormat`` interface) and the names below:

- ``sharding``: the ``sharding`` JSON object, checked, as a ``ShardFormat``;
- ``ids``: chunk ids to shards and minishards, shard file names, Morton codes;
- ``shard_file``: the binary layout of a shard file (build, parse, split, check);
- ``store``: :class:`PrecomputedShardedStore`, a directory of shard files as a
  key-value store of chunk ids (ranged reads through its indices, conditional
  rewrites);
- ``volume``: :class:`PrecomputedVolume`, volumes (``info`` file plus scales);
- ``tools``: ``info``, ``ls``, ``verify`` and leftovers of precomputed data.

The pure modules (the first three) import only ``shardstore.errors`` and
``shardstore.formats``; ``store`` adds the inner stores and the read retry;
``volume`` and ``tools`` build on ``store``. Only the pure names are exported
here, so that the core may import this package without the I/O modules.
"""

from shardstore.formats.precomputed import ids, shard_file, sharding
from shardstore.formats.precomputed.ids import *  # noqa: F403  (the pure modules' names, re-exported)
from shardstore.formats.precomputed.shard_file import *  # noqa: F403
from shardstore.formats.precomputed.sharding import *  # noqa: F403

__all__ = [*sharding.__all__, *ids.__all__, *shard_file.__all__]
