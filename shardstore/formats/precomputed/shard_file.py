"""The neuroglancer precomputed sharded format (``neuroglancer_uint64_sharded_v1``): pure functions, no I/O.

A uint64 chunk id is shifted right by ``preshift_bits`` and hashed (identity or
MurmurHash3_x86_128); the low ``minishard_bits`` of the hash name a minishard and
the next ``shard_bits`` a shard, stored as one ``<shard>.shard`` file. A shard file
is a shard index of ``2**minishard_bits`` little-endian uint64 ``(start, end)`` pairs
locating each minishard's index, then, minishard after minishard, that minishard's
chunk data followed by its minishard index: the layout tensorstore writes. Every
byte range is relative to the end of the shard index.

A minishard index is a C-order ``[3, n]`` uint64 LE array: delta-encoded chunk ids,
offsets delta-encoded against the end of the previous chunk (the first against the
end of the shard index), and sizes. ``gzip`` is exactly one gzip member (a zlib
stream, trailing bytes or a second member are refused), as tensorstore reads it;
it is written at level 9 with the header tensorstore writes (mtime 0). The deflate
bytes themselves can differ from tensorstore's (another deflate implementation):
the layout matches byte for byte, gzip streams decode to the same bytes.
"""

from __future__ import annotations

import itertools
import operator
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from shardstore.errors import ShardFormatError
from shardstore.formats.findings import IMPOSSIBLE, SHOWN, listed
from shardstore.formats.precomputed.ids import locate_ids, shard_number_of_name
from shardstore.formats.precomputed.params import Encoding, ShardingParams

__all__ = [
    "MAX_DECODED_NBYTES",
    "build_shard",
    "decode_chunk",
    "decode_minishard_index",
    "decode_shard_index",
    "minishard_index_range",
    "parse_shard",
    "shard_problems",
    "split_shard",
]

MAX_DECODED_NBYTES: Final = 1 << 30
"""Most bytes one gzip-encoded chunk or minishard index may inflate to: far above any
real one, and it keeps a damaged (or hostile) stream from exhausting memory."""
_GZIP_LEVEL: Final = 9
_GZIP_WBITS: Final = 31  # 16 + 15: gzip header and trailer, as tensorstore's zlib uses
_U64: Final = np.dtype("<u8")

# -- encodings -----------------------------------------------------------------------


class _Problem(Exception):
    """One thing wrong with a shard, without the key (the public functions add it)."""


def _encode(data: bytes | memoryview, encoding: Encoding) -> bytes:
    if encoding == "raw":
        return bytes(data)
    compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
    return compressor.compress(data) + compressor.flush()


def _decode(stored: bytes | memoryview, encoding: Encoding, limit: int) -> bytes:
    """Inflate exactly one gzip member, no more than ``limit`` bytes of output."""
    if encoding == "raw":
        return bytes(stored)
    inflater = zlib.decompressobj(_GZIP_WBITS)
    try:
        out = inflater.decompress(stored, limit + 1)
    except zlib.error as e:
        raise _Problem(f"not a valid gzip stream ({e})") from None
    if len(out) > limit:
        raise _Problem(f"gzip stream inflates to more than {limit} bytes")
    if not inflater.eof:
        raise _Problem(f"gzip stream truncated ({len(stored)} bytes)")
    if inflater.unused_data:
        raise _Problem(f"{len(inflater.unused_data)} bytes follow the gzip stream")
    return out


def _encode_minishard_index(
    ids: npt.NDArray[np.uint64], starts: npt.NDArray[np.uint64], sizes: npt.NDArray[np.uint64]
) -> bytes:
    """Sorted ids and their ranges (relative to the shard index end) as the ``[3, n]``
    delta-encoded table; the first offset is against 0, the end of the shard index."""
    ends = starts + sizes
    previous_ends = np.concatenate([np.zeros(1, np.uint64), ends[:-1]])
    table = np.stack([np.diff(ids, prepend=np.uint64(0)), starts - previous_ends, sizes])
    return table.astype(_U64).tobytes()


