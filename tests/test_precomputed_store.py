"""PrecomputedShardedStore: neuroglancer precomputed sharded directories as a mapping of
uint64 chunk ids, over every kind of inner store; interop with tensorstore both ways;
one rebuild per shard per update; request counts; several writing processes; damaged
shards; read-only stores; minishard index caches that notice other writers."""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore import ChunkKeyError, PrecomputedShardedStore, ShardFormatError
from shardstore.formats.precomputed import (
    PrecomputedSharding,
    locate_ids,
    shard_file_name,
    split_shard,
)
from shardstore.instrument import CountingInner

from .helpers import later_clock, sharding
from .processes import Writers

ts = pytest.importorskip("tensorstore")

U64_MAX = 2**64 - 1
SHARD0 = r"'0\.shard'"
"""How errors name the shard file ``0.shard``."""


SMALL = sharding(0, 2, 2)
"""identity: minishard = id & 3, shard = (id >> 2) & 3; four shards ``0.shard`` .. ``3.shard``."""


def _where(spec: dict[str, Any], chunk_id: int) -> tuple[str, int]:
    """(shard file name, minishard) of a chunk id."""
    parsed = PrecomputedSharding.from_json(spec)
    shards, minishards = locate_ids(parsed, np.array([chunk_id], dtype=np.uint64))
    return shard_file_name(parsed, int(shards[0])), int(minishards[0])


def _chunks(seed: int, n: int = 60) -> dict[int, bytes]:
    """Chunks of many sizes (empty ones included) at ids small, huge and at the edges."""
    rng = np.random.default_rng(seed)
    ids = {0, 1, 2, 3, 255, 256, 4096, 2**32, 2**63, U64_MAX}
    ids |= set(rng.integers(0, 2**63, n // 2).tolist()) | set(rng.integers(0, 5000, n // 2).tolist())
    sizes = rng.integers(0, 200, len(ids))
    sizes[::7] = 0
    return {
        int(i): bytes(rng.integers(0, 4, int(s), dtype=np.uint8))
        for i, s in zip(sorted(ids), sizes, strict=True)
    }


def _absent(chunks: dict[int, bytes]) -> list[int]:
    return [i for i in (5, 77777, 2**40 + 3, U64_MAX - 1) if i not in chunks]


# -- inner stores ------------------------------------------------------------------------------

INNERS = ["path", "file-url", "zarr-local", "dict", "zarr-memory", "fsspec-memory", "s3"]


@pytest.fixture(params=INNERS)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., PrecomputedShardedStore]]:
    """Stores over one location of the kind asked for (each call: a new instance)."""
    kind = request.param
    storage_options: dict[str, Any] | None = None
    location: Any
    if kind == "path":
        location = str(tmp_path / "scale")
    elif kind == "file-url":
        location = f"file://{tmp_path}/scale"
    elif kind == "zarr-local":
        location = zarr.storage.LocalStore(tmp_path / "scale")
    elif kind == "dict":
        location = {}
    elif kind == "zarr-memory":
        location = zarr.storage.MemoryStore()
    elif kind == "fsspec-memory":
        location = fsspec.get_mapper(f"memory://precomputed-{uuid.uuid4().hex}")
    else:
        s3 = request.getfixturevalue("s3")
        location, storage_options = s3.url(f"scale-{uuid.uuid4().hex}"), s3.storage_options

    def new(spec: dict[str, Any] = SMALL, **kwargs: Any) -> PrecomputedShardedStore:
        return PrecomputedShardedStore(location, spec, storage_options=storage_options, **kwargs)

    yield new
    if kind == "fsspec-memory":
        memory = fsspec.filesystem("memory")
        if memory.exists(location.root):
            memory.rm(location.root, recursive=True)


def _contents(store: PrecomputedShardedStore) -> dict[int, bytes]:
    """Everything in the store, in two batched passes (ids, then values)."""
    ids = list(store)
    values = asyncio.run(store.get_many(ids))
    assert None not in values
    return dict(zip(ids, values, strict=True))  # type: ignore[arg-type]


