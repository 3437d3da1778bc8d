"""An inner store seen from one of its directories: the keys below a prefix,
without it (a precomputed volume's scale, a zarr array's shard directory)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Sequence

from zarr.abc.store import ByteRequest

from shardstore.inner.base import (
    DEFAULT_ATTEMPTS,
    AppendBuilder,
    Change,
    ChunkBytes,
    InnerStore,
    ReadInto,
    ReadThen,
)
from shardstore.inner.delegating import DelegatingInner

__all__ = ["SubdirectoryInner"]


class SubdirectoryInner(DelegatingInner):
    """The keys of ``inner`` below ``prefix/``, without the prefix."""

    def __init__(self, inner: InnerStore, prefix: str) -> None:
        super().__init__(inner)
        self.prefix = prefix.rstrip("/") + "/"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubdirectoryInner) and (self.inner, self.prefix) == (
            other.inner,
            other.prefix,
        )

    def __repr__(self) -> str:
        return f"{self.inner!r}/{self.prefix}"

    def _in(self, key: str) -> str:
        return self.prefix + key

    def _out(self, key: str) -> str:
        return key[len(self.prefix) :] if key.startswith(self.prefix) else key

    def version(self, key: str) -> Hashable | None:
        return self.inner.version(self._in(key))

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        return await self.inner.get(self._in(key), byte_range)

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        return await self.inner.get_many([(self._in(k), r) for k, r in requests])

    async def get_many_versioned(
        self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        return await self.inner.get_many_versioned([(self._in(k), r) for k, r in requests], expected)

    async def get_many_into(
        self,
        requests: Sequence[tuple[str, ByteRequest | None]],
        expected: Sequence[Hashable | None],
        into: ReadInto,
        then: ReadThen | None = None,
    ) -> list[tuple[ChunkBytes | None, Hashable | None]]:
        return await self.inner.get_many_into([(self._in(k), r) for k, r in requests], expected, into, then)

    async def get_many_if_modified(
        self, requests: Sequence[tuple[str, Hashable]]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        return await self.inner.get_many_if_modified([(self._in(k), v) for k, v in requests])

    async def getsize(self, key: str) -> int | None:
        return await self.inner.getsize(self._in(key))

    async def exists(self, key: str) -> bool:
        return await self.inner.exists(self._in(key))

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        async for key in self.inner.list_prefix(self._in(prefix)):
            yield self._out(key)

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        async for name in self.inner.list_dir(self._in(prefix)):
            yield name

    async def temporary_files(self, prefix: str) -> list[str]:
        return [self._out(k) for k in await self.inner.temporary_files(self._in(prefix))]

    async def set(self, key: str, value: bytes) -> None:
        await self.inner.set(self._in(key), value)

    async def delete(self, key: str) -> None:
        await self.inner.delete(self._in(key))

    async def update(
        self, key: str, change: Change, *, read_old: bool = True, attempts: int = DEFAULT_ATTEMPTS
    ) -> None:
        await self.inner.update(self._in(key), change, read_old=read_old, attempts=attempts)

    async def read_for_update(self, key: str) -> tuple[bytes | None, Hashable]:
        return await self.inner.read_for_update(self._in(key))

    async def write_if(self, key: str, value: bytes | None, version: Hashable) -> bool:
        return await self.inner.write_if(self._in(key), value, version)

    async def append(self, key: str, build: AppendBuilder) -> bool:
        return await self.inner.append(self._in(key), build)
