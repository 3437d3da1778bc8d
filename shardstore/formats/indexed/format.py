"""The indexed shard format (ZEP 2 ``type: "indexed"``): pure functions, no I/O.

A shard is the encoded chunks followed (or, with ``index_location="start"``,
preceded) by an index of ``prod(chunks_per_shard)`` little-endian
``(offset, nbytes)`` uint64 pairs in C order, optionally followed by a crc32c
of the index. This is byte-for-byte the ``sharding_indexed`` codec v1.0 format,
so the same objects can be described either by the ZEP 2 storage transformer or
by the codec. Absent chunks have both fields set to ``2**64 - 1``. A chunk is
its position in the index.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import google_crc32c
import numpy as np
import numpy.typing as npt
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest

from shardstore.errors import ShardFormatError, ShardingConfigError
from shardstore.formats.base import (
    EMPTIED,
    Allocate,
    Change,
    ChunkTable,
    ShardFormat,
    TableFigures,
    empty_rows,
)
from shardstore.formats.findings import IMPOSSIBLE, SHOWN, listed
from shardstore.formats.indexed.codec_form import codec_layout_problem, is_codec, to_codec_form

__all__ = [
    "MAX_CHUNKS_PER_SHARD",
    "MISSING",
    "IndexLocation",
    "IndexedFormat",
    "ShardIndex",
    "block_coords",
    "in_grid_positions",
    "index_problem",
    "live_bytes",
    "parse_index_codecs",
    "present_positions",
]

MISSING = 2**64 - 1
MAX_CHUNKS_PER_SHARD = 2**24
"""An index of 2**24 entries is 256 MiB; anything larger cannot sensibly be held in memory."""
_ENTRY_NBYTES = 16
_CHECKSUM_NBYTES = 4
_U64 = np.dtype("<u8")

IndexLocation = Literal["start", "end"]
ShardIndex = npt.NDArray[np.uint64]
"""An ``(n, 2)`` array of ``(offset, nbytes)`` pairs, one row per chunk position."""


def parse_index_codecs(codecs: Any) -> bool | None:
    """Whether the index codecs are ``[bytes(little)]`` (False) or with ``crc32c``
    (True); None for anything else, the only index encodings this format reads."""
    if not isinstance(codecs, list) or not codecs or not is_codec(codecs[0], "bytes"):
        return None
    config = codecs[0].get("configuration") if isinstance(codecs[0], dict) else None
    if isinstance(config, dict) and config.get("endian", "little") != "little":
        return None
    rest = codecs[1:]
    if not rest:
        return False
    if len(rest) == 1 and is_codec(rest[0], "crc32c"):
        return True
    return None


def _checksum_of(config: Mapping[str, Any], where: str) -> bool:
    """Whether the index has a crc32c checksum, by the codec spec's ``index_codecs``
    or by ``index_checksum``, the shorthand older shardstore wrote (both must agree)."""
    flag = config.get("index_checksum")
    if flag is not None and not isinstance(flag, bool):
        raise ShardingConfigError(f"{where}: index_checksum must be true or false, not {flag!r}")
    if "index_codecs" not in config:
        return bool(flag)
    codecs = config["index_codecs"]
    checksum = parse_index_codecs(codecs)
    if checksum is None:
        raise ShardingConfigError(
            f"{where}: unsupported index_codecs {codecs!r}; shardstore reads bytes (little-endian) "
            "optionally followed by crc32c"
        )
    if flag is not None and flag != checksum:
        raise ShardingConfigError(
            f"{where}: index_checksum {str(flag).lower()} contradicts index_codecs {codecs!r}"
        )
    return checksum


@dataclass(frozen=True)
class IndexedFormat(ShardFormat):
    """The indexed format with its parameters: ``chunks_per_shard`` (the shard's
    chunk grid, C order), where the index sits, and whether a crc32c follows it."""

    chunks_per_shard: tuple[int, ...]
    index_location: IndexLocation = "end"
    index_checksum: bool = False

    type_name: ClassVar[str] = "indexed"

    @property
    def appendable(self) -> bool:
        return self.index_location == "end"

    @property
    def grid_block(self) -> tuple[int, ...]:
        return self.chunks_per_shard

    has_codec_form: ClassVar[bool] = True

    def codec_form_problem(self, doc: Mapping[str, Any]) -> str | None:
        return codec_layout_problem(dict(doc))

    def codec_document(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        index = {
            "chunks_per_shard": list(self.chunks_per_shard),
            "index_codecs": self.index_codecs(),
            "index_location": self.index_location,
        }
        return to_codec_form(dict(doc), index)

    def nominal_nbytes(self, chunk_nbytes: int) -> int:
        return self.n_chunks * chunk_nbytes

    def places_in(self, shard: tuple[int, ...], grid_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_grid_positions(grid_shape, self.chunks_per_shard, shard)

    # -- configuration -------------------------------------------------------------

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> IndexedFormat:
        """Read (and check) ``chunks_per_shard``, ``index_location`` and
        ``index_codecs`` (or the ``index_checksum`` shorthand)."""
        if "chunks_per_shard" not in config:
            raise ShardingConfigError(f"{where}: the sharding configuration lacks chunks_per_shard")
        cps = config.get("chunks_per_shard")
        if isinstance(cps, str | bytes) or not isinstance(cps, list | tuple):
            raise ShardingConfigError(f"{where}: chunks_per_shard {cps!r} is not a sequence of integers")
        if any(not isinstance(c, numbers.Integral) or isinstance(c, bool) or c < 1 for c in cps):
            raise ShardingConfigError(f"{where}: chunks_per_shard {list(cps)} must be positive integers")
        cps = [int(c) for c in cps]  # (numpy's integers too)
        n = math.prod(cps)
        if n > MAX_CHUNKS_PER_SHARD:
            raise ShardingConfigError(
                f"{where}: chunks_per_shard {list(cps)} makes {n} chunks per shard, more than "
                f"{MAX_CHUNKS_PER_SHARD} (a {16 * n} byte index is too large to hold in memory)"
            )
        location = config.get("index_location", "end")
        if location not in ("start", "end"):
            raise ShardingConfigError(f"{where}: index_location must be 'start' or 'end', not {location!r}")
        return cls(tuple(cps), location, _checksum_of(config, where))

    def for_array(self, path: str, ndim: int) -> IndexedFormat:
        """This format, if it can shard an array of rank ``ndim`` at ``path`` (and puts
        more than one chunk in a shard), else raise."""
        cps = self.chunks_per_shard
        if len(cps) != ndim:
            raise ShardingConfigError(
                f"array {path or '/'!r}: chunks_per_shard {list(cps)} has {len(cps)} entries, "
                f"the array has {ndim} dimensions"
            )
        if self.n_chunks < 2:
            raise ShardingConfigError(
                f"array {path or '/'!r}: chunks_per_shard {list(cps)} puts one chunk in each shard; "
                "leave the array unsharded instead"
            )
        return self

    def to_config(self) -> dict[str, Any]:
        """The index spelled by the codec spec's names only (a reader that knows only
        ``index_checksum`` fails on shardstore's marker codec anyway)."""
        return {
            "type": self.type_name,
            "chunks_per_shard": list(self.chunks_per_shard),
            "index_location": self.index_location,
            "index_codecs": self.index_codecs(),
        }

    def index_codecs(self) -> list[dict[str, Any]]:
        """Always spelled out: zarr-python assumes ``[bytes, crc32c]`` when they are missing."""
        return [
            {"name": "bytes", "configuration": {"endian": "little"}},
            *([{"name": "crc32c"}] if self.index_checksum else []),
        ]

    # -- geometry ------------------------------------------------------------------

    @property
    def n_chunks(self) -> int:
        return math.prod(self.chunks_per_shard)

    @property
    def index_nbytes(self) -> int:
        return self.n_chunks * _ENTRY_NBYTES + (_CHECKSUM_NBYTES if self.index_checksum else 0)

    # -- key mapping -----------------------------------------------------------------

    def locate(self, coords: tuple[int, ...], grid_shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """Grid coordinates floor-divided by ``chunks_per_shard``, and the C-order index
        position within the block. Plain ints: one key at a time, numpy would cost more
        than the arithmetic."""
        shard: list[int] = []
        position = 0
        for c, n in zip(coords, self.chunks_per_shard, strict=True):
            q, r = divmod(c, n)
            shard.append(q)
            position = position * n + r
        return tuple(shard), position

    def locate_many(
        self, coords: npt.NDArray[np.int64], grid_shape: tuple[int, ...]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        shards, local = np.divmod(coords, np.asarray(self.chunks_per_shard, dtype=np.int64))
        return shards, np.ravel_multi_index(tuple(local.T), self.chunks_per_shard).astype(np.int64)

    def members(
        self, table: ChunkTable, shard: tuple[int, ...], grid_shape: tuple[int, ...]
    ) -> list[tuple[int, tuple[int, ...]]]:
        assert not isinstance(table, dict)
        positions = present_positions(table)
        inside = in_grid_positions(grid_shape, self.chunks_per_shard, shard)
        if len(inside) < self.n_chunks:
            positions = positions[np.isin(positions, inside)]
        grid = block_coords(shard, self.chunks_per_shard)[positions]
        return [(int(p), tuple(c)) for p, c in zip(positions.tolist(), grid.tolist(), strict=True)]

    def index_request(self) -> ByteRequest:
        if self.index_location == "start":
            return RangeByteRequest(0, self.index_nbytes)
        return SuffixByteRequest(self.index_nbytes)

    def data_bounds(self, shard_nbytes: int) -> tuple[int, int]:
        """The byte range of a shard of that size that chunks may occupy."""
        if self.index_location == "start":
            return self.index_nbytes, shard_nbytes
        return 0, shard_nbytes - self.index_nbytes

    def index_slice(self, shard_nbytes: int) -> slice:
        if self.index_location == "start":
            return slice(0, self.index_nbytes)
        return slice(shard_nbytes - self.index_nbytes, shard_nbytes)

    # -- the index -----------------------------------------------------------------

    def empty_index(self) -> ShardIndex:
        return np.full((self.n_chunks, 2), MISSING, dtype=np.uint64)

    def empty_table(self) -> ShardIndex:
        return self.empty_index()

    def table_places(self, table: ChunkTable) -> npt.NDArray[np.uint64]:
        assert not isinstance(table, dict)
        return present_positions(table).astype(np.uint64)

    def check_table(self, table: ChunkTable, nbytes: int, key: str) -> None:
        assert not isinstance(table, dict)
        self.check_ranges(table, nbytes, key)

    def check_tables(self, tables: Sequence[ChunkTable], nbytes: Sequence[int], keys: Sequence[str]) -> None:
        # check_ranges of them all with numpy at once; a bad one checked again alone, to say what
        if len(tables) < 2:
            super().check_tables(tables, nbytes, keys)
            return
        stacked = np.stack([cast(ShardIndex, table) for table in tables])
        bounds = np.maximum(np.array([self.data_bounds(size) for size in nbytes], dtype=np.int64), 0)
        lo, hi = bounds.astype(np.uint64)[:, :1], bounds.astype(np.uint64)[:, 1:]
        offsets, sizes = stacked[..., 0], stacked[..., 1]
        bad = (offsets != MISSING) & (
            (offsets < lo) | (offsets > hi) | (sizes > hi - np.minimum(offsets, hi))
        )
        for k in np.flatnonzero(bad.any(axis=1)).tolist():
            self.check_ranges(cast(ShardIndex, tables[k]), nbytes[k], keys[k])

    def table_figures(self, table: ChunkTable, nbytes: int) -> TableFigures:
        assert not isinstance(table, dict)
        live = live_bytes(table)
        return TableFigures(int((table[:, 0] != MISSING).sum()), live, nbytes - self.index_nbytes - live)

    def append_after(
        self, nbytes: int, read: Callable[[int, int], bytes], changes: Mapping[int, Change], key: str
    ) -> bytes | None:
        if nbytes < self.index_nbytes:
            self.split(read(0, nbytes), key)  # raises: too short for its index
        index = self.decode_index(read(nbytes - self.index_nbytes, nbytes), key)
        self.check_ranges(index, nbytes, key)
        new_index, parts, offset = index.copy(), [], nbytes
        for pos, (needs_old, make) in changes.items():
            offset_old, nbytes_old = index[pos].tolist()
            old = read(offset_old, offset_old + nbytes_old) if offset_old != MISSING and needs_old else None
            value = make(old)
            if value is None:
                new_index[pos] = (MISSING, MISSING)
            else:
                new_index[pos] = (offset, len(value))
                parts.append(value)
                offset += len(value)
        if np.array_equal(new_index, index):
            return None
        if (new_index[:, 0] == MISSING).all():
            return EMPTIED
        return b"".join(parts) + self.encode_index(new_index)

    def encode_index(self, index: ShardIndex) -> bytes:
        raw = np.ascontiguousarray(index, dtype=_U64).tobytes()
        if self.index_checksum:
            raw += google_crc32c.value(raw).to_bytes(_CHECKSUM_NBYTES, "little")
        return raw

    def decode_index(self, raw: bytes | memoryview, key: str) -> ShardIndex:
        """Parse and check an index read from shard ``key`` (pairs and checksum only).

        Ranges can only be checked against the shard's size, see :meth:`check_ranges`.
        """
        index = self._pairs(raw, key)
        _check_consistent(index, key)
        return index

    def _pairs(self, raw: bytes | memoryview, key: str) -> ShardIndex:
        """The index read from shard ``key`` as ``(offset, nbytes)`` rows, its size and
        checksum checked (its entries not yet)."""
        return np.frombuffer(self._entries(raw, key), dtype=_U64).reshape(self.n_chunks, 2).astype(np.uint64)

    def read_parts(
        self, parts: Sequence[int], raws: Sequence[bytes | memoryview], keys: Sequence[str]
    ) -> list[ChunkTable | RangeByteRequest]:
        # (each part a shard's one index) decode_index of them all, its checks made with
        # numpy over all of them at once: a slab's eight indices cost eight times
        # a dozen small numpy calls otherwise; those that may be inconsistent are
        # decoded again one by one, which says what is wrong
        if len(raws) < 2:
            return super().read_parts(parts, raws, keys)
        try:
            joined = b"".join(self._entries(raw, key) for raw, key in zip(raws, keys, strict=True))
        except ShardFormatError:  # (one cut short, or its checksum wrong: one by one says which first)
            return super().read_parts(parts, raws, keys)
        stacked = np.frombuffer(joined, dtype=_U64).reshape(len(raws), self.n_chunks, 2).astype(np.uint64)
        tables: list[ChunkTable | RangeByteRequest] = list(stacked)
        for k in np.flatnonzero(_maybe_inconsistent(stacked)).tolist():
            tables[k] = self.decode_index(raws[k], keys[k])
        return tables

    def _entries(self, raw: bytes | memoryview, key: str) -> memoryview:
        """The pairs of an index read from shard ``key``, its size and checksum checked."""
        if len(raw) != self.index_nbytes:
            raise ShardFormatError(
                f"shard {key!r}: expected an index of {self.index_nbytes} bytes, "
                f"found {len(raw)} (object truncated or not a shard of this array)"
            )
        entries = memoryview(raw)[: self.n_chunks * _ENTRY_NBYTES]
        if self.index_checksum:
            stored = int.from_bytes(bytes(raw[-_CHECKSUM_NBYTES:]), "little")
            actual = google_crc32c.value(bytes(entries))
            if stored != actual:
                raise ShardFormatError(
                    f"shard {key!r}: index checksum mismatch (stored {stored:#010x}, computed "
                    f"{actual:#010x}); {_CUT_OR_OVERWRITTEN}"
                )
        return entries

    def check_ranges(self, index: ShardIndex, shard_nbytes: int, key: str) -> None:
        """Raise unless every present chunk lies inside the shard's data area."""
        lo, hi = self.data_bounds(shard_nbytes)
        offsets, nbytes = index[:, 0], index[:, 1]
        present = offsets != MISSING
        # Compare as ``nbytes > hi - offset`` so that huge values cannot overflow.
        hi_u = np.uint64(max(hi, 0))
        bad = present & (
            (offsets < np.uint64(lo)) | (offsets > hi_u) | (nbytes > hi_u - np.minimum(offsets, hi_u))
        )
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            raise ShardFormatError(
                f"shard {key!r}: chunk {pos} claims bytes [{int(offsets[pos])}, "
                f"{int(offsets[pos]) + int(nbytes[pos])}) outside the data area [{lo}, {hi}) "
                f"of a {shard_nbytes}-byte shard; {_CUT_OR_OVERWRITTEN}"
            )

    # -- whole shards --------------------------------------------------------------

    def parse(self, blob: bytes | memoryview, key: str) -> ShardIndex:
        """The checked index of a whole shard object (read from its tail, or head)."""
        if len(blob) < self.index_nbytes:
            raise ShardFormatError(
                f"shard {key!r}: object has {len(blob)} bytes, fewer than its {self.index_nbytes}-byte index"
            )
        index = self._pairs(memoryview(blob)[self.index_slice(len(blob))], key)
        if not _in_order_within(index, *self.data_bounds(len(blob))):
            _check_consistent(index, key)  # (what is wrong, said as an index read alone says it)
            self.check_ranges(index, len(blob), key)
        return index

    def split(self, blob: bytes, key: str) -> dict[int, bytes]:
        index = self.parse(blob, key)
        return {
            int(pos): blob[int(index[pos, 0]) : int(index[pos, 0]) + int(index[pos, 1])]
            for pos in present_positions(index)
        }

    def build(self, chunks: Mapping[int, bytes | memoryview]) -> bytes:
        """A compact shard holding ``chunks`` (position -> encoded bytes) in position order."""
        # one join: the shard's bytes are copied once (a shard is megabytes, each copy costs)
        return b"".join(self.pieces(chunks))

    def pieces(self, chunks: Mapping[int, bytes | memoryview]) -> list[bytes | memoryview]:
        """:meth:`build`'s object as its index and its chunks, in the order they lie."""
        positions = sorted(chunks)
        parts = [chunks[p] for p in positions]
        sizes = np.fromiter(map(len, parts), dtype=np.uint64, count=len(parts))
        start = self.index_location == "start"
        offsets = np.cumsum(sizes, dtype=np.uint64) - sizes + np.uint64(self.index_nbytes if start else 0)
        index = self.empty_index()
        if positions:
            index[positions, 0] = offsets
            index[positions, 1] = sizes
        raw_index = self.encode_index(index)
        return [raw_index, *parts] if start else [*parts, raw_index]

    def dense_shards(
        self, chunk_nbytes: int, count: int, empty: Allocate = empty_rows
    ) -> list[tuple[memoryview, memoryview]]:
        # One allocation for all of them: from 4 MiB numpy asks the kernel for huge
        # pages, and a fresh shard's memory then costs a few page faults, not 256 a MiB.
        data_nbytes = self.n_chunks * chunk_nbytes
        nbytes = data_nbytes + self.index_nbytes
        start = self.index_nbytes if self.index_location == "start" else 0
        index = self.empty_index()
        index[:, 0] = np.arange(self.n_chunks, dtype=np.uint64) * np.uint64(chunk_nbytes) + np.uint64(start)
        index[:, 1] = chunk_nbytes
        raw_index = np.frombuffer(self.encode_index(index), dtype=np.uint8)
        where = self.index_slice(nbytes)
        objects = empty(count, nbytes)
        objects[:, where] = raw_index
        return [(memoryview(one), memoryview(one)[start : start + data_nbytes]) for one in objects]

    def problems(self, blob: bytes, key: str, chunk_nbytes: int | None = None) -> list[str]:
        """Each distinct problem once, naming its entries."""
        if len(blob) < self.index_nbytes:
            return [f"truncated: {len(blob)} bytes, shorter than the {self.index_nbytes}-byte index alone"]
        raw = blob[self.index_slice(len(blob))]
        entries = np.frombuffer(raw, dtype="<u8", count=2 * self.n_chunks).reshape(-1, 2).astype(np.uint64)
        found = []
        if self.encode_index(entries) != raw:
            found.append("index checksum mismatch: the index bytes are damaged")
        return found + _entry_problems(self, entries, len(blob), chunk_nbytes)


def _entry_masks(index: ShardIndex) -> tuple[npt.NDArray[np.bool_], ...]:
    """Entries present, half-empty (one field marked absent), and absurdly large (of
    one index, or of several stacked)."""
    offsets, sizes = index[..., 0], index[..., 1]
    present = offsets != MISSING
    half = present != (sizes != MISSING)
    return present, half, present & ~half & ((offsets >= IMPOSSIBLE) | (sizes >= IMPOSSIBLE))


def _entry_problems(
    fmt: IndexedFormat, index: ShardIndex, nbytes: int, chunk_nbytes: int | None
) -> list[str]:
    offsets, sizes = index[:, 0], index[:, 1]
    present, half, impossible = _entry_masks(index)
    sane = present & ~half & ~impossible
    ends = np.where(sane, offsets, 0) + np.where(sane, sizes, 0)  # no overflow: both below 2**53
    lo, hi = fmt.data_bounds(nbytes)
    past_end = sane & (ends > nbytes)
    empty = sane & (sizes == 0)
    rules = [
        (half, "entries with only one of offset/nbytes marked empty"),
        (impossible, f"impossible ranges (beyond {IMPOSSIBLE:,} bytes)"),
        (past_end, f"truncated: the object ({nbytes} bytes) is shorter than its index says"),
        (sane & ~past_end & ((offsets < lo) | (ends > hi)), f"ranges into the index (data: [{lo}, {hi}))"),
        (empty, "zero-length entries: no codec decodes an empty chunk"),
    ]
    if chunk_nbytes is not None:
        every = f"every chunk of this array encodes to {chunk_nbytes} bytes"
        rules.append((sane & ~empty & (sizes < chunk_nbytes), f"short entries ({every})"))
        rules.append((sane & (sizes > chunk_nbytes), f"long entries ({every})"))
    named = [f"{what}: {_entries(index, mask)}" for mask, what in rules if mask.any()]
    return named + _overlaps(index, np.flatnonzero(sane & ~empty))


def _entry(index: ShardIndex, position: int) -> str:
    return f"chunk {position} (offset {int(index[position, 0])}, nbytes {int(index[position, 1])})"


def _entries(index: ShardIndex, mask: npt.NDArray[np.bool_]) -> str:
    where = np.flatnonzero(mask)
    return listed([_entry(index, int(p)) for p in where[:SHOWN]], len(where))


def _overlaps(index: ShardIndex, positions: npt.NDArray[np.intp]) -> list[str]:
    """Chunks whose ranges share bytes with an earlier one's (each chunk owns its bytes)."""
    if len(positions) < 2:
        return []
    order = positions[np.lexsort((index[positions, 1], index[positions, 0]))]
    starts = index[order, 0]
    ends = starts + index[order, 1]
    reach = np.maximum.accumulate(ends)
    # the chunk reaching furthest so far: the one a later start runs into
    furthest = np.maximum.accumulate(np.where(ends == reach, np.arange(len(order)), 0))
    hits = np.flatnonzero(starts[1:] < reach[:-1]) + 1
    kinds: dict[str, list[tuple[int, int]]] = {"duplicated entries": [], "overlapping ranges": []}
    for i in hits.tolist():
        a, b = int(order[int(furthest[i - 1])]), int(order[i])
        kinds["duplicated entries" if (index[a] == index[b]).all() else "overlapping ranges"].append((a, b))
    return [
        f"{what}: "
        + listed([f"{_entry(index, a)} and {_entry(index, b)}" for a, b in found[:SHOWN]], len(found))
        for what, found in kinds.items()
        if found
    ]


def index_problem(index: ShardIndex) -> str | None:
    """What makes an index inconsistent in itself, whatever the shard's size (None:
    nothing): an entry with one field marked empty, an absurdly large range, or
    ranges of two chunks sharing bytes (each chunk owns its bytes). Empty chunks
    are data here; :meth:`IndexedFormat.problems` also judges them, and the object's size."""
    present, half, impossible = _entry_masks(index)
    if half.any():
        return f"entries with only one of offset/nbytes marked empty: {_entries(index, half)}"
    if impossible.any():
        return f"impossible ranges (beyond {IMPOSSIBLE:,} bytes): {_entries(index, impossible)}"
    rows = index[present]
    if (rows[1:, 0] >= rows[:-1, 0] + rows[:-1, 1]).all():
        return None  # each range after the one before it (as written): none shares a byte
    # an empty range counts too: inside another chunk's bytes it is no chunk of its own
    overlaps = _overlaps(index, np.flatnonzero(present))
    return overlaps[0] if overlaps else None


_CUT_OR_OVERWRITTEN = "the index is damaged, as in a shard cut short or overwritten"
"""Said with every index that cannot be a writer's: the index of a shard cut short is
read from the wrong bytes, and its entries then say anything."""


def _check_consistent(index: ShardIndex, key: str) -> None:
    """Raise unless the index of shard ``key`` is consistent in itself (see :func:`index_problem`)."""
    problem = index_problem(index)
    if problem is not None:
        raise ShardFormatError(f"shard {key!r}: {problem}; {_CUT_OR_OVERWRITTEN}")


def _in_order_within(index: ShardIndex, lo: int, hi: int) -> bool:
    """Whether every chunk of ``index`` is present and lies after the one before it,
    all inside ``[lo, hi)``, as a writer lays a shard out: then :func:`index_problem`
    and :meth:`IndexedFormat.check_ranges` find nothing. Checked with four numpy calls
    instead of their two dozen: a whole read parses every shard's index on the
    threads that share the read (False: check it the long way)."""
    if not len(index) or int(np.max(index)) >= IMPOSSIBLE:  # (absent entries hold 2**64 - 1)
        return False
    ends = index[:, 0] + index[:, 1]
    return int(index[0, 0]) >= lo and int(ends[-1]) <= hi and bool((index[1:, 0] >= ends[:-1]).all())


def _maybe_inconsistent(indices: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
    """For indices stacked ``(n, chunks, 2)``: whether :func:`index_problem` may find
    something in each (it finds nothing where this is False): an entry half empty or
    absurdly large, or a range that does not lie after every one before it."""
    present, half, impossible = _entry_masks(indices)
    sane = present & ~half & ~impossible
    offsets = np.where(sane, indices[..., 0], 0)
    reach = np.maximum.accumulate(offsets + np.where(sane, indices[..., 1], 0), axis=-1)
    before = np.concatenate([np.zeros_like(reach[:, :1]), reach[:, :-1]], axis=-1)
    return (half | impossible | (sane & (offsets < before))).any(axis=-1)


def present_positions(index: ShardIndex) -> npt.NDArray[np.intp]:
    return np.flatnonzero(index[:, 0] != MISSING)


def live_bytes(index: ShardIndex) -> int:
    """Bytes covered by the index's chunk ranges, overlaps counted once."""
    present = index[index[:, 0] != MISSING]
    if len(present) == 0:
        return 0
    order = np.argsort(present[:, 0])
    starts = present[order, 0].astype(np.int64)
    ends = starts + present[order, 1].astype(np.int64)
    reach = np.maximum.accumulate(ends)
    # a range starts a new run where it begins past everything before it
    new_run = np.concatenate([[True], starts[1:] > reach[:-1]])
    run_ends = np.maximum.reduceat(ends, np.flatnonzero(new_run))
    return int((run_ends - starts[new_run]).sum())


def block_coords(shard: tuple[int, ...], chunks_per_shard: tuple[int, ...]) -> npt.NDArray[np.int64]:
    """Grid coordinates of every position of the block ``shard``, one row per position
    in C order."""
    local = np.indices(chunks_per_shard, dtype=np.int64).reshape(len(chunks_per_shard), -1).T
    return local + np.asarray(shard, dtype=np.int64) * np.asarray(chunks_per_shard, dtype=np.int64)


@functools.lru_cache(maxsize=4096)
def in_grid_positions(
    grid_shape: tuple[int, ...], chunks_per_shard: tuple[int, ...], shard: tuple[int, ...]
) -> tuple[int, ...]:
    """Index positions of the block ``shard`` that lie inside a grid of ``grid_shape``."""
    inside = np.all(block_coords(shard, chunks_per_shard) < np.asarray(grid_shape, dtype=np.int64), axis=1)
    return tuple(int(p) for p in np.flatnonzero(inside))
