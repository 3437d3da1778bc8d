"""ShardAwarePipeline: zarr's pipeline reading and writing whole selections by shard.

Results equal zarr's own pipeline on every selection; the requests are one
commit per shard written (none read for wholly covered shards) and one batched
read per ``fetch_concurrency`` shards read; other stores see zarr's pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.storage import MemoryStore

import shardstore.pipeline
from shardstore import PIPELINE_PATH, PipelineChoiceWarning, ShardAwarePipeline, ShardingStore
from shardstore.errors import ReadOnlyError
from shardstore.inner import LocalInner
from shardstore.instrument import CountingInner

from .helpers import inner_keys, sample

ZARR_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"
T = TypeVar("T")


@pytest.fixture
def pipeline() -> Iterator[None]:
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        yield


def _counted(
    tmp_path: Path, name: str = "s", *, threads: bool = True, **options: Any
) -> tuple[ShardingStore, CountingInner]:
    """A store over counted local files; without ``threads``, files that do not read in
    threads (as every store but local files: a group is fetched while the last decodes)."""
    local = LocalInner(str(tmp_path / name))
    if not threads:
        local.capabilities = dataclasses.replace(local.capabilities, hands_as_read=False)
    inner = CountingInner(local)
    return ShardingStore(inner, (4, 4), **options), inner


@pytest.mark.usefixtures("pipeline")
def test_zarr_picks_the_pipeline_for_arrays_opened_while_configured(tmp_path: Path) -> None:
    store, _ = _counted(tmp_path)
    arr = zarr.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="i4")
    assert isinstance(arr._async_array.codec_pipeline, ShardAwarePipeline)


@pytest.mark.usefixtures("pipeline")
def test_a_whole_write_commits_each_shard_once_reading_only_those_the_edge_cuts(tmp_path: Path) -> None:
    """A shard the array's edge cuts is read (another process may have grown the
    array and written past the edge this one knows); the others are not."""
    store, inner = _counted(tmp_path)
    data = sample((64, 48), "f4")
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype="f4")
    inner.counts.reset()
    arr[:] = data
    # 8x6 chunks, 4x4 per shard: 2x2 shards, the two of the last shard column cut by the edge
    assert (inner.counts.reads, inner.counts.writes) == (2, 2 * 2)
    reopened = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
    np.testing.assert_array_equal(reopened[:], data)


@pytest.mark.usefixtures("pipeline")
def test_a_partial_write_reads_the_chunks_it_covers_in_part_once(tmp_path: Path) -> None:
    store, inner = _counted(tmp_path)
    data = sample((64, 64), "i4")
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype="i4")
    arr[:] = data
    inner.counts.reset()
    arr[3:61, 3:61] = 7  # edges cover chunks in part: 4 shards read-modify-written
    data[3:61, 3:61] = 7
    assert inner.counts.writes == 4
    assert inner.counts.read_batches <= 2 + 1  # chunk reads in one batch (+ indices), then commits
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:], data)


@pytest.fixture
def groups_by_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of half ``fetch_concurrency`` shards, however small (not GROUP_BYTES)."""
    monkeypatch.setattr(shardstore.pipeline, "GROUP_BYTES", 0)


@pytest.fixture
def placed_as_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards however small decoded as they are read, where the store reads in threads."""
    monkeypatch.setattr(shardstore.pipeline, "PLACED_AS_READ_FROM", 0)


@pytest.mark.usefixtures("groups_by_count")
@pytest.mark.parametrize("concurrency", [1, 3, 4, 32])
@pytest.mark.parametrize(("threads", "small"), [(True, False), (True, True), (False, False)])
def test_a_whole_read_reads_fetch_concurrency_shards_a_batch_or_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, concurrency: int, threads: bool, small: bool
) -> None:
    """Where the inner store reads in threads (local files), each shard is decoded as it
    is read and let go of: ``fetch_concurrency`` shards a batch. Elsewhere, and for
    shards smaller than PLACED_AS_READ_FROM, the next batch is read while this one
    decodes: half, so that at most ``fetch_concurrency`` shards are held at once. Each
    shard is read once (whole: the read wants all of it)."""
    monkeypatch.setattr(shardstore.pipeline, "PLACED_AS_READ_FROM", 4097 if small else 4096)  # (4 KiB shards)
    a_batch = max(1, concurrency if threads and not small else concurrency // 2)
    assert _whole_read_batches(tmp_path, concurrency, threads=threads) == (-(-4 // a_batch), 4)


class _CommitSizes(LocalInner):
    """A local directory that records how many shards each commit call gives it, and
    may say it is remote (each request a round trip)."""

    def __init__(self, root: str, *, remote: bool, by_commit: bool = False) -> None:
        super().__init__(root)
        self.capabilities = dataclasses.replace(
            LocalInner.capabilities, remote=remote, changes_in_threads=by_commit
        )
        self.sizes: list[int] = []

    async def update_many(self, changes: Any, **kwargs: Any) -> list[Exception | None]:
        self.sizes.append(len(changes))
        return await super().update_many(changes, **kwargs)


@pytest.mark.usefixtures("groups_by_count", "pipeline")
@pytest.mark.parametrize(("remote", "by_commit"), [(False, False), (True, False), (False, True)])
def test_a_whole_write_commits_half_fetch_concurrency_shards_a_group_or_a_quarter_remotely(
    tmp_path: Path, remote: bool, by_commit: bool
) -> None:
    """Locally the next group is encoded while one commits (more commits at once only
    contend for the cores); on a remote store while up to three commit, each waiting
    on round trips. Either way ``fetch_concurrency`` shards at most are held (where
    each commit encodes its own shard, none is held until its commit)."""
    inner = _CommitSizes(str(tmp_path / "s"), remote=remote, by_commit=by_commit)
    store = ShardingStore(inner, (2, 2), fetch_concurrency=8)
    data = sample((64, 64), "f4")
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype="f4")
    inner.sizes.clear()
    arr[:] = data  # 16 shards
    assert inner.sizes == ([2] * 8 if remote else [4] * 4)
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:], data)
    inner.sizes.clear()
    arr[:, 4:] = data[:, 4:] + 1  # no shard's whole block: encoded ahead
    assert inner.sizes == ([2] * 8 if remote else [4] * 4)


def _encodings_in_commits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """For each shard encoded whole (``encode_block``): whether it was in a local
    commit (under the shard's lock), and on the event loop's thread."""
    import shardstore.inner.local

    seen: list[tuple[bool, bool]] = []
    committing = threading.local()
    real_encode, real_update = shardstore.pipeline.encode_block, LocalInner._update

    def encode(*args: Any) -> Any:
        seen.append(
            (getattr(committing, "now", False), threading.current_thread() is threading.main_thread())
        )
        return real_encode(*args)

    def update(self: LocalInner, *args: Any) -> int:
        committing.now = True
        try:
            return real_update(self, *args)
        finally:
            committing.now = False

    monkeypatch.setattr(shardstore.pipeline, "encode_block", encode)
    monkeypatch.setattr(shardstore.inner.local.LocalInner, "_update", update)
    return seen


@pytest.mark.usefixtures("pipeline")
def test_a_whole_write_to_local_files_encodes_each_shard_in_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard whose whole block a write gives is encoded by its commit, on a worker
    thread, under the shard's lock: one read-free write per shard, as before; a write
    in a batch builds its shards first, then hands them to the batch."""
    seen = _encodings_in_commits(monkeypatch)
    store, inner = _counted(tmp_path)
    data = sample((64, 64), "f4")
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype="f4")
    inner.counts.reset()
    arr[:] = data
    assert (inner.counts.reads, inner.counts.writes) == (0, 2 * 2)  # 8x8 chunks, 4x4 per shard
    assert seen == [(True, False)] * 4
    seen.clear()
    with store.batch():
        arr[:] = data + 1
    assert inner.counts.writes == 8 and len(seen) == 4 and not any(in_commit for in_commit, _ in seen)
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:], data + 1)


