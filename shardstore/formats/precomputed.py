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
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Final, Literal, cast

import numpy as np
import numpy.typing as npt
from zarr.abc.store import ByteRequest, RangeByteRequest

from shardstore.errors import ShardFormatError, ShardingConfigError
from shardstore.formats.base import ShardFormat
from shardstore.formats.findings import IMPOSSIBLE, SHOWN, listed

__all__ = [
    "MAX_DECODED_NBYTES",
    "MAX_MINISHARD_BITS",
    "TYPE_NAME",
    "PrecomputedSharding",
    "build_shard",
    "chunk_hash",
    "compressed_morton_code",
    "decode_chunk",
    "decode_minishard_index",
    "decode_shard_index",
    "locate_ids",
    "minishard_index_range",
    "morton_positions",
    "murmurhash3_x86_128_64",
    "parse_shard",
    "renumber",
    "renumbered",
    "shard_file_name",
    "shard_number_of_name",
    "shard_problems",
    "split_shard",
]

TYPE_NAME: Final = "neuroglancer_uint64_sharded_v1"
HashName = Literal["identity", "murmurhash3_x86_128"]
Encoding = Literal["raw", "gzip"]
_HASHES: Final = ("identity", "murmurhash3_x86_128")
_ENCODINGS: Final = ("raw", "gzip")
_BITS_FIELDS: Final = ("preshift_bits", "minishard_bits", "shard_bits")
_FIELDS: Final = ("@type", *_BITS_FIELDS, "hash", "minishard_index_encoding", "data_encoding")

MAX_MINISHARD_BITS: Final = 32
"""tensorstore's limit: a shard index of ``2**32`` entries is already 64 GiB."""
MAX_DECODED_NBYTES: Final = 1 << 30
"""Most bytes one gzip-encoded chunk or minishard index may inflate to: far above any
real one, and it keeps a damaged (or hostile) stream from exhausting memory."""
_GZIP_LEVEL: Final = 9
_GZIP_WBITS: Final = 31  # 16 + 15: gzip header and trailer, as tensorstore's zlib uses
_U64: Final = np.dtype("<u8")
_DIRECTORY: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


# -- configuration -----------------------------------------------------------------


def _check_fields(obj: Mapping[Any, Any], where: str) -> None:
    """Refuse anything tensorstore or neuroglancer would not read as this sharding."""
    unknown = [k for k in obj if k not in _FIELDS]
    if unknown:
        k = unknown[0]
        raise ShardingConfigError(
            f"{where}: unknown field {k!r} (value {obj[k]!r}); "
            f"a {TYPE_NAME} sharding has only {list(_FIELDS)}"
        )
    if obj.get("@type") != TYPE_NAME:
        found = repr(obj["@type"]) if "@type" in obj else "missing"
        raise ShardingConfigError(f"{where}: field '@type' is {found}, expected {TYPE_NAME!r}")
    bits: dict[str, int] = {}
    for name in _BITS_FIELDS:
        if name not in obj:
            raise ShardingConfigError(f"{where}: field {name!r} is missing (an integer from 0 to 64)")
        value = obj[name]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 64:
            raise ShardingConfigError(f"{where}: field {name!r} is {value!r}, not an integer from 0 to 64")
        bits[name] = value
    if bits["minishard_bits"] > MAX_MINISHARD_BITS:
        raise ShardingConfigError(
            f"{where}: field 'minishard_bits' is {bits['minishard_bits']}, more than {MAX_MINISHARD_BITS} "
            f"(a shard index of 16 * 2**{bits['minishard_bits']} bytes cannot be held)"
        )
    if sum(bits.values()) > 64:
        raise ShardingConfigError(
            f"{where}: fields preshift_bits + minishard_bits + shard_bits are "
            f"{' + '.join(str(v) for v in bits.values())} = {sum(bits.values())}, "
            "more than the 64 bits of a chunk id"
        )
    if "hash" not in obj:
        raise ShardingConfigError(f"{where}: field 'hash' is missing (one of {list(_HASHES)})")
    if obj["hash"] not in _HASHES:
        raise ShardingConfigError(f"{where}: field 'hash' is {obj['hash']!r}, not one of {list(_HASHES)}")
    for name in ("minishard_index_encoding", "data_encoding"):
        if name in obj and obj[name] not in _ENCODINGS:
            raise ShardingConfigError(
                f"{where}: field {name!r} is {obj[name]!r}, not one of {list(_ENCODINGS)}"
            )