def _decode_minishard_index(sharding: ShardingParams, raw: bytes | memoryview) -> npt.NDArray[np.uint64]:
    """``(n, 3)`` rows of ``(id, absolute offset, nbytes)``; _Problem for anything wrong.

    Offsets add up modulo 2**64, as tensorstore and neuroglancer add them, so a chunk
    stored before its predecessor (a "negative" delta) is read as they read it.
    """
    data = _decode(raw, sharding.minishard_index_encoding, MAX_DECODED_NBYTES)
    if len(data) % 24:
        raise _Problem(f"decoded length {len(data)} is not a multiple of 24 (3 uint64 per chunk)")
    n = len(data) // 24
    table = np.frombuffer(data, dtype=_U64).reshape(3, n).astype(np.uint64)
    ids = np.cumsum(table[0], dtype=np.uint64)
    falls = np.flatnonzero(ids[1:] <= ids[:-1])
    if falls.size:
        i = int(falls[0]) + 1
        raise _Problem(
            f"chunk ids not strictly increasing: entry {i} (delta {int(table[0, i])}) gives id "
            f"{int(ids[i])} after {int(ids[i - 1])}"
        )
    sizes = table[2]
    steps = np.empty(2 * n, dtype=np.uint64)
    steps[0::2] = table[1]
    steps[1::2] = sizes
    starts = np.cumsum(steps, dtype=np.uint64)[0::2]  # wraps like tensorstore's uint64 sum
    limit = np.uint64(IMPOSSIBLE - sharding.shard_index_nbytes)
    absurd = np.flatnonzero((starts > limit) | (sizes > limit) | (sizes > limit - np.minimum(starts, limit)))
    if absurd.size:
        i = int(absurd[0])
        raise _Problem(
            f"entry {i} (chunk {int(ids[i])}) has an impossible byte range: offset {int(starts[i])} "
            f"(delta {int(table[1, i])}), size {int(sizes[i])}"
        )
    return np.stack([ids, starts + np.uint64(sharding.shard_index_nbytes), sizes], axis=1)


def _shard_index_table(sharding: ShardingParams, raw: bytes | memoryview) -> npt.NDArray[np.uint64]:
    return np.frombuffer(raw, dtype=_U64, count=2 * sharding.num_minishards).reshape(-1, 2).astype(np.uint64)


def _minishards(table: npt.NDArray[np.uint64], mask: npt.NDArray[np.bool_]) -> str:
    where = np.flatnonzero(mask)
    shown = [f"minishard {int(m)} [{int(table[m, 0])}, {int(table[m, 1])})" for m in where[:SHOWN]]
    return listed(shown, len(where))


def _shard_index_problems(table: npt.NDArray[np.uint64]) -> list[str]:
    starts, ends = table[:, 0], table[:, 1]
    backwards = ends < starts
    absurd = ~backwards & (ends > np.uint64(IMPOSSIBLE))
    found = []
    if backwards.any():
        found.append(f"shard index entries ending before they start: {_minishards(table, backwards)}")
    if absurd.any():
        found.append(f"shard index entries beyond {IMPOSSIBLE:,} bytes: {_minishards(table, absurd)}")
    return found


# -- building ------------------------------------------------------------------------


def build_shard(sharding: ShardingParams, chunks: Mapping[int, bytes | memoryview]) -> bytes:
    """One shard file holding ``chunks`` (id -> raw chunk bytes, all of one shard), laid
    out as tensorstore writes it: shard index, then per minishard (ascending) its chunks
    by ascending id, each encoded per ``data_encoding``, then its minishard index.

    An empty mapping gives ``b""``, which is not a shard (tensorstore writes no file
    for it): callers delete the shard object instead of writing it.
    """
    if not chunks:
        return b""
    keys = list(chunks)
    for k in keys:
        if isinstance(k, bool) or not hasattr(k, "__index__") or not 0 <= operator.index(k) < 1 << 64:
            raise ValueError(f"chunk id {k!r} is not a uint64")
    ids = np.array([operator.index(k) for k in keys], dtype=np.uint64)
    shards, minishards = locate_ids(sharding, ids)
    if (shards != shards[0]).any():
        other = int(np.flatnonzero(shards != shards[0])[0])
        raise ValueError(
            f"chunks of different shards in one shard: chunk {keys[0]} is in shard {int(shards[0])}, "
            f"chunk {keys[other]} in shard {int(shards[other])}"
        )
    order = np.lexsort((ids, minishards))
    ids, minishards = ids[order], minishards[order]
    encoded = [_encode(chunks[keys[i]], sharding.data_encoding) for i in order.tolist()]
    sizes = np.fromiter((len(e) for e in encoded), dtype=np.uint64, count=len(encoded))
    bounds = [0, *(np.flatnonzero(np.diff(minishards)) + 1).tolist(), len(ids)]
    shard_index = np.zeros((sharding.num_minishards, 2), dtype=np.uint64)
    pieces: list[bytes] = []
    position = 0  # relative to the end of the shard index
    for lo, hi in itertools.pairwise(bounds):
        group = sizes[lo:hi]
        ends = np.cumsum(group, dtype=np.uint64) + np.uint64(position)
        pieces.extend(encoded[lo:hi])
        position = int(ends[-1])
        index = _encode(
            _encode_minishard_index(ids[lo:hi], ends - group, group), sharding.minishard_index_encoding
        )
        shard_index[int(minishards[lo])] = (position, position + len(index))
        pieces.append(index)
        position += len(index)
    return shard_index.astype(_U64).tobytes() + b"".join(pieces)


