"""The array catalog: which paths hold arrays, with their geometry and sharding.

Fed by every metadata document the store reads or writes, so that the
geometry follows zarr (which writes new metadata before the chunks of a grown
array, and reads it whenever it opens one); a path not yet seen is looked up
in the inner store. Entries are dropped when their documents are deleted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from shardstore.errors import StaleArrayError
from shardstore.inner import InnerStore
from shardstore.keys import candidate_array_paths, join_path
from shardstore.metadata import (
    ARRAY_DOC_NAMES,
    DRAFT_DOC,
    V2_ARRAY,
    V3_NAME,
    ArrayInfo,
    array_info,
    draft_document_key,
    load_document,
)
from shardstore.tasks import gather

if TYPE_CHECKING:
    from shardstore.addressing import ShardAddress

__all__ = ["ArrayCatalog"]


class ArrayCatalog:
    """What one store knows of the arrays in ``inner`` (the adapted inner store):
    fed by the metadata documents it reads and writes, looked up there otherwise."""

    def __init__(self, inner: InnerStore) -> None:
        self._inner = inner
        # path -> document name -> (document present, the array it describes if any)
        self._docs: dict[str, dict[str, tuple[bool, ArrayInfo | None]]] = {}
        self._zarr_sharded: set[str] = set()
        """Paths where zarr wrote ``sharding_indexed`` metadata through this store: zarr
        shards those arrays itself, so they pass through untouched."""
        self.generation = 0
        """Bumped whenever what the catalog knows changes: answers derived from it expire."""

    def remember(self, path: str, name: str, raw: bytes | None) -> ArrayInfo | None:
        """Record what a metadata document read or written through the store says."""
        if name not in ARRAY_DOC_NAMES and name != DRAFT_DOC:
            return None
        doc = None if raw is None else load_document(raw)
        info = None if doc is None else array_info(path, name, doc)
        if info is not None and info.form == "codec" and path in self._zarr_sharded:
            info = replace(info, shard_format=None, codec_sharded=True, form="transformer")
        self._docs.setdefault(path, {})[name] = (raw is not None, info)
        self.generation += 1
        return info

    def zarr_shards(self, path: str, itself: bool) -> None:
        """Record whether zarr itself shards the array it just wrote at ``path``."""
        if itself:
            self._zarr_sharded.add(path)
        else:
            self._zarr_sharded.discard(path)

    def zarr_sharded(self, path: str) -> bool:
        return path in self._zarr_sharded

    def forget(self, prefix: str) -> None:
        """Drop every path at or below the directory ``prefix`` ("" or ending in "/")."""
        for path in [p for p in self._docs if join_path(p, "").startswith(prefix)]:
            del self._docs[path]
        self.generation += 1

    def _known(self, path: str) -> tuple[bool, ArrayInfo | None]:
        """Whether the catalog can tell what is at ``path``, and the array if so."""
        docs = self._docs.get(path, {})
        if DRAFT_DOC in docs:
            return True, docs[DRAFT_DOC][1]
        present, info = docs.get(V3_NAME, (False, None))
        if present:  # zarr reads zarr.json whenever there is one, whatever .zarray says
            return True, info
        if all(n in docs for n in ARRAY_DOC_NAMES):
            return True, docs[V2_ARRAY][1]
        return False, None

    async def lookup(self, path: str, *, refresh: bool = False) -> ArrayInfo | None:
        if refresh:
            self._docs.pop(path, None)
            self.generation += 1
        known, info = self._known(path)
        if known:
            return info
        draft = draft_document_key(path)
        if draft is not None:  # the v3 draft's layout: metadata kept apart from the chunks
            self.remember(path, DRAFT_DOC, await self._inner.get(draft))
            return self._known(path)[1]
        docs = self._docs.get(path, {})
        missing = [n for n in ARRAY_DOC_NAMES if n not in docs]
        raws = await self._inner.get_many([(join_path(path, n), None) for n in missing])
        for name, raw in zip(missing, raws, strict=True):
            self.remember(path, name, raw)
        return self._known(path)[1]

    async def document(self, path: str, name: str, *, refresh: bool = False) -> ArrayInfo | None:
        """The array one metadata document at ``path`` describes (fetched if unknown, or
        with ``refresh``)."""
        docs = self._docs.get(path, {})
        if refresh or name not in docs:
            self.remember(path, name, await self._inner.get(join_path(path, name)))
        return self._docs[path][name][1]

    async def array_for_key(self, key: str, *, refresh: bool = False) -> ArrayInfo | None:
        """The array whose chunk keys ``key`` is written like (whatever its rank), if any."""
        for path in candidate_array_paths(key):
            info = await self.lookup(path, refresh=refresh)
            if info is not None and info.looks_like_chunk_key(key):
                return info
        return None

    async def array_for_shard_file(self, key: str) -> ArrayInfo | None:
        """The array whose format names its shard objects itself and whose chunk prefix
        holds ``key``, named as one of them there or one directory below (its shard
        directory, or one an interrupted resize left): such keys are no chunk keys.
        Whether it is one of the array's shards now is
        :func:`~shardstore.addressing.shard_at`'s to say."""
        parts = key.split("/")[:-1]
        for up in range(min(len(parts), 3) + 1):  # <array>/[c/][directory/]<shard file>
            info = await self.lookup("/".join(parts[: len(parts) - up]))
            fmt = None if info is None else info.shard_format
            if info is None or fmt is None or not fmt.named_shards or not key.startswith(info.chunk_prefix):
                continue
            rest = key[len(info.chunk_prefix) :].split("/")
            if len(rest) <= 2 and fmt.shard_of_file(rest[-1]) is not None:
                return info
        return None

    async def confirm_place(self, shard: ShardAddress) -> None:
        """Raise StaleArrayError if the array's stored metadata, read afresh, numbers or
        places its chunk ids otherwise than ``shard`` was located by: another process
        resized it since this store read it (the catalog then knows the new metadata)."""
        was = shard.info
        name = next((n for n, (_, info) in self._docs.get(was.path, {}).items() if info == was), V3_NAME)
        raw = await self._inner.get(join_path(was.path, name))
        doc = None if raw is None else load_document(raw)
        now = None if doc is None else array_info(was.path, name, doc)
        if now is None or now.shard_format is None or now == was:
            return  # unchanged, or deleted (a write then makes an orphan, as in zarr)
        self.remember(was.path, name, raw)
        if now.shard_prefix != was.shard_prefix or now.shard_format.renumbers(was.grid_shape, now.grid_shape):
            raise StaleArrayError(
                f"array {was.path or '/'!r} was resized elsewhere (shape {list(was.shape)} -> "
                f"{list(now.shape)}) since this store read its metadata, which moved its chunks to "
                f"new ids; shard {shard.key!r} was not used. Re-open the array"
            )

    async def sharded_array_around(self, prefix: str) -> ArrayInfo | None:
        """The sharded array whose directory holds or is ``prefix``, if any."""
        parts = prefix.split("/")[:-1] if prefix else []
        paths = ["", *("/".join(parts[: i + 1]) for i in range(len(parts)))]
        infos = await gather(*(self.lookup(p) for p in paths))
        return next((i for i in infos if i is not None and i.shard_format is not None), None)
