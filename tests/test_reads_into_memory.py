"""Whole reads into memory given: a bulk read's shards are read into memory one read
earlier in the same call (or an earlier call) let go of, never into memory anything
still refers to, and the values read are the objects' bytes all the same."""

from __future__ import annotations

import asyncio
import collections
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec

import shardstore.pipeline
import shardstore.shard_buffers
from shardstore import PIPELINE_PATH, ShardingStore
from shardstore.inner import LocalInner
from shardstore.inner.delegating import DelegatingInner
from shardstore.inner.zarr_store import MappingInner
from shardstore.instrument import CountingInner
from shardstore.shard_buffers import ShardBuffers

from .helpers import sample

CPS = (2, 2)


class _Given:
    """An ``into`` that hands out numpy memory and remembers it."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []

    def __call__(self, nbytes: int) -> memoryview:
        self.arrays.append(np.empty(nbytes, dtype=np.uint8))
        return memoryview(self.arrays[-1])

    def holds(self, value: Any) -> bool:
        return any(np.shares_memory(np.frombuffer(value, dtype=np.uint8), array) for array in self.arrays)


def test_local_files_are_read_whole_into_the_memory_given(tmp_path: Path) -> None:
    objects = {f"s/{k}": os.urandom(3000 + k) for k in range(3)}
    for key, data in objects.items():
        (tmp_path / key).parent.mkdir(exist_ok=True)
        (tmp_path / key).write_bytes(data)
    inner, given = LocalInner(tmp_path), _Given()
    keys = [*objects, "s/absent"]
    got = asyncio.run(inner.get_many_into([(key, None) for key in keys], [None] * len(keys), given))
    plain = asyncio.run(inner.get_many_versioned([(key, None) for key in keys], [None] * len(keys)))
    assert [bytes(value) if value is not None else None for value, _ in got] == [*objects.values(), None]
    assert all(given.holds(value) for value, _ in got[:3])
    assert [version for _, version in got] == [version for _, version in plain]
    assert sorted(len(array) for array in given.arrays) == [3000, 3001, 3002]


@pytest.mark.parametrize("counted", [False, True])
def test_values_handed_to_then_as_read_are_the_values_and_counted_alike(
    tmp_path: Path, counted: bool
) -> None:
    """With ``then``, each value (None: absent) goes to it, on the thread that read it,
    and the list keeps the versions alone; a counting wrapper counts the same reads and
    bytes as without."""
    objects = {f"s/{k}": os.urandom(3000 + k) for k in range(3)}
    for key, data in objects.items():
        (tmp_path / key).parent.mkdir(exist_ok=True)
        (tmp_path / key).write_bytes(data)
    inner: Any = CountingInner(LocalInner(tmp_path)) if counted else LocalInner(tmp_path)
    keys = [*objects, "s/absent"]
    requests = [(key, None) for key in keys]
    handed: dict[int, tuple[bytes | None, int]] = {}

    def then(k: int, value: Any, version: Any) -> None:
        handed[k] = (None if value is None else bytes(value), threading.get_ident())

    got = asyncio.run(inner.get_many_into(requests, [None] * len(keys), _Given(), then))
    plain = asyncio.run(inner.get_many_into(requests, [None] * len(keys), _Given()))
    assert [handed[k][0] for k in range(len(keys))] == [*objects.values(), None]
    assert threading.get_ident() not in {thread for _, thread in handed.values()}
    assert got == [(None, version) for _, version in plain]
    if counted:
        assert inner.counts.reads == 2 * len(keys) and inner.counts.read_batches == 2
        assert inner.counts.bytes_read == 2 * sum(map(len, objects.values()))


def test_a_store_that_cannot_read_into_memory_returns_what_it_read(tmp_path: Path) -> None:
    inner, given = MappingInner({"a": b"first", "b": b"second"}), _Given()
    got = asyncio.run(inner.get_many_into([(key, None) for key in "abc"], [None] * 3, given))
    assert [value for value, _ in got] == [b"first", b"second", None]
    assert given.arrays == []


_SHARDS = [f"a/c/{i}/{j}" for i in range(4) for j in range(4)]
"""The shards of :func:`_written_and_read_back`'s array."""


