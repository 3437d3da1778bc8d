"""The write buffer behind ``store.batch()``: chunk updates held in memory per shard.

Inside a batch a chunk write returns as soon as it is buffered. A shard is
committed as soon as the buffer covers all its chunks inside the array (no
read needed); the rest are committed when the batch ends, one
read-modify-write each. When the buffer outgrows its byte limit the fullest
shards are committed early. Buffered updates stay readable until their commit
has landed, so a read inside the batch sees the batch's own writes.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from shardstore.writing.updates import ShardUpdates, Splice, Update, merge_updates

__all__ = ["Held", "WriteBuffer"]

T = TypeVar("T")


def _size(updates: Mapping[int, list[Update]]) -> int:
    return sum(len(u.data if isinstance(u, Splice) else u or b"") for ups in updates.values() for u in ups)


@dataclass(eq=False)
class Held(Generic[T]):
    """The buffered updates of one shard."""

    shard_key: str
    target: T
    updates: ShardUpdates = field(default_factory=dict)
    nbytes: int = 0
    done: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)


class WriteBuffer(Generic[T]):
    """The updates of one ``batch()`` block, per shard: a shard is due for commit
    once ``ready(target, updates)`` says its updates cover it, or, past
    ``max_bytes`` held, the fullest shards are."""

    def __init__(self, max_bytes: int, ready: Callable[[T, ShardUpdates], bool]) -> None:
        self.max_bytes = max_bytes
        self._ready = ready
        self._lock = threading.Lock()
        self._open: dict[str, Held[T]] = {}
        self._committing: dict[str, list[Held[T]]] = {}
        self.nbytes = 0
        self.failures: list[tuple[Held[T], BaseException]] = []
        self.committed: set[str] = set()
        """Shards whose updates went to a commit (due early, or at the end)."""
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def add(self, shard_key: str, target: T, updates: Mapping[int, list[Update]]) -> list[Held[T]] | None:
        """Buffer updates; returns the shards due for commit now (None: the batch has
        closed, the caller must write directly)."""
        with self._lock:
            if self._closed:
                return None
            held = self._open.get(shard_key)
            if held is None:
                held = self._open[shard_key] = Held(shard_key, target)
            held.target = target
            merge_updates(held.updates, updates)
            added = _size(updates)
            held.nbytes += added
            self.nbytes += added
            due = [self._take(shard_key)] if self._ready(target, held.updates) else []
            if self.nbytes > self.max_bytes:
                for key in sorted(self._open, key=lambda k: -self._open[k].nbytes):
                    if self.nbytes - sum(h.nbytes for h in due) <= self.max_bytes // 2:
                        break
                    due.append(self._take(key))
            return due

    def _take(self, shard_key: str) -> Held[T]:
        held = self._open.pop(shard_key)
        self._committing.setdefault(shard_key, []).append(held)
        self.committed.add(shard_key)
        return held

    def take_all(self) -> list[Held[T]]:
        with self._lock:
            return [self._take(k) for k in list(self._open)]

    def discard_open(self) -> list[Held[T]]:
        with self._lock:
            dropped = list(self._open.values())
            self._open.clear()
            self.nbytes -= sum(h.nbytes for h in dropped)
            return dropped

    def finished(self, held: Held[T], error: BaseException | None) -> None:
        with self._lock:
            self._committing[held.shard_key].remove(held)
            if not self._committing[held.shard_key]:
                del self._committing[held.shard_key]
            self.nbytes -= held.nbytes
            if error is not None:
                self.failures.append((held, error))
        if error is None:
            held.done.set_result(None)
        else:
            held.done.set_exception(error)

    def updates_for(self, shard_key: str, position: int) -> list[Update] | None:
        """Updates to one chunk not yet in the inner store, oldest first (None: none)."""
        with self._lock:
            merged: ShardUpdates = {}
            for held in [*self._committing.get(shard_key, []), self._open.get(shard_key)]:
                if held is not None and position in held.updates:
                    merge_updates(merged, {position: held.updates[position]})
            return merged.get(position)

    def in_flight(self) -> list[concurrent.futures.Future[None]]:
        with self._lock:
            return [h.done for helds in self._committing.values() for h in helds]

    @property
    def empty(self) -> bool:
        with self._lock:
            return not self._open and not self._committing
