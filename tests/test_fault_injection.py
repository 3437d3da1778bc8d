"""Fault injection at every request of every write path.

A wrapper inner store fails (or truncates, or loses the acknowledgement of, or
tears) its N-th request, for every N the un-faulted operation makes. The
operation raises a ShardStoreError or completes; afterwards a fresh store reads
every chunk as its old or its new value, every shard commit all-or-nothing,
never a ShardFormatError, and the same operation run again completes. The
operations and the check of what they leave are in ``fault_cases``.

The wrapper raises what the built-in adapters raise when their storage fails
(InnerStoreError from an OSError); a dict failing with a plain OSError below the
real adapter is tested too. A bug these tests found is fixed and kept as a
regression test: an OSError from an inner store of the user's own reaching the
caller bare.
"""

from __future__ import annotations

import errno
import os
import threading
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import ByteRequest

import shardstore.inner.local as local_module
from shardstore import ShardingStore
from shardstore.errors import InnerStoreError, ShardStoreError
from shardstore.inner import STALE, UNCHANGED, adapt
from shardstore.inner.base import DEFAULT_ATTEMPTS
from shardstore.inner.delegating import DelegatingInner
from shardstore.maintenance import shard_reports

from .fault_cases import CASES, LAYOUT, Backend, Case, Commit, check_state
from .helpers import quiesce


def _injected(op: str, key: str) -> InnerStoreError:
    """What an adapter raises when its storage fails (see shardstore.inner.base.failure)."""
    cause = OSError(errno.EIO, f"injected fault: {op} {key!r}")
    exc = InnerStoreError(f"inner store failed to {op} {key!r}: OSError: {cause}")
    exc.__cause__ = cause
    return exc


# Which requests each mode counts, and so which N it can hit.
MODE_CLASS = {
    "error": "any",  # the request raises instead of happening
    "trunc1": "read",  # a read returns its bytes less the last one
    "trunchalf": "read",  # a read returns the first half of its bytes
    "lost-ack": "write",  # a write/delete/append happens, then raises
    "torn": "append-write",  # an append writes half its bytes, then fails
    "torn-crash": "append-write",  # ... and so does the truncation that would undo it
}


