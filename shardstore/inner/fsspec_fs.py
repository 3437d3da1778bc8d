"""fsspec file systems: the async API on its home event loop, else threads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import os
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

import shardstore.sync_bridge as sync_bridge
from shardstore.errors import ConcurrentWriterWarning
from shardstore.inner import sessions
from shardstore.inner.base import ANY_VERSION, Capabilities, InnerStore, failure, slice_range
from shardstore.tasks import at_work, gather

T = TypeVar("T")

_HOME = "_shardstore_home_loop"
"""Attribute of an async file system instance: the event loop its sessions belong to."""
_READY = "_shardstore_ready"
"""Attribute of an async file system instance: :meth:`FsspecInner._prepare` has run for it."""
_HOP_CHECK_S = 0.5
"""How often a call waiting on another loop checks that the loop still runs."""
_HOME_LOCK = threading.Lock()


class FsspecInner(InnerStore):
    """An fsspec file system below ``root``: its async API where it has one, else
    its sync API in worker threads (inline for the in-memory file system)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self._async_fs = _async_api(fs)
        self._guests: dict[asyncio.AbstractEventLoop, fsspec.AbstractFileSystem | None] = {}
        """Instances for loops that serve sync calls while the home loop waits for them."""
        self._inline = isinstance(fs, MemoryFileSystem)
        self.capabilities = Capabilities(remote=not self._inline and not isinstance(fs, LocalFileSystem))

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
        return await self._on_home_loop(lambda fs: getattr(fs, "_" + name)(*args, **kwargs))

    async def _on_home_loop(self, call: Callable[[fsspec.AbstractFileSystem], Awaitable[Any]]) -> Any:
        """An async file system's sessions belong to one event loop, and calls run
        there, hopping over from any other loop (zarr's own loop and a user's
        ``asyncio.run`` may both use one store). An instance made for synchronous use
        (what every URL and mapper gives) belongs to fsspec's own I/O loop, which lasts
        as long as the process, so no session outlives its loop (an ``asyncio.run``
        ending leaves none unclosed); one the user made asynchronous belongs to the
        loop that first used it. If that loop has ended (or the instance comes from a
        parent process), calls go on with a fresh instance of our own. Each instance
        is prepared off its home loop before its first call, and its sessions are
        closed there at exit (:mod:`~shardstore.inner.sessions`)."""
        current = asyncio.get_running_loop()
        with _HOME_LOCK:
            fs = self._async_fs
            assert fs is not None
            home = _home(fs)
            if home is None or home.is_closed() or not home.is_running():
                if home is not None or _forked(fs):
                    fs = self._async_fs = _fresh_copy(self.fs, asynchronous=fs.asynchronous)
                home = _home(fs) or current
                if fs.asynchronous:
                    setattr(fs, _HOME, home)
            if home is not current and sync_bridge.blocked(home):
                # The home loop waits for this very call (a sync call made inside it):
                # use an instance whose sessions belong to this loop instead.
                fs = self._guests.get(current)
                if fs is None:
                    fs = self._guests[current] = _fresh_copy(self.fs, asynchronous=True)
                    setattr(fs, _HOME, current)
                home = current
        assert fs is not None
        if not getattr(fs, _READY, False):
            await self._prepare(fs)
            setattr(fs, _READY, True)
            sessions.track(fs, _home)  # its sessions closed on its home loop at exit, in silence
        if home is current:
            return await call(fs)
        return await _hop(call(fs), home)

    async def _prepare(self, fs: fsspec.AbstractFileSystem) -> None:
        """What an instance needs, before its first call, done off its home loop so as
        not to block that loop (nothing for most file systems)."""

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
        with failure("read", key):
            try:
                return bytes(await self._call("cat_file", self._path(key), start=start, end=end))
            except (FileNotFoundError, IsADirectoryError):
                return None
            except (OSError, ValueError) as exc:
                if start is not None and start > 0:
                    if past_the_end(exc):
                        return b""  # like files and zarr's stores: no bytes past the end
                    raise
                # An empty object has no byte 0 (S3 answers 416); a suffix longer than the
                # object makes some file systems seek before 0: read it whole instead.
                try:
                    whole = bytes(await self._call("cat_file", self._path(key)))
                except (FileNotFoundError, IsADirectoryError):
                    return None
                return slice_range(whole, byte_range)

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        """One ``cat_ranges`` call (``_cat_ranges`` on async file systems: the requests
        run concurrently; on others one thread hop for the batch). Reads that fail
        for another reason than a missing object are retried alone by :meth:`get`,
        which knows the fallbacks and names the key in its error."""
        if len(requests) < 2:
            return [await self.get(key, byte_range) for key, byte_range in requests]
        limits = [self._limits(r) if r is not None else (0, None) for _, r in requests]
        with failure("read", requests[0][0]):
            values = await self._call(
                "cat_ranges",
                [self._path(key) for key, _ in requests],
                [start for start, _ in limits],
                [end for _, end in limits],
                on_error="return",
            )
        out: list[bytes | None] = [None] * len(requests)
        retry: list[int] = []
        for i, value in enumerate(values):
            if isinstance(value, FileNotFoundError | IsADirectoryError):
                continue
            if isinstance(value, BaseException):
                retry.append(i)
            else:
                out[i] = bytes(value)
        again = await gather(*(self.get(*requests[i]) for i in retry))
        for i, value in zip(retry, again, strict=True):
            out[i] = value
        return out

    async def set(self, key: str, value: bytes) -> None:
        with failure("write", key):
            path = self._path(key)
            try:
                await self._call("pipe_file", path, value)
            except FileNotFoundError:
                # A file system with real directories: create the parents, once. Object
                # stores never get here, so they pay no extra request per write.
                await self._call("makedirs", path.rpartition("/")[0], exist_ok=True)
                await self._call("pipe_file", path, value)

    async def read_for_update(self, key: str) -> tuple[bytes | None, Hashable]:
        value = await self.get(key)
        if not self.capabilities.remote:  # memory: only this process writes it, and it takes turns
            return value, ANY_VERSION
        return value, None if value is None else len(value)

    async def write_if(self, key: str, value: bytes | None, version: Hashable) -> bool:
        """No conditional write here: a remote object whose size changed since we read
        it was written by another process; re-read rather than overwrite it, and say
        that this store is for one writer per shard (a change that keeps the size,
        or lands after this check, cannot be seen)."""
        if version is not ANY_VERSION and await self.getsize(key) != version:
            warnings.warn(
                f"shardstore: {key!r} changed between our read and our write: another process "
                f"writes it. {self.fs.protocol} offers no conditional writes here, so keep one writer "
                "per shard (align the writers' regions to shards); retrying this update",
                ConcurrentWriterWarning,
                stacklevel=2,
            )
            return False
        return await super().write_if(key, value, version)

    async def delete(self, key: str) -> None:
        with failure("delete", key), contextlib.suppress(FileNotFoundError):
            await self._call("rm_file", self._path(key))

    async def getsize(self, key: str) -> int | None:
        with failure("size", key):
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
        # Compared without a leading "/": a memory file system answers "/root/..." for
        # a root some of its wrappers spell "root" (fsspec 2024's AsyncFileSystemWrapper).
        root = self.root.lstrip("/") + "/" if self.root.strip("/") else ""
        keys = [p.lstrip("/") for p in map(self.fs._strip_protocol, paths)]
        return [k[len(root) :] for k in keys if k.startswith(root) and k[len(root) :].startswith(prefix)]

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        with failure("list", prefix):
            keys = await self._find(prefix)
        for key in keys:
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        with failure("list", prefix):
            try:
                paths = await self._call("ls", self._path(prefix.rstrip("/")), detail=False)
            except FileNotFoundError:
                paths = []
        names = sorted({self.fs._strip_protocol(p).rstrip("/").rpartition("/")[2] for p in paths})
        for name in names:
            yield name


