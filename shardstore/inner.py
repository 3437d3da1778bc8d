"""Adapters that give every kind of wrapped storage the same small async API.

shardstore needs only whole and ranged reads (singly and batched), writes,
deletes, sizes and listings. Each adapter maps those onto its storage's own
primitives: a zarr ``Store``, an fsspec file system (its async API where it
has one, threads otherwise), local files (replaced atomically), or a plain
mapping. Failures other than "not found" become :class:`InnerStoreError`
naming the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.mapping import FSMap
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import FsspecStore, LocalStore

from shardstore.errors import InnerStoreError

__all__ = [
    "FsspecInner",
    "InnerStore",
    "LocalInner",
    "MappingInner",
    "ZarrInner",
    "adapt",
]

T = TypeVar("T")
AppendBuilder = Callable[[int, Callable[[int, int], bytes]], bytes | None]
UNCHANGED = b"<unchanged>"
"""Returned by an update's change function: leave the object as it is (compared by identity)."""
Change = Callable[[bytes | None], bytes | None]
TEMP_SUFFIXES = (".partial", ".appending")
"""Our own temporary files beside objects in a directory: never listed as keys."""


@contextlib.contextmanager
def _failure(op: str, key: str) -> Iterator[None]:
    """Turn a storage failure into an InnerStoreError naming the operation and key."""
    try:
        yield
    except InnerStoreError:
        raise
    except Exception as exc:
        raise InnerStoreError(f"inner store failed to {op} {key!r}: {type(exc).__name__}: {exc}") from exc


def slice_range(value: bytes, byte_range: ByteRequest | None) -> bytes:
    """Apply a byte request to a whole value (short data past the end, like zarr's stores)."""
    if byte_range is None:
        return value
    if isinstance(byte_range, RangeByteRequest):
        return value[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return value[byte_range.offset :]
    if isinstance(byte_range, SuffixByteRequest):
        return value[max(len(value) - byte_range.suffix, 0) :]
    raise TypeError(f"Unexpected byte_range, got {byte_range}")


def _names_under(keys: Iterator[str] | list[str], prefix: str) -> list[str]:
    """First path segments below ``prefix`` (which is "" or ends with "/")."""
    return sorted({k[len(prefix) :].split("/", 1)[0] for k in keys if k.startswith(prefix) and k != prefix})


class InnerStore(ABC):
    """The wrapped storage as seen by the sharding layer."""

    @abstractmethod
    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None: ...

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        """Several reads in one batch; adapters with a batched range API override this."""
        return list(await asyncio.gather(*(self.get(k, r) for k, r in requests)))

    @abstractmethod
    async def set(self, key: str, value: bytes) -> None: ...

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""

    @abstractmethod
    async def getsize(self, key: str) -> int | None: ...

    async def exists(self, key: str) -> bool:
        return await self.getsize(key) is not None

    @abstractmethod
    def list_prefix(self, prefix: str) -> AsyncIterator[str]: ...

    @abstractmethod
    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        """Names directly below ``prefix`` ("" or ending in "/") that hold at least one key."""

    async def update(self, key: str, change: Change) -> None:
        """Read-modify-write one object: ``change(old)`` returns the new bytes, None to
        delete, or ``UNCHANGED``. Adapters that can do it in one step override this."""
        old = await self.get(key)
        new = change(old)
        if new is None:
            if old is not None:
                await self.delete(key)
        elif new is not UNCHANGED:
            await self.set(key, new)

    supports_append = False

    async def append(self, key: str, build: AppendBuilder) -> bool:
        """Append ``build(size, read)`` to an existing object, holding it exclusively.

        ``build`` gets the object's size and a ``read(start, stop)`` function and
        returns the bytes to append (None: nothing). Returns False, doing nothing,
        if there is no such object. Only stores that can append implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot append")


class ZarrInner(InnerStore):
    """Any ``zarr.abc.store.Store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ZarrInner) and self.store == other.store

    def __repr__(self) -> str:
        return repr(self.store)

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        with _failure("read", key):
            buf = await self.store.get(key, default_buffer_prototype(), byte_range)
        return None if buf is None else buf.to_bytes()

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        with _failure("read", requests[0][0] if requests else ""):
            bufs = await self.store.get_partial_values(default_buffer_prototype(), list(requests))
        return [None if b is None else b.to_bytes() for b in bufs]

    async def set(self, key: str, value: bytes) -> None:
        with _failure("write", key):
            await self.store.set(key, default_buffer_prototype().buffer.from_bytes(value))

    async def delete(self, key: str) -> None:
        with _failure("delete", key):
            await self.store.delete(key)

    async def getsize(self, key: str) -> int | None:
        with _failure("size", key):
            try:
                return await self.store.getsize(key)
            except FileNotFoundError:
                return None

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        with _failure("list", prefix):
            async for key in self.store.list_prefix(prefix):
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        with _failure("list", prefix):
            async for name in self.store.list_dir(prefix):
                yield name


