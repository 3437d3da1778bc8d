"""Resizes keep the data: in the neuroglancer format chunk ids are compressed Morton
codes of grid positions, which depend on the grid shape, so a resize that would
renumber chunks already stored moves them to their new ids, in a new directory
that the metadata write commits (or, with ``renumbering="refuse"``, is refused
before anything changes)."""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing as mp
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from zarr.core.buffer import default_buffer_prototype

from shardstore import ShardingConfigError, ShardingStore
from shardstore.errors import ShardConflictError, ShardStoreError, StaleArrayError
from shardstore.formats.precomputed import (
    PrecomputedSharding,
    compressed_morton_code,
    morton_positions,
    renumber,
    renumbered,
)
from shardstore.maintenance import leftovers, verify

from .helpers import logical_keys, sample
from .processes import Writers

SHARDING = PrecomputedSharding(1, "identity", 2, 2)

_grids = st.integers(1, 3).flatmap(
    lambda n: st.tuples(*[st.lists(st.integers(1, 12), min_size=n, max_size=n)] * 2)
)


@given(grids=_grids)
def test_renumbered_says_whether_a_common_position_changes_id(grids: tuple[list[int], list[int]]) -> None:
    old, new = grids
    common = [min(o, n) for o, n in zip(old, new, strict=True)]
    positions = np.array(list(itertools.product(*(range(c) for c in common))))
    moved = (compressed_morton_code(positions, old) != compressed_morton_code(positions, new)).any()
    assert renumbered(old, new) == bool(moved)


def _array(where: Path | MutableMapping[str, bytes], **options: Any) -> tuple[zarr.Array, np.ndarray]:
    """The array "a", (32, 128) int32 in 16 x 16 chunks, filled: in local files below the
    directory ``where``, or in the mapping ``where``."""
    inner = str(where / "s") if isinstance(where, Path) else where
    store = ShardingStore(inner, chunks_per_shard=SHARDING, **options)
    arr = zarr.create_array(store, name="a", shape=(32, 128), chunks=(16, 16), dtype="i4")
    data = sample((32, 128), "i4")
    arr[:] = data
    return arr, data


def test_a_growth_that_would_renumber_chunks_is_refused_before_anything_changes(tmp_path: Path) -> None:
    arr, data = _array(tmp_path, renumbering="refuse")
    before = (tmp_path / "s" / "a" / "zarr.json").read_bytes()
    shards = {p.name: p.read_bytes() for p in (tmp_path / "s" / "a" / "c").iterdir()}
    with pytest.raises(ShardingConfigError, match=r"'a'.*\[32, 128\] to \[200, 128\].*renumber"):
        arr.resize((200, 128))  # the grid grows from 2 to 13 rows of chunks
    assert (tmp_path / "s" / "a" / "zarr.json").read_bytes() == before
    assert {p.name: p.read_bytes() for p in (tmp_path / "s" / "a" / "c").iterdir()} == shards
    reopened = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
    assert reopened.shape == (32, 128)
    np.testing.assert_array_equal(reopened[:], data)


def test_resizes_that_keep_every_id_go_through(tmp_path: Path) -> None:
    arr, data = _array(tmp_path)
    arr.resize((32, 129))  # columns 8 -> 9 chunks: the new bit comes after every other
    arr.resize((32, 250))
    arr[:, 128:] = 5
    reopened = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
    assert reopened.shape == (32, 250)
    np.testing.assert_array_equal(reopened[:, :128], data)
    np.testing.assert_array_equal(reopened[:, 128:], 5)


def test_an_array_without_chunks_takes_any_shape(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path / "s"), chunks_per_shard=SHARDING)
    arr = zarr.create_array(store, name="a", shape=(0, 16), chunks=(16, 16), dtype="i4")
    arr.resize((200, 128))
    arr[:] = 3
    doc = json.loads((tmp_path / "s" / "a" / "zarr.json").read_text())
    assert doc["shape"] == [200, 128]
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:], 3)


