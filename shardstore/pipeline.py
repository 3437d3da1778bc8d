"""zarr's codec pipeline, reading and writing a whole selection at a time through
a :class:`~shardstore.ShardingStore`.

zarr hands a store one chunk at a time, at most ``async.concurrency`` (10) at
once, in C order. A store under it can neither fetch the shards of a large read
together (it sees ten chunks, of one or two shards, per round trip) nor write a
shard once per ``arr[...] = ...`` (each burst of ten chunks rewrites the shards
it touches, and durability forbids holding a chunk back). This pipeline sees
the whole selection: it groups its chunks by shard (a selection of a few
chunks goes through the store chunk by chunk: :func:`_chunk_by_chunk`) and works on
``fetch_concurrency`` shards (HELD_MAX_BYTES at most) at a time in two groups, with
one batched read per group (the next group's read under way while this one decodes;
the next group encoded while this one commits; where the inner store makes its
changes on worker threads, each shard whose whole block the value gives is encoded
by its own commit instead) and one commit per shard, done when durable. The common
codec chains are decoded straight into the output and encoded straight from the
value (:mod:`shardstore.chunk_codecs`), a thread per core. For an array that zarr
shards itself it is zarr's :class:`~zarr.core.codec_pipeline.BatchedCodecPipeline`; for an array in any
other store zarr gets the pipeline it would build without shardstore — that
batched pipeline, or the one ``codec_pipeline.fallback_path`` names, so
zarr's ``FusedCodecPipeline`` or zarrs' Rust ``ZarrsCodecPipeline`` serves
the other arrays beside it.

Importing shardstore makes it zarr's ``codec_pipeline.path`` while that is
still zarr's default (:mod:`shardstore.default_pipeline`); elsewhere select it
before opening the array (zarr picks the pipeline then)::

    zarr.config.set({"codec_pipeline.path": "shardstore.pipeline.ShardAwarePipeline"})

or, for every process of a dask cluster, the environment variable
``ZARR_CODEC_PIPELINE__PATH=shardstore.pipeline.ShardAwarePipeline``; add
``"codec_pipeline.fallback_path": "zarrs.ZarrsCodecPipeline"`` (or
``ZARR_CODEC_PIPELINE__FALLBACK_PATH``) to keep another pipeline for other stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib
import math
import operator
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, TypeAlias, TypeVar

import numpy as np
import zarr
import zarr.abc.codec
from zarr.abc.codec import CodecPipeline
from zarr.abc.store import ByteRequest, Store
from zarr.core.array import create_codec_pipeline
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import Buffer, BufferPrototype, NDBuffer
from zarr.core.codec_pipeline import BatchedCodecPipeline
from zarr.core.indexing import SelectorTuple
from zarr.registry import register_pipeline
from zarr.storage import StorePath

from shardstore.addressing import ShardAddress
from shardstore.blocks import Box, shard_boxes
from shardstore.chunk_codecs import ChunkCodec, FrameDamage, chunk_codec, frame_check
from shardstore.chunk_work import (
    REPORTS,
    ShardPart,
    block_of_value,
    encode_block,
    encode_shards,
    merge_and_encode,
    scatter_chunks,
    scatter_shards,
)
from shardstore.default_pipeline import PIPELINE_PATH, become_default
from shardstore.errors import ChunkDecodeError, ShardingConfigError, ShardStoreError
from shardstore.internals import StoreInternals
from shardstore.reading.cache import ShardSnapshot
from shardstore.reading.reader import EachShard
from shardstore.routing import RoutedChunks
from shardstore.shard_buffers import ShardBuffers
from shardstore.store import ShardingStore
from shardstore.tasks import in_threads
from shardstore.writing.builds import ShardBuilds
from shardstore.writing.updates import BuiltShard, ShardToBuild

__all__ = ["FALLBACK_KEY", "PIPELINE_PATH", "ShardAwarePipeline"]


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
    written: list[tuple[str, Buffer | bytes | None]] = field(default_factory=list)

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
        """zarr asks this first. On a ShardingStore: this class (zarr then builds it from
        the codecs). On any other store: the pipeline zarr builds there without
        shardstore — ``codec_pipeline.fallback_path``'s, default zarr's batched one —
        so that other arrays behave and perform exactly as they would."""
        if isinstance(store, ShardingStore):
            raise NotImplementedError
        fallback = _fallback_class()
        if fallback is not None:
            with contextlib.suppress(NotImplementedError):  # zarrs' is built for the store
                return fallback.from_array_metadata_and_store(array_metadata, store)  # type: ignore[return-value]
        built = create_codec_pipeline(array_metadata)  # this class, as zarr builds it from the codecs
        assert isinstance(built, ShardAwarePipeline)
        other = built.fallback or (_batched(built) if fallback is None else fallback.from_codecs(list(built)))
        return other  # type: ignore[return-value]  # zarr takes any CodecPipeline here

    def evolve_from_array_spec(self, array_spec: ArraySpec) -> Self:
        """This pipeline for one array (as zarr evolves its codecs), its fallback evolved too."""
        evolved = super().evolve_from_array_spec(array_spec)
        fallback = _fallback_class()
        other = (
            _batched(evolved)
            if fallback is None
            else fallback.from_codecs(list(self)).evolve_from_array_spec(array_spec)
        )
        return dataclasses.replace(evolved, fallback=other)

    async def _read_by_zarr(self, items: list[Any], out: NDBuffer, drop_axes: tuple[int, ...]) -> Any:
        """zarr's codecs decode chunks held with their bytes into ``out`` (see :func:`_named`)."""
        return await _named(self, lambda part: self.read_batch(part, out, drop_axes), items)

    async def _write_by_zarr(self, items: list[Any], value: NDBuffer, drop_axes: tuple[int, ...]) -> None:
        """zarr's codecs merge and encode chunks held with their bytes (see :func:`_named`)."""
        await _named(self, lambda part: self.write_batch(part, value, drop_axes), items, writing=True)

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
        codec = _direct(self, chunks, out)
        routed = (
            None
            if codec is None or _chunk_by_chunk(store, chunks)
            else await store.internals.route_chunks(_paths(chunks))
        )
        if codec is not None and routed is not None:
            return await self._read_shards(store, chunks, routed, codec, out, drop_axes)
        groups = await _by_shard(store, chunks)
        results: list[Any] = [None] * len(chunks)

        async def decode(group: list[int], held: dict[int, _Held]) -> None:
            items = [(held[n], *chunks[n][1:]) for n in group]
            got: Sequence[Any] | None
            if codec is None:
                got = await self._read_by_zarr(items, out, drop_axes)
            else:  # decoded straight into the output, by a thread per core
                reports: list[Any] = [None] * len(items)
                failed: list[int] = []
                scatter = functools.partial(
                    scatter_chunks, codec, items, out=out, drop_axes=drop_axes, reports=reports, failed=failed
                )
                await in_threads(scatter, len(items), nbytes=_nbytes(codec, chunks, len(items)))
                if failed:  # zarr's codecs decode them, or say what is wrong
                    redone = await self._read_by_zarr([items[k] for k in failed], out, drop_axes)
                    for k, result in zip(failed, redone or (), strict=False):
                        reports[k] = result
                got = reports
            for n, result in zip(group, got or (), strict=False):
                results[n] = result

        await _ahead(groups, lambda group: _fetch(store, chunks, group, everything=True), decode)
        return tuple(results) if None not in results else None

    async def _read_shards(
        self,
        store: ShardingStore,
        chunks: Sequence[ChunkInfo],
        routed: RoutedChunks,
        codec: ChunkCodec,
        out: NDBuffer,
        drop_axes: tuple[int, ...],
    ) -> Any:
        """:meth:`read` of chunks routed at once: shard by shard, each shard's chunks
        decoded from its snapshot straight into ``out`` by a thread per core (a shard's
        chunks that are a box of its block in ``out`` placed there in one operation).
        Where the inner store hands values on as they are read, a big shard read whole
        is decoded as soon as it is read: on local files by the thread that read it,
        from memory the CPU's cache still holds; from object stores while the other
        responses are awaited (see :func:`_placed_as_read`). Elsewhere a group is
        fetched while the last one decodes."""
        internals = store.internals
        members = _members(routed)
        boxes = _boxes(chunks, routed, drop_axes)
        results: list[Any] = [None] * len(chunks)
        failed: list[tuple[int, bytes | None]] = []
        buffers = ShardBuffers()  # (a shard read whole, or decoded, takes memory one before let go of)

        def fetch(
            group: Sequence[int], each: EachShard | None = None
        ) -> Awaitable[list[ShardSnapshot | None]]:
            return internals.read_shards(
                _wanted(routed, [(s, members[s]) for s in group]), buffers.flat, each
            )

        def scatter(parts: list[ShardPart], part: range) -> None:
            scatter_shards(
                codec, chunks, parts, routed.block, part, out=out, drop_axes=drop_axes, reports=results,
                failed=failed, empty=buffers.empty,
            )  # fmt: skip

        def decoded_as_read(group: range) -> EachShard:
            return lambda i, snapshot: scatter(
                _parts(routed, members, boxes, [group[i]], [snapshot]), range(1)
            )

        async def decode(group: Sequence[int], snapshots: Sequence[ShardSnapshot | None]) -> None:
            left = [
                (s, snapshot) for s, snapshot in zip(group, snapshots, strict=True) if snapshot is not None
            ]
            parts = _parts(routed, members, boxes, [s for s, _ in left], [snapshot for _, snapshot in left])
            nbytes = _nbytes(codec, chunks, sum(len(part[0]) for part in parts))
            await in_threads(functools.partial(scatter, parts), len(parts), nbytes=nbytes)

        with buffers:
            if _placed_as_read(internals, routed):
                for group in _groups(routed, internals.fetch_concurrency, held=1):
                    await decode(group, await fetch(group, decoded_as_read(group)))
            else:
                await _ahead(_groups(routed, internals.fetch_concurrency), fetch, decode)
        if failed:  # zarr's codecs decode them, or say what is wrong
            redone = await self._read_by_zarr(_held_items(chunks, failed), out, drop_axes)
            for (n, _), result in zip(failed, redone or (), strict=False):
                results[n] = result
        return tuple(results) if REPORTS else None

    async def write(
        self, batch_info: Iterable[ChunkInfo], value: NDBuffer, drop_axes: tuple[int, ...] = ()
    ) -> None:
        """Write the chunks of a selection from ``value``: on a ShardingStore each shard's
        chunks are encoded together and committed once; elsewhere the fallback
        pipeline writes them."""
        chunks = list(batch_info)
        store = _sharding_store(chunks, self)
        if store is None:
            other = self._other_store_pipeline(chunks)
            if other is not None:
                await other.write(chunks, value, drop_axes)
            else:
                await super().write(chunks, value, drop_axes)
            return
        store.internals.check_writable([chunks[0][0].path])  # (before any chunk is read)
        codec = _direct(self, chunks, value)
        whole = all(map(_COMPLETE, chunks))  # (no chunk's old bytes to read)
        routed = (
            None
            if codec is None or _chunk_by_chunk(store, chunks)
            else await store.internals.route_chunks(_paths(chunks), reads_nothing=whole)
        )
        if codec is not None and routed is not None:
            await self._write_shards(store, chunks, routed, codec, value, drop_axes)
            return

        async def encoded(group: list[int]) -> list[tuple[str, Buffer | bytes | None]]:
            """The group's new chunk values (None: delete), encoded straight from the
            value by a thread per core where ``codec`` can, else by zarr's codecs."""
            held = await _fetch(store, chunks, group, everything=False)
            items = [(held[n], *chunks[n][1:]) for n in group]
            new: list[bytes | Exception | None] = [None] * len(items)
            if codec is not None:
                merge = functools.partial(
                    merge_and_encode, codec, items, value=value, drop_axes=drop_axes, encoded=new
                )
                await in_threads(merge, len(items), nbytes=_nbytes(codec, chunks, len(items)))
            if codec is None or any(isinstance(e, Exception) for e in new):
                await self._write_by_zarr(items, value, drop_axes)  # zarr's codecs, or what they say
            else:
                for (held_chunk, *_), data in zip(items, new, strict=True):
                    assert not isinstance(data, Exception)
                    held_chunk.written.append((held_chunk.path, data))
            return [item for n in group for item in held[n].written]

        await _ahead(await _by_shard(store, chunks), encoded, lambda _, ready: store.set_many(ready))

    async def _write_shards(
        self,
        store: ShardingStore,
        chunks: Sequence[ChunkInfo],
        routed: RoutedChunks,
        codec: ChunkCodec,
        value: NDBuffer,
        drop_axes: tuple[int, ...],
    ) -> None:
        """:meth:`write` of chunks routed at once: shard by shard, the chunks covered in
        part read first (one batch per group), each shard's chunks encoded from
        ``value`` by a thread per core (a shard stored raw that is a whole block of
        the value cut out in one copy), each shard committed once; the next group
        encodes while this one commits. Shards whose whole block the value gives are
        encoded by their commits where the inner store makes those on worker
        threads (:class:`ShardToBuild`: local files)."""
        internals = store.internals
        members = _members(routed)
        boxes = _boxes(chunks, routed, drop_axes)
        held = REMOTE_WRITE_GROUPS if internals.raw.capabilities.remote else 2
        spec = chunks[0][1]
        source = value.as_ndarray_like()
        # shards whose whole block the value gives are encoded by their commits, where
        # those are made on worker threads (see ShardToBuild; a shard all fill is then
        # deleted unread); still in groups, as a shard that must wait its turn in the
        # commit queue is encoded ahead of it
        can = internals.raw.capabilities
        wholes = (
            [block_of_value(codec, spec, source, box, routed.block) for box in boxes]
            if boxes is not None and can.changes_in_threads and can.ordered_deletes
            else [None] * len(routed.shards)
        )
        groups = _groups(routed, internals.fetch_concurrency, held=held)
        buffers = ShardBuffers()  # (a group built in place takes the memory of one committed)
        builds = ShardBuilds()
        complete = np.fromiter(map(_COMPLETE, chunks), dtype=bool, count=len(chunks))

        async def encoded(
            group: range,
        ) -> list[tuple[ShardAddress, dict[int, Any] | BuiltShard | ShardToBuild]]:
            cut = [(s, members[s][~complete[members[s]]]) for s in group]  # chunks covered in part
            partial = [(s, wanted) for s, wanted in cut if len(wanted)]
            read = await internals.read_shards(_wanted(routed, partial)) if partial else []
            snapshots = dict(zip([s for s, _ in partial], read, strict=True))
            parts = _parts(routed, members, boxes, group, [snapshots.get(s) for s in group])
            shard_format = routed.shards[group[0]].shard_format
            new: list[dict[int, Any] | BuiltShard | ShardToBuild] = [{} for _ in parts]
            for k, s in enumerate(group):
                whole = wholes[s]
                if whole is not None:
                    assert routed.block is not None
                    build = functools.partial(
                        encode_block, codec, whole, routed.block, spec, shard_format, buffers.empty
                    )
                    new[k] = ShardToBuild(*builds.build(build))
            now = [k for k, values in enumerate(new) if not isinstance(values, ShardToBuild)]
            encoded_now: list[dict[int, Any] | BuiltShard] = [{} for _ in now]
            failed: list[tuple[int, bytes | None]] = []
            encode = functools.partial(
                encode_shards, codec, chunks, [parts[k] for k in now], routed.block, value=value,
                drop_axes=drop_axes, encoded=encoded_now, failed=failed, shard_format=shard_format,
                empty=buffers.empty,
            )  # fmt: skip
            await in_threads(
                encode, len(now), nbytes=_nbytes(codec, chunks, sum(len(parts[k][0]) for k in now))
            )
            for k, encoding in zip(now, encoded_now, strict=True):
                new[k] = encoding
            if failed:  # zarr's codecs merge and encode them, or say what is wrong
                items = _held_items(chunks, failed)
                await self._write_by_zarr(items, value, drop_axes)
                where = {
                    n: (k, int(routed.places[n])) for k, s in enumerate(group) for n in members[s].tolist()
                }
                for (n, _), (held, *_) in zip(failed, items, strict=True):
                    for _, written in held.written:
                        k, place = where[n]
                        values = new[k]
                        # (only shards read in part fail)
                        assert not isinstance(values, BuiltShard | ShardToBuild)
                        values[place] = None if written is None else written.to_bytes()
            return [(routed.shards[s], values) for s, values in zip(group, new, strict=True)]

        with buffers, contextlib.closing(builds):
            await _ahead(groups, encoded, lambda _, ready: internals.write_shards(ready), finishing=held - 1)


