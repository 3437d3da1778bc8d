"""The shard-format interface: what the read, write and maintenance paths ask of
a binary shard format, so that a second format plugs in beside the first.

A format turns the chunks of one shard (an ``int`` each: an index position, or
a uint64 chunk id; bytes as the layer above hands them over) into one object
and back, says where a reader finds the
object's (first-level) index, and round-trips its own configuration (the
``configuration`` of a ZEP 2 ``type``, or neuroglancer's ``sharding`` object).
Implementations are frozen dataclasses of pure methods: no I/O.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Self, TypeAlias

import numpy as np
import numpy.typing as npt
from zarr.abc.store import ByteRequest

__all__ = ["ChunkTable", "ShardFormat", "table_entry"]

ChunkTable: TypeAlias = npt.NDArray[np.uint64] | dict[int, tuple[int, int]]
"""Where a shard's chunks lie: an ``(n, 2)`` index of ``(offset, nbytes)`` rows by
position (absent rows all ``2**64 - 1``), or ``{chunk id: (offset, nbytes)}``."""


def table_entry(table: ChunkTable, chunk: int) -> tuple[int, int] | None:
    """``(offset, nbytes)`` of a chunk in a table, None where absent."""
    if isinstance(table, dict):
        return table.get(chunk)
    offset, nbytes = table[chunk].tolist()  # Python ints, the cheapest way out of numpy
    return None if offset == 2**64 - 1 else (offset, nbytes)


class ShardFormat(ABC):
    """One binary shard format with its parameters."""

    type_name: ClassVar[str]
    """How configurations name the format (ZEP 2 ``type``, neuroglancer ``@type``)."""

    @property
    def appendable(self) -> bool:
        """Whether new chunk bytes and a new index can be appended after a shard's old
        bytes, the old index becoming dead bytes (``write_strategy="append"``)."""
        return False

    @classmethod
    @abstractmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> Self:
        """The format a configuration describes; ShardingConfigError naming ``where``."""

    def for_array(self, path: str, ndim: int) -> Self:
        """This format, if it can shard the zarr array of rank ``ndim`` at ``path``;
        else ShardingConfigError naming the array (rank, chunks per shard, encoding)."""
        return self

    @abstractmethod
    def to_config(self) -> dict[str, Any]:
        """The configuration :meth:`from_config` reads back."""

    # -- key mapping: where the chunks of a zarr array's grid go (pure) ---------------

    @abstractmethod
    def locate(self, coords: tuple[int, ...], grid_shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """The shard holding the chunk at grid ``coords`` (in the format's own terms: a
        block of the grid, or a shard number) and the chunk's place in it (its index
        position, or its chunk id)."""

    named_shards: ClassVar[bool] = False
    """Whether the format names its shard objects itself (:meth:`shard_file`, below the
    array's shard prefix); else a shard's key is the array's chunk key of its grid block."""

    def shard_file(self, shard: tuple[int, ...]) -> str:
        """The name of the object of ``shard``, where :attr:`named_shards`."""
        raise NotImplementedError(f"{self.type_name} shards are named by their grid block")

    def shard_of_file(self, name: str) -> tuple[int, ...] | None:
        """The shard an object ``name`` below the shard prefix is, where
        :attr:`named_shards` (None: no shard of this format)."""
        raise NotImplementedError(f"{self.type_name} shards are named by their grid block")

    @abstractmethod
    def members(
        self, table: ChunkTable, shard: tuple[int, ...], grid_shape: tuple[int, ...]
    ) -> list[tuple[int, tuple[int, ...]]]:
        """``(place, grid coordinates)`` of every chunk ``table`` lists in ``shard`` that
        lies inside a grid of ``grid_shape`` (other tools may store chunks past its
        edge), in the order of their places."""

    @abstractmethod
    def index_request(self) -> ByteRequest:
        """Where a reader finds the index, without knowing the object's size."""

    @abstractmethod
    def build(self, chunks: Mapping[int, bytes]) -> bytes:
        """One compact shard object holding ``chunks`` (chunk -> stored bytes)."""

    @abstractmethod
    def parse(self, blob: bytes, key: str) -> ChunkTable:
        """Where each chunk's stored bytes lie in a whole shard object, after checking
        it (ShardFormatError naming ``key``)."""

    @abstractmethod
    def split(self, blob: bytes, key: str) -> dict[int, bytes]:
        """The chunks of a whole shard object, after checking it (ShardFormatError
        naming ``key`` for anything inconsistent)."""

    @abstractmethod
    def problems(self, blob: bytes, key: str, chunk_nbytes: int | None = None) -> list[str]:
        """Everything structurally wrong with the shard object ``key``, without
        raising (empty: intact). ``chunk_nbytes``: the size every stored chunk has,
        where the array's codecs fix one."""
