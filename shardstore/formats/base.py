"""The shard-format interface: what the read, write and maintenance paths ask of
a binary shard format, so that a second format plugs in beside the first.

A format turns the chunks of one shard (an ``int`` each: an index position, or
a uint64 chunk id; bytes as the layer above hands them over) into one object
and back, says where a reader finds the parts of the object's index that locate
given chunks, maps a zarr array's chunk grid onto shards, and round-trips its own
configuration (the ``configuration`` of a ZEP 2 ``type``, or neuroglancer's
``sharding`` object). Implementations are frozen dataclasses of pure methods: no
I/O. The layers above ask a format what they need through this interface, never
which format it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Self, TypeAlias

import numpy as np
import numpy.typing as npt
from zarr.abc.store import ByteRequest, RangeByteRequest

from shardstore.errors import ShardingConfigError

__all__ = [
    "ABSENT",
    "EMPTIED",
    "Change",
    "ChunkTable",
    "ShardFormat",
    "TableFigures",
    "table_entry",
    "table_rows",
]

ChunkTable: TypeAlias = npt.NDArray[np.uint64] | dict[int, tuple[int, int]]
"""Where a shard's chunks lie: an ``(n, 2)`` index of ``(offset, nbytes)`` rows by
position (absent rows all ``2**64 - 1``), or ``{chunk id: (offset, nbytes)}``."""


Change: TypeAlias = tuple[bool, Callable[[bytes | None], bytes | memoryview | None]]
"""A change to one chunk: whether it needs the old bytes, and the new value it makes of
them (None: no chunk)."""
EMPTIED = b"<emptied>"
"""What :meth:`ShardFormat.append_after` returns when no chunk would be left (compared by
identity)."""


ABSENT = 2**64 - 1
"""The offset a table row has where its chunk is absent."""


def table_entry(table: ChunkTable, chunk: int) -> tuple[int, int] | None:
    """``(offset, nbytes)`` of a chunk in a table, None where absent."""
    if isinstance(table, dict):
        return table.get(chunk)
    offset, nbytes = table[chunk].tolist()  # Python ints, the cheapest way out of numpy
    return None if offset == ABSENT else (offset, nbytes)


def table_rows(table: ChunkTable, places: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.uint64]:
    """``(offset, nbytes)`` of the chunks at ``places`` in a table, as one ``(n, 2)``
    array; offset :data:`ABSENT` where a chunk is absent."""
    if isinstance(table, np.ndarray):
        picked: npt.NDArray[np.uint64] = table[places]
        return picked
    rows = np.full((len(places), 2), ABSENT, dtype=np.uint64)
    for row, place in enumerate(places.tolist()):
        if (entry := table.get(place)) is not None:
            rows[row] = entry
    return rows


Allocate: TypeAlias = Callable[[int, int], npt.NDArray[np.uint8]]
"""``(count, nbytes)``: an array of ``count`` rows of ``nbytes`` bytes, contents undefined."""


def empty_rows(count: int, nbytes: int) -> npt.NDArray[np.uint8]:
    """New memory (:data:`Allocate`): one allocation for all the rows, for which numpy
    asks the kernel for huge pages from 4 MiB."""
    return np.empty((count, nbytes), dtype=np.uint8)


class TableFigures(NamedTuple):
    """What a shard's table says of the object: chunks listed, their bytes, and the
    bytes that are neither chunks nor the index (left by appends)."""

    chunks: int
    live: int
    dead: int


class ShardFormat(ABC):
    """One binary shard format with its parameters."""

    type_name: ClassVar[str]
    """How configurations name the format (ZEP 2 ``type``, neuroglancer ``@type``)."""

    @property
    def appendable(self) -> bool:
        """Whether new chunk bytes and a new index can be appended after a shard's old
        bytes, the old index becoming dead bytes (``write_strategy="append"``; such a
        format implements :meth:`append_index`)."""
        return False

    @property
    def grid_block(self) -> tuple[int, ...] | None:
        """The block of a zarr array's chunk grid that one shard holds (the user's
        ``chunks_per_shard``); None where shards hold chunks by id, spread over the grid."""
        return None

    places_follow_grid: ClassVar[bool] = False
    """Whether a chunk's place (its id) is numbered from its position in the grid's
    shape, so that a resize may renumber stored chunks (:meth:`renumbers`)."""

    def renumbers(self, old_grid: tuple[int, ...], new_grid: tuple[int, ...]) -> bool:
        """Whether a grid of ``old_grid`` chunks resized to ``new_grid`` gives stored
        chunks other places."""
        return False

    def renumbered(
        self, places: npt.NDArray[np.uint64], old_grid: tuple[int, ...], new_grid: tuple[int, ...]
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.uint64]]:
        """Chunks at ``places`` of the old grid in the resized one: ``(kept, new)``,
        ``kept`` marking those whose position lies in both grids, ``new`` their places."""
        return np.ones(len(places), dtype=bool), places

    def in_subdirectory(self, directory: str) -> Self:
        """This format with an array's shard objects in ``directory`` below its chunk
        prefix (a renumbering resize writes the moved chunks there: formats whose places
        follow the grid)."""
        raise NotImplementedError(f"{self.type_name} shards stay where their grid blocks are")

    def shards_of(self, places: Sequence[int]) -> list[tuple[int, ...]]:
        """The shard of each place, where places alone say it (chunk ids)."""
        raise NotImplementedError(f"{self.type_name} places are positions within a shard")

    has_codec_form: ClassVar[bool] = False
    """Whether zarr's standard sharding codec can describe this format's shards
    (``layout="codec"``): then :meth:`codec_document` gives that metadata."""

    def codec_form_problem(self, doc: Mapping[str, Any]) -> str | None:
        """Why zarr's sharding codec cannot describe the array of document ``doc`` (None:
        it can), said to follow "layout='codec'"."""
        return f"describes only the indexed shard format, not {self.type_name!r}"

    def codec_document(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """A plain zarr v3 array document with its sharding recorded as zarr's standard
        sharding codec (the layout plain readers read)."""
        raise ShardingConfigError(
            f"layout 'codec' describes only the indexed shard format, not {self.type_name!r}"
        )

    @property
    def subdirectory(self) -> str:
        """The directory below an array's chunk prefix that its shard objects are in
        ("": the chunk prefix itself)."""
        return ""

    def nominal_nbytes(self, chunk_nbytes: int) -> int | None:
        """A full shard's bytes before compression, for chunks of ``chunk_nbytes`` (None
        where the format does not fix how many chunks a shard holds)."""
        return None

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

    def locate_many(
        self, coords: npt.NDArray[np.int64], grid_shape: tuple[int, ...]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
        """:meth:`locate` of many chunks at once (``coords`` one row per chunk): their
        shards (rows) and places; None where the format locates chunks one at a time."""
        return None

    named_shards: ClassVar[bool] = False
    """Whether the format names its shard objects itself (:meth:`shard_file`, below the
    array's shard prefix); else a shard's key is the array's chunk key of its grid block."""

    def places_in(self, shard: tuple[int, ...], grid_shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """The places of every chunk of ``shard`` that lies inside a grid of
        ``grid_shape`` (None where they are spread over the grid: not enumerated)."""
        return None

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
        """Where a reader finds the (first-level) index, without knowing the object's size."""

    # -- the table: where a shard's chunks lie, read a part at a time ----------------

    def empty_table(self) -> ChunkTable:
        """The table of a shard that holds nothing."""
        return {}

    one_index: ClassVar[bool] = True
    """Whether one index (at :meth:`index_request`) locates every chunk of a shard; else
    a chunk is located through a part of the index: its entry in a first-level index
    (:meth:`part_request`), then that part's own index (:meth:`read_part`)."""

    def index_parts(self, places: Sequence[int]) -> list[int]:
        """The part of a shard's index that locates each place (one index: part 0)."""
        return [0] * len(places)

    def part_request(self, part: int) -> ByteRequest:
        """Where a part's first level lies (one index: :meth:`index_request`)."""
        return self.index_request()

    def read_part(self, part: int, raw: bytes | memoryview, key: str) -> ChunkTable | RangeByteRequest:
        """A part's table from its first level, or where its second level lies (then
        :meth:`decode_part`); ShardFormatError naming ``key`` for damage."""
        return self.decode_index(raw, key)

    def read_parts(
        self, parts: Sequence[int], raws: Sequence[bytes | memoryview], keys: Sequence[str]
    ) -> list[ChunkTable | RangeByteRequest]:
        """:meth:`read_part` of several shards' parts at once (a format may check them
        all in one go); the first damaged one, in order, raises as it would."""
        return [self.read_part(part, raw, key) for part, raw, key in zip(parts, raws, keys, strict=True)]

    def decode_part(self, part: int, raw: bytes | memoryview, key: str) -> ChunkTable:
        """A part's table from its second level (formats of more than one index)."""
        raise NotImplementedError(f"{self.type_name} shards have one index")

    def decode_index(self, raw: bytes | memoryview, key: str) -> ChunkTable:
        """The table a shard's one index holds (ShardFormatError naming ``key``)."""
        raise NotImplementedError(f"{self.type_name} shards locate chunks by parts of their index")

    @abstractmethod
    def table_places(self, table: ChunkTable) -> npt.NDArray[np.uint64]:
        """Every place ``table`` lists a chunk at, in ascending order."""

    @abstractmethod
    def check_table(self, table: ChunkTable, nbytes: int, key: str) -> None:
        """Raise ShardFormatError naming ``key`` if ``table`` locates anything outside an
        object of ``nbytes``."""

    def check_tables(self, tables: Sequence[ChunkTable], nbytes: Sequence[int], keys: Sequence[str]) -> None:
        """:meth:`check_table` of several shards at once; the first bad one, in order,
        raises as it would."""
        for table, size, key in zip(tables, nbytes, keys, strict=True):
            self.check_table(table, size, key)

    @abstractmethod
    def table_figures(self, table: ChunkTable, nbytes: int) -> TableFigures:
        """Chunks, live bytes and dead bytes of an object of ``nbytes`` with ``table``."""

    def append_after(
        self, nbytes: int, read: Callable[[int, int], bytes], changes: Mapping[int, Change], key: str
    ) -> bytes | None:
        """What to append to the shard ``key`` of ``nbytes`` bytes (``read(start, stop)``
        reads it) so that its new index gives each place in ``changes`` the value its
        change makes of the old one: new chunk bytes and a new index (appendable formats;
        the old index becomes dead bytes). None: nothing changes; :data:`EMPTIED`: no
        chunk would be left (the shard is to be deleted instead). ShardFormatError names
        ``key`` for damage."""
        raise NotImplementedError(f"{self.type_name} shards are not appended to")

    @abstractmethod
    def build(self, chunks: Mapping[int, bytes | memoryview]) -> bytes:
        """One compact shard object holding ``chunks`` (chunk -> stored bytes)."""

    def pieces(self, chunks: Mapping[int, bytes | memoryview]) -> list[bytes | memoryview]:
        """The object :meth:`build` gives, as pieces to write one after another: where the
        format lays chunks out as they are, the chunks themselves, not copied into one
        object (a local file takes them in one system call)."""
        return [self.build(chunks)]

    def dense_shards(
        self, chunk_nbytes: int, count: int, empty: Allocate = empty_rows
    ) -> list[tuple[memoryview, memoryview]] | None:
        """``count`` new shard objects in each of which every chunk is present and
        ``chunk_nbytes`` long, stored in chunk order, with the index written; each with
        a writable view of its data area for the caller to fill (chunk ``p`` at
        ``p * chunk_nbytes``), all in rows of one array ``empty`` gives. Chunks stored
        raw go straight into the object, not through :meth:`build`'s copy. None where
        the format lays shards out otherwise."""
        return None

    @abstractmethod
    def parse(self, blob: bytes | memoryview, key: str) -> ChunkTable:
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
