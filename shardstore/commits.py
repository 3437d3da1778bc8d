"""Per-shard commit queue: concurrent chunk updates to one shard become one commit.

zarr writes the chunks of an array as many concurrent ``set()`` calls. Each
shard has at most one commit in flight; updates arriving meanwhile gather in
the shard's next batch, which starts when the previous commit ends. So no
update can be lost to an interleaved read-modify-write, and a burst of writes
to one shard costs a few shard writes rather than one per chunk.

Batches are signalled with thread-safe futures, so writers on different event
loops (or threads) are ordered and merged just the same.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias, TypeVar

__all__ = ["CommitQueue", "Splice", "Update", "apply_updates"]


@dataclass(frozen=True)
class Splice:
    """Overwrite part of a chunk's bytes from ``start`` (a ZEP 2 partial write)."""

    start: int
    data: bytes


Update: TypeAlias = bytes | Splice | None
"""New bytes for a chunk, a splice into its current bytes, or None to erase it."""


def apply_updates(old: bytes | None, updates: list[Update]) -> bytes | None:
    value = old
    for update in updates:
        if isinstance(update, Splice):
            buf = bytearray(value or b"")
            buf[update.start : update.start + len(update.data)] = update.data
            value = bytes(buf)
        else:
            value = update
    return value


def independent_of_old(updates: list[Update]) -> bool:
    """Whether the chunk's new value can be known without reading the old one."""
    return bool(updates) and not isinstance(updates[0], Splice)


T = TypeVar("T")


@dataclass
class _Batch(Generic[T]):
    target: T
    updates: dict[int, list[Update]] = field(default_factory=dict)
    done: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)


Commit: TypeAlias = Callable[[str, T, dict[int, list[Update]]], Awaitable[None]]


class CommitQueue(Generic[T]):
    """Serialises and merges commits per shard key. ``target`` is whatever the
    commit function needs to know of the shard besides its updates."""

    def __init__(self, commit: Commit[T]) -> None:
        self._commit = commit
        self._lock = threading.Lock()
        self._pending: dict[str, _Batch[T]] = {}
        self._tail: dict[str, concurrent.futures.Future[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def submit(self, shard_key: str, target: T, updates: Mapping[int, Update]) -> None:
        """Apply ``updates`` (position -> update) to a shard; returns once committed."""
        with self._lock:
            batch = self._pending.get(shard_key)
            if batch is None:
                batch = self._pending[shard_key] = _Batch(target)
                previous = self._tail.get(shard_key)
                self._tail[shard_key] = batch.done
                task = asyncio.get_running_loop().create_task(self._run(shard_key, batch, previous))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            batch.target = target
            for pos, update in updates.items():
                if isinstance(update, Splice):
                    batch.updates.setdefault(pos, []).append(update)
                else:
                    batch.updates[pos] = [update]
        await asyncio.wrap_future(batch.done)

    async def _run(
        self, shard_key: str, batch: _Batch[T], previous: concurrent.futures.Future[None] | None
    ) -> None:
        if previous is not None:
            with contextlib.suppress(Exception):  # its own writers get its error
                await asyncio.wrap_future(previous)
        else:
            await asyncio.sleep(0)  # one loop turn: let writers already under way join
        with self._lock:
            if self._pending.get(shard_key) is batch:
                del self._pending[shard_key]
        try:
            await self._commit(shard_key, batch.target, batch.updates)
        except BaseException as exc:
            batch.done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            batch.done.set_result(None)
        finally:
            with self._lock:
                if self._tail.get(shard_key) is batch.done:
                    del self._tail[shard_key]
