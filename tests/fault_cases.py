"""The small array the fault, fuzz and race tests share, and the fault tests' cases.

An 8 x 8 int32 array ``a`` of 2 x 2 chunks, 2 x 2 chunks to a shard (four shards);
its OLD and NEW states; the write operations run over it (rewrites, batches,
erasures, a resize, appends, a compaction), each with the state it starts from
and the state it must reach; the backends it is written to, restored from a
snapshot for each run; and ``check_state``, which reads back through a fresh
store what an operation (faulted or not) left: every chunk old or new, every
shard commit all-or-nothing, listing and shard objects consistent.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.core.sync import sync
from zarr.storage import LocalStore, MemoryStore

from shardstore import ShardingStore
from shardstore.formats.indexed import IndexedFormat
from shardstore.inner import adapt
from shardstore.maintenance import compact

from .helpers import logical_key_set

LAYOUT = IndexedFormat((2, 2))
SHAPE = (8, 8)
CHUNK = 2
GRID = SHAPE[0] // CHUNK  # 4 x 4 chunks, 2 x 2 shards of 2 x 2 chunks

_IDS = np.arange(64, dtype="i4").reshape(SHAPE)
OLD = np.zeros(SHAPE, "i4")
OLD[0:4, :] = 1000 + _IDS[0:4, :]  # shards a/c/0/0 and a/c/0/1 full
OLD[4:6, 0:2] = 1000 + _IDS[4:6, 0:2]  # shard a/c/1/0: one chunk; shard a/c/1/1 absent
NEW = 5000 + _IDS
MID = 3000 + _IDS


def _assign(state: np.ndarray, *regions: tuple[slice, slice], values: np.ndarray = NEW) -> np.ndarray:
    out = state.copy()
    for region in regions:
        out[region] = values[region]
    return out


def _erase(state: np.ndarray, *chunks: tuple[int, int]) -> np.ndarray:
    out = state.copy()
    for r, c in chunks:
        out[r * CHUNK : (r + 1) * CHUNK, c * CHUNK : (c + 1) * CHUNK] = 0
    return out


APPENDED = _assign(OLD, np.s_[0:2, 0:2], np.s_[2:4, 4:6], values=MID)
"""The initial state of the compaction cases: OLD, then two appends (dead bytes)."""


@dataclass
class Commit:
    key: str
    positions: frozenset[int]
    """Index positions whose chunk this commit changes."""


# -- the operations ------------------------------------------------------------------------


def _erase_values(*keys: str) -> Callable[[ShardingStore, zarr.Array], None]:
    return lambda store, arr: sync(store.erase_values(list(keys)))


def _batch(store: ShardingStore, arr: zarr.Array) -> None:
    with store.batch():
        arr[0:4, 4:8] = NEW[0:4, 4:8]  # a whole shard: committed early, unread
        arr[4:6, 0:8] = NEW[4:6, 0:8]  # part of a/c/1/0, a new a/c/1/1: at the end


def _batch_partial(store: ShardingStore, arr: zarr.Array) -> None:
    with store.batch():
        arr[1:3, 5:7] = NEW[1:3, 5:7]  # parts of four chunks: zarr reads them inside the block
        arr[6:8, 6:8] = NEW[6:8, 6:8]  # a chunk of the absent a/c/1/1


def _append_mix(store: ShardingStore, arr: zarr.Array) -> None:
    arr[0:2, 0:2] = NEW[0:2, 0:2]  # appended to a/c/0/0
    arr[4:6, 6:8] = NEW[4:6, 6:8]  # a/c/1/1 does not exist: written compact
    sync(store.delete("a/c/2/0"))  # the last chunk of a/c/1/0: the shard is deleted
    arr[0:2, 4:8] = NEW[0:2, 4:8]  # two chunks appended to a/c/0/1


def _setitem(region: tuple[slice, slice]) -> Callable[[ShardingStore, zarr.Array], None]:
    def run(store: ShardingStore, arr: zarr.Array) -> None:
        arr[region] = NEW[region]

    return run


def _compact(store: ShardingStore, arr: zarr.Array) -> None:
    compact(store, "a/")


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[ShardingStore, zarr.Array], None]
    old: np.ndarray
    new: np.ndarray
    backends: tuple[str, ...] = ("dict", "memory", "local")
    strategy: str = "rewrite"
    new_shape: tuple[int, int] = SHAPE


CASES = [
    Case("rewrite-chunk", _setitem(np.s_[0:2, 0:2]), OLD, _assign(OLD, np.s_[0:2, 0:2])),
    Case("rewrite-shard", _setitem(np.s_[0:4, 0:4]), OLD, _assign(OLD, np.s_[0:4, 0:4])),
    Case("rewrite-span", _setitem(np.s_[2:6, 2:8]), OLD, _assign(OLD, np.s_[2:6, 2:8])),
    Case("rewrite-part-chunks", _setitem(np.s_[1:3, 5:7]), OLD, _assign(OLD, np.s_[1:3, 5:7])),
    Case("batch", _batch, OLD, _assign(OLD, np.s_[0:4, 4:8], np.s_[4:6, 0:8])),
    Case("batch-partial", _batch_partial, OLD, _assign(OLD, np.s_[1:3, 5:7], np.s_[6:8, 6:8])),
    Case(
        "erase-values",
        _erase_values("a/c/0/0", "a/c/1/3", "a/c/2/0"),
        OLD,
        _erase(OLD, (0, 0), (1, 3), (2, 0)),
    ),
    Case(
        "erase-prefix",
        lambda store, arr: sync(store.delete_dir("a/c/1")),
        OLD,
        _erase(OLD, (1, 0), (1, 1), (1, 2), (1, 3)),
    ),
    Case(
        "erase-all",
        lambda store, arr: sync(store.delete_dir("a/c")),
        OLD,
        np.zeros(SHAPE, "i4"),
    ),
    Case(
        "resize-shrink",
        lambda store, arr: arr.resize((4, 8)),
        OLD,
        _erase(OLD, (2, 0)),
        new_shape=(4, 8),
    ),
    Case(
        "append-mix",
        _append_mix,
        OLD,
        _erase(_assign(OLD, np.s_[0:2, 0:2], np.s_[4:6, 6:8], np.s_[0:2, 4:8]), (2, 0)),
        backends=("local",),
        strategy="append",
    ),
    Case(
        "append-span",
        _setitem(np.s_[2:6, 2:8]),
        OLD,
        _assign(OLD, np.s_[2:6, 2:8]),
        backends=("local",),
        strategy="append",
    ),
    Case("compact", _compact, APPENDED, APPENDED, backends=("local",)),
]


# -- building, copying and checking states --------------------------------------------------


def _write_initial(raw: Any, initial: np.ndarray) -> None:
    store = ShardingStore(raw, (2, 2))
    arr = zarr.create_array(store, name="a", shape=SHAPE, chunks=(CHUNK, CHUNK), dtype="i4", compressors=None)
    # zarr skips chunks equal to the fill value 0: only the chunks OLD holds are written
    arr[:] = OLD if initial is APPENDED else initial
    if initial is APPENDED:
        appender = zarr.open_array(ShardingStore(raw, write_strategy="append"), path="a")
        appender[0:2, 0:2] = MID[0:2, 0:2]
        appender[2:4, 4:6] = MID[2:4, 4:6]


class Backend:
    """Snapshots of a backend's storage, restored into a fresh copy for each run."""

    def __init__(self, name: str, tmp: Path) -> None:
        self.name = name
        self.tmp = tmp
        self.runs = 0
        self._snapshots: dict[int, Any] = {}

    def _fresh(self) -> Any:
        self.runs += 1
        if self.name == "dict":
            return {}
        if self.name == "memory":
            return MemoryStore()
        return LocalStore(self.tmp / f"run{self.runs}")

    def restore(self, initial: np.ndarray) -> Any:
        snap = self._snapshots.get(id(initial))
        if snap is None:
            made = self._fresh()
            _write_initial(made, initial)
            if self.name == "dict":
                snap = dict(made)
            elif self.name == "memory":
                snap = dict(made._store_dict)
            else:
                snap = Path(made.root)
            self._snapshots[id(initial)] = snap
        if self.name == "dict":
            return dict(snap)
        if self.name == "memory":
            return MemoryStore(store_dict=dict(snap))
        made = self._fresh()
        shutil.copytree(snap, made.root)
        return made