def test_roundtrip(make: Callable[..., PrecomputedShardedStore]) -> None:
    store = make()
    assert len(store) == 0 and list(store) == [] and store.get(5) is None and 5 not in store
    with pytest.raises(KeyError) as missing:
        store[5]
    assert not isinstance(missing.value, ChunkKeyError)  # absent, not malformed

    store[5] = b"five"
    store[U64_MAX] = b"max"
    store[0] = b""
    assert store[5] == b"five" and store.get(U64_MAX) == b"max" and store[0] == b""
    assert 5 in store and 0 in store and 6 not in store and np.uint64(5) in store
    assert store.get(6, b"default") == b"default"

    many = {i: bytes([i % 256]) * (i % 50) for i in range(10, 30)}
    store.update(many)
    expected = {5: b"five", U64_MAX: b"max", 0: b"", **many}
    fresh = make()  # nothing cached
    for s in (store, fresh):
        assert len(s) == len(expected)
        assert list(s) == sorted(expected)
        assert _contents(s) == expected
    assert asyncio.run(fresh.shard_keys()) == ["0.shard", "1.shard", "2.shard", "3.shard"]

    store.update({5: b"FIVE", 10: None, 11: None, 12: b"twelve", 2**40: bytearray(b"ba")})
    store[13] = memoryview(b"mv")  # type: ignore[assignment]
    del store[U64_MAX]
    expected.update({5: b"FIVE", 12: b"twelve", 2**40: b"ba", 13: b"mv"})
    for gone in (10, 11, U64_MAX):
        del expected[gone]
    assert _contents(make()) == expected
    with pytest.raises(KeyError):
        del store[10]

    # deleting every chunk of a shard deletes the shard file
    store.update({i: None for i in expected if _where(SMALL, i)[0] != "1.shard"})
    assert asyncio.run(store.shard_keys()) == ["1.shard"]
    left = {i: v for i, v in expected.items() if _where(SMALL, i)[0] == "1.shard"}
    assert dict(make().items()) == left
    store.update({i: None for i in left})
    assert len(store) == 0 and asyncio.run(store.shard_keys()) == []


async def test_async_api(make: Callable[..., PrecomputedShardedStore]) -> None:
    store = make(sharding(1, 1, 3, "murmurhash3_x86_128", "gzip", "gzip"))
    chunks = _chunks(7)
    await store.update_many(chunks)
    absent = _absent(chunks)
    wanted = [*chunks, *absent, *list(chunks)[:5]]  # repeats are fine
    assert await store.get_many(wanted) == [chunks.get(i) for i in wanted]
    assert await store.get_many([]) == []
    assert await store.ids() == sorted(chunks)
    keys = await store.shard_keys()
    assert keys == sorted({_where(store.sharding.to_json(), i)[0] for i in chunks})
    await store.update_many({i: None for i in list(chunks)[::2]})
    assert await store.ids() == sorted(list(chunks)[1::2])


BAD_IDS = [-1, 2**64, 2**70, "5", b"5", 5.0, True, None, np.int64(-3), (1, 2)]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_ids_outside_uint64_raise_chunk_key_error(tmp_path: Path, bad: Any) -> None:
    store = PrecomputedShardedStore(str(tmp_path), SMALL)
    store[1] = b"one"
    before = (tmp_path / "0.shard").read_bytes()
    with pytest.raises(ChunkKeyError, match="chunk id"):
        store[bad]
    with pytest.raises(ChunkKeyError):
        store.get(bad)  # Mapping.get would say None
    with pytest.raises(ChunkKeyError):
        store[bad] = b"x"
    with pytest.raises(ChunkKeyError):
        del store[bad]
    with pytest.raises(ChunkKeyError):
        store.update({2: b"two", bad: b"x"})  # refused before anything is written
    with pytest.raises(ChunkKeyError):
        asyncio.run(store.get_many([1, bad]))
    with pytest.raises(ChunkKeyError):
        asyncio.run(store.update_many({bad: None}))
    assert bad not in store  # membership is a question, not a failure
    assert list(store) == [1] and (tmp_path / "0.shard").read_bytes() == before


def test_values_must_be_bytes(tmp_path: Path) -> None:
    store = PrecomputedShardedStore(str(tmp_path), SMALL)
    with pytest.raises(TypeError, match="chunk 3"):
        store.update({1: b"ok", 3: "text"})
    assert len(store) == 0
    with pytest.raises(TypeError):
        store.update(a=b"x")


