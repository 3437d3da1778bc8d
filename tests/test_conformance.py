"""zarr's own conformance suite for stores, run against ShardingStore over each inner store.

The suite writes keys like ``c/0`` and ``foo/0/0`` with no array metadata:
they must pass through untouched. A second variant puts a sharded array in
place first, so that the same keys are chunk keys living inside shards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import pytest
import zarr
from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
from zarr.core.buffer import Buffer, cpu, default_buffer_prototype
from zarr.testing.store import StoreTests

from shardstore import ShardingStore


class _Base(StoreTests[ShardingStore, cpu.Buffer]):
    store_cls = ShardingStore
    buffer_cls = cpu.Buffer

    async def set(self, store: ShardingStore, key: str, value: Buffer) -> None:
        await store.internals.raw.set(key, value.to_bytes())

    async def get(self, store: ShardingStore, key: str) -> Buffer:
        raw = await store.internals.raw.get(key)
        assert raw is not None, key
        return self.buffer_cls.from_bytes(raw)

    def test_store_repr(self, store: ShardingStore) -> None:
        assert repr(store).startswith("ShardingStore(")

    def test_store_supports_writes(self, store: ShardingStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: ShardingStore) -> None:
        assert store.supports_listing


class TestOverDict(_Base):
    @pytest.fixture
    def store_kwargs(self) -> dict[str, Any]:
        return {"inner": {}, "chunks_per_shard": (2, 2)}


class TestOverMemoryStore(_Base):
    @pytest.fixture
    def store_kwargs(self) -> dict[str, Any]:
        return {"inner": zarr.storage.MemoryStore(), "chunks_per_shard": (2, 2)}


class TestOverLocalStore(_Base):
    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"inner": zarr.storage.LocalStore(tmp_path), "chunks_per_shard": (2, 2)}


class TestOverFsspecLocal(_Base):
    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"inner": fsspec.get_mapper(f"file://{tmp_path}/data"), "chunks_per_shard": (2, 2)}


class TestOverFsspecMemory(_Base):
    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"inner": fsspec.get_mapper(f"memory://{tmp_path.name}"), "chunks_per_shard": (2, 2)}


class TestOverAsyncFsspec(_Base):
    """An async file system: the adapter drives its coroutine API directly."""

    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        fs = AsyncFileSystemWrapper(fsspec.filesystem("memory"))
        return {"inner": fsspec.FSMap(f"async-{tmp_path.name}", fs), "chunks_per_shard": (2, 2)}

    def test_uses_the_async_api(self, store: ShardingStore) -> None:
        assert store.internals.raw._async_fs is not None  # type: ignore[attr-defined]


class TestOverZarrFsspecStore(_Base):
    """zarr's own FsspecStore does not create parent directories; the adapter must."""

    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        inner = zarr.storage.FsspecStore.from_mapper(fsspec.get_mapper(f"file://{tmp_path}/zf"))
        return {"inner": inner, "chunks_per_shard": (2, 2)}

    async def test_nested_chunk_write(self, store: ShardingStore) -> None:
        arr = await zarr.api.asynchronous.create_array(
            store, name="deep/er/a", shape=(4, 4), chunks=(1, 1), dtype="u1"
        )
        await arr.setitem(slice(None), 1)
        assert (await arr.getitem(slice(None))).sum() == 16


class TestOverURL(_Base):
    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, Any]:
        return {"inner": f"file://{tmp_path}/url", "chunks_per_shard": (2, 2)}


@pytest.fixture(scope="module")
def s3_server() -> Any:
    """moto_server behind the counting proxy on 127.0.0.1, for this module's S3 classes."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from shardstore.testing.s3 import local_s3

    with local_s3() as server:
        yield server


def _on_server(server: Any, tmp_path: Path) -> dict[str, Any]:
    """A store over a fresh directory of a local object-store server, by URL."""
    return {
        "inner": server.url(f"conformance/{tmp_path.name}"),
        "storage_options": server.storage_options,
        "chunks_per_shard": (2, 2),
    }


class TestOverS3(_Base):
    """s3fs (async, its sessions on one event loop) against moto_server."""

    @pytest.fixture
    def store_kwargs(self, s3_server: Any, tmp_path: Path) -> dict[str, Any]:
        return _on_server(s3_server, tmp_path)


class TestOverObstore(_Base):
    """obstore's S3 client (Rust, no event loop of its own) against moto_server."""

    @pytest.fixture
    def store_kwargs(self, s3_server: Any, tmp_path: Path) -> dict[str, Any]:
        pytest.importorskip("obstore")
        from shardstore.inner import ObstoreInner

        inner = ObstoreInner.from_url(s3_server.url(f"obstore/{tmp_path.name}"), s3_server.storage_options)
        return {"inner": inner, "chunks_per_shard": (2, 2)}


