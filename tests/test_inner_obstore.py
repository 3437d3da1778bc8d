"""ObstoreInner (obstore, Rust object_store) on an S3 API: moto_server on 127.0.0.1,
started and stopped here, behind the counting proxy."""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from shardstore import ShardingStore
from shardstore.errors import InnerStoreError
from shardstore.inner.base import ANY_VERSION, NOT_MODIFIED, STALE

pytest.importorskip("moto.server")
obstore = pytest.importorskip("obstore")
from shardstore.inner import ObstoreInner  # noqa: E402
from shardstore.testing.s3 import LocalS3, local_s3  # noqa: E402

from .processes import Writers  # noqa: E402


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalS3]:
    with local_s3() as server:
        yield server


def _inner(s3: LocalS3, path: str) -> ObstoreInner:
    return ObstoreInner.from_url(s3.url(path), s3.storage_options)


def _store(s3: LocalS3, path: str, **kwargs: Any) -> ShardingStore:
    return ShardingStore(_inner(s3, path), chunks_per_shard=(4, 4), **kwargs)


def test_from_url_translates_s3fs_storage_options(s3: LocalS3) -> None:
    inner = _inner(s3, "where/is.zarr")
    config: Any = inner.store.config
    assert config["endpoint"] == s3.endpoint_url and config["region"] == "us-east-1"
    assert config["access_key_id"] == "testing" and config["virtual_hosted_style_request"] in (False, "false")
    assert str((inner.store.client_options or {}).get("allow_http")).lower() == "true"
    assert repr(inner) == "ObstoreInner(s3://shardstore/where/is.zarr)"
    assert inner.lock_scope == _inner(s3, "where/is.zarr").lock_scope != _inner(s3, "other").lock_scope
    assert inner == pickle.loads(pickle.dumps(inner))
    assert pickle.loads(pickle.dumps(inner)).store is inner.store is _inner(s3, "where/is.zarr").store
    caps = inner.capabilities
    assert caps.remote and caps.versioned_ranges and caps.conditional_writes and not caps.append


def test_zarr_round_trip(s3: LocalS3) -> None:
    data = np.arange(256 * 256, dtype="f4").reshape(256, 256)
    store = _store(s3, "round.zarr")
    arr = zarr.create_array(store, name="a", shape=(256, 256), chunks=(32, 32), dtype="f4")
    s3.reset()
    with store.batch():
        arr[:] = data
    assert dict(s3.counts) == {"PUT": 4}  # one per shard, nothing read
    s3.reset()
    arr[32:64, 0:32] = -1  # one chunk: one read-modify-write of its shard
    assert dict(s3.counts) == {"GET": 1, "PUT": 1}
    data[32:64, 0:32] = -1
    for strategy in ("auto", "chunk", "shard"):
        back = zarr.open_array(_store(s3, "round.zarr", read_strategy=strategy), path="a", zarr_format=3)
        np.testing.assert_array_equal(back[:], data)
    cold = zarr.open_array(pickle.loads(pickle.dumps(_store(s3, "round.zarr"))), path="a", zarr_format=3)
    s3.reset()
    assert cold[100, 100] == data[100, 100]
    assert dict(s3.counts) == {"GET": 1}  # the whole shard, in one GET

    async def listing() -> list[str]:
        return sorted([k async for k in store.list_prefix("a/c/")])

    assert len(asyncio.run(listing())) == 64
    asyncio.run(store.delete_dir("a"))
    assert asyncio.run(listing()) == []


