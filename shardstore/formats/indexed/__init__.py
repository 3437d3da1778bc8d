"""The indexed shard format (ZEP 2 ``type: "indexed"``, byte for byte the
``sharding_indexed`` codec v1.0): one wing.

``format``: the binary layout and its index math; ``codec_form``: an array's
metadata in zarr's standard ``sharding_indexed`` codec form and back (pure). The
format is read and written by the store's own paths (``shardstore.reading``,
``shardstore.writing``), through the ``ShardFormat`` interface, and its tools are
those of zarr arrays (``shardstore.maintenance``). Imports only
``shardstore.errors``, ``shardstore.chunk_grids`` and ``shardstore.formats.base``.
"""

from shardstore.formats.indexed import format
from shardstore.formats.indexed.format import *  # noqa: F403  (the wing's names are its format's)

__all__ = format.__all__
