"""No silent fallbacks: what the store does instead of what was asked is said."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import zarr
from zarr.core.buffer import cpu, default_buffer_prototype
from zarr.storage import FsspecStore, LocalStore, MemoryStore

from shardstore import ReadOnlyError, ShardingStore, StrategyFallbackWarning, UnshardedArrayWarning


@pytest.mark.parametrize("kind", ["dict", "memory", "fsspec-memory"])
def test_append_on_a_store_that_cannot_append_warns_and_says_rewrite(kind: str) -> None:
    inner = {"dict": {}, "memory": zarr.storage.MemoryStore(), "fsspec-memory": "memory://fallback"}[kind]
    with pytest.warns(StrategyFallbackWarning, match="rewritten whole"):
        store = ShardingStore(inner, (2, 2), write_strategy="append")
    assert store.internals.write_strategy == "rewrite"


def test_append_on_local_files_is_append_without_a_warning(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = ShardingStore(str(tmp_path), (2, 2), write_strategy="append")
    assert store.internals.write_strategy == "append"
    assert ShardingStore(str(tmp_path), (2, 2)).internals.write_strategy == "rewrite"


def test_a_chunks_per_shard_of_another_rank_warns_once_per_rank() -> None:
    store = ShardingStore({}, (4, 4))
    with pytest.warns(UnshardedArrayWarning, match=r"'x' has 1 dimension.*\[4, 4\]") as caught:
        zarr.create_array(store, name="x", shape=(8,), chunks=(2,), dtype="u1")
        zarr.create_array(store, name="y", shape=(8,), chunks=(2,), dtype="u1")  # same rank: said already
    assert len([w for w in caught if issubclass(w.category, UnshardedArrayWarning)]) == 1
    with pytest.warns(UnshardedArrayWarning, match="'v' has 3 dimension"):
        zarr.create_array(store, name="v", shape=(2, 2, 2), chunks=(1, 1, 1), dtype="u1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rank it is for, and 0-d arrays: nothing to say
        zarr.create_array(store, name="m", shape=(8, 8), chunks=(2, 2), dtype="u1")
        zarr.create_array(store, name="s", shape=(), dtype="u1")


async def test_a_read_only_store_refuses_batches_and_writes_with_read_only_error() -> None:
    backing: dict[str, bytes] = {}
    zarr.create_array(ShardingStore(backing, (2, 2)), name="a", shape=(4, 4), chunks=(2, 2), dtype="u1")
    store = ShardingStore(backing, read_only=True)
    with pytest.raises(ReadOnlyError, match="read-only"):
        store.batch()
    with pytest.raises(ReadOnlyError):
        await store.set("a/c/0/0", cpu.Buffer.from_bytes(b"\x01" * 4))
    assert isinstance(ReadOnlyError("x"), ValueError)  # zarr's own read-only error type


@pytest.mark.parametrize("inner", ["local", "fsspec", "memory"])
async def test_a_read_only_zarr_store_given_makes_the_store_read_only(tmp_path: Path, inner: str) -> None:
    """As zarr's own wrappers do: writes are refused naming the key, the shard unchanged
    (over local files they went through: the adapter reads the files directly)."""
    writable: Any = MemoryStore() if inner == "memory" else LocalStore(tmp_path)
    arr = zarr.create_array(
        ShardingStore(writable, (2, 2)), name="a", shape=(4, 4), chunks=(2, 2), dtype="u1"
    )
    arr[:] = 1
    before = await writable.get("a/c/0/0", default_buffer_prototype())
    given: Any = (
        FsspecStore.from_url(f"file://{tmp_path}", read_only=True)
        if inner == "fsspec"
        else writable.with_read_only(True)
    )
    store = ShardingStore(given)
    assert store.read_only
    with pytest.raises(ReadOnlyError, match="'a/c/0/0' was not written"):
        await store.set("a/c/0/0", cpu.Buffer.from_bytes(b"\x02" * 4))
    assert (await writable.get("a/c/0/0", default_buffer_prototype())) == before
    # its writable twin writes, over the given store's own writable twin (as zarr's wrappers)
    twin = store.with_read_only(False)
    assert not twin.read_only and twin.with_read_only(True).read_only
    zarr.open_array(twin, path="a")[0, 0] = 7
    assert zarr.open_array(ShardingStore(writable), path="a")[0, 0] == 7


def test_commits_retries_and_read_decisions_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    store = ShardingStore({}, (2, 2))
    arr = zarr.create_array(store, name="a", shape=(4, 4), chunks=(2, 2), dtype="u1")
    with caplog.at_level(logging.DEBUG, logger="shardstore"):
        arr[:] = 1
        _ = arr[:]
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("shardstore")]
    assert any(m.startswith("commit 'a/c/0/0'") for m in messages)
    assert any(m.startswith("read ") and "shard(s)" in m for m in messages)


@pytest.mark.filterwarnings("always::shardstore.errors.UnshardedArrayWarning")
def test_the_command_line_says_a_warning_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardstore.cli import main

    src = zarr.open_group(str(tmp_path / "src"), mode="w")
    src.create_array("lat", shape=(16,), chunks=(4,), dtype="f4")[:] = 1.0
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--chunks-per-shard", "2,2"]) == 0
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if "UnshardedArrayWarning" in ln]
    assert line.startswith("shardstore convert: UnshardedArrayWarning: array 'lat'")
    assert "self._note_unsharded" not in err  # no source line