@pytest.fixture(scope="module")
def gcs_server() -> Any:
    """gcp-storage-emulator behind the precondition proxy on 127.0.0.1 (this module's GCS class)."""
    from shardstore.testing.gcs import local_gcs

    with local_gcs() as server:
        yield server


@pytest.fixture(scope="module")
def azure_server() -> Any:
    """azurite behind the counting proxy on 127.0.0.1 (this module's Azure classes)."""
    from shardstore.testing.azure import local_azure

    with local_azure() as server:
        yield server


class TestOverGCS(_Base):
    """gcsfs (generation-conditional writes) against gcp-storage-emulator."""

    @pytest.fixture
    def store_kwargs(self, gcs_server: Any, tmp_path: Path) -> dict[str, Any]:
        return _on_server(gcs_server, tmp_path)


class TestOverAzure(_Base):
    """adlfs (ETag-conditional writes through the Azure SDK) against azurite."""

    @pytest.fixture
    def store_kwargs(self, azure_server: Any, tmp_path: Path) -> dict[str, Any]:
        return _on_server(azure_server, tmp_path)


class TestOverObstoreAzure(_Base):
    """obstore's Azure client against azurite."""

    @pytest.fixture
    def store_kwargs(self, azure_server: Any, tmp_path: Path) -> dict[str, Any]:
        from shardstore.inner import ObstoreInner

        url = azure_server.url(f"obstore/{tmp_path.name}")
        return {"inner": ObstoreInner.from_url(url, azure_server.obstore_options), "chunks_per_shard": (2, 2)}


class TestChunkKeysInsideShards:
    """The suite's key shapes again, but as chunk keys of real sharded arrays."""

    @pytest.fixture
    def store(self) -> ShardingStore:
        store = ShardingStore({}, chunks_per_shard={"foo": [2, 2], "": [4]})
        zarr.create_array(
            store,
            name="foo",
            shape=(8, 8),
            chunks=(2, 2),
            dtype="u1",
            chunk_key_encoding={"name": "default", "separator": "."},
        )
        return store

    async def test_set_get_chunk_of_sharded_array(self, store: ShardingStore) -> None:
        proto = default_buffer_prototype()
        await store.set("foo/c.0.0", cpu.Buffer.from_bytes(b"\x01\x02\x03\x04"))
        await store.set("foo/c.1.1", cpu.Buffer.from_bytes(b"xyz"))
        assert "foo/c.0.0" not in store.inner or store.inner["foo/c.0.0"] != b"\x01\x02\x03\x04"
        got = await store.get("foo/c.0.0", proto)
        assert got is not None and got.to_bytes() == b"\x01\x02\x03\x04"
        part = await store.get_partial_values(
            proto,
            [
                ("foo/c.1.1", zarr.abc.store.RangeByteRequest(1, 3)),
                ("foo/c.0.0", zarr.abc.store.SuffixByteRequest(1)),
            ],
        )
        assert [p.to_bytes() for p in part if p is not None] == [b"yz", b"\x04"]
        assert sorted([k async for k in store.list_prefix("foo/c")]) == ["foo/c.0.0", "foo/c.1.1"]
        assert sorted([k async for k in store.list_dir("foo")]) == ["c.0.0", "c.1.1", "zarr.json"]
        assert [k for k in store.inner if k.startswith("foo/c")] == ["foo/c.0.0"]
        assert await store.getsize("foo/c.1.1") == 3
        # a directory is measured (zarr 3.4): the array's document and its chunks
        assert await store.getsize_prefix("foo") == 7 + await store.getsize("foo/zarr.json")
        assert await store.getsize_prefix("foo/c") == 0  # no directory "foo/c/" here
        await store.delete("foo/c.0.0")
        assert not await store.exists("foo/c.0.0")
        assert await store.exists("foo/c.1.1")
        await store.delete("foo/c.1.1")
        assert [k for k in store.inner if k.startswith("foo/c")] == []