@pytest.mark.usefixtures("pipeline")
def test_a_shard_whose_encoding_fails_in_its_commit_is_left_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The encoding's own error is raised (as by an encoding ahead of the commit), the
    shard it was for keeps its previous contents, and no lock file is left."""
    store = ShardingStore(str(tmp_path / "s"), (4, 4))
    data = sample((64, 64), "f4")  # 8 x 8 chunks: routed at once
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype="f4")
    arr[:] = data
    real = shardstore.pipeline.encode_block

    def failing(*args: Any) -> Any:
        raise MemoryError("no room to encode")

    monkeypatch.setattr(shardstore.pipeline, "encode_block", failing)
    with pytest.raises(MemoryError, match="no room to encode"):
        arr[:] = data + 1
    monkeypatch.setattr(shardstore.pipeline, "encode_block", real)
    reopened = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
    np.testing.assert_array_equal(reopened[:], data)
    assert not [p for p in (tmp_path / "s").rglob("*") if p.name.startswith(".")]


@pytest.mark.usefixtures("pipeline")
def test_a_cancelled_write_reads_its_value_only_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commits of a cancelled write go on, and write the value as it was given:
    every shard handed to a commit is encoded before the call returns (the caller
    may reuse its array then), the one under way by its commit, the others by the
    call's end; none is encoded after."""
    import shardstore.inner.local
    import shardstore.writing.builds

    store = ShardingStore(str(tmp_path / "s"), (4, 4))
    data = sample((64, 64), "f4")  # 4 shards of 4 x 4 chunks
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype="f4")
    arr[:] = data
    events: list[str] = []
    begun, go_on, all_done = threading.Event(), threading.Event(), threading.Event()
    real_encode, real_update = shardstore.pipeline.encode_block, LocalInner._update
    real_close = shardstore.writing.builds.ShardBuilds.close
    done: list[int] = []

    def encode(*args: Any) -> Any:
        events.append("begin")
        begun.set()
        assert go_on.wait(timeout=30)
        events.append("end")
        return real_encode(*args)

    def update(self: LocalInner, *args: Any) -> int:
        try:
            return real_update(self, *args)
        finally:
            done.append(1)
            if len(done) == 4:
                all_done.set()

    def close(self: Any) -> None:
        go_on.set()  # (the encoding under way ends only now: the call must wait for it)
        real_close(self)

    monkeypatch.setattr(shardstore.pipeline, "encode_block", encode)
    monkeypatch.setattr(shardstore.inner.local.LocalInner, "_update", update)
    monkeypatch.setattr(shardstore.writing.builds.ShardBuilds, "close", close)
    value = data + 1

    async def cancelled() -> None:
        write = asyncio.ensure_future(arr._async_array.setitem(slice(None), value))
        assert await asyncio.to_thread(begun.wait, 30)
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        events.append("returned")
        value[:] = -5  # the caller reuses its array
        assert await asyncio.to_thread(all_done.wait, 30)  # (the loop runs on: the commits go on)

    asyncio.run(cancelled())
    assert events == ["begin", "end"] * 4 + ["returned"]
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:], data + 1)


