"""The shard-index cache: indices by shard key, least recently used first out,
bounded by bytes. Entries carry the object version they were read at, where the
inner store can tell one, so that a read can check it for free."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from shardstore.format import ShardIndex

__all__ = ["IndexCache"]


class IndexCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[ShardIndex, Hashable]] = OrderedDict()

    def get(self, key: str) -> tuple[ShardIndex, Hashable] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: str, index: ShardIndex, version: Hashable) -> None:
        if index.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old[0].nbytes
            self._entries[key] = (index, version)
            self.nbytes += index.nbytes
            while self.nbytes > self.max_bytes:
                _, (evicted, _) = self._entries.popitem(last=False)
                self.nbytes -= evicted.nbytes

    def drop(self, key: str) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old[0].nbytes

    def __len__(self) -> int:
        return len(self._entries)