def test_the_indexed_format_resizes_freely(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path / "s"), chunks_per_shard=(2, 2))
    arr = zarr.create_array(store, name="a", shape=(32, 128), chunks=(16, 16), dtype="i4")
    data = sample((32, 128), "i4")
    arr[:] = data
    arr.resize((200, 128))
    arr.resize((200, 300))
    np.testing.assert_array_equal(
        zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:32, :128], data
    )


@given(grids=_grids, seed=st.integers(0, 2**32 - 1))
def test_renumber_maps_each_kept_position_to_its_code_in_the_new_grid(
    grids: tuple[list[int], list[int]], seed: int
) -> None:
    old, new = grids
    positions = np.array(list(itertools.product(*(range(g) for g in old))))
    ids = compressed_morton_code(positions, old)
    np.random.default_rng(seed).shuffle(ids)
    kept, new_ids = renumber(ids, old, new)
    back = morton_positions(ids, old)
    inside = np.all(back < np.minimum(old, new), axis=1)
    np.testing.assert_array_equal(kept, inside)
    np.testing.assert_array_equal(new_ids, compressed_morton_code(back[inside], new))


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(
    "new_shape",
    [(200, 128), (16, 128), (200, 64), (64, 16), (1, 1), (0, 128), (32, 129)],
    ids=["grow", "shrink", "grow-and-shrink", "other-axis", "one-chunk", "empty", "keeps-ids"],
)
def test_a_renumbering_resize_moves_every_chunk_to_its_new_id(
    tmp_path: Path, new_shape: tuple[int, int]
) -> None:
    arr, data = _array(tmp_path)
    plain = zarr.create_array(
        zarr.storage.MemoryStore(), name="a", shape=(32, 128), chunks=(16, 16), dtype="i4"
    )
    plain[:] = data
    arr.resize(new_shape)
    plain.resize(new_shape)
    reopened = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
    assert reopened.shape == new_shape
    np.testing.assert_array_equal(reopened[:], plain[:])
    np.testing.assert_array_equal(arr[:], plain[:])  # the same store goes on with the new ids
    doc = json.loads((tmp_path / "s" / "a" / "zarr.json").read_text())
    config = doc["storage_transformers"][0]["configuration"]
    moved = renumbered((2, 8), [-(-s // 16) for s in new_shape]) and 0 not in new_shape
    assert ("directory" in config) == moved
    shard_files = [f for f in _files(tmp_path / "s") if f.endswith(".shard")]
    prefix = f"a/c/{config['directory']}/" if moved else "a/c/"
    assert all(f.startswith(prefix) and "/" not in f[len(prefix) :] for f in shard_files), shard_files
    assert leftovers(ShardingStore(str(tmp_path / "s"))) == {}
    # the array goes on: writes, another renumbering resize, listings
    arr[:] = 7 if 0 in new_shape else arr[:] + 1
    arr.resize((40, 40))
    plain[:] = 7 if 0 in new_shape else plain[:] + 1
    plain.resize((40, 40))
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:], plain[:])
    assert [k for k in logical_keys(ShardingStore(str(tmp_path / "s"))) if "/c/" in k] == sorted(
        k for k in asyncio.run(_keys(plain.store)) if "/c/" in k
    )


async def _keys(store: zarr.abc.store.Store) -> list[str]:
    return [k async for k in store.list_prefix("")]


class _Killed(Exception):
    """The writer died here: this mutation and every later one never reach storage."""


class _DiesAfter(MutableMapping[str, bytes]):
    """Storage whose writer dies after ``budget`` mutations: what it holds then is
    what a process killed at that moment leaves (its clean-up never lands)."""

    def __init__(self, data: dict[str, bytes], budget: int) -> None:
        self.data, self.budget = data, budget

    def _spend(self) -> None:
        if self.budget == 0:
            raise _Killed
        self.budget -= 1

    def __getitem__(self, key: str) -> bytes:
        return self.data[key]

    def __setitem__(self, key: str, value: bytes) -> None:
        self._spend()
        self.data[key] = value

    def __delitem__(self, key: str) -> None:
        self._spend()
        del self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.data))

    def __len__(self) -> int:
        return len(self.data)