def http_range(byte_range: ByteRequest | None) -> str | None:
    """The HTTP ``Range`` header asking for ``byte_range`` (None: the whole object)."""
    if byte_range is None:
        return None
    if isinstance(byte_range, RangeByteRequest):
        return f"bytes={byte_range.start}-{byte_range.end - 1}"
    if isinstance(byte_range, OffsetByteRequest):
        return f"bytes={byte_range.offset}-"
    if isinstance(byte_range, SuffixByteRequest):
        return f"bytes=-{byte_range.suffix}"
    raise TypeError(f"Unexpected byte_range, got {byte_range}")


def past_the_end(exc: BaseException) -> bool:
    """Whether a ranged read failed for starting past the object's end (HTTP 416)."""
    response = getattr(exc.__cause__, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status == 416 or "416" in str(exc) or "not satisfiable" in str(exc).lower()


async def _hop(coro: Awaitable[Any], home: asyncio.AbstractEventLoop) -> Any:
    """Run ``coro`` on the running loop ``home`` and wait for it; if ``home`` stops
    first (its ``asyncio.run`` ended), fail rather than wait for ever."""
    call = _at_work(coro)
    future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(call, home)
    waiter = asyncio.wrap_future(future)
    try:
        while True:
            done, _ = await asyncio.wait([waiter], timeout=_HOP_CHECK_S)
            if done:
                return waiter.result()
            if home.is_closed() or not home.is_running():
                future.cancel()
                for never_ran in (call, coro):  # and never will: no "never awaited" warning
                    if (
                        inspect.iscoroutine(never_ran)
                        and inspect.getcoroutinestate(never_ran) == inspect.CORO_CREATED
                    ):
                        never_ran.close()
                raise RuntimeError(
                    "the event loop that owns this file system's sessions stopped before the call ran"
                )
    except BaseException:  # this call was cancelled, or failed: the call on ``home`` ends with it
        if not waiter.done():
            waiter.cancel()  # (cancels the call on its home loop too)
        elif not waiter.cancelled():
            waiter.exception()  # an outcome no one waits for any more: not "never retrieved"
        raise


async def _at_work(coro: Awaitable[T]) -> T:
    """``coro`` on its home loop, recorded as waiting on storage (settled there at exit)."""
    with at_work():
        return await coro


def _home(fs: fsspec.AbstractFileSystem) -> asyncio.AbstractEventLoop | None:
    """The loop an async file system's sessions belong to: fsspec's I/O loop for an
    instance made for synchronous use, else the loop that first used it (None yet)."""
    if fs.asynchronous:
        return getattr(fs, _HOME, None)
    if _forked(fs):
        return None
    loop: asyncio.AbstractEventLoop = fs.loop
    return loop


def _forked(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` was made by a parent process (fsspec instances are not fork-safe)."""
    return getattr(fs, "_pid", os.getpid()) != os.getpid()


def _fresh_copy(fs: fsspec.AbstractFileSystem, *, asynchronous: bool) -> fsspec.AbstractFileSystem:
    """A new instance of ``fs`` (never one fsspec cached, whose sessions may belong to a
    loop that has ended): for synchronous use (on this process's fsspec I/O loop) or
    ``asynchronous`` (for the loop that first uses it)."""
    spec = json.loads(fs.to_json())
    spec["asynchronous"] = asynchronous
    spec["skip_instance_cache"] = True
    return fsspec.AbstractFileSystem.from_json(json.dumps(spec))


def _async_api(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem | None:
    """``fs`` if its async API can be driven from an event loop: it is an async file
    system that can be made afresh (from its JSON form) when its loop ends."""
    if not getattr(fs, "async_impl", False):
        return None
    try:
        fs.to_json()
    except Exception:  # not serialisable: use its sync API in threads instead
        return None
    return fs
