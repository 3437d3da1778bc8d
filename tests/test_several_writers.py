"""Several writers of the same shards lose nothing: processes, store instances, threads.

Writers in separate processes (spawn) each own some chunks of every shard and
write them twice; afterwards every chunk must hold its writer's last value.
Local files order writers by per-shard file locks, S3 by conditional writes.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardstore import PIPELINE_PATH, ShardingStore
from shardstore.errors import ShardConflictError
from shardstore.inner import adapt
from shardstore.inner.locks import file_lock, lock_path
from shardstore.maintenance import compact

from .helpers import inner_keys
from .processes import Writers

GRID, CHUNK, CPS, WRITERS = 8, 4, (4, 4), 4


def _mine(w: int) -> list[tuple[int, int]]:
    return [(r, c) for r in range(GRID) for c in range(GRID) if (r * 3 + c) % WRITERS == w]


def _value(r: int, c: int, final: bool) -> int:
    return (r * GRID + c + 1) * (1 if final else -1)


def _all_final() -> np.ndarray[Any, Any]:
    """The whole array once every chunk holds its last value."""
    return np.kron(np.arange(1, GRID * GRID + 1).reshape(GRID, GRID), np.ones((CHUNK, CHUNK), "i4"))


def _in_threads(work: Callable[[int], None], n: int) -> None:
    threads = [threading.Thread(target=work, args=(w,)) for w in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _create(url: str, storage_options: dict[str, Any] | None = None) -> None:
    store = ShardingStore(url, chunks_per_shard=CPS, storage_options=storage_options)
    zarr.create_array(store, name="a", shape=(GRID * CHUNK,) * 2, chunks=(CHUNK, CHUNK), dtype="i4")


def _writer(url: str, mode: str, w: int, storage_options: dict[str, Any] | None, start: Any) -> None:
    kwargs: dict[str, Any] = {"write_strategy": "append"} if mode in ("append", "compact") else {}
    store = ShardingStore(url, storage_options=storage_options, **kwargs)
    # every chunk of this writer in one setitem: one commit per shard
    pipeline = zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}) if mode == "pipeline" else None
    with pipeline or contextlib.nullcontext():
        arr = zarr.open_array(store, path="a")
        start.wait()
        _write(store, arr, mode, w)


def _write(store: ShardingStore, arr: zarr.Array, mode: str, w: int) -> None:
    if mode == "pipeline":
        for final in (False, True):
            rows, cols = zip(*_mine(w), strict=True)
            blocks = np.array([_value(r, c, final) for r, c in _mine(w)], "i4")
            cells = np.indices((CHUNK, CHUNK)).reshape(2, -1)
            arr.vindex[
                (np.array(rows)[:, None] * CHUNK + cells[0]).ravel(),
                (np.array(cols)[:, None] * CHUNK + cells[1]).ravel(),
            ] = np.repeat(blocks, CHUNK * CHUNK)
        return
    if mode == "compact" and w == 0:  # one process compacts while the others append
        for _ in range(20):
            compact(store, "a/")
        return
    for final in (False, True):
        for r, c in _mine(w):
            with store.batch() if mode == "batch" else contextlib.nullcontext():
                arr[r * CHUNK : (r + 1) * CHUNK, c * CHUNK : (c + 1) * CHUNK] = _value(r, c, final)


def _race(writers: Writers, url: str, mode: str, storage_options: dict[str, Any] | None = None) -> None:
    """Run the writers, each in a process of its own, and check that every chunk holds
    its writer's last value (the message names each that does not, and what it holds:
    minus that value is the writer's first write, 0 none)."""
    _create(url, storage_options)
    writers.together([(_writer, (url, mode, w, storage_options)) for w in range(WRITERS)])
    got = zarr.open_array(ShardingStore(url, storage_options=storage_options), path="a", mode="r")[:]
    blocks = got.reshape(GRID, CHUNK, GRID, CHUNK).transpose(0, 2, 1, 3)
    expected = np.array([[_value(r, c, True) for c in range(GRID)] for r in range(GRID)])
    writers = {w for w in range(WRITERS) if mode != "compact" or w != 0}
    owned = np.array([[(r * 3 + c) % WRITERS in writers for c in range(GRID)] for r in range(GRID)])
    good = (blocks == expected[:, :, None, None]).all(axis=(2, 3)) | ~owned
    lost = [(int(r), int(c), sorted(set(blocks[r, c].ravel().tolist()))) for r, c in np.argwhere(~good)]
    assert not lost, f"{mode}: {len(lost)} chunks lost or stale (row, column, values held): {lost}"


