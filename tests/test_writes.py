"""Writes: shard-at-once commits, batches, append-only shards, and failures mid-commit."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.core.buffer import cpu, default_buffer_prototype

from shardstore import PIPELINE_PATH, BatchCommitError, InnerStoreError, InvalidOffsetError, ShardingStore
from shardstore.inner import LocalInner, MappingInner
from shardstore.inner.base import Capabilities
from shardstore.instrument import CountingInner
from shardstore.maintenance import compact, shard_reports

from .helpers import inner_keys, logical_keys, sample, turns_until

SHAPE, CHUNKS, CPS = (256, 256), (16, 16), (4, 4)  # 16 x 16 chunks in 4 x 4 shards


def _array(store: ShardingStore, name: str = "a", **kwargs: Any) -> zarr.Array:
    return zarr.create_array(store, name=name, shape=SHAPE, chunks=CHUNKS, dtype="f4", **kwargs)


def _counted_array_of_ones(root: Path) -> tuple[ShardingStore, CountingInner, zarr.Array]:
    """A store over a counted local directory holding an array of ones (ranges read
    there, where they are checked against their index's version); counts start afterwards."""
    counted = CountingInner(LocalInner(str(root)))
    store = ShardingStore(counted, chunks_per_shard=CPS, read_strategy="chunk")
    arr = _array(store)
    arr[:] = 1
    counted.counts.reset()
    return store, counted, arr


def _stored_bytes(counted: CountingInner, store: ShardingStore, prefix: str = "a/c/") -> int:
    async def total() -> int:
        keys = [k async for k in counted.inner.list_prefix(prefix)]
        return sum([await counted.inner.getsize(k) or 0 for k in keys])

    return asyncio.run(total())


# -- batches ----------------------------------------------------------------------


@pytest.mark.parametrize("inner_kind", ["dict", "local"])
def test_batch_whole_array_write_amplification_and_no_reads(tmp_path: Path, inner_kind: str) -> None:
    counted = CountingInner({} if inner_kind == "dict" else LocalInner(tmp_path))
    store = ShardingStore(counted, chunks_per_shard=CPS)
    arr = _array(store)
    data = sample(SHAPE, "f4")
    counted.counts.reset()
    with store.batch():
        arr[:] = data
    assert counted.counts.reads == 0  # every shard fully overwritten: nothing read
    assert counted.counts.writes == 16  # one write per shard
    assert counted.counts.bytes_written <= 1.01 * _stored_bytes(counted, store)
    np.testing.assert_array_equal(arr[:], data)


async def test_async_batch_and_reads_inside_see_the_batch() -> None:
    counted = CountingInner({})
    store = ShardingStore(counted, chunks_per_shard=CPS)
    arr = await zarr.api.asynchronous.create_array(store, name="a", shape=SHAPE, chunks=CHUNKS, dtype="f4")
    counted.counts.reset()
    async with store.batch():
        await arr.setitem((slice(0, 10), slice(0, 10)), np.ones((10, 10), "f4"))
        # a partial chunk write reads the chunk first: it must see the buffered one
        await arr.setitem((slice(5, 12), slice(5, 12)), np.full((7, 7), 2, "f4"))
        inside = await arr.getitem((slice(0, 12), slice(0, 12)))
        assert counted.counts.writes == 0  # nothing committed yet: the shard is not complete
        assert sorted([k async for k in store.list_prefix("a/c/")]) == ["a/c/0/0"]  # listing commits
    expected = np.zeros((12, 12), "f4")
    expected[:10, :10] = 1
    expected[5:12, 5:12] = 2
    np.testing.assert_array_equal(inside, expected)
    np.testing.assert_array_equal(await arr.getitem((slice(0, 12), slice(0, 12))), expected)


def test_batch_commits_partial_shards_once_at_the_end(tmp_path: Path) -> None:
    store, counted, arr = _counted_array_of_ones(tmp_path)
    with store.batch():
        for i in range(0, 256, 32):
            arr[i, :] = 5  # every other chunk row: each shard half rewritten
    assert counted.counts.writes == 16  # one read-modify-write per shard
    assert max(counted.counts.unranged_reads.values()) == 1  # each shard read whole once, to merge
    got = arr[:]
    assert (got[::32, :] == 5).all() and (got[16::32, :] == 1).all() and (got[1::16, :] == 1).all()


def test_batch_memory_bound_commits_fullest_shards_early() -> None:
    counted = CountingInner({})
    store = ShardingStore(counted, chunks_per_shard=CPS)
    arr = _array(store, compressors=None)
    data = sample(SHAPE, "f4")
    with store.batch(max_bytes=16 * 1024 * 4):  # room for about four chunks
        with zarr.config.set({"async.concurrency": 1}):
            for i in range(0, 256, 16):
                arr[i : i + 16, :] = data[i : i + 16, :]  # chunk rows: no shard completes early
        assert counted.counts.writes > 0  # committed before the block ended
    np.testing.assert_array_equal(arr[:], data)


def test_exception_inside_batch_commits_nothing_partial() -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=CPS)
    arr = _array(store)
    arr[:] = 1
    before = {k: v for k, v in backing.items() if "/c/" in k}
    with pytest.raises(RuntimeError, match="boom") as info, store.batch():
        arr[0:16, 0:16] = 7  # one chunk of shard (0, 0): buffered, not a whole shard
        raise RuntimeError("boom")
    assert {k: v for k, v in backing.items() if "/c/" in k} == before
    assert any("a/c/0/0" in note and "not written" in note for note in info.value.__notes__)
    assert (arr[:] == 1).all()


