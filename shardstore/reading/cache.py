"""The read caches: parts of shard indices, by shard and part, and whole shards, by
shard key; least recently used first out, each bounded by bytes.

An index part (a whole index, or a neuroglancer minishard index: whatever part of
a shard's index a format locates chunks by) carries the object version it was
read at, where the inner store can tell one, so that a read can check it for
free. Whole shards are self-consistent snapshots (bytes and their own table), so
a cached one can be old but never garbage; the reader decides how long one may be
served.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from shardstore.formats.base import ChunkTable, table_entry

__all__ = ["IndexCache", "IndexEntry", "LruCache", "ShardCache", "ShardSnapshot", "table_nbytes"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """A thread-safe LRU mapping whose values' total size stays within ``max_bytes``."""

    def __init__(self, max_bytes: int, size: Callable[[V], int]) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: K, value: V) -> None:
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
                gone, evicted = self._entries.popitem(last=False)
                self.nbytes -= self._size(evicted)
                self._evicted(gone)

    def drop(self, key: K) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= self._size(old)
                self._evicted(key)

    def _evicted(self, key: K) -> None:
        """(Called with the lock held when ``key`` leaves the cache.)"""

    def __len__(self) -> int:
        return len(self._entries)


class IndexEntry(NamedTuple):
    """A part of a shard's index as a table, the version it was read at (where the
    store tells) and when the request that read it was sent (``time.monotonic()``)."""

    table: ChunkTable
    version: Hashable
    fetched_at: float


def table_nbytes(table: ChunkTable) -> int:
    return 24 * len(table) if isinstance(table, dict) else table.nbytes


class IndexCache(LruCache[tuple[str, int], IndexEntry]):
    """Parts of shard indices by ``(shard key, part)`` (with the version read with them),
    least recently used out past ``max_bytes``; a shard's parts go together."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, lambda entry: table_nbytes(entry.table))
        self._parts: dict[str, set[int]] = {}

    def put(self, key: tuple[str, int], value: IndexEntry) -> None:
        super().put(key, value)
        with self._lock:
            if key in self._entries:
                self._parts.setdefault(key[0], set()).add(key[1])

    def _evicted(self, key: tuple[str, int]) -> None:
        parts = self._parts.get(key[0])
        if parts is not None:
            parts.discard(key[1])
            if not parts:
                del self._parts[key[0]]

    def drop_shard(self, shard_key: str) -> None:
        """Every part of a shard's index goes (the shard changed)."""
        with self._lock:
            parts = list(self._parts.get(shard_key, ()))
        for part in parts:
            self.drop((shard_key, part))


@dataclass(frozen=True)
class ShardSnapshot:
    """A whole shard object with its checked index, as fetched by a request sent
    at ``fetched_at`` (``time.monotonic()``), at ``version`` where the store tells.
    Chunks are served from it as views (:data:`~shardstore.inner.ChunkBytes`): copying each chunk
    out of its shard costs a large read as much as decoding it. Its bytes are a
    memoryview where read into memory a read gave (one never cached)."""

    data: bytes | memoryview
    index: ChunkTable
    fetched_at: float
    version: Hashable | None = None

    @property
    def nbytes(self) -> int:
        return len(self.data) + table_nbytes(self.index)

    def chunk(self, position: int) -> tuple[int, int] | None:
        """(offset, nbytes) of the chunk at ``position`` (its id), None where absent."""
        return table_entry(self.index, position)

    def view(self, start: int, stop: int) -> memoryview:
        """Bytes ``start:stop`` of the shard, not copied."""
        return memoryview(self.data)[start:stop]


class ShardCache(LruCache[str, ShardSnapshot]):
    """Whole shards (with their parsed index), least recently used out past
    ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, lambda snapshot: snapshot.nbytes)
