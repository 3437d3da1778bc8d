"""A reader process racing a rewriting/appending writer in this process.

The reader reads the whole array over and over in every read configuration; the
writer rewrites, appends, batches and compacts. Every chunk the reader sees is
whole and in place, and never older than one it saw before.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from shardstore import ShardingStore
from shardstore.errors import ShardConflictError
from shardstore.maintenance import compact

from .fault_cases import CHUNK, GRID, SHAPE

RACE_SECONDS = 3.0
RACE_CONFIGS: list[dict[str, str]] = [
    {},  # the defaults: on local files indices cached by version, shards fetched whole on repeat
    {"read_strategy": "chunk"},
    {"index_cache": "off"},
    {"read_strategy": "chunk", "index_cache": "off"},
    {"read_strategy": "shard", "index_cache": "off"},
]


def _race_value(generation: int, chunk_id: int) -> int:
    return (generation + 1) * 1000 + chunk_id  # never the fill value 0


def _race_reader(url: str, seconds: float, ready: Any, results: Any) -> None:
    """Reads the whole array in a loop, in every configuration in turn: every chunk must be
    a constant (g + 1) * 1000 + chunk id, and g must never go back for a configuration."""
    arrays = [zarr.open_array(ShardingStore(url, **cfg), path="a", mode="r") for cfg in RACE_CONFIGS]
    last = np.full((len(arrays), GRID, GRID), -1)
    ids = np.arange(GRID * GRID).reshape(GRID, GRID)
    stats: dict[str, Any] = {"reads": 0, "conflicts": 0, "regressions": 0, "bad": []}
    ready.set()
    deadline = time.monotonic() + seconds
    turn = 0
    while time.monotonic() < deadline:
        which = turn % len(arrays)
        turn += 1
        try:
            data = arrays[which][:]
        except ShardConflictError:
            stats["conflicts"] += 1
            continue
        except Exception as exc:  # reported to the test
            stats["bad"].append(f"{RACE_CONFIGS[which]}: {exc!r}")
            continue
        stats["reads"] += 1
        blocks = data.reshape(GRID, CHUNK, GRID, CHUNK).transpose(0, 2, 1, 3).reshape(GRID, GRID, -1)
        first = blocks[:, :, 0]
        generations = first // 1000 - 1
        sound = (blocks == first[:, :, None]).all(axis=2) & (first % 1000 == ids) & (generations >= 0)
        if not sound.all():
            stats["bad"].append(f"{RACE_CONFIGS[which]}: torn, fill or misplaced chunks: {data.tolist()}")
            continue
        stats["regressions"] += int((generations < last[which]).sum())
        last[which] = generations
    results.put(stats)


def _race_write(arr: zarr.Array, generation: int, rows: slice, cols: slice, model: np.ndarray) -> None:
    ids = np.arange(GRID * GRID).reshape(GRID, GRID)
    value = np.kron(_race_value(generation, ids), np.ones((CHUNK, CHUNK), dtype="i4")).astype("i4")
    region = np.s_[rows.start * CHUNK : rows.stop * CHUNK, cols.start * CHUNK : cols.stop * CHUNK]
    arr[region] = value[region]
    model[rows, cols] = generation


def test_reader_process_racing_rewrites_and_appends(tmp_path: Path, record_property: Any) -> None:
    url = str(tmp_path / "race.zarr")
    rewrite = ShardingStore(url, (2, 2))
    arr = zarr.create_array(rewrite, name="a", shape=SHAPE, chunks=(CHUNK, CHUNK), dtype="i4")
    model = np.zeros((GRID, GRID), dtype=int)
    _race_write(arr, 0, slice(0, GRID), slice(0, GRID), model)
    appender = ShardingStore(url, write_strategy="append")
    arrays = {"rewrite": arr, "append": zarr.open_array(appender, path="a")}
    ctx = mp.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_race_reader, args=(url, RACE_SECONDS, ready, results))
    reader.start()
    rng = random.Random(7)
    writes = Counter[str]()
    try:
        assert ready.wait(60), "the reader process did not start"
        generation = 0
        while reader.is_alive() and results.empty():
            generation += 1
            how = rng.choice(["rewrite", "append", "append", "batch", "compact"])
            if how == "compact":
                compact(appender, "a/")
                writes[how] += 1
                continue
            r0, c0 = rng.randrange(GRID), rng.randrange(GRID)
            rows, cols = slice(r0, rng.randint(r0 + 1, GRID)), slice(c0, rng.randint(c0 + 1, GRID))
            if how == "batch":
                with rewrite.batch():
                    _race_write(arr, generation, rows, cols, model)
            else:
                _race_write(arrays[how], generation, rows, cols, model)
            writes[how] += 1
        stats = results.get(timeout=60)
    finally:
        reader.join(60)
        if reader.is_alive():
            reader.kill()
    assert reader.exitcode == 0
    assert stats["bad"] == [], stats["bad"][:3]
    assert stats["reads"] >= 20, stats
    assert stats["conflicts"] <= max(3, stats["reads"] // 20), stats  # rare
    assert stats["regressions"] == 0, stats
    got = zarr.open_array(ShardingStore(url, index_cache="off"), path="a", mode="r")[:]
    ids = np.arange(GRID * GRID).reshape(GRID, GRID)
    expected = np.kron(_race_value(model, ids), np.ones((CHUNK, CHUNK), dtype=int))
    np.testing.assert_array_equal(got, expected)
    record_property("reader", {k: v for k, v in stats.items() if k != "bad"})
    record_property("writes", dict(writes))
    record_property("generations", generation)