class _FullAtShard11(dict[str, Any]):
    """A mapping whose disk is full for shard a/c/1/1."""

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "a/c/1/1":
            raise OSError("no space left")
        super().__setitem__(key, value)


def test_an_error_in_a_batch_says_which_shards_were_committed_early_and_goes_on_itself() -> None:
    """A shard committed early in the block (all its chunks buffered) holds what that
    commit wrote: the note says so, not "intact"; a commit that failed meanwhile is
    said in a note on the block's own error, which is the one raised."""

    backing = _FullAtShard11()
    store = ShardingStore(backing, chunks_per_shard=CPS)
    arr = _array(store)
    arr[:128, :64] = 1  # shards a/c/0/0 and a/c/1/0
    with pytest.raises(RuntimeError, match="boom") as info, store.batch():
        arr[:64, :64] = 2  # shard a/c/0/0 whole: committed at once
        arr[64:128, 64:128] = 2  # shard a/c/1/1 whole: its commit fails
        arr[0:16, 0:16] = 5  # a/c/0/0 again, one chunk: still buffered
        arr[64:80, 0:16] = 5  # a/c/1/0, one chunk: buffered, never committed before
        raise RuntimeError("boom")
    notes = "\n".join(info.value.__notes__)
    assert "were committed earlier in the block" in notes and "'a/c/0/0'" in notes
    assert "previous contents are intact: 'a/c/1/0'" in notes
    assert "could not be committed" in notes and "'a/c/1/1'" in notes
    got = arr[:]
    assert (got[:64, :64] == 2).all() and (got[64:80, 0:16] == 1).all() and (got[64:128, 64:128] == 0).all()


def test_failed_commit_in_batch_names_the_shard_and_writes_the_rest() -> None:
    backing = _FullAtShard11()
    store = ShardingStore(backing, chunks_per_shard=CPS)
    arr = _array(store)
    with pytest.raises(BatchCommitError, match="a/c/1/1") as info, store.batch():
        arr[:] = 3
    assert set(info.value.failed) == {"a/c/1/1"}
    assert len([k for k in backing if "/c/" in k]) == 15
    got = arr[:]
    assert (got[64:128, 64:128] == 0).all() and got.sum() == 3 * (256 * 256 - 64 * 64)