@pytest.mark.parametrize("new_shape", [(200, 128), (200, 64)], ids=["grow", "grow-and-shrink"])
def test_a_resize_killed_at_any_step_leaves_the_old_array_or_the_new_one(new_shape: tuple[int, int]) -> None:
    base: dict[str, bytes] = {}
    arr = zarr.create_array(
        ShardingStore(base, chunks_per_shard=SHARDING), name="a", shape=(32, 128), chunks=(16, 16), dtype="i4"
    )
    data = sample((32, 128), "i4")
    arr[:] = data
    counter = _DiesAfter(dict(base), 10**9)
    zarr.open_array(ShardingStore(counter), path="a").resize(new_shape)
    steps = 10**9 - counter.budget
    assert steps > 3  # the copy, the commit, the clean-up
    outcomes = set()
    for budget in range(steps):
        held = dict(base)
        try:
            zarr.open_array(ShardingStore(_DiesAfter(held, budget)), path="a").resize(new_shape)
            returned = True  # killed while deleting the old shards: the resize is done
        except ShardStoreError:  # the inner store's failure, named
            returned = False
        store = ShardingStore(held)
        got = zarr.open_array(store, path="a")
        assert got.shape in ((32, 128), new_shape)
        assert got.shape == new_shape or not returned
        outcomes.add(got.shape)
        common = tuple(slice(0, min(a, b)) for a, b in zip((32, 128), new_shape, strict=True))
        np.testing.assert_array_equal(got[common], data[common])  # never lost, never scrambled
        if got.shape == (32, 128):  # zarr may have deleted some of the chunks it was dropping
            rest = got[:]
            assert ((rest == data) | (rest == 0)).all()
        else:
            assert not got[common[0].stop :, :].any() and not got[:, common[1].stop :].any()
        assert verify(store) == {}
        stale = leftovers(store)
        assert all(k.endswith(".shard") for k in stale)
        for key in stale:  # what leftovers reports can go, and the array stays whole
            del held[key]
        np.testing.assert_array_equal(zarr.open_array(ShardingStore(held), path="a")[:], got[:])
        # and the resize can be made again
        again = zarr.open_array(ShardingStore(held), path="a")
        again.resize(new_shape)
        np.testing.assert_array_equal(again[common], data[common])
    assert outcomes == {(32, 128), new_shape}


def _on_a_thread_of_its_own(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end on another thread and event loop: another store's."""
    worker = threading.Thread(target=asyncio.run, args=(work,))
    worker.start()
    worker.join()


class _WritesDuringCopy(dict[str, bytes]):
    """A mapping where another store (its own thread and event loop, the old metadata)
    copies chunk (0, 0) over chunk ``chunk`` while the first new shard of a
    renumbering copy is written: the copy must notice and start again."""

    def __init__(self, chunk: str) -> None:
        super().__init__()
        self.chunk = chunk
        self.fired = False

    def __setitem__(self, key: str, value: bytes) -> None:
        super().__setitem__(key, value)
        if "/ids-" in key and not self.fired:
            self.fired = True
            _on_a_thread_of_its_own(self._write())

    async def _write(self) -> None:
        other = ShardingStore(self)
        prototype = default_buffer_prototype()
        value = await other.get("a/c/0/0", prototype)
        assert value is not None
        await other.set(self.chunk, value)


def test_a_chunk_written_by_another_store_during_the_copy_is_kept() -> None:
    inner = _WritesDuringCopy("a/c/1/6")
    arr, data = _array(inner)
    arr.resize((200, 128))
    assert inner.fired
    expected = np.zeros((200, 128), dtype="i4")
    expected[:32] = data
    expected[16:32, 96:112] = data[:16, :16]
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(dict(inner)), path="a")[:], expected)
    config = json.loads(inner["a/zarr.json"])["storage_transformers"][0]["configuration"]
    assert all(k.startswith(f"a/c/{config['directory']}/") for k in inner if k.endswith(".shard"))