@pytest.mark.usefixtures("pipeline")
def test_a_write_cancelled_as_its_commits_start_leaves_no_shard_reserved(tmp_path: Path) -> None:
    """A whole write with one shard free and one behind a pending commit, cancelled in
    each of its first loop turns: the free shard's commit is started with its
    reservation, whatever turn the cancel comes in, so a later write of it never waits
    for a reservation nobody releases."""

    class Gated(LocalInner):
        gate: asyncio.Event | None = None
        entered: asyncio.Event | None = None

        async def update(self, key: str, change: Any, **kwargs: Any) -> None:
            if self.gate is not None and self.entered is not None and key.endswith("/1"):
                self.entered.set()
                await self.gate.wait()
            await super().update(key, change, **kwargs)

    async def trial(root: Path, turns: int) -> None:
        inner = Gated(str(root))
        arr = await zarr.api.asynchronous.create_array(
            ShardingStore(inner, (4,)), name="a", shape=(8,), chunks=(1,), dtype="i4", compressors=None
        )
        inner.gate, inner.entered = asyncio.Event(), asyncio.Event()
        pending = asyncio.ensure_future(arr.setitem(slice(4, 6), np.full(2, 7, "i4")))  # shard 1, gated
        await inner.entered.wait()
        write = asyncio.ensure_future(arr.setitem(slice(None), np.arange(1, 9, dtype="i4")))
        for _ in range(turns):
            await asyncio.sleep(0)
        write.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await write
        inner.gate.set()
        await pending
        await asyncio.wait_for(arr.setitem(slice(0, 4), np.full(4, 9, "i4")), 30)  # shard 0 again
        got = await (
            await zarr.api.asynchronous.open_array(store=ShardingStore(str(root)), path="a")
        ).getitem(slice(0, 4))
        np.testing.assert_array_equal(got, [9, 9, 9, 9])

    for turns in range(8):
        asyncio.run(trial(tmp_path / f"s{turns}", turns))


@pytest.mark.usefixtures("pipeline")
def test_shards_encoded_by_their_commits_are_shared_out_however_small_they_compress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local commits of small objects are made one after another on one thread, until
    one is big, or took its thread SHARED_COMMITS_FROM_CPU_S: so shards that compress
    to a few bytes are still encoded by several threads at once (the second and third
    encodings wait for each other here, which one thread could never do)."""
    import shardstore.inner.local

    calls: list[int] = []
    both = threading.Barrier(2, timeout=30)
    real = shardstore.pipeline.encode_block

    def encode(*args: Any) -> Any:
        calls.append(threading.get_ident())
        if len(calls) == 1:  # the work of a real encoding, as its thread's CPU time
            began = time.thread_time()
            while time.thread_time() - began < 2 * shardstore.inner.local.SHARED_COMMITS_FROM_CPU_S:
                pass
        elif len(calls) <= 3:
            both.wait()
        return real(*args)

    monkeypatch.setattr(shardstore.pipeline, "encode_block", encode)
    store = ShardingStore(str(tmp_path / "s"), (4, 4))
    data = np.ones((128, 128), dtype="f4")  # 16 shards of a few hundred bytes each
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype="f4")
    arr[:] = data
    assert len(calls) == 16 and len(set(calls)) >= 2
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:], data)


def _peak_of(action: Callable[[], T]) -> tuple[T, int]:
    """``action()``, and the most memory it held at once above what was held before (as
    tracemalloc sees numpy's and Python's allocations)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = action()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.usefixtures("pipeline")
def test_a_whole_write_in_a_batch_holds_its_groups_not_every_shard(tmp_path: Path) -> None:
    """Shards to be encoded by their commits that go to a batch are encoded first, a
    group at a time as ever: the batch's ``max_bytes`` and the groups bound what the
    write holds, not the array's size."""
    shard_nbytes = 4 * 4 * 128 * 128 * 4  # 1 MiB, uncompressed
    store = ShardingStore(str(tmp_path / "s"), (4, 4), fetch_concurrency=4)
    data = sample((4096, 2048), "f4")  # 32 shards
    arr = zarr.create_array(
        store, name="a", shape=data.shape, chunks=(128, 128), dtype="f4", compressors=None
    )

    def write_in_a_batch() -> None:
        with store.batch(max_bytes=2 * shard_nbytes):
            arr[:] = data

    _, wrote = _peak_of(write_in_a_batch)
    np.testing.assert_array_equal(arr[:], data)
    # (groups of two, the batch's two, and memory kept for reuse: 7-10 shards here)
    assert wrote <= 14 * shard_nbytes, wrote