class MappingInner(InnerStore):
    """A plain ``MutableMapping[str, bytes]`` (a dict, a zarr v2 style store, ...)."""

    def __init__(self, mapping: MutableMapping[str, Any]) -> None:
        self.mapping = mapping

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MappingInner) and (
            self.mapping is other.mapping or self.mapping == other.mapping
        )

    def __repr__(self) -> str:
        return f"{type(self.mapping).__name__}@{id(self.mapping):#x}"

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        with _failure("read", key):
            try:
                value = self.mapping[key]
            except KeyError:
                return None
            return slice_range(bytes(value), byte_range)

    async def set(self, key: str, value: bytes) -> None:
        with _failure("write", key):
            self.mapping[key] = value

    async def delete(self, key: str) -> None:
        with _failure("delete", key):
            self.mapping.pop(key, None)

    async def getsize(self, key: str) -> int | None:
        with _failure("size", key):
            value = self.mapping.get(key)
            return None if value is None else len(value)

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        with _failure("list", prefix):
            keys = [k for k in list(self.mapping) if k.startswith(prefix)]
        for key in keys:
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        with _failure("list", prefix):
            names = _names_under(list(self.mapping), prefix)
        for name in names:
            yield name


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
        with _failure("read", key):
            return await asyncio.to_thread(self._read, self._path(key), byte_range)

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        # One thread hop for the whole batch: local reads are fast, hops are not.
        with _failure("read", requests[0][0] if requests else ""):
            return await asyncio.to_thread(lambda: [self._read(self._path(k), r) for k, r in requests])

    @staticmethod
    def _read(path: Path, byte_range: ByteRequest | None) -> bytes | None:
        try:
            with open(path, "rb") as f:
                if byte_range is None:
                    return f.read()
                if isinstance(byte_range, RangeByteRequest):
                    f.seek(byte_range.start)
                    return f.read(max(byte_range.end - byte_range.start, 0))
                if isinstance(byte_range, OffsetByteRequest):
                    f.seek(byte_range.offset)
                    return f.read()
                if isinstance(byte_range, SuffixByteRequest):
                    # A shard's index: appends hold the file exclusively while they extend
                    # it, so a shared lock sees the whole old tail or the whole new one.
                    fcntl.flock(f.fileno(), fcntl.LOCK_SH)
                    f.seek(max(os.fstat(f.fileno()).st_size - byte_range.suffix, 0))
                    return f.read(byte_range.suffix)
                raise TypeError(f"Unexpected byte_range, got {byte_range}")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    async def set(self, key: str, value: bytes) -> None:
        with _failure("write", key):
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
        with _failure("delete", key):
            await asyncio.to_thread(self._unlink, self._path(key))

    async def update(self, key: str, change: Change) -> None:
        # Read, change and replace in one worker-thread hop rather than two.
        with _failure("update", key):
            await asyncio.to_thread(self._update, self._path(key), change)

    def _update(self, path: Path, change: Change) -> None:
        old = self._read(path, None)
        new = change(old)
        if new is None:
            if old is not None:
                self._unlink(path)
        elif new is not UNCHANGED:
            self._write(path, new)

    def _unlink(self, path: Path) -> None:
        """Delete a file and the directories it leaves empty, as an object store would."""
        path.unlink(missing_ok=True)
        for parent in path.parents:
            if parent == self.root or self.root not in parent.parents:
                break
            try:
                parent.rmdir()
            except OSError:  # not empty (or already gone): stop
                break

    async def getsize(self, key: str) -> int | None:
        with _failure("size", key):
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
                if name.endswith(TEMP_SUFFIXES):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return keys

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        with _failure("list", prefix):
            keys = await asyncio.to_thread(self._walk, prefix)
        for key in keys:
            yield key

    supports_append = True

    async def append(self, key: str, build: AppendBuilder) -> bool:
        with _failure("append to", key):
            return await asyncio.to_thread(self._append, self._path(key), build)

    @staticmethod
    def _journal(path: Path) -> Path:
        return path.with_name(f".{path.name}.appending")

    def _append(self, path: Path, build: AppendBuilder) -> bool:
        """Append under an exclusive lock. A journal holding the old size exists while
        bytes are being appended; if a crash leaves it behind, the next append cuts the
        object back to that size, so the old index is the last bytes again."""
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
            if not e.name.endswith(TEMP_SUFFIXES)
            and (e.is_file() or (e.is_dir() and self._holds_file(e.path)))
        )

    @staticmethod
    def _holds_file(directory: str) -> bool:
        return any(files for _, _, files in os.walk(directory))

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        with _failure("list", prefix):
            names = await asyncio.to_thread(self._children, prefix)
        for name in names:
            yield name