class _ResizedMeanwhile(dict[str, bytes]):
    """A mapping where, once armed, another store (its own thread and event loop)
    resizes the array to ``shape`` just before the next listing: the listing then
    finds the old shards gone, moved by that resize."""

    def __init__(self, shape: tuple[int, int]) -> None:
        super().__init__()
        self.shape = shape
        self.armed = False

    def __iter__(self) -> Iterator[str]:
        if self.armed:
            self.armed = False
            _on_a_thread_of_its_own(self._resize())
        return super().__iter__()

    async def _resize(self) -> None:
        other = await zarr.api.asynchronous.open_array(store=ShardingStore(self), path="a")
        await other.resize(self.shape)


def test_a_resize_that_finds_its_chunks_moved_by_another_resize_starts_again_from_there() -> None:
    """It read the array's metadata, then listed no old shards (the other resize had
    moved them): committing the old, empty place would lose every chunk."""
    inner = _ResizedMeanwhile((200, 128))
    arr, data = _array(inner)
    inner.armed = True
    arr.resize((64, 128))
    assert not inner.armed, "the other resize ran"
    got = zarr.open_array(ShardingStore(dict(inner)), path="a")
    assert got.shape == (64, 128)
    np.testing.assert_array_equal(got[:32], data)


class _NeverQuiet(dict[str, bytes]):
    """A mapping where an old shard changes again whenever a renumbering copy writes."""

    def __setitem__(self, key: str, value: bytes) -> None:
        super().__setitem__(key, value)
        if "/ids-" in key:
            old = next(k for k in sorted(self) if k.startswith("a/c/") and k.endswith(".shard"))
            chunks = SHARDING.split(self[old], old)
            ids = sorted(chunks)  # every chunk takes the next one's bytes
            rotated = dict(zip(ids, [chunks[i] for i in ids[1:] + ids[:1]], strict=True))
            super().__setitem__(old, SHARDING.build(rotated))


def test_other_writers_that_never_stop_end_in_a_conflict_and_no_change() -> None:
    inner = _NeverQuiet()
    arr, _ = _array(inner, write_attempts=3)
    before = inner["a/zarr.json"]
    with pytest.raises(ShardConflictError, match=r"'a'.*3 attempts"):
        arr.resize((200, 128))
    assert inner["a/zarr.json"] == before
    assert not [k for k in inner if "/ids-" in k]  # each abandoned copy removed


def _grow_and_check(store: ShardingStore, reopen: Callable[[], ShardingStore]) -> None:
    arr = zarr.create_array(store, name="a", shape=(32, 128), chunks=(16, 16), dtype="i4")
    data = sample((32, 128), "i4")
    arr[:] = data
    arr.resize((200, 64))
    arr[100:, :] = 9
    got = zarr.open_array(reopen(), path="a")
    np.testing.assert_array_equal(got[:32], data[:, :64])
    np.testing.assert_array_equal(got[100:], 9)
    assert not got[32:100].any()
    assert verify(reopen()) == {} and leftovers(reopen()) == {}


def test_renumbering_works_on_every_kind_of_inner_store(make_store: Callable[..., ShardingStore]) -> None:
    _grow_and_check(make_store(SHARDING), make_store)


def test_renumbering_on_s3_checks_each_old_shard_by_its_etag(s3: Any) -> None:
    def store() -> ShardingStore:
        return ShardingStore(s3.url("ids.zarr"), SHARDING, storage_options=s3.storage_options)

    _grow_and_check(store(), store)


def _resize_forever(url: str, started: Any) -> None:
    arr = zarr.open_array(ShardingStore(url), path="a")
    while True:
        for shape in ((200, 128), (32, 128), (32, 1000), (5000, 128)):
            arr.resize(shape)
            started.set()