def test_nested_batches_commit_at_the_outermost_exit() -> None:
    counted = CountingInner({})
    store = ShardingStore(counted, chunks_per_shard=CPS)
    arr = _array(store)
    counted.counts.reset()
    with store.batch():
        with store.batch():
            arr[0, 0] = 1
        assert counted.counts.writes == 0
    assert counted.counts.writes == 1 and arr[0, 0] == 1


# -- the default: shard-at-once commits -------------------------------------------------------


def test_default_single_chunk_update_is_one_read_and_one_write(tmp_path: Path) -> None:
    _, counted, arr = _counted_array_of_ones(tmp_path)
    arr[16:32, 32:48] = 2  # exactly chunk (1, 2), in shard (0, 0): zarr reads nothing
    assert counted.counts.writes == 1
    assert counted.counts.read_keys["a/c/0/0"] == 1  # the read-modify-write of that shard


class _CommitCalls(LocalInner):
    """A local directory that records its commits: one ``update_many`` call's keys, or
    one ``update``'s; ``refused`` keys fail as a disk would."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: list[list[str]] = []
        self.refused: set[str] = set()

    async def update(self, key: str, change: Any, **kwargs: Any) -> None:
        self.calls.append([key])
        await super().update(key, change, **kwargs)

    async def update_many(self, changes: Any, **kwargs: Any) -> list[Exception | None]:
        self.calls.append([key for key, _ in changes])
        return await super().update_many(changes, **kwargs)

    def _update(self, path: Path, change: Any, read_old: bool) -> None:
        if path.relative_to(self.root).as_posix() in self.refused:
            raise OSError(28, "No space left on device")
        super()._update(path, change, read_old)


def test_shards_a_write_replaces_whole_are_committed_together_without_reads(tmp_path: Path) -> None:
    """Shards whose every chunk a write decides (fill-value chunks included: zarr erases
    them) need no read and no turn in the commit queue: one ``update_many`` call for
    them; a shard cut in part is a read-modify-write of its own."""
    inner = _CommitCalls(tmp_path)
    counted = CountingInner(inner)
    store = ShardingStore(counted, chunks_per_shard=CPS)
    arr = _array(store, fill_value=0)
    data = sample(SHAPE, "f4")
    data[:16, :16] = 0  # one chunk of shard (0, 0) is the fill value: erased, not stored
    counted.counts.reset()
    arr[:] = data
    assert inner.calls == [sorted(f"a/c/{i}/{j}" for i in range(4) for j in range(4))]
    assert counted.counts.reads == 0 and counted.counts.writes == 16
    inner.calls.clear()
    arr[:72, :8] = 7  # all of shard (0, 0)'s first column and part of shard (1, 0)'s
    assert sorted(map(tuple, inner.calls)) == [("a/c/0/0",), ("a/c/1/0",)]
    data[:72, :8] = 7
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(LocalInner(tmp_path)), path="a")[:], data)


def test_a_failed_commit_among_shards_replaced_together_names_its_shard_and_the_rest_land(
    tmp_path: Path,
) -> None:
    inner = _CommitCalls(tmp_path)
    arr = _array(ShardingStore(inner, chunks_per_shard=CPS))
    arr[:] = 1
    inner.refused = {"a/c/2/1", "a/c/3/3"}
    with pytest.raises(InnerStoreError, match=r"'a/c/2/1'.*No space left") as caught:
        arr[:] = 2
    assert any("'a/c/3/3'" in note for note in caught.value.__notes__)  # the other failure, as a note
    got = zarr.open_array(ShardingStore(LocalInner(tmp_path)), path="a")[:]
    shards = got.reshape(4, 64, 4, 64).transpose(0, 2, 1, 3)
    assert (shards[2, 1] == 1).all() and (shards[3, 3] == 1).all()  # the previous shards, intact
    assert (shards == 2).all(axis=(2, 3)).sum() == 14  # every other shard written


# -- append ------------------------------------------------------------------------------------


def _append_store(tmp_path: Path, **kwargs: Any) -> tuple[ShardingStore, CountingInner]:
    counted = CountingInner(LocalInner(tmp_path))
    return ShardingStore(counted, chunks_per_shard=CPS, write_strategy="append", **kwargs), counted


def test_append_single_chunk_update_writes_little(tmp_path: Path) -> None:
    store, counted = _append_store(tmp_path)
    arr = _array(store, compressors=None)
    arr[:] = 1

    def dead() -> int:
        (report,) = [r for r in shard_reports(store, "a/") if r.key == "a/c/0/0"]
        return report.dead_bytes

    before = dead()
    counted.counts.reset()
    arr[16:32, 16:32] = 2  # one whole chunk
    chunk_bytes, index_bytes = 16 * 16 * 4, 16 * 16
    assert counted.counts.writes == 1
    assert counted.counts.bytes_written <= chunk_bytes + index_bytes + 1024
    assert (arr[16:32, 16:32] == 2).all() and arr[:].sum() == 256 * 256 + 16 * 16
    assert dead() - before == chunk_bytes + index_bytes  # the old chunk and the old index


def test_append_then_compact_round_trip(tmp_path: Path) -> None:
    store, _ = _append_store(tmp_path)
    arr = _array(store)
    data = sample(SHAPE, "f4")
    arr[:] = data
    for i in range(10):
        arr[i * 16 : i * 16 + 3, 5] = -i
        data[i * 16 : i * 16 + 3, 5] = -i
    arr[200:210, 200:210] = 0  # zarr writes or deletes chunks as it sees fit
    data[200:210, 200:210] = 0
    dead_before = sum(r.dead_bytes for r in shard_reports(store))
    assert dead_before > 0
    compacted = compact(store)
    assert compacted and all(r.dead_bytes > 0 for r in compacted)
    assert sum(r.dead_bytes for r in shard_reports(store)) == 0
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path)), path="a")[:], data)


@pytest.mark.parametrize("concurrency", [10, 128])
def test_append_under_concurrency_loses_nothing(tmp_path: Path, concurrency: int) -> None:
    store, _ = _append_store(tmp_path)
    arr = _array(store)
    data = sample(SHAPE, "f4")
    with zarr.config.set({"async.concurrency": concurrency}):
        arr[:] = 0
        arr[:] = data
        arr[::3, ::5] = -1
    data[::3, ::5] = -1
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path)), path="a")[:], data)


def test_append_with_checksummed_index_and_index_at_start(tmp_path: Path) -> None:
    for location in ("end", "start"):
        store, _ = _append_store(tmp_path / location, index_checksum=True, index_location=location)  # type: ignore[arg-type]
        arr = _array(store)
        arr[:] = 1
        arr[0, 0] = 9
        assert arr[0, 0] == 9 and arr[:].sum() == 256 * 256 + 8
        dead = sum(r.dead_bytes for r in shard_reports(store))
        assert (dead > 0) == (location == "end")  # an index at the start cannot be appended: rewritten


def test_crash_between_data_and_index_is_recovered(tmp_path: Path) -> None:
    """A crash mid-append leaves a journal; the next append restores the old shard first."""
    store, _ = _append_store(tmp_path)
    arr = _array(store, compressors=None)
    arr[:] = 1
    shard = tmp_path / "a" / "c" / "0" / "0"
    good_size = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"\x00" * 1000)  # half an append: no valid index at the end
    (shard.parent / ".0.appending").write_text(f"{shard.stat().st_ino} {good_size}")
    # readers see the shard as committed, whatever the strategy
    for strategy in ("chunk", "shard"):
        reader = zarr.open_array(ShardingStore(str(tmp_path), read_strategy=strategy), path="a")
        assert reader[:].sum() == 256 * 256
    arr[0:16, 0:16] = 5  # the next append truncates back to good_size first
    assert not (shard.parent / ".0.appending").exists()
    got = zarr.open_array(ShardingStore(str(tmp_path)), path="a")[:]
    assert (got[:16, :16] == 5).all() and got.sum() == 256 * 256 + 4 * 256
    assert "a/c/0/.0.appending" not in inner_keys(store)


# -- failures mid-commit ---------------------------------------------------------------------


class FailOnNthWrite(zarr.storage.MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.countdown: int | None = None

    async def set(self, key: str, value: Any, byte_range: Any = None) -> None:
        if self.countdown is not None and "/c/" in key:
            self.countdown -= 1
            if self.countdown < 0:
                raise OSError(f"injected failure writing {key}")
        await super().set(key, value)


@pytest.mark.parametrize("mode", ["default", "batch"])
@pytest.mark.parametrize("nth", [0, 3, 7])
def test_failure_on_nth_write_keeps_acknowledged_chunks(mode: str, nth: int) -> None:
    inner = FailOnNthWrite()
    store = ShardingStore(inner, chunks_per_shard=CPS)
    arr = _array(store)
    arr[:] = 1  # acknowledged
    inner.countdown = nth
    with pytest.raises(Exception, match="injected failure"):
        if mode == "batch":
            with store.batch():
                arr[:] = 2
        else:
            arr[:] = 2
    inner.countdown = None
    got = zarr.open_array(ShardingStore(inner), path="a")[:]
    assert set(np.unique(got)) <= {1.0, 2.0}  # never garbage, never fill value: nothing lost
    # zarr writes chunk by chunk, so by default a shard may hold some new chunks; in a
    # batch a shard is committed whole. Either way nothing is torn below that unit.
    unit = 64 if mode == "batch" else 16
    for i in range(0, 256, unit):
        for j in range(0, 256, unit):
            assert len(np.unique(got[i : i + unit, j : j + unit])) == 1


def test_set_partial_values_splices_into_chunks_and_merges_per_shard() -> None:
    counted = CountingInner({})
    store = ShardingStore(counted, chunks_per_shard=(4,))
    zarr.create_array(store, name="p", shape=(8,), chunks=(1,), dtype="u1", compressors=None)
    proto = default_buffer_prototype()

    async def go() -> list[bytes | None]:
        await asyncio.gather(*(store.set(f"p/c/{i}", cpu.Buffer.from_bytes(b"abcd")) for i in range(8)))
        counted.counts.reset()
        await store.set_partial_values([("p/c/0", 1, b"XY"), ("p/c/1", 3, b"Z!"), ("p/c/0", 2, b"Q")])
        got = await store.get_partial_values(proto, [("p/c/0", None), ("p/c/1", None), ("p/c/2", None)])
        return [None if g is None else g.to_bytes() for g in got]

    assert asyncio.run(go()) == [b"aXQd", b"abcZ!", b"abcd"]
    assert counted.counts.writes == 1  # both chunks are in shard 0: one commit


@pytest.mark.parametrize("start", [-1, -5, 1.5, "1", None])
def test_a_partial_write_at_an_offset_no_value_has_is_refused_and_writes_nothing(start: Any) -> None:
    """A negative offset would splice the bytes in before the end (the chunk grew by
    them, undecodable); nothing of the call is written, the chunk nor anything else."""
    backing: dict[str, bytes] = {}
    store = ShardingStore(backing, chunks_per_shard=(4,))
    zarr.create_array(store, name="p", shape=(8,), chunks=(1,), dtype="u1", compressors=None)

    async def go() -> None:
        await store.set("p/c/0", cpu.Buffer.from_bytes(b"abcd"))
        await store.set("note", cpu.Buffer.from_bytes(b"hello"))
        before = dict(backing)
        for key in ("p/c/0", "note"):
            with pytest.raises(InvalidOffsetError, match=rf"'{key}'.*offset"):
                await store.set_partial_values([("p/c/1", 0, b"Z"), (key, start, b"XY")])
        assert backing == before

    asyncio.run(go())


def test_keys_named_like_temporary_files_are_still_listed(tmp_path: Path) -> None:
    """Only our exact temporary names (``.<name>.<uuid>.partial``, ``.<name>.appending``)
    are hidden from listings; zarr nodes may well be called ``.partial``."""
    import asyncio

    store = ShardingStore(str(tmp_path), (2,))
    root = zarr.open_group(store, mode="w")
    root.create_group(".partial")
    root.create_array("x.partial", shape=(4,), chunks=(1,), dtype="u1")[:] = 1

    async def listing(prefix: str) -> list[str]:
        return sorted([k async for k in store.list_dir(prefix)])

    assert asyncio.run(listing("")) == [".partial", "x.partial", "zarr.json"]
    assert sorted(root.group_keys()) == [".partial"] and sorted(root.array_keys()) == ["x.partial"]


class _UncheckedDeletes(MappingInner):
    """Conditional writes but deletes that cannot check a version (as obstore's)."""

    capabilities = Capabilities(conditional_writes=True)


@pytest.mark.parametrize("deletes", ["ordered", "unchecked"])
def test_an_emptied_shard_is_kept_empty_where_a_delete_cannot_be_checked(deletes: str) -> None:
    backing: dict[str, Any] = {}
    inner = MappingInner(backing) if deletes == "ordered" else _UncheckedDeletes(backing)
    store = ShardingStore(inner, (2, 2))
    arr = zarr.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="i4", fill_value=0)
    arr[:4, :4] = 1
    arr[:4, :4] = 0  # every chunk of shard (0, 0) leaves it
    kept = "a/c/0/0" in backing
    assert kept == (deletes == "unchecked")
    if kept:  # an index of empty entries: no chunk, nothing damaged, nothing listed
        assert len(backing["a/c/0/0"]) == 2 * 2 * 16
        assert [k for k in logical_keys(store, "a/c/")] == []
    arr[0, 0] = 3
    assert arr[0, 0] == 3 and arr[1:4, 1:4].sum() == 0


