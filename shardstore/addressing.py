"""Where a chunk lives: its shard object and its position in that shard's index."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from shardstore.formats.indexed import IndexedFormat, ShardIndex, present_positions
from shardstore.keys import chunk_coords_in_shard, locate_chunk
from shardstore.metadata import ArrayInfo

__all__ = ["ChunkAddress", "ShardAddress", "locate"]


@dataclass(frozen=True)
class ShardAddress:
    """A shard object of a sharded array."""

    info: ArrayInfo
    key: str
    coords: tuple[int, ...]

    @property
    def shard_format(self) -> IndexedFormat:
        assert self.info.shard_format is not None
        return self.info.shard_format

    def in_grid_positions(self) -> tuple[int, ...]:
        """Index positions of this shard's chunks that lie inside the array."""
        return _in_grid_positions(self.info.grid_shape, self.shard_format.chunks_per_shard, self.coords)

    def present_keys(self, index: ShardIndex) -> list[tuple[int, str]]:
        """(position, chunk key) of every chunk inside the array the index says is
        present (other tools may store chunks beyond the array's edge)."""
        positions = present_positions(index)
        inside = self.in_grid_positions()
        if len(inside) < self.shard_format.n_chunks:
            positions = positions[np.isin(positions, inside)]
        coords = chunk_coords_in_shard(self.coords, self.shard_format.chunks_per_shard)[positions]
        return [(int(p), self.info.key(c.tolist())) for p, c in zip(positions, coords, strict=True)]


@dataclass(frozen=True)
class ChunkAddress:
    """A chunk of a sharded array: its own key, its shard, its index position."""

    key: str
    shard: ShardAddress
    position: int


def locate(info: ArrayInfo, key: str, coords: tuple[int, ...]) -> ChunkAddress:
    assert info.shard_format is not None
    shard_coords, position = locate_chunk(coords, info.shard_format.chunks_per_shard)
    return ChunkAddress(key, ShardAddress(info, info.key(shard_coords), shard_coords), position)


@functools.lru_cache(maxsize=4096)
def _in_grid_positions(
    grid_shape: tuple[int, ...], chunks_per_shard: tuple[int, ...], shard_coords: tuple[int, ...]
) -> tuple[int, ...]:
    coords = chunk_coords_in_shard(shard_coords, chunks_per_shard)
    inside = np.all(coords < np.asarray(grid_shape, dtype=np.int64), axis=1)
    return tuple(int(p) for p in np.flatnonzero(inside))
