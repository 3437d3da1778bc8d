"""Local directories: atomic replacement, per-shard file locks, appends with a crash journal."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from pathlib import Path
from stat import S_ISDIR
from typing import Any, cast

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from shardstore.inner.base import (
    DEFAULT_ATTEMPTS,
    STALE,
    UNCHANGED,
    AppendBuilder,
    Capabilities,
    Change,
    ChunkBytes,
    InnerStore,
    ReadInto,
    ReadThen,
    Written,
    failure,
    handing_as_read,
    is_temporary,
    storage_error,
    took,
    written_nbytes,
)
from shardstore.inner.locks import file_lock
from shardstore.inner.mounts import on_local_disk
from shardstore.tasks import in_threads

_IOV_MAX = max(os.sysconf("SC_IOV_MAX"), 16)
"""The most pieces one ``writev`` takes (16, POSIX's least, where the system does not say)."""


def _write_pieces(fd: int, pieces: list[bytes | memoryview]) -> None:
    """Write ``pieces`` one after another from the file's position: ``writev``, no join
    (a shard's index and chunks, each copied only into the page cache)."""
    views = [view for view in (memoryview(piece).cast("B") for piece in pieces) if view.nbytes]
    first = 0
    while first < len(views):
        written = os.writev(fd, views[first : first + _IOV_MAX])
        if written == 0:
            raise OSError(f"writev wrote nothing of {sum(v.nbytes for v in views[first:])} bytes")
        while first < len(views) and written >= views[first].nbytes:
            written -= views[first].nbytes
            first += 1
        if written:  # a piece written in part: the rest of it next
            views[first] = views[first][written:]


def _replacing(path: Path, rename: Callable[[], object]) -> None:
    """``rename()``, a rename onto ``path``: an empty directory there, left by another
    layout, is removed first (never one with files)."""
    try:
        rename()
    except IsADirectoryError:
        path.rmdir()
        rename()


def _timed(change: Change, spent: list[float], old: bytes | None) -> Any:
    """``change(old)``, the CPU time it took its thread put in ``spent[0]``."""
    began = time.thread_time()
    try:
        return change(old)
    finally:
        spent[0] = time.thread_time() - began


def journal_path(path: Path | str) -> Path:
    """The append journal of a local shard."""
    return Path(_journal_name(path))


def _journal_name(path: Path | str) -> str:
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.appending")


def committed_size(path: Path | str, stat: os.stat_result) -> int:
    """The size of the shard's last committed state: the file's size, unless a crashed
    append left a journal naming this very file (inode) and a smaller size. A journal
    naming another inode (the shard was replaced since) or unreadable is ignored."""
    try:  # (string paths and os.open: every whole or index read asks, most find no journal)
        fd = os.open(_journal_name(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return stat.st_size
    try:
        inode, size = (int(v) for v in os.read(fd, 64).split())
    except (OSError, ValueError):
        return stat.st_size
    finally:
        os.close(fd)
    return size if inode == stat.st_ino and size < stat.st_size else stat.st_size


BULKY_BYTES = 1 << 20
"""Ranges read in one batch that, together, are worth a thread per core (and one more)."""


def _bulky(requests: Sequence[tuple[str, ByteRequest | None]]) -> bool:
    """Whether a batch of reads moves enough bytes to share it out over the cores:
    several whole objects (shards fetched whole), or ranges of BULKY_BYTES or more."""
    if len(requests) < 2:
        return False
    total = 0
    for _, byte_range in requests:
        if byte_range is None:
            return True
        if isinstance(byte_range, RangeByteRequest):
            total += byte_range.end - byte_range.start
    return total >= BULKY_BYTES


SHARED_COMMITS_FROM_BYTES = 64 << 10
"""Commits of a batch are shared out, a thread per core and one more, from the first
object this big or bigger: such a commit is mostly a copy into the page cache, which
cores make side by side, and the encoding of its shard where the commit builds it
(:class:`~shardstore.writing.updates.ShardToBuild`); the thread more keeps the cores
busy while one waits in the kernel (64 MiB whole writes of shards encoded by their
commits, alternated, medians of 12: zstd 142.9 ms with three threads against 146.6
with two, overwrites 199.7 against 235.1; uncompressed 75.7 against 88.5). Smaller
ones are made by one worker thread, one after another: each is a dozen quick system
calls, at which two threads only hand the GIL back and forth (1,024 new shards of
4 KiB, alternated, medians of 10: a whole write took 735 ms shared, 671 ms on one
thread)."""

SHARED_COMMITS_FROM_CPU_S = 0.0003
"""Commits are shared out from the first whose change took its thread this much CPU,
too, whatever it wrote (the change's: the system calls of a first commit into a new
directory take about as much): shards encoded by their commits that compress well
make small objects, and without this a whole write's encoding went to one thread (a
64 MiB zstd write of smooth data took 74 ms against 56 before such commits; with
this, 110 against 115, alternated, medians of 12). Shards of 4 KiB built by their
commits come near it, and their writes take about as long either way (1,024 of
them, alternated, medians of 6: 1,150 ms with this, 1,129 with every commit after
the first shared out)."""

AT_ONCE_SLOW_S = 0.002
"""A batch read on the caller's thread that takes longer than this (opening files on a
slow file system) ends such reads for its store (see :meth:`LocalInner.get_many_versioned`)."""

_PREADV = hasattr(os, "preadv")
"""Whether the system reads into memory given."""
_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None) if _PREADV else None
"""``preadv``'s flag to fail rather than wait for the disk (Linux), if there is one."""


class _WouldWait(Exception):
    """A read on the caller's thread that would wait: for the disk, for a lock, or to read
    more than it may; ``always`` where the file system cannot say (``RWF_NOWAIT``
    unsupported)."""

    def __init__(self, always: bool = False) -> None:
        self.always = always


def _pread(fd: int, n: int, offset: int, at_once: int | None, into: ReadInto | None = None) -> ChunkBytes:
    """``n`` bytes at ``offset`` (fewer at the end of the file), into ``into(n)`` where
    given (and the system reads into memory); with ``at_once``, only what the page
    cache holds whole and ``at_once`` bytes at most, else _WouldWait."""
    if not _PREADV:
        into = None
    if at_once is None and into is None:
        return os.pread(fd, n, offset)
    if at_once is not None and n > at_once:
        raise _WouldWait()
    flags = 0 if at_once is None else _NOWAIT
    assert flags is not None  # (no read is made at once without RWF_NOWAIT: see LocalInner)
    buf = bytearray(n) if into is None else into(n)
    try:
        got = os.preadv(fd, [buf], offset, flags) if n else 0
    except BlockingIOError:
        raise _WouldWait() from None
    except OSError as exc:
        if at_once is not None and exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            raise _WouldWait(always=True) from None
        raise
    if at_once is not None and got < n:  # (the end of the file, or a part not cached: a thread reads it)
        raise _WouldWait()
    return bytes(buf) if into is None else memoryview(buf)[:got]


class LocalInner(InnerStore):
    """The directory ``root`` as an inner store. Objects are replaced atomically (a
    shard written into its lock file, anything else into a temporary file, then
    renamed onto the object), so neither a concurrent reader nor a crash ever sees
    half a shard."""

    capabilities = Capabilities(
        versions=True,
        versioned_ranges=True,
        append=True,
        writes_buffers=True,
        hands_as_read=True,
        changes_in_threads=True,
    )

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()
        self._root = os.fspath(self.root)
        self._at_once = _NOWAIT is not None and on_local_disk(self._root)
        self.capabilities = handing_as_read(
            self, self.capabilities, LocalInner.get_many_versioned
        )  # (see get_many_into)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalInner) and self.root == other.root

    def __repr__(self) -> str:
        return f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def _file(self, key: str) -> str:
        """``_path(key)`` as a string, for reads: made without a Path for the plain keys
        chunk and shard reads use (making a Path costs more than reading a shard index)."""
        if key and key[0] != "/" and not key.endswith(("/", "/.")) and "//" not in key:
            return f"{self._root}/{key}"
        return os.fspath(self._path(key))

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        with failure("read", key):
            return await asyncio.to_thread(self._read, self._file(key), byte_range)

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        return [value for value, _ in await self.get_many_versioned(requests, [None] * len(requests))]

    async def get_many_versioned(
        self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        # (bytes: a read into given memory alone is not)
        return cast(list[tuple[bytes | None, Hashable | None]], await self._get_many(requests, expected))

    async def get_many_into(
        self,
        requests: Sequence[tuple[str, ByteRequest | None]],
        expected: Sequence[Hashable | None],
        into: ReadInto,
        then: ReadThen | None = None,
    ) -> list[tuple[ChunkBytes | None, Hashable | None]]:
        if type(self).get_many_versioned is not LocalInner.get_many_versioned:
            # a subclass that changes reads (faults, delays) sees these too, as bytes
            return await super().get_many_into(requests, expected, into, then)
        return await self._get_many(requests, expected, into, then)

    async def _get_many(
        self,
        requests: Sequence[tuple[str, ByteRequest | None]],
        expected: Sequence[Hashable | None],
        into: ReadInto | None = None,
        then: ReadThen | None = None,
    ) -> list[tuple[ChunkBytes | None, Hashable | None]]:
        # A batch of a few small reads is read on this thread, while none would wait
        # (a hop to a worker thread costs about 0.1 ms, five times eight index reads
        # from the page cache); what is left, in one thread hop; shards read whole, by
        # a thread per core and one more: such a read is mostly a copy, which one core
        # serialises, and a thread decoding what it read waits for the GIL part of its
        # time, the others keeping the cores busy meanwhile (64 MiB whole reads on two
        # cores, alternated: uncompressed 73.5 against 81.6 ms, zstd 117.7 against 119.1).
        got: list[tuple[ChunkBytes | None, Hashable | None]] = [(None, None)] * len(requests)

        def read(part: range) -> None:
            for k in part:
                key, byte_range = requests[k]
                took(got, k, self._read_key(key, byte_range, expected[k], into=into), then)

        with failure("read", requests[0][0] if requests else ""):
            if _bulky(requests):
                await in_threads(read, len(requests), extra=1)
                return got
            first = self._read_at_once(requests, expected, got, into, then) if self._at_once else 0
            rest = range(first, len(requests))
            if rest and then is None:
                await asyncio.to_thread(read, rest)
            elif rest:  # (then's work ends before the call does, cancelled or not: see in_threads)
                await in_threads(lambda part: read(rest[part.start : part.stop]), len(rest))
        return got

    def _read_at_once(
        self,
        requests: Sequence[tuple[str, ByteRequest | None]],
        expected: Sequence[Hashable | None],
        got: list[tuple[ChunkBytes | None, Hashable | None]],
        into: ReadInto | None,
        then: ReadThen | None,
    ) -> int:
        """Read the batch from its start on this thread for as long as no read would
        wait (for the disk, for an appender's lock, or to read more than BULKY_BYTES
        in all): how many were read. A batch that takes longer than AT_ONCE_SLOW_S
        anyway (opening files on a slow file system) ends this for the store: its
        reads go to a worker thread from then on, as they do where the file system
        cannot tell what would wait, and off local disks (an open there may wait on a
        server: see :mod:`~shardstore.inner.mounts`)."""
        began, left = time.monotonic(), BULKY_BYTES
        for k, (key, byte_range) in enumerate(requests):
            try:
                read = self._read_key(key, byte_range, expected[k], at_once=left, into=into)
            except _WouldWait as wait:
                self._at_once = not wait.always
                return k
            value = read[0]
            left -= 0 if value is None or value is STALE else len(value)
            handed = time.monotonic()
            took(got, k, read, then)
            began += time.monotonic() - handed  # (the time of reads alone counts)
            if time.monotonic() - began > AT_ONCE_SLOW_S:
                self._at_once = False
                return k + 1
        return len(requests)

    def _read_key(
        self,
        key: str,
        byte_range: ByteRequest | None,
        expected: Hashable | None,
        at_once: int | None = None,
        into: ReadInto | None = None,
    ) -> tuple[ChunkBytes | None, Hashable | None]:
        """One read of a batch (:meth:`_read_versioned`); its failure names its own key,
        not the batch's first."""
        try:
            return self._read_versioned(self._file(key), byte_range, expected, at_once=at_once, into=into)
        except OSError as exc:
            raise storage_error("read", key, exc) from exc

    def version(self, key: str) -> Hashable | None:
        try:
            # a string path: a Path costs more than the stat (cached shards are checked per read)
            stat = os.stat(self._file(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def object_size(self, version: Hashable | None) -> int | None:
        return version[1] if isinstance(version, tuple) else None

    @staticmethod
    def _read(path: Path | str, byte_range: ByteRequest | None) -> bytes | None:
        value, _ = LocalInner._read_versioned(path, byte_range, None)
        return cast(bytes | None, value)  # (read into no memory given: bytes)

    @staticmethod
    def _read_versioned(
        path: Path | str,
        byte_range: ByteRequest | None,
        expected: Hashable | None,
        at_once: int | None = None,
        into: ReadInto | None = None,
    ) -> tuple[ChunkBytes | None, Hashable | None]:
        """A read, with the file's version: (inode, size, mtime). Replacing an object
        makes a new inode, appending changes its size, so whatever a caller derived
        from an earlier read can be checked here.

        Whole and suffix reads take a shared lock (the ``append`` capability: they
        see an append whole or not at all); if a crashed append left a torn tail,
        they see the object as it was committed (version None: not to be cached).
        Ranges at known offsets need no lock: appends never move existing bytes.

        With ``at_once`` (bytes), a read on the caller's thread: _WouldWait where it
        would wait for the disk or the lock, or read more than that."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None, None
        try:
            tail = byte_range is None or isinstance(byte_range, SuffixByteRequest)
            if tail:  # (the lock before the file's one fstat: the version is that of what is read)
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH if at_once is None else fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise _WouldWait() from None
            try:
                stat = os.fstat(fd)
                if S_ISDIR(stat.st_mode):
                    return None, None
                version: Hashable | None = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                if expected is not None and version != expected:
                    return STALE, version
                if isinstance(byte_range, RangeByteRequest):
                    stop = min(byte_range.end, stat.st_size)
                    return _pread(
                        fd, max(stop - byte_range.start, 0), byte_range.start, at_once, into
                    ), version
                if isinstance(byte_range, OffsetByteRequest):
                    return _pread(
                        fd, max(stat.st_size - byte_range.offset, 0), byte_range.offset, at_once, into
                    ), version
                if not tail:
                    raise TypeError(f"Unexpected byte_range, got {byte_range}")
                size = committed_size(path, stat)
                start = max(size - byte_range.suffix, 0) if isinstance(byte_range, SuffixByteRequest) else 0
                return _pread(fd, size - start, start, at_once, into), (
                    version if size == stat.st_size else None
                )
            finally:  # (released, not only closed: a child forked meanwhile shares the file)
                if tail:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    async def set(self, key: str, value: bytes) -> None:
        with failure("write", key):
            await asyncio.to_thread(self._write, self._path(key), value)

    @staticmethod
    def _write(path: Path, value: Written) -> None:
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
        replaced = False
        try:
            for attempt in range(3):  # a concurrent delete may prune the directory we just made
                try:
                    with open(tmp, "wb") as f:
                        if isinstance(value, list):
                            _write_pieces(f.fileno(), value)  # (nothing goes through f's buffer)
                        else:
                            f.write(value)
                    break
                except FileNotFoundError:  # no directory yet (a shard's lock usually made it)
                    if attempt == 2:
                        raise
                    with contextlib.suppress(FileExistsError):  # made meanwhile (see file_lock)
                        path.parent.mkdir(parents=True, exist_ok=True)
            _replacing(path, lambda: os.replace(tmp, path))
            replaced = True
        finally:
            if not replaced:
                tmp.unlink(missing_ok=True)

    async def delete(self, key: str) -> None:
        with failure("delete", key):
            await asyncio.to_thread(self._unlink, self._path(key))

    async def update(
        self, key: str, change: Change, *, read_old: bool = True, attempts: int = DEFAULT_ATTEMPTS
    ) -> None:
        # Under the shard's file lock, which every writer in every process takes: no
        # conflict to retry. Read, change and replace in one worker-thread hop.
        with failure("update", key):
            await asyncio.to_thread(self._update, self._path(key), change, read_old)

    async def update_many(
        self,
        changes: Sequence[tuple[str, Change]],
        *,
        read_old: bool = True,
        attempts: int = DEFAULT_ATTEMPTS,
    ) -> list[Exception | None]:
        # A local commit is a dozen quick system calls and a thread hop costs about as
        # much: small objects are committed by one worker thread, one after another,
        # until one is big or its change slow (an encoding); from there on they are
        # shared out, one hop per thread, a thread more than the cores (see
        # SHARED_COMMITS_FROM_BYTES, SHARED_COMMITS_FROM_CPU_S). Each commit is made
        # under its file lock.
        errors: list[Exception | None] = [None] * len(changes)
        rest: list[int] = []  # the objects after the first big one: shared out
        big = False

        def commit(k: int, spent: list[float] | None = None) -> int:
            key, change = changes[k]
            if spent is not None:  # (the CPU time of the change itself, into spent[0])
                change = functools.partial(_timed, change, spent)
            try:
                with failure("update", key):
                    return self._update(self._path(key), change, read_old) or 0  # (a subclass may say None)
            except Exception as exc:
                errors[k] = exc
                return 0

        def one_by_one(part: range) -> None:
            nonlocal big
            for k in part:
                if big:
                    rest.append(k)
                    continue
                spent = [0.0]
                big = commit(k, spent) >= SHARED_COMMITS_FROM_BYTES or spent[0] >= SHARED_COMMITS_FROM_CPU_S

        def shared(part: range) -> None:
            for k in part:
                commit(rest[k])

        # (an object at a time, from the threads' cursor: a cancelled call begins no more)
        await in_threads(one_by_one, len(changes), at_most=1)
        await in_threads(shared, len(rest), extra=1)
        return errors

    def _update(self, path: Path, change: Change, read_old: bool) -> int:
        """The change made under the object's file lock: the bytes it wrote."""
        with file_lock(path) as held:
            old = self._read(path, None) if read_old else None  # as committed
            new = change(old)
            if new is None:
                if old is not None or not read_old:
                    path.unlink(missing_ok=True)
            elif new is not UNCHANGED:
                if held.fresh:  # written into the lock file, which becomes the object
                    _write_pieces(held.fd, new if isinstance(new, list) else [new])
                    _replacing(path, lambda: held.become(path))
                else:  # (a lock file another process made, or a dead writer left)
                    self._write(path, new)
            if new is not UNCHANGED:  # a crashed append's journal ends with the file it named
                journal_path(path).unlink(missing_ok=True)
        if new is None:
            self._prune(path.parent)
        return 0 if new is None or new is UNCHANGED else written_nbytes(new)

    def _unlink(self, path: Path) -> None:
        """Delete a file and the directories it leaves empty, as an object store would."""
        path.unlink(missing_ok=True)
        self._prune(path.parent)

    def _prune(self, directory: Path) -> None:
        for parent in [directory, *directory.parents]:
            if parent == self.root or self.root not in parent.parents:
                break
            try:
                parent.rmdir()
            except OSError:  # not empty (or already gone): stop
                break

    async def getsize(self, key: str) -> int | None:
        with failure("size", key):
            try:
                path = self._path(key)
                return path.stat().st_size if path.is_file() else None
            except (FileNotFoundError, NotADirectoryError):
                return None

    def _walk(self, prefix: str) -> list[str]:
        base, _, _ = prefix.rpartition("/")
        top = self._path(base)
        keys: list[str] = []
        for dirpath, _dirs, files in os.walk(top):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in files:
                if is_temporary(name):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return keys

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        with failure("list", prefix):
            keys = await asyncio.to_thread(self._walk, prefix)
        for key in keys:
            yield key

    async def append(self, key: str, build: AppendBuilder) -> bool:
        with failure("append to", key):
            return await asyncio.to_thread(self._append, self._path(key), build)

    def _append(self, path: Path, build: AppendBuilder) -> bool:
        """Append under the object's file lock (writers take turns with rewrites too)
        and an exclusive ``flock`` on the object itself (whole and suffix readers take
        a shared one). While bytes are being appended a journal names the file and its
        committed size; one a crash left behind for this file cuts it back to that
        size, so its last committed bytes are its tail again (see :func:`committed_size`)."""
        with file_lock(path):
            try:
                f = open(path, "r+b")  # noqa: SIM115  (closed below, after the lock)
            except (FileNotFoundError, IsADirectoryError):
                return False
            with f:
                fd = f.fileno()
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    self._append_locked(path, fd, build)
                finally:  # (released, not only closed: a child forked meanwhile shares the file)
                    fcntl.flock(fd, fcntl.LOCK_UN)
        return True

    @staticmethod
    def _append_locked(path: Path, fd: int, build: AppendBuilder) -> None:
        """The append itself, under both locks (see :meth:`_append`)."""
        journal = journal_path(path)
        stat = os.fstat(fd)
        size = committed_size(path, stat)
        if size != stat.st_size:
            os.ftruncate(fd, size)
        journal.unlink(missing_ok=True)  # ours, now applied, or another file's
        payload = build(size, lambda start, stop: os.pread(fd, stop - start, start))
        if payload:
            journal.write_text(f"{stat.st_ino} {size}")
            try:
                os.pwrite(fd, payload, size)
            except BaseException:
                os.ftruncate(fd, size)
                raise
            journal.unlink()

    def _children(self, prefix: str) -> list[str]:
        """One directory level; subdirectories only if some file lies below them."""
        try:
            entries = list(os.scandir(self._path(prefix.rstrip("/"))))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(
            e.name
            for e in entries
            if not is_temporary(e.name) and (e.is_file() or (e.is_dir() and self._holds_file(e.path)))
        )

    @staticmethod
    def _holds_file(directory: str) -> bool:
        return any(not is_temporary(f) for _, _, files in os.walk(directory) for f in files)

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        with failure("list", prefix):
            names = await asyncio.to_thread(self._children, prefix)
        for name in names:
            yield name

    async def temporary_files(self, prefix: str) -> list[str]:
        def walk() -> list[str]:
            top = self._path(prefix.rpartition("/")[0])
            found = (
                Path(folder, name).relative_to(self.root).as_posix()
                for folder, _, names in os.walk(top)
                for name in names
                if is_temporary(name)
            )
            return sorted(key for key in found if key.startswith(prefix))

        with failure("list", prefix):
            return await asyncio.to_thread(walk)