def test_other_files_in_the_directory_are_not_chunks(tmp_path: Path) -> None:
    store = PrecomputedShardedStore(str(tmp_path), SMALL)
    store.update({1: b"a", 9: b"b"})
    (tmp_path / "info").write_text("{}")
    (tmp_path / "00.shard").write_bytes(b"not ours: padded wider than 2 bits need")
    (tmp_path / "A.shard").write_bytes(b"not ours: upper case")
    assert list(store) == [1, 9] and len(store) == 2
    assert asyncio.run(store.shard_keys()) == ["0.shard", "2.shard"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(
        st.dictionaries(
            st.one_of(st.integers(0, 40), st.integers(0, U64_MAX)),
            st.one_of(st.none(), st.binary(max_size=20)),
            max_size=12,
        ),
        min_size=1,
        max_size=5,
    ),
    spec=st.sampled_from(
        [sharding(0, 1, 2), sharding(2, 0, 1, "murmurhash3_x86_128", "gzip", "raw"), sharding(0, 0, 0)]
    ),
    local=st.booleans(),
)
def test_matches_a_dict(
    tmp_path: Path, batches: list[dict[int, bytes | None]], spec: Any, local: bool
) -> None:
    where: Any = str(tmp_path / uuid.uuid4().hex) if local else {}
    store = PrecomputedShardedStore(where, spec)
    model: dict[int, bytes] = {}
    for batch in batches:
        store.update(batch)
        for i, v in batch.items():
            if v is None:
                model.pop(i, None)
            else:
                model[i] = v
        assert dict(store.items()) == model
    wanted = [*model, 41, U64_MAX - 7]
    assert asyncio.run(PrecomputedShardedStore(where, spec).get_many(wanted)) == [
        model.get(i) for i in wanted
    ]


# -- interop with tensorstore --------------------------------------------------------------------

SHARDINGS = [
    sharding(0, 0, 0),
    sharding(0, 2, 2, "murmurhash3_x86_128", "gzip", "gzip"),
    sharding(1, 3, 2, "identity", "raw", "gzip"),
    sharding(2, 0, 3, "murmurhash3_x86_128", "gzip", "raw"),
    sharding(0, 4, 0, "identity", "gzip", "raw"),
    sharding(3, 1, 5, "murmurhash3_x86_128", "raw", "raw"),
]
SHARDING_IDS = [
    f"{s['hash'][:8]}-p{s['preshift_bits']}m{s['minishard_bits']}s{s['shard_bits']}"
    f"-{s['minishard_index_encoding']}-{s['data_encoding']}"
    for s in SHARDINGS
]


def _kvstore(path: Path, spec: dict[str, Any], context: Any = None) -> Any:
    return ts.KvStore.open(
        {
            "driver": "neuroglancer_uint64_sharded",
            "base": {"driver": "file", "path": f"{path}/"},
            "metadata": spec,
        },
        context=context if context is not None else ts.Context(),
    ).result()


def _key(chunk_id: int) -> bytes:
    return struct.pack(">Q", chunk_id)  # tensorstore's keys: the id as 8 big-endian bytes


def _ts_write(kv: Any, chunks: dict[int, bytes | None]) -> None:
    with ts.Transaction() as txn:
        for chunk_id, value in chunks.items():
            kv.with_transaction(txn).write(_key(chunk_id), value).result()  # None: delete


def _ts_read(kv: Any, ids: list[int]) -> list[bytes | None]:
    futures = [kv.read(_key(i)) for i in ids]
    results = [f.result() for f in futures]
    return [bytes(r.value) if r.state == "value" else None for r in results]


def _ts_ids(kv: Any) -> list[int]:
    return sorted(struct.unpack(">Q", k)[0] for k in kv.list().result())


def _write(writer: str, path: Path, spec: dict[str, Any], chunks: dict[int, bytes]) -> None:
    if writer == "tensorstore":
        _ts_write(_kvstore(path, spec), dict(chunks))
    else:
        PrecomputedShardedStore(str(path), spec).update(chunks)


@pytest.mark.parametrize("reader", ["tensorstore", "shardstore"])
@pytest.mark.parametrize("writer", ["tensorstore", "shardstore"])
@pytest.mark.parametrize("spec", SHARDINGS, ids=SHARDING_IDS)
def test_interop(tmp_path: Path, spec: dict[str, Any], writer: str, reader: str) -> None:
    chunks = _chunks(spec["shard_bits"] + 10 * spec["minishard_bits"])
    _write(writer, tmp_path, spec, chunks)
    parsed = PrecomputedSharding.from_json(spec)
    shards, _ = locate_ids(parsed, np.array(list(chunks), dtype=np.uint64))
    expected_files = sorted({shard_file_name(parsed, int(s)) for s in shards})
    assert sorted(p.name for p in tmp_path.iterdir()) == expected_files  # named as both name them
    wanted = [*chunks, *_absent(chunks)]
    if reader == "tensorstore":
        kv = _kvstore(tmp_path, spec)
        assert _ts_read(kv, wanted) == [chunks.get(i) for i in wanted]
        assert _ts_ids(kv) == sorted(chunks)
    else:
        store = PrecomputedShardedStore(str(tmp_path), spec)
        assert asyncio.run(store.get_many(wanted)) == [chunks.get(i) for i in wanted]
        assert list(store) == sorted(chunks) and len(store) == len(chunks)
        # and whole files, as an in-memory store reads them
        mem = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        assert dict(PrecomputedShardedStore(mem, spec).items()) == chunks


