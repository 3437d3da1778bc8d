"""Test helpers: raw access to what a ShardingStore keeps in its inner store."""

from __future__ import annotations

import asyncio
import time
import types
from typing import Any

import numpy as np
import pytest

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
    from shardstore.formats.precomputed import store as precomputed_store
    from shardstore.reading import reader

    clock = _ShiftedTime(**{name: getattr(time, name) for name in ("time", "perf_counter", "sleep")})
    for module in (reader, precomputed_store):
        monkeypatch.setattr(module, "time", clock)
    return clock