class _TearingOs:
    """Stands in for ``os`` inside shardstore.inner.local: tears the next pwrite."""

    def __init__(self) -> None:
        self.tear: str | None = None  # None, "torn" or "torn-crash"
        self.crash = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        mode, self.tear = self.tear, None
        if mode is None:
            return os.pwrite(fd, data, offset)
        os.pwrite(fd, bytes(data)[: len(data) // 2], offset)
        self.crash = mode == "torn-crash"
        raise OSError(errno.ENOSPC, "injected: no space left half way through an append")

    def ftruncate(self, fd: int, length: int) -> None:
        if self.crash:
            self.crash = False
            raise OSError(errno.EIO, "injected: the process died before undoing the torn append")
        os.ftruncate(fd, length)


class FaultyInner(DelegatingInner):
    """Forwards every request to the inner store it wraps, counting them; the planned
    one fails, is truncated, loses its acknowledgement or is torn. It also records
    every shard commit (update write or append) with the positions it changes."""

    def __init__(self, inner: Any, tearing: _TearingOs | None = None) -> None:
        super().__init__(adapt(inner))
        self.tearing = tearing
        self._lock = threading.Lock()
        self.mode: str | None = None
        self.at: int | None = None
        self.seen: Counter[str] = Counter()
        self.fired: str | None = None
        self.commits: list[Commit] = []
        self.armed = False

    def arm(self, mode: str, at: int | None) -> None:
        self.mode, self.at, self.armed = mode, at, True
        self.seen.clear()
        self.fired = None
        self.commits.clear()

    def disarm(self) -> None:
        self.armed = False

    # -- the fault plan ----------------------------------------------------------------

    def _tick(self, *classes: str) -> bool:
        """Count one request of these classes; whether it is the planned one."""
        if not self.armed:
            return False
        with self._lock:
            for c in classes:
                self.seen[c] += 1
            target = MODE_CLASS[self.mode] if self.mode else None
            if (
                self.fired is None
                and self.at is not None
                and target in classes
                and self.seen[target] == self.at
            ):
                self.fired = f"{self.mode}@{target}#{self.at}"
                return True
        return False

    def _request(self, op: str, key: str) -> None:
        """Any request: raises if it is the one planned to fail."""
        if self._tick("any") and self.mode == "error":
            raise _injected(op, key)

    def _returned(self, value: Any) -> Any:
        """Bytes a read returns: truncated if this read is the planned one."""
        if not isinstance(value, bytes | bytearray) or value is STALE or len(value) == 0:
            return value
        if self._tick("read"):
            return bytes(value[: len(value) - 1] if self.mode == "trunc1" else value[: len(value) // 2])
        return value

    def _mutation(self, op: str, key: str, append: bool = False) -> bool:
        """A write, delete or append's write (counted as well as a request): raises if
        planned to fail; returns True if it must happen and then raise (lost ack)."""
        any_hit = self._tick("any")
        classes = ("write", "append-write") if append else ("write",)
        hit = self._tick(*classes)
        if any_hit and self.mode == "error":
            raise _injected(op, key)
        if hit and self.mode in ("torn", "torn-crash"):
            assert self.tearing is not None
            self.tearing.tear = self.mode
            return False
        return hit and self.mode == "lost-ack"

    # -- reads -------------------------------------------------------------------------

    async def get(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        self._request("read", key)
        return self._returned(await self.inner.get(key, byte_range))

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        for key, _ in requests:
            self._request("read", key)
        return [self._returned(v) for v in await self.inner.get_many(requests)]

    async def get_many_versioned(
        self, requests: Sequence[tuple[str, ByteRequest | None]], expected: Sequence[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        for key, _ in requests:
            self._request("read", key)
        results = await self.inner.get_many_versioned(requests, expected)
        return [(self._returned(v), version) for v, version in results]

    async def getsize(self, key: str) -> int | None:
        self._request("size", key)
        return await self.inner.getsize(key)

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        self._request("list", prefix)
        async for key in self.inner.list_prefix(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        self._request("list", prefix)
        async for name in self.inner.list_dir(prefix):
            yield name

    # -- writes ------------------------------------------------------------------------

    async def set(self, key: str, value: bytes) -> None:
        lost = self._mutation("write", key)
        await self.inner.set(key, value)
        if lost:
            raise _injected("write (acknowledgement lost)", key)

    async def delete(self, key: str) -> None:
        lost = self._mutation("delete", key)
        await self.inner.delete(key)
        if lost:
            raise _injected("delete (acknowledgement lost)", key)

    async def update(
        self, key: str, change: Any, *, read_old: bool = True, attempts: int = DEFAULT_ATTEMPTS
    ) -> None:
        lost = False

        def changed(old: bytes | None) -> bytes | None:
            nonlocal lost
            if read_old:
                self._request("read for update", key)
                old = self._returned(old)
            new = change(old)
            if new is UNCHANGED or (new is None and old is None and read_old):
                return new
            self._record_rewrite(key, old, new)
            lost = self._mutation("update", key)
            return new

        await self.inner.update(key, changed, read_old=read_old, attempts=attempts)
        if lost:
            raise _injected("update (acknowledgement lost)", key)

    def _record_rewrite(self, key: str, old: bytes | None, new: Any) -> None:
        if isinstance(new, list):  # pieces to write one after another (Capabilities.writes_buffers)
            new = b"".join(new)
        before = {} if old is None else LAYOUT.split(old, key)
        after = {} if new is None else LAYOUT.split(new, key)
        if old is None and new is None:  # a whole shard deleted unread
            changed = frozenset(range(LAYOUT.n_chunks))
        else:
            changed = frozenset(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        with self._lock:
            self.commits.append(Commit(key, changed))

    async def append(self, key: str, build: Any) -> bool:
        self._request("append to", key)
        lost = False

        def built(size: int, read: Callable[[int, int], bytes]) -> bytes | None:
            nonlocal lost

            def faulty_read(start: int, stop: int) -> bytes:
                self._request("read (append)", key)
                return self._returned(read(start, stop))

            payload = build(size, faulty_read)
            if payload:
                n = LAYOUT.index_nbytes
                before = LAYOUT.decode_index(read(size - n, size), key)
                after = LAYOUT.decode_index(payload[-n:], key)
                changed = frozenset(int(p) for p in np.flatnonzero((before != after).any(axis=1)))
                with self._lock:
                    self.commits.append(Commit(key, changed))
                lost = self._mutation("append", key, append=True)
            return payload

        done = await self.inner.append(key, built)
        if lost:
            raise _injected("append (acknowledgement lost)", key)
        return done


MODES = ["error", "trunc1", "trunchalf", "lost-ack"]
APPEND_MODES = [*MODES, "torn", "torn-crash"]


@dataclass
class FaultStats:
    operations: int = 0
    faults: int = 0
    raised: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)


def _run_case(
    case: Case, backend: Backend, mode: str, at: int | None, stats: FaultStats
) -> tuple[FaultyInner, BaseException | None]:
    raw = backend.restore(case.old)
    tearing = local_module.os if isinstance(local_module.os, _TearingOs) else None
    faulty = FaultyInner(raw, tearing)
    store = ShardingStore(faulty, write_strategy=case.strategy)
    arr = zarr.open_array(store, path="a")
    faulty.arm(mode, at)
    error: BaseException | None = None
    try:
        case.run(store, arr)
    except BaseException as exc:  # judged below
        error = exc
    finally:
        quiesce()
        faulty.disarm()
        if tearing is not None:
            tearing.tear, tearing.crash = None, False
    stats.operations += 1
    where = f"{case.name} on {backend.name}, {mode} at request {at} ({faulty.fired})"
    if error is not None:
        if not isinstance(error, ShardStoreError):
            tb = "".join(traceback.format_exception(error, limit=-6))
            raise AssertionError(f"{where}: raised a bare {type(error).__name__}\n{tb}") from error
        stats.raised[type(error).__name__] += 1
    if faulty.fired is not None:
        stats.faults += 1
    try:
        outcome = check_state(raw, case, faulty.commits)
    except Exception as exc:
        raise AssertionError(f"{where}: after the fault ({error!r}): {exc}") from exc
    if error is None:
        # nothing raised: the fault was absorbed (a retried read) or the truncated bytes
        # were not needed; either way the operation must have done all of its work
        assert outcome == "new", f"{where}: completed without error but left the {outcome} state"
    stats.outcomes[f"{'raised' if error else 'completed'}->{outcome}"] += 1
    if at is not None:
        # the same operation, run again un-faulted over what the fault left, completes
        again = ShardingStore(raw, write_strategy=case.strategy)
        try:
            case.run(again, zarr.open_array(again, path="a"))
            assert check_state(raw, case, []) == "new"
        except Exception as exc:
            raise AssertionError(f"{where}: the operation run again after the fault: {exc!r}") from exc
        if case.name == "compact":
            assert all(r.dead_bytes == 0 for r in shard_reports(ShardingStore(raw), "a/")), where
    return faulty, error


@pytest.fixture
def tearing(monkeypatch: pytest.MonkeyPatch) -> _TearingOs:
    fake = _TearingOs()
    monkeypatch.setattr(local_module, "os", fake)
    return fake


FAULT_PARAMS = [(case, backend) for case in CASES for backend in case.backends]


@pytest.mark.parametrize(("case", "backend"), FAULT_PARAMS, ids=[f"{c.name}-{b}" for c, b in FAULT_PARAMS])
def test_fault_at_every_request(
    case: Case, backend: str, tmp_path: Path, tearing: _TearingOs, record_property: Any
) -> None:
    """Every request of the operation, in turn, fails / is truncated / loses its
    acknowledgement (/ is torn, for appends): a ShardStoreError or completion, and
    afterwards every chunk old or new, every commit all-or-nothing, and the
    operation runs again to completion."""
    store_backend = Backend(backend, tmp_path)
    stats = FaultStats()
    modes = APPEND_MODES if case.strategy == "append" else MODES
    # un-faulted first: it must do exactly the expected thing; it tells the request counts
    dry, error = _run_case(case, store_backend, "error", None, stats)
    assert error is None, error
    counts = dict(dry.seen)
    planned = 0
    for mode in modes:
        for at in range(1, counts.get(MODE_CLASS[mode], 0) + 1):
            _run_case(case, store_backend, mode, at, stats)
            planned += 1
    if case.strategy == "append":
        assert counts.get("append-write", 0) >= 1, counts
    # commits of one operation may group differently from run to run (timing): a planned
    # N may then lie beyond the requests a run makes; nearly all must fire
    assert stats.faults >= 0.8 * planned, (stats, counts)
    record_property("requests", counts)
    record_property("operations", stats.operations)
    record_property("faults", stats.faults)
    record_property("raised", dict(stats.raised))
    record_property("outcomes", dict(stats.outcomes))


class FailingMapping(dict):  # type: ignore[type-arg]
    """Storage below the real adapter: a dict whose N-th access raises a plain OSError."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.at: int | None = None
        self.calls = 0
        self.fired = False

    def _access(self) -> None:
        if self.at is None:
            return
        self.calls += 1
        if self.calls == self.at:
            self.fired = True
            raise OSError(errno.EIO, "injected: the storage failed")

    def __getitem__(self, key: str) -> Any:
        self._access()
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._access()
        return super().get(key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        self._access()
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._access()
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self._access()
        return super().pop(key, *default)

    def __iter__(self) -> Any:
        self._access()
        return super().__iter__()


STORAGE_CASES = [c for c in CASES if "dict" in c.backends]


@pytest.mark.parametrize("case", STORAGE_CASES, ids=[c.name for c in STORAGE_CASES])
def test_storage_failure_at_every_access(case: Case, tmp_path: Path, record_property: Any) -> None:
    """The same operations over a dict whose N-th access (read, write, delete, listing)
    raises a plain OSError: the adapter's InnerStoreError (or a BatchCommitError)
    reaches the caller, never the bare OSError, and the state is old or new."""
    backend = Backend("dict", tmp_path)
    dry = FailingMapping(backend.restore(case.old))
    store = ShardingStore(dry, write_strategy=case.strategy)
    arr = zarr.open_array(store, path="a")
    dry.at = 0  # count, never fire
    case.run(store, arr)
    quiesce()
    total, faults = dry.calls, 0
    assert total > 0
    for at in range(1, total + 1):
        data = FailingMapping(backend.restore(case.old))
        store = ShardingStore(data, write_strategy=case.strategy)
        arr = zarr.open_array(store, path="a")
        data.at = at
        try:
            case.run(store, arr)
        except ShardStoreError:
            pass
        except BaseException as exc:
            tb = "".join(traceback.format_exception(exc, limit=-6))
            raise AssertionError(f"{case.name}: storage access {at} failed: bare {exc!r}\n{tb}") from exc
        finally:
            quiesce()
            data.at = None
        faults += data.fired
        check_state(dict(data), case, [])
    assert faults == total
    record_property("faults", faults)


def _raw_fault(op: str, key: str) -> OSError:
    return OSError(errno.EIO, f"injected fault: {op} {key!r}")


RAW_CASES = [c for c in CASES if c.name in ("rewrite-chunk", "erase-values", "append-mix", "compact")]


@pytest.mark.parametrize("case", RAW_CASES, ids=[c.name for c in RAW_CASES])
def test_custom_inner_store_oserror_becomes_inner_store_error(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(f"{__name__}._injected", _raw_fault)
    raw = Backend(case.backends[-1], tmp_path).restore(case.old)
    faulty = FaultyInner(raw)
    store = ShardingStore(faulty, write_strategy=case.strategy)
    arr = zarr.open_array(store, path="a")
    faulty.arm("lost-ack", 1)  # the first write lands, then its acknowledgement fails
    try:
        with pytest.raises(ShardStoreError):
            case.run(store, arr)
    finally:
        quiesce()
    assert faulty.fired
