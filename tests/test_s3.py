"""Requests on an S3 API (moto_server on 127.0.0.1, one per module: conftest's ``s3``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import fsspec
import fsspec.asyn
import numpy as np
import pytest
import zarr

from shardstore import ShardingStore
from shardstore.reading import reader

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
from shardstore.inner.s3 import CONNECTIONS, s3_storage_options
from shardstore.testing.proxy import server_process
from shardstore.testing.s3 import MOTO_SERVER, LocalS3

from .helpers import later_clock


def _store(s3: LocalS3, path: str, **kwargs: object) -> ShardingStore:
    return ShardingStore(s3.url(path), chunks_per_shard=(4, 4), storage_options=s3.storage_options, **kwargs)


def test_batch_whole_array_write_requests(s3: LocalS3) -> None:
    store = _store(s3, "batch.zarr")
    s3.reset()
    arr = zarr.create_array(store, name="a", shape=(256, 256), chunks=(32, 32), dtype="f4")
    # creating: two metadata PUTs, and the four GETs zarr itself makes on any store to
    # check that nothing exists there yet (a/zarr.json, a/.zarray, zarr.json twice)
    assert s3.counts["PUT"] == 2 and s3.counts["GET"] <= 4 and s3.counts["HEAD"] == 0
    s3.reset()
    with store.batch():
        arr[:] = np.arange(256 * 256, dtype="f4").reshape(256, 256)
    assert dict(s3.counts) == {"PUT": 4}  # one per shard, nothing read
    np.testing.assert_array_equal(arr[:], np.arange(256 * 256).reshape(256, 256))


def test_rewrite_update_is_one_get_and_one_put(s3: LocalS3) -> None:
    store = _store(s3, "update.zarr")
    arr = zarr.create_array(store, name="a", shape=(128, 128), chunks=(32, 32), dtype="f4")
    arr[:] = 1
    for i in range(4):
        s3.reset()
        arr[i * 32 : (i + 1) * 32, 0:32] = i
        assert dict(s3.counts) == {"GET": 1, "PUT": 1}
    assert arr[:, 0].tolist() == [v for v in range(4) for _ in range(32)]


def _written(s3: LocalS3, path: str) -> zarr.Array:
    arr = zarr.create_array(_store(s3, path), name="a", shape=(256, 256), chunks=(32, 32), dtype="f4")
    arr[:] = np.arange(256 * 256, dtype="f4").reshape(256, 256)
    return arr


def test_cold_chunk_read_fetches_its_shard_in_one_get(s3: LocalS3) -> None:
    _written(s3, "cold.zarr")
    # read_strategy="auto": whole shards here; kept an hour, however slow the machine
    arr = zarr.open_array(_store(s3, "cold.zarr", cache_max_age=3600), path="a")
    s3.reset()
    assert arr[40, 40] == 40 * 256 + 40
    assert dict(s3.counts) == {"GET": 1}
    s3.reset()
    assert arr[0:128, 0:128].sum() == np.arange(256 * 256).reshape(256, 256)[0:128, 0:128].sum()
    assert dict(s3.counts) == {}  # the rest of that shard comes from the shard cache


def test_cold_chunk_read_with_chunk_strategy_is_two_ranged_gets(s3: LocalS3) -> None:
    _written(s3, "ranged.zarr")
    arr = zarr.open_array(_store(s3, "ranged.zarr", read_strategy="chunk"), path="a")
    s3.reset()
    assert arr[40, 40] == 40 * 256 + 40
    assert dict(s3.counts) == {"GET": 2}  # index (a suffix range), then the chunk's range
    assert s3.bytes_down < 2 * 32 * 32 * 4


def test_warm_chunk_read_with_a_trusted_index_cache_is_one_get(s3: LocalS3) -> None:
    _written(s3, "warm.zarr")
    arr = zarr.open_array(_store(s3, "warm.zarr", read_strategy="chunk", index_cache="trust"), path="a")
    assert arr[0, 0] == 0
    s3.reset()
    assert arr[40, 40] == 40 * 256 + 40
    assert dict(s3.counts) == {"GET": 1}


@pytest.mark.parametrize("strategy", ["auto", "shard"])
def test_whole_array_read_is_one_get_per_shard(s3: LocalS3, strategy: str) -> None:
    _written(s3, f"whole-{strategy}.zarr")
    s3.reset()
    store = _store(s3, f"whole-{strategy}.zarr", read_strategy=strategy)
    arr = zarr.open_array(store, path="a", zarr_format=3)  # (unasked, zarr also probes v2 names)
    np.testing.assert_array_equal(arr[:], np.arange(256 * 256, dtype="f4").reshape(256, 256))
    assert s3.counts["HEAD"] == 0
    assert s3.counts["GET"] <= 4 + 1  # 4 shards, and the array's metadata


def test_a_store_opened_by_url_has_its_requests_in_flight_together(s3: LocalS3) -> None:
    """A read of 16 shards sends 16 requests at once: all are in flight together
    (botocore keeps 10 connections unless told otherwise: six would wait a round trip)."""
    arr = zarr.create_array(_store(s3, "pool.zarr"), name="a", shape=(512, 512), chunks=(32, 32), dtype="f4")
    arr[:] = 1  # (16 shards of 4 x 4 chunks)
    fresh = zarr.open_array(_store(s3, "pool.zarr", read_strategy="shard"), path="a", zarr_format=3)
    s3.reset()
    s3.latency_s = 0.2  # (each request held long enough for the others to arrive)
    try:
        assert (fresh[:] == 1).all()
    finally:
        s3.latency_s = 0.0
    assert s3.counts["GET"] == 16
    assert s3.most_in_flight > 10


def test_a_shard_write_sends_its_body_without_waiting_for_a_go_ahead(s3: LocalS3) -> None:
    """Each PUT (a shard's, the metadata's) and its body go in one round trip: botocore
    asks for ``Expect: 100-continue`` (a round trip more) on the bytes it turns into a
    file object."""
    s3.reset()
    arr = zarr.create_array(_store(s3, "ahead.zarr"), name="a", shape=(256, 256), chunks=(32, 32), dtype="f4")
    arr[:] = np.arange(256 * 256, dtype="f4").reshape(256, 256)  # new shards: If-None-Match
    arr[:] = 7  # replaced ones: If-Match
    assert s3.counts["PUT"] == 2 + 8  # the metadata (unconditional), the shards twice
    assert s3.continues == 0
    assert (zarr.open_array(_store(s3, "ahead.zarr"), path="a", zarr_format=3)[:] == 7).all()


@pytest.fixture(scope="module")
def https_s3() -> Iterator[str]:
    """moto_server over HTTPS (a certificate of its own) on 127.0.0.1, with a bucket:
    its endpoint. Over HTTPS botocore sends a checksum it computes in a trailer."""
    with server_process(
        lambda port: [*MOTO_SERVER, "-s", "-p", str(port)], "moto_server (https)", timeout_s=30
    ) as port:
        endpoint = f"https://127.0.0.1:{port}"
        _s3fs(endpoint).mkdir("shardstore")
        yield endpoint


def _s3fs(endpoint: str, additional: dict[str, str] | None = None, **config: str) -> Any:
    return fsspec.filesystem(
        "s3",
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": endpoint, "region_name": "eu-west-1", "verify": False},
        config_kwargs=config,
        s3_additional_kwargs=additional or {},
        skip_instance_cache=True,
    )


def _puts_sent(fs: Any, path: str) -> list[tuple[type, dict[str, str]]]:
    """Write an array of 4 shards through ``fs``: each PUT's body type and headers, as sent."""
    sent: list[tuple[type, dict[str, str]]] = []
    fsspec.asyn.sync(fs.loop, fs.set_session)
    fs.s3.meta.events.register(
        "before-send.s3.PutObject",
        lambda request, **_: sent.append((type(request.body), dict(request.headers))),
    )
    store = ShardingStore(fs.get_mapper(f"shardstore/{path}"), chunks_per_shard=(4, 4))
    arr = zarr.create_array(store, name="a", shape=(256, 256), chunks=(32, 32), dtype="f4")
    arr[:] = np.arange(256 * 256, dtype="f4").reshape(256, 256)
    reread = zarr.open_array(
        ShardingStore(fs.get_mapper(f"shardstore/{path}"), (4, 4)), path="a", zarr_format=3
    )
    np.testing.assert_array_equal(reread[:], np.arange(256 * 256).reshape(256, 256))
    return sent