@pytest.mark.parametrize("mode", ["rewrite", "batch", "append", "compact", "pipeline"])
def test_processes_writing_the_same_local_shards_lose_nothing(
    writers: Writers, tmp_path: Path, mode: str
) -> None:
    url = f"file://{tmp_path}/x.zarr"
    _race(writers, url, mode)
    leftovers = [p.name for p in (tmp_path / "x.zarr").rglob(".*") if p.is_file()]
    assert leftovers == []  # no lock file, journal or temporary file left behind


def test_store_instances_in_threads_lose_nothing(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/t.zarr"
    _create(url)

    def write(w: int, strategy: str) -> None:
        arr = zarr.open_array(ShardingStore(url, write_strategy=strategy), path="a")
        for r, c in _mine(w % WRITERS):
            arr[r * CHUNK : (r + 1) * CHUNK, c * CHUNK : (c + 1) * CHUNK] = _value(r, c, True)

    _in_threads(lambda w: write(w, ("rewrite", "append")[w // WRITERS]), 2 * WRITERS)
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(url), path="a")[:], _all_final())


@pytest.mark.parametrize("kind", ["dict", "zarr-memory", "fsspec-memory"])
def test_store_instances_over_one_in_memory_store_take_turns(kind: str, tmp_path: Path) -> None:
    import fsspec

    inner: Any = {
        "dict": {},
        "zarr-memory": zarr.storage.MemoryStore(),
        "fsspec-memory": fsspec.get_mapper(f"memory://{tmp_path.name}-turns"),
    }[kind]
    zarr.create_array(
        ShardingStore(inner, CPS), name="a", shape=(GRID * CHUNK,) * 2, chunks=(CHUNK, CHUNK), dtype="i4"
    )
    arrays = [zarr.open_array(ShardingStore(inner), path="a") for _ in range(WRITERS)]

    def write(w: int) -> None:
        for r, c in _mine(w):
            arrays[w][r * CHUNK : (r + 1) * CHUNK, c * CHUNK : (c + 1) * CHUNK] = _value(r, c, True)

    _in_threads(write, WRITERS)
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(inner), path="a")[:], _all_final())


def _hold_lock(path: str, held: Any) -> None:
    with file_lock(Path(path)):
        held.set()
        time.sleep(600)


def test_a_lock_left_by_a_killed_writer_does_not_block_the_next(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/k.zarr"
    _create(url)
    arr = zarr.open_array(ShardingStore(url), path="a")
    arr[:] = 1
    shard = tmp_path / "k.zarr" / "a" / "c" / "0" / "0"
    ctx = mp.get_context("spawn")
    held = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(shard), held))
    holder.start()
    assert held.wait(60)
    os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
    holder.join()
    assert lock_path(shard).exists()  # left behind, but no longer locked
    keys = inner_keys(ShardingStore(url))
    assert "a/c/0/0" in keys and not any(k.endswith(".lock") for k in keys)  # never listed
    done = threading.Event()

    def write() -> None:
        arr[0:CHUNK, 0:CHUNK] = 7
        done.set()

    threading.Thread(target=write, daemon=True).start()
    assert done.wait(30), "the write is blocked by a dead writer's lock"
    assert arr[0, 0] == 7 and arr[CHUNK, CHUNK] == 1
    assert not lock_path(shard).exists()  # the next writer cleaned it up


def test_a_writer_waits_for_the_lock_holder(tmp_path: Path) -> None:
    """While another process holds a shard's lock, a write to it waits, then lands."""
    url = f"file://{tmp_path}/w.zarr"
    _create(url)
    arr = zarr.open_array(ShardingStore(url), path="a")
    shard = tmp_path / "w.zarr" / "a" / "c" / "0" / "0"
    ctx = mp.get_context("spawn")
    held = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(shard), held))
    holder.start()
    try:
        assert held.wait(60)
        done = threading.Event()

        def write() -> None:
            arr[0:CHUNK, 0:CHUNK] = 5
            done.set()

        threading.Thread(target=write, daemon=True).start()
        assert not done.wait(1.0)  # blocked behind the holder
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        holder.join()
    assert done.wait(30)
    assert arr[0, 0] == 5


# -- S3: conditional writes -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["rewrite", "batch", "pipeline"])
def test_processes_writing_the_same_s3_shards_lose_nothing(writers: Writers, s3: Any, mode: str) -> None:
    _race(writers, s3.url(f"race-{mode}.zarr"), mode, s3.storage_options)


