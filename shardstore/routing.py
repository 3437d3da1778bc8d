"""Key routing: where each key zarr uses lives below the store.

A key is a metadata document (served by the metadata gateway), a chunk of a
sharded array (an index position in a shard object), a key that looks like a
chunk key of a sharded array but is none (wrong rank: absent, never stored),
or anything else, passed through to the inner store unchanged.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from shardstore.addressing import ChunkAddress, locate
from shardstore.catalog import ArrayCatalog
from shardstore.errors import ChunkKeyError
from shardstore.keys import split_key
from shardstore.metadata import METADATA_NAMES, ArrayInfo

__all__ = ["Destination", "KeyRouter"]

Destination: TypeAlias = ChunkAddress | Literal["metadata", "inner", "absent"]
"""A chunk of a sharded array, a metadata document, a pass-through key, or a key
shaped like a chunk key of a sharded array that is none (reads find nothing)."""

_ADDRESS_CACHE = 1 << 17
"""Chunk keys whose shard address is remembered (cleared when full)."""


def _in_grid(info: ArrayInfo, key: str) -> bool:
    coords = info.coords(key)
    return coords is not None and info.in_grid(coords)


class KeyRouter:
    """Routes keys by what ``catalog`` knows of the arrays (``catalog``: the store's
    :class:`~shardstore.catalog.ArrayCatalog`; addresses are remembered until it changes)."""

    def __init__(self, catalog: ArrayCatalog) -> None:
        self._catalog = catalog
        # chunk key -> (catalog generation, address): zarr touches the same keys over and over
        self._addresses: dict[str, tuple[int, ChunkAddress]] = {}

    async def route(self, key: str, *, writing: bool = False) -> Destination:
        """Where ``key`` lives. Writes to a chunk key outside its array's grid, or of
        the wrong rank, raise ChunkKeyError (reads of those find nothing)."""
        if split_key(key)[1] in METADATA_NAMES:
            return "metadata"
        known = self._addresses.get(key)
        if known is not None and known[0] == self._catalog.generation:
            return known[1]
        info = await self._catalog.array_for_key(key)
        if writing and (info is None or (info.shard_format is not None and not _in_grid(info, key))):
            # The array may have been created or grown through another store instance.
            info = await self._catalog.array_for_key(key, refresh=True)
        if info is None or info.shard_format is None:
            return "inner"
        coords = info.coords(key)
        if writing and (coords is None or not info.in_grid(coords)):
            what = (
                "outside the chunk grid"
                if coords is not None
                else f"not a chunk key of this {info.ndim}-d array"
            )
            raise ChunkKeyError(
                f"cannot write {key!r}: {what} of array {info.path or '/'!r} "
                f"(grid shape {list(info.grid_shape)})"
            )
        if coords is None:
            return "absent"
        address = locate(info, key, coords)
        if info.in_grid(coords):  # valid for reads and writes alike until the catalog changes
            if len(self._addresses) > _ADDRESS_CACHE:
                self._addresses.clear()
            self._addresses[key] = (self._catalog.generation, address)
        return address