def test_over_https_a_put_sends_its_body_whole_with_its_checksum_in_a_header(https_s3: str) -> None:
    """(Not in a trailer, the body streamed in chunks as a file, as botocore sends a
    checksum it computes itself over HTTPS.)"""
    sent = _puts_sent(_s3fs(https_s3), "https.zarr")
    assert len(sent) == 2 + 4  # the metadata, the shards
    for body, headers in sent:
        assert body is bytearray
        assert "Transfer-Encoding" not in headers and "Expect" not in headers
        assert "x-amz-checksum-crc32" in headers


def test_a_client_that_computes_checksums_only_when_required_gets_none(https_s3: str) -> None:
    """(Some S3-compatible stores refuse them: users set ``when_required`` for those.)"""
    fs = _s3fs(https_s3, request_checksum_calculation="when_required")
    sent = _puts_sent(fs, "when-required.zarr")
    assert len(sent) == 2 + 4
    for body, headers in sent:
        assert body is bytearray
        assert not any(name.lower().startswith("x-amz-checksum") for name in headers)


def test_a_checksum_algorithm_the_user_names_is_the_one_sent(https_s3: str) -> None:
    """(``s3_additional_kwargs={"ChecksumAlgorithm": ...}``: botocore computes that one,
    and no CRC32 of ours goes beside it.)"""
    fs = _s3fs(https_s3, {"ChecksumAlgorithm": "SHA256"})
    sent = _puts_sent(fs, "sha256.zarr")
    assert len(sent) == 2 + 4
    for _, headers in sent:
        named = {
            name.lower(): (v.decode() if isinstance(v, bytes) else v).lower() for name, v in headers.items()
        }
        assert "x-amz-checksum-crc32" not in named
        assert "x-amz-checksum-sha256" in named or "sha256" in named.get("x-amz-trailer", "")