@dataclass(frozen=True)
class PrecomputedSharding(ShardFormat):
    """The ``sharding`` object of a neuroglancer precomputed scale (or kvstore metadata),
    as a :class:`~shardstore.formats.base.ShardFormat`: chunks are uint64 ids, their
    bytes raw (the format applies ``data_encoding`` itself)."""

    type_name: ClassVar[str] = TYPE_NAME

    preshift_bits: int
    hash: HashName
    minishard_bits: int
    shard_bits: int
    minishard_index_encoding: Encoding = "raw"
    data_encoding: Encoding = "raw"
    directory: str = ""
    """Where a zarr array's shard files are, below its chunk prefix ("": there
    itself). A resize that renumbers the chunks writes them to a new directory, and
    the metadata naming it is the commit: not part of the neuroglancer format."""

    def __post_init__(self) -> None:
        _check_fields(self.to_json(), type(self).__name__)
        if self.directory and _DIRECTORY.fullmatch(self.directory) is None:
            raise ShardingConfigError(
                f"{type(self).__name__}: directory {self.directory!r} is not a plain name "
                "(letters, digits, '.', '_' and '-', not starting with '.')"
            )

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "sharding") -> PrecomputedSharding:
        """Read and check a sharding JSON object; ShardingConfigError names ``where``,
        the field and its value. Missing encodings are ``"raw"``; extra keys are refused."""
        if not isinstance(obj, Mapping):
            raise ShardingConfigError(f"{where}: {obj!r} is not a JSON object")
        _check_fields(obj, where)
        return cls(
            preshift_bits=obj["preshift_bits"],
            hash=cast(HashName, obj["hash"]),
            minishard_bits=obj["minishard_bits"],
            shard_bits=obj["shard_bits"],
            minishard_index_encoding=cast(Encoding, obj.get("minishard_index_encoding", "raw")),
            data_encoding=cast(Encoding, obj.get("data_encoding", "raw")),
        )

    def to_json(self) -> dict[str, Any]:
        """As tensorstore writes it: ``@type`` and every field, defaults included."""
        return {
            "@type": TYPE_NAME,
            "preshift_bits": self.preshift_bits,
            "hash": self.hash,
            "minishard_bits": self.minishard_bits,
            "shard_bits": self.shard_bits,
            "minishard_index_encoding": self.minishard_index_encoding,
            "data_encoding": self.data_encoding,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> PrecomputedSharding:
        """The sharding object, its ``@type`` spelled ``type`` as in a ZEP 2 storage
        transformer configuration (``@type`` is accepted too), and the ``directory``
        of the shard files if they are not in the chunk prefix itself."""
        obj = dict(config)
        if "type" in obj:
            obj.setdefault("@type", obj.pop("type"))
        directory = obj.pop("directory", "")
        if not isinstance(directory, str):
            raise ShardingConfigError(f"{where}: field 'directory' is {directory!r}, not a string")
        sharding = cls.from_json(obj, where)
        try:
            return replace(sharding, directory=directory)
        except ShardingConfigError as exc:
            raise ShardingConfigError(f"{where}: {exc}") from None

    def to_config(self) -> dict[str, Any]:
        obj = self.to_json()
        directory = {"directory": self.directory} if self.directory else {}
        return {"type": obj.pop("@type"), **obj, **directory}

    def parse(self, blob: bytes, key: str) -> dict[int, tuple[int, int]]:
        """Where each chunk's stored bytes lie in a whole shard file, checked."""
        return parse_shard(self, blob, key)

    def index_request(self) -> ByteRequest:
        """The shard index: the first-level index, at the start of every shard file."""
        return RangeByteRequest(0, self.shard_index_nbytes)

    def build(self, chunks: Mapping[int, bytes]) -> bytes:
        return build_shard(self, chunks)

    def split(self, blob: bytes, key: str) -> dict[int, bytes]:
        return split_shard(self, blob, key)

    def problems(self, blob: bytes, key: str, chunk_nbytes: int | None = None) -> list[str]:
        return shard_problems(self, blob, key)

    @property
    def shard_index_nbytes(self) -> int:
        return 16 << self.minishard_bits

    @property
    def num_minishards(self) -> int:
        return 1 << self.minishard_bits

    @property
    def num_shards(self) -> int:
        return 1 << self.shard_bits


# -- from chunk ids to shards --------------------------------------------------------

_C1: Final = np.uint32(0x239B961B)
_C2: Final = np.uint32(0xAB0E9789)
_C3: Final = np.uint32(0x38B34AE5)
_LEN: Final = np.uint32(8)

U32Array = npt.NDArray[np.uint32]


def _rotl(x: U32Array, r: int) -> U32Array:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _fmix(h: U32Array) -> U32Array:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def murmurhash3_x86_128_64(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """MurmurHash3_x86_128 (seed 0) of the 8 little-endian bytes of each value, low 64
    bits of the digest read little-endian (``h1 | h2 << 32``), as neuroglancer uses it.

    Vectorised in uint32 arithmetic (numpy arrays wrap around silently); with 8 bytes
    of input only the tail step of the body runs, so that is all there is here.
    """
    flat = np.asarray(values, dtype=np.uint64).reshape(-1)
    low = (flat & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (flat >> np.uint64(32)).astype(np.uint32)
    h1 = (_rotl(low * _C1, 15) * _C2) ^ _LEN
    h2 = (_rotl(high * _C2, 16) * _C3) ^ _LEN
    h1 = h1 + h2 + _LEN + _LEN  # h3 = h4 = seed ^ len = 8
    h2 = h2 + h1
    h34 = _fmix(_LEN + h1)  # h3 and h4 are equal throughout
    h1 = _fmix(h1)
    h2 = _fmix(h2)
    h1 = h1 + h2 + h34 + h34
    h2 = h2 + h1
    out = h1.astype(np.uint64) | (h2.astype(np.uint64) << np.uint64(32))
    return out.reshape(np.shape(values))


def _as_ids(ids: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """uint64 ids, refusing what would silently wrap (negative or non-integer values)."""
    arr = np.asarray(ids)
    if arr.dtype.kind == "u" or arr.size == 0:
        return arr.astype(np.uint64, copy=False)
    if arr.dtype.kind == "i":
        if (arr < 0).any():
            raise ValueError(f"chunk ids must be non-negative uint64 values, got {arr[arr < 0][0]}")
        return arr.astype(np.uint64)
    raise ValueError(f"chunk ids must be unsigned 64-bit integers, got an array of {arr.dtype}")


def _low_mask(bits: int) -> np.uint64:
    return np.uint64((1 << bits) - 1)


def chunk_hash(sharding: PrecomputedSharding, ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Each id shifted right by ``preshift_bits`` and hashed: what minishard and shard
    numbers are cut from."""
    arr = _as_ids(ids)
    # numpy (like C) leaves a shift by 64 bits undefined
    shifted = np.zeros_like(arr) if sharding.preshift_bits >= 64 else arr >> np.uint64(sharding.preshift_bits)
    if sharding.hash == "identity":
        return shifted
    return murmurhash3_x86_128_64(shifted)


def locate_ids(
    sharding: PrecomputedSharding, ids: npt.NDArray[np.uint64]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """``(shard numbers, minishard numbers)`` of each id, arrays shaped like ``ids``."""
    hashed = chunk_hash(sharding, ids)
    minishards = hashed & _low_mask(sharding.minishard_bits)
    shards = (hashed >> np.uint64(sharding.minishard_bits)) & _low_mask(sharding.shard_bits)
    return shards, minishards


def _name_width(sharding: PrecomputedSharding) -> int:
    return -(-sharding.shard_bits // 4)


def shard_file_name(sharding: PrecomputedSharding, shard: int) -> str:
    """Lowercase hex zero-padded to ``ceil(shard_bits / 4)`` digits, then ``.shard``
    (``0.shard`` when ``shard_bits`` is 0): the name tensorstore and neuroglancer use."""
    number = operator.index(shard)
    if not 0 <= number < sharding.num_shards:
        raise ValueError(f"shard number {number} is outside [0, 2**{sharding.shard_bits}) of this sharding")
    return f"{number:0{_name_width(sharding)}x}.shard"


_NAME = re.compile(r"([0-9a-f]+)\.shard")


def shard_number_of_name(sharding: PrecomputedSharding, name: str) -> int | None:
    """The shard a file name holds; None for any name :func:`shard_file_name` does not
    produce for this sharding (other case, padding or range)."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    number = int(match.group(1), 16)
    if number >= sharding.num_shards or shard_file_name(sharding, number) != name:
        return None
    return number


def compressed_morton_code(
    positions: npt.NDArray[np.integer[Any]], grid_shape: Sequence[int]
) -> npt.NDArray[np.uint64]:
    """Chunk ids of chunk grid positions (``(n, ndim)``, dimension 0 = x) as neuroglancer
    numbers volumetric chunks: the bits of the coordinates interleaved, x first,
    skipping at each bit position the dimensions whose grid is already exhausted."""
    shape = [operator.index(s) for s in grid_shape]
    pos = np.asarray(positions)
    if pos.ndim != 2 or pos.shape[1] != len(shape):
        raise ValueError(f"positions must have shape (n, {len(shape)}), not {pos.shape}")
    if any(s < 1 for s in shape):
        raise ValueError(f"grid shape {shape} must be positive")
    widths = [(s - 1).bit_length() for s in shape]
    if sum(widths) > 64:
        raise ValueError(f"a grid of {shape} chunks needs {sum(widths)} bits, more than a uint64 chunk id")
    if pos.size and (pos.dtype.kind not in "iu" or (pos < 0).any() or (pos >= np.asarray(shape)).any()):
        raise ValueError(f"positions must be integers inside the grid {shape}")
    coords = pos.astype(np.uint64)
    code = np.zeros(len(pos), dtype=np.uint64)
    j = 0
    for i in range(max(widths, default=0)):
        for d, s in enumerate(shape):
            if (1 << i) < s:
                bit = (coords[:, d] >> np.uint64(i)) & np.uint64(1)
                code |= bit << np.uint64(j)
                j += 1
    return code


def _bit_places(grid_shape: Sequence[int]) -> dict[tuple[int, int], int]:
    """Where bit ``i`` of dimension ``d`` goes in a compressed Morton code: (i, d) -> j."""
    places: dict[tuple[int, int], int] = {}
    for i in range(max(((s - 1).bit_length() for s in grid_shape), default=0)):
        for d, s in enumerate(grid_shape):
            if (1 << i) < s:
                places[(i, d)] = len(places)
    return places


def renumbered(old_grid: Sequence[int], new_grid: Sequence[int]) -> bool:
    """Whether some grid position inside both grids has another compressed Morton code
    in ``new_grid`` than in ``old_grid`` (a grid change that moves existing chunks)."""
    common = [min(o, n) for o, n in zip(old_grid, new_grid, strict=True)]
    old, new = _bit_places(old_grid), _bit_places(new_grid)
    live = [(i, d) for (i, d) in old if (1 << i) < common[d]]  # bits a common position can set
    return any(old[bit] != new.get(bit) for bit in live)


def renumber(
    ids: npt.NDArray[np.uint64], old_grid: Sequence[int], new_grid: Sequence[int]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.uint64]]:
    """Chunk ids numbered in ``old_grid`` as ``new_grid`` numbers the same positions:
    ``(kept, new_ids)``, where ``kept`` marks the ids whose position lies in both
    grids and ``new_ids`` holds the kept ones' new ids."""
    positions = morton_positions(np.asarray(ids, dtype=np.uint64), old_grid)
    common = np.minimum(np.asarray(old_grid, dtype=np.int64), np.asarray(new_grid, dtype=np.int64))
    kept = np.all(positions < common, axis=1)
    if not kept.any():
        return kept, np.zeros(0, dtype=np.uint64)
    return kept, compressed_morton_code(positions[kept], new_grid)


def morton_positions(codes: npt.NDArray[np.uint64], grid_shape: Sequence[int]) -> npt.NDArray[np.int64]:
    """The grid positions (``(n, ndim)``) of compressed Morton codes: the inverse of
    :func:`compressed_morton_code` (codes beyond the grid give positions outside it)."""
    shape = [operator.index(s) for s in grid_shape]
    codes = np.asarray(codes, dtype=np.uint64)
    coords = np.zeros((len(codes), len(shape)), dtype=np.uint64)
    j = 0
    for i in range(max(((s - 1).bit_length() for s in shape), default=0)):
        for d, s in enumerate(shape):
            if (1 << i) < s:
                coords[:, d] |= ((codes >> np.uint64(j)) & np.uint64(1)) << np.uint64(i)
                j += 1
    if j < 64:  # bits past the grid's: a code no grid position has
        coords[codes >> np.uint64(j) != 0] = np.asarray(shape, dtype=np.uint64)
    return coords.astype(np.int64)


# -- encodings -----------------------------------------------------------------------


class _Problem(Exception):
    """One thing wrong with a shard, without the key (the public functions add it)."""


def _encode(data: bytes, encoding: Encoding) -> bytes:
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


def _decode_minishard_index(sharding: PrecomputedSharding, raw: bytes | memoryview) -> npt.NDArray[np.uint64]:
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


def _shard_index_table(sharding: PrecomputedSharding, raw: bytes | memoryview) -> npt.NDArray[np.uint64]:
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


def build_shard(sharding: PrecomputedSharding, chunks: Mapping[int, bytes]) -> bytes:
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


def decode_shard_index(sharding: PrecomputedSharding, raw: bytes, key: str) -> npt.NDArray[np.uint64]:
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


def minishard_index_range(sharding: PrecomputedSharding, entry: bytes, minishard: int, key: str) -> range:
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


def decode_minishard_index(sharding: PrecomputedSharding, raw: bytes, key: str) -> npt.NDArray[np.uint64]:
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


def _expected_shard(sharding: PrecomputedSharding, key: str, shard: int | None) -> int | None:
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
    sharding: PrecomputedSharding, blob: bytes | memoryview, key: str, shard: int | None, *, collect: bool
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
    sharding: PrecomputedSharding, blob: bytes, key: str, *, shard: int | None = None
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
    sharding: PrecomputedSharding, stored: bytes, key: str, *, max_nbytes: int = MAX_DECODED_NBYTES
) -> bytes:
    """A chunk's raw bytes from its stored bytes (``data_encoding`` undone, gzip inflating
    to at most ``max_nbytes``); ShardFormatError naming shard ``key`` for a bad stream."""
    try:
        return _decode(stored, sharding.data_encoding, max_nbytes)
    except _Problem as e:
        raise ShardFormatError(f"shard {key!r}: chunk data: {e}") from None


def split_shard(
    sharding: PrecomputedSharding,
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
    sharding: PrecomputedSharding,
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
