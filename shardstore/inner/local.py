"""Local directories: atomic replacement, per-shard file locks, appends with a crash journal."""

from __future__ import annotations

import asyncio
import fcntl
import os
import uuid
from collections.abc import AsyncIterator, Hashable, Sequence
from pathlib import Path

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from shardstore.inner.base import (
    DEFAULT_ATTEMPTS,
    STALE,
    UNCHANGED,
    AppendBuilder,
    Change,
    InnerStore,
    failure,
    is_temporary,
)
from shardstore.inner.locks import file_lock


class LocalInner(InnerStore):
    """A local directory. Objects are replaced atomically (temporary file, then
    rename), so neither a concurrent reader nor a crash ever sees half a shard."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalInner) and self.root == other.root

    def __repr__(self) -> str:
        return f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        with failure("read", key):
            return await asyncio.to_thread(self._read, self._path(key), byte_range)

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        # One thread hop for the whole batch: local reads are fast, hops are not.
        with failure("read", requests[0][0] if requests else ""):
            return await asyncio.to_thread(lambda: [self._read(self._path(k), r) for k, r in requests])

    supports_versions = True

    async def get_many_versioned(
        self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        with failure("read", requests[0][0] if requests else ""):
            return await asyncio.to_thread(
                lambda: [
                    self._read_versioned(self._path(k), r, e)
                    for (k, r), e in zip(requests, expected, strict=True)
                ]
            )

    def version(self, key: str) -> Hashable | None:
        try:
            stat = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns)

    @staticmethod
    def _read(path: Path, byte_range: ByteRequest | None) -> bytes | None:
        return LocalInner._read_versioned(path, byte_range, None)[0]

    @staticmethod
    def _read_versioned(
        path: Path, byte_range: ByteRequest | None, expected: Hashable | None
    ) -> tuple[bytes | None, Hashable | None]:
        """A read, with the file's version: (inode, size, mtime). Replacing a shard makes
        a new inode, appending changes its size, so a cached index can be checked here."""
        try:
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                if expected is not None and version != expected:
                    return STALE, version
                if byte_range is None:
                    # a whole shard: its tail must be an index, not half an append
                    fcntl.flock(f.fileno(), fcntl.LOCK_SH)
                    data = f.read()
                    stat = os.fstat(f.fileno())
                    return data, (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                if isinstance(byte_range, RangeByteRequest):
                    f.seek(byte_range.start)
                    return f.read(max(byte_range.end - byte_range.start, 0)), version
                if isinstance(byte_range, OffsetByteRequest):
                    f.seek(byte_range.offset)
                    return f.read(), version
                if isinstance(byte_range, SuffixByteRequest):
                    # A shard's index: appends hold the file exclusively while they extend
                    # it, so a shared lock sees the whole old tail or the whole new one.
                    fcntl.flock(f.fileno(), fcntl.LOCK_SH)
                    stat = os.fstat(f.fileno())
                    version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                    f.seek(max(stat.st_size - byte_range.suffix, 0))
                    return f.read(byte_range.suffix), version
                raise TypeError(f"Unexpected byte_range, got {byte_range}")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None, None

    async def set(self, key: str, value: bytes) -> None:
        with failure("write", key):
            await asyncio.to_thread(self._write, self._path(key), value)

    @staticmethod
    def _write(path: Path, value: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
        try:
            for attempt in range(3):  # a concurrent delete may prune the directory we just made
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    with open(tmp, "wb") as f:
                        f.write(value)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
            if path.is_dir():
                path.rmdir()  # an empty directory left by another layout; never one with files
            os.replace(tmp, path)
        finally:
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

    def _update(self, path: Path, change: Change, read_old: bool) -> None:
        with file_lock(path):
            # An append journal seen under the lock is a crashed append's: the shard's
            # committed state ends at the size it holds. Replacing the shard ends it.
            journal = self._journal(path)
            pending = journal.read_text() if journal.exists() else None
            old = self._read(path, None) if read_old else None
            if old is not None and pending:
                old = old[: int(pending)]
            new = change(old)
            if new is None:
                if old is not None or not read_old:
                    path.unlink(missing_ok=True)
            elif new is not UNCHANGED:
                self._write(path, new)
            if pending is not None and new is not UNCHANGED:
                journal.unlink()
        if new is None:
            self._prune(path.parent)

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

    supports_append = True

    async def append(self, key: str, build: AppendBuilder) -> bool:
        with failure("append to", key):
            return await asyncio.to_thread(self._append, self._path(key), build)

    @staticmethod
    def _journal(path: Path) -> Path:
        return path.with_name(f".{path.name}.appending")

    def _append(self, path: Path, build: AppendBuilder) -> bool:
        """Append under the shard's file lock (writers take turns with rewrites too) and
        an exclusive ``flock`` on the shard itself (index readers take a shared one, so
        they see the whole old tail or the whole new one). A journal holding the old
        size exists while bytes are being appended; if a crash leaves it behind, the
        next append cuts the object back to that size, so the old index is the last
        bytes again."""
        with file_lock(path):
            try:
                f = open(path, "r+b")  # noqa: SIM115  (closed below, after the lock)
            except (FileNotFoundError, IsADirectoryError):
                return False
            with f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                fd = f.fileno()
                journal = self._journal(path)
                if journal.exists():
                    os.ftruncate(fd, int(journal.read_text() or os.fstat(fd).st_size))
                    journal.unlink()
                size = os.fstat(fd).st_size
                payload = build(size, lambda start, stop: os.pread(fd, stop - start, start))
                if payload:
                    journal.write_text(str(size))
                    try:
                        os.pwrite(fd, payload, size)
                    except BaseException:
                        os.ftruncate(fd, size)
                        raise
                    journal.unlink()
        return True

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