_RANGES = [
    None,
    *(
        zarr.abc.store.RangeByteRequest(a, b)
        for a in (-40, -3, -1, 0, 1, 5, 40)
        for b in (-40, -2, 0, 2, 6, 40)
    ),
    *(zarr.abc.store.OffsetByteRequest(n) for n in (-40, -3, -1, 0, 2, 6, 40)),
    *(zarr.abc.store.SuffixByteRequest(n) for n in (-3, 0, 2, 6, 40)),
]


def _sliced(value: bytes, request: zarr.abc.store.ByteRequest | None) -> bytes:
    """What zarr 3.4's MemoryStore takes of ``value`` for ``request``: a Python slice
    (zarr 3.1's took the last bytes for a suffix longer than the value)."""
    if isinstance(request, zarr.abc.store.RangeByteRequest):
        return value[request.start : request.end]
    if isinstance(request, zarr.abc.store.OffsetByteRequest):
        return value[request.offset :]
    if isinstance(request, zarr.abc.store.SuffixByteRequest):
        return value[max(len(value) - request.suffix, 0) :]
    return value


@pytest.mark.parametrize("read_strategy", ["chunk", "shard"])
@pytest.mark.parametrize("inner", ["dict", "local"])
async def test_a_byte_range_of_a_chunk_takes_a_slice_of_its_bytes_never_a_neighbours_byte(
    tmp_path: Path, inner: str, read_strategy: str
) -> None:
    """Any byte request on a chunk key (negative numbers and ranges past the end
    included) takes of the chunk's own bytes what zarr's MemoryStore takes of the
    same value; the chunks beside it in the shard are never read into the answer."""
    backing: Any = {} if inner == "dict" else zarr.storage.LocalStore(tmp_path)
    store = ShardingStore(backing, chunks_per_shard=(2, 2), read_strategy=read_strategy)
    zarr.create_array(store, name="a", shape=(4, 4), chunks=(2, 2), dtype="u1", compressors=None)
    values = {
        f"a/c/{i}/{j}": bytes([16 * i + 4 * j + k for k in range(5)]) for i in range(2) for j in range(2)
    }
    for key, value in values.items():
        await store.set(key, cpu.Buffer.from_bytes(value))
    proto = default_buffer_prototype()
    requests = [(key, r) for key in values for r in _RANGES]
    for (key, r), got in zip(requests, await store.get_partial_values(proto, requests), strict=True):
        want = _sliced(values[key], r)
        assert got is not None and got.to_bytes() == want, (key, r)
        one = await store.get(key, proto, r)
        assert one is not None and one.to_bytes() == want, (key, r)


@pytest.mark.parametrize("zarr_format", [2, 3])
async def test_the_size_under_a_prefix_is_the_sum_of_the_sizes_of_the_keys_listed(zarr_format: int) -> None:
    """``getsize_prefix`` measures the keys as zarr sees them: a metadata document
    without the entry that records the sharding (as ``get`` and ``getsize`` give
    it), consolidated metadata too; chunks by their index entries."""
    inner: dict[str, bytes] = {}
    store = ShardingStore(inner, chunks_per_shard=(2, 2))
    root = zarr.open_group(store, mode="w", zarr_format=zarr_format)
    inner_group = root.create_group("g")
    for parent in (root, inner_group):
        arr = parent.create_array("a", shape=(6, 6), chunks=(2, 2), dtype="u1", compressors=None)
        arr[:4, :] = 3
        arr.attrs["note"] = "kept"
    zarr.consolidate_metadata(store)
    for prefix in ("", "a", "g", "g/a"):
        keys = [k async for k in store.list_prefix(prefix + "/" if prefix else "")]
        assert any(k.endswith(("zarr.json", ".zarray")) for k in keys)
        sizes = [await store.getsize(k) for k in keys]
        assert await store.getsize_prefix(prefix) == sum(sizes), prefix
    raw = sum(len(v) for k, v in inner.items() if k.startswith("a/"))
    assert await store.getsize_prefix("a") < raw  # (the shard indices and the entry are not counted)