def test_a_first_write_into_a_bucket_not_there_makes_it_as_s3fs_does(s3: LocalS3) -> None:
    """(s3fs makes a bucket where the region allows: not us-east-1, which takes no
    location constraint.)"""
    options = {
        **s3.storage_options,
        "client_kwargs": {"endpoint_url": s3.endpoint_url, "region_name": "eu-west-1"},
    }
    store = ShardingStore("s3://made-on-write/arr.zarr", (4, 4), storage_options=options)
    arr = zarr.create_array(store, name="a", shape=(64, 64), chunks=(32, 32), dtype="f4")
    arr[:] = 3
    assert (zarr.open_array(store, path="a", zarr_format=3)[:] == 3).all()


def test_s3_storage_options_keep_a_pool_size_the_user_set() -> None:
    ours = s3_storage_options("s3://bucket/a.zarr", {"anon": True})
    assert ours == {"anon": True, "config_kwargs": {"max_pool_connections": CONNECTIONS}}
    mine = {"config_kwargs": {"max_pool_connections": 4, "connect_timeout": 9}}
    assert s3_storage_options("s3://bucket/a.zarr", mine) == mine
    assert s3_storage_options("gs://bucket/a.zarr", {"token": "anon"}) == {"token": "anon"}


def test_listing_and_erasing_on_s3(s3: LocalS3) -> None:
    store = _store(s3, "list.zarr")
    arr = zarr.create_array(store, name="a", shape=(128, 128), chunks=(32, 32), dtype="u1")
    arr[0:32, 0:32] = 1
    arr[96:, 96:] = 2

    async def listing() -> list[str]:
        return sorted([k async for k in store.list_prefix("a/c/")])

    keys = asyncio.run(listing())
    assert keys == ["a/c/0/0", "a/c/3/3"]
    asyncio.run(store.delete_dir("a"))
    assert asyncio.run(listing()) == []


def test_a_shard_url_over_s3(s3: LocalS3) -> None:
    url = f"shard::{s3.url('proto.zarr')}"
    options = {"s3": s3.storage_options, "shard": {"chunks_per_shard": [4, 4]}}
    arr = zarr.create_array(
        url, name="a", shape=(128, 128), chunks=(32, 32), dtype="f4", storage_options=options
    )
    arr[:] = np.arange(128 * 128, dtype="f4").reshape(128, 128)
    s3.reset()
    back = zarr.open_array(url, path="a", mode="r", storage_options={"s3": s3.storage_options}, zarr_format=3)
    np.testing.assert_array_equal(back[:], np.arange(128 * 128).reshape(128, 128))
    assert s3.paths["GET /shardstore/proto.zarr/a/c/0/0"] == 1  # one shard object, read once
    assert s3.counts["HEAD"] == 0 and s3.counts["GET"] <= 1 + 1


def test_revalidate_sees_other_writers_at_once_without_downloading_again(s3: LocalS3) -> None:
    """``index_cache="revalidate"``: every read of a cached shard is a conditional GET on
    its ETag; 304 reuses the cached bytes, a changed shard comes back whole."""
    writer = _store(s3, "revalidate.zarr")
    arr = zarr.create_array(writer, name="a", shape=(128, 128), chunks=(32, 32), dtype="f4")
    arr[:] = 1
    reader = zarr.open_array(
        ShardingStore(
            s3.url("revalidate.zarr"), storage_options=s3.storage_options, index_cache="revalidate"
        ),
        path="a",
    )
    assert reader[0, 0] == 1
    s3.reset()
    assert reader[1, 1] == 1
    assert dict(s3.counts) == {"GET": 1} and s3.bytes_down == 0  # 304: nothing downloaded again
    arr[:32, :32] = 2  # another store changes the shard
    s3.reset()
    assert reader[0, 0] == 2  # seen at once, not after cache_max_age
    assert dict(s3.counts) == {"GET": 1} and s3.bytes_down > 0