def chunk_at(state: np.ndarray, r: int, c: int) -> np.ndarray:
    return state[r * CHUNK : (r + 1) * CHUNK, c * CHUNK : (c + 1) * CHUNK]


def _shard_chunks(key: str, positions: frozenset[int]) -> list[tuple[int, int]]:
    sr, sc = (int(v) for v in key.split("/")[-2:])
    return [(2 * sr + p // 2, 2 * sc + p % 2) for p in sorted(positions)]


def _raw_keys(raw: Any) -> set[str]:
    async def collect() -> set[str]:
        return {k async for k in adapt(raw).list_prefix("")}

    return sync(collect())


def check_state(raw: Any, case: Case, commits: list[Commit]) -> str:
    """Read everything back through a fresh store over the un-faulted storage: every
    chunk old or new, every commit all-or-nothing, listing and objects consistent.
    Returns "old", "new" or "mixed"."""
    store = ShardingStore(raw, read_strategy="chunk", index_cache="off")
    arr = zarr.open_array(store, path="a", mode="r")
    assert arr.shape in {SHAPE, case.new_shape}, arr.shape
    got = np.zeros(SHAPE, "i4")
    got[: arr.shape[0], : arr.shape[1]] = arr[:]
    whole = zarr.open_array(ShardingStore(raw, read_strategy="shard", index_cache="off"), path="a", mode="r")
    np.testing.assert_array_equal(whole[:], got[: arr.shape[0], : arr.shape[1]])  # whole-shard reads agree
    if arr.shape != SHAPE:  # zarr deletes the chunks outside first, then writes metadata
        assert not {"a/c/1/0", "a/c/1/1"} & _raw_keys(raw)
    states: dict[tuple[int, int], str] = {}
    for r in range(GRID):
        for c in range(GRID):
            block, old, new = chunk_at(got, r, c), chunk_at(case.old, r, c), chunk_at(case.new, r, c)
            if np.array_equal(old, new):
                assert np.array_equal(block, old), (r, c, block, old)
                continue
            if np.array_equal(block, old):
                states[(r, c)] = "old"
            elif np.array_equal(block, new):
                states[(r, c)] = "new"
            else:
                raise AssertionError(f"chunk {(r, c)} is neither old {old} nor new {new}: {block}")
    for commit in commits:
        seen = {states[rc] for rc in _shard_chunks(commit.key, commit.positions) if rc in states}
        assert len(seen) <= 1, f"commit to {commit.key} half applied: {commit.positions}, {states}"
    # listing: exactly the chunks holding data (no value written is the fill value 0)
    present = {
        f"a/c/{r}/{c}" for r in range(arr.shape[0] // CHUNK) for c in range(GRID) if chunk_at(got, r, c).any()
    }
    assert logical_key_set(store, "a/") - {"a/zarr.json", "zarr.json"} == present
    # shard objects: only non-empty ones, each a valid shard
    shards = {k for k in _raw_keys(raw) if k.startswith("a/c/")}
    assert shards == {
        f"a/c/{r // 2}/{c // 2}" for r in range(GRID) for c in range(GRID) if chunk_at(got, r, c).any()
    }, shards
    kinds = set(states.values())
    return "mixed" if len(kinds) > 1 else (kinds.pop() if kinds else "new")
