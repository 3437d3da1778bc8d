"""Read strategies and the shard cache: what each read asks of the inner store."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import ByteRequest
from zarr.core.buffer import default_buffer_prototype

from shardstore import ShardFormatError, ShardingConfigError, ShardingStore
from shardstore.addressing import locate
from shardstore.inner import LocalInner, MappingInner
from shardstore.inner.base import Capabilities
from shardstore.instrument import CountingInner
from shardstore.options import ReadPolicy, StoreOptions
from shardstore.reading.cache import IndexCache, ShardCache
from shardstore.reading.reader import ShardReader

from .helpers import later_clock, turns_until

DATA = np.arange(32 * 32, dtype="u2").reshape(32, 32)
HOUR = 3600.0
"""A ``cache_max_age`` for tests that count requests: an entry cached a moment ago still
serves reads however long a loaded machine takes between them (the default is 1 s)."""


class RemoteMapping(MappingInner):
    """A mapping that says it is remote, as object stores do."""

    capabilities = Capabilities(remote=True)


class HeldMapping(MappingInner):
    """A mapping whose next read, once a test asks (``hold()``), takes its bytes and then
    waits until ``release()``, saying when it got there (``held``): a fetch under way for
    as long as the test needs, whatever the machine's load."""

    def __init__(self, mapping: dict[str, Any]) -> None:
        super().__init__(mapping)
        self.held = asyncio.Event()
        self._next: asyncio.Event | None = None
        self._holding: asyncio.Event | None = None

    def hold(self) -> None:
        self._next = asyncio.Event()
        self.held.clear()

    def release(self) -> None:
        assert self._holding is not None
        self._holding.set()

    async def get_many_versioned(
        self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        values = await super().get_many_versioned(requests, expected)
        gate, self._next = self._next, None
        if gate is not None:
            self._holding = gate
            self.held.set()
            await gate.wait()
        return values


async def _turns(n: int = 50) -> None:
    """Let the loop run ``n`` turns: more than a read of an in-memory mapping takes to reach
    it or to join a fetch under way (no I/O, no threads: a count, not a time)."""
    for _ in range(n):
        await asyncio.sleep(0)


def _written(inner: Any = None, **kwargs: Any) -> tuple[CountingInner, dict[str, Any]]:
    """A 32 x 32 array of 2 x 2 chunks, 4 x 4 chunks per shard: 16 shards."""
    backing: dict[str, Any] = {}
    counted = CountingInner(inner(backing) if inner else backing)
    arr = zarr.create_array(
        ShardingStore(counted, chunks_per_shard=(4, 4)),
        name="a",
        shape=DATA.shape,
        chunks=(2, 2),
        dtype=DATA.dtype,
        compressors=None,
        **kwargs,
    )
    arr[:] = DATA
    counted.counts.reset()
    return counted, backing


def _open(counted: CountingInner, **options: Any) -> tuple[ShardingStore, zarr.Array]:
    store = ShardingStore(counted, **options)
    arr = zarr.open_array(store, path="a", zarr_format=3)
    counted.counts.reset()
    return store, arr


def _chunk_reads(counted: CountingInner) -> int:
    return sum(n for key, n in counted.counts.read_keys.items() if "/c/" in key)


def test_shard_strategy_cold_chunk_is_one_request_and_the_rest_of_its_shard_is_free() -> None:
    counted, _ = _written()
    _, arr = _open(counted, read_strategy="shard", cache_max_age=HOUR)
    assert arr[3, 5] == DATA[3, 5]
    assert counted.counts.reads == 1 and counted.counts.read_keys["a/c/0/0"] == 1
    np.testing.assert_array_equal(arr[0:8, 0:8], DATA[0:8, 0:8])
    assert counted.counts.reads == 1


def test_shard_strategy_whole_array_is_one_request_per_shard() -> None:
    counted, _ = _written()
    _, arr = _open(counted, read_strategy="shard")
    np.testing.assert_array_equal(arr[:], DATA)
    assert counted.counts.reads == 16
    assert set(counted.counts.read_keys.values()) == {1}


def test_absent_shards_are_remembered_too() -> None:
    counted, _ = _written(fill_value=9)
    _, arr = _open(counted, read_strategy="shard", cache_max_age=HOUR)
    arr.resize((64, 32))
    counted.counts.reset()
    assert arr[40, 0] == 9 and arr[41, 3] == 9
    assert counted.counts.reads == 1  # shard (5, 0) does not exist: one request says so


def test_chunk_strategy_fetches_a_shard_whole_only_for_a_batch_wanting_most_of_it(tmp_path: Path) -> None:
    counted, _ = _written(lambda _: LocalInner(tmp_path))  # ranges: checked against their index's version
    _, arr = _open(counted, read_strategy="chunk")
    assert arr[3, 5] == DATA[3, 5]
    assert counted.counts.reads == 2  # index, then the chunk
    counted.counts.reset()
    keys = [(f"a/c/{i}/{j}", None) for i in range(4, 8) for j in range(4)]  # shard (1, 0), whole
    store = arr.store
    values = asyncio.run(store.get_partial_values(default_buffer_prototype(), keys))
    assert all(v is not None for v in values)
    assert counted.counts.reads == 1 and not counted.counts.writes


def test_auto_fetches_whole_shards_on_remote_stores_only(tmp_path: Path) -> None:
    local, _ = _written(lambda _: LocalInner(tmp_path))
    _, arr = _open(local)
    assert arr[3, 5] == DATA[3, 5]
    assert local.counts.reads == 2  # local files, read once: ranges
    memory, _ = _written()
    _, arr = _open(memory)
    assert arr[3, 5] == DATA[3, 5]
    assert memory.counts.reads == 1  # in memory: the whole shard, one consistent read
    remote, _ = _written(RemoteMapping)
    _, arr = _open(remote)
    assert arr[3, 5] == DATA[3, 5]
    assert remote.counts.reads == 1  # a remote store: the whole (small) shard


def test_auto_reads_ranges_of_shards_too_large_to_fetch_whole() -> None:
    backing: dict[str, Any] = {}
    counted = CountingInner(RemoteMapping(backing))
    store = ShardingStore(counted, chunks_per_shard=(4, 4))
    # 16 chunks of 1024 x 1024 float64: 128 MiB a shard before compression
    arr = zarr.create_array(store, name="a", shape=(8192, 8192), chunks=(1024, 1024), dtype="f8")
    arr[0:1024, 0:1024] = 1.5
    counted.counts.reset()
    fresh = zarr.open_array(ShardingStore(counted), path="a", zarr_format=3)
    counted.counts.reset()
    assert fresh[5, 5] == 1.5
    assert counted.counts.reads == 2


def test_shard_cache_stays_within_its_bound() -> None:
    counted, _ = _written()
    shard_nbytes = 16 * 8 + 16 * 16  # 16 chunks of 8 bytes, and the index
    store, arr = _open(counted, read_strategy="shard", shard_cache_bytes=3 * shard_nbytes)
    for row in range(0, 32, 2):  # one chunk of every shard at a time: each shard is kept
        for col in range(0, 32, 8):
            np.testing.assert_array_equal(
                arr[row : row + 2, col : col + 2], DATA[row : row + 2, col : col + 2]
            )
    entries, nbytes = store.internals.cache_usage()["shards"]
    assert 0 < nbytes <= 3 * shard_nbytes
    assert entries <= 3


def test_a_read_of_whole_shards_passes_them_through_the_shard_cache() -> None:
    """A bulk read does not push out what repeated chunk reads keep: the shards it
    reads whole are not kept, and a shard read in part is."""
    counted, _ = _written()
    store, arr = _open(counted, read_strategy="shard", cache_max_age=HOUR)
    np.testing.assert_array_equal(arr[:], DATA)
    assert store.internals.cache_usage()["shards"] == (0, 0)
    np.testing.assert_array_equal(arr[:2, :2], DATA[:2, :2])
    assert store.internals.cache_usage()["shards"][0] == 1
    counted.counts.reset()
    np.testing.assert_array_equal(arr[2:4, 2:4], DATA[2:4, 2:4])  # another chunk of that shard
    assert counted.counts.reads == 0


@pytest.mark.parametrize("mode", ["auto", "trust"])
def test_read_after_own_write_is_fresh(mode: str) -> None:
    counted, _ = _written()
    _, arr = _open(counted, read_strategy="shard", index_cache=mode)
    for value in range(3):
        assert arr[0, 0] == (DATA[0, 0] if value == 0 else value - 1)
        arr[0:2, 0:2] = value
        assert arr[1, 1] == value and arr[2, 2] == DATA[2, 2]


def test_another_writer_is_seen_once_the_cached_shard_is_older_than_max_age(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = later_clock(monkeypatch)
    counted, _ = _written()
    _, reader = _open(counted, read_strategy="shard", cache_max_age=60)
    _, writer = _open(counted)
    assert reader[0, 0] == DATA[0, 0]
    writer[0:2, 0:2] = 777
    assert reader[1, 1] == DATA[1, 1]  # a snapshot of the shard: old, never garbage
    clock.shift += 61
    assert reader[1, 1] == 777


@pytest.mark.parametrize("options", [{"cache_max_age": 0}, {"index_cache": "off"}])
def test_another_writer_is_seen_at_once_without_shard_caching(options: dict[str, Any]) -> None:
    counted, _ = _written()
    _, reader = _open(counted, read_strategy="shard", **options)
    _, writer = _open(counted)
    assert reader[0, 0] == DATA[0, 0]
    writer[0:2, 0:2] = 777
    assert reader[1, 1] == 777


def test_trusted_shards_stay_until_evicted() -> None:
    counted, _ = _written()
    _, reader = _open(counted, read_strategy="shard", index_cache="trust", cache_max_age=0)
    assert reader[0, 0] == DATA[0, 0]
    assert reader[1, 1] == DATA[1, 1]
    assert counted.counts.reads == 1


async def test_concurrent_fetches_of_one_shard_share_one_request() -> None:
    counted, _ = _written(HeldMapping)
    held = counted.inner
    assert isinstance(held, HeldMapping)
    store = ShardingStore(counted, read_strategy="shard")
    proto = default_buffer_prototype()
    await store.get("a/zarr.json", proto)
    counted.counts.reset()
    held.hold()
    first = asyncio.ensure_future(store.get("a/c/0/0", proto))
    await held.held.wait()  # the first fetch is under way ...
    second = asyncio.ensure_future(store.get("a/c/1/1", proto))
    await _turns()  # ... and a later read joins it (a read of its own would not be held)
    held.release()
    assert (await second) is not None and (await first) is not None
    assert counted.counts.reads == 1


async def _held_reader(*, threads: bool = False) -> tuple[CountingInner, HeldMapping, ShardReader, Any]:
    """A reader of the written array whose next fetch is held, and where chunk
    ``a/c/1/1`` is (its shard, its place); with ``threads``, over a store that says it
    reads in threads (its reads given to ``each`` once the batch is read)."""
    counted, _ = _written(HeldMapping)
    held = counted.inner
    assert isinstance(held, HeldMapping)
    if threads:
        counted.capabilities = dataclasses.replace(counted.capabilities, hands_as_read=True)
    store = ShardingStore(counted, read_strategy="shard")
    await store.get("a/zarr.json", default_buffer_prototype())
    info = await store.internals.array_of_key("a/c/1/1")
    assert info is not None
    policy = ReadPolicy.resolve(StoreOptions(read_strategy="shard"), store.internals.raw.capabilities)
    reader = ShardReader(store.internals.raw, IndexCache(2**20), ShardCache(2**20), policy)
    counted.counts.reset()
    held.hold()
    return counted, held, reader, locate(info, "a/c/1/1", (1, 1))


async def test_a_cancelled_fetch_does_not_strand_fetches_that_joined_it() -> None:
    counted, held, reader, where = await _held_reader()
    first = asyncio.ensure_future(reader.fetch_shards([where.shard]))
    await held.held.wait()  # the first fetch is under way ...
    second = asyncio.ensure_future(reader.fetch_shards([where.shard]))
    await _turns()  # ... and the second has joined it
    first.cancel()
    ((snapshot, error),) = await asyncio.wait_for(second, 5)
    assert error is None and snapshot is not None
    assert snapshot.chunk(where.position) is not None
    assert counted.counts.reads == 1  # the joined fetch's own (the cancelled one never completed)


async def test_a_cancelled_read_that_joined_a_fetch_leaves_it_to_the_others() -> None:
    """A read that joined a fetch under way and is then cancelled takes neither the
    fetch nor the other reads waiting for it down with it: the one that sent it and a
    third that joined it get the shard, from the one request."""
    counted, held, reader, where = await _held_reader()
    first = asyncio.ensure_future(reader.fetch_shards([where.shard]))
    await held.held.wait()  # the first fetch is under way ...
    second = asyncio.ensure_future(reader.fetch_shards([where.shard]))
    third = asyncio.ensure_future(reader.fetch_shards([where.shard]))
    await _turns()  # ... the others have joined it
    second.cancel()
    await _turns()
    held.release()
    for task in (first, third):
        ((snapshot, error),) = await asyncio.wait_for(task, 5)
        assert error is None and snapshot is not None
        assert snapshot.chunk(where.position) is not None
    assert second.cancelled()
    assert counted.counts.reads == 1


def _memory(nbytes: int) -> memoryview:
    return memoryview(bytearray(nbytes))


async def test_a_shard_another_read_joined_the_fetch_of_is_not_given_to_each() -> None:
    """A shard whose fetch another read joined before it was read comes, as its
    snapshot, to both (``each`` does not get it): one request."""
    counted, held, reader, where = await _held_reader(threads=True)
    given: list[int] = []
    first = asyncio.ensure_future(
        reader.fetch_shards(
            [where.shard], passing={where.shard.key}, into=_memory, each=lambda i, _: given.append(i)
        )
    )
    await held.held.wait()  # the first fetch is under way ...
    second = asyncio.ensure_future(reader.fetch_shards([where.shard]))
    await _turns()  # ... and the second has joined it
    held.release()
    for fetch in (first, second):
        ((snapshot, error),) = await asyncio.wait_for(fetch, 5)
        assert error is None and snapshot is not None
        assert snapshot.chunk(where.position) is not None
    assert given == []
    assert counted.counts.reads == 1


async def test_a_read_that_joins_a_fetch_after_it_gave_the_shard_to_each_fetches_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By then the shard's memory may be the next shard's: the read that joined fetches
    it again, and gets it."""
    store = ShardingStore(CountingInner(LocalInner(tmp_path)), chunks_per_shard=(4, 4))
    zarr.create_array(store, name="a", shape=DATA.shape, chunks=(2, 2), dtype=DATA.dtype)[:] = DATA
    counted = store.internals.raw
    assert isinstance(counted, CountingInner) and counted.capabilities.hands_as_read
    info = await store.internals.array_of_key("a/c/0/0")
    assert info is not None
    policy = ReadPolicy.resolve(StoreOptions(read_strategy="shard"), counted.capabilities)
    reader = ShardReader(counted, IndexCache(2**20), ShardCache(2**20), policy)
    first_shard, held_shard = (
        locate(info, key, c).shard for key, c in (("a/c/0/0", (0, 0)), ("a/c/0/4", (0, 4)))
    )
    gate, given_first, reading = threading.Event(), threading.Event(), LocalInner._read_versioned

    def read(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith(held_shard.key):
            gate.wait(10)  # the batch stays under way ...
        return reading(path, *args, **kwargs)

    def each(i: int, _: Any) -> None:
        if i == 0:
            given_first.set()

    monkeypatch.setattr(LocalInner, "_read_versioned", staticmethod(read))
    counted.counts.reset()
    shards = [first_shard, held_shard]
    first = asyncio.ensure_future(
        reader.fetch_shards(shards, passing={s.key for s in shards}, into=_memory, each=each)
    )
    assert await asyncio.to_thread(given_first.wait, 10)  # ... once its first shard is given away
    second = asyncio.ensure_future(reader.fetch_shards([first_shard]))
    await _turns()  # the second has joined it
    gate.set()
    assert await asyncio.wait_for(first, 10) == [(None, None), (None, None)]
    ((snapshot, error),) = await asyncio.wait_for(second, 10)
    assert error is None and snapshot is not None
    assert snapshot.chunk(locate(info, "a/c/1/1", (1, 1)).position) is not None
    assert counted.counts.unranged_reads[first_shard.key] == 2


async def _two_shards(*, threads: bool, damaged: bool = False) -> tuple[ShardReader, list[Any]]:
    """A reader of the written array (the second of its two shards asked for cut short
    if ``damaged``), over a store that says it reads in ``threads`` or not."""
    counted, backing = _written()
    if threads:
        counted.capabilities = dataclasses.replace(counted.capabilities, hands_as_read=True)
    if damaged:
        backing["a/c/0/1"] = backing["a/c/0/1"][:-3]
    store, _ = _open(counted, read_strategy="shard")
    info = await store.internals.array_of_key("a/c/0/0")
    assert info is not None
    policy = ReadPolicy.resolve(StoreOptions(read_strategy="shard"), counted.capabilities)
    reader = ShardReader(counted, IndexCache(2**20), ShardCache(2**20), policy)
    return reader, [
        locate(info, key, coords).shard for key, coords in (("a/c/0/0", (0, 0)), ("a/c/0/4", (0, 4)))
    ]


@pytest.mark.parametrize("threads", [True, False])
async def test_each_takes_only_shards_passing_through_into_memory_given_where_the_store_hands_as_read(
    threads: bool,
) -> None:
    """Elsewhere, and for shards that do not pass through (the cache keeps them), the
    snapshots come back as they always did, and ``each`` is not called."""
    reader, shards = await _two_shards(threads=threads)
    assert [shard.key for shard in shards] == ["a/c/0/0", "a/c/0/1"]
    given: list[int] = []
    for passing in ({shard.key for shard in shards}, set()):
        outcomes = await reader.fetch_shards(
            shards, passing=passing, into=_memory, each=lambda i, _: given.append(i)
        )
        assert all(error is None for _, error in outcomes)
        assert [snapshot is None for snapshot, _ in outcomes] == [threads and bool(passing)] * 2
    assert given == ([0, 1] if threads else [])


@pytest.mark.parametrize("damage", ["shard", "each"])
async def test_a_shard_given_to_each_fails_the_fetch_as_a_damaged_shard_does(damage: str) -> None:
    """A damaged shard is never given to ``each`` and fails the fetch naming it; what
    ``each`` raises fails it too, as it is."""
    reader, shards = await _two_shards(threads=True, damaged=damage == "shard")
    given: list[int] = []

    def each(i: int, snapshot: Any) -> None:
        if damage == "each" and i == 1:
            raise RuntimeError("each failed")
        given.append(i)

    outcomes = await reader.fetch_shards(shards, passing={s.key for s in shards}, into=_memory, each=each)
    assert given == [0]
    assert outcomes[0] == (None, None)
    snapshot, error = outcomes[1]
    assert snapshot is None
    if damage == "shard":
        assert isinstance(error, ShardFormatError) and "a/c/0/1" in str(error)
    else:
        assert isinstance(error, RuntimeError) and str(error) == "each failed"


def test_a_corrupt_shard_raises_naming_it_and_others_still_read() -> None:
    counted, backing = _written()
    backing["a/c/0/1"] = backing["a/c/0/1"][:-3]
    _, arr = _open(counted, read_strategy="shard")
    with pytest.raises(ShardFormatError, match="a/c/0/1"):
        arr[0, 8]
    assert arr[0, 0] == DATA[0, 0]


@pytest.mark.parametrize(
    "options",
    [{"read_strategy": "whole"}, {"shard_cache_bytes": -1}, {"cache_max_age": float("nan")}],
)
def test_bad_read_options_are_config_errors(options: dict[str, Any]) -> None:
    with pytest.raises(ShardingConfigError, match=next(iter(options))):
        ShardingStore({}, **options)


async def test_fsspec_batches_are_one_cat_ranges_call_with_per_read_outcomes() -> None:
    import fsspec
    from zarr.abc.store import RangeByteRequest, SuffixByteRequest

    from shardstore.inner import FsspecInner

    fs = fsspec.filesystem("memory", skip_instance_cache=True)
    fs.pipe_file("/b/x", b"0123456789")
    fs.pipe_file("/b/empty", b"")
    calls: list[int] = []
    cat_ranges = fs.cat_ranges

    def counted(paths: list[str], *args: Any, **kwargs: Any) -> Any:
        calls.append(len(paths))
        return cat_ranges(paths, *args, **kwargs)

    fs.cat_ranges = counted  # type: ignore[method-assign]
    inner = FsspecInner(fs, "/b")
    values = await inner.get_many(
        [
            ("x", RangeByteRequest(2, 5)),
            ("x", SuffixByteRequest(3)),
            ("x", None),
            ("missing", None),
            ("empty", None),  # no byte 0: retried alone, read whole
        ]
    )
    assert values == [b"234", b"789", b"0123456789", None, b""]
    assert calls == [5]


async def test_a_read_under_way_during_an_own_write_is_not_cached() -> None:
    """A whole-shard fetch sent before a write through the store returns the old shard;
    it must not be cached, or a read after the write would see the old chunk."""
    counted, _ = _written(HeldMapping)
    held = counted.inner
    assert isinstance(held, HeldMapping)
    store = ShardingStore(counted, read_strategy="shard", index_cache="trust")
    arr = await zarr.api.asynchronous.open_array(store=store, path="a", zarr_format=3)
    held.hold()
    reading = asyncio.ensure_future(arr.getitem((slice(0, 2), slice(0, 2))))
    await held.held.wait()  # the fetch of shard (0, 0) has read the old bytes, not yet returned
    await arr.setitem((slice(0, 2), slice(0, 2)), 555)
    held.release()
    old = await reading
    assert old.tolist() in (DATA[0:2, 0:2].tolist(), [[555, 555], [555, 555]])
    np.testing.assert_array_equal(await arr.getitem((slice(0, 2), slice(0, 2))), 555)


def test_a_read_after_a_write_does_not_join_a_fetch_sent_before_it(tmp_path: Path) -> None:
    """A read of a shard joins a fetch of it already under way, unless the shard was
    written through the store since that fetch was sent: then it fetches afresh, and
    sees what was written."""

    class Gated(LocalInner):
        armed = False
        gate = threading.Event()
        inside = threading.Event()

        def _read_versioned(self, path: Any, byte_range: Any, expected: Any, **how: Any) -> Any:
            where = Path(path)
            if self.armed and byte_range is None and where.name == "0" and where.parent.name == "0":
                self.armed = False  # the first whole fetch of shard a/c/0/0 only
                self.inside.set()
                assert self.gate.wait(timeout=60)
            return super()._read_versioned(path, byte_range, expected, **how)

    async def main() -> tuple[np.ndarray, np.ndarray]:
        inner = Gated(tmp_path)
        inner._at_once = False  # (the gate holds a worker thread, never the event loop)
        store = ShardingStore(inner, (2, 2), read_strategy="shard")
        arr = await zarr.api.asynchronous.create_array(
            store, name="a", shape=(8, 8), chunks=(2, 2), dtype="i4", fill_value=0
        )
        await arr.setitem(slice(None), np.ones((8, 8), "i4"))
        fresh = await zarr.api.asynchronous.open_array(store=store, path="a")
        inner.armed = True
        early = asyncio.ensure_future(fresh.getitem((slice(0, 4), slice(0, 4))))  # fetch under way
        assert await asyncio.to_thread(inner.inside.wait, 60)
        await fresh.setitem((slice(0, 4), slice(0, 4)), np.full((4, 4), 2, "i4"))  # the whole shard
        later = asyncio.ensure_future(fresh.getitem((slice(0, 4), slice(0, 4))))
        try:
            await turns_until(later.done, limit=1_000_000)  # its own fetch: no wait for the gate
        finally:
            inner.gate.set()
        return np.asarray(await early), np.asarray(await later)

    early, later = asyncio.run(main())
    assert len(np.unique(early)) == 1  # before or after the write, never a mix
    assert (later == 2).all()


def test_local_reads_of_what_is_no_file_are_absent_and_of_files_carry_their_version(tmp_path: Path) -> None:
    from zarr.abc.store import RangeByteRequest, SuffixByteRequest

    from shardstore.inner import STALE

    inner = LocalInner(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_bytes(b"0123456789")
    requests: list[tuple[str, ByteRequest | None]] = [
        ("dir", None),
        ("dir", SuffixByteRequest(4)),
        ("dir", RangeByteRequest(0, 2)),
        ("nope", None),
        ("file/under", None),
        ("file", None),
        ("file", SuffixByteRequest(4)),
        ("file", RangeByteRequest(2, 5)),
    ]
    requests.append(("file/", None))  # (a trailing slash: the file, as zarr's LocalStore reads it)
    got = asyncio.run(inner.get_many_versioned(requests, [None] * len(requests)))
    assert [value for value, _ in got] == [
        None,
        None,
        None,
        None,
        None,
        *[b"0123456789", b"6789", b"234"],
        b"0123456789",
    ]
    assert [version for _, version in got][:5] == [None] * 5
    assert got[5][1] == got[6][1] == got[7][1] == got[8][1] == inner.version("file")
    (tmp_path / ".file.appending").mkdir()  # an append journal that cannot be read: ignored
    [(value, _)] = asyncio.run(inner.get_many_versioned([("file", SuffixByteRequest(2))], [None]))
    assert value == b"89"
    [(value, _)] = asyncio.run(inner.get_many_versioned([("file", RangeByteRequest(0, 1))], [(0, 10, 0)]))
    assert value is STALE