def test_ranged_reads(s3: LocalS3) -> None:
    inner = _inner(s3, "ranges")

    async def run() -> None:
        await inner.set("k", b"0123456789")
        await inner.set("empty", b"")
        cases = [
            (None, b"0123456789"),
            (RangeByteRequest(2, 5), b"234"),
            (RangeByteRequest(8, 20), b"89"),
            (RangeByteRequest(5, 5), b""),
            (RangeByteRequest(10, 12), b""),  # past the end: nothing, as files and zarr's stores
            (RangeByteRequest(20, 30), b""),
            (OffsetByteRequest(3), b"3456789"),
            (OffsetByteRequest(10), b""),
            (SuffixByteRequest(4), b"6789"),
            (SuffixByteRequest(40), b"0123456789"),
        ]
        for request, expected in cases:
            assert await inner.get("k", request) == expected, request
        for request in (None, RangeByteRequest(0, 5), OffsetByteRequest(0), SuffixByteRequest(4)):
            assert await inner.get("empty", request) == b"", request
        assert await inner.get("missing") is None
        assert await inner.get("missing", RangeByteRequest(0, 4)) is None
        requests = [("k", r) for r, _ in cases] + [("missing", None)]
        assert await inner.get_many(requests) == [*(v for _, v in cases), None]
        assert await inner.getsize("k") == 10 and await inner.getsize("missing") is None
        assert await inner.exists("k") and not await inner.exists("missing")

    asyncio.run(run())


def test_if_match_reads_are_stale_after_a_replacement(s3: LocalS3) -> None:
    inner = _inner(s3, "stale")

    async def run() -> None:
        await inner.set("k", b"first version")
        [(value, etag)] = await inner.get_many_versioned([("k", None)], [None])
        assert value == b"first version" and isinstance(etag, tuple) and etag[0]  # (ETag, version)
        got = await inner.get_many_versioned([("k", RangeByteRequest(0, 5))], [etag])
        assert got == [(b"first", etag)]
        await inner.set("k", b"second version")
        s3.reset()
        got = await inner.get_many_versioned([("k", RangeByteRequest(0, 5)), ("nope", None)], [etag, None])
        assert got[0][0] is STALE and got[1] == (None, None)
        assert s3.counts["GET"] == 2 and s3.bytes_down < 1000  # refused (412): nothing read
        assert (await inner.get_many_versioned([("nope", None)], ["whatever"])) == [(None, None)]

    asyncio.run(run())


def test_if_none_match_reads_are_not_modified(s3: LocalS3) -> None:
    inner = _inner(s3, "revalidate")

    async def run() -> None:
        await inner.set("k", b"x" * 1000)
        value, etag = await inner.read_for_update("k")
        assert value == b"x" * 1000 and etag is not None
        s3.reset()
        [(back, tag)] = await inner.get_many_if_modified([("k", etag)])
        assert back is NOT_MODIFIED and tag == etag
        assert dict(s3.counts) == {"GET": 1} and s3.bytes_down == 0  # 304
        await inner.set("k", b"y" * 1000)
        [(back, tag)] = await inner.get_many_if_modified([("k", etag)])
        assert back == b"y" * 1000 and tag not in (etag, None)

    asyncio.run(run())


def test_revalidating_store_sees_other_writers(s3: LocalS3) -> None:
    writer = _store(s3, "reval.zarr")
    arr = zarr.create_array(writer, name="a", shape=(64, 64), chunks=(16, 16), dtype="f4")
    arr[:] = 1
    reader = zarr.open_array(_store(s3, "reval.zarr", index_cache="revalidate"), path="a")
    assert reader[0, 0] == 1
    s3.reset()
    assert reader[1, 1] == 1
    assert dict(s3.counts) == {"GET": 1} and s3.bytes_down == 0
    arr[:16, :16] = 2
    assert reader[0, 0] == 2


def test_conditional_writes(s3: LocalS3) -> None:
    inner = _inner(s3, "cond")

    async def run() -> None:
        assert await inner.write_if("k", b"one", None)  # create
        assert not await inner.write_if("k", b"again", None)  # exists now
        _, v1 = await inner.read_for_update("k")
        assert await inner.write_if("k", b"two", v1)
        assert not await inner.write_if("k", b"stale", v1)  # an old ETag: refused
        assert await inner.get("k") == b"two"
        assert await inner.write_if("k", b"three", ANY_VERSION)
        assert not await inner.write_if("k", None, v1)  # a delete at an old version: refused
        value, v3 = await inner.read_for_update("k")
        assert value == b"three"
        assert await inner.write_if("k", None, v3)
        assert await inner.get("k") is None
        assert not await inner.write_if("k", b"four", v3)  # deleted since: look again
        assert await inner.write_if("k", None, None)  # absent, as read: nothing to do
        await inner.delete("k")  # a missing key is fine
        await inner.delete("never")

    asyncio.run(run())