CHUNK_BYTES = 256 * 512 * 4  # 512 KiB chunks, 16 to an 8 MiB shard


def _large_shards(s3: LocalS3, path: str) -> tuple[zarr.Array, np.ndarray]:
    """An array of one uncompressed 8 MiB shard (4 x 4 chunks of 512 KiB)."""
    data = np.arange(1024 * 2048, dtype="f4").reshape(1024, 2048)
    arr = zarr.create_array(
        _store(s3, path), name="a", shape=data.shape, chunks=(256, 512), dtype="f4", compressors=None
    )
    with arr.store.batch():
        arr[:] = data
    return arr, data


def test_a_cold_chunk_of_a_large_shard_moves_its_index_and_itself(s3: LocalS3) -> None:
    _, data = _large_shards(s3, "large-cold.zarr")
    arr = zarr.open_array(_store(s3, "large-cold.zarr"), path="a", zarr_format=3)
    s3.reset()
    assert arr[300, 700] == data[300, 700]
    assert dict(s3.counts) == {"GET": 2}  # the index, then the chunk
    assert CHUNK_BYTES <= s3.bytes_down < CHUNK_BYTES + 4096  # not the 8 MiB shard
    s3.reset()
    assert arr[900, 1900] == data[900, 1900]  # another chunk: the index is cached
    assert dict(s3.counts) == {"GET": 1} and s3.bytes_down < CHUNK_BYTES + 4096


def test_whole_shard_bytes_sets_the_budget_for_whole_fetches(s3: LocalS3) -> None:
    _, data = _large_shards(s3, "large-budget.zarr")
    arr = zarr.open_array(_store(s3, "large-budget.zarr", whole_shard_bytes=16 * 2**20), path="a")
    s3.reset()
    assert arr[300, 700] == data[300, 700]
    assert dict(s3.counts) == {"GET": 1} and s3.bytes_down > 8 * 2**20  # one GET, the whole shard
    small = _written(s3, "small-budget.zarr")
    del small
    arr = zarr.open_array(_store(s3, "small-budget.zarr", whole_shard_bytes=0), path="a", zarr_format=3)
    s3.reset()
    assert arr[40, 40] == 40 * 256 + 40
    assert dict(s3.counts) == {"GET": 2}  # a zero budget: index and range even for 64 KiB shards