# -- reading -------------------------------------------------------------------------


def decode_shard_index(sharding: ShardingParams, raw: bytes, key: str) -> npt.NDArray[np.uint64]:
    """The ``(2**minishard_bits, 2)`` ``(start, end)`` pairs of a shard index read from
    shard ``key``, relative to its end; checked in themselves (the shard's size is
    checked by :func:`parse_shard`)."""
    if len(raw) != sharding.shard_index_nbytes:
        raise ShardFormatError(
            f"shard {key!r}: expected a shard index of {sharding.shard_index_nbytes} bytes, found {len(raw)}"
        )
    table = _shard_index_table(sharding, raw)
    found = _shard_index_problems(table)
    if found:
        raise ShardFormatError(f"shard {key!r}: {found[0]}")
    return table


def minishard_index_range(
    sharding: ShardingParams, entry: bytes | memoryview, minishard: int, key: str
) -> range:
    """Where in the shard file the minishard index of ``minishard`` lies, from its
    16-byte shard index entry (an empty range: an empty minishard)."""
    if len(entry) != 16:
        raise ShardFormatError(
            f"shard {key!r}: shard index entry {minishard} is cut short ({len(entry)} bytes)"
        )
    start, end = (int(v) for v in np.frombuffer(entry, dtype=_U64))
    if end < start or end >= IMPOSSIBLE:
        raise ShardFormatError(
            f"shard {key!r}: shard index entry {minishard} is [{start}, {end}): impossible"
        )
    base = sharding.shard_index_nbytes
    return range(base + start, base + end)


def decode_minishard_index(
    sharding: ShardingParams, raw: bytes | memoryview, key: str
) -> npt.NDArray[np.uint64]:
    """``(n, 3)`` rows of ``(id, absolute offset in the shard file, nbytes)`` of an
    encoded minishard index read from shard ``key``: ids un-delta-encoded and checked
    strictly increasing, offsets un-delta-encoded plus ``shard_index_nbytes``."""
    try:
        return _decode_minishard_index(sharding, raw)
    except _Problem as e:
        raise ShardFormatError(f"shard {key!r}: minishard index: {e}") from None


@dataclass
class _Scan:
    """What a walk over one shard found: every chunk's stored range, and problems."""

    ids: npt.NDArray[np.uint64]
    offsets: npt.NDArray[np.uint64]
    sizes: npt.NDArray[np.uint64]
    problems: list[str]


def _expected_shard(sharding: ShardingParams, key: str, shard: int | None) -> int | None:
    """The shard ``key`` names, where its last path segment is a shard file name."""
    if shard is not None:
        number = operator.index(shard)
        if not 0 <= number < sharding.num_shards:
            raise ValueError(
                f"shard number {number} is outside [0, 2**{sharding.shard_bits}) of this sharding"
            )
        return number
    return shard_number_of_name(sharding, key.rsplit("/", 1)[-1])


