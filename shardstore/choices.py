"""The values a store's options and metadata choose among (types only).

On the ground floor, so that every layer names a choice without importing the
layer that acts on it: the options module checks them, the writer, the metadata
gateway and the read policy follow them.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

__all__ = ["IndexCacheMode", "Layout", "ReadStrategy", "Renumbering", "WholeShards", "WriteStrategy"]

Layout: TypeAlias = Literal["transformer", "codec"]
"""How an array's metadata records its sharding: the ZEP 2 storage transformer, or
zarr's standard sharding codec (readable without shardstore)."""
WriteStrategy: TypeAlias = Literal["rewrite", "append"]
"""Each commit rewrites its shard whole, or appends new chunks and a new index."""
ReadStrategy: TypeAlias = Literal["auto", "chunk", "shard"]
"""Reads of the chunks asked for, of whole shards, or chosen by size and backend."""
IndexCacheMode: TypeAlias = Literal["auto", "trust", "off", "revalidate"]
"""How cached indices and shards are checked before they are served."""
Renumbering: TypeAlias = Literal["migrate", "refuse"]
"""What a resize that gives stored chunks other ids does: move them, or refuse."""
WholeShards: TypeAlias = Literal["never", "first", "repeat", "always"]
"""When the read path fetches a shard whole (the read policy's resolution of the options)."""