def test_a_process_killed_while_renumbering_leaves_a_whole_array(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _, data = _array(tmp_path)
    ctx = mp.get_context("spawn")
    for trial in range(5):
        started = ctx.Event()
        writer = ctx.Process(target=_resize_forever, args=(url, started))
        writer.start()
        assert started.wait(60)
        time.sleep(random.Random(trial).uniform(0, 0.3))
        os.kill(writer.pid, signal.SIGKILL)  # type: ignore[arg-type]
        writer.join()
        store = ShardingStore(url)
        got = zarr.open_array(store, path="a")
        assert got.shape in ((200, 128), (32, 128), (32, 1000), (5000, 128))
        np.testing.assert_array_equal(got[:32, :128], data)
        assert verify(store) == {}
        found = leftovers(store)
        assert all(k.endswith((".shard", ".partial", ".lock")) for k in found), found


def _write_after_a_resize_elsewhere(url: str, opened: Any, resized: Any) -> None:
    arr = zarr.open_array(ShardingStore(url), path="a")  # the metadata as it was
    opened.set()
    assert resized.wait(60)
    arr[16:32, 0:16] = -7  # its shard, numbered for the old grid, was moved away


def test_a_process_that_opened_the_array_before_a_renumbering_resize_writes_to_the_new_ids(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "s")
    _, data = _array(tmp_path)
    ctx = mp.get_context("spawn")
    opened, resized = ctx.Event(), ctx.Event()
    writer = ctx.Process(target=_write_after_a_resize_elsewhere, args=(url, opened, resized))
    writer.start()
    assert opened.wait(60)
    zarr.open_array(ShardingStore(url), path="a").resize((200, 128))
    resized.set()
    writer.join(60)
    assert writer.exitcode == 0
    expected = np.zeros((200, 128), dtype="i4")
    expected[:32] = data
    expected[16:32, 0:16] = -7
    store = ShardingStore(url)
    np.testing.assert_array_equal(zarr.open_array(store, path="a")[:], expected)
    assert leftovers(store) == {}


def test_stale_whole_chunk_writes_re_route_and_byte_range_writes_are_refused(tmp_path: Path) -> None:
    _, data = _array(tmp_path)
    url = str(tmp_path / "s")
    stale = ShardingStore(url)
    chunk = asyncio.run(stale.get("a/c/0/0", default_buffer_prototype()))  # reads the metadata
    assert chunk is not None
    zarr.open_array(ShardingStore(url), path="a").resize((200, 128))
    asyncio.run(stale.set_many([("a/c/1/7", chunk)]))  # the pipeline's way: one commit per shard
    got = zarr.open_array(ShardingStore(url), path="a")[:]
    np.testing.assert_array_equal(got[16:32, 112:128], data[0:16, 0:16])
    splicer = ShardingStore(url)
    assert asyncio.run(splicer.get("a/c/0/0", default_buffer_prototype())) is not None
    zarr.open_array(ShardingStore(url), path="a").resize((32, 128))  # renumbers back
    with pytest.raises(StaleArrayError, match=r"'a' was resized elsewhere.*\[200, 128\] -> \[32, 128\]"):
        asyncio.run(splicer.set_partial_values([("a/c/0/0", 0, b"\0")]))
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(url), path="a")[:], got[:32])
    assert leftovers(ShardingStore(url)) == {}


def _grow_and_write(url: str, done: Any) -> None:
    array = zarr.open_array(ShardingStore(url), path="a")
    array.resize((48, 4))
    array[36:48] = 7  # chunk rows 9-11: past the edge the other process knows, in its edge shard
    done.set()