@pytest.mark.usefixtures("pipeline")
def test_a_whole_write_holds_a_shard_a_commit_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards encoded by their commits are let go of as each is written: a whole write
    holds a shard per commit thread (a thread per core and one more), not a group of
    ``fetch_concurrency`` encoded shards."""
    import shardstore.tasks

    monkeypatch.setattr(shardstore.tasks, "available_cores", lambda: 2)
    shard_nbytes = 4 * 4 * 128 * 128 * 4  # 4 x 4 chunks of 128 x 128 float32, uncompressed: 1 MiB
    store = ShardingStore(str(tmp_path / "s"), (4, 4), fetch_concurrency=32)
    data = sample((2048, 2048), "f4")  # 16 shards, 16 MiB
    arr = zarr.create_array(
        store, name="a", shape=data.shape, chunks=(128, 128), dtype="f4", compressors=None
    )
    _, wrote = _peak_of(lambda: arr.__setitem__(slice(None), data))
    np.testing.assert_array_equal(arr[:], data)
    assert wrote <= (2 + 1 + 1) * shard_nbytes, wrote  # (+1: a shard's room and zarr's bookkeeping)


@pytest.mark.usefixtures("pipeline")
def test_fill_value_chunks_are_erased_from_their_shards(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path / "s"), (2, 2))
    arr = zarr.create_array(store, name="a", shape=(16, 16), chunks=(4, 4), dtype="i4", fill_value=0)
    arr[:] = 5
    arr[:8, :] = 0
    assert sorted(k for k in inner_keys(store) if "/c/" in k) == ["a/c/1/0", "a/c/1/1"]
    arr[:] = 0
    assert [k for k in inner_keys(store) if "/c/" in k] == []


@pytest.mark.usefixtures("pipeline")
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_formats_ranks_and_edge_chunks_round_trip(tmp_path: Path, zarr_format: int) -> None:
    store = ShardingStore(str(tmp_path / "s"), (2, 3, 2))
    data = sample((9, 13, 5), "u2")
    arr = zarr.create_array(
        store, name="a", shape=data.shape, chunks=(2, 2, 2), dtype="u2", zarr_format=zarr_format
    )
    arr[:] = data
    arr[1, 2:11, 4] = 9  # a scalar over a strided selection
    data[1, 2:11, 4] = 9
    np.testing.assert_array_equal(arr[:], data)
    np.testing.assert_array_equal(arr[3:8, ::3, 1:], data[3:8, ::3, 1:])


@pytest.mark.usefixtures("pipeline")
def test_writes_inside_a_batch_are_buffered_like_any_other(tmp_path: Path) -> None:
    store, inner = _counted(tmp_path)
    arr = zarr.create_array(store, name="a", shape=(16, 16), chunks=(4, 4), dtype="i4")
    inner.counts.reset()
    with store.batch():
        arr[:8] = 1
        assert inner.counts.writes == 0
        np.testing.assert_array_equal(arr[6:10, 0], [1, 1, 0, 0])  # reads see the batch
        arr[8:] = 2  # the shard is complete: written at once
    assert inner.counts.writes == 1  # (the read above looked for the chunks not written yet)
    np.testing.assert_array_equal(arr[:], np.repeat([1, 2], 8)[:, None] * np.ones((1, 16), "i4"))


@pytest.mark.usefixtures("pipeline")
@pytest.mark.parametrize(("compressors", "fetch_concurrency"), [(None, 32), ("auto", 32), ("auto", 8)])
def test_a_few_chunks_go_chunk_by_chunk_and_more_shard_by_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compressors: Any, fetch_concurrency: int
) -> None:
    """A read or write of fewer than ROUTED_FROM chunks, and of no more than one batch of
    shards (half ``fetch_concurrency``), goes through the store chunk by chunk (routing
    a few chunks at once costs more than it saves); more, routed at once, shard by
    shard. The data is the same either way."""
    routed: list[int] = []
    pipeline = shardstore.pipeline.ShardAwarePipeline
    real = pipeline._read_shards, pipeline._write_shards

    def counting(k: int) -> Any:
        async def through(self: Any, store: Any, chunks: Any, *args: Any) -> Any:
            routed.append(len(chunks))
            return await real[k](self, store, chunks, *args)

        return through

    monkeypatch.setattr(pipeline, "_read_shards", counting(0))
    monkeypatch.setattr(pipeline, "_write_shards", counting(1))
    few = min(shardstore.pipeline.ROUTED_FROM - 1, fetch_concurrency // 2)
    store, _ = _counted(tmp_path, fetch_concurrency=fetch_concurrency)
    arr = zarr.create_array(
        store, name="a", shape=(4, 4 * (few + 1)), chunks=(4, 4), dtype="f4", compressors=compressors
    )
    data = sample(arr.shape, "f4")
    arr[:, : 4 * few] = data[:, : 4 * few]
    np.testing.assert_array_equal(arr[:, : 4 * few], data[:, : 4 * few])
    assert routed == []
    arr[:] = data
    np.testing.assert_array_equal(arr[:], data)
    assert routed == [few + 1, few + 1]


@pytest.mark.usefixtures("pipeline")
@pytest.mark.parametrize("n", [16, 17, 31])
def test_a_few_chunks_take_no_more_requests_chunk_by_chunk_than_routed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """Chunk by chunk or routed, a selection of ``n`` chunks each in a shard of its own
    takes the same requests, bytes and rounds (batches) of reads."""
    inner = CountingInner(LocalInner(str(tmp_path / "s")))
    arr = zarr.create_array(ShardingStore(inner, (2,)), name="a", shape=(64,), chunks=(1,), dtype="i2")
    arr[:] = np.arange(64, dtype="i2")
    counts = []
    for routed_from in (shardstore.pipeline.ROUTED_FROM, 1):
        monkeypatch.setattr(shardstore.pipeline, "ROUTED_FROM", routed_from)
        fresh = CountingInner(LocalInner(str(tmp_path / "s")))
        again = zarr.open_array(ShardingStore(fresh), path="a")
        np.testing.assert_array_equal(again[0 : 2 * n : 2], np.arange(0, 2 * n, 2, dtype="i2"))
        counts.append((fresh.counts.reads, fresh.counts.read_batches, fresh.counts.bytes_read))
    assert counts[0] == counts[1]


@pytest.mark.usefixtures("pipeline")
def test_a_write_to_a_read_only_store_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    """Also a write of part of a chunk, which reads the chunk first: refused before that
    read (a damaged shard would otherwise say so instead)."""
    where = str(tmp_path / "s")
    zarr.create_array(ShardingStore(where, (2,)), name="a", shape=(16,), chunks=(4,), dtype="i2")[:] = 5
    inner = CountingInner(LocalInner(where))
    read_only = zarr.open_array(ShardingStore(inner, read_only=True), path="a")
    inner.counts.reset()  # (the array's metadata, read at open)
    for selection in (slice(1, 3), slice(0, 4), slice(None)):
        with pytest.raises(ReadOnlyError):
            read_only[selection] = 7
    assert (inner.counts.reads, inner.counts.writes) == (0, 0)
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(where), path="a")[:], 5)


@pytest.mark.usefixtures("pipeline")
def test_whole_chunks_written_in_a_batch_go_shard_by_shard_and_a_part_merges_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's write of whole chunks reads nothing, so it is encoded shard by shard
    as outside a batch; a write of part of a chunk reads the chunk, which only the
    key-by-key path finds in the batch, so it goes that way."""
    monkeypatch.setattr(shardstore.pipeline, "ROUTED_FROM", 1)  # (a few chunks: shard by shard all the same)
    shards: list[int] = []
    real = shardstore.pipeline.encode_shards
    monkeypatch.setattr(
        shardstore.pipeline, "encode_shards", lambda *a, **k: (shards.append(len(a[2])), real(*a, **k))[1]
    )
    store, inner = _counted(tmp_path)
    arr = zarr.create_array(store, name="a", shape=(16, 16), chunks=(4, 4), dtype="i4")
    expected = np.zeros((16, 16), "i4")
    inner.counts.reset()
    with store.batch():
        arr[:8, :12] = 1
        expected[:8, :12] = 1
        assert shards and sum(shards) == 1  # (its one shard: 4x4 chunks of 4x4)
        arr[1:3, 5:7] = 5  # part of a buffered chunk
        expected[1:3, 5:7] = 5
        assert sum(shards) == 1
        assert inner.counts.writes == 0
        np.testing.assert_array_equal(arr[:], expected)
    np.testing.assert_array_equal(arr[:], expected)
    assert inner.counts.writes == 1