def _put_behind_our_back(s3: Any, key: str, body: bytes) -> None:
    """Another writer: a plain PUT with a client of its own."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.put_object(Bucket=s3.bucket, Key=key, Body=body)


def test_a_failed_precondition_is_re_read_and_retried(s3: Any) -> None:
    import asyncio

    inner = adapt(s3.url("cond"), s3.storage_options)
    assert inner.capabilities.conditional_writes
    seen: list[bytes | None] = []

    def change(old: bytes | None) -> bytes:
        seen.append(old)
        if len(seen) == 1:  # another process writes between our read and our write
            _put_behind_our_back(s3, "cond/k", b"theirs")
        return (old or b"") + b"+ours"

    async def run() -> bytes | None:
        await inner.set("k", b"base")
        s3.reset()
        await inner.update("k", change)
        counts = dict(s3.counts)
        assert counts == {"GET": 2, "PUT": 3}, s3.paths  # ours refused (412), theirs, ours again
        return await inner.get("k")

    assert asyncio.run(run()) == b"theirs+ours"
    assert seen == [b"base", b"theirs"]  # re-read after the refused write


def test_a_new_object_is_written_only_if_still_absent(s3: Any) -> None:
    import asyncio

    inner = adapt(s3.url("fresh"), s3.storage_options)
    calls: list[bytes | None] = []

    def change(old: bytes | None) -> bytes:
        calls.append(old)
        if len(calls) == 1:
            _put_behind_our_back(s3, "fresh/k", b"first")
        return (old or b"") + b"+second"

    asyncio.run(inner.update("k", change))
    assert calls == [None, b"first"]
    assert asyncio.run(inner.get("k")) == b"first+second"


def test_retries_are_bounded(s3: Any) -> None:
    import asyncio

    inner = adapt(s3.url("busy"), s3.storage_options)
    asyncio.run(inner.set("k", b"0"))
    n = 0

    def change(old: bytes | None) -> bytes:
        nonlocal n
        n += 1
        _put_behind_our_back(s3, "busy/k", str(n).encode())  # someone always gets there first
        return b"ours"

    with pytest.raises(ShardConflictError, match=r"'k'.*3 attempts"):
        asyncio.run(inner.update("k", change, attempts=3))
    assert n == 3 and asyncio.run(inner.get("k")) == b"3"


def test_write_attempts_is_checked() -> None:
    from shardstore.errors import ShardingConfigError

    with pytest.raises(ShardingConfigError, match="write_attempts"):
        ShardingStore({}, write_attempts=0)


def test_a_rewrite_honours_and_ends_a_crashed_appends_journal(tmp_path: Path) -> None:
    """A kill inside an append leaves a journal and a torn tail; the next rewrite of the
    shard (under the same lock) starts from the last committed state and ends the journal."""
    url = f"file://{tmp_path}/j.zarr"
    _create(url)
    arr = zarr.open_array(ShardingStore(url, write_strategy="append"), path="a")
    arr[:] = 1
    arr[0:CHUNK, 0:CHUNK] = 2  # an append
    shard = tmp_path / "j.zarr" / "a" / "c" / "0" / "0"
    committed = shard.stat().st_size
    journal = shard.with_name(".0.appending")
    journal.write_text(f"{shard.stat().st_ino} {committed}")
    with open(shard, "ab") as f:
        f.write(b"half an append")  # torn tail
    rewriter = zarr.open_array(ShardingStore(url), path="a")
    rewriter[CHUNK : 2 * CHUNK, 0:CHUNK] = 3
    assert not journal.exists()
    arr[0:CHUNK, CHUNK : 2 * CHUNK] = 4  # a later append must not cut the new file back
    back = zarr.open_array(ShardingStore(url), path="a")[: 4 * CHUNK, : 4 * CHUNK]
    expected = np.ones((4 * CHUNK, 4 * CHUNK), "i4")
    expected[:CHUNK, :CHUNK], expected[CHUNK : 2 * CHUNK, :CHUNK], expected[:CHUNK, CHUNK : 2 * CHUNK] = (
        2,
        3,
        4,
    )
    np.testing.assert_array_equal(back, expected)


def test_s3_range_reads_never_read_a_replaced_shard(s3: Any) -> None:
    """A chunk range located by an index carries If-Match on that index's ETag: after
    another writer replaced the shard, the read is refused and redone with a fresh index."""
    url = s3.url("replaced.zarr")
    writer = ShardingStore(url, chunks_per_shard=CPS, storage_options=s3.storage_options)
    arr = zarr.create_array(writer, name="a", shape=(16, 16), chunks=(4, 4), dtype="i4")
    arr[:] = 1
    reader = zarr.open_array(
        ShardingStore(url, storage_options=s3.storage_options, read_strategy="chunk", index_cache="trust"),
        path="a",
    )
    assert reader[0, 0] == 1  # its index is cached now, with its ETag
    arr[:8, :8] = np.arange(64, dtype="i4").reshape(8, 8)  # another store rewrites the shard
    s3.reset()
    np.testing.assert_array_equal(reader[:4, :4], np.arange(64).reshape(8, 8)[:4, :4])
    assert s3.counts["GET"] == 3  # refused range (412), fresh index, range
