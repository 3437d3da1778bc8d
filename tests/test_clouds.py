"""Google Cloud Storage and Azure Blob: the guarantees S3 has, against local emulators.

GCS runs on gcp-storage-emulator behind a proxy that enforces GCS's generation
preconditions (the emulator ignores them: the first test shows it), Azure on
azurite, which honours its conditions itself (the second test shows it). Both
are started here on 127.0.0.1 and stopped by PID (azurite installed by npm on
first use). Every test names its cloud: ``-k gcs`` or ``-k azure`` picks them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zarr

from shardstore import ShardingStore
from shardstore.errors import ShardConflictError
from shardstore.inner import AzureInner, GCSInner, adapt
from shardstore.testing.azure import LocalAzure, local_azure
from shardstore.testing.gcs import LocalGCS, local_gcs

from .processes import Writers
from .test_several_writers import CPS, _race


@pytest.fixture(scope="module")
def gcs() -> Iterator[LocalGCS]:
    with local_gcs() as server:
        yield server


@pytest.fixture(scope="module")
def azure() -> Iterator[LocalAzure]:
    with local_azure() as server:
        yield server


def _gcs_upload(gcs: LocalGCS, name: str, body: bytes, **conditions: str) -> int:
    """A plain JSON API upload of another writer (a client of its own): its status."""
    query = "&".join(f"{k}={v}" for k, v in {"uploadType": "media", "name": name, **conditions}.items())
    request = urllib.request.Request(
        f"{gcs.endpoint_url}/upload/storage/v1/b/{gcs.bucket}/o?{query}", data=body, method="POST"
    )
    try:
        with urllib.request.urlopen(request) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _azure_upload(azure: LocalAzure, name: str, body: bytes) -> None:
    from azure.storage.blob import BlobServiceClient

    with BlobServiceClient.from_connection_string(azure.connection_string) as service:
        service.get_blob_client(azure.container, name).upload_blob(body, overwrite=True)


# -- what each emulator does by itself -----------------------------------------------------


def test_gcs_emulator_alone_ignores_preconditions(gcs: LocalGCS) -> None:
    """Why GCS runs behind the proxy: the emulator writes whatever the condition says."""
    gcs.enforce = False
    try:
        assert _gcs_upload(gcs, "plain/k", b"one") == 200
        assert _gcs_upload(gcs, "plain/k", b"two", ifGenerationMatch="1") == 200  # GCS: 412
        assert _gcs_upload(gcs, "plain/k", b"three", ifGenerationMatch="0") == 200  # GCS: 412
    finally:
        gcs.enforce = True
    assert _gcs_upload(gcs, "plain/k", b"four", ifGenerationMatch="1") == 412  # the proxy as GCS
    assert _gcs_upload(gcs, "plain/k", b"five", ifGenerationMatch="0") == 412


def test_azure_emulator_honours_conditions(azure: LocalAzure) -> None:
    from azure.core import MatchConditions
    from azure.core.exceptions import ResourceExistsError, ResourceModifiedError
    from azure.storage.blob import BlobServiceClient

    with BlobServiceClient.from_connection_string(azure.connection_string) as service:
        blob = service.get_blob_client(azure.container, "plain/k")
        first = blob.upload_blob(b"one", overwrite=True)["etag"]
        blob.upload_blob(b"two", overwrite=True)
        with pytest.raises(ResourceModifiedError):  # If-Match on a stale ETag: 412
            blob.upload_blob(b"x", overwrite=True, etag=first, match_condition=MatchConditions.IfNotModified)
        with pytest.raises(ResourceExistsError):  # If-None-Match: * on an existing blob: 409
            blob.upload_blob(b"x", overwrite=False)
        with pytest.raises(ResourceModifiedError):  # a range read on a stale ETag
            blob.download_blob(offset=0, length=1, etag=first, match_condition=MatchConditions.IfNotModified)
        with pytest.raises(ResourceModifiedError):  # a delete on a stale ETag
            blob.delete_blob(etag=first, match_condition=MatchConditions.IfNotModified)
        assert blob.download_blob().readall() == b"two"


# -- the adapters --------------------------------------------------------------------------

Cloud = tuple[Any, Callable[[str, bytes], Any]]


@pytest.fixture(params=["gcs", "azure"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    """(server, another writer's plain upload of key -> bytes) for each cloud."""
    if request.param == "gcs":
        server: Any = request.getfixturevalue("gcs")
        return server, lambda key, body: _gcs_upload(server, key, body)
    server = request.getfixturevalue("azure")
    return server, lambda key, body: _azure_upload(server, key, body)


def test_urls_of_gcs_and_azure_get_their_conditional_adapters(gcs: LocalGCS, azure: LocalAzure) -> None:
    for url in (gcs.url("a"), f"gcs://{gcs.bucket}/a"):
        inner = adapt(url, gcs.storage_options)
        assert isinstance(inner, GCSInner)
        assert inner.capabilities.conditional_writes and inner.capabilities.conditional_deletes
    for url in (azure.url("a"), f"abfs://{azure.container}/a"):
        inner = adapt(url, azure.storage_options)
        assert isinstance(inner, AzureInner)
        assert inner.capabilities.conditional_writes and inner.capabilities.versioned_ranges


def _update_overtaken(inner: Any, theirs: Callable[[], Any]) -> tuple[bytes | None, list[bytes | None]]:
    """``inner.update`` of "k" (first "base") with ``theirs`` written between its first read
    and its write: what "k" holds after, and what the update read each time."""
    seen: list[bytes | None] = []

    def change(old: bytes | None) -> bytes:
        seen.append(old)
        if len(seen) == 1:  # another process writes between our read and our write
            theirs()
        return (old or b"") + b"+ours"

    async def run() -> bytes | None:
        await inner.set("k", b"base")
        await inner.update("k", change)
        return await inner.get("k")

    return asyncio.run(run()), seen


def test_gcs_and_azure_a_failed_precondition_is_re_read_and_retried(cloud: Cloud) -> None:
    server, upload = cloud
    inner = adapt(server.url("cond"), server.storage_options)
    got, seen = _update_overtaken(inner, lambda: upload("cond/k", b"theirs"))
    assert got == b"theirs+ours"
    assert seen == [b"base", b"theirs"]  # re-read after the refused write


def test_azure_a_suffix_is_cut_from_the_version_its_size_was_taken_of(
    azure: LocalAzure, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Azure ranges have a start, so a suffix (a shard's index) is two requests: the
    blob's size, then its bytes from there. A blob replaced in between was cut at the
    old size's offset (bytes from the middle of a shard read as its index); the
    bytes are now read only from the version measured, measured again if it changed."""
    import shardstore.inner.azure as azure_adapter

    inner = adapt(azure.url("suffix"), azure.storage_options)
    asyncio.run(inner.set("k", b"0123456789"))
    measured = azure_adapter._limits
    sizes: list[Any] = []

    async def replaced_once_measured(blob: Any, byte_range: Any, condition: dict[str, Any]) -> Any:
        limits = await measured(blob, byte_range, condition)
        sizes.append(limits[:2])
        if len(sizes) == 1:  # another writer replaces it, longer, before its bytes are read
            _azure_upload(azure, "suffix/k", b"abcdefghijklmnopqrst")
        return limits

    monkeypatch.setattr(azure_adapter, "_limits", replaced_once_measured)
    assert asyncio.run(inner.get("k", zarr.abc.store.SuffixByteRequest(4))) == b"qrst"
    assert sizes == [(6, 4), (16, 4)]


def test_gcs_and_azure_a_new_object_is_written_only_if_still_absent(cloud: Cloud) -> None:
    server, upload = cloud
    inner = adapt(server.url("fresh"), server.storage_options)
    calls: list[bytes | None] = []

    def change(old: bytes | None) -> bytes:
        calls.append(old)
        if len(calls) == 1:
            upload("fresh/k", b"first")
        return (old or b"") + b"+second"

    asyncio.run(inner.update("k", change))
    assert calls == [None, b"first"]
    assert asyncio.run(inner.get("k")) == b"first+second"


def test_gcs_and_azure_conditional_deletes_and_bounded_retries(cloud: Cloud) -> None:
    server, upload = cloud
    inner = adapt(server.url("busy"), server.storage_options)

    async def stale_delete() -> tuple[bool, bytes | None]:
        await inner.set("k", b"0")
        _, version = await inner.read_for_update("k")
        upload("busy/k", b"theirs")
        return await inner.write_if("k", None, version), await inner.get("k")

    assert asyncio.run(stale_delete()) == (False, b"theirs")  # their write kept
    n = 0

    def change(old: bytes | None) -> bytes:
        nonlocal n
        n += 1
        upload("busy/k", str(n).encode())  # someone always gets there first
        return b"ours"

    with pytest.raises(ShardConflictError, match=r"'k'.*3 attempts"):
        asyncio.run(inner.update("k", change, attempts=3))
    assert n == 3 and asyncio.run(inner.get("k")) == b"3"


def _ones(server: Any, path: str) -> tuple[str, dict[str, Any], zarr.Array]:
    """(URL, storage options, array "a") of a new 16 x 16 array of ones at ``path``."""
    url, so = server.url(path), server.storage_options
    arr = zarr.create_array(
        ShardingStore(url, CPS, storage_options=so), name="a", shape=(16, 16), chunks=(4, 4), dtype="i4"
    )
    arr[:] = 1
    return url, so, arr


def test_gcs_and_azure_range_reads_never_read_a_replaced_shard(cloud: Cloud) -> None:
    """A chunk range located by a cached index carries that index's version: after
    another writer replaced the shard, the read is refused and redone afresh."""
    server, _ = cloud
    url, so, arr = _ones(server, "replaced.zarr")
    reader = zarr.open_array(
        ShardingStore(url, storage_options=so, read_strategy="chunk", index_cache="trust"), path="a"
    )
    assert reader[0, 0] == 1  # its index is cached now, with its version
    arr[:8, :8] = np.arange(64).reshape(8, 8)  # another store rewrites the shard
    server.reset()
    np.testing.assert_array_equal(reader[:4, :4], np.arange(64).reshape(8, 8)[:4, :4])
    assert server.counts["GET"] >= 3  # refused range (412), fresh index, range


@pytest.mark.parametrize("mode", ["rewrite", "batch", "pipeline"])
def test_gcs_and_azure_processes_writing_the_same_shards_lose_nothing(
    writers: Writers, cloud: Cloud, mode: str
) -> None:
    server, _ = cloud
    _race(writers, server.url(f"race-{mode}.zarr"), mode, server.storage_options)


def test_obstore_on_azure_writes_conditionally(azure: LocalAzure) -> None:
    from shardstore.inner import ObstoreInner

    inner = ObstoreInner.from_url(azure.url("ob"), azure.obstore_options)
    got, seen = _update_overtaken(inner, lambda: _azure_upload(azure, "ob/k", b"theirs"))
    assert got == b"theirs+ours"
    assert seen == [b"base", b"theirs"]


# -- a writer killed between its read and its conditional write ----------------------------

_STALLED_WRITER = """
import sys, time, zarr
from shardstore import ShardingStore
from shardstore.inner.base import InnerStore
url, options = sys.argv[1], __import__("json").loads(sys.argv[2])
async def stall(self, key, value, version):
    print("read", flush=True)
    time.sleep(600)  # killed here: between the read of the shard and its write
todo = [InnerStore]
while todo:  # every adapter class, however deep
    cls = todo.pop()
    cls.write_if = stall
    todo.extend(cls.__subclasses__())
arr = zarr.open_array(ShardingStore(url, storage_options=options), path="a")
arr[0:4, 0:4] = -1
"""


def test_gcs_and_azure_a_writer_killed_before_its_write_leaves_the_shard_whole(cloud: Cloud) -> None:
    url, so, arr = _ones(cloud[0], "killed.zarr")
    child = subprocess.Popen(
        [sys.executable, "-c", _STALLED_WRITER, url, json.dumps(so)], stdout=subprocess.PIPE, env=os.environ
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"read"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    arr[4:8, 4:8] = 2  # the next writer of the same shard goes ahead
    got = zarr.open_array(ShardingStore(url, storage_options=so), path="a")[:]
    want = np.ones((16, 16))
    want[4:8, 4:8] = 2
    np.testing.assert_array_equal(got, want)  # nothing of the killed writer, nothing lost


# -- the neuroglancer format, URLs and the command line --------------------------------------


def test_gcs_neuroglancer_format_store_on_a_bucket(gcs: LocalGCS) -> None:
    from shardstore import PrecomputedShardedStore

    sharding = {
        "@type": "neuroglancer_uint64_sharded_v1",
        "preshift_bits": 1,
        "hash": "identity",
        "minishard_bits": 1,
        "shard_bits": 1,
        "minishard_index_encoding": "gzip",
        "data_encoding": "raw",
    }
    store = PrecomputedShardedStore(gcs.url("ng"), sharding, storage_options=gcs.storage_options)
    ids = [0, 1, 2, 3, 7, 100]
    gcs.reset()
    store.update({i: f"chunk {i}".encode() for i in ids})
    assert gcs.counts["POST"] >= 1  # shard objects uploaded
    again = PrecomputedShardedStore(gcs.url("ng"), sharding, storage_options=gcs.storage_options)
    assert [again[i] for i in ids] == [f"chunk {i}".encode() for i in ids]
    assert 5 not in again
    assert sorted(again) == ids


@pytest.mark.parametrize("which", ["gcs", "azure"])
def test_gcs_and_azure_shard_urls_info_verify_and_convert(which: str, request: pytest.FixtureRequest) -> None:
    server: Any = request.getfixturevalue(which)
    other: Any = request.getfixturevalue("azure" if which == "gcs" else "gcs")
    url, so = server.url("cli.zarr"), server.storage_options
    options = {"shard": {"chunks_per_shard": [2, 2]}, url.split(":")[0]: so}
    arr = zarr.create_array(
        f"shard::{url}", name="a", shape=(16, 16), chunks=(4, 4), dtype="i4", storage_options=options
    )
    arr[:] = np.arange(256).reshape(16, 16)
    env = {**os.environ}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "shardstore", *args], capture_output=True, text=True, env=env, timeout=300
        )

    info = cli("info", url, "--storage-options", json.dumps(so))
    assert info.returncode == 0, info.stderr
    verify = cli("verify", url, "--storage-options", json.dumps(so))
    assert verify.returncode == 0, verify.stderr
    target = other.url(f"from-{which}.zarr")
    converted = cli(
        "convert",
        url,
        target,
        "--chunks-per-shard",
        "4,4",
        "--storage-options",
        json.dumps(so),
        "--dst-storage-options",
        json.dumps(other.storage_options),
    )
    assert converted.returncode == 0, converted.stderr
    got = zarr.open_array(ShardingStore(target, storage_options=other.storage_options), path="a", mode="r")[:]
    np.testing.assert_array_equal(got, np.arange(256).reshape(16, 16))