@pytest.mark.usefixtures("pipeline")
def test_other_stores_and_zarrs_own_sharding_get_zarrs_pipeline_behaviour(tmp_path: Path) -> None:
    data = sample((32, 32), "f4")
    plain = zarr.create_array(MemoryStore(), name="a", shape=data.shape, chunks=(8, 8), dtype="f4")
    plain[:] = data
    np.testing.assert_array_equal(plain[5:20], data[5:20])
    codec = zarr.create_array(
        ShardingStore(str(tmp_path / "s"), None),
        name="c",
        shape=data.shape,
        chunks=(8, 8),
        shards=(16, 16),
        dtype="f4",
    )
    codec[:] = data
    np.testing.assert_array_equal(codec[3:30, 7:9], data[3:30, 7:9])


_selection = st.tuples(
    st.integers(0, 20), st.integers(1, 21), st.integers(0, 20), st.integers(1, 21), st.integers(1, 3)
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=st.lists(_selection, min_size=1, max_size=4), read=_selection)
def test_any_selection_matches_zarrs_own_pipeline(
    tmp_path_factory: pytest.TempPathFactory, writes: list[tuple[int, ...]], read: tuple[int, ...]
) -> None:
    root = tmp_path_factory.mktemp("h")
    results = []
    for path in (ZARR_PIPELINE, PIPELINE_PATH):
        with zarr.config.set({"codec_pipeline.path": path}):
            store = ShardingStore(str(root / path), (2, 3))
            arr = zarr.create_array(store, name="a", shape=(21, 21), chunks=(3, 2), dtype="i2", fill_value=-1)
            for n, (r0, r1, c0, c1, step) in enumerate(writes):
                arr[r0:r1:step, c0:c1] = n
            r0, r1, c0, c1, step = read
            results.append(
                (arr[r0:r1, c0:c1:step], zarr.open_array(ShardingStore(str(root / path)), path="a")[:])
            )
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


@pytest.mark.usefixtures("pipeline")
def test_an_unsharded_array_under_the_pipeline_is_one_object_per_chunk(tmp_path: Path) -> None:
    inner = CountingInner(LocalInner(str(tmp_path / "s")))
    store = ShardingStore(inner, (4, 4), fetch_concurrency=5)
    with pytest.warns(UserWarning):  # a 1-d array under a 2-d chunks_per_shard stays unsharded
        arr = zarr.create_array(store, name="v", shape=(40,), chunks=(2,), dtype="i4")
    inner.counts.reset()
    arr[:] = np.arange(40)
    assert inner.counts.writes == 20  # one object per chunk, as without shardstore
    np.testing.assert_array_equal(
        zarr.open_array(ShardingStore(str(tmp_path / "s")), path="v")[:], np.arange(40)
    )


def test_the_environment_variable_selects_the_pipeline_without_importing_shardstore() -> None:
    """The ``zarr.codec_pipeline`` entry point registers it: a dask worker configured by
    environment alone gets it for any array, and zarr's behaviour for other stores."""
    script = (
        "import zarr; from zarr.storage import MemoryStore\n"
        "a = zarr.create_array(MemoryStore(), name='a', shape=(8,), chunks=(2,), dtype='i4')\n"
        "a[:] = 3\n"
        "print(type(a._async_array.codec_pipeline).__name__, int(a[:].sum()))\n"
    )
    env = {**os.environ, "ZARR_CODEC_PIPELINE__PATH": PIPELINE_PATH}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["BatchedCodecPipeline", "24"]  # zarr's own, as zarr builds it


FUSED = "zarr.core.codec_pipeline.FusedCodecPipeline"
ZARRS = "zarrs.ZarrsCodecPipeline"


def _round_trip(store: Any, data: np.ndarray) -> Any:
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype=data.dtype, fill_value=0)
    arr[:] = data
    arr[3:21, 5:9] = 7
    expected = data.copy()
    expected[3:21, 5:9] = 7
    np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[:], expected)
    return arr._async_array.codec_pipeline


def test_fallback_path_serves_other_stores_and_ours_serves_sharding_stores(tmp_path: Path) -> None:
    """zarr 3.4's FusedCodecPipeline (zarr 3.1 has none: zarr's batched pipeline) serves
    an array in a plain store; under the same configuration a ShardingStore array
    costs the requests it costs without a fallback."""
    has_fused = hasattr(zarr.core.codec_pipeline, "FusedCodecPipeline")
    fallback = FUSED if has_fused else ZARR_PIPELINE
    data = sample((32, 32), "i4")
    counts = []
    for config in ({}, {"codec_pipeline.fallback_path": fallback}):
        with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH, **config}):
            plain = _round_trip(zarr.storage.LocalStore(tmp_path / f"plain{len(counts)}"), data)
            store, inner = _counted(tmp_path, f"s{len(counts)}")
            inner.counts.reset()
            assert isinstance(_round_trip(store, data), ShardAwarePipeline)
            counts.append((inner.counts.reads, inner.counts.read_batches, inner.counts.writes))
    served = plain.fallback if isinstance(plain, ShardAwarePipeline) else plain
    if has_fused:
        assert type(served).__name__ == "FusedCodecPipeline"
    assert counts[0] == counts[1]


