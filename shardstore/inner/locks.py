"""Per-shard locks: one for every writer in this process, one on files for every process.

A shard update is read-modify-write, so two writers of one shard must take
turns or one loses the other's chunks. Object stores with conditional
writes need no lock (a lost race is retried); everywhere else writers take
turns here:

- :func:`process_lock` orders writers of one location inside this process,
  whatever store instance, thread or event loop they come from;
- :func:`file_lock` orders writers of one local file across processes, by
  ``flock`` on a hidden lock file beside it (``.<name>.lock``). The kernel
  drops the lock when its holder dies, so a killed writer never blocks the
  next one; a lock file left behind is taken like a new one, and the holder
  removes it on release so that shards are not doubled by lock files.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
import weakref
from collections.abc import AsyncIterator, Hashable, Iterator
from pathlib import Path

from shardstore.sync_bridge import refuse_to_wait

__all__ = ["file_lock", "lock_path", "process_lock"]


class _Lock:
    """A threading lock that can live in a WeakValueDictionary, with the event loop
    of its holder."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holder: asyncio.AbstractEventLoop | None = None


_registry: weakref.WeakValueDictionary[Hashable, _Lock] = weakref.WeakValueDictionary()
_registry_guard = threading.Lock()


@contextlib.asynccontextmanager
async def process_lock(scope: Hashable, key: str) -> AsyncIterator[None]:
    """Exclusive use of ``key`` in the storage named by ``scope``, within this process.

    Polled rather than awaited, so holders on any thread or event loop exclude
    each other and a cancelled waiter holds nothing."""
    with _registry_guard:
        entry = _registry.get((scope, key))
        if entry is None:
            entry = _registry[(scope, key)] = _Lock()
    delay = 0.0002
    while not entry.lock.acquire(blocking=False):
        if (holder := entry.holder) is not None:
            refuse_to_wait(holder, key, "a write holding the shard's lock")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.01)
    entry.holder = asyncio.get_running_loop()
    try:
        yield
    finally:
        entry.holder = None
        entry.lock.release()


def lock_path(path: Path) -> Path:
    """The lock file of a local object."""
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold the exclusive lock of the local object at ``path`` (blocking).

    The lock is the lock file's inode, so after taking it the holder checks
    that the name still leads to that inode: an earlier holder may have
    removed it on release (then the lock is retaken on the new file). Parent
    directories are created as needed, again if a concurrent delete prunes them."""
    lock = lock_path(path)
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            # Path.mkdir(parents=True) can raise FileExistsError when another writer
            # creates the directory meanwhile (or prunes it): look again either way
            with contextlib.suppress(FileExistsError, FileNotFoundError):
                lock.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                break
        except FileNotFoundError:  # removed by the previous holder: take the new one
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(lock)  # still holding it: waiters find the name gone and retry
        finally:
            os.close(fd)
