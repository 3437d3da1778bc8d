"""What the read path needs to know of a shard and of a chunk in it: its key, its
format, its place. A zarr array's shards (``shardstore.addressing``) are such
shards, and so are the shard files of a neuroglancer key-value store, which
belong to no array."""

from __future__ import annotations

from typing import Protocol

from shardstore.formats.base import ShardFormat

__all__ = ["ChunkRef", "ShardRef"]


class ShardRef(Protocol):
    """A shard object: where it is and how it is laid out."""

    @property
    def key(self) -> str: ...

    @property
    def shard_format(self) -> ShardFormat: ...

    @property
    def nominal_nbytes(self) -> int | None:
        """A full shard's bytes before compression, where known."""

    def places_in_grid(self) -> tuple[int, ...] | None:
        """The places of every chunk the shard may hold (None: not enumerated)."""


class ChunkRef(Protocol):
    """A chunk: its own name, its shard and its place there."""

    @property
    def key(self) -> str: ...

    @property
    def shard(self) -> ShardRef: ...

    @property
    def position(self) -> int: ...
