"""Byte ranges of chunk reads: a request's range within a chunk, merging nearby
ranges of one object into one request. Pure; shared by every reader."""

from __future__ import annotations

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest

__all__ = ["MERGE_GAP", "merge_ranges", "sub_range"]


def sub_range(offset: int, nbytes: int, byte_range: ByteRequest | None) -> tuple[int, int]:
    """Absolute [start, stop) of a byte request on a chunk stored at [offset, offset + nbytes)."""
    if byte_range is None:
        lo, hi = 0, nbytes
    elif isinstance(byte_range, RangeByteRequest):
        lo, hi = min(byte_range.start, nbytes), min(byte_range.end, nbytes)
    elif isinstance(byte_range, OffsetByteRequest):
        lo, hi = min(byte_range.offset, nbytes), nbytes
    else:
        lo, hi = nbytes - min(byte_range.suffix, nbytes), nbytes
    return offset + lo, offset + max(hi, lo)


MERGE_GAP = 64 * 1024
"""Ranges of one shard closer than this are read as one request: a request costs more
than reading a few unwanted bytes, on object stores by far."""


def merge_ranges(
    ranges: list[tuple[int, int, int]], gap: int
) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
    """Group (slot, start, stop) ranges into spans (start, stop, members), merging
    ranges whose distance is at most ``gap`` (overlapping and shared ranges too)."""
    spans: list[tuple[int, int, list[tuple[int, int, int]]]] = []
    for member in sorted(ranges, key=lambda r: r[1]):
        _, start, stop = member
        if spans and start - spans[-1][1] <= gap:
            span_start, span_stop, members = spans[-1]
            spans[-1] = (span_start, max(span_stop, stop), [*members, member])
        else:
            spans.append((start, stop, [member]))
    return spans
