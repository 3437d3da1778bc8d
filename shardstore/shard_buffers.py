"""Memory for shards built in place or read whole, used again within one write or read
once nothing refers to it any more.

A whole write of raw chunks copies each shard's block into a new shard object
(:meth:`~shardstore.formats.base.ShardFormat.dense_shards`), a few groups at a
time. New memory costs the kernel a page fault and a page of zeros per page, on
top of the copy: a 64 MiB write spent about 13 ms of its threads' time there
(huge pages, which numpy asks for from 4 MiB, zeroed on first touch), against
18 ms for the copy itself. The groups of one write have the same shape, so a
later group takes the memory of one committed before it. A whole read fetches its
shards into new memory alike: a 64 MiB read of zstd chunks took about 11,800 page
faults and 70 ms of kernel time more than reading into memory used again; there a
later group of shards is read into the memory of one already decoded.

Memory is taken again only when nothing refers to it any more: not the commit,
nor a batch holding the chunks until it ends, nor any view of them; that is, when
its reference count is what this holder's own references give. Where the
interpreter gives no such count (PyPy; a free-threaded build, whose counts other
threads change unsynchronised), every array is new.

Only arrays of TRACKED_FROM bytes or more are handed out again: malloc serves smaller
ones from its heap, in memory freed before, and tracking each of the thousand 4 KiB
shards of a read of 64-byte chunks cost more than the read's decoding.

When the call ends, what nothing refers to is kept for the next call, up to
SPARE_BYTES in the process: memory freed goes back to the kernel, and the next
read would pay the faults again (the 64 MiB zstd read: 6,000 faults and 14 ms of
kernel time more than with memory kept, 6 to 10 ms of its time). What is still
referred to (a shard the cache keeps, a chunk a caller holds) is left to its
holders.
"""

from __future__ import annotations

import bisect
import sys
import threading
from typing import Any, Self, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = ["ShardBuffers"]

ROOM = 32
"""A new array holds 1/ROOM more than asked for, so that a later shard a little bigger
(shards read whole differ a little in size) fits in it."""
TRACKED_FROM = 128 << 10
"""Smaller arrays are always new (see the module docstring): glibc's malloc takes
memory from the kernel (faults and zeros) from this size on, by default."""
SPARE_BYTES = 48 << 20
"""Idle memory a process keeps between calls: most of what a whole read of 1 MiB shards
holds at once (two groups of 32 shards fetched, a shard's chunks decoded per thread).
80 MiB, all of it, gave no faster repeated reads of 64 MiB (106.0 against 107.9 ms)."""
_COUNTED = hasattr(sys, "getrefcount") and getattr(sys, "_is_gil_enabled", lambda: True)()
"""Whether a reference count tells that nothing else refers to an array (see above)."""

_Bytes: TypeAlias = npt.NDArray[np.uint8]


class _Spare:
    """Idle arrays kept between calls, SPARE_BYTES at most, smallest first."""

    def __init__(self) -> None:
        self._arrays: list[_Bytes] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> _Bytes | None:
        with self._lock:
            i = bisect.bisect_left(self._arrays, nbytes, key=len)
            return self._arrays.pop(i) if i < len(self._arrays) else None

    def keep(self, arrays: list[_Bytes]) -> None:
        with self._lock:
            room = SPARE_BYTES - sum(len(array) for array in self._arrays)
            for array in sorted(arrays, key=len):
                if len(array) > room:
                    break
                bisect.insort(self._arrays, array, key=len)
                room -= len(array)


_SPARE = _Spare()


class ShardBuffers:
    """Memory for one write's shards built in place (:meth:`empty`) or one read's
    shards read whole and chunks decoded side by side (:meth:`flat`, :meth:`empty`),
    handed out again when idle; what is idle when the call ends is kept for the next
    (see the module docstring): use it as a context manager around the call."""

    def __init__(self) -> None:
        # the first entry, referred to by nothing else, gives the count of an idle one
        self._held: list[Any] = [object()]
        self._lock = threading.Lock()  # (threads ask at once)
        self.allocated = 0
        """Arrays allocated so far (the others handed out were idle ones)."""

    def empty(self, count: int, nbytes: int) -> _Bytes:
        """``count`` rows of ``nbytes`` bytes, their contents undefined (an
        :data:`~shardstore.formats.base.Allocate`)."""
        return self._taken(count * nbytes).reshape(count, nbytes)

    def flat(self, nbytes: int) -> memoryview:
        """``nbytes`` writable bytes, their contents undefined."""
        return memoryview(self._taken(nbytes))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            counts = [sys.getrefcount(held) for held in self._held]
            _SPARE.keep([held for held, n in zip(self._held[1:], counts[1:], strict=True) if n == counts[0]])
            del self._held[1:]

    def _taken(self, nbytes: int) -> _Bytes:
        """The first ``nbytes`` of the smallest idle array that holds them: held, else
        spare, else new (always new below TRACKED_FROM)."""
        if nbytes < TRACKED_FROM or not _COUNTED:
            self.allocated += 1
            return np.empty(nbytes, dtype=np.uint8)
        with self._lock:
            held = self._held
            counts = [sys.getrefcount(array) for array in held]  # (each counted alike)
            fits = [i for i in range(1, len(held)) if counts[i] == counts[0] and len(held[i]) >= nbytes]
            if fits:
                return held[min(fits, key=lambda i: len(held[i]))][:nbytes]  # type: ignore[no-any-return]
            array = _SPARE.take(nbytes)
            if array is None:
                array = np.empty(nbytes + nbytes // ROOM, dtype=np.uint8)
                self.allocated += 1
            self._held.append(array)
            return array[:nbytes]
