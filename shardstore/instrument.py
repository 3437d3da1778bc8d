"""Counting what the sharding layer asks of the inner store.

Requests and bytes moved are stable where timings are not, so tests and
benchmarks assert on these. Wrap any inner store::

    counted = CountingInner(some_store)   # anything ShardingStore accepts
    store = ShardingStore(counted, chunks_per_shard=(8, 8))
    ...
    counted.counts.reads, counted.counts.bytes_written
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

from shardstore.inner import STALE, UNCHANGED, AppendBuilder, Change, ChunkBytes, adapt
from shardstore.inner.base import DEFAULT_ATTEMPTS, NOT_MODIFIED, ReadInto, ReadThen, written_nbytes
from shardstore.inner.delegating import DelegatingInner

__all__ = ["CountingInner", "CountingStore", "RequestCounts"]


@dataclass
class RequestCounts:
    """Requests an inner store received, by kind."""

    reads: int = 0
    """Object reads, whole or ranged (each item of a batch counts)."""
    read_batches: int = 0
    """Calls that issued reads: a batch of several ranges is one."""
    writes: int = 0
    deletes: int = 0
    lists: int = 0
    sizes: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_keys: Counter[str] = field(default_factory=Counter)
    unranged_reads: Counter[str] = field(default_factory=Counter)

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


class CountingInner(DelegatingInner):
    """An inner store that counts every request passed on to the one it wraps
    (``inner``, with ``storage_options``, as ShardingStore accepts it)."""

    def __init__(self, inner: Any, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__(adapt(inner, storage_options))
        self.counts = RequestCounts()
        self._lock = threading.Lock()

    def _count_reads(
        self, requests: Sequence[tuple[str, ByteRequest | None]], values: Sequence[ChunkBytes | None]
    ) -> None:
        self._count_sizes(requests, [0 if value is None else len(value) for value in values])

    def _count_sizes(self, requests: Sequence[tuple[str, ByteRequest | None]], sizes: Sequence[int]) -> None:
        self.counts.read_batches += 1
        self.counts.reads += len(requests)
        for (key, byte_range), size in zip(requests, sizes, strict=True):
            self.counts.read_keys[key] += 1
            if byte_range is None:
                self.counts.unranged_reads[key] += 1
            self.counts.bytes_read += size

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        value = await self.inner.get(key, byte_range)
        self._count_reads([(key, byte_range)], [value])
        return value

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        values = await self.inner.get_many(requests)
        self._count_reads(requests, values)
        return values

    async def get_many_versioned(
        self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        results = await self.inner.get_many_versioned(requests, expected)
        self._count_reads(requests, [v if v is not STALE else None for v, _ in results])
        return results

    async def get_many_into(
        self,
        requests: Sequence[tuple[str, ByteRequest | None]],
        expected: Sequence[Hashable | None],
        into: ReadInto,
        then: ReadThen | None = None,
    ) -> list[tuple[ChunkBytes | None, Hashable | None]]:
        if then is not None:  # each value goes to then, not into the list: its size is noted on the way
            sizes = [0] * len(requests)

            def sized(k: int, value: ChunkBytes | None, version: Hashable | None) -> None:
                sizes[k] = 0 if value is None or value is STALE else len(value)
                then(k, value, version)

            results = await self.inner.get_many_into(requests, expected, into, sized)
            self._count_sizes(requests, sizes)
            return results
        results = await self.inner.get_many_into(requests, expected, into)
        self._count_reads(requests, [v if v is not STALE else None for v, _ in results])
        return results

    async def get_many_if_modified(
        self, requests: Sequence[tuple[str, Hashable]]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        results = await self.inner.get_many_if_modified(requests)
        self._count_reads(
            [(k, None) for k, _ in requests], [v if v is not NOT_MODIFIED else None for v, _ in results]
        )
        return results

    async def set(self, key: str, value: bytes) -> None:
        await self.inner.set(key, value)
        self.counts.writes += 1
        self.counts.bytes_written += len(value)

    async def update(
        self, key: str, change: Change, *, read_old: bool = True, attempts: int = DEFAULT_ATTEMPTS
    ) -> None:
        await self.inner.update(
            key, self._counted(key, change, read_old), read_old=read_old, attempts=attempts
        )

    async def update_many(
        self,
        changes: Sequence[tuple[str, Change]],
        *,
        read_old: bool = True,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> list[Exception | None]:
        counted = [(key, self._counted(key, change, read_old)) for key, change in changes]
        return await self.inner.update_many(counted, read_old=read_old, attempts=attempts)

    def _counted(self, key: str, change: Change, read_old: bool) -> Change:
        """``change``, counting what it reads and writes (in the inner store's worker
        threads, several at once: under a lock, so that no count is lost)."""

        def counted(old: bytes | None) -> bytes | None:
            if read_old:
                with self._lock:
                    self._count_reads([(key, None)], [old])
            new = change(old)
            with self._lock:
                if new is None and (old is not None or not read_old):
                    self.counts.deletes += 1
                elif new is not None and new is not UNCHANGED:
                    self.counts.writes += 1
                    self.counts.bytes_written += written_nbytes(new)
            return new

        return counted

    async def append(self, key: str, build: AppendBuilder) -> bool:
        appended = 0

        def counted(size: int, read: Callable[[int, int], bytes]) -> bytes | None:
            nonlocal appended
            payload = build(size, read)
            appended = len(payload or b"")
            return payload

        done = await self.inner.append(key, counted)
        self.counts.reads += 1  # the index (and any chunk spliced into) read under the lock
        if appended:
            self.counts.writes += 1
            self.counts.bytes_written += appended
        return done

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)
        self.counts.deletes += 1

    async def getsize(self, key: str) -> int | None:
        self.counts.sizes += 1
        return await self.inner.getsize(key)

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        self.counts.lists += 1
        async for key in self.inner.list_prefix(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        self.counts.lists += 1
        async for name in self.inner.list_dir(prefix):
            yield name


class CountingStore(WrapperStore[Store]):
    """A zarr store wrapper with the same counts, for zarr's own layouts (unsharded
    chunks, the sharding codec) in benchmarks beside ShardingStore."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.counts = RequestCounts()

    def _with_store(self, store: Store) -> CountingStore:
        return type(self)(store)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        value = await self._store.get(key, prototype, byte_range)
        self.counts.read_batches += 1
        self.counts.reads += 1
        self.counts.read_keys[key] += 1
        if byte_range is None:
            self.counts.unranged_reads[key] += 1
        self.counts.bytes_read += 0 if value is None else len(value)
        return value

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        requests = list(key_ranges)
        values = await self._store.get_partial_values(prototype, requests)
        self.counts.read_batches += 1
        self.counts.reads += len(requests)
        self.counts.bytes_read += sum(0 if v is None else len(v) for v in values)
        return values

    async def set(self, key: str, value: Buffer) -> None:
        await self._store.set(key, value)
        self.counts.writes += 1
        self.counts.bytes_written += len(value)

    async def delete(self, key: str) -> None:
        await self._store.delete(key)
        self.counts.deletes += 1
