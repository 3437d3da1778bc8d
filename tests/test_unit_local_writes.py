"""A local file written from pieces (a shard's index and chunks, not joined): every byte
in order, whatever ``writev`` takes at a time, and the same object the format builds.
A shard commit writes its new shard into the shard's lock file and renames that onto
the shard: one file made per commit, a failed one leaves the shard as it was, what a
killed writer left in a lock file is never served, and a writer that waited on a lock
that became the shard takes a new one; a lock file the writer did not make never
becomes the shard, and a child forked meanwhile does not keep the shard locked."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardstore.inner.local as local_module
import shardstore.tasks
from shardstore.formats.indexed.format import IndexedFormat
from shardstore.inner.local import LocalInner
from shardstore.inner.locks import file_lock, lock_path


class _ShortWrites:
    """Stands in for ``os`` inside shardstore.inner.local: each ``writev`` takes at most
    ``most`` bytes of at most ``pieces`` pieces (what a file system may do)."""

    def __init__(self, most: int, pieces: int) -> None:
        self.most, self.pieces, self.calls = most, pieces, 0

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def writev(self, fd: int, buffers: list[memoryview]) -> int:
        self.calls += 1
        assert len(buffers) <= local_module._IOV_MAX
        data = b"".join(bytes(b) for b in buffers[: self.pieces])[: self.most]
        return os.write(fd, data)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), max_size=40),
    most=st.integers(1, 500),
    pieces=st.integers(1, 5),
)
def test_pieces_are_written_whole_and_in_order_whatever_each_writev_takes(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], most: int, pieces: int
) -> None:
    rng = np.random.default_rng(len(sizes) * 1000 + most)
    parts: list[bytes | memoryview] = [rng.bytes(n) for n in sizes]
    parts = [memoryview(p) if k % 2 else p for k, p in enumerate(parts)]  # bytes and views alike
    path = tmp_path_factory.mktemp("w") / "shard"
    short = _ShortWrites(most, pieces)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local_module, "os", short)
        mp.setattr(local_module, "_IOV_MAX", 3)
        LocalInner._write(path, parts)
    assert path.read_bytes() == b"".join(parts)
    assert short.calls >= -(-sum(sizes) // most)  # (it did go through the short writes)


def test_a_writev_that_writes_nothing_is_an_error_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_module, "os", _ShortWrites(0, 1))
    with pytest.raises(OSError, match="wrote nothing"):
        LocalInner._write(tmp_path / "shard", [b"abc", b"def"])
    assert list(tmp_path.iterdir()) == []  # (the temporary file is gone too)


@pytest.mark.parametrize("index_location", ["start", "end"])
def test_a_shards_pieces_are_the_object_it_builds(index_location: str) -> None:
    fmt = IndexedFormat((2, 3), index_location, True)  # type: ignore[arg-type]
    chunks: dict[int, bytes | memoryview] = {0: b"a" * 5, 2: memoryview(b"bb"), 5: b"c" * 9}
    pieces = fmt.pieces(chunks)
    assert b"".join(pieces) == fmt.build(chunks)
    assert [bytes(p) for p in (pieces[1:] if index_location == "start" else pieces[:-1])] == [
        bytes(chunks[p]) for p in sorted(chunks)
    ]  # the chunks themselves, in place order
    assert fmt.split(fmt.build(chunks), "k") == {p: bytes(c) for p, c in chunks.items()}


_made: list[list[str]] = []  # (the files made while a test counts; audit hooks stay for good)


def _count_made(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _made and isinstance(args[2], int) and args[2] & os.O_CREAT:
        _made[-1].append(os.fsdecode(args[0]))


sys.addaudithook(_count_made)


@contextlib.contextmanager
def _files_made() -> Iterator[list[str]]:
    _made.append([])
    try:
        yield _made[-1]
    finally:
        _made.pop()


def test_a_commit_makes_one_file_its_lock_which_becomes_the_shard(tmp_path: Path) -> None:
    inner, shard = LocalInner(tmp_path), tmp_path / "shard"
    for new in (b"first", b"second, longer"):  # a new shard, then one replaced
        with _files_made() as made:
            inner._update(shard, lambda old, new=new: new, True)
        assert made == [str(lock_path(shard))]
        assert shard.read_bytes() == new
        assert sorted(p.name for p in tmp_path.iterdir()) == ["shard"]


def test_a_failed_commit_leaves_the_shard_as_it_was_and_no_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner, shard = LocalInner(tmp_path), tmp_path / "shard"
    inner._update(shard, lambda old: b"kept", True)
    monkeypatch.setattr(local_module, "os", _ShortWrites(0, 1))  # the disk takes nothing
    with pytest.raises(OSError, match="wrote nothing"):
        inner._update(shard, lambda old: [b"lost" * 100, b"more"], True)
    monkeypatch.undo()
    assert shard.read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard"]


def test_a_lock_file_another_process_made_never_becomes_the_shard(tmp_path: Path) -> None:
    """The shard a commit writes is its writer's, made with its umask, whoever made
    the lock file it took (another process, another user, another umask)."""
    inner, shard = LocalInner(tmp_path), tmp_path / "shard"
    lock_path(shard).touch(mode=0o600)  # (made, then left or released, by someone else)
    os.chmod(lock_path(shard), 0o600)
    umask = os.umask(0o022)
    try:
        with _files_made() as made:
            inner._update(shard, lambda old: b"mine", True)
    finally:
        os.umask(umask)
    assert shard.read_bytes() == b"mine" and not lock_path(shard).exists()
    assert shard.stat().st_mode & 0o777 == 0o644
    assert len(made) == 2 and made[0] == str(lock_path(shard))  # the lock tried, then a temporary file


def _waiting_on(fd: int) -> bool:
    """Whether some flock waits on the file open at ``fd`` (``/proc/locks``: a waiter's
    line has ``->``; the file is ``major:minor:inode``)."""
    inode = os.fstat(fd).st_ino
    with open("/proc/locks") as locks:
        return any("->" in line and line.split()[-3].endswith(f":{inode}") for line in locks)


def _until_waiting_on(fd: int) -> None:
    """Wait (30 s at most) until another thread's flock waits on the file open at ``fd``."""
    deadline = time.monotonic() + 30
    while not _waiting_on(fd):  # the waiter blocks on this very file
        assert time.monotonic() < deadline, "the waiter never waited on the lock"
        time.sleep(0.001)


