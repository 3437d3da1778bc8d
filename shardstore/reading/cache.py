"""The read caches: shard indices and whole shards, by shard key, least recently
used first out, each bounded by bytes.

Index entries carry the object version they were read at, where the inner store
can tell one, so that a read can check them for free. Whole shards are
self-consistent snapshots (bytes and their own index), so a cached one can be
old but never garbage; the reader decides how long one may be served.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from shardstore.formats.base import ChunkTable, table_entry
from shardstore.formats.indexed import ShardIndex

__all__ = ["IndexCache", "IndexEntry", "LruCache", "ShardCache", "ShardSnapshot"]

V = TypeVar("V")


class LruCache(Generic[V]):
    """A thread-safe LRU mapping whose values' total size stays within ``max_bytes``."""

    def __init__(self, max_bytes: int, size: Callable[[V], int]) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, V] = OrderedDict()

    def get(self, key: str) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: str, value: V) -> None:
        nbytes = self._size(value)
        if nbytes > self.max_bytes:
            self.drop(key)
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= self._size(old)
            self._entries[key] = value
            self.nbytes += nbytes
            while self.nbytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.nbytes -= self._size(evicted)

    def drop(self, key: str) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= self._size(old)

    def __len__(self) -> int:
        return len(self._entries)


class IndexEntry(NamedTuple):
    """A shard's index, the version it was read at (where the store tells) and when
    the request that read it was sent (``time.monotonic()``)."""

    table: ShardIndex
    version: Hashable
    fetched_at: float


class IndexCache(LruCache[IndexEntry]):
    """Shard indices (with the version read with them), least recently used out
    past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, lambda entry: entry.table.nbytes)


@dataclass(frozen=True)
class ShardSnapshot:
    """A whole shard object with its checked index, as fetched by a request sent
    at ``fetched_at`` (``time.monotonic()``), at ``version`` where the store tells.
    Chunks are served from it as views (:data:`~shardstore.inner.ChunkBytes`): copying each chunk
    out of its shard costs a large read as much as decoding it."""

    data: bytes
    index: ChunkTable
    fetched_at: float
    version: Hashable | None = None

    @property
    def nbytes(self) -> int:
        return len(self.data) + (24 * len(self.index) if isinstance(self.index, dict) else self.index.nbytes)

    def chunk(self, position: int) -> tuple[int, int] | None:
        """(offset, nbytes) of the chunk at ``position`` (its id), None where absent."""
        return table_entry(self.index, position)

    def view(self, start: int, stop: int) -> memoryview:
        """Bytes ``start:stop`` of the shard, not copied."""
        return memoryview(self.data)[start:stop]


class ShardCache(LruCache[ShardSnapshot]):
    """Whole shards (with their parsed index), least recently used out past
    ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, lambda snapshot: snapshot.nbytes)