def test_a_write_acknowledged_after_a_failed_one_is_not_undone_by_its_commits(tmp_path: Path) -> None:
    """A write that fails (a shard it cuts in part is refused) raises while its other
    commits still run, as a queued commit does. A later write of the same shard waits
    for them: the value it was acknowledged for stands."""

    class Disk(LocalInner):
        refused: frozenset[str] = frozenset()
        held, gate, landed = threading.Event(), threading.Event(), threading.Event()

        def _update(self, path: Path, change: Any, read_old: bool) -> None:
            key = path.relative_to(self.root).as_posix()
            if key in self.refused:
                raise OSError(28, "No space left on device")
            first = self.refused and key == "a/c/0/1" and not self.held.is_set()
            if first:  # the failing write's commit of this shard: held until the gate opens
                self.held.set()
                assert self.gate.wait(timeout=60)
            super()._update(path, change, read_old)
            if first:
                self.landed.set()

    async def main() -> np.ndarray:
        disk = Disk(tmp_path)
        store = ShardingStore(disk, (2, 2))
        with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
            arr = await zarr.api.asynchronous.create_array(
                store, name="a", shape=(16, 8), chunks=(2, 2), dtype="i4", fill_value=0
            )
            await arr.setitem(slice(None), np.full((16, 8), 5, "i4"))
            disk.refused = frozenset({"a/c/3/0", "a/c/3/1"})
            with pytest.raises(InnerStoreError, match="No space left"):
                await arr.setitem((slice(0, 13), slice(None)), np.ones((13, 8), "i4"))
            disk.refused = frozenset()
            assert await asyncio.to_thread(disk.held.wait, 60)
            retry = asyncio.ensure_future(arr.setitem((slice(0, 4), slice(4, 8)), np.full((4, 4), 2, "i4")))
            queue = store._writer._queue  # (waiting there, behind the failed write's commit)
            await turns_until(lambda: retry.done() or "a/c/0/1" in queue._pending, limit=100_000)
            disk.gate.set()
            await retry
            assert await asyncio.to_thread(disk.landed.wait, 60)
        fresh = await zarr.api.asynchronous.open_array(store=ShardingStore(LocalInner(tmp_path)), path="a")
        return np.asarray(await fresh.getitem((slice(0, 4), slice(4, 8))))

    got = asyncio.run(main())
    assert (got == 2).all(), got