@contextlib.contextmanager
def _forked_child() -> Iterator[None]:
    """A child forked now, holding what it inherited (open files, their locks) until the
    block ends."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child: holds what it inherited until told to go
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    try:
        yield
    finally:
        os.close(write_end)
        os.waitpid(child, 0)


def _take_shared_lock_at_once(shard: Path) -> None:
    """Take and drop the shared lock a reader of the shard's index takes; BlockingIOError
    if someone holds it locked."""
    fd = os.open(shard, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_during_a_commit_does_not_keep_the_shard_locked(tmp_path: Path) -> None:
    """A child forked while a commit holds the lock shares the lock file's open file,
    which becomes the shard: the lock is released for the child too."""
    inner, shard = LocalInner(tmp_path), tmp_path / "shard"
    inside, go_on = threading.Event(), threading.Event()

    def change(old: bytes | None) -> bytes:
        inside.set()
        assert go_on.wait(30)
        return b"new"

    committing = threading.Thread(target=inner._update, args=(shard, change, True))
    committing.start()
    assert inside.wait(30)
    with _forked_child():
        go_on.set()
        committing.join(30)
        assert shard.read_bytes() == b"new"
        _take_shared_lock_at_once(shard)


@pytest.mark.skipif(
    not (hasattr(os, "fork") and os.path.exists("/proc/locks")), reason="needs fork, /proc/locks"
)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_while_a_writer_waits_does_not_keep_the_shard_locked(tmp_path: Path) -> None:
    """A waiter on a lock file that became the shard takes the lock on the shard, sees
    the name gone, and lets go: for a child forked while it waited too (the child
    shares the waiter's open file)."""
    shard = tmp_path / "shard"
    took, done = threading.Event(), threading.Event()

    def waiter() -> None:
        took.wait(30)
        with file_lock(shard):
            pass
        done.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    with contextlib.ExitStack() as child:
        with file_lock(shard) as held:
            took.set()
            _until_waiting_on(held.fd)
            child.enter_context(_forked_child())
            os.write(held.fd, b"new")
            held.become(shard)
        assert done.wait(30)
        _take_shared_lock_at_once(shard)


def test_what_a_killed_writer_left_in_a_lock_file_is_never_served(tmp_path: Path) -> None:
    inner, shard = LocalInner(tmp_path), tmp_path / "shard"
    inner._update(shard, lambda old: b"committed", True)
    lock_path(shard).write_bytes(b"x" * 5000)  # filled, then killed before its rename
    seen: list[bytes | None] = []

    def change(old: bytes | None) -> bytes:
        seen.append(old)
        return b"next"

    inner._update(shard, change, True)
    assert seen == [b"committed"]  # the shard as committed, not the lock file's bytes
    assert shard.read_bytes() == b"next"  # no tail of the longer leftover
    assert not lock_path(shard).exists()


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks")
def test_a_writer_waiting_on_a_lock_that_became_the_shard_takes_a_new_lock(tmp_path: Path) -> None:
    shard = tmp_path / "shard"
    seen: dict[str, int] = {}
    took, done = threading.Event(), threading.Event()

    def waiter() -> None:
        took.wait(30)
        with file_lock(shard) as held:
            seen["held"], seen["named"] = os.fstat(held.fd).st_ino, os.stat(held.path).st_ino
            seen["shard"] = os.stat(shard).st_ino
        done.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    with file_lock(shard) as held:
        took.set()
        _until_waiting_on(held.fd)
        os.write(held.fd, b"new")
        held.become(shard)
        assert not held.path.exists()
    assert done.wait(30)
    assert seen["held"] == seen["named"] != seen["shard"]  # a new lock file, not the shard
    assert shard.read_bytes() == b"new" and not lock_path(shard).exists()


def _commits_by_thread(
    tmp_path: Path, sizes: list[int], gate: threading.Barrier | None = None, gated_from: int = 0
) -> list[int]:
    """Commit one new object of each of ``sizes`` in one ``update_many``: the thread
    that made each (those from ``gated_from`` on wait at ``gate``, where given)."""
    import asyncio

    threads: list[int] = [0] * len(sizes)

    def change(k: int) -> Any:
        def made(old: Any) -> bytes:
            threads[k] = threading.get_ident()
            if gate is not None and k >= gated_from:
                gate.wait()
            return bytes(sizes[k])

        return made

    inner = LocalInner(tmp_path)
    changes = [(f"c/{k}", change(k)) for k in range(len(sizes))]
    errors = asyncio.run(inner.update_many(changes, read_old=False))
    assert errors == [None] * len(sizes)
    assert [(tmp_path / f"c/{k}").stat().st_size for k in range(len(sizes))] == sizes
    return threads


def test_small_commits_are_made_by_one_worker_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dozen quick system calls a commit: two threads at them would only hand the GIL
    back and forth."""
    monkeypatch.setattr(shardstore.tasks, "available_cores", lambda: 2)
    threads = _commits_by_thread(tmp_path, [4096] * 40)
    assert len(set(threads)) == 1 and threading.get_ident() not in threads


def test_big_commits_are_shared_out_from_the_first_big_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the first object of SHARED_COMMITS_FROM_BYTES, the rest go a thread per core:
    two of them are made at once (they wait for each other at a barrier; one thread
    alone would wait 10 s and fail)."""
    monkeypatch.setattr(shardstore.tasks, "available_cores", lambda: 2)
    big = local_module.SHARED_COMMITS_FROM_BYTES
    threads = _commits_by_thread(tmp_path, [100, big, big + 1, big + 2], threading.Barrier(2, timeout=10), 2)
    assert len(set(threads[:2])) == 1 and len(set(threads[2:])) == 2


def test_commits_are_shared_out_from_the_first_whose_change_was_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change that took its thread SHARED_COMMITS_FROM_CPU_S (a shard encoded by its
    commit) shares the rest out however small the objects: two of them are made at
    once (they wait for each other at a barrier; one thread alone would fail)."""
    import asyncio
    import time

    monkeypatch.setattr(shardstore.tasks, "available_cores", lambda: 2)
    both = threading.Barrier(2, timeout=10)
    threads: list[int] = [0] * 4

    def change(k: int) -> Any:
        def made(old: Any) -> bytes:
            threads[k] = threading.get_ident()
            if k == 1:  # slow: the CPU time of an encoding
                began = time.thread_time()
                while time.thread_time() - began < 2 * local_module.SHARED_COMMITS_FROM_CPU_S:
                    pass
            elif k >= 2:
                both.wait()
            return b"x"

        return made

    errors = asyncio.run(
        LocalInner(tmp_path).update_many([(f"c/{k}", change(k)) for k in range(4)], read_old=False)
    )
    assert errors == [None] * 4
    assert len(set(threads[:2])) == 1 and len(set(threads[2:])) == 2


def test_a_cancelled_batch_of_small_commits_begins_no_more(tmp_path: Path) -> None:
    """Small objects are committed one at a time from the threads' cursor: a call
    cancelled while one is made ends once it is, the rest never begun."""
    import asyncio

    began, release, made = threading.Event(), threading.Event(), []

    def change(k: int) -> Any:
        def new(old: Any) -> bytes:
            if k == 0:
                began.set()
                release.wait(10)
            made.append(k)
            return b"x"

        return new

    async def main() -> None:
        inner = LocalInner(tmp_path)
        call = asyncio.ensure_future(
            inner.update_many([(f"c/{k}", change(k)) for k in range(50)], read_old=False)
        )
        assert await asyncio.to_thread(began.wait, 10)
        call.cancel()
        for _ in range(20):  # (a count of loop turns, not a time)
            await asyncio.sleep(0)
        assert not call.done()  # it waits for the commit under way
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(main())
    assert made == [0] and [p.name for p in (tmp_path / "c").iterdir() if not p.name.startswith(".")] == ["0"]
