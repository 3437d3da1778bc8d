"""Key routing: where each key zarr uses lives below the store.

A key is a metadata document (served by the metadata gateway), a chunk of a
sharded array (an index position in a shard object), a key that looks like a
chunk key of a sharded array but is none (wrong rank: absent, never stored),
or anything else, passed through to the inner store unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from shardstore.addressing import ChunkAddress, ShardAddress, locate, shard_address
from shardstore.catalog import ArrayCatalog
from shardstore.errors import ChunkKeyError
from shardstore.keys import INTEGER, split_key
from shardstore.metadata import METADATA_NAMES, ArrayInfo

__all__ = ["Destination", "KeyRouter", "RoutedChunks"]

Destination: TypeAlias = ChunkAddress | Literal["metadata", "inner", "absent"]
"""A chunk of a sharded array, a metadata document, a pass-through key, or a key
shaped like a chunk key of a sharded array that is none (reads find nothing)."""

_CACHE_ENTRIES = 1 << 17
"""Chunk keys whose shard address (and directories whose array) are remembered
(each cache cleared when full)."""


_LOCATABLE = 2**63
"""Grid coordinates from here on have no shard (shards are numbered with int64): a key
beyond the grid this far holds nothing."""


def _place(info: ArrayInfo | None, key: str) -> tuple[tuple[int, ...] | None, bool]:
    """Grid coordinates of ``key`` if it is a chunk key of the sharded array ``info``
    (any position), and whether they lie inside the array's grid."""
    if info is None or info.shard_format is None:
        return None, False
    coords = info.coords(key)
    return coords, coords is not None and info.in_grid(coords)


@dataclass(frozen=True)
class RoutedChunks:
    """Many chunk keys of one sharded array, routed at once: the shards they lie in, in
    the order first met, and for each key its shard (an index into ``shards``) and
    its place there; ``block`` the block of the grid one shard holds, where the grid
    is regular (None: chunks of several shapes); ``keys`` the keys, as given."""

    shards: list[ShardAddress]
    shard_of: npt.NDArray[np.intp]
    places: npt.NDArray[np.int64]
    block: tuple[int, ...] | None
    keys: Sequence[str]


class KeyRouter:
    """Routes keys by what ``catalog`` knows of the arrays (``catalog``: the store's
    :class:`~shardstore.catalog.ArrayCatalog`; addresses are remembered until it changes)."""

    def __init__(self, catalog: ArrayCatalog) -> None:
        self._catalog = catalog
        # chunk key -> (catalog generation, address): zarr touches the same keys over and over
        self._addresses: dict[str, tuple[int, ChunkAddress]] = {}
        # directory -> (catalog generation, the array of its integer-named keys), see _array_for
        self._arrays: dict[str, tuple[int, ArrayInfo | None]] = {}

    async def _array_for(self, key: str, directory: str, name: str) -> ArrayInfo | None:
        """``catalog.array_for_key(key)``, remembered per directory for keys whose last
        segment is an integer (``a/c/3/4``): the array paths such a key could belong to,
        and whether it is encoded like a chunk key of each, depend on that segment only
        through its being an integer, so every such key of a directory has one answer."""
        if INTEGER.fullmatch(name) is None:
            return await self._catalog.array_for_key(key)
        generation = self._catalog.generation
        known = self._arrays.get(directory)
        if known is not None and known[0] == generation:
            return known[1]
        info = await self._catalog.array_for_key(key)
        # under the generation it was looked up at: stale at once if the lookup changed anything
        if len(self._arrays) > _CACHE_ENTRIES:
            self._arrays.clear()
        self._arrays[directory] = (generation, info)
        return info

    async def route(self, key: str, *, writing: bool = False) -> Destination:
        """Where ``key`` lives. Writes to a chunk key outside its array's grid, or of
        the wrong rank, raise ChunkKeyError (reads of those find nothing)."""
        directory, name = split_key(key)
        if name in METADATA_NAMES:
            return "metadata"
        known = self._addresses.get(key)
        if known is not None and known[0] == self._catalog.generation:
            return known[1]
        info = await self._array_for(key, directory, name)
        coords, inside = _place(info, key)
        if writing and not inside and (info is None or info.shard_format is not None):
            # The array may have been created or grown through another store instance.
            info = await self._catalog.array_for_key(key, refresh=True)
            coords, inside = _place(info, key)
        if info is None or info.shard_format is None:
            return "inner"
        if writing and not inside:
            what = (
                "outside the chunk grid"
                if coords is not None
                else f"not a chunk key of this {info.ndim}-d array"
            )
            raise ChunkKeyError(
                f"cannot write {key!r}: {what} of array {info.path or '/'!r} "
                f"(grid shape {list(info.grid_shape)})"
            )
        if coords is None or (
            not inside and (info.shard_format.places_follow_grid or max(coords, default=0) >= _LOCATABLE)
        ):
            return "absent"  # (chunk ids number only the grid's positions)
        address = locate(info, key, coords)
        if inside:  # valid for reads and writes alike until the catalog changes
            if len(self._addresses) > _CACHE_ENTRIES:
                self._addresses.clear()
            self._addresses[key] = (self._catalog.generation, address)
        return address

    async def route_many(self, keys: Sequence[str]) -> RoutedChunks | None:
        """Where many chunk keys of one array lie, with the key and shard math done once
        for all of them (a selection of thousands of chunks costs zarr a few
        microseconds a chunk: routing them one by one would cost as much again).
        None unless every key is a canonical chunk key inside the grid of the sharded
        array the first one belongs to, in a format that locates chunks in bulk: then
        :meth:`route` them one by one."""
        if not keys:
            return None
        first = await self.route(keys[0])
        if not isinstance(first, ChunkAddress):
            return None
        info = first.shard.info
        fmt = first.shard.shard_format
        coords = info.grammar.decode_many(keys, info.prefix, info.ndim)
        if coords is None or ((coords < 0) | (coords >= np.asarray(info.grid_shape))).any():
            return None
        located = fmt.locate_many(coords, info.grid_shape)
        if located is None:
            return None
        shard_coords, places = located
        shard_ids = np.ravel_multi_index(tuple(shard_coords.T), tuple(shard_coords.max(axis=0) + 1))
        _, first_of, inverse = np.unique(shard_ids, return_index=True, return_inverse=True)
        order = np.argsort(first_of)  # shards in the order their first chunk comes
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        shards = [shard_address(info, tuple(shard)) for shard in shard_coords[first_of[order]].tolist()]
        block = fmt.grid_block if info.edges is None else None
        return RoutedChunks(shards, rank[inverse.reshape(-1)], places, block, keys)