G = TypeVar("G")
R = TypeVar("R")


async def _ahead(
    groups: Sequence[G],
    prepare: Callable[[G], Awaitable[R]],
    finish: Callable[[G, R], Awaitable[None]],
    *,
    finishing: int = 1,
) -> None:
    """``finish(group, await prepare(group))`` for each group: one group prepared at a
    time, in order, the next one under way while up to ``finishing`` earlier ones
    finish (a read while the last decodes; an encoding while the last commits, or
    several: commits wait on storage, and a commit that starts as soon as its group
    is encoded keeps both the cores and the storage busy). ``finishing + 1`` groups
    in memory at most, each let go as soon as it is finished; the first failure
    ends the call, after what it started has ended."""
    if not groups:
        return
    ahead: asyncio.Future[R] | None = asyncio.ensure_future(prepare(groups[0]))
    running: set[asyncio.Future[None]] = set()
    try:
        for i, group in enumerate(groups):
            assert ahead is not None
            ready = await ahead
            while len(running) >= finishing:
                running = await _one_finished(running)
            ahead = asyncio.ensure_future(prepare(groups[i + 1])) if i + 1 < len(groups) else None
            running.add(asyncio.ensure_future(finish(group, ready)))
            del ready
        while running:
            running = await _one_finished(running)
    finally:
        for pending in [ahead, *running]:
            await _settle(pending)


