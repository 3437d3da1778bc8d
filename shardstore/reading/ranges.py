"""Byte ranges of chunk reads: a request's range within a chunk, merging nearby
ranges of one object into one request. Pure; shared by every reader."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest

__all__ = ["MERGE_GAP", "merge_ranges", "merge_spans", "sub_range"]


def sub_range(offset: int, nbytes: int, byte_range: ByteRequest | None) -> tuple[int, int]:
    """Absolute [start, stop) of a byte request on a chunk stored at [offset, offset + nbytes):
    the bytes :func:`~shardstore.inner.base.slice_range` takes of the chunk's value (a
    Python slice, as zarr's MemoryStore and fsspec take them, negative numbers counted
    from the chunk's end), never a byte outside the chunk."""
    if byte_range is None:
        cut = slice(None)
    elif isinstance(byte_range, RangeByteRequest):
        cut = slice(byte_range.start, byte_range.end)
    elif isinstance(byte_range, OffsetByteRequest):
        cut = slice(byte_range.offset, None)
    else:
        cut = slice(max(nbytes - byte_range.suffix, 0), None)
    lo, hi, _ = cut.indices(nbytes)
    return offset + lo, offset + max(hi, lo)


MERGE_GAP = 64 * 1024
"""Ranges of one shard closer than this are read as one request: a request costs more
than reading a few unwanted bytes, on object stores by far."""


def merge_ranges(
    ranges: list[tuple[int, int, int]], gap: int
) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
    """Group (slot, start, stop) ranges into spans (start, stop, members, in the order
    of their starts), merging ranges whose distance is at most ``gap`` (overlapping and
    shared ranges too): :func:`merge_spans` with the members."""
    starts = np.fromiter((r[1] for r in ranges), dtype=np.int64, count=len(ranges))
    stops = np.fromiter((r[2] for r in ranges), dtype=np.int64, count=len(ranges))
    span_starts, span_stops, span_of = merge_spans(starts, stops, gap)
    members: list[list[tuple[int, int, int]]] = [[] for _ in range(len(span_starts))]
    span_of_range = span_of.tolist()
    for k in np.argsort(starts, kind="stable").tolist():
        members[span_of_range[k]].append(ranges[k])
    return list(zip(span_starts.tolist(), span_stops.tolist(), members, strict=True))


def merge_spans(
    starts: npt.NDArray[np.int64], stops: npt.NDArray[np.int64], gap: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """Spans of arrays of [start, stop) ranges, merging ranges whose distance is at most
    ``gap``: the spans' starts and stops, in order, and the span of each range."""
    if not len(starts):
        return starts[:0], stops[:0], np.zeros(0, dtype=np.intp)
    order = np.argsort(starts, kind="stable")
    first, last = starts[order], stops[order]
    reach = np.maximum.accumulate(last)
    opens = np.empty(len(first), dtype=bool)
    opens[0] = True
    opens[1:] = first[1:] - reach[:-1] > gap
    heads = np.flatnonzero(opens)
    span_of: npt.NDArray[Any] = np.empty(len(first), dtype=np.intp)
    span_of[order] = np.cumsum(opens) - 1
    return first[heads], np.maximum.reduceat(last, heads), span_of
