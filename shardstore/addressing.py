"""Where a chunk lives: its shard object and its place in that shard, as the array's
shard format maps it (``ShardFormat.locate``): in the indexed format, a block of the
grid and an index position; in the neuroglancer format, a shard file and a chunk id.
Shard objects are named by the array's chunk key grammar, or by the format itself
(``ShardFormat.shard_file``) below the array's shard prefix."""

from __future__ import annotations

from dataclasses import dataclass

from shardstore.formats.base import ChunkTable, ShardFormat
from shardstore.metadata import ArrayInfo

__all__ = ["ChunkAddress", "ShardAddress", "locate", "shard_address", "shard_at"]


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
    def nominal_nbytes(self) -> int | None:
        """A full shard's bytes before compression, where the data type tells it."""
        return self.info.nominal_shard_nbytes

    def places_in_grid(self) -> tuple[int, ...] | None:
        """The places of this shard's chunks that lie inside the array (None where the
        format spreads a shard's chunks over the grid: not enumerated)."""
        return self.shard_format.places_in(self.coords, self.info.grid_shape)

    def present_keys(self, table: ChunkTable) -> list[tuple[int, str]]:
        """(place, chunk key) of every chunk inside the array the table says is
        present (other tools may store chunks beyond the array's edge)."""
        members = self.shard_format.members(table, self.coords, self.info.grid_shape)
        return [(place, self.info.key(list(coords))) for place, coords in members]


@dataclass(frozen=True)
class ChunkAddress:
    """A chunk of a sharded array: its own key, its shard, its index position."""

    key: str
    shard: ShardAddress
    position: int


def locate(info: ArrayInfo, key: str, coords: tuple[int, ...]) -> ChunkAddress:
    fmt = info.shard_format
    assert fmt is not None
    shard, place = fmt.locate(coords, info.grid_shape)
    return ChunkAddress(key, shard_address(info, shard), place)


def shard_address(info: ArrayInfo, shard: tuple[int, ...]) -> ShardAddress:
    """The shard ``shard`` (in the format's own terms, as ``ShardFormat.locate`` gives
    it) of a sharded array."""
    fmt = info.shard_format
    assert fmt is not None
    key = info.shard_prefix + fmt.shard_file(shard) if fmt.named_shards else info.key(shard)
    return ShardAddress(info, key, shard)


def shard_at(info: ArrayInfo, key: str) -> ShardAddress | None:
    """The shard object ``key`` is, of a sharded array (None: not one of its shards)."""
    fmt = info.shard_format
    if fmt is None:
        return None
    if not fmt.named_shards:
        coords = info.coords(key)
        return None if coords is None else ShardAddress(info, key, coords)
    name = key[len(info.shard_prefix) :] if key.startswith(info.shard_prefix) else ""
    shard = fmt.shard_of_file(name)
    return None if shard is None else ShardAddress(info, key, shard)
