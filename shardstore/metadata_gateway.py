"""Metadata documents between zarr and the inner store.

zarr must see plain array metadata (zarr-python refuses our
``storage_transformers`` entry, and our marker codec is there to make plain
readers fail), while the inner store must keep the sharding config. Reads
strip it (:func:`~shardstore.metadata.present_document`), writes decide or
keep each array's sharding and record it again
(:func:`~shardstore.metadata.inject_sharding`), consolidated copies included.
Every document read or written feeds the catalog.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import zarr
from zarr.abc.store import ByteRequest

from shardstore.catalog import ArrayCatalog
from shardstore.choices import Layout, Renumbering
from shardstore.chunk_grids import check_rectilinear_supported, is_rectilinear
from shardstore.errors import ShardingConfigError, ShardingPassthroughWarning, UnshardedArrayWarning
from shardstore.formats.base import ShardFormat
from shardstore.inner import InnerStore, slice_range
from shardstore.inner.base import DEFAULT_ATTEMPTS
from shardstore.keys import join_path, split_key
from shardstore.metadata import (
    ARRAY_DOC_NAMES,
    V3_NAME,
    ArrayInfo,
    ShardingPolicy,
    array_info,
    consolidated_arrays,
    dump_document,
    inject_sharding,
    load_document,
    present_document,
)
from shardstore.renumbering import Migration, delete_old, migrate, shard_keys
from shardstore.tasks import gather

__all__ = ["MetadataGateway"]

"""What a resize that would give stored chunks new ids (neuroglancer format) does."""


class MetadataGateway:
    """Reads and writes the metadata documents in ``inner`` for one store, keeping
    ``catalog`` informed: ``policy`` shards new arrays, recorded in ``form`` (our
    transformer entry, or standard codec metadata)."""

    def __init__(
        self,
        inner: InnerStore,
        catalog: ArrayCatalog,
        policy: ShardingPolicy,
        form: Layout,
        *,
        renumbering: Renumbering = "migrate",
        attempts: int = DEFAULT_ATTEMPTS,
        settle: Callable[[], Awaitable[None]] | None = None,
        forget: Callable[[str], None] | None = None,
    ) -> None:
        self._inner = inner
        self._catalog = catalog
        self._policy = policy
        self._form = form
        self._renumbering = renumbering
        self._attempts = attempts
        self._settle = settle  # commits what a batch() holds: a migration copies what is stored
        self._forget = forget  # drops what readers cached of a shard the migration deletes
        self._unsharded_ranks: set[int] = set()

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        """A metadata document as zarr must see it: without our transformer entry."""
        path, name = split_key(key)
        raw = await self._inner.get(key)
        info = self._catalog.remember(path, name, raw)
        if info is not None and info.passthrough_reason is not None and self._policy.names(path):
            warnings.warn(
                f"array {path or '/'!r} is passed through, not served by shardstore: "
                f"{info.passthrough_reason}",
                ShardingPassthroughWarning,
                stacklevel=2,
            )
        if raw is None:
            return None
        doc = load_document(raw)
        if doc is not None:
            _check_readable(path, name, doc)
        if doc is not None and present_document(path, name, doc, self._catalog.zarr_sharded):
            raw = dump_document(doc)
        return slice_range(raw, byte_range)

    async def get_many(self, requests: list[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        return list(await gather(*(self.get(k, r) for k, r in requests)))

    async def set(self, key: str, raw: bytes) -> None:
        """Write a metadata document, recording (or keeping) the array's sharding config."""
        path, name = split_key(key)
        doc = load_document(raw)
        migration = None
        if doc is not None:
            changed = False
            written = array_info(path, name, doc) if name in ARRAY_DOC_NAMES else None
            if written is not None:
                itself = written.form == "codec" or written.codec_sharded  # zarr's own sharding codec
                self._catalog.zarr_shards(path, itself)
                decided, migration = (
                    (None, None) if itself else await self._format_for_written(path, name, written, doc)
                )
                if decided is not None:
                    inject_sharding(doc, *decided)
                    changed = True
            children = consolidated_arrays(name, doc)
            infos = await gather(*(self._catalog.lookup(f"{path}/{rel}".strip("/")) for rel in children))
            for child, info in zip(children.values(), infos, strict=True):
                if info is not None and info.shard_format is not None:
                    inject_sharding(child, info.shard_format, info.form)
                    changed = True
            if changed:
                raw = dump_document(doc)
        await self.write_as_is(key, raw)  # the commit of a migration, if there is one
        if migration is not None:
            await delete_old(self._inner, migration, path, self._forget)

    async def write_as_is(self, key: str, raw: bytes) -> None:
        """Write a document exactly as given, and note it in the catalog."""
        await self._inner.set(key, raw)
        self._catalog.remember(*split_key(key), raw)

    async def _format_for_written(
        self, path: str, name: str, written: ArrayInfo, doc: dict[str, Any]
    ) -> tuple[tuple[ShardFormat, Layout] | None, Migration | None]:
        """How a plain array document zarr writes is to be sharded, and in which form;
        and the migration of its chunks to new ids that the document commits, if any."""
        if written.shard_format is not None:  # the writer recorded a config itself
            return (written.shard_format, "transformer"), None
        existing = await self._catalog.document(path, name)  # the document being replaced
        if (
            existing is not None
            and existing.shard_format is not None
            and existing.shard_format.places_follow_grid
        ):
            # Chunk ids: another process may have moved them since we read it.
            existing = await self._catalog.document(path, name, refresh=True)
        if existing is not None and (existing.chunks, existing.grammar) == (written.chunks, written.grammar):
            # the same array, resized or re-attributed: keep its config and form
            if existing.shard_format is None:
                return None, None
            if not existing.shard_format.places_follow_grid:
                return (existing.shard_format, existing.form), None
            migration = await self._keep_ids(path, name, existing, written)
            fmt = existing.shard_format if migration is None else migration.shard_format
            return (fmt, existing.form), migration
        return self._new_format(path, name, written, doc), None

    async def _keep_ids(
        self, path: str, name: str, existing: ArrayInfo, written: ArrayInfo
    ) -> Migration | None:
        """Keep every stored chunk readable across a resize: the neuroglancer format's
        chunk ids (compressed Morton codes) depend on the grid shape, so a resize that
        would renumber stored chunks moves them to their new ids (the document written
        next commits it) or, with ``renumbering="refuse"``, is refused before anything
        changes."""
        assert existing.shard_format is not None
        if not existing.shard_format.renumbers(existing.grid_shape, written.grid_shape):
            return None
        if self._renumbering == "migrate":
            if self._settle is not None:  # chunks buffered for their old ids are stored first
                await self._settle()

            async def current() -> ArrayInfo | None:  # as another resize may have left it
                return await self._catalog.document(path, name, refresh=True)

            return await migrate(self._inner, existing, current, written.grid_shape, attempts=self._attempts)
        if await shard_keys(self._inner, existing):
            raise ShardingConfigError(
                f"array {existing.path or '/'!r}: resizing it from shape {list(existing.shape)} to "
                f"{list(written.shape)} would renumber the chunks it holds (a grid of "
                f"{list(existing.grid_shape)} -> {list(written.grid_shape)} chunks; the neuroglancer "
                "precomputed format numbers chunks by the compressed Morton code of their grid "
                "position, which depends on the grid's shape), and this store was opened with "
                "renumbering='refuse'; the metadata was not changed. Open it with "
                "renumbering='migrate' to move the chunks to their new ids"
            )
        return None

    def check_new_array(self, key: str, raw: bytes) -> None:
        """Raise ShardingConfigError if writing this new array document would (a dry
        run of the config checks of :meth:`set`, for tools writing many arrays)."""
        path, name = split_key(key)
        doc = load_document(raw)
        written = None if doc is None else array_info(path, name, doc)
        if doc is None or written is None:
            return
        if written.shard_format is None and written.form == "transformer" and not written.codec_sharded:
            self._new_format(path, name, written, doc)

    def _note_unsharded(self, path: str, ndim: int) -> None:
        """Say once per rank that a ``chunks_per_shard`` sequence of another rank
        leaves new arrays unsharded (xarray's 1-d coordinates beside 2-d variables
        are meant to be; a typo is not)."""
        cps = self._policy.chunks_per_shard
        if not isinstance(cps, tuple) or ndim in (0, len(cps)) or ndim in self._unsharded_ranks:
            return
        self._unsharded_ranks.add(ndim)
        warnings.warn(
            f"array {path or '/'!r} has {ndim} dimension(s) and stays unsharded: chunks_per_shard "
            f"{list(cps)} is for {len(cps)}-d arrays (give a mapping by path or a callable to shard "
            f"arrays of several ranks); said once per rank",
            UnshardedArrayWarning,
            stacklevel=2,
        )

    def _new_format(
        self, path: str, name: str, written: ArrayInfo, doc: dict[str, Any]
    ) -> tuple[ShardFormat, Layout] | None:
        fmt = self._policy.format_for(path, doc, written.ndim)
        if fmt is None:
            self._note_unsharded(path, written.ndim)
            return None
        form: Layout = self._form if fmt.has_codec_form else "transformer"
        if form == "codec" and name != V3_NAME:
            raise ShardingConfigError(
                f"array {path or '/'!r}: layout='codec' needs zarr v3 metadata (a zarr v2 array has no "
                "codec pipeline to describe its shards in); create it with zarr_format=3, or use "
                "layout='transformer'"
            )
        if form == "codec" and (problem := fmt.codec_form_problem(doc)) is not None:
            raise ShardingConfigError(
                f"array {path or '/'!r}: layout='codec' {problem}; use layout='transformer', which "
                "shards any chunk grid"
            )
        return fmt, form


def _check_readable(path: str, name: str, doc: dict[str, Any]) -> None:
    """Refuse, naming the feature and the zarr that has it, a document the installed
    zarr cannot read: zarr's own error would not say what to upgrade."""
    docs = {path: doc} if name in ARRAY_DOC_NAMES else {}
    docs.update({join_path(path, rel): child for rel, child in consolidated_arrays(name, doc).items()})
    for where, array in docs.items():
        if is_rectilinear(array.get("chunk_grid")):
            check_rectilinear_supported(where, zarr.__version__)
