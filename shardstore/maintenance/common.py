"""What every tool shares: the progress callback, object sizes for progress totals,
and how many objects one batch reads. Imports only the inner-store API."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from shardstore.inner import InnerStore
from shardstore.tasks import gather

__all__ = ["VERIFY_BATCH", "Progress", "sizes_of"]

if TYPE_CHECKING:
    pass

Progress = Callable[[str, int, int], None]
"""Called with the stage of the work ("shards" checked or compacted, "chunks" decoded),
the bytes of it done so far, and its total bytes (cumulative: ``done`` only grows
within a stage; a total may grow too, if objects grow while they are read).
:class:`shardstore.progress.StageProgress` draws such calls as progress bars."""

_SIZE_BATCH = 256
"""Object sizes asked for at once (for a progress total)."""


async def sizes_of(inner: InnerStore, keys: list[str]) -> int:
    """The total size of the objects ``keys`` (gone ones count 0)."""
    total = 0
    for start in range(0, len(keys), _SIZE_BATCH):
        found = await gather(*(inner.getsize(k) for k in keys[start : start + _SIZE_BATCH]))
        total += sum(n for n in found if n is not None)
    return total


VERIFY_BATCH = 16
"""Whole shards read at once while verifying: requests in flight, memory bounded."""