async def _one_finished(running: set[asyncio.Future[None]]) -> set[asyncio.Future[None]]:
    """Those of ``running`` still running once one has ended (raising its error)."""
    done, still = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    for future in done:
        future.result()
    return still


async def _settle(pending: asyncio.Future[Any] | None) -> None:
    """Cancels work started ahead that is no longer wanted and waits for it to end, so
    that nothing runs on after the call that started it."""
    if pending is None:
        return
    if pending.done():
        if not pending.cancelled():
            pending.exception()  # its failure, if any, is no news: the call fails already
        return
    pending.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pending


def _direct(
    pipeline: BatchedCodecPipeline, chunks: Sequence[ChunkInfo], array: NDBuffer
) -> ChunkCodec | None:
    """The array's codec chain run directly (None: zarr's codecs run it, or the data
    is not a numpy array in memory)."""
    if not chunks or not isinstance(array.as_ndarray_like(), np.ndarray):
        return None
    return chunk_codec(list(pipeline), chunks[0][1])


def _nbytes(codec: ChunkCodec, chunks: Sequence[ChunkInfo], count: int) -> int:
    """The bytes of ``count`` chunks of the array in memory (the work to decode or
    encode them goes by it)."""
    return count * codec.dtype.itemsize * math.prod(chunks[0][1].shape)