def test_zarrs_as_fallback_and_zarrs_alone_give_correct_data(tmp_path: Path) -> None:
    """zarrs' Rust pipeline serves what it can (a local store) beside ours; configured
    alone, it leaves a ShardingStore array to zarr's pipeline, with the same data."""
    pytest.importorskip("zarrs")
    data = sample((32, 32), "i4")
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH, "codec_pipeline.fallback_path": ZARRS}):
        plain = _round_trip(zarr.storage.LocalStore(tmp_path / "plain"), data)
        ours = _round_trip(ShardingStore(str(tmp_path / "s"), (2, 2)), data)
    assert type(plain).__name__ == "ZarrsCodecPipeline"
    assert isinstance(ours, ShardAwarePipeline)
    with zarr.config.set({"codec_pipeline.path": ZARRS}):
        alone = _round_trip(ShardingStore(str(tmp_path / "z"), (2, 2)), data)
    assert not isinstance(alone, ShardAwarePipeline)
    np.testing.assert_array_equal(
        zarr.open_array(ShardingStore(str(tmp_path / "z")), path="a")[:8, :8],
        zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:8, :8],
    )


def test_a_fallback_path_that_names_no_pipeline_is_refused(tmp_path: Path) -> None:
    from shardstore import ShardingConfigError

    for bad in ("nowhere.Pipeline", "numpy.ndarray"):
        with (
            zarr.config.set({"codec_pipeline.path": PIPELINE_PATH, "codec_pipeline.fallback_path": bad}),
            pytest.raises(ShardingConfigError, match=r"codec_pipeline\.fallback_path"),
        ):
            zarr.create_array(zarr.storage.MemoryStore(), name="a", shape=(4,), chunks=(2,), dtype="i4")


@pytest.mark.usefixtures("pipeline")
def test_missing_chunks_are_reported_to_zarr(tmp_path: Path) -> None:
    """zarr 3.4 asks the pipeline which chunks were missing (``array.read_missing_chunks``
    False: reading one raises); through ours, chunk by chunk, in the order asked."""
    if not hasattr(zarr.errors, "ChunkNotFoundError"):
        pytest.skip(f"zarr {zarr.__version__} has no array.read_missing_chunks")
    store = ShardingStore(str(tmp_path / "s"), (2, 2))
    arr = zarr.create_array(store, name="a", shape=(16, 16), chunks=(4, 4), dtype="i4", fill_value=0)
    arr[:8, :8] = 1
    with zarr.config.set({"array.read_missing_chunks": False}):
        strict = zarr.open_array(store, path="a")
        np.testing.assert_array_equal(strict[:8, :8], 1)
        with pytest.raises(zarr.errors.ChunkNotFoundError) as caught:
            strict[2:14, 6:10]  # chunk rows 0-3, columns 1-2: present where both < 2
    named = set(re.findall(r"chunk '(c/[0-9/]+)'", str(caught.value)))
    assert named == {f"c/{i}/{j}" for i in range(4) for j in (1, 2) if not (i < 2 and j < 2)}


_KINDS = """
import sys, zarr
from zarr.storage import LocalStore, MemoryStore
import shardstore
from shardstore import ShardingStore
root = sys.argv[1]
def kind(arr):
    return type(arr._async_array.codec_pipeline).__name__
ours = ShardingStore(root + "/s", (2, 2))
made = zarr.create_array(ours, name="a", shape=(8, 8), chunks=(2, 2), dtype="u1")
made[:] = 1
print(zarr.config.get("codec_pipeline.path"))
print(kind(made), kind(zarr.open_array(ShardingStore(root + "/s"), path="a")))
print(kind(zarr.open_group(ShardingStore(root + "/s"))["a"]))
print(kind(zarr.create_array(MemoryStore(), shape=(8,), chunks=(2,), dtype="i4")))
local = LocalStore(root + "/p")
print(kind(zarr.create_array(local, shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="u1")))
"""


