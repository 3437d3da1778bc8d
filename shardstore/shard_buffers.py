"""Memory for shards built in place, used again within one write once a commit has let
go of it.

A whole write of raw chunks copies each shard's block into a new shard object
(:meth:`~shardstore.formats.base.ShardFormat.dense_shards`), a few groups at a
time. New memory costs the kernel a page fault and a page of zeros per page, on
top of the copy: a 64 MiB write spent about 13 ms of its threads' time there
(huge pages, which numpy asks for from 4 MiB, zeroed on first touch), against
18 ms for the copy itself. The groups of one write have the same shape, so a
later group takes the memory of one committed before it.

Memory is taken again only when nothing refers to it any more: not the commit,
nor a batch holding the chunks until it ends, nor any view of them; that is, when
its reference count is what this holder's own references give. Where the
interpreter gives no such count (PyPy; a free-threaded build, whose counts other
threads change unsynchronised), every array is new. Nothing is kept after the
write: the holder goes with the call that made it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["ShardBuffers"]

_COUNTED = hasattr(sys, "getrefcount") and getattr(sys, "_is_gil_enabled", lambda: True)()
"""Whether a reference count tells that nothing else refers to an array (see above)."""


class ShardBuffers:
    """``(count, nbytes)`` byte arrays for one write's shards built in place, each
    allocated once and handed out again when idle (see the module docstring)."""

    def __init__(self) -> None:
        # the first entry, referred to by nothing else, gives the count of an idle one
        self._held: list[Any] = [object()]
        self._lock = threading.Lock()  # (encoding threads ask at once)
        self.allocated = 0
        """Arrays allocated so far (the others handed out were used again)."""

    def empty(self, count: int, nbytes: int) -> npt.NDArray[np.uint8]:
        """``count`` rows of ``nbytes`` bytes, their contents undefined: rows of an idle
        array of rows that long, else of a new one."""
        if not _COUNTED:
            self.allocated += 1
            return np.empty((count, nbytes), dtype=np.uint8)
        with self._lock:
            counts = [sys.getrefcount(held) for held in self._held]
            idle = counts[0]
            for held, references in zip(self._held[1:], counts[1:], strict=True):
                if references == idle and held.shape[1] == nbytes and len(held) >= count:
                    return held[:count]  # type: ignore[no-any-return]
            new = np.empty((count, nbytes), dtype=np.uint8)
            self._held.append(new)
            self.allocated += 1
            return new