def _paths(chunks: Sequence[ChunkInfo]) -> list[str]:
    # (indexed, not unpacked: ``for getter, *_ in`` builds a list a chunk, 12x the cost)
    return [info[0].path for info in chunks]


def _members(routed: RoutedChunks) -> list[np.ndarray[Any, np.dtype[np.intp]]]:
    """Each shard's chunks (their places in the selection, in order)."""
    order = np.argsort(routed.shard_of, kind="stable")
    bounds = np.cumsum(np.bincount(routed.shard_of, minlength=len(routed.shards)))[:-1]
    return np.split(order, bounds)


_COMPLETE = operator.itemgetter(4)
"""Whether zarr says a chunk's selection covers it whole (the last of its ``ChunkInfo``)."""

ROUTED_FROM = 32
"""Selections of fewer chunks go chunk by chunk (grouped by shard, through the store's
batched reads and writes) where that is one batch, as routed (see
:func:`_chunk_by_chunk`): routing them at once, finding boxes and a task per group
cost about 0.3 ms, more than so few chunks save. Warm reads of 16 KiB zstd chunks: one
0.29 ms against 0.58 ms, 16 chunks 0.84 against 1.24 ms, 32 chunks 1.29 against
1.66 ms; routed, 48 chunks read cold (a newly opened store) took 4.3 against 4.6 ms."""
GROUP_BYTES = 8 << 20
"""Small shards go in groups this big (before compression): a group costs a round of
requests and a thread hop or two whatever its size."""
HELD_MAX_BYTES = 128 << 20
"""A read or write holds big shards this many bytes at most at once (before
compression, in all its groups; a shard a group at least), whatever
``fetch_concurrency`` says: 64 shards of 8 MiB would be 512 MiB. A read that decodes
each shard as it is read (local files) asks for this many a batch at most, and holds
a shard per thread."""
REMOTE_WRITE_GROUPS = 4
"""Groups a write to a remote store holds at once: one encoded while the others commit,
whose requests wait on round trips. Elsewhere a write holds two, as a read does (one
fetched while the other decodes): a local commit is copies into the page cache, CPU
work that more commits at once only contend for."""