def _kinds(tmp_path: Path, **env: str) -> list[str]:
    """What a fresh process gets: zarr's setting, then the pipeline class of a
    ShardingStore array (created, opened, from a group), a MemoryStore array and an
    array zarr shards itself on a LocalStore."""
    done = subprocess.run(
        [sys.executable, "-c", _KINDS, str(tmp_path)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def test_importing_shardstore_makes_its_pipeline_zarrs_default_for_its_stores_only(tmp_path: Path) -> None:
    assert _kinds(tmp_path) == [
        PIPELINE_PATH,
        *["ShardAwarePipeline"] * 3,
        *["BatchedCodecPipeline"] * 2,  # exactly the class zarr builds without shardstore
    ]


def test_the_default_can_be_refused_by_the_environment(tmp_path: Path) -> None:
    assert _kinds(tmp_path, SHARDSTORE_DEFAULT_PIPELINE="0") == [ZARR_PIPELINE, *["BatchedCodecPipeline"] * 5]


def test_a_pipeline_the_user_chose_is_left_alone(tmp_path: Path) -> None:
    pytest.importorskip("zarrs")
    got = _kinds(tmp_path, ZARR_CODEC_PIPELINE__PATH=ZARRS)
    assert got[0] == ZARRS
    assert "ShardAwarePipeline" not in got  # zarrs declines a ShardingStore: zarr's batched pipeline


def test_a_setting_in_force_while_zarr_loads_shardstore_leaves_the_decision_to_the_first_store(
    tmp_path: Path,
) -> None:
    """zarr may import shardstore (loading its pipeline entry points) inside a user's
    temporary setting; the first ShardingStore made after it ends makes the default."""
    script = (
        "import sys, zarr\n"
        "with zarr.config.set({'codec_pipeline.path': 'shardstore.pipeline.ShardAwarePipeline'}):\n"
        "    import shardstore\n"
        "print(zarr.config.get('codec_pipeline.path'))\n"
        "shardstore.ShardingStore(sys.argv[1])\n"
        "print(zarr.config.get('codec_pipeline.path'))\n"
        "zarr.config.set({'codec_pipeline.path': 'zarr.core.codec_pipeline.BatchedCodecPipeline'})\n"
        "shardstore.ShardingStore(sys.argv[1])\n"
        "print(zarr.config.get('codec_pipeline.path'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True
    )
    # decided by the first store; after that the user's explicit choice stands
    assert done.stdout.split() == [ZARR_PIPELINE, PIPELINE_PATH, ZARR_PIPELINE]


def test_xarray_reads_through_the_default_pipeline(tmp_path: Path) -> None:
    xr = pytest.importorskip("xarray")
    store, inner = _counted(tmp_path)
    data = sample((128, 128), "f4")  # 16 shards of 4 x 4 chunks
    xr.Dataset({"v": (("y", "x"), data)}).to_zarr(
        store, mode="w", encoding={"v": {"chunks": (8, 8)}}, consolidated=False
    )
    batches = {}
    for path in (PIPELINE_PATH, ZARR_PIPELINE):
        with zarr.config.set({"codec_pipeline.path": path}):
            inner.counts.reset()
            got = xr.open_zarr(ShardingStore(inner), consolidated=False, chunks=None)["v"].values
            np.testing.assert_array_equal(got, data)
            batches[path] = inner.counts.read_batches
    # the same metadata reads; then the 16 shards in one batch, not zarr's rounds of 10 chunks
    assert batches[PIPELINE_PATH] <= batches[ZARR_PIPELINE] - 10, batches


@pytest.mark.usefixtures("placed_as_read", "pipeline")
@pytest.mark.parametrize("group_bytes", [1, 2])
@pytest.mark.parametrize("threads", [True, False])
def test_small_shards_are_read_as_many_as_fill_group_bytes_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group_bytes: int, threads: bool
) -> None:
    """A batch per group costs as much for small shards as for big ones: a group holds
    half ``fetch_concurrency`` shards, or as many as GROUP_BYTES hold (twice as many
    where each shard is decoded as it is read: no group is fetched ahead)."""
    monkeypatch.setattr(shardstore.pipeline, "GROUP_BYTES", group_bytes * 4096)
    a_batch = group_bytes * (2 if threads else 1)
    assert _whole_read_batches(tmp_path, fetch_concurrency=2, threads=threads) == (4 // a_batch, 4)


def _whole_read_batches(tmp_path: Path, fetch_concurrency: int, *, threads: bool = True) -> tuple[int, int]:
    """(read batches, reads) of a whole read of 4 shards of 4 KiB each (4 x 4 chunks
    of 8 x 8), from files that read in ``threads`` or not."""
    store, _ = _counted(tmp_path)
    data = sample((64, 64), "f4")
    zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype="f4")[:] = data
    reader, inner = _counted(tmp_path, threads=threads, fetch_concurrency=fetch_concurrency)
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.open_array(reader, path="a")
        inner.counts.reset()
        np.testing.assert_array_equal(arr[:], data)
    return inner.counts.read_batches, inner.counts.reads


@pytest.mark.usefixtures("placed_as_read", "pipeline", "groups_by_count")
@pytest.mark.parametrize("max_shards", [1, 2, 4])
@pytest.mark.parametrize("threads", [True, False])
def test_big_shards_are_read_no_more_than_held_max_bytes_a_batch_or_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_shards: int, threads: bool
) -> None:
    """However many shards ``fetch_concurrency`` allows, a read holds HELD_MAX_BYTES of
    big shards at most (a shard a batch at least): half a batch where two groups are
    held at once (one fetched while the other decodes), a whole batch where each shard
    is decoded as it is read."""
    groups = 1 if threads else 2
    monkeypatch.setattr(shardstore.pipeline, "HELD_MAX_BYTES", groups * (max_shards * 4096 + 4095))
    assert _whole_read_batches(tmp_path, fetch_concurrency=64, threads=threads) == (4 // max_shards, 4)


@pytest.mark.usefixtures("groups_by_count")
def test_a_whole_read_and_write_hold_at_most_fetch_concurrency_shards(tmp_path: Path) -> None:
    """Peak memory (as tracemalloc sees numpy's and Python's allocations) of a whole read
    is the output plus ``fetch_concurrency`` shards, and of a whole write the encoded
    shards of ``fetch_concurrency`` at most: never the whole array's shards at once.
    (The shard cache is a budget of its own, ``shard_cache_bytes``: off here.)"""
    shard_nbytes = 128 * 128 * 4  # 2 x 2 chunks of 64 x 64 float32, uncompressed
    store = ShardingStore(str(tmp_path / "s"), (2, 2), fetch_concurrency=4)
    data = sample((1024, 1024), "f4")  # 64 shards, 4 MiB
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(64, 64), dtype="f4", compressors=None)
    slack = 2**19  # per-chunk bookkeeping (zarr's and ours, ~1 KiB a chunk), chunks in flight
    _, wrote = _peak_of(lambda: arr.__setitem__(slice(None), data))
    uncached = ShardingStore(str(tmp_path / "s"), (2, 2), fetch_concurrency=4, shard_cache_bytes=0)
    reader = zarr.open_array(uncached, path="a")
    got, read = _peak_of(lambda: reader[:])
    np.testing.assert_array_equal(got, data)
    assert wrote <= 4 * shard_nbytes + slack, wrote
    assert read <= data.nbytes + 4 * shard_nbytes + slack, read


# -- a user's pipeline choice --------------------------------------------------------


def _main_paths() -> list[str]:
    """Every other pipeline this stack has: zarr's batched one, zarr 3.4's fused one, zarrs."""
    paths = [ZARR_PIPELINE]
    if hasattr(zarr.core.codec_pipeline, "FusedCodecPipeline"):
        paths.append(FUSED)
    if importlib.util.find_spec("zarrs") is not None:
        paths.append(ZARRS)
    return paths


