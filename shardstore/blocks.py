"""Whole shards as blocks of an array in memory: which shards of a selection fill a
block of the output (or of the value written), and one numpy operation per shard
between such a block and the shard's chunks laid out one after another.

A shard of ``block`` chunks of ``chunk`` elements is, in memory, the region of
``block * chunk`` elements its chunks cover; viewed as ``(b0, c0, b1, c1, ...)``,
chunk ``(i, j)`` is ``[i, :, j, :]``, and the chunks in their C order are that
view transposed to ``(b0, b1, c0, c1)``. Pure functions over numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

__all__ = ["block_view", "chunks_of_block", "shard_origins", "stacked_chunks"]


def shard_origins(
    starts: npt.NDArray[np.int64],
    places: npt.NDArray[np.int64],
    shard_of: npt.NDArray[np.intp],
    n_shards: int,
    block: tuple[int, ...],
    chunk: tuple[int, ...],
) -> npt.NDArray[np.int64]:
    """Where each shard's block starts in the output (one row per shard), for chunks
    whose own regions start at ``starts`` (one row per chunk, each a whole chunk);
    -1 for a shard whose chunks in the selection are not its whole block, each at its
    place (the selection leaves some out, reorders them, or the grid's edge cuts it)."""
    ndim = len(block)
    local = (
        np.stack(np.unravel_index(places, block), axis=1) if len(places) else np.empty((0, ndim), np.int64)
    )
    origin = starts - local * np.asarray(chunk, dtype=np.int64)
    order = np.argsort(shard_of, kind="stable")
    firsts = order[np.minimum(np.searchsorted(shard_of[order], np.arange(n_shards)), len(order) - 1)]
    first = origin[firsts] if len(order) else np.full((n_shards, ndim), -1, dtype=np.int64)
    same = (origin == first[shard_of]).all(axis=1)
    counts = np.bincount(shard_of, minlength=n_shards)
    agreeing = np.bincount(shard_of, weights=same, minlength=n_shards)
    whole = (counts == int(np.prod(block))) & (agreeing == counts)
    first[~whole] = -1
    return first


def block_view(
    array: npt.NDArray[Any], origin: Sequence[int], block: tuple[int, ...], chunk: tuple[int, ...]
) -> npt.NDArray[Any] | None:
    """The region of ``array`` a shard's block covers from ``origin``, viewed (not
    copied) as ``(b0, c0, b1, c1, ...)``; None where ``array`` ends before the block
    does (a shard at the array's edge: its chunks are cut there)."""
    region = array[tuple(slice(o, o + b * c) for o, b, c in zip(origin, block, chunk, strict=True))]
    if region.shape != tuple(b * c for b, c in zip(block, chunk, strict=True)):
        return None
    shape = tuple(n for b, c in zip(block, chunk, strict=True) for n in (b, c))
    strides = tuple(n for s, c in zip(region.strides, chunk, strict=True) for n in (s * c, s))
    return as_strided(region, shape=shape, strides=strides)


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
    """A shard's chunks, in the order of their places, as one ``(n, *chunk)`` array over
    the shard's bytes, where each is stored raw at full size, side by side (a view
    when they are in order, else one copy); None where a chunk is absent or stored
    otherwise."""
    nbytes = dtype.itemsize * int(np.prod(chunk))
    offsets, sizes = table[:, 0], table[:, 1]
    if len(table) == 0 or nbytes == 0 or not (sizes == nbytes).all():
        return None  # (absent chunks' rows hold 2**64 - 1: no size matches)
    n = len(table)
    base = int(offsets[0]) if (np.diff(offsets.astype(np.int64)) == nbytes).all() else None
    if base is not None:  # in the order of their places (as written): a view
        slots = None
    else:
        base = int(np.min(offsets))
        rel = offsets - np.uint64(base)
        slots = (rel // np.uint64(nbytes)).astype(np.intp)
        if not ((rel % np.uint64(nbytes) == 0).all() and np.array_equal(np.sort(slots), np.arange(n))):
            return None
    if base + n * nbytes > len(data):
        return None
    flat = np.frombuffer(data, dtype=dtype, count=n * nbytes // dtype.itemsize, offset=base)
    stacked = flat.reshape((n, *chunk))
    return stacked if slots is None else stacked[slots]