PLACED_AS_READ_FROM = 256 << 10
"""Shards this big or bigger (before compression), read whole from an inner store that
hands values on as they are read, are each decoded as soon as read (:func:`_placed_as_read`).
Smaller ones are read a group at a time and decoded together: their work is mostly
Python, which two threads only take turns at (65,536 chunks of 64 bytes, 4 KiB
shards: 662 ms read by groups, 773 ms each as read)."""


def _placed_as_read(internals: StoreInternals, routed: RoutedChunks) -> bool:
    """Whether a read decodes each shard read whole as soon as it is read (big shards,
    from a store that hands values on as read): no group of them is held, nor fetched
    while another decodes. Local files: by the thread that read it, the bytes still in
    the CPU's cache, two threads each reading and decoding instead of four contending
    for two cores; a 64 MiB read of 1 MiB shards, alternated in one process: 16 KiB
    zstd chunks 136 against 115 ms (zarrs 80), uncompressed 88 against 80 ms (zarrs
    35). Object stores: each response while the others are awaited; 16 MiB from S3
    +20 ms a request, alternated, medians of 30: 128.5 against 124.6 ms (tensorstore
    92), and only the shards not yet decoded are held."""
    nominal = routed.shards[0].nominal_nbytes if routed.shards else None
    return internals.raw.capabilities.hands_as_read and (nominal or 0) >= PLACED_AS_READ_FROM


