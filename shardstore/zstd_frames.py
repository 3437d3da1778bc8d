"""Where zstd frames end, and the sizes they say, read from their headers: all the
frames of a shard in one call.

A chunk's stored bytes must be exactly one zstd frame: zarr's codec refuses anything
else. zstandard's calls that decompress many frames at once do not hold them to that:
a stream runs on across chunks (a frame's last block, raw or skipped, may cover the
next chunk's frame), and the call for many frames stops at each frame's end and never
looks at what follows (the call for one frame does, where told to: a few frames are
each decoded by it instead). So the check is made here, before decoding, from the
frame format (RFC 8878, section 3.1.1): a frame is its magic number, a header whose
size its first byte says, blocks each led by a 3-byte header that gives its size, its
type and whether it is the last, and a checksum where the first byte says so. The frames are walked with
numpy, a step a block (a chunk of up to 128 KiB is one block at the usual levels, so
one step walks every frame of a shard; levels 16-22 cut one into about a dozen).
Frames alike, as one writer makes them (see :func:`_alike`), are read with half the
numpy calls. Pure functions.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["content_sizes"]

MAGIC = 0xFD2FB528
"""The first four bytes of every zstd frame (little-endian)."""
_RLE, _RESERVED = 1, 3
"""Block types: an RLE block is one byte repeated; a reserved one is invalid."""


def content_sizes(
    data: npt.NDArray[np.uint8], segments: npt.NDArray[np.uint64]
) -> npt.NDArray[np.int64] | None:
    """The content size the header of each piece of ``data`` at ``segments`` (rows of
    offset and length) says (-1: it does not say; a streamed frame), where each piece
    is one zstd frame and nothing after it, going by the headers alone (whether the
    blocks decode is zstd's to say); None where one is not: also a piece outside
    ``data``, and anything but a plain zstd frame (a skippable frame, a legacy one, a
    reserved bit set)."""
    alike = _alike(data, segments)
    return alike if alike is not None else _walked(data, segments)


_HEAD = np.arange(24)
"""Where the bytes of a frame's start lie: its magic number, header (18 bytes at most)
and first block header."""


def _alike(data: npt.NDArray[np.uint8], segments: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64] | None:
    """:func:`content_sizes` where every piece is one frame of one block with the header
    of the first (its first byte: the same fields, so in the same places), as one
    writer makes a shard's chunks of up to 128 KiB at the usual levels; None where they
    are not (or not frames at all: :func:`_walked` says which). Half the numpy calls of
    the walk: a shard's 64 frames in 29 µs against 59; in a whole 64 MiB read's
    threads, whose Python runs with cold caches, 7.4 ms of CPU against 11.2."""
    starts = segments[:, 0].astype(np.int64)
    lengths = segments[:, 1].astype(np.int64)
    if not ((lengths >= 8) & (starts + lengths <= len(data))).all():
        return None
    head = np.take(data, starts[:, None] + _HEAD, mode="clip")  # (bytes past a piece: see below)
    descriptor = int(head[0, 4])
    if descriptor & 0b1000 or not (head[:, 4] == descriptor).all():
        return None
    single_segment, size_flag = (descriptor >> 5) & 1, descriptor >> 6
    size_bytes = (1 << size_flag) if size_flag else single_segment
    size_at = 5 + (1 - single_segment) + (4 if descriptor & 3 == 3 else descriptor & 3)
    block_at = size_at + size_bytes
    fields = np.zeros((len(starts), 16), dtype=np.uint8)  # magic, content size (8), block header
    fields[:, :4] = head[:, :4]
    fields[:, 4 : 4 + size_bytes] = head[:, size_at:block_at]
    fields[:, 12:15] = head[:, block_at : block_at + 3]
    magic, low, high, block = fields.view("<u4").T.astype(np.int64)
    kind = (block >> 1) & 3
    if not ((magic == MAGIC) & (block & 1 == 1) & (kind != _RESERVED)).all():
        return None
    # (ends past block_at + 3: a piece too short for its header read bytes past its end)
    ends = block_at + 3 + np.where(kind == _RLE, 1, block >> 3) + 4 * ((descriptor >> 2) & 1)
    if not (ends == lengths).all():
        return None
    if not size_bytes:
        return np.full(len(starts), -1, dtype=np.int64)
    return low + (high << 32) + (256 if size_bytes == 2 else 0)


def _walked(data: npt.NDArray[np.uint8], segments: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64] | None:
    """:func:`content_sizes` of any pieces, walked a block a step."""
    starts = segments[:, 0].astype(np.int64)
    stops = starts + segments[:, 1].astype(np.int64)
    # (the magic number, the frame header's first byte and a block header, at least)
    if not ((segments[:, 1] >= 8) & (stops <= len(data))).all():
        return None
    magic, descriptor = _words(data, starts, 8).T
    descriptor &= 0xFF
    if not ((magic == MAGIC) & (descriptor & 0b1000 == 0)).all():
        return None
    single_segment = (descriptor >> 5) & 1
    size_flag = descriptor >> 6
    size_bytes = np.where(size_flag == 0, single_segment, 1 << size_flag)
    size_at = starts + 5 + (1 - single_segment) + np.where(descriptor & 3 == 3, 4, descriptor & 3)
    low, high = _words(data, size_at, 8).T
    sizes = np.where(size_bytes == 8, low | (high << 32), low & ((1 << (8 * np.minimum(size_bytes, 4))) - 1))
    sizes = np.where(size_bytes == 0, -1, sizes + np.where(size_bytes == 2, 256, 0))
    at = size_at + size_bytes
    walking = np.arange(len(starts))
    while len(walking):  # a step a block; a frame leaves the walk after its last block
        here = at[walking]
        if not (here + 3 <= stops[walking]).all():
            return None
        header = _words(data, here, 4)[:, 0] & 0xFFFFFF
        kind = (header >> 1) & 3
        if (kind == _RESERVED).any():
            return None
        at[walking] = here + 3 + np.where(kind == _RLE, 1, header >> 3)
        walking = walking[header & 1 == 0]
    return sizes if (at + 4 * ((descriptor >> 2) & 1) == stops).all() else None


def _words(data: npt.NDArray[np.uint8], at: npt.NDArray[np.int64], nbytes: int) -> npt.NDArray[np.int64]:
    """The ``nbytes`` (a multiple of 4) bytes at each of ``at`` of ``data`` as unsigned
    little-endian 32-bit integers, a row each: one gather (a byte past the end reads as
    the last one; callers mask it off)."""
    gathered = np.take(data, at[:, None] + np.arange(nbytes), mode="clip")
    return gathered.view("<u4").astype(np.int64)