def _overlaps(
    starts: npt.NDArray[np.uint64], ends: npt.NDArray[np.uint64], label: Callable[[int], str]
) -> list[str]:
    """Pairs of non-empty ranges sharing bytes (each chunk and index owns its bytes)."""
    keep = np.flatnonzero(ends > starts)
    if len(keep) < 2:
        return []
    order = keep[np.lexsort((ends[keep], starts[keep]))]
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    furthest = np.maximum.accumulate(np.where(e == reach, np.arange(len(order)), 0))
    hits = np.flatnonzero(s[1:] < reach[:-1]) + 1
    shown = [f"{label(int(order[furthest[i - 1]]))} and {label(int(order[i]))}" for i in hits[:SHOWN]]
    return [f"overlapping byte ranges: {listed(shown, len(hits))}"] if len(hits) else []


def _scan(
    sharding: ShardingParams, blob: bytes | memoryview, key: str, shard: int | None, *, collect: bool
) -> _Scan:
    """Walk a whole shard file: raise _Problem at the first inconsistency, or with
    ``collect`` note every one found and go on with what can still be trusted."""
    problems: list[str] = []

    def found(problem: str) -> None:
        if not collect:
            raise _Problem(problem)
        problems.append(problem)

    empty = np.zeros(0, dtype=np.uint64)
    size, index_nbytes = len(blob), sharding.shard_index_nbytes
    if size == 0:
        found("empty object: not a shard (a shard without chunks is deleted, not written)")
        return _Scan(empty, empty, empty, problems)
    if size < index_nbytes:
        found(f"truncated: {size} bytes, fewer than the {index_nbytes}-byte shard index")
        return _Scan(empty, empty, empty, problems)
    view = memoryview(blob)
    table = _shard_index_table(sharding, view[:index_nbytes])
    for problem in _shard_index_problems(table):
        found(problem)
    starts, ends = table[:, 0], table[:, 1]
    sane = (ends >= starts) & (ends <= np.uint64(IMPOSSIBLE))
    past = sane & (ends > np.uint64(size - index_nbytes))
    if past.any():
        found(
            f"truncated: minishard indices past the end of the {size}-byte object: {_minishards(table, past)}"
        )
    present = np.flatnonzero(sane & ~past & (ends > starts))
    rows: list[npt.NDArray[np.uint64]] = []
    owners: list[int] = []
    broken: list[str] = []
    for m in present.tolist():
        lo, hi = index_nbytes + int(starts[m]), index_nbytes + int(ends[m])
        try:
            rows.append(_decode_minishard_index(sharding, view[lo:hi]))
        except _Problem as e:
            broken.append(f"minishard {m} at [{lo}, {hi}): {e}")
            if not collect:
                break
        else:
            owners.append(m)
    if broken:
        found(f"minishard indices that do not decode: {listed(broken, len(broken))}")
    entries = np.concatenate(rows) if rows else np.zeros((0, 3), dtype=np.uint64)
    counts = [len(r) for r in rows]
    minishard_of = np.repeat(np.array(owners, dtype=np.uint64), counts)
    ids, offsets, sizes = entries[:, 0], entries[:, 1], entries[:, 2]

    def chunks_where(mask: npt.NDArray[np.bool_], extra: Callable[[int], str] = lambda i: "") -> str:
        where = np.flatnonzero(mask)
        shown = [
            f"chunk {int(ids[i])} [{int(offsets[i])}, {int(offsets[i] + sizes[i])}){extra(int(i))}"
            for i in where[:SHOWN]
        ]
        return listed(shown, len(where))

    outside = offsets + sizes > np.uint64(size)  # both below 2**53: no overflow
    if outside.any():
        found(f"truncated: chunks past the end of the {size}-byte object: {chunks_where(outside)}")
    shard_of, minishard_found = locate_ids(sharding, ids)
    wrong = minishard_found != minishard_of
    if wrong.any():
        found(
            "chunks listed in the wrong minishard: "
            + chunks_where(
                wrong, lambda i: f" in minishard {int(minishard_of[i])}, hashes to {int(minishard_found[i])}"
            )
        )
    expected = _expected_shard(sharding, key, shard)
    if len(ids):
        want = int(shard_of[0]) if expected is None else expected
        elsewhere = shard_of != np.uint64(want)
        if elsewhere.any():
            found(
                f"chunks of another shard than {want}: "
                + chunks_where(elsewhere, lambda i: f" of shard {int(shard_of[i])}")
            )
    index_starts = starts[present] + np.uint64(index_nbytes)
    index_ends = ends[present] + np.uint64(index_nbytes)
    inside = np.flatnonzero(~outside)
    all_starts = np.concatenate([index_starts, offsets[inside]])
    all_ends = np.concatenate([index_ends, offsets[inside] + sizes[inside]])
    n_indices = len(present)

    def label(i: int) -> str:
        lo, hi = int(all_starts[i]), int(all_ends[i])
        if i < n_indices:
            return f"minishard {int(present[i])} index [{lo}, {hi})"
        return f"chunk {int(ids[inside[i - n_indices]])} [{lo}, {hi})"

    for problem in _overlaps(all_starts, all_ends, label):
        found(problem)
    return _Scan(ids, offsets, sizes, problems)


