"""The ``shard`` fsspec protocol: ``shard::<any fsspec URL>`` is that store, sharded.

Registered through the package's ``fsspec.specs`` entry point, so that
``zarr.open("shard::file:///data/x.zarr")`` and
``xarray.open_zarr("shard::s3://bucket/x.zarr")`` work with no import:
zarr opens the URL as an ``FsspecStore`` over this file system, whose paths
are the logical keys of a :class:`~shardstore.store.ShardingStore` wrapping
the chained (target) URL. Store options travel as this layer's storage
options: ``storage_options={"shard": {"chunks_per_shard": [8, 8]}}``; the
target's own options under its protocol name (``{"s3": {"anon": True}}``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fsspec.asyn import AsyncFileSystem
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype

from shardstore.store import ShardingStore
from shardstore.tasks import gather

__all__ = ["ShardFileSystem"]


def _byte_request(start: int | None, end: int | None) -> ByteRequest | None:
    if start is None and end is None:
        return None
    if end is None:
        return SuffixByteRequest(-start) if start is not None and start < 0 else OffsetByteRequest(start or 0)
    return RangeByteRequest(start or 0, end)


class ShardFileSystem(AsyncFileSystem):  # type: ignore[misc]
    """A file system whose files are the logical keys of a ShardingStore over ``fo``
    (a path or URL of ``target_protocol``, opened with ``target_options``);
    ``asynchronous`` and ``loop`` as for any fsspec AsyncFileSystem."""

    protocol = "shard"
    root_marker = ""

    def __init__(
        self,
        fo: str = "",
        *,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        asynchronous: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
        **store_options: Any,
    ) -> None:
        super().__init__(asynchronous=asynchronous, loop=loop)
        url = fo if "://" in fo or not target_protocol else f"{target_protocol}://{fo}"
        self.store = ShardingStore(url, storage_options=target_options or None, **store_options)

    @staticmethod
    def _key(path: str) -> str:
        return str(ShardFileSystem._strip_protocol(path)).strip("/")

    async def _cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        if end is not None and (end < 0 or (start is not None and start < 0)):
            data = await self._cat_file(path)  # a range counted from the end on both sides: rare
            return data[start:end]
        value = await self.store.get(self._key(path), default_buffer_prototype(), _byte_request(start, end))
        if value is None:
            raise FileNotFoundError(path)
        return value.to_bytes()

    async def _cat_ranges(
        self,
        paths: list[str],
        starts: list[int | None] | int | None,
        ends: list[int | None] | int | None,
        max_gap: int | None = None,
        batch_size: int | None = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> list[bytes | Exception]:
        """One ``get_partial_values`` call: the store reads each shard's index once."""
        starts = starts if isinstance(starts, list) else [starts] * len(paths)
        ends = ends if isinstance(ends, list) else [ends] * len(paths)
        requests = [(self._key(p), _byte_request(s, e)) for p, s, e in zip(paths, starts, ends, strict=True)]
        values = await self.store.get_partial_values(default_buffer_prototype(), requests)
        out: list[bytes | Exception] = []
        for path, value in zip(paths, values, strict=True):
            if value is None:
                if on_error != "return":
                    raise FileNotFoundError(path)
                out.append(FileNotFoundError(path))
            else:
                out.append(value.to_bytes())
        return out

    async def _pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        await self.store.set(self._key(path), default_buffer_prototype().buffer.from_bytes(value))

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        await self.store.delete(self._key(path))

    async def _rm(self, path: str | list[str], recursive: bool = False, **kwargs: Any) -> None:
        for one in [path] if isinstance(path, str) else path:
            key = self._key(one)
            if recursive:
                await self.store.delete_dir(key)
            if key:  # (the root is a directory, never a key: zarr and xarray empty it to overwrite)
                await self.store.delete(key)

    async def _keys_under(self, key: str) -> list[str]:
        prefix = f"{key}/" if key else ""
        return [k async for k in self.store.list_prefix(prefix)]

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        key = self._key(path)
        if key:
            try:  # one lookup: the size of a key that exists
                return {"name": key, "size": await self.store.getsize(key), "type": "file"}
            except FileNotFoundError:
                pass
        if not key or await self._keys_under(key):
            return {"name": key, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    async def _exists(self, path: str, **kwargs: Any) -> bool:
        try:
            await self._info(path)
        except FileNotFoundError:
            return False
        return True

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        key = self._key(path)
        prefix = f"{key}/" if key else ""
        names = [n async for n in self.store.list_dir(prefix)]
        if not names and key and not await self._keys_under(key):
            raise FileNotFoundError(path)
        full = [prefix + n for n in names]
        if not detail:
            return full
        return list(await gather(*(self._info(f) for f in full)))

    async def _find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        keys = sorted(await self._keys_under(self._key(path)))
        if maxdepth is not None:
            depth = self._key(path).count("/") + (1 if self._key(path) else 0)
            keys = [k for k in keys if k.count("/") - depth < maxdepth]
        if not detail:
            return keys
        sizes = await gather(*(self.store.getsize(k) for k in keys))
        return {k: {"name": k, "type": "file", "size": size} for k, size in zip(keys, sizes, strict=True)}

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Directories exist when something is below them."""

    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Directories exist when something is below them."""
