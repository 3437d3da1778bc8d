"""Test helpers shared by several test files: raw access to what a ShardingStore keeps in
its inner store, sample data, a movable cache clock, waiting on event loops, the command
line in a subprocess, and neuroglancer sharding specs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import types
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import pytest
from zarr.core.sync import sync

from shardstore import ShardingStore
from shardstore.formats.indexed import IndexedFormat


def inner_keys(store: ShardingStore) -> list[str]:
    async def collect() -> list[str]:
        return sorted([k async for k in store.internals.raw.list_prefix("")])

    return asyncio.run(collect())


def inner_get(store: ShardingStore, key: str) -> bytes | None:
    return asyncio.run(store.internals.raw.get(key))


def logical_keys(store: ShardingStore, prefix: str = "") -> list[str]:
    async def collect() -> list[str]:
        return sorted([k async for k in store.list_prefix(prefix)])

    return asyncio.run(collect())


def logical_key_set(store: ShardingStore, prefix: str) -> set[str]:
    """The store's keys under ``prefix``, listed on zarr's event loop (``logical_keys``
    lists them on a loop of its own)."""

    async def collect() -> set[str]:
        return {k async for k in store.list_prefix(prefix)}

    return sync(collect())


def shard_chunks(store: ShardingStore, key: str, layout: IndexedFormat) -> dict[int, bytes]:
    raw = inner_get(store, key)
    assert raw is not None, key
    return layout.split(raw, key)


def sample(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    if dt.kind == "b":
        flat = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        flat = rng.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dt)
    elif dt.kind == "f":
        flat = rng.standard_normal(n).astype(dt)
    elif dt.kind == "c":
        flat = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    elif dt.kind in "SU":
        words = np.array(["a", "bb", "ccc", "", "dddd"], dtype=dt)
        flat = words[rng.integers(0, len(words), n)]
    else:
        raise NotImplementedError(dt)
    return flat.reshape(shape)


class _ShiftedTime(types.SimpleNamespace):
    """``time`` as a module sees it, with ``monotonic()`` moved on by ``shift`` seconds."""

    shift = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.shift


def later_clock(monkeypatch: pytest.MonkeyPatch) -> _ShiftedTime:
    """shardstore's cache clocks, made to move on at will (``clock.shift += seconds``):
    a cache entry ages past ``cache_max_age`` without the test waiting for it."""
    from shardstore.reading import indices, reader

    clock = _ShiftedTime(**{name: getattr(time, name) for name in ("time", "perf_counter", "sleep")})
    for module in (reader, indices):
        monkeypatch.setattr(module, "time", clock)
    return clock


# -- event loops ---------------------------------------------------------------------------

T = TypeVar("T")


def quiesce(timeout: float = 20.0) -> None:
    """Wait for every task on zarr's event loop to end. When one chunk write of an
    ``arr[...] = ...`` fails, zarr raises at once while the array's other chunk
    writes are still under way (its ``concurrent_map`` gathers without cancelling):
    they land afterwards, so a state is only checked once they are done."""

    async def settle() -> None:
        me = asyncio.current_task()
        while others := [t for t in asyncio.all_tasks() if t is not me]:
            _, pending = await asyncio.wait(others, timeout=timeout)
            assert not pending, f"tasks still under way after {timeout} s: {pending}"

    sync(settle())


async def within(awaitable: Awaitable[T], seconds: float = 5) -> T:
    """Await ``awaitable``, failing instead of hanging should it never complete."""
    return await asyncio.wait_for(awaitable, seconds)


async def turns_until(condition: Callable[[], bool], limit: int = 50) -> int:
    """The number of event-loop turns until ``condition`` holds (fails past ``limit``)."""
    for turn in range(limit):
        if condition():
            return turn
        await asyncio.sleep(0)
    raise AssertionError(f"condition still false after {limit} loop turns")


# -- the command line ----------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m shardstore ARGS`` in a subprocess, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "shardstore", *args], capture_output=True, text=True, timeout=300
    )


# -- neuroglancer precomputed ----------------------------------------------------------------


def sharding(
    preshift: int,
    minishard: int,
    shard: int,
    hash: str = "identity",
    index: str = "raw",
    data: str = "raw",
) -> dict[str, Any]:
    """The JSON of a ``neuroglancer_uint64_sharded_v1`` sharding (as an info file's
    scale holds it); ``index`` and ``data`` are the two encodings, "raw" or "gzip"."""
    return {
        "@type": "neuroglancer_uint64_sharded_v1",
        "preshift_bits": preshift,
        "hash": hash,
        "minishard_bits": minishard,
        "shard_bits": shard,
        "minishard_index_encoding": index,
        "data_encoding": data,
    }