@pytest.mark.parametrize("spec", SHARDINGS, ids=SHARDING_IDS)
def test_we_update_what_tensorstore_wrote_and_it_reads_it_back(tmp_path: Path, spec: dict[str, Any]) -> None:
    chunks = _chunks(99 + spec["shard_bits"])
    kv = _kvstore(tmp_path, spec, ts.Context({"cache_pool": {"total_bytes_limit": 10**8}}))
    _ts_write(kv, dict(chunks))
    assert _ts_read(kv, list(chunks)) == list(chunks.values())  # now in tensorstore's cache

    store = PrecomputedShardedStore(str(tmp_path), spec)
    ids = list(chunks)
    changes: dict[int, bytes | None] = {i: b"changed %d" % i for i in ids[::3]}
    changes.update({i: None for i in ids[1::5]})
    changes.update({i: b"new %d" % i for i in (6, 7000, 2**50 + 1, U64_MAX - 2) if i not in chunks})
    store.update(changes)
    expected = {i: v for i, v in {**chunks, **changes}.items() if v is not None}
    wanted = sorted({*expected, *chunks})
    for reader in (kv, _kvstore(tmp_path, spec)):  # the one that cached, and a fresh one
        assert _ts_read(reader, wanted) == [expected.get(i) for i in wanted]
        assert _ts_ids(reader) == sorted(expected)
    # and tensorstore updates what we rewrote, seen by the store that cached it
    _ts_write(kv, {ids[0]: b"from tensorstore again", ids[2]: None})
    expected[ids[0]] = b"from tensorstore again"
    expected.pop(ids[2], None)
    assert dict(store.items()) == expected


# -- one rebuild per shard ---------------------------------------------------------------------------


def test_update_rebuilds_each_shard_once(tmp_path: Path) -> None:
    counted = CountingInner(str(tmp_path))
    store = PrecomputedShardedStore(counted, SMALL)
    chunks = {i: b"v%d" % i for i in range(100)}  # ids 0..99: all four shards
    assert len({_where(SMALL, i)[0] for i in chunks}) == 4
    store.update(chunks)
    assert (counted.counts.writes, counted.counts.deletes) == (4, 0)
    assert counted.counts.reads == 4  # each shard's old bytes, once (absent here)
    assert dict(store.items()) == chunks

    counted.counts.reset()
    store.update({1: b"one", 2: None, 5: b"five", 1000: b"new"})  # ids 1, 2 in shard 0; 5 in 1; 1000 in 2
    assert (counted.counts.writes, counted.counts.reads) == (3, 3)
    assert counted.counts.unranged_reads == {"0.shard": 1, "1.shard": 1, "2.shard": 1}

    counted.counts.reset()
    store.update({i: None for i in range(100) if _where(SMALL, i)[0] == "3.shard"})
    assert (counted.counts.writes, counted.counts.deletes) == (0, 1)
    assert not (tmp_path / "3.shard").exists()

    counted.counts.reset()
    store[7] = b"seven"  # a single chunk: its shard, once
    assert counted.counts.writes == 1


def test_update_on_s3_is_one_get_and_one_put_per_shard(s3: Any) -> None:
    store = PrecomputedShardedStore(
        s3.url(f"upd-{uuid.uuid4().hex}"), SMALL, storage_options=s3.storage_options
    )
    s3.reset()
    store.update({i: b"v%d" % i for i in range(100)})
    assert dict(s3.counts) == {"GET": 4, "PUT": 4}
    s3.reset()
    store.update({1: b"one", 2: None, 5: b"five"})
    assert dict(s3.counts) == {"GET": 2, "PUT": 2}


# -- request counts ------------------------------------------------------------------------------------


def _ts_file_reads() -> int | None:
    """tensorstore's process-wide count of file reads (None: it does not tell)."""
    collect = getattr(ts, "experimental_collect_matching_metrics", None)
    if collect is None:
        return None
    for metric in collect("/tensorstore/kvstore/file/"):
        if metric["name"] == "/tensorstore/kvstore/file/read":
            return int(metric["values"][0].get("value", 0))
    return 0


COUNTED = {i: b"chunk %d" % i for i in range(64)}
COLD, WARM = 5, 21  # both in minishard 1 of 1.shard under SMALL


