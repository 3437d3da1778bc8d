"""Shards as blocks of an array in memory: which chunks of each shard a selection
covers as a box of its block (the whole block, or a part: a slab's row of chunks),
and one numpy operation per shard between such a box and the shard's chunks laid
out one after another.

A shard of ``block`` chunks of ``chunk`` elements is, in memory, the region of
``block * chunk`` elements its chunks cover; viewed as ``(b0, c0, b1, c1, ...)``,
chunk ``(i, j)`` is ``[i, :, j, :]``, and the chunks in their C order are that
view transposed to ``(b0, b1, c0, c1)``. Pure functions over numpy arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeGuard

import numpy as np
import numpy.typing as npt

__all__ = ["Box", "block_view", "chunks_of_block", "is_block", "shard_boxes", "stacked_chunks"]


class Box(NamedTuple):
    """The chunks of one shard a selection covers, as a box of the shard's block: the
    chunks at block coordinates ``low`` to ``low + extent`` (exclusive), each at its
    place, the first starting at ``corner`` of the array read into or written from."""

    corner: tuple[int, ...]
    low: tuple[int, ...]
    extent: tuple[int, ...]


def shard_boxes(
    starts: npt.NDArray[np.int64],
    places: npt.NDArray[np.int64],
    shard_of: npt.NDArray[np.intp],
    n_shards: int,
    block: tuple[int, ...],
    chunk: tuple[int, ...],
) -> list[Box | None]:
    """Each shard's chunks as a box of its block, for distinct chunks (zarr hands each
    once) whose own regions start at ``starts`` (one row per chunk, each a whole
    chunk); None for a shard whose chunks are no box, each at its place (the selection
    leaves some out of the box, reorders them, or meets none)."""
    ndim = len(block)
    if not len(places):
        return [None] * n_shards
    local = np.stack(np.unravel_index(places, block), axis=1)
    origin = starts - local * np.asarray(chunk, dtype=np.int64)  # the block's, by each chunk
    order = np.argsort(shard_of, kind="stable")
    counts = np.bincount(shard_of, minlength=n_shards)
    met = np.flatnonzero(counts)
    firsts = np.cumsum(counts)[met] - counts[met]  # each shard met: its first chunk in ``order``
    by_shard = local[order]
    low = np.zeros((n_shards, ndim), dtype=np.int64)
    extent = np.zeros((n_shards, ndim), dtype=np.int64)
    low[met] = np.minimum.reduceat(by_shard, firsts, axis=0)
    extent[met] = np.maximum.reduceat(by_shard, firsts, axis=0) - low[met] + 1
    first = np.zeros((n_shards, ndim), dtype=np.int64)
    first[met] = origin[order[firsts]]
    agreeing = np.bincount(shard_of, weights=(origin == first[shard_of]).all(axis=1), minlength=n_shards)
    # as many distinct chunks as the box between their lowest and highest holds: all of it
    boxed = (counts > 0) & (counts == extent.prod(axis=1)) & (agreeing == counts)
    corner = first + low * np.asarray(chunk, dtype=np.int64)
    return [
        Box(tuple(c), tuple(lo), tuple(e)) if ok else None
        for ok, c, lo, e in zip(boxed.tolist(), corner.tolist(), low.tolist(), extent.tolist(), strict=True)
    ]


def is_block(box: Box | None, block: tuple[int, ...] | None) -> TypeGuard[Box]:
    """Whether ``box`` is its shard's whole block."""
    return box is not None and box.extent == block


def block_view(
    array: npt.NDArray[Any], origin: Sequence[int], block: tuple[int, ...], chunk: tuple[int, ...]
) -> npt.NDArray[Any] | None:
    """The region of ``array`` a shard's block covers from ``origin``, viewed (not
    copied) as ``(b0, c0, b1, c1, ...)``; None where ``array`` ends before the block
    does (a shard at the array's edge: its chunks are cut there)."""
    region = array[tuple(slice(o, o + b * c) for o, b, c in zip(origin, block, chunk, strict=True))]
    if region.shape != tuple(b * c for b, c in zip(block, chunk, strict=True)):
        return None
    # (splitting each axis in two is always a view, whatever the strides)
    return region.reshape(tuple(n for b, c in zip(block, chunk, strict=True) for n in (b, c)))


def _interleaving(ndim: int) -> tuple[int, ...]:
    """Axes of ``(b0, b1, ..., c0, c1, ...)`` in the order ``(b0, c0, b1, c1, ...)``."""
    return tuple(a for d in range(ndim) for a in (d, ndim + d))


def chunks_of_block(stacked: npt.NDArray[Any], block: tuple[int, ...]) -> npt.NDArray[Any]:
    """Chunks stacked in C order (``(n, c0, c1, ...)``) as a block view's shape."""
    chunk = stacked.shape[1:]
    return stacked.reshape(block + chunk).transpose(_interleaving(len(block)))


def stacked_chunks(
    data: Any, table: npt.NDArray[np.uint64], dtype: np.dtype[Any], chunk: tuple[int, ...]
) -> npt.NDArray[Any] | None:
    """The chunks at the rows ``table`` of a shard's index, in that order, as one
    ``(n, *chunk)`` array over the shard's bytes, where each is stored raw at full
    size, all in slots of that size from the first (a view where they follow one
    another in that order, else one copy); None where a chunk is absent, stored
    otherwise, or two share a slot."""
    nbytes = dtype.itemsize * math.prod(chunk)
    offsets, sizes = table[:, 0], table[:, 1]
    if len(table) == 0 or nbytes == 0 or not (sizes == nbytes).all():
        return None  # (absent chunks' rows hold 2**64 - 1: no size matches)
    n = len(table)
    # (modulo 2**64 alike: each a chunk after the one before; np.diff costs twice this)
    base = int(offsets[0]) if ((offsets[1:] - offsets[:-1]) == nbytes).all() else None
    if base is not None:  # one after another (a whole shard as written, a row of its chunks)
        slots, span = None, n
    else:
        base = int(np.min(offsets))
        rel = offsets - np.uint64(base)
        slots = (rel // np.uint64(nbytes)).astype(np.intp)
        if not (rel % np.uint64(nbytes) == 0).all() or len(np.unique(slots)) != n:
            return None
        span = int(np.max(slots)) + 1
    if base + span * nbytes > len(data):
        return None
    flat = np.frombuffer(data, dtype=dtype, count=span * nbytes // dtype.itemsize, offset=base)
    stacked = flat.reshape((span, *chunk))
    return stacked if slots is None else stacked[slots]