@pytest.mark.parametrize("how", ["rewrite", "append", "batch", "fill"])
def test_a_process_holding_a_smaller_shape_keeps_the_chunks_another_wrote_past_its_edge(
    tmp_path: Path, how: str
) -> None:
    """By the shape it read, its write gives every chunk of its edge shard; the shard
    is still read and merged, not made anew (that dropped the other's chunks, acknowledged)."""
    url = str(tmp_path / "s")
    create = ShardingStore(url, chunks_per_shard=(4, 1))
    zarr.create_array(create, name="a", shape=(36, 4), chunks=(4, 4), dtype="i4", fill_value=0)
    store = ShardingStore(url, write_strategy="append" if how == "append" else "rewrite")
    array = zarr.open_array(store, path="a")  # shape (36, 4): shard a/c/2/0 holds chunk row 8 only
    ctx = mp.get_context("spawn")
    done = ctx.Event()
    other = ctx.Process(target=_grow_and_write, args=(url, done))
    other.start()
    assert done.wait(120)
    other.join(60)
    value = 0 if how == "fill" else 5
    if how == "batch":
        with store.batch():
            array[32:36] = value
    else:
        array[32:36] = value
    got = zarr.open_array(ShardingStore(url), path="a")[:]
    assert got.shape == (48, 4)
    assert (got[36:48] == 7).all(), "the other process's chunks are lost"
    assert (got[32:36] == value).all()


def test_a_store_holding_old_metadata_keeps_the_data_when_it_rewrites_the_metadata(tmp_path: Path) -> None:
    """Its attribute update or resize is measured against the stored document, not its
    own copy, which still names the old shard directory."""
    _, data = _array(tmp_path)
    url = str(tmp_path / "s")
    stale = zarr.open_array(ShardingStore(url), path="a")
    zarr.open_array(ShardingStore(url), path="a").resize((200, 128))  # moves the chunks
    stale.attrs["k"] = 1  # zarr writes its whole (old-shaped) document
    got = zarr.open_array(ShardingStore(url), path="a")
    assert got.shape == (32, 128) and got.attrs["k"] == 1  # plain zarr's outcome
    np.testing.assert_array_equal(got[:], data)
    stale.resize((64, 128))
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(url), path="a")[:32], data)
    assert leftovers(ShardingStore(url)) == {}


def test_a_long_lived_reader_and_eraser_follow_a_renumbering_elsewhere(tmp_path: Path) -> None:
    _, data = _array(tmp_path)
    url = str(tmp_path / "s")
    reader = zarr.open_array(ShardingStore(url), path="a")
    np.testing.assert_array_equal(reader[:], data)  # its shards located (and cached) by the old ids
    zarr.open_array(ShardingStore(url), path="a").append(np.zeros((168, 128), "i4"))  # (200, 128)
    np.testing.assert_array_equal(reader[:], data)  # what it knows of, read at the new ids
    reader[0:16, 0:16] = 0  # the fill value: zarr deletes the chunk
    got = zarr.open_array(ShardingStore(url), path="a")[:32]
    expected = data.copy()
    expected[0:16, 0:16] = 0
    np.testing.assert_array_equal(got, expected)


def _resize_to(url: str, shape: tuple[int, int], start: Any) -> None:
    arr = zarr.open_array(ShardingStore(url), path="a")
    start.wait()  # both opened the array
    arr.resize(shape)


def test_two_processes_renumbering_at_once_keep_the_data(writers: Writers, tmp_path: Path) -> None:
    _, data = _array(tmp_path)
    url = str(tmp_path / "s")
    for _ in range(3):
        writers.together([(_resize_to, (url, shape)) for shape in ((200, 128), (64, 128))])
        got = zarr.open_array(ShardingStore(url), path="a")
        assert got.shape in ((200, 128), (64, 128))
        np.testing.assert_array_equal(got[:32], data)
        zarr.open_array(ShardingStore(url), path="a").resize((32, 128))


def test_stale_consolidated_metadata_reads_fill_past_the_grid(tmp_path: Path) -> None:
    _, data = _array(tmp_path)
    url = str(tmp_path / "s")
    zarr.consolidate_metadata(ShardingStore(url))
    zarr.open_array(ShardingStore(url), path="a").resize((16, 128))
    old = zarr.open_group(ShardingStore(url), mode="r", use_consolidated=True)["a"]
    assert old.shape == (32, 128)  # what the stale consolidated copy says
    got = old[:]
    np.testing.assert_array_equal(got[:16], data[:16])
    assert not got[16:].any()