def _written_and_read_back(inner: Any, before_read: Callable[[], object]) -> None:
    """A 32 x 32 array of 64 chunks in 16 shards (enough chunks to be read shard by
    shard) written through ``inner``, then read whole through a new store over it."""
    data = sample((32, 32), "f4")
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(
            ShardingStore(inner, CPS), name="a", shape=(32, 32), chunks=(4, 4), dtype="f4"
        )
        arr[:] = data
        before_read()
        np.testing.assert_array_equal(zarr.open_array(ShardingStore(inner, CPS), path="a")[:], data)


def test_a_wrapper_that_changes_reads_still_sees_the_whole_reads(tmp_path: Path) -> None:
    """A wrapper overriding ``get_many_versioned`` (fault injection, latency) still
    gets a bulk read's whole-shard fetches: only wrappers that pass
    ``get_many_into`` on (counting, a subdirectory) read into memory given."""

    class Seen(DelegatingInner):
        keys: list[str]

        async def get_many_versioned(self, requests: Any, expected: Any) -> Any:
            self.keys.extend(key for key, _ in requests)
            return await self.inner.get_many_versioned(requests, expected)

    seen = Seen(LocalInner(tmp_path))
    seen.keys = []
    counted = CountingInner(seen)
    assert not seen.capabilities.hands_as_read and not counted.capabilities.hands_as_read
    assert CountingInner(LocalInner(tmp_path)).capabilities.hands_as_read  # (it passes them on)
    _written_and_read_back(counted, before_read=lambda: (seen.keys.clear(), counted.counts.reset()))
    assert sorted(k for k in seen.keys if "/c/" in k) == _SHARDS
    assert sorted(k for k in counted.counts.unranged_reads if "/c/" in k) == _SHARDS


def test_a_local_store_whose_subclass_changes_reads_reads_through_it(tmp_path: Path) -> None:
    """A LocalInner subclass overriding ``get_many_versioned`` (to audit or change
    what is read) sees a bulk read's whole-shard fetches too."""

    class Audited(LocalInner):
        seen: list[str]

        async def get_many_versioned(self, requests: Any, expected: Any) -> Any:
            self.seen.extend(key for key, _ in requests)
            return await super().get_many_versioned(requests, expected)

    inner = Audited(tmp_path)
    assert not inner.capabilities.hands_as_read  # (its reads are not LocalInner's)
    assert LocalInner(tmp_path).capabilities.hands_as_read
    inner.seen = []
    _written_and_read_back(inner, before_read=inner.seen.clear)
    assert sorted(k for k in inner.seen if "/c/" in k) == _SHARDS


