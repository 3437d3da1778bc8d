"""Where zstd frames end, and the sizes they say, read from their headers: all the
frames of a shard in one call.

A chunk's stored bytes must be exactly one zstd frame: zarr's codec refuses anything
else. zstandard's calls that decompress many frames at once do not hold them to that:
a stream runs on across chunks (a frame's last block, raw or skipped, may cover the
next chunk's frame), and a call a frame stops at each frame's end and never looks at
what follows. So the check is made here, before decoding, from the frame format (RFC
8878, section 3.1.1): a frame is its magic number, a header whose size its first byte
says, blocks each led by a 3-byte header that gives its size, its type and whether it
is the last, and a checksum where the first byte says so. The frames are walked with
numpy, a step a block (a chunk of up to 128 KiB is one block, so one step walks every
frame of a shard): about 55 µs a call, whatever their number (a few frames are each
decompressed on their own instead, by a call that checks them whole). Pure functions.
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
