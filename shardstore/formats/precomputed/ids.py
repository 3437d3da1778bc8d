"""From uint64 chunk ids to shards and minishards (the preshift and the hash), shard
file names, and the compressed Morton code that numbers a grid's chunks. Pure."""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from shardstore.formats.precomputed.params import ShardingParams

__all__ = [
    "chunk_hash",
    "compressed_morton_code",
    "locate_ids",
    "morton_positions",
    "murmurhash3_x86_128_64",
    "renumber",
    "renumbered",
    "shard_file_name",
    "shard_number_of_name",
]

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


def chunk_hash(sharding: ShardingParams, ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Each id shifted right by ``preshift_bits`` and hashed: what minishard and shard
    numbers are cut from."""
    arr = _as_ids(ids)
    # numpy (like C) leaves a shift by 64 bits undefined
    shifted = np.zeros_like(arr) if sharding.preshift_bits >= 64 else arr >> np.uint64(sharding.preshift_bits)
    if sharding.hash == "identity":
        return shifted
    return murmurhash3_x86_128_64(shifted)


def locate_ids(
    sharding: ShardingParams, ids: npt.NDArray[np.uint64]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """``(shard numbers, minishard numbers)`` of each id, arrays shaped like ``ids``."""
    hashed = chunk_hash(sharding, ids)
    minishards = hashed & _low_mask(sharding.minishard_bits)
    shards = (hashed >> np.uint64(sharding.minishard_bits)) & _low_mask(sharding.shard_bits)
    return shards, minishards


def _name_width(sharding: ShardingParams) -> int:
    return -(-sharding.shard_bits // 4)


def shard_file_name(sharding: ShardingParams, shard: int) -> str:
    """Lowercase hex zero-padded to ``ceil(shard_bits / 4)`` digits, then ``.shard``
    (``0.shard`` when ``shard_bits`` is 0): the name tensorstore and neuroglancer use."""
    number = operator.index(shard)
    if not 0 <= number < sharding.num_shards:
        raise ValueError(f"shard number {number} is outside [0, 2**{sharding.shard_bits}) of this sharding")
    return f"{number:0{_name_width(sharding)}x}.shard"


_NAME = re.compile(r"([0-9a-f]+)\.shard")


def shard_number_of_name(sharding: ShardingParams, name: str) -> int | None:
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
