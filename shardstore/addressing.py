"""Where a chunk lives: its shard object and its place in that shard.

In the indexed format a chunk's place is its position in the shard's index, and
its shard is its grid coordinates floor-divided by ``chunks_per_shard``. In the
neuroglancer format it is its id, the compressed Morton code of its grid
position, and its shard is the one that id hashes to (``<shard>.shard`` under
the array's chunk prefix)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from shardstore.formats.base import ChunkTable, ShardFormat
from shardstore.formats.indexed import IndexedFormat, present_positions
from shardstore.formats.precomputed import (
    PrecomputedSharding,
    compressed_morton_code,
    locate_ids,
    morton_positions,
    shard_file_name,
    shard_number_of_name,
)
from shardstore.keys import chunk_coords_in_shard, locate_chunk
from shardstore.metadata import ArrayInfo

__all__ = ["ChunkAddress", "ShardAddress", "locate", "shard_at"]


@dataclass(frozen=True)
class ShardAddress:
    """A shard object of a sharded array."""

    info: ArrayInfo
    key: str
    coords: tuple[int, ...]

    @property
    def shard_format(self) -> ShardFormat:
        assert self.info.shard_format is not None
        return self.info.shard_format

    @property
    def indexed(self) -> IndexedFormat | None:
        """The shard's format where chunks are index positions (None: chunk ids)."""
        fmt = self.shard_format
        return fmt if isinstance(fmt, IndexedFormat) else None

    def in_grid_positions(self) -> tuple[int, ...]:
        """Index positions of this indexed shard's chunks that lie inside the array."""
        fmt = self.indexed
        assert fmt is not None
        return _in_grid_positions(self.info.grid_shape, fmt.chunks_per_shard, self.coords)

    def present_keys(self, table: ChunkTable) -> list[tuple[int, str]]:
        """(place, chunk key) of every chunk inside the array the table says is
        present (other tools may store chunks beyond the array's edge)."""
        if isinstance(table, dict):
            ids = np.fromiter(table, dtype=np.uint64, count=len(table))
            coords = morton_positions(ids, self.info.grid_shape)
            inside = np.all(coords < np.asarray(self.info.grid_shape, dtype=np.int64), axis=1)
            return sorted(
                (int(i), self.info.key(c.tolist())) for i, c in zip(ids[inside], coords[inside], strict=True)
            )
        fmt = self.indexed
        assert fmt is not None
        positions = present_positions(table)
        inside_positions = self.in_grid_positions()
        if len(inside_positions) < fmt.n_chunks:
            positions = positions[np.isin(positions, inside_positions)]
        grid = chunk_coords_in_shard(self.coords, fmt.chunks_per_shard)[positions]
        return [(int(p), self.info.key(c.tolist())) for p, c in zip(positions, grid, strict=True)]


@dataclass(frozen=True)
class ChunkAddress:
    """A chunk of a sharded array: its own key, its shard, its index position."""

    key: str
    shard: ShardAddress
    position: int


def locate(info: ArrayInfo, key: str, coords: tuple[int, ...]) -> ChunkAddress:
    fmt = info.shard_format
    if isinstance(fmt, PrecomputedSharding):
        chunk_id = compressed_morton_code(np.array([coords]), info.grid_shape)
        shard = int(locate_ids(fmt, chunk_id)[0][0])
        shard_key = info.shard_prefix + shard_file_name(fmt, shard)
        return ChunkAddress(key, ShardAddress(info, shard_key, (shard,)), int(chunk_id[0]))
    assert isinstance(fmt, IndexedFormat)
    shard_coords, position = locate_chunk(coords, fmt.chunks_per_shard)
    return ChunkAddress(key, ShardAddress(info, info.key(shard_coords), shard_coords), position)


def shard_at(info: ArrayInfo, key: str) -> ShardAddress | None:
    """The shard object ``key`` is, of a sharded array (None: not one of its shards)."""
    fmt = info.shard_format
    if isinstance(fmt, PrecomputedSharding):
        name = key[len(info.shard_prefix) :] if key.startswith(info.shard_prefix) else ""
        number = shard_number_of_name(fmt, name)
        return None if number is None else ShardAddress(info, key, (number,))
    coords = info.coords(key) if fmt is not None else None
    return None if coords is None else ShardAddress(info, key, coords)


@functools.lru_cache(maxsize=4096)
def _in_grid_positions(
    grid_shape: tuple[int, ...], chunks_per_shard: tuple[int, ...], shard_coords: tuple[int, ...]
) -> tuple[int, ...]:
    coords = chunk_coords_in_shard(shard_coords, chunks_per_shard)
    inside = np.all(coords < np.asarray(grid_shape, dtype=np.int64), axis=1)
    return tuple(int(p) for p in np.flatnonzero(inside))