def _groups(routed: RoutedChunks, fetch_concurrency: int, held: int = 2) -> list[range]:
    """Shards in ``held`` groups per ``fetch_concurrency`` (big shards: HELD_MAX_BYTES
    per ``held`` groups), or of as many small shards as hold GROUP_BYTES / ``held``:
    with ``held`` groups in memory at once (see :func:`_ahead`), ``fetch_concurrency``
    shards (or twice GROUP_BYTES) at most, and HELD_MAX_BYTES."""
    n_shards = len(routed.shards)
    nominal = routed.shards[0].nominal_nbytes if n_shards else None
    size = fetch_concurrency // held
    if nominal:
        size = max(min(size, HELD_MAX_BYTES // held // nominal), 2 * GROUP_BYTES // held // nominal)
    size = max(1, size)
    return [range(i, min(i + size, n_shards)) for i in range(0, n_shards, size)]


def _wanted(
    routed: RoutedChunks, picks: Iterable[tuple[int, Any]]
) -> list[tuple[ShardAddress, list[int], list[str]]]:
    """What a read of chunks ``picks`` (a shard, and the places in the selection of its
    chunks wanted) asks of the store."""
    keys = routed.keys
    return [
        (routed.shards[s], routed.places[wanted].tolist(), [keys[n] for n in wanted.tolist()])
        for s, wanted in picks
    ]


def _parts(
    routed: RoutedChunks,
    members: list[Any],
    boxes: list[Box | None] | None,
    group: Sequence[int],
    snapshots: Sequence[ShardSnapshot | None],
) -> list[ShardPart]:
    return [
        (members[s], routed.places[members[s]], snapshot, None if boxes is None else boxes[s])
        for s, snapshot in zip(group, snapshots, strict=True)
    ]


def _boxes(
    chunks: Sequence[ChunkInfo], routed: RoutedChunks, drop_axes: tuple[int, ...]
) -> list[Box | None] | None:
    """Each shard's chunks as a box of its block in the array read into or written from
    (None: not one); None where the selection is no box of whole chunks (index arrays,
    dropped axes, chunks cut by the selection, a grid of several chunk shapes)."""
    if drop_axes or routed.block is None or not all(map(_COMPLETE, chunks)):
        return None
    ndim = len(routed.block)
    selections: Sequence[Any] = chunks  # (their out selections: slices, unless not a box)
    try:  # (no call a chunk in this loop, not even ``typing.cast``: 0.15 ms of 4,096 chunks)
        starts = np.fromiter(
            (s.start for info in selections for s in info[3]), dtype=np.int64, count=len(chunks) * ndim
        ).reshape(len(chunks), ndim)
    except (AttributeError, TypeError, ValueError):  # an index array, not a slice
        return None
    shape = tuple(chunks[0][1].shape)
    return shard_boxes(starts, routed.places, routed.shard_of, len(routed.shards), routed.block, shape)


async def _named(
    pipeline: ShardAwarePipeline,
    run: Callable[[list[Any]], Awaitable[R]],
    items: list[Any],
    *,
    writing: bool = False,
) -> R:
    """``run`` (zarr's codecs) over chunks ``items`` held with their stored bytes (see
    :class:`_Held`). Where it fails, the first of those chunks whose bytes zarr's codecs
    (``pipeline.decode``) refuse on their own is named by a ChunkDecodeError, what they
    raised its cause: that error names no chunk (numcodecs' zstd says only "invalid input
    data"). A read decodes every chunk stored, a write (``writing``) those it covers in
    part. Where every chunk decodes, the failure is no damage (a value that does not
    encode, an ``out`` that cannot be written, memory): it is raised as it is. Damage
    zarr's codecs would not see (:func:`frame_check`) is named before they run."""
    # the chunks whose bytes are decoded (4: covered whole by a write, its old bytes unread)
    needed = [item for item in items if item[0].value is not None and not (writing and item[4])]
    check = frame_check(list(pipeline))
    if check is not None:
        for item in needed:
            try:
                check(item[0].value.as_numpy_array())
            except FrameDamage as exc:
                raise _damaged(item[0].path, exc, writing) from exc
    try:
        return await run(items)
    except ShardStoreError:
        raise
    except Exception as exc:
        failure = exc
    for item in needed:
        try:
            await pipeline.decode([(item[0].value, item[1])])
        except MemoryError:  # (no finding about the bytes)
            break
        except Exception as exc:
            raise _damaged(item[0].path, exc, writing) from exc
    raise failure


def _damaged(path: str, cause: Exception, writing: bool) -> ChunkDecodeError:
    """The error naming chunk ``path`` whose stored bytes do not decode (``cause``)."""
    needed = ", and a write of part of the chunk needs the rest of its values" if writing else ""
    return ChunkDecodeError(
        f"chunk {path!r}: its stored bytes do not decode{needed}: {type(cause).__name__}: {cause}"
    )


def _held_items(chunks: Sequence[ChunkInfo], stored: list[tuple[int, bytes | None]]) -> list[tuple[Any, ...]]:
    """Chunks with their stored bytes (None: absent) held, as zarr's codecs take them."""
    prototype = chunks[0][1].prototype
    return [
        (_Held(chunks[n][0].path, None if raw is None else prototype.buffer.from_bytes(raw)), *chunks[n][1:])
        for n, raw in stored
    ]


def _batched(pipeline: BatchedCodecPipeline) -> BatchedCodecPipeline:
    """zarr's own batched pipeline with the codecs of ``pipeline`` (nothing re-validated,
    so no advisory warning is said twice)."""
    return BatchedCodecPipeline(
        **{f.name: getattr(pipeline, f.name) for f in dataclasses.fields(BatchedCodecPipeline)}
    )


def _sharding_store(chunks: Sequence[ChunkInfo], pipeline: BatchedCodecPipeline) -> ShardingStore | None:
    """The ShardingStore under a selection whose chunks zarr reads whole (None: none)."""
    if not chunks or pipeline.supports_partial_decode or pipeline.supports_partial_encode:
        return None
    getter = chunks[0][0]
    return getter.store if _in_sharding_store(chunks) else None


def _in_sharding_store(chunks: Sequence[ChunkInfo]) -> bool:
    getter = chunks[0][0]
    return isinstance(getter, StorePath) and isinstance(getter.store, ShardingStore)


def _chunk_by_chunk(store: ShardingStore, chunks: Sequence[ChunkInfo]) -> bool:
    """Whether a selection goes through the store chunk by chunk: fewer than ROUTED_FROM
    chunks, and no more than the shards of one of that path's batches
    (:func:`_by_shard`), so that it takes no more rounds of requests than routed."""
    return len(chunks) < ROUTED_FROM and len(chunks) <= _shards_a_batch(store)


def _shards_a_batch(store: ShardingStore) -> int:
    """Shards in one batch of the chunk-by-chunk path: half ``fetch_concurrency``."""
    return max(1, store.internals.fetch_concurrency // 2)


async def _by_shard(store: ShardingStore, chunks: Sequence[ChunkInfo]) -> list[list[int]]:
    """Positions in ``chunks``, grouped so that each group holds every chunk of at
    most half ``fetch_concurrency`` shards, in the order they are first met (a chunk
    stored unsharded counts as a shard of its own): with one group read or encoded
    ahead, ``fetch_concurrency`` shards at most are held at once."""
    internals = store.internals
    by_shard: dict[str, list[int]] = {}
    for n, path in enumerate(_paths(chunks)):
        by_shard.setdefault(await internals.shard_key_of(path) or path, []).append(n)
    members = list(by_shard.values())
    size = _shards_a_batch(store)
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
become_default(final=False)