def test_cold_read_is_three_reads_and_warm_read_one(tmp_path: Path) -> None:
    assert _where(SMALL, COLD) == _where(SMALL, WARM) == ("1.shard", 1)
    PrecomputedShardedStore(str(tmp_path), SMALL).update(COUNTED)
    counted = CountingInner(str(tmp_path))
    store = PrecomputedShardedStore(counted, SMALL)
    assert store[COLD] == COUNTED[COLD]
    cold = counted.counts.reads
    assert (cold, counted.counts.read_batches) == (3, 3)  # shard index entry, minishard index, data
    assert counted.counts.read_keys == {"1.shard": 3} and not counted.counts.unranged_reads
    assert counted.counts.bytes_read == 16 + 4 * 24 + len(COUNTED[COLD])  # entry, index of 4, chunk

    counted.counts.reset()
    assert store[WARM] == COUNTED[WARM]
    warm = counted.counts.reads
    assert warm == 1  # the minishard index is cached (checked by stat, which is no read)

    counted.counts.reset()
    assert asyncio.run(store.get_many(list(range(0, 64, 3)))) == [COUNTED[i] for i in range(0, 64, 3)]
    assert counted.counts.read_batches == 3  # every shard and minishard in the same three rounds
    counted.counts.reset()
    assert asyncio.run(store.get_many(list(range(0, 64, 3)))) == [COUNTED[i] for i in range(0, 64, 3)]
    assert counted.counts.read_batches == 1  # all cached: only the data

    # tensorstore reading the same files, with a cache pool so that it may keep indices
    if _ts_file_reads() is None:
        pytest.skip("this tensorstore does not expose its kvstore metrics")
    kv = _kvstore(tmp_path, SMALL, ts.Context({"cache_pool": {"total_bytes_limit": 10**8}}))
    before = _ts_file_reads()
    assert _ts_read(kv, [COLD]) == [COUNTED[COLD]]
    middle = _ts_file_reads()
    assert _ts_read(kv, [WARM]) == [COUNTED[WARM]]
    after = _ts_file_reads()
    assert before is not None and middle is not None and after is not None
    ts_cold, ts_warm = middle - before, after - middle
    print(f"local reads: shardstore cold {cold} warm {warm}; tensorstore cold {ts_cold} warm {ts_warm}")
    assert cold <= ts_cold and warm <= ts_warm  # measured: tensorstore 3 and 2 (it revalidates by a read)


