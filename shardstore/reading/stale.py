"""Reads that meet a changed shard: how often, and how, they are tried again.

A ranged read is located by an index read earlier (a chunk's range by the shard
index, a neuroglancer minishard index by its shard index entry) and is made at
the version that index was read at; a shard replaced in between answers STALE
(or is gone), and only those items are read again, with fresh indices. Every
ranged read path goes through :func:`until_fresh`, so the attempt limit, the
backoff and the log line are the same everywhere. Never is a changed shard
reported as absent: after :data:`STALE_READS` attempts the read fails.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from shardstore.errors import ShardConflictError

__all__ = ["STALE_READS", "Attempt", "until_fresh"]

log = logging.getLogger("shardstore")

T = TypeVar("T")

STALE_READS = 8
"""Attempts of a read whose shard keeps changing under it, then ShardConflictError."""
_BACKOFF_S = 0.002
"""The first backoff's upper bound, doubling with each attempt after the second (the
first retry is at once: a cached index that was stale is the common case)."""
_MAX_BACKOFF_S = 0.2


@dataclass(frozen=True)
class Attempt:
    """Which attempt this is: the first may use cached indices, the last must decide."""

    number: int

    @property
    def first(self) -> bool:
        return self.number == 0

    @property
    def last(self) -> bool:
        return self.number == STALE_READS - 1


async def until_fresh(
    attempt: Callable[[list[T], Attempt], Awaitable[list[T]]],
    todo: list[T],
    *,
    shard_of: Callable[[T], str],
    what: str,
) -> None:
    """Run ``attempt(todo, Attempt)``, which reads what it can and returns the items that
    met a changed shard, until none is left; those are tried again (up to
    :data:`STALE_READS` attempts in all), then ShardConflictError names their shards.
    ``what``: the things read, as the error and the log line name them."""
    for number in range(STALE_READS):
        if not todo:
            return
        if number:
            log.debug(
                "%d read(s) of %s met a shard changed since its index was read: again (attempt %d of %d)",
                len(todo),
                what,
                number + 1,
                STALE_READS,
            )
        if number >= 2:  # writers keep replacing it: let them get ahead
            await asyncio.sleep(random.uniform(0, min(_MAX_BACKOFF_S, _BACKOFF_S * 2 ** (number - 2))))
        todo = await attempt(todo, Attempt(number))
    if todo:
        shards = sorted({shard_of(item) for item in todo})
        raise ShardConflictError(
            f"shard(s) {', '.join(map(repr, shards))} changed under each of {STALE_READS} attempts to read "
            f"{what} (other writers are rewriting them); try again"
        )