def test_a_write_behind_our_back_is_re_read_and_retried(s3: LocalS3) -> None:
    inner = _inner(s3, "behind")
    other = _inner(s3, "behind").store
    seen: list[bytes | None] = []

    def change(old: bytes | None) -> bytes:
        seen.append(old)
        if len(seen) == 1:  # another process writes between our read and our write
            obstore.put(other, "k", b"theirs")
        return (old or b"") + b"+ours"

    async def run() -> bytes | None:
        await inner.set("k", b"base")
        s3.reset()
        await inner.update("k", change)
        assert dict(s3.counts) == {"GET": 2, "PUT": 3}  # ours refused (412), theirs, ours again
        return await inner.get("k")

    assert asyncio.run(run()) == b"theirs+ours"
    assert seen == [b"base", b"theirs"]


class _OwnLock(ObstoreInner):
    """An instance that shares no process lock with the others: only the store's
    conditional writes order them, as between processes."""

    @property
    def lock_scope(self) -> Hashable:
        return id(self)


def test_concurrent_updates_never_lose_one(s3: LocalS3) -> None:
    shared = _inner(s3, "many")
    url, options = s3.url("many"), s3.storage_options
    separate = [_OwnLock(ObstoreInner.from_url(url, options).store) for _ in range(6)]

    def adding(token: bytes) -> Any:
        return lambda old: b"" if old is None else old + token + b";"

    async def run() -> set[bytes]:
        await shared.set("k", b"")
        await asyncio.gather(
            *(shared.update("k", adding(b"s%d" % i)) for i in range(6)),
            *(inner.update("k", adding(b"o%d" % i), attempts=100) for i, inner in enumerate(separate)),
        )
        value = await shared.get("k")
        assert value is not None
        return set(value.split(b";")) - {b""}

    assert asyncio.run(run()) == {b"s%d" % i for i in range(6)} | {b"o%d" % i for i in range(6)}


def test_listings(s3: LocalS3) -> None:
    inner = _inner(s3, "listing")

    async def run() -> None:
        for key in ("zarr.json", "a/zarr.json", "a/c/0/0", "a/c/1/0", "ab/x", "b/c"):
            await inner.set(key, b"1")
        assert sorted([k async for k in inner.list_prefix("")]) == [
            "a/c/0/0",
            "a/c/1/0",
            "a/zarr.json",
            "ab/x",
            "b/c",
            "zarr.json",
        ]
        assert sorted([k async for k in inner.list_prefix("a/")]) == ["a/c/0/0", "a/c/1/0", "a/zarr.json"]
        assert sorted([k async for k in inner.list_prefix("a")]) == [
            "a/c/0/0",
            "a/c/1/0",
            "a/zarr.json",
            "ab/x",
        ]
        assert [k async for k in inner.list_prefix("a/c/1")] == ["a/c/1/0"]
        assert [k async for k in inner.list_prefix("nothing/")] == []
        assert [k async for k in inner.list_dir("")] == ["a", "ab", "b", "zarr.json"]
        assert [k async for k in inner.list_dir("a/")] == ["c", "zarr.json"]
        assert [k async for k in inner.list_dir("a/c/")] == ["0", "1"]
        assert [k async for k in inner.list_dir("nothing/")] == []

    asyncio.run(run())


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port that refuses connections for the whole test: bound, never listened on,
    so that no server another test starts meanwhile can take it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def test_errors_name_the_key(s3: LocalS3, closed_port: int) -> None:
    from obstore.store import S3Store

    unreachable = ObstoreInner(
        S3Store(
            "bucket",
            endpoint=f"http://127.0.0.1:{closed_port}",
            region="us-east-1",
            skip_signature=True,
            client_options={"allow_http": True},
            retry_config={"max_retries": 0},
        )
    )
    no_bucket = ObstoreInner.from_url("s3://no-such-bucket/x", s3.storage_options)
    with pytest.raises(InnerStoreError, match=r"read 'a/c/0/0'"):
        asyncio.run(unreachable.get("a/c/0/0"))
    with pytest.raises(InnerStoreError, match=r"read 'a/c/0/1'"):
        asyncio.run(unreachable.get_many([("a/c/0/1", RangeByteRequest(0, 4))]))
    with pytest.raises(InnerStoreError, match=r"size 'k'"):
        asyncio.run(unreachable.getsize("k"))
    with pytest.raises(InnerStoreError, match=r"write 'a/c/1/1'"):
        asyncio.run(no_bucket.set("a/c/1/1", b"x"))
    with pytest.raises(InnerStoreError, match=r"write 'a/zarr.json'"):
        asyncio.run(no_bucket.write_if("a/zarr.json", b"x", None))

    async def listing() -> list[str]:
        return [k async for k in unreachable.list_prefix("a/")]

    with pytest.raises(InnerStoreError, match=r"list 'a/'"):
        asyncio.run(listing())
    arr_store = ShardingStore(unreachable, chunks_per_shard=(2, 2))
    with pytest.raises(InnerStoreError, match=r"'a/zarr.json'"):
        zarr.open_array(arr_store, path="a", zarr_format=3)