class FsspecInner(InnerStore):
    """An fsspec file system below ``root``: its async API where it has one, else
    its sync API in worker threads (inline for the in-memory file system)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self._async_fs = _asynchronous_copy(fs)
        self._home_loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        self._inline = isinstance(fs, MemoryFileSystem)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FsspecInner) and self.fs == other.fs and self.root == other.root

    def __repr__(self) -> str:
        return f"{self.fs.protocol}:{self.root}"

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._async_fs is not None:
            return await self._call_async(name, *args, **kwargs)
        method: Callable[..., Any] = getattr(self.fs, name)
        if self._inline:
            return method(*args, **kwargs)
        return await asyncio.to_thread(method, *args, **kwargs)

    async def _call_async(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """An async file system's sessions belong to the event loop that first used
        them: run there, hopping over from any other loop (zarr's own loop and a
        user's ``asyncio.run`` may both use one store). If that loop has ended,
        start afresh on this one."""
        current = asyncio.get_running_loop()
        with self._loop_lock:
            home = self._home_loop
            if home is None or home.is_closed() or not home.is_running():
                if home is not None:
                    self._async_fs = _asynchronous_copy(self.fs, fresh=True)
                self._home_loop = home = current
            fs = self._async_fs
        call = getattr(fs, "_" + name)(*args, **kwargs)
        if home is current:
            return await call
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, home))

    @staticmethod
    def _limits(byte_range: ByteRequest | None) -> tuple[int | None, int | None]:
        if byte_range is None:
            return None, None
        if isinstance(byte_range, RangeByteRequest):
            return byte_range.start, byte_range.end
        if isinstance(byte_range, OffsetByteRequest):
            return byte_range.offset, None
        if isinstance(byte_range, SuffixByteRequest):
            return -byte_range.suffix, None
        raise TypeError(f"Unexpected byte_range, got {byte_range}")

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        # A whole object is read as the range "from 0": s3fs sends a HEAD before an
        # un-ranged GET, never before a ranged one.
        start, end = self._limits(byte_range) if byte_range is not None else (0, None)
        with _failure("read", key):
            try:
                return bytes(await self._call("cat_file", self._path(key), start=start, end=end))
            except (FileNotFoundError, IsADirectoryError):
                return None
            except (OSError, ValueError):
                if start is not None and start > 0:
                    raise
                # An empty object has no byte 0 (S3 answers 416); a suffix longer than the
                # object makes some file systems seek before 0: read it whole instead.
                try:
                    whole = bytes(await self._call("cat_file", self._path(key)))
                except (FileNotFoundError, IsADirectoryError):
                    return None
                return slice_range(whole, byte_range)

    async def set(self, key: str, value: bytes) -> None:
        with _failure("write", key):
            path = self._path(key)
            try:
                await self._call("pipe_file", path, value)
            except FileNotFoundError:
                # A file system with real directories: create the parents, once. Object
                # stores never get here, so they pay no extra request per write.
                await self._call("makedirs", path.rpartition("/")[0], exist_ok=True)
                await self._call("pipe_file", path, value)

    async def delete(self, key: str) -> None:
        with _failure("delete", key), contextlib.suppress(FileNotFoundError):
            await self._call("rm_file", self._path(key))

    async def getsize(self, key: str) -> int | None:
        with _failure("size", key):
            try:
                info = await self._call("info", self._path(key))
            except FileNotFoundError:
                return None
            return int(info["size"]) if info.get("type") == "file" else None

    async def _find(self, prefix: str) -> list[str]:
        base = self._path(prefix.rpartition("/")[0])
        try:
            paths = await self._call("find", base)
        except FileNotFoundError:
            return []
        cut = len(self.root) + 1 if self.root else 0
        keys = [p[cut:] if p.startswith(self.root) else p for p in map(self.fs._strip_protocol, paths)]
        return [k for k in keys if k.startswith(prefix)]

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        with _failure("list", prefix):
            keys = await self._find(prefix)
        for key in keys:
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        with _failure("list", prefix):
            try:
                paths = await self._call("ls", self._path(prefix.rstrip("/")), detail=False)
            except FileNotFoundError:
                paths = []
        names = sorted({self.fs._strip_protocol(p).rstrip("/").rpartition("/")[2] for p in paths})
        for name in names:
            yield name


def _asynchronous_copy(
    fs: fsspec.AbstractFileSystem, *, fresh: bool = False
) -> fsspec.AbstractFileSystem | None:
    """An instance of an async file system to drive from an event loop (``fresh``:
    never one fsspec cached, whose sessions may belong to a loop that has ended)."""
    if not getattr(fs, "async_impl", False):
        return None
    if getattr(fs, "asynchronous", False) and not fresh:
        return fs
    try:
        spec = json.loads(fs.to_json())
        spec["asynchronous"] = True
        if fresh:
            spec["skip_instance_cache"] = True
        return fsspec.AbstractFileSystem.from_json(json.dumps(spec))
    except Exception:  # not serialisable: use its sync API in threads instead
        return None


def adapt(inner: Any, storage_options: dict[str, Any] | None = None) -> InnerStore:
    """The adapter for whatever the user passed as the inner store."""
    if isinstance(inner, InnerStore):
        return inner
    if isinstance(inner, str | os.PathLike):
        fs, root = fsspec.url_to_fs(str(inner), **(storage_options or {}))
        return _from_fs(fs, root)
    if storage_options:
        raise TypeError("storage_options only apply when the inner store is given as a URL")
    if isinstance(inner, FSMap):
        return _from_fs(inner.fs, inner.root)
    if isinstance(inner, LocalStore):
        return LocalInner(inner.root)
    if isinstance(inner, FsspecStore):  # ours creates parent directories; zarr's does not
        return _from_fs(getattr(inner.fs, "sync_fs", inner.fs), inner.path)
    if isinstance(inner, Store):
        return ZarrInner(inner)
    if isinstance(inner, MutableMapping):
        return MappingInner(inner)
    raise TypeError(
        f"cannot wrap {type(inner).__name__}: pass an fsspec mapper, a URL, a zarr Store or a MutableMapping"
    )


def _from_fs(fs: fsspec.AbstractFileSystem, root: str) -> InnerStore:
    if isinstance(fs, LocalFileSystem):
        return LocalInner(root)
    return FsspecInner(fs, root)
