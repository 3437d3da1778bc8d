"""Small local reads on the caller's thread: a batch of reads the page cache holds is
read without a hop to a worker thread (about 0.1 ms, more than the reads); whatever
would wait there (the disk, an appender's lock, a big read, a file system that cannot
tell) goes to a worker thread, and a store whose reads there turn out slow stops."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from zarr.abc.store import RangeByteRequest, SuffixByteRequest

import shardstore.inner.local as local_module
import shardstore.tasks
from shardstore.inner.local import BULKY_BYTES, LocalInner

pytestmark = pytest.mark.skipif(
    local_module._NOWAIT is None or not local_module.on_local_disk(tempfile.gettempdir()),
    reason="no RWF_NOWAIT here, or the temporary directory is on no local disk",
)


def _hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions handed to worker threads from now on."""
    hops: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(func, "__name__", repr(func)))
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(local_module.asyncio, "to_thread", counted)
    return hops


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LocalInner, dict[str, bytes]]:
    # A busy machine may take a batch longer than a slow store does (a preempted
    # thread): that rule has a test of its own, the others read at any pace.
    monkeypatch.setattr(local_module, "AT_ONCE_SLOW_S", 60.0)
    written = {f"s/{k}": os.urandom(5000 + k) for k in range(8)}
    for key, data in written.items():
        (tmp_path / key).parent.mkdir(exist_ok=True)
        (tmp_path / key).write_bytes(data)
    return LocalInner(tmp_path), written


def _batch(written: dict[str, bytes]) -> list[tuple[str, Any]]:
    return [
        (key, RangeByteRequest(100, 1100) if k % 2 else SuffixByteRequest(40))
        for k, key in enumerate(written)
    ]


def _want(written: dict[str, bytes]) -> list[bytes]:
    return [data[100:1100] if k % 2 else data[-40:] for k, data in enumerate(written.values())]


def _read(inner: LocalInner, requests: list[tuple[str, Any]]) -> list[bytes | None]:
    return asyncio.run(inner.get_many(requests))


def test_a_small_batch_the_page_cache_holds_is_read_without_a_thread(
    files: tuple[LocalInner, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    inner, written = files
    _read(inner, _batch(written))  # (now in the page cache, whatever it was)
    hops = _hops(monkeypatch)
    assert _read(inner, _batch(written)) == _want(written)
    assert hops == []


def test_a_range_that_would_wait_for_the_disk_is_read_by_a_thread(
    files: tuple[LocalInner, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RWF_NOWAIT`` fails (EAGAIN) for a page the page cache lacks, unless the disk
    fills it before the kernel looks again (a fast one may): the kernel's answer for
    one file is given here, so that the test does not depend on the disk's pace."""
    inner, written = files
    evicted = str(tmp_path / list(written)[3])
    real = os.preadv

    def would_wait(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        if flags and os.readlink(f"/proc/self/fd/{fd}") == evicted:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return real(fd, buffers, offset, flags)

    monkeypatch.setattr(local_module.os, "preadv", would_wait)
    hops = _hops(monkeypatch)
    assert _read(inner, _batch(written)) == _want(written)
    assert hops == ["read"]  # the rest of the batch, from that file on
    assert inner._at_once  # (and the next batch is tried on the caller's thread again)


def test_a_read_that_would_wait_for_an_appenders_lock_leaves_the_event_loop_free(
    files: tuple[LocalInner, dict[str, bytes]], tmp_path: Path
) -> None:
    inner, written = files
    key = next(iter(written))
    holder = os.open(tmp_path / key, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # as an append holds it while it writes
    # (should the read block the loop, the lock goes after 30 s and the read is done)
    release = threading.Timer(30, fcntl.flock, (holder, fcntl.LOCK_UN))
    release.start()

    async def main() -> bytes | None:
        read = asyncio.ensure_future(inner.get_many([(key, SuffixByteRequest(40))]))
        for _ in range(20):  # the loop goes on meanwhile
            await asyncio.sleep(0.005)
        assert not read.done()  # (waiting, in a thread, for the lock)
        fcntl.flock(holder, fcntl.LOCK_UN)
        return (await asyncio.wait_for(read, 30))[0]

    try:
        assert asyncio.run(main()) == written[key][-40:]
    finally:
        release.cancel()
        os.close(holder)


def test_a_batch_of_more_than_a_few_bytes_is_read_by_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "big").write_bytes(b"x" * (BULKY_BYTES + 1))
    inner = LocalInner(tmp_path)
    _read(inner, [("big", None)])
    hops = _hops(monkeypatch)
    assert _read(inner, [("big", None)]) == [b"x" * (BULKY_BYTES + 1)]
    assert hops == ["read"]


def test_objects_read_whole_are_read_by_a_thread_per_core_and_one_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three threads on two cores read shards whole at once (a barrier of three): each
    waits for the GIL or in the kernel part of its time."""
    monkeypatch.setattr(shardstore.tasks, "available_cores", lambda: 2)
    for k in range(6):
        (tmp_path / f"s{k}").write_bytes(bytes([k]) * 10)
    inner = LocalInner(tmp_path)
    three, threads = threading.Barrier(3, timeout=10), set()
    read = LocalInner._read_versioned

    def together(*args: Any, **kwargs: Any) -> Any:
        threads.add(threading.get_ident())
        three.wait()
        return read(*args, **kwargs)

    monkeypatch.setattr(LocalInner, "_read_versioned", staticmethod(together))
    assert _read(inner, [(f"s{k}", None) for k in range(6)]) == [bytes([k]) * 10 for k in range(6)]
    assert len(threads) == 3


def test_a_store_whose_reads_are_slow_stops_reading_on_the_callers_thread(
    files: tuple[LocalInner, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    inner, written = files
    _read(inner, _batch(written))
    monkeypatch.setattr(local_module, "AT_ONCE_SLOW_S", -1.0)  # every batch takes longer
    hops = _hops(monkeypatch)
    assert _read(inner, _batch(written)) == _want(written)
    assert hops == ["read"] and not inner._at_once  # one read on the caller's thread, no more
    assert _read(inner, _batch(written)) == _want(written)
    assert hops == ["read", "read"]


def test_a_file_system_that_cannot_tell_what_would_wait_is_read_by_threads(
    files: tuple[LocalInner, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    inner, written = files
    real = os.preadv

    def unsupported(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
        if flags:
            raise OSError(95, "Operation not supported")
        return real(fd, buffers, offset)

    monkeypatch.setattr(local_module.os, "preadv", unsupported)
    hops = _hops(monkeypatch)
    assert _read(inner, _batch(written)) == _want(written)
    assert _read(inner, _batch(written)) == _want(written)
    assert hops == ["read", "read"] and not inner._at_once


def test_off_a_local_disk_every_batch_is_read_by_a_thread(
    files: tuple[LocalInner, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(An open on NFS, Lustre or a FUSE file system may wait on a server.)"""
    _, written = files
    monkeypatch.setattr(local_module, "on_local_disk", lambda path: False)
    inner = LocalInner(tmp_path)
    _read(inner, _batch(written))
    hops = _hops(monkeypatch)
    assert _read(inner, _batch(written)) == _want(written)
    assert hops == ["read"]
