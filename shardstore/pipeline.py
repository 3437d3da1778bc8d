"""zarr's codec pipeline, reading and writing a whole selection at a time through
a :class:`~shardstore.ShardingStore`.

zarr hands a store one chunk at a time, at most ``async.concurrency`` (10) at
once, in C order. A store under it can neither fetch the shards of a large read
together (it sees ten chunks, of one or two shards, per round trip) nor write a
shard once per ``arr[...] = ...`` (each burst of ten chunks rewrites the shards
it touches, and durability forbids holding a chunk back). This pipeline sees
the whole selection: it groups its chunks by shard and works on
``fetch_concurrency`` shards at a time, with one batched read per group (the
next group's read under way while this one decodes) and one commit per shard,
done when durable. For an array that zarr shards itself it is zarr's
:class:`~zarr.core.codec_pipeline.BatchedCodecPipeline`; for an array in any
other store it is the pipeline named by ``codec_pipeline.fallback_path``
(default that same batched pipeline), so zarr's ``FusedCodecPipeline`` or
zarrs' Rust ``ZarrsCodecPipeline`` can serve the other arrays beside it.

Opt in before opening the array (zarr picks the pipeline then)::

    zarr.config.set({"codec_pipeline.path": "shardstore.pipeline.ShardAwarePipeline"})

or, for every process of a dask cluster, the environment variable
``ZARR_CODEC_PIPELINE__PATH=shardstore.pipeline.ShardAwarePipeline``; add
``"codec_pipeline.fallback_path": "zarrs.ZarrsCodecPipeline"`` (or
``ZARR_CODEC_PIPELINE__FALLBACK_PATH``) to keep another pipeline for other stores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, TypeAlias

import zarr
from zarr.abc.codec import CodecPipeline
from zarr.abc.store import ByteRequest, Store
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import Buffer, BufferPrototype, NDBuffer
from zarr.core.codec_pipeline import BatchedCodecPipeline
from zarr.core.indexing import SelectorTuple
from zarr.registry import register_pipeline
from zarr.storage import StorePath

from shardstore.errors import ShardingConfigError
from shardstore.store import ShardingStore

__all__ = ["FALLBACK_KEY", "PIPELINE_PATH", "ShardAwarePipeline"]

PIPELINE_PATH = "shardstore.pipeline.ShardAwarePipeline"
"""The value of zarr's ``codec_pipeline.path`` that selects this pipeline."""

FALLBACK_KEY = "codec_pipeline.fallback_path"
"""zarr configuration key naming the pipeline for arrays outside a ShardingStore."""

ChunkInfo: TypeAlias = tuple[Any, ArraySpec, SelectorTuple, SelectorTuple, bool]
"""zarr's description of one chunk of a selection: its byte getter/setter, spec,
selection in the chunk and in the value, and whether the chunk is wholly covered."""


