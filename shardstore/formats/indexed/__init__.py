"""The indexed shard format (ZEP 2 ``type: "indexed"``, byte for byte the
``sharding_indexed`` codec v1.0): one wing.

``format``: the binary layout and its index math (pure). The format's reader and
writer are the store's own (``shardstore.reading``, ``shardstore.writing``), which
read its index table, and its tools are those of zarr arrays
(``shardstore.maintenance``). Imports only ``shardstore.errors`` and
``shardstore.formats``.
"""

from shardstore.formats.indexed import format
from shardstore.formats.indexed.format import *  # noqa: F403  (the wing's names are its format's)

__all__ = format.__all__
