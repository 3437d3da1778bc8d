"""Object stores hand each response of a batch on as it comes: whole shards of a bulk
read are decoded into place on a thread per core while the other requests are still
awaited, and a read ends only once that work has."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import ByteRequest

import shardstore.pipeline
from shardstore import PIPELINE_PATH, ShardingStore
from shardstore.inner import STALE, MappingInner
from shardstore.inner.base import Capabilities, VersionedReads, slice_range

from .helpers import sample


class TaggedMapping(VersionedReads, MappingInner):
    """A mapping read as an object store is: one tagged read a request, the tag its
    bytes' hash; a key in ``gates`` answers only once its event is set, and ``answered``
    lists the keys answered, in turn."""

    capabilities = Capabilities(remote=True, versioned_ranges=True, hands_as_read=True)

    def __init__(self, mapping: dict[str, Any]) -> None:
        super().__init__(mapping)
        self.gates: dict[str, asyncio.Event] = {}
        self.answered: list[str] = []

    async def _get_tagged(
        self, key: str, byte_range: ByteRequest | None, expected: Hashable | None, unless: Hashable = None
    ) -> tuple[bytes | None, Hashable | None]:
        if key in self.gates:
            await self.gates[key].wait()
        self.answered.append(key)
        value = self.mapping.get(key)
        if value is None:
            return None, None
        tag = hash(bytes(value))
        if expected is not None and expected != tag:
            return STALE, None
        return slice_range(bytes(value), byte_range), tag


class Handed:
    """A ``then`` that notes each value with the thread it came on; ``block`` holds each
    call until set (10 s at most), ``began`` is set as the first begins."""

    def __init__(self, raises: bool = False) -> None:
        self.values: dict[int, tuple[Any, Hashable | None, int]] = {}
        self.block = threading.Event()
        self.block.set()
        self.began = threading.Event()
        self.two = threading.Event()
        self.raises = raises
        self._lock = threading.Lock()

    def __call__(self, k: int, value: Any, version: Hashable | None) -> None:
        self.began.set()
        self.block.wait(10)
        with self._lock:
            self.values[k] = (None if value is None else bytes(value), version, threading.get_ident())
            if len(self.values) == 2:
                self.two.set()
        if self.raises:
            raise ValueError(f"cannot take {k}")


def _objects() -> TaggedMapping:
    return TaggedMapping({"a": b"A" * 10, "b": b"B" * 20, "c": b"C" * 30})


REQUESTS: list[tuple[str, ByteRequest | None]] = [("a", None), ("b", None), ("c", None), ("none", None)]


async def test_each_response_is_handed_on_a_worker_thread_while_the_others_are_awaited() -> None:
    inner, then = _objects(), Handed()
    inner.gates["c"] = asyncio.Event()
    call = asyncio.ensure_future(inner.get_many_into(REQUESTS, [None] * 4, bytearray, then))
    assert await asyncio.to_thread(then.two.wait, 10)  # a and b, handed while c is awaited
    assert not call.done() and set(then.values) <= {0, 1, 3}
    inner.gates["c"].set()
    got = await call
    assert [value for value, _ in got] == [None] * 4  # (each went to then)
    assert [version for _, version in got] == [hash(b"A" * 10), hash(b"B" * 20), hash(b"C" * 30), None]
    values = [b"A" * 10, b"B" * 20, b"C" * 30, None]
    assert {k: v[:2] for k, v in then.values.items()} == {k: (values[k], got[k][1]) for k in range(4)}
    assert threading.get_ident() not in {thread for *_, thread in then.values.values()}


async def test_without_then_a_batch_returns_its_values() -> None:
    got = await _objects().get_many_into(REQUESTS, [None] * 4, bytearray)
    assert [value for value, _ in got] == [b"A" * 10, b"B" * 20, b"C" * 30, None]


async def test_what_then_raises_fails_the_call_once_every_read_and_then_has_ended() -> None:
    inner, then = _objects(), Handed(raises=True)
    with pytest.raises(ValueError, match="cannot take"):
        await inner.get_many_into(REQUESTS, [None] * 4, bytearray, then)
    assert sorted(inner.answered) == ["a", "b", "c", "none"]


async def test_a_cancelled_batch_ends_only_once_no_then_runs_any_more() -> None:
    """A thread cannot be stopped: a batch cancelled while ``then`` works (placing chunks
    into the caller's array) ends after it, and hands nothing more on."""
    inner, then = _objects(), Handed()
    inner.gates["c"] = asyncio.Event()
    then.block.clear()
    call = asyncio.ensure_future(inner.get_many_into(REQUESTS, [None] * 4, bytearray, then))
    assert await asyncio.to_thread(then.began.wait, 10)
    call.cancel()
    for _ in range(50):  # (a count of loop turns, not a time)
        await asyncio.sleep(0)
    assert not call.done()  # it waits for the threads
    then.block.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert 2 not in then.values  # c was never answered, nor handed on


async def test_a_subclass_that_changes_reads_hands_values_once_the_batch_is_read() -> None:
    class Delayed(TaggedMapping):
        async def get_many_versioned(
            self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
        ) -> list[tuple[bytes | None, Hashable | None]]:
            self.answered.append("through get_many_versioned")
            return await super().get_many_versioned(requests, expected)

    inner, then = Delayed(_objects().mapping), Handed()
    await inner.get_many_into(REQUESTS, [None] * 4, bytearray, then)
    assert inner.answered[0] == "through get_many_versioned"
    assert {thread for *_, thread in then.values.values()} == {threading.get_ident()}
    assert then.values[1][0] == b"B" * 20


async def test_a_whole_read_places_shards_while_the_last_is_still_awaited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bulk read from an object store decodes each shard into place as it comes: with
    one shard's response held back, the others' chunks are in place before it comes; the
    data and the requests are what they were (one a shard)."""
    monkeypatch.setattr(shardstore.pipeline, "PLACED_AS_READ_FROM", 0)  # (small shards here)
    inner = TaggedMapping({})
    data = sample((32, 32), "f4")
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = await zarr.api.asynchronous.create_array(
            ShardingStore(inner, (4, 4)), name="a", shape=data.shape, chunks=(4, 4), dtype="f4",
        )  # fmt: skip
        await arr.setitem(slice(None), data)
        shards = sorted(key for key in inner.mapping if "/c/" in key)
        assert len(shards) == 4
        inner.gates[shards[-1]] = asyncio.Event()
        placing, placed = shardstore.pipeline.scatter_shards, threading.Event()

        def place(*args: Any, **kwargs: Any) -> None:
            placing(*args, **kwargs)
            placed.set()

        monkeypatch.setattr(shardstore.pipeline, "scatter_shards", place)
        reopened = await zarr.api.asynchronous.open_array(store=ShardingStore(inner, (4, 4)), path="a")
        inner.answered.clear()
        read = asyncio.ensure_future(reopened.getitem(slice(None)))
        assert await asyncio.to_thread(placed.wait, 10)  # before the last shard's response
        assert not read.done()
        inner.gates[shards[-1]].set()
        np.testing.assert_array_equal(await read, data)
    assert sorted(inner.answered) == shards
