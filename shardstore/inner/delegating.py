"""An inner store that passes everything on to another: the base of wrappers.

A wrapper (counting requests, injecting faults, adding latency) overrides only
what it changes; capabilities and every other operation are the wrapped
store's, so a new capability cannot be forgotten in one wrapper.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Hashable, Sequence

from zarr.abc.store import ByteRequest

from shardstore.inner.base import DEFAULT_ATTEMPTS, AppendBuilder, Change, InnerStore

__all__ = ["DelegatingInner"]


class DelegatingInner(InnerStore):
    """Every operation and capability of ``inner``, unchanged."""

    def __init__(self, inner: InnerStore) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        if type(self).get_many_into is InnerStore.get_many_into:  # (reads in threads only if passed on)
            self.capabilities = dataclasses.replace(inner.capabilities, hands_as_read=False)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DelegatingInner) and type(other) is type(self) and self.inner == other.inner

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    # -- capabilities ------------------------------------------------------------

    @property
    def lock_scope(self) -> Hashable:
        return self.inner.lock_scope

    def version(self, key: str) -> Hashable | None:
        return self.inner.version(key)

    def object_size(self, version: Hashable | None) -> int | None:
        return self.inner.object_size(version)

    # -- reads -------------------------------------------------------------------

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        return await self.inner.get(key, byte_range)

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        return await self.inner.get_many(requests)

    async def get_many_versioned(
        self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        return await self.inner.get_many_versioned(requests, expected)

    async def get_many_if_modified(
        self, requests: Sequence[tuple[str, Hashable]]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        return await self.inner.get_many_if_modified(requests)

    async def getsize(self, key: str) -> int | None:
        return await self.inner.getsize(key)

    async def exists(self, key: str) -> bool:
        return await self.inner.exists(key)

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        async for key in self.inner.list_prefix(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        async for name in self.inner.list_dir(prefix):
            yield name

    async def temporary_files(self, prefix: str) -> list[str]:
        return await self.inner.temporary_files(prefix)

    # -- writes ------------------------------------------------------------------

    async def set(self, key: str, value: bytes) -> None:
        await self.inner.set(key, value)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def update(
        self, key: str, change: Change, *, read_old: bool = True, attempts: int = DEFAULT_ATTEMPTS
    ) -> None:
        await self.inner.update(key, change, read_old=read_old, attempts=attempts)

    async def read_for_update(self, key: str) -> tuple[bytes | None, Hashable]:
        return await self.inner.read_for_update(key)

    async def write_if(self, key: str, value: bytes | None, version: Hashable) -> bool:
        return await self.inner.write_if(key, value, version)

    async def append(self, key: str, build: AppendBuilder) -> bool:
        return await self.inner.append(key, build)
