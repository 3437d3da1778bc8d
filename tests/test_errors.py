"""Every failure a user can cause raises a ShardStoreError naming the key and the cause."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.core.buffer import cpu, default_buffer_prototype
from zarr.storage import LocalStore, MemoryStore, WrapperStore

from shardstore import (
    ChunkKeyError,
    InnerStoreError,
    InvalidKeyError,
    ShardFormatError,
    ShardingConfigError,
    ShardingStore,
    ShardStoreError,
)
from shardstore.formats.indexed import IndexedFormat


def _sharded(inner: Any | None = None) -> tuple[ShardingStore, zarr.Array, dict[str, Any]]:
    backing = {} if inner is None else inner
    store = ShardingStore(backing, chunks_per_shard=(2, 2))
    arr = zarr.create_array(store, name="a", shape=(4, 4), chunks=(2, 2), dtype="i4", compressors=None)
    arr[:] = np.arange(16, dtype="i4").reshape(4, 4)
    return store, arr, backing


def test_truncated_shard_raises_format_error_naming_shard() -> None:
    store, _, backing = _sharded()
    backing["a/c/0/0"] = backing["a/c/0/0"][:20]
    with pytest.raises(ShardFormatError, match=r"a/c/0/0") as info:
        zarr.open_array(store, path="a")[:]
    assert isinstance(info.value, ShardStoreError)


@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize("where", ["local", "mapping"])
def test_a_shard_cut_short_is_said_to_be_so_whatever_its_index_then_reads(
    tmp_path: Path, where: str, checksum: bool
) -> None:
    """A shard cut short has its index read from the wrong bytes, which then says
    anything (overlapping ranges, ranges past the end, a bad checksum): the error
    names the shard and the likely cause, for every cut, on every read."""
    for cut in (1, 5, 8, 13, 16, 40, 64, 70, 100):
        inner: Any = LocalStore(tmp_path / str(cut)) if where == "local" else {}
        store = ShardingStore(inner, chunks_per_shard=(2, 2), index_checksum=checksum)
        arr = zarr.create_array(store, name="a", shape=(4, 4), chunks=(2, 2), dtype="i4", compressors=None)
        arr[:] = np.arange(16, dtype="i4").reshape(4, 4)
        if where == "local":
            shard = tmp_path / str(cut) / "a" / "c" / "0" / "0"
            shard.write_bytes(shard.read_bytes()[:-cut])
        else:
            inner["a/c/0/0"] = inner["a/c/0/0"][:-cut]
        for selection in (np.s_[:], np.s_[0, 0], np.s_[1:2, :]):
            with pytest.raises(ShardFormatError, match=r"'a/c/0/0'.*(cut short|truncated|fewer than)"):
                zarr.open_array(ShardingStore(inner), path="a")[selection]


def test_index_pointing_past_the_end() -> None:
    store, _, backing = _sharded()
    layout = IndexedFormat((2, 2))
    index = layout.empty_index()
    index[0] = (0, 10_000)
    backing["a/c/0/0"] = b"x" * 16 + layout.encode_index(index)
    with pytest.raises(ShardFormatError, match=r"a/c/0/0.*(runs past the end|outside the data area)"):
        zarr.open_array(store, path="a")[0, 0]


def test_garbage_index() -> None:
    store, _, backing = _sharded()
    backing["a/c/0/0"] = bytes(range(256)) * 2
    with pytest.raises(ShardFormatError, match="a/c/0/0"):
        zarr.open_array(store, path="a")[:2, :2]


def test_writing_into_a_corrupt_shard_leaves_it_untouched() -> None:
    _store, arr, backing = _sharded()
    corrupt = backing["a/c/0/0"][:-3]
    backing["a/c/0/0"] = corrupt
    with pytest.raises(ShardFormatError):
        arr[0, 0] = 99
    assert backing["a/c/0/0"] == corrupt


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"a": [2]}, "has 1 entries, the array has 2 dimensions"),
        ({"a": [0, 2]}, "must be positive integers"),
        ({"a": [-1, 2]}, "must be positive integers"),
        ({"a": [1, 1]}, "one chunk in each shard"),
        ({"a": [2**13, 2**13]}, "too large to hold in memory"),
        ((0, 4), "must be positive"),
        ((1, 1), "one chunk in each shard"),
    ],
)
def test_bad_config_raises_before_metadata_is_written(config: Any, message: str) -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=config)
    with pytest.raises(ShardingConfigError, match=message) as info:
        zarr.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="u1")
    assert "'a'" in str(info.value)
    assert "a/zarr.json" not in backing


def test_bad_callable_config() -> None:
    store = ShardingStore({}, chunks_per_shard=lambda path, meta: [2, 2, 2])
    with pytest.raises(ShardingConfigError, match=r"array 'x'.*3 entries"):
        zarr.create_array(store, name="x", shape=(8,), chunks=(2,), dtype="u1")


def test_a_callable_config_that_raises_is_a_config_error_naming_the_array() -> None:
    store = ShardingStore({}, chunks_per_shard=lambda path, meta: 1 // 0)
    with pytest.raises(ShardingConfigError, match=r"array 'x'.*raised ZeroDivisionError") as info:
        zarr.create_array(store, name="x", shape=(8,), chunks=(2,), dtype="u1")
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_numpy_integers_shard_as_ints_do() -> None:
    backing: dict[str, Any] = {}
    store = ShardingStore(backing, chunks_per_shard=np.array([2, 2]))
    zarr.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="u1")[:] = 1
    assert sorted(k for k in backing if "/c/" in k) == ["a/c/0/0", "a/c/0/1", "a/c/1/0", "a/c/1/1"]


@pytest.mark.parametrize("bad", ["4,4", 4, 3.5])
def test_config_of_the_wrong_type(bad: Any) -> None:
    with pytest.raises(ShardingConfigError, match="chunks_per_shard must be"):
        ShardingStore({}, chunks_per_shard=bad)


@pytest.mark.parametrize(
    ("option", "value"),
    [("layout", "nope"), ("write_strategy", "x"), ("read_strategy", "y"), ("index_location", "middle")],
)
def test_bad_options(option: str, value: str) -> None:
    with pytest.raises(ShardingConfigError, match=value):
        ShardingStore({}, **{option: value})


def test_corrupt_config_in_metadata() -> None:
    _store, _, backing = _sharded()
    import json

    meta = json.loads(backing["a/zarr.json"])
    meta["storage_transformers"][0]["configuration"]["chunks_per_shard"] = [0, 2]
    backing["a/zarr.json"] = json.dumps(meta).encode()
    with pytest.raises(ShardingConfigError, match="array 'a'"):
        zarr.open_array(ShardingStore(backing), path="a")


def test_write_outside_the_grid_raises_but_delete_is_a_noop() -> None:
    store, _, _ = _sharded()
    buf = cpu.Buffer.from_bytes(b"1234")
    with pytest.raises(ChunkKeyError, match=r"'a/c/2/0'.*outside the chunk grid.*'a'"):
        asyncio.run(store.set("a/c/2/0", buf))
    with pytest.raises(ChunkKeyError, match="not a chunk key of this 2-d array"):
        asyncio.run(store.set("a/c/0", buf))
    asyncio.run(store.delete("a/c/9/9"))
    asyncio.run(store.delete("a/c/"))
    assert asyncio.run(store.get("a/c/0", default_buffer_prototype())) is None
    for huge in ("a/c/9223372036854775808/1", "a/c/18446744073709551616/0"):  # no int64 shard number
        with pytest.raises(ChunkKeyError, match="outside the chunk grid"):
            asyncio.run(store.set(huge, buf))
        asyncio.run(store.delete(huge))
        assert asyncio.run(store.get(huge, default_buffer_prototype())) is None
        assert not asyncio.run(store.exists(huge))


@pytest.mark.parametrize("key", ["../escape", "/etc/passwd", "a/../../b"])
def test_keys_escaping_the_root(key: str) -> None:
    store = ShardingStore({})
    with pytest.raises(InvalidKeyError, match="invalid key"):
        asyncio.run(store.set(key, cpu.Buffer.from_bytes(b"x")))
    with pytest.raises(InvalidKeyError):
        asyncio.run(store.get(key, default_buffer_prototype()))


class FailingMapping(MutableMapping[str, bytes]):
    """A dict whose n-th write fails: an inner store going away mid-commit."""

    def __init__(self, fail_on_write: int | None = None) -> None:
        self.data: dict[str, bytes] = {}
        self.writes = 0
        self.fail_on_write = fail_on_write

    def __getitem__(self, key: str) -> bytes:
        return self.data[key]

    def __setitem__(self, key: str, value: bytes) -> None:
        self.writes += 1
        if self.fail_on_write is not None and self.writes >= self.fail_on_write:
            raise OSError("disk on fire")
        self.data[key] = value

    def __delitem__(self, key: str) -> None:
        del self.data[key]

    def __iter__(self) -> Any:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


def test_failing_inner_store_raises_inner_store_error_and_keeps_old_shard() -> None:
    backing = FailingMapping()
    _store, arr, _ = _sharded(backing)  # type: ignore[arg-type]
    before = dict(backing.data)
    backing.fail_on_write = backing.writes + 1
    with pytest.raises(InnerStoreError, match=r"write 'a/c/0/0'.*disk on fire"):
        arr[0:2, 0:2] = -1
    assert backing.data == before
    np.testing.assert_array_equal(
        zarr.open_array(ShardingStore(backing.data), path="a")[:], np.arange(16).reshape(4, 4)
    )


def test_a_batch_commit_error_pickles_whole() -> None:
    """It crosses from a worker process to its caller (dask, multiprocessing)."""
    import pickle

    from shardstore.errors import BatchCommitError

    error = BatchCommitError("2 shard(s) ...", {"a/c/0/0": ValueError("x")})
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and list(again.failed) == ["a/c/0/0"]


class _FailsOneKey(WrapperStore[Any]):
    """A zarr store whose reads of one key fail, alone or in a batch (whose error names no key)."""

    bad = "a/c/1/1"

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        if key == self.bad:
            raise OSError(5, "I/O error")
        return await self._store.get(key, prototype, byte_range)

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> Any:
        key_ranges = list(key_ranges)
        if any(key == self.bad for key, _ in key_ranges):
            raise OSError(5, "I/O error")
        return await self._store.get_partial_values(prototype, key_ranges)


@pytest.mark.parametrize("inner", ["local", "zarr-store"])
def test_a_read_of_many_shards_names_the_one_that_fails(tmp_path: Path, inner: str) -> None:
    """Not the first shard of the batch: a user is sent to the shard at fault."""
    store: Any = LocalStore(tmp_path) if inner == "local" else MemoryStore()
    arr = zarr.create_array(
        ShardingStore(store, (2, 2)), name="a", shape=(8, 8), chunks=(2, 2), dtype="i4", compressors=None
    )
    arr[:] = 1
    if inner == "local":  # a file the system cannot open: a symbolic link to itself
        (tmp_path / "a/c/1/1").unlink()
        (tmp_path / "a/c/1/1").symlink_to(tmp_path / "a/c/1/1")
    else:
        store = _FailsOneKey(store)
    arr = zarr.open_array(ShardingStore(store), path="a")
    for selection in (np.s_[:], np.s_[3:5, :], np.s_[4:8, 4:8]):  # many shards, a slab, the one alone
        with pytest.raises(InnerStoreError, match=r"failed to read 'a/c/1/1': OSError"):
            arr[selection]


class _HandsBackBytes(WrapperStore[Any]):
    """A zarr store of a user's own whose reads of chunk data return bytes, not zarr Buffers."""

    @staticmethod
    def _wrong(key: str, found: Any) -> Any:
        return found if found is None or key.endswith("zarr.json") else found.to_bytes()

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        return self._wrong(key, await self._store.get(key, prototype, byte_range))

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> Any:
        key_ranges = list(key_ranges)
        found = await self._store.get_partial_values(prototype, key_ranges)
        return [self._wrong(key, b) for (key, _), b in zip(key_ranges, found, strict=True)]


def test_a_zarr_store_that_hands_back_the_wrong_type_is_named_with_the_key() -> None:
    """Its AttributeError (``'bytes' object has no attribute 'to_bytes'``) is the inner
    store failing, named with the key read, as any other of its failures."""
    store = MemoryStore()
    arr = zarr.create_array(
        ShardingStore(store, (2, 2)), name="a", shape=(4, 4), chunks=(2, 2), dtype="i4", compressors=None
    )
    arr[:] = 1
    arr = zarr.open_array(ShardingStore(_HandsBackBytes(store)), path="a")
    for selection in (np.s_[:], np.s_[0, 0]):
        with pytest.raises(InnerStoreError, match=r"failed to read 'a/c/0/0': AttributeError") as info:
            arr[selection]
        assert isinstance(info.value.__cause__, AttributeError)
