"""A writer killed at any moment (SIGKILL) never leaves wrong data behind.

A writer process rewrites every chunk generation after generation (each chunk
filled with ``generation * 1000 + chunk id``) in one write mode, and is
killed at a random moment. A fresh reader then finds every chunk at some
generation it was written with, no older than the last generation whose
writes had all returned — never a fill value for a written chunk, garbage or
an error — and after one more write of every chunk ``verify`` finds nothing
wrong (a torn append is repaired by the next write).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardstore import ShardingStore
from shardstore.maintenance import compact, verify

GRID, CHUNK, CPS = 4, 8, (2, 2)
TRIALS = int(os.environ.get("SHARDSTORE_CRASH_TRIALS", "5"))  # more by hand: a longer crash loop


def _ids() -> np.ndarray[Any, Any]:
    return np.arange(GRID * GRID).reshape(GRID, GRID) + 1


def _store(url: str, mode: str) -> ShardingStore:
    return ShardingStore(url, write_strategy="append" if mode in ("append", "compact") else "rewrite")


def _write_generation(store: ShardingStore, arr: zarr.Array[Any], mode: str, generation: int) -> None:
    with store.batch() if mode == "batch" else contextlib.nullcontext():
        for r in range(GRID):
            for c in range(GRID):
                value = generation * 1000 + int(_ids()[r, c])
                arr[r * CHUNK : (r + 1) * CHUNK, c * CHUNK : (c + 1) * CHUNK] = value
    if mode == "compact":
        compact(store, "a/")


def _write_forever(url: str, mode: str, first: int, started: Any, acknowledged: Any) -> None:
    store = _store(url, mode)
    arr = zarr.open_array(store, path="a")
    generation = first
    while True:
        _write_generation(store, arr, mode, generation)
        acknowledged.value = generation  # every chunk's write of it has returned
        started.set()
        generation += 1


def _check_every_chunk_is_a_written_value(url: str, acknowledged: int = 0) -> None:
    got = zarr.open_array(ShardingStore(url, read_strategy="chunk"), path="a", mode="r")[:]
    blocks = got.reshape(GRID, CHUNK, GRID, CHUNK).transpose(0, 2, 1, 3).reshape(GRID, GRID, -1)
    assert (blocks.min(axis=2) == blocks.max(axis=2)).all(), "a chunk holds mixed values"
    values = blocks[:, :, 0]
    assert (values > 0).all(), "a written chunk reads as the fill value"
    assert ((values - _ids()) % 1000 == 0).all(), "a chunk holds a value never written to it"
    assert (values // 1000 >= acknowledged).all(), "an acknowledged write was lost"


@pytest.mark.parametrize("mode", ["rewrite", "batch", "append", "compact"])
def test_kill_at_any_moment_leaves_only_written_values(tmp_path: Path, mode: str) -> None:
    url = f"file://{tmp_path}/k.zarr"
    zarr.create_array(
        ShardingStore(url, chunks_per_shard=CPS),
        name="a",
        shape=(GRID * CHUNK,) * 2,
        chunks=(CHUNK,) * 2,
        dtype="i4",
    )
    store = _store(url, mode)
    arr = zarr.open_array(store, path="a")
    _write_generation(store, arr, mode, 1)
    ctx = mp.get_context("spawn")
    rng = random.Random(mode)
    for trial in range(TRIALS):
        # no lock: a writer killed while holding a Value's lock would leave this process waiting on it forever
        started, acknowledged = ctx.Event(), ctx.Value("i", 0, lock=False)
        writer = ctx.Process(target=_write_forever, args=(url, mode, 10 * (trial + 1), started, acknowledged))
        writer.start()
        assert started.wait(120)
        time.sleep(rng.uniform(0, 0.2))  # somewhere in a later generation
        os.kill(writer.pid, signal.SIGKILL)  # type: ignore[arg-type]
        writer.join()
        _check_every_chunk_is_a_written_value(url, acknowledged.value)
    _write_generation(store, arr, mode, 99)  # the next writes repair what a kill tore
    _check_every_chunk_is_a_written_value(url)
    assert verify(ShardingStore(url), decode=True) == {}