@pytest.fixture
def flats(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Where the memory is that bulk reads ask of their ShardBuffers for shards read
    whole, with no memory left by an earlier test."""
    asked: list[int] = []

    class Spied(ShardBuffers):
        def flat(self, nbytes: int) -> memoryview:
            given = super().flat(nbytes)
            asked.append(np.frombuffer(given, dtype=np.uint8).ctypes.data)
            return given

    monkeypatch.setattr(shardstore.pipeline, "ShardBuffers", Spied)
    monkeypatch.setattr(shardstore.shard_buffers, "_SPARE", shardstore.shard_buffers._Spare())
    monkeypatch.setattr(shardstore.shard_buffers, "TRACKED_FROM", 0)  # (small shards here)
    return asked


@pytest.mark.parametrize("compressors", ["auto", None])
def test_a_bulk_read_of_many_groups_reads_each_into_memory_let_go_of(
    tmp_path: Path, flats: list[int], monkeypatch: pytest.MonkeyPatch, compressors: Any
) -> None:
    """Sixteen shards in groups of one, two groups in memory at once: every shard is
    read into given memory, later groups into that of groups decoded before, and
    every value is the one written, read on a new handle (shards fetched whole) and
    again on the same one (indices known: the chunks' spans read by range)."""
    monkeypatch.setattr(shardstore.pipeline, "GROUP_BYTES", 0)
    data = sample((32, 32), "f4")
    inner = CountingInner(LocalInner(tmp_path))
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(
            ShardingStore(inner, CPS),
            name="a",
            shape=(32, 32),
            chunks=(4, 4),
            dtype="f4",
            compressors=compressors,
        )
        arr[:] = data
        for _ in range(2):
            flats.clear()
            inner.counts.reset()
            reopened = zarr.open_array(ShardingStore(inner, CPS, fetch_concurrency=2), path="a")
            np.testing.assert_array_equal(reopened[:], data)
            shards = {key: n for key, n in inner.counts.unranged_reads.items() if "/c/" in key}
            assert len(flats) == sum(shards.values()) == len(shards) == 16
            assert len(set(flats)) <= 4  # (two groups of one shard at once: a few more)
            flats.clear()
            inner.counts.reset()
            np.testing.assert_array_equal(reopened[:], data)
            assert inner.counts.unranged_reads == {} and len(flats) == inner.counts.reads == 16
            assert len(set(flats)) <= 4
            del reopened


@pytest.mark.parametrize("compressors", ["auto", None])
def test_a_whole_read_of_local_files_places_each_shard_by_the_thread_that_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compressors: Any
) -> None:
    """Each shard read whole goes into place on the thread that read it, before that
    thread reads another: its bytes still in the CPU's cache, and its memory free for
    the next shard. Nothing is placed apart from its read."""
    monkeypatch.setattr(shardstore.pipeline, "PLACED_AS_READ_FROM", 0)  # (small shards here)
    events: dict[int, list[str]] = collections.defaultdict(list)
    reading, placing = LocalInner._read_versioned, shardstore.pipeline.scatter_shards

    def read(path: Any, *args: Any, **kwargs: Any) -> Any:
        if "/c/" in str(path):
            events[threading.get_ident()].append("read")
        return reading(path, *args, **kwargs)

    def place(codec: Any, chunks: Any, parts: Any, block: Any, part: range, **kwargs: Any) -> None:
        events[threading.get_ident()].extend(["placed"] * len(part))
        placing(codec, chunks, parts, block, part, **kwargs)

    data = sample((32, 32), "f4")
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(
            ShardingStore(LocalInner(tmp_path), CPS),
            name="a", shape=(32, 32), chunks=(4, 4), dtype="f4", compressors=compressors,
        )  # fmt: skip
        arr[:] = data
        reopened = zarr.open_array(ShardingStore(LocalInner(tmp_path), CPS), path="a")
        monkeypatch.setattr(LocalInner, "_read_versioned", staticmethod(read))
        monkeypatch.setattr(shardstore.pipeline, "scatter_shards", place)
        np.testing.assert_array_equal(reopened[:], data)
    assert sum(len(seen) for seen in events.values()) == 2 * 16
    for seen in events.values():
        assert seen == ["read", "placed"] * (len(seen) // 2)


def _gated_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Shard files read from local files on a worker thread only once the first event
    returned is set (10 s at most), the second set as the first such read begins: a
    read under way for as long as a test needs."""
    gate, entered, reading = threading.Event(), threading.Event(), LocalInner._read_versioned

    def read(path: Any, *args: Any, **kwargs: Any) -> Any:
        if "/c/" in str(path) and kwargs.get("at_once") is None:  # (not on the loop's thread)
            entered.set()
            gate.wait(10)
        return reading(path, *args, **kwargs)

    monkeypatch.setattr(LocalInner, "_read_versioned", staticmethod(read))
    return gate, entered


async def test_a_cancelled_read_ends_only_once_no_thread_places_chunks_any_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone shard of over a MiB is read, and placed as read, on a worker thread: a read
    cancelled meanwhile ends after that thread has placed its chunks, never while it
    still writes into the array the read was given."""
    data = sample((512, 512), "f4")  # one shard of 8 x 8 chunks of 16 KiB, stored raw
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = await zarr.api.asynchronous.create_array(
            ShardingStore(LocalInner(tmp_path), (8, 8)),
            name="a", shape=data.shape, chunks=(64, 64), dtype="f4", compressors=None,
        )  # fmt: skip
        await arr.setitem(slice(None), data)
        reopened = await zarr.api.asynchronous.open_array(
            store=ShardingStore(LocalInner(tmp_path), (8, 8)), path="a"
        )
        gate, entered = _gated_reads(monkeypatch)
        placing, placed = shardstore.pipeline.scatter_shards, threading.Event()

        def place(*args: Any, **kwargs: Any) -> None:
            placing(*args, **kwargs)
            placed.set()

        monkeypatch.setattr(shardstore.pipeline, "scatter_shards", place)
        read = asyncio.ensure_future(reopened.getitem(slice(None)))
        assert await asyncio.to_thread(entered.wait, 10)  # the shard is being read, on a thread
        read.cancel()
        for _ in range(50):  # (a count of loop turns, not a time)
            await asyncio.sleep(0)
        assert not read.done()  # it waits for its thread
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await read
        assert placed.is_set()


async def test_concurrent_whole_reads_of_one_store_read_each_shard_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole read that joins another's fetch of the same shards gets them from that
    fetch (the shards are not given away to be placed as read), and each read gets
    its values: one request a shard."""
    monkeypatch.setattr(shardstore.pipeline, "PLACED_AS_READ_FROM", 0)  # (small shards here)
    data = sample((32, 32), "f4")
    inner = CountingInner(LocalInner(tmp_path))
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = await zarr.api.asynchronous.create_array(
            ShardingStore(inner, CPS), name="a", shape=(32, 32), chunks=(4, 4), dtype="f4"
        )
        await arr.setitem(slice(None), data)
        reopened = await zarr.api.asynchronous.open_array(store=ShardingStore(inner, CPS), path="a")
        inner.counts.reset()
        gate, entered = _gated_reads(monkeypatch)
        first = asyncio.ensure_future(reopened.getitem(slice(None)))
        assert await asyncio.to_thread(entered.wait, 10)  # its shards are being read ...
        second = asyncio.ensure_future(reopened.getitem(slice(None)))
        for _ in range(50):  # ... and the second read joins (a count of loop turns, not a time)
            await asyncio.sleep(0)
        gate.set()
        for got in await asyncio.gather(first, second):
            np.testing.assert_array_equal(got, data)
    assert sorted(key for key in inner.counts.unranged_reads if "/c/" in key) == _SHARDS
    assert sum(n for key, n in inner.counts.unranged_reads.items() if "/c/" in key) == len(_SHARDS)


def test_a_shard_the_cache_keeps_is_never_read_into_memory_given(tmp_path: Path, flats: list[int]) -> None:
    """A read of part of a shard (not all its chunks) keeps the shard in the cache:
    that one is read as bytes of its own, so that no later read overwrites it."""
    data = sample((16, 16), "u2")
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(
            ShardingStore(LocalInner(tmp_path), (4, 4)),
            name="a", shape=(16, 16), chunks=(2, 2), dtype="u2", serializer=BytesCodec(), compressors=None,
        )  # fmt: skip
        arr[:] = data
        store = ShardingStore(LocalInner(tmp_path), (4, 4), read_strategy="shard")
        reopened = zarr.open_array(store, path="a")
        np.testing.assert_array_equal(reopened[:6, :6], data[:6, :6])  # 9 chunks of shard 0, 0
        assert store.internals.cache_usage()["shards"][0] >= 1
        assert flats == []
        np.testing.assert_array_equal(reopened[:], data)  # the cached shard, and the others whole
        np.testing.assert_array_equal(reopened[:6, :6], data[:6, :6])


def test_memory_a_caller_still_holds_after_a_read_is_not_read_into(tmp_path: Path) -> None:
    """What a call kept for the next is memory nothing referred to when it ended: a
    chunk the zarr array handed out was copied out of it, and later reads never
    change what an earlier read returned."""
    data = [sample((32, 32), "i4", seed=s) for s in range(3)]
    inner = LocalInner(tmp_path)
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(
            ShardingStore(inner, CPS), name="a", shape=(32, 32), chunks=(4, 4), dtype="i4"
        )
        results = []
        for value in data:
            arr[:] = value
            results.append(zarr.open_array(ShardingStore(inner, CPS), path="a")[:])
    for got, value in zip(results, data, strict=True):
        np.testing.assert_array_equal(got, value)
