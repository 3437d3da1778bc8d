"""Adapters for a zarr ``Store`` and for a plain mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping, Sequence
from typing import Any

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore, MemoryStore, WrapperStore, ZipStore

from shardstore.errors import InnerStoreError
from shardstore.inner.base import Capabilities, InnerStore, failure, names_under, slice_range
from shardstore.tasks import gather


class ZarrInner(InnerStore):
    """Any ``zarr.abc.store.Store``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.capabilities = Capabilities(
            remote=not isinstance(_innermost(store), MemoryStore | LocalStore | ZipStore)
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ZarrInner) and self.store == other.store

    def __repr__(self) -> str:
        return repr(self.store)

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        with failure("read", key):  # (a store of the user's own may hand back anything)
            buf = await self.store.get(key, default_buffer_prototype(), byte_range)
            return None if buf is None else buf.to_bytes()

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        """One ``get_partial_values`` batch. Where it fails, each read is made alone: the
        batch's error names no key (the one that failed is named by its own), and some
        stores (zarr 3.1's LocalStore, so any wrapper of one) raise for a missing key
        there where ``get`` returns None ("not found" is then per key)."""
        if len(requests) < 2:
            return [await self.get(key, byte_range) for key, byte_range in requests]
        try:
            with failure("read", requests[0][0]):
                bufs = await self.store.get_partial_values(default_buffer_prototype(), list(requests))
                return [None if b is None else b.to_bytes() for b in bufs]
        except InnerStoreError:
            return list(await gather(*(self.get(k, r) for k, r in requests)))

    async def set(self, key: str, value: bytes) -> None:
        with failure("write", key):
            await self.store.set(key, default_buffer_prototype().buffer.from_bytes(value))

    async def delete(self, key: str) -> None:
        with failure("delete", key):
            await self.store.delete(key)

    async def getsize(self, key: str) -> int | None:
        with failure("size", key):
            try:
                return await self.store.getsize(key)
            except FileNotFoundError:
                return None

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        with failure("list", prefix):
            async for key in self.store.list_prefix(prefix):
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        with failure("list", prefix):
            async for name in self.store.list_dir(prefix):
                yield name


def _innermost(store: Store) -> Store:
    while isinstance(store, WrapperStore):
        store = store._store
    return store


class MappingInner(InnerStore):
    """A plain ``mapping`` of str to bytes (a dict, a zarr v2 style store, ...)."""

    def __init__(self, mapping: MutableMapping[str, Any]) -> None:
        self.mapping = mapping

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MappingInner) and (
            self.mapping is other.mapping or self.mapping == other.mapping
        )

    def __repr__(self) -> str:
        return f"{type(self.mapping).__name__}@{id(self.mapping):#x}"

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        with failure("read", key):
            try:
                value = self.mapping[key]
            except KeyError:
                return None
            return slice_range(bytes(value), byte_range)

    async def set(self, key: str, value: bytes) -> None:
        with failure("write", key):
            self.mapping[key] = value

    async def delete(self, key: str) -> None:
        with failure("delete", key):
            self.mapping.pop(key, None)

    async def getsize(self, key: str) -> int | None:
        with failure("size", key):
            value = self.mapping.get(key)
            return None if value is None else len(value)

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        with failure("list", prefix):
            keys = [k for k in list(self.mapping) if k.startswith(prefix)]
        for key in keys:
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        with failure("list", prefix):
            names = names_under(list(self.mapping), prefix)
        for name in names:
            yield name