def test_a_cached_s3_index_never_serves_another_writers_old_bytes(
    s3: LocalS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Present chunks are read with If-Match on the ETag their index came with: a shard
    another store replaced is re-indexed at once. A chunk another store added is seen
    once the cached index is older than cache_max_age; one it deleted at once."""
    writer, data = _large_shards(s3, "large-stale.zarr")
    clock = later_clock(monkeypatch)
    reader = zarr.open_array(_store(s3, "large-stale.zarr", cache_max_age=60), path="a", zarr_format=3)
    assert reader[0, 0] == data[0, 0]
    writer[0:256, 0:512] = -1  # replaced: the reader's cached index is stale
    s3.reset()
    assert reader[0, 0] == -1
    assert s3.counts["GET"] == 3  # refused by If-Match (412), the index again, the chunk
    writer[0:256, 0:512] = 0  # the fill value: the chunk leaves the shard
    assert reader[0, 0] == 0
    reader[0, 1]  # (the reader now knows the chunk is absent)
    writer[0:256, 0:512] = 5  # added back by another store
    clock.shift += 61
    assert reader[0, 0] == 5  # "absent" from a cached index older than max_age is checked
    erase = ShardingStore(s3.url("large-stale.zarr"), storage_options=s3.storage_options)
    asyncio.run(erase.erase_prefix("a/c/"))
    assert reader[300, 700] == 0  # a deleted shard is absent, not damaged


def test_a_small_shard_read_again_and_again_is_fetched_whole_again(
    s3: LocalS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "REPEAT_WINDOW", 3600.0)  # "again and again" however slow the machine
    _written(s3, "again.zarr")  # 64 KiB shards
    arr = zarr.open_array(_store(s3, "again.zarr", cache_max_age=0), path="a", zarr_format=3)
    moved = []
    for i in range(3):
        s3.reset()
        assert arr[i, 0] == i * 256
        assert dict(s3.counts) == {"GET": 1}
        moved.append(s3.bytes_down)
    # first read: the whole shard; then a range located by the cached index; the
    # third read within a second: the whole shard again, for the reads to come
    assert moved[0] > 32 * 32 * 4 * 8 and moved[1] <= 32 * 32 * 4 and moved[2] == moved[0]


def test_a_whole_read_decodes_each_shard_on_a_worker_thread_as_it_comes(
    s3: LocalS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big shards read whole from S3 are each decoded into place as their response comes,
    off zarr's loop, with the same requests: one GET a shard."""
    import threading

    import shardstore.pipeline

    _written(s3, "as-they-come.zarr")
    monkeypatch.setattr(shardstore.pipeline, "PLACED_AS_READ_FROM", 0)  # (64 KiB shards here)
    placing, threads = shardstore.pipeline.scatter_shards, set()

    def place(*args: Any, **kwargs: Any) -> None:
        threads.add(threading.current_thread().name)
        placing(*args, **kwargs)

    monkeypatch.setattr(shardstore.pipeline, "scatter_shards", place)
    arr = zarr.open_array(_store(s3, "as-they-come.zarr"), path="a", zarr_format=3)
    s3.reset()
    np.testing.assert_array_equal(arr[:], np.arange(256 * 256, dtype="f4").reshape(256, 256))
    assert s3.counts["GET"] == 4
    assert threads and all(name.startswith("asyncio") for name in threads)  # (the loop's executor)


def test_an_s3_store_whose_subclass_changes_reads_does_not_say_it_hands_values_as_read(s3: LocalS3) -> None:
    """Its reads hand values on after the batch (through the subclass's reads): the
    pipeline then decodes big shards a group at a time, off zarr's loop."""
    import s3fs

    from shardstore.inner.s3 import S3Inner

    class Delayed(S3Inner):
        async def get_many_versioned(self, requests: Any, expected: Any) -> Any:
            return await super().get_many_versioned(requests, expected)

    fs = s3fs.S3FileSystem(**s3.storage_options)
    assert S3Inner(fs, "shardstore/x").capabilities.hands_as_read
    assert not Delayed(fs, "shardstore/x").capabilities.hands_as_read
    assert Delayed(fs, "shardstore/x").capabilities.conditional_writes


def test_conditional_creates_of_one_object_racing_through_the_proxy_let_exactly_one_in(s3: LocalS3) -> None:
    """As S3 does: of writes racing to create one object (``If-None-Match: *``), one
    lands and the others are refused. moto alone checks and then writes; the proxy
    hands it one change of an object at a time."""
    import http.client
    import threading
    import uuid

    host, port = s3.endpoint_url.removeprefix("http://").split(":")
    key, n = f"/{s3.bucket}/race-{uuid.uuid4().hex}", 12
    gate, statuses = threading.Barrier(n, timeout=30), []

    def create(i: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        gate.wait()
        conn.request("PUT", key, body=b"%02d" % i, headers={"If-None-Match": "*"})
        response = conn.getresponse()
        response.read()
        statuses.append(response.status)
        conn.close()

    threads = [threading.Thread(target=create, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(statuses) == n and statuses.count(200) == 1  # (the others refused: moto says 403)


def test_a_proxy_in_its_own_process_counts_requests_and_bytes_and_adds_its_latency() -> None:
    """The benchmarks' proxy (:func:`~shardstore.testing.s3.apart_s3`) counts what
    the one in the client's process counts, takes the latency set here, and ends
    with its block."""
    import multiprocessing
    import time

    from shardstore.testing.s3 import apart_s3

    with apart_s3(bucket="apart") as s3:
        fs = fsspec.filesystem("s3", **s3.storage_options, skip_instance_cache=True)
        fs.pipe_file(s3.url("x"), b"abcd" * 100)  # one PUT (no go-ahead asked for 400 bytes)
        assert (s3.requests, s3.bytes_up) == (1, 400)
        s3.reset()
        assert fs.cat_file(s3.url("x"), start=0) == b"abcd" * 100  # one ranged GET
        assert (s3.requests, s3.bytes_up, s3.bytes_down) == (1, 0, 400)
        s3.latency_s = 0.25
        began = time.monotonic()
        fs.cat_file(s3.url("x"), start=0)
        assert time.monotonic() - began >= 0.25  # (a lower bound: a sleep is never shorter)
        assert s3.requests == 2
        (proxy,) = [p for p in multiprocessing.active_children() if p.name == "proxy"]
    proxy.join(10)
    assert not proxy.is_alive()