@dataclass
class _Held:
    """One chunk's bytes as read ahead, standing in for zarr's StorePath; what zarr
    writes to it is kept for one ``set_many`` (None: delete)."""

    path: str
    value: Buffer | None = None
    written: list[tuple[str, Buffer | None]] = field(default_factory=list)

    async def get(self, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        assert byte_range is None  # zarr asks a non-sharding pipeline's chunks whole
        return self.value

    async def set(self, value: Buffer) -> None:
        self.written.append((self.path, value))

    async def set_if_not_exists(self, default: Buffer) -> None:
        """(ByteSetter's; zarr writes chunks with ``set``, never with this.)"""
        if self.value is None:
            await self.set(default)

    async def delete(self) -> None:
        self.written.append((self.path, None))


def _fallback_class() -> type[CodecPipeline] | None:
    """The pipeline class ``codec_pipeline.fallback_path`` names (None: zarr's batched one)."""
    path = zarr.config.get(FALLBACK_KEY, None)
    if not path or path in (PIPELINE_PATH, f"{BatchedCodecPipeline.__module__}.BatchedCodecPipeline"):
        return None
    module, _, name = str(path).rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ShardingConfigError(
            f"{FALLBACK_KEY}={path!r}: cannot import that codec pipeline: {exc}"
        ) from exc
    if not (isinstance(found, type) and issubclass(found, CodecPipeline)):
        raise ShardingConfigError(f"{FALLBACK_KEY}={path!r} is not a zarr CodecPipeline class")
    return found


@dataclass(frozen=True)
class ShardAwarePipeline(BatchedCodecPipeline):
    """zarr's batched pipeline, with reads and writes of whole selections grouped by
    shard when the array lives in a ShardingStore (see the module docstring).

    ``fallback`` serves the arrays of other stores when zarr builds this class for
    them (a fallback pipeline that zarr can build for a store is used directly)."""

    fallback: CodecPipeline | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_array_metadata_and_store(cls, array_metadata: Any, store: Store) -> Self:
        """zarr asks this first: outside a ShardingStore, the fallback pipeline if it
        can be built for that store (zarrs' can); else this class, from the codecs."""
        fallback = _fallback_class()
        if fallback is None or isinstance(store, ShardingStore):
            raise NotImplementedError
        return fallback.from_array_metadata_and_store(array_metadata, store)  # type: ignore[return-value]

    def evolve_from_array_spec(self, array_spec: ArraySpec) -> Self:
        evolved = super().evolve_from_array_spec(array_spec)
        fallback = _fallback_class()
        if fallback is None:
            return evolved
        return dataclasses.replace(
            evolved, fallback=fallback.from_codecs(list(self)).evolve_from_array_spec(array_spec)
        )

    def _other_store_pipeline(self, chunks: Sequence[ChunkInfo]) -> CodecPipeline | None:
        """The fallback, for a selection of an array outside any ShardingStore."""
        if self.fallback is None or not chunks or _in_sharding_store(chunks):
            return None
        return self.fallback

    async def read(
        self, batch_info: Iterable[ChunkInfo], out: NDBuffer, drop_axes: tuple[int, ...] = ()
    ) -> Any:
        """zarr 3.4 and later: each chunk's ``GetResult`` (present or missing), in
        the order given; zarr 3.1: None."""
        chunks = list(batch_info)
        store = _sharding_store(chunks, self)
        if store is None:
            other = self._other_store_pipeline(chunks)
            if other is not None:
                return await other.read(chunks, out, drop_axes)
            return await super().read(chunks, out, drop_axes)
        groups = await _by_shard(store, chunks)
        results: list[Any] = [None] * len(chunks)

        def read_ahead(i: int) -> asyncio.Future[dict[int, _Held]] | None:
            if i == len(groups):
                return None
            return asyncio.ensure_future(_fetch(store, chunks, groups[i], everything=True))

        ahead = read_ahead(0)
        try:
            for i, group in enumerate(groups):
                assert ahead is not None
                held = await ahead
                ahead = read_ahead(i + 1)  # the next group's read under way while this one decodes
                got = await self.read_batch([(held[n], *chunks[n][1:]) for n in group], out, drop_axes)
                for n, result in zip(group, got or (), strict=False):
                    results[n] = result
        finally:
            if ahead is not None:
                ahead.cancel()
        return tuple(results) if None not in results else None

    async def write(
        self, batch_info: Iterable[ChunkInfo], value: NDBuffer, drop_axes: tuple[int, ...] = ()
    ) -> None:
        chunks = list(batch_info)
        store = _sharding_store(chunks, self)
        if store is None:
            other = self._other_store_pipeline(chunks)
            if other is not None:
                await other.write(chunks, value, drop_axes)
            else:
                await super().write(chunks, value, drop_axes)
            return
        for group in await _by_shard(store, chunks):
            held = await _fetch(store, chunks, group, everything=False)
            await self.write_batch([(held[n], *chunks[n][1:]) for n in group], value, drop_axes)
            await store.set_many(item for n in group for item in held[n].written)


def _sharding_store(chunks: Sequence[ChunkInfo], pipeline: BatchedCodecPipeline) -> ShardingStore | None:
    """The ShardingStore under a selection whose chunks zarr reads whole (None: none)."""
    if not chunks or pipeline.supports_partial_decode or pipeline.supports_partial_encode:
        return None
    getter = chunks[0][0]
    return getter.store if _in_sharding_store(chunks) else None


def _in_sharding_store(chunks: Sequence[ChunkInfo]) -> bool:
    getter = chunks[0][0]
    return isinstance(getter, StorePath) and isinstance(getter.store, ShardingStore)


async def _by_shard(store: ShardingStore, chunks: Sequence[ChunkInfo]) -> list[list[int]]:
    """Positions in ``chunks``, grouped so that each group holds every chunk of at
    most ``fetch_concurrency`` shards, in the order they are first met (a chunk
    stored unsharded counts as a shard of its own)."""
    internals = store.internals
    by_shard: dict[str, list[int]] = {}
    for n, (getter, *_) in enumerate(chunks):
        by_shard.setdefault(await internals.shard_key_of(getter.path) or getter.path, []).append(n)
    members = list(by_shard.values())
    size = internals.fetch_concurrency
    return [[n for shard in members[i : i + size] for n in shard] for i in range(0, len(members), size)]


async def _fetch(
    store: ShardingStore, chunks: Sequence[ChunkInfo], group: list[int], *, everything: bool
) -> dict[int, _Held]:
    """The group's chunks read ahead in one batched read: all of them, or (for a write)
    those the write covers only in part."""
    wanted = [n for n in group if everything or not chunks[n][4]]
    prototype = chunks[group[0]][1].prototype
    values = (
        await store.get_partial_values(prototype, [(chunks[n][0].path, None) for n in wanted])
        if wanted
        else []
    )
    held = {n: _Held(chunks[n][0].path) for n in group}
    for n, value in zip(wanted, values, strict=True):
        held[n].value = value
    return held


register_pipeline(ShardAwarePipeline)
