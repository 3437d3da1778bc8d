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

from shardstore.formats.precomputed.ids import (
    chunk_hash,
    compressed_morton_code,
    locate_ids,
    morton_positions,
    murmurhash3_x86_128_64,
    renumber,
    renumbered,
    shard_file_name,
    shard_number_of_name,
)
from shardstore.formats.precomputed.shard_file import (
    MAX_DECODED_NBYTES,
    build_shard,
    decode_chunk,
    decode_minishard_index,
    decode_shard_index,
    minishard_index_range,
    parse_shard,
    shard_problems,
    split_shard,
)
from shardstore.formats.precomputed.sharding import MAX_MINISHARD_BITS, TYPE_NAME, PrecomputedSharding

__all__ = [
    "MAX_DECODED_NBYTES",
    "MAX_MINISHARD_BITS",
    "TYPE_NAME",
    "PrecomputedSharding",
    "build_shard",
    "chunk_hash",
    "compressed_morton_code",
    "decode_chunk",
    "decode_minishard_index",
    "decode_shard_index",
    "locate_ids",
    "minishard_index_range",
    "morton_positions",
    "murmurhash3_x86_128_64",
    "parse_shard",
    "renumber",
    "renumbered",
    "shard_file_name",
    "shard_number_of_name",
    "shard_problems",
    "split_shard",
]