def test_s3_cold_read_is_three_gets_and_warm_read_one(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"counts-{uuid.uuid4().hex}"
    PrecomputedShardedStore(s3.url(prefix), SMALL, storage_options=s3.storage_options).update(COUNTED)
    store = PrecomputedShardedStore(
        s3.url(prefix), SMALL, storage_options=s3.storage_options, cache_max_age=60
    )
    s3.reset()
    assert store[COLD] == COUNTED[COLD]
    cold = dict(s3.counts)
    assert cold == {"GET": 3}
    s3.reset()
    assert store[WARM] == COUNTED[WARM]
    warm = dict(s3.counts)
    assert warm == {"GET": 1}

    # another writer replaces the shard while the index is cached: the data GET carries
    # If-Match, is refused, and the chunk is located again (never read from the new object
    # at the old offsets)
    moved = b"a longer value that moves every chunk after it"
    PrecomputedShardedStore(s3.url(prefix), SMALL, storage_options=s3.storage_options)[COLD] = moved
    s3.reset()
    assert store[WARM] == COUNTED[WARM]
    assert dict(s3.counts) == {"GET": 4}

    # tensorstore through the same counting proxy
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    base = {
        "driver": "s3",
        "bucket": s3.bucket,
        "path": f"{prefix}/",
        "endpoint": s3.endpoint_url,
        "aws_region": "us-east-1",
    }
    try:
        kv = ts.KvStore.open(
            {"driver": "neuroglancer_uint64_sharded", "base": base, "metadata": SMALL},
            context=ts.Context({"cache_pool": {"total_bytes_limit": 10**8}}),
        ).result()
        s3.reset()
        assert _ts_read(kv, [COLD]) == [moved]
    except ValueError as exc:  # no credentials or no endpoint option in this tensorstore
        pytest.skip(f"tensorstore cannot reach the local S3: {exc}")
    ts_cold = s3.requests
    s3.reset()
    assert _ts_read(kv, [WARM]) == [COUNTED[WARM]]
    ts_warm = s3.requests
    print(f"S3 requests: shardstore cold {cold} warm {warm}; tensorstore cold {ts_cold} warm {ts_warm}")
    assert sum(cold.values()) <= ts_cold and sum(warm.values()) <= ts_warm  # measured: 3 and 2


# -- several writers ---------------------------------------------------------------------------------------

WRITERS, IDS = 4, 96
SHARED = sharding(0, 2, 1)
"""Two shards of four minishards: every writer writes chunks of both."""


def _value(chunk_id: int, final: bool) -> bytes:
    return (b"final %d " if final else b"first %d ") % chunk_id * (1 + chunk_id % 5)


def _writer(path: str, w: int, start: Any) -> None:
    store = PrecomputedShardedStore(path, SHARED)
    mine = [i for i in range(IDS) if i % WRITERS == w]
    start.wait()
    for i in mine:  # first round: one chunk per rewrite, most contention
        store[i] = _value(i, False)
    half = len(mine) // 2  # second round: in two batches
    store.update({i: _value(i, True) for i in mine[:half]})
    store.update({i: _value(i, True) for i in mine[half:]})


def test_processes_writing_the_same_shards_lose_nothing(writers: Writers, tmp_path: Path) -> None:
    assert {_where(SHARED, i)[0] for i in range(IDS) if i % WRITERS == 0} == {"0.shard", "1.shard"}
    writers.together([(_writer, (str(tmp_path), w)) for w in range(WRITERS)])
    got = dict(PrecomputedShardedStore(str(tmp_path), SHARED).items())
    lost = [i for i in range(IDS) if got.get(i) != _value(i, True)]
    assert len(lost) == 0, f"{len(lost)} chunks lost or stale: {lost[:10]}"
    assert sorted(got) == list(range(IDS))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.shard", "1.shard"]  # no temporary left


# -- damage ------------------------------------------------------------------------------------------------

DAMAGE_SPECS = [sharding(0, 2, 0), sharding(0, 2, 0, "identity", "gzip", "gzip")]
DAMAGED = {i: bytes([65 + i]) * (3 + i) for i in (0, 1, 2, 4, 5, 9)}
"""Minishards 0, 1 and 2 of one shard (of four minishards): 247 bytes raw."""


def _damaged_dir(tmp_path: Path, spec: dict[str, Any]) -> tuple[Path, bytes]:
    PrecomputedShardedStore(str(tmp_path), spec).update(DAMAGED)
    path = tmp_path / "0.shard"
    return path, path.read_bytes()


def _read_all(where: Any, spec: dict[str, Any]) -> None:
    store = PrecomputedShardedStore(where, spec)
    asyncio.run(store.get_many([*DAMAGED, 1, 3]))
    asyncio.run(store.ids())


@pytest.mark.parametrize("spec", DAMAGE_SPECS, ids=["raw", "gzip"])
def test_truncated_shards_raise_shard_format_error(tmp_path: Path, spec: dict[str, Any]) -> None:
    path, blob = _damaged_dir(tmp_path, spec)
    for cut in range(len(blob)):
        path.write_bytes(blob[:cut])
        for where in (str(tmp_path), {"0.shard": blob[:cut]}):  # by ranges, and whole
            with pytest.raises(ShardFormatError, match=SHARD0):
                _read_all(where, spec)


def test_truncated_shard_on_s3_raises_shard_format_error(s3: Any) -> None:
    prefix = f"cut-{uuid.uuid4().hex}"
    store = PrecomputedShardedStore(s3.url(prefix), DAMAGE_SPECS[0], storage_options=s3.storage_options)
    store.update(DAMAGED)
    fs = fsspec.filesystem("s3", **s3.storage_options)
    blob = fs.cat(f"{s3.bucket}/{prefix}/0.shard")
    for cut in (len(blob) - 1, len(blob) - 40, 70, 64):  # in the last index, data, entries' end
        fs.pipe(f"{s3.bucket}/{prefix}/0.shard", blob[:cut])
        with pytest.raises(ShardFormatError, match=SHARD0):
            asyncio.run(
                PrecomputedShardedStore(
                    s3.url(prefix), DAMAGE_SPECS[0], storage_options=s3.storage_options
                ).get_many(list(DAMAGED))
            )


@pytest.mark.parametrize("spec", DAMAGE_SPECS, ids=["raw", "gzip"])
def test_flipped_bytes_raise_only_shard_format_errors(tmp_path: Path, spec: dict[str, Any]) -> None:
    """A flipped byte of chunk data is invisible to the format (raw data carries no
    checksum); anything else a reader notices is a ShardFormatError naming the shard."""
    path, blob = _damaged_dir(tmp_path, spec)
    noticed = 0
    for at in range(len(blob)):
        damaged = bytearray(blob)
        damaged[at] ^= 0x80 if at % 2 else 0x01  # low bits: small shifts; high: absurd values
        path.write_bytes(damaged)
        for where in (str(tmp_path), {"0.shard": bytes(damaged)}):
            try:
                _read_all(where, spec)
            except ShardFormatError as exc:
                assert "'0.shard'" in str(exc)
                noticed += 1
    assert noticed > 0


@pytest.mark.parametrize("spec", DAMAGE_SPECS, ids=["raw", "gzip"])
def test_damage_the_format_can_see_is_refused(tmp_path: Path, spec: dict[str, Any]) -> None:
    path, blob = _damaged_dir(tmp_path, spec)
    assert split_shard(PrecomputedSharding.from_json(spec), blob, "0.shard") == DAMAGED
    cases = {  # shard index entry 0 is bytes [0, 16): (start, end) of minishard 0's index
        "entry 0 ending beyond 2**53": blob[:15] + b"\x7f" + blob[16:],
        "entry 0 starting after it ends": blob[:7] + b"\x7f" + blob[8:],
        "entry 0 ending before it starts": blob[:8] + b"\0" * 8 + blob[16:],
        "entry 0 ending a byte early": blob[:8] + bytes([blob[8] - 1]) + blob[9:],
        "shard index cut": blob[:40],
        "last minishard index cut": blob[:-3],
        "empty object": b"",
        "not a shard at all": b"<html>no such key</html>" * 3,
    }
    for name, damaged in cases.items():
        path.write_bytes(damaged)
        for where in (str(tmp_path), {"0.shard": damaged}):
            with pytest.raises(ShardFormatError, match=SHARD0):
                _read_all(where, spec)
                pytest.fail(f"{name}: not noticed")


@pytest.mark.parametrize("kind", ["local", "dict"])
def test_writes_over_a_damaged_shard_raise_and_change_nothing(tmp_path: Path, kind: str) -> None:
    spec = DAMAGE_SPECS[0]
    path, blob = _damaged_dir(tmp_path, spec)
    damaged = blob[:-5]
    path.write_bytes(damaged)
    mapping = {"0.shard": damaged}
    store = PrecomputedShardedStore(str(tmp_path) if kind == "local" else mapping, spec)
    attempts: list[Callable[[], Any]] = [
        lambda: store.__setitem__(1, b"x"),
        lambda: store.update({1: b"x", 3: None}),
        lambda: store.update({0: None}),
        lambda: asyncio.run(store.update_many({5: b"y"})),
    ]
    for attempt in attempts:
        with pytest.raises(ShardFormatError, match=SHARD0):
            attempt()
        now = path.read_bytes() if kind == "local" else mapping["0.shard"]
        assert now == damaged
    with pytest.raises(ShardFormatError, match=SHARD0):
        del store[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.shard"]  # no temporary file left


# -- read-only ---------------------------------------------------------------------------------------------


def test_read_only_store_refuses_writes(tmp_path: Path) -> None:
    PrecomputedShardedStore(str(tmp_path), SMALL).update(COUNTED)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    store = PrecomputedShardedStore(str(tmp_path), SMALL, read_only=True)
    assert store[3] == COUNTED[3] and len(store) == len(COUNTED)
    writes: list[Callable[[], Any]] = [
        lambda: store.__setitem__(3, b"x"),
        lambda: store.__setitem__(1000, b"new"),
        lambda: store.update({3: b"x"}),
        lambda: store.__delitem__(3),
        lambda: asyncio.run(store.update_many({3: None})),
        lambda: store.pop(3),
        lambda: store.clear(),
    ]
    for write in writes:
        with pytest.raises(ValueError, match="read-only"):
            write()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# -- caches see other writers ------------------------------------------------------------------------------


def test_cached_minishard_index_sees_another_instance_rewrite(tmp_path: Path) -> None:
    PrecomputedShardedStore(str(tmp_path), SMALL).update(COUNTED)
    counted = CountingInner(str(tmp_path))
    reader = PrecomputedShardedStore(counted, SMALL, cache_max_age=3600)
    other = PrecomputedShardedStore(str(tmp_path), SMALL)
    assert reader[WARM] == COUNTED[WARM]

    other[WARM] = b"CHUNK 21"  # same size: the shard keeps its size, but not its inode
    counted.counts.reset()
    assert reader[WARM] == b"CHUNK 21"
    assert counted.counts.reads == 3  # the stale index was dropped on its stat, not misused

    other[COLD] = b"a value that moves the chunks after it"
    assert reader[WARM] == b"CHUNK 21" and reader[COLD] == b"a value that moves the chunks after it"
    other.update({i: None for i in COUNTED if _where(SMALL, i)[0] == "1.shard"})
    assert reader.get(WARM) is None and WARM not in reader


def test_cached_minishard_index_sees_tensorstore_rewrite(tmp_path: Path) -> None:
    PrecomputedShardedStore(str(tmp_path), SMALL).update(COUNTED)
    reader = PrecomputedShardedStore(str(tmp_path), SMALL, cache_max_age=3600)
    assert reader[WARM] == COUNTED[WARM]
    kv = _kvstore(tmp_path, SMALL)
    assert _where(SMALL, WARM + 64) == _where(SMALL, WARM)
    for value in (b"ts 21 one", b"ts 21 two", b"ts 21 three: longer"):
        _ts_write(kv, {WARM: value, WARM + 64: b"another chunk in that minishard"})
        assert reader[WARM] == value
    _ts_write(kv, {WARM: None})
    assert reader.get(WARM) is None and reader[COLD] == COUNTED[COLD]


@pytest.mark.parametrize("kind", ["s3", "dict"])
def test_cache_sees_another_instance_rewrite_without_stat(
    kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where versions cannot be checked for free (S3: the cache is trusted for
    cache_max_age, then each range read carries If-Match; in memory: whole shards,
    no cache) a rewrite is still seen at once."""
    if kind == "s3":
        s3 = request.getfixturevalue("s3")
        where: Any = s3.url(f"cache-{uuid.uuid4().hex}")
        options = s3.storage_options
    else:
        where, options = {}, None
    reader = PrecomputedShardedStore(where, SMALL, storage_options=options, cache_max_age=3600)
    other = PrecomputedShardedStore(where, SMALL, storage_options=options)
    other.update(COUNTED)
    assert reader[WARM] == COUNTED[WARM]
    for value in (b"CHUNK 21", b"x", b"a much longer value than before"):
        other[WARM] = value
        assert reader[WARM] == value
    other[COLD] = b"shifts 21"  # an earlier chunk of the same minishard
    assert reader[WARM] == b"a much longer value than before"
    del other[WARM]
    assert reader.get(WARM) is None

    # a chunk added to a cached minishard: an absent id needs no data read to check, so a
    # time-trusted cache sees it once its cache_max_age has passed (in memory: at once)
    clock = later_clock(monkeypatch)
    ageing = PrecomputedShardedStore(where, SMALL, storage_options=options, cache_max_age=60)
    assert ageing.get(WARM + 64) is None
    other[WARM + 64] = b"added"
    if kind == "s3":
        clock.shift += 61
    assert ageing[WARM + 64] == b"added" and reader.get(WARM) is None


async def test_a_read_of_several_shards_retries_only_the_shard_that_changed(tmp_path: Path) -> None:
    """A writer replacing one shard or the other between every index read and data read
    must not starve a read of both: only the changed shard's chunks are read again."""
    sharding = PrecomputedSharding(0, "identity", 2, 1)
    kv = PrecomputedShardedStore(str(tmp_path), sharding)
    ids = list(range(64))
    await kv.update_many({i: b"old" for i in ids})
    shard_of = {i: kv.shard_key(i) for i in ids}
    shards = sorted(set(shard_of.values()))
    assert len(shards) == 2
    writer = PrecomputedShardedStore(str(tmp_path), sharding)
    real = kv.raw.get_many_versioned
    state = {"round": 0, "replaced": 0}

    async def replace_one_shard_before_each_data_read(requests: Any, expected: Any) -> Any:
        # each try: shard index entries (no version expected), minishard indices, data
        state["round"] = 0 if all(e is None for e in expected) else state["round"] + 1
        if state["round"] == 2 and state["replaced"] < 20:  # more than STALE_READS: every try meets one
            victim = shards[state["replaced"] % 2]
            state["replaced"] += 1
            await writer.update_many({i: b"new" for i in ids if shard_of[i] == victim})
        return await real(requests, expected)

    kv.raw.get_many_versioned = replace_one_shard_before_each_data_read  # type: ignore[method-assign]
    values = await kv.get_many(ids)
    assert state["replaced"] >= 2  # both shards changed under the read at least once
    assert all(v in (b"old", b"new") for v in values)
    assert {values[i] for i in ids if shard_of[i] == shards[0]} in ({b"old"}, {b"new"})


async def test_nearby_chunks_of_a_shard_are_read_as_one_range(tmp_path: Path) -> None:
    sharding = PrecomputedSharding(0, "identity", 0, 0)  # one minishard: the chunks lie side by side
    await PrecomputedShardedStore(str(tmp_path), sharding).update_many({i: b"x" * 100 for i in range(500)})
    counted = CountingInner(str(tmp_path))
    kv = PrecomputedShardedStore(counted, sharding)
    assert await kv.get_many(range(500)) == [b"x" * 100] * 500
    assert counted.counts.reads == 3  # shard index entry, minishard index, every chunk in one span
    counted.counts.reset()
    await kv.get_many(range(0, 500, 7))
    assert counted.counts.reads == 1