# -- several processes writing the same shards -------------------------------------------------

GRID, CHUNK, WRITERS = 8, 4, 4


def _mine(w: int) -> list[tuple[int, int]]:
    return [(r, c) for r in range(GRID) for c in range(GRID) if (r * 3 + c) % WRITERS == w]


def _value(r: int, c: int, final: bool) -> int:
    return (r * GRID + c + 1) * (1 if final else -1)


def _writer(url: str, options: dict[str, Any], w: int, start: Any) -> None:
    arr = zarr.open_array(ShardingStore(ObstoreInner.from_url(url, options)), path="a")
    start.wait()
    for final in (False, True):
        for r, c in _mine(w):
            arr[r * CHUNK : (r + 1) * CHUNK, c * CHUNK : (c + 1) * CHUNK] = _value(r, c, final)


def test_processes_writing_the_same_shards_lose_nothing(writers: Writers, s3: LocalS3) -> None:
    """4 spawned processes each own some chunks of every shard and write them twice;
    only the store's conditional writes order them (as s3fs's in test_several_writers)."""
    url = s3.url("race.zarr")
    store = ShardingStore(ObstoreInner.from_url(url, s3.storage_options), chunks_per_shard=(4, 4))
    zarr.create_array(store, name="a", shape=(GRID * CHUNK,) * 2, chunks=(CHUNK, CHUNK), dtype="i4")
    writers.together([(_writer, (url, s3.storage_options, w)) for w in range(WRITERS)])
    got = zarr.open_array(ShardingStore(ObstoreInner.from_url(url, s3.storage_options)), path="a")[:]
    blocks = got.reshape(GRID, CHUNK, GRID, CHUNK).transpose(0, 2, 1, 3)
    expected = np.array([[_value(r, c, True) for c in range(GRID)] for r in range(GRID)])
    lost = int((~(blocks == expected[:, :, None, None]).all(axis=(2, 3))).sum())
    assert lost == 0, f"{lost} chunks lost or stale"


def test_an_update_emptying_a_shard_keeps_it_empty_rather_than_deleting_unchecked(
    s3: LocalS3,
) -> None:
    """obstore cannot delete conditionally: the emptied shard stays, as an index of empty
    entries (a conditional PUT), so a concurrent writer's update cannot be deleted."""
    inner = _inner(s3, "emptied")
    store = ShardingStore(inner, (2, 2))
    arr = zarr.create_array(store, name="a", shape=(4, 4), chunks=(2, 2), dtype="i4", fill_value=0)
    arr[:] = 1
    arr[:] = 0
    assert asyncio.run(inner.get("a/c/0/0")) == bytes(2 * 2 * 16 * [255])
    assert arr[:].sum() == 0