def parse_shard(
    sharding: ShardingParams, blob: bytes | memoryview, key: str, *, shard: int | None = None
) -> dict[int, tuple[int, int]]:
    """id -> ``(offset, nbytes)`` of the stored (encoded) bytes of every chunk of a whole
    shard file, after checking it all: ShardFormatError naming ``key`` and the cause.

    ``shard``: the shard number the file must hold; by default the one ``key``'s last
    segment names (when it is a shard file name), else whichever the chunks agree on.
    An empty object is refused: no writer stores a shard without chunks.
    """
    try:
        scan = _scan(sharding, blob, key, shard, collect=False)
    except _Problem as e:
        raise ShardFormatError(f"shard {key!r}: {e}") from None
    return dict(
        zip(scan.ids.tolist(), zip(scan.offsets.tolist(), scan.sizes.tolist(), strict=True), strict=True)
    )


def decode_chunk(
    sharding: ShardingParams, stored: bytes, key: str, *, max_nbytes: int = MAX_DECODED_NBYTES
) -> bytes:
    """A chunk's raw bytes from its stored bytes (``data_encoding`` undone, gzip inflating
    to at most ``max_nbytes``); ShardFormatError naming shard ``key`` for a bad stream."""
    try:
        return _decode(stored, sharding.data_encoding, max_nbytes)
    except _Problem as e:
        raise ShardFormatError(f"shard {key!r}: chunk data: {e}") from None


def split_shard(
    sharding: ShardingParams,
    blob: bytes,
    key: str,
    *,
    shard: int | None = None,
    max_nbytes: int = MAX_DECODED_NBYTES,
) -> dict[int, bytes]:
    """id -> raw (decoded) bytes of every chunk of a whole shard file, checked as by
    :func:`parse_shard`."""
    view = memoryview(blob)
    chunks: dict[int, bytes] = {}
    for chunk_id, (offset, nbytes) in parse_shard(sharding, blob, key, shard=shard).items():
        try:
            chunks[chunk_id] = _decode(view[offset : offset + nbytes], sharding.data_encoding, max_nbytes)
        except _Problem as e:
            raise ShardFormatError(
                f"shard {key!r}: chunk {chunk_id} at [{offset}, {offset + nbytes}): {e}"
            ) from None
    return chunks


def shard_problems(
    sharding: ShardingParams,
    blob: bytes,
    key: str,
    *,
    shard: int | None = None,
    max_nbytes: int = MAX_DECODED_NBYTES,
) -> list[str]:
    """Everything wrong with a whole shard file (empty list: intact), without raising:
    for a ``verify`` tool. Each kind of problem once, naming its first few items, and
    without ``key`` (the caller names the object); chunk data is decoded too."""
    scan = _scan(sharding, blob, key, shard, collect=True)
    if sharding.data_encoding == "raw":
        return scan.problems
    view = memoryview(blob)
    broken: list[str] = []
    within = scan.offsets + scan.sizes <= np.uint64(len(blob))
    for chunk_id, offset, nbytes in zip(
        scan.ids[within].tolist(), scan.offsets[within].tolist(), scan.sizes[within].tolist(), strict=True
    ):
        try:
            _decode(view[offset : offset + nbytes], sharding.data_encoding, max_nbytes)
        except _Problem as e:
            broken.append(f"chunk {chunk_id} at [{offset}, {offset + nbytes}): {e}")
    if broken:
        scan.problems.append(f"chunk data that does not decode: {listed(broken, len(broken))}")
    return scan.problems