@pytest.fixture
def untold(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process has not said PipelineChoiceWarning yet, nor declined the default."""
    import shardstore.default_pipeline

    monkeypatch.setattr(shardstore.default_pipeline, "_warned", False)
    monkeypatch.delenv("SHARDSTORE_DEFAULT_PIPELINE", raising=False)


def _choice_warnings(said: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in said if issubclass(w.category, PipelineChoiceWarning)]


def _whole_write(store: ShardingStore, inner: CountingInner, data: np.ndarray) -> tuple[Any, int]:
    """Write ``data`` as a new array "a" (8 x 8 chunks): its pipeline and the inner writes."""
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype=data.dtype)
    inner.counts.reset()
    arr[:] = data
    np.testing.assert_array_equal(arr[:], data)
    return arr._async_array.codec_pipeline, inner.counts.writes


@pytest.mark.usefixtures("untold")
@pytest.mark.parametrize("path", _main_paths())
def test_another_main_pipeline_is_named_once_with_the_settings_that_give_both(
    tmp_path: Path, path: str
) -> None:
    """A ShardingStore array served one chunk at a time by the user's pipeline: one
    warning per process, naming both settings; following it, shardstore's pipeline
    serves the ShardingStore array (one write per shard) and theirs every other."""
    data = sample((64, 64), "i4")  # 8 x 8 chunks, 2 x 2 shards of 4 x 4
    with warnings.catch_warnings(record=True) as said, zarr.config.set({"codec_pipeline.path": path}):
        warnings.simplefilter("always")
        _, writes = _whole_write(*_counted(tmp_path, "first"), data)
        _whole_write(*_counted(tmp_path, "second"), data)
    (message,) = _choice_warnings(said)
    assert f"codec_pipeline.path is {path!r}" in message and "'a/c/" in message
    assert f"codec_pipeline.path to {PIPELINE_PATH!r} and codec_pipeline.fallback_path to {path!r}" in message
    assert writes > 2 * 2, "one chunk at a time: more than one commit per shard"

    advised = {"codec_pipeline.path": PIPELINE_PATH, "codec_pipeline.fallback_path": path}
    with warnings.catch_warnings(record=True) as said, zarr.config.set(advised):
        warnings.simplefilter("always")
        pipeline, writes = _whole_write(*_counted(tmp_path, "advised"), data)
        plain = _round_trip(zarr.storage.LocalStore(tmp_path / "plain"), data)
    assert isinstance(pipeline, ShardAwarePipeline) and writes == 2 * 2
    assert not _choice_warnings(said)
    if path != ZARR_PIPELINE:
        served = plain.fallback if isinstance(plain, ShardAwarePipeline) else plain
        assert path.endswith(type(served).__name__)


@pytest.mark.usefixtures("untold")
def test_no_choice_warning_under_shardstores_pipeline_or_once_the_default_was_declined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = sample((16, 16), "i4")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
            _round_trip(ShardingStore(str(tmp_path / "ours"), (2, 2)), data)
        monkeypatch.setenv("SHARDSTORE_DEFAULT_PIPELINE", "0")
        with zarr.config.set({"codec_pipeline.path": ZARR_PIPELINE}):
            _round_trip(ShardingStore(str(tmp_path / "declined"), (2, 2)), data)
    assert not _choice_warnings(said)


# -- groups in flight -----------------------------------------------------------------


@given(
    finishing=st.integers(1, 4),
    prepare_turns=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    finish_turns=st.lists(st.integers(0, 6), min_size=12, max_size=12),
)
def test_groups_are_prepared_one_at_a_time_and_at_most_finishing_plus_one_are_held(
    finishing: int, prepare_turns: list[int], finish_turns: list[int]
) -> None:
    """Whatever each step's duration (in loop turns): every group is prepared, in order,
    one at a time, and finished once; never more than ``finishing`` finish at once,
    nor more than ``finishing + 1`` are held (prepared or being prepared, not finished)."""
    groups = list(range(len(prepare_turns)))
    preparing, finishing_now, held, peaks = set(), set(), set(), {"prepare": 0, "finish": 0, "held": 0}
    order: list[int] = []
    finished: list[int] = []

    async def prepare(g: int) -> int:
        preparing.add(g)
        held.add(g)
        order.append(g)
        peaks["prepare"] = max(peaks["prepare"], len(preparing))
        peaks["held"] = max(peaks["held"], len(held))
        for _ in range(prepare_turns[g]):
            await asyncio.sleep(0)
        preparing.discard(g)
        return g * 10

    async def finish(g: int, ready: int) -> None:
        assert ready == g * 10
        finishing_now.add(g)
        peaks["finish"] = max(peaks["finish"], len(finishing_now))
        for _ in range(finish_turns[g]):
            await asyncio.sleep(0)
        finishing_now.discard(g)
        held.discard(g)
        finished.append(g)

    asyncio.run(shardstore.pipeline._ahead(groups, prepare, finish, finishing=finishing))
    assert order == groups and sorted(finished) == groups
    assert peaks["prepare"] == 1 and peaks["finish"] <= finishing and peaks["held"] <= finishing + 1


def test_a_failed_group_ends_the_call_after_what_it_started_has_ended() -> None:
    """The first failure is raised once no prepare or finish it started still runs."""
    running: set[int] = set()
    seen_running_after: list[set[int]] = []

    async def prepare(g: int) -> int:
        running.add(-g - 1)
        try:
            await asyncio.sleep(0.001 * g)
        finally:
            running.discard(-g - 1)
        return g

    async def finish(g: int, ready: int) -> None:
        running.add(g)
        try:
            for _ in range(5 if g != 2 else 1):
                await asyncio.sleep(0)
            if g == 2:
                raise OSError("disk full at group 2")
        finally:
            running.discard(g)

    async def main() -> None:
        with pytest.raises(OSError, match="group 2"):
            await shardstore.pipeline._ahead(list(range(8)), prepare, finish, finishing=3)
        seen_running_after.append(set(running))

    asyncio.run(main())
    assert seen_running_after == [set()]
