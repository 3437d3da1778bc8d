"""zarr's synchronous store calls (``get_sync``, ``set_sync``, ``delete_sync``) from
anywhere: inside a running event loop (zarr 3.4's store laws), from many threads,
nested; and a clear SyncCallError, never a hang, where the call cannot be served."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import fsspec
import pytest
import zarr
import zarr.api.asynchronous
from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
from zarr.abc.store import RangeByteRequest
from zarr.core.buffer import Buffer, default_buffer_prototype

from shardstore import InnerStoreError, ShardingStore, SyncCallError, sync_bridge

PROTO = default_buffer_prototype()


def buf(data: bytes) -> Buffer:
    return PROTO.buffer.from_bytes(data)


async def _array(store: ShardingStore, shape: tuple[int, int] = (8, 8)) -> None:
    await zarr.api.asynchronous.create_array(
        store, name="a", shape=shape, chunks=(2, 2), dtype="u1", fill_value=0
    )


async def test_sync_calls_inside_a_running_loop(make_store: Callable[..., ShardingStore]) -> None:
    """Over every inner kind (an async file system's sessions belong to this very loop,
    which the call blocks): the sync calls see what the async ones see, both ways."""
    store = make_store()
    await _array(store)
    store.set_sync("a/c/0/0", buf(b"\x01" * 4))
    got = await store.get("a/c/0/0", PROTO)
    assert got is not None and got.to_bytes() == b"\x01" * 4

    await store.set("a/c/0/1", buf(b"\x01\x02\x03\x04"))
    got = store.get_sync("a/c/0/1")
    assert got is not None and got.to_bytes() == b"\x01\x02\x03\x04"
    part = store.get_sync("a/c/0/1", byte_range=RangeByteRequest(1, 3))
    assert part is not None and part.to_bytes() == b"\x02\x03"

    store.delete_sync("a/c/0/0")
    assert await store.get("a/c/0/0", PROTO) is None
    assert store.get_sync("a/c/0/0") is None
    assert await store.exists("a/c/0/1")


def test_sync_calls_outside_any_loop(make_store: Callable[..., ShardingStore]) -> None:
    store = make_store()
    asyncio.run(_array(store))
    store.set_sync("a/c/1/1", buf(b"\x05" * 4))
    got = store.get_sync("a/c/1/1")
    assert got is not None and got.to_bytes() == b"\x05" * 4
    store.delete_sync("a/c/1/1")
    assert store.get_sync("a/c/1/1") is None


def test_sync_writes_from_many_threads_lose_nothing(make_store: Callable[..., ShardingStore]) -> None:
    """Eight threads write the chunks of the same shards at once, half of them from
    inside an event loop of their own: every chunk is there afterwards."""
    store = make_store((4, 4))
    asyncio.run(_array(store, (16, 16)))
    keys = [f"a/c/{i}/{j}" for i in range(8) for j in range(8)]
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        mine = keys[n::8]
        try:
            if n % 2:
                for key in mine:
                    store.set_sync(key, buf(key.encode()))
            else:

                async def inside_a_loop() -> None:
                    for key in mine:
                        store.set_sync(key, buf(key.encode()))

                asyncio.run(inside_a_loop())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert not any(t.is_alive() for t in threads)
    lost = [k for k in keys if (v := store.get_sync(k)) is None or v.to_bytes() != k.encode()]
    assert lost == []


async def test_nested_sync_calls() -> None:
    """A sync call made by code that itself serves a sync call (on a bridge loop)."""
    store = ShardingStore({}, (2, 2))
    await _array(store)
    await store.set("a/c/0/0", buf(b"\x07" * 4))

    async def read_inside() -> bytes:
        got = store.get_sync("a/c/0/0")
        assert got is not None
        return got.to_bytes()

    assert sync_bridge.run(read_inside()) == b"\x07" * 4


class _Gated(zarr.storage.MemoryStore):
    """A memory store whose writes wait at a gate, once it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    async def set(self, key: str, value: Buffer, byte_range: Any = None) -> None:
        if not self.gate.is_set():
            self.entered.set()
            while not self.gate.is_set():
                await asyncio.sleep(0.001)
        await super().set(key, value)


async def _a_commit_under_way() -> tuple[ShardingStore, _Gated, asyncio.Future[None]]:
    """A store whose write of chunk a/c/0/0 is under way on the running loop, held at
    the inner store's gate."""
    inner = _Gated()
    store = ShardingStore(inner, (2, 2))
    await _array(store)
    inner.gate.clear()
    pending = asyncio.ensure_future(store.set("a/c/0/0", buf(b"\x01" * 4)))
    while not inner.entered.is_set():
        await asyncio.sleep(0.001)
    return store, inner, pending


async def test_a_sync_write_behind_a_write_of_its_own_loop_raises() -> None:
    """The loop that makes a sync call is blocked until it returns: a sync write of a
    shard whose commit is under way on that loop cannot wait for it. It raises
    SyncCallError naming the shard, does not hang, and writes nothing; the pending
    write still lands, and a sync write after it works."""
    store, inner, pending = await _a_commit_under_way()
    with pytest.raises(SyncCallError, match=r"a/c/0/0.*deadlock"):
        store.set_sync("a/c/0/1", buf(b"\x02" * 4))
    inner.gate.set()
    await pending
    assert (await store.get("a/c/0/1", PROTO)) is None
    store.set_sync("a/c/0/1", buf(b"\x02" * 4))
    for key, value in [("a/c/0/0", b"\x01" * 4), ("a/c/0/1", b"\x02" * 4)]:
        got = await store.get(key, PROTO)
        assert got is not None and got.to_bytes() == value


async def test_a_sync_write_of_another_shard_does_not_wait() -> None:
    """Only the shard whose commit waits on the blocked loop is refused."""
    store, inner, pending = await _a_commit_under_way()
    threading.Timer(0.05, inner.gate.set).start()  # the other shard's write also meets the gate
    store.set_sync("a/c/2/2", buf(b"\x03" * 4))
    await pending
    got = await store.get("a/c/2/2", PROTO)
    assert got is not None and got.to_bytes() == b"\x03" * 4


class _Home(asyncio.SelectorEventLoop):
    """A loop that says when a call was queued on it from another thread: not a worker
    thread's result delivered to a task waiting on it (asyncio's ``_set_state``), which
    may come late from earlier work, but a call sent there to run."""

    def __init__(self) -> None:
        super().__init__()
        self.queued = threading.Event()

    def call_soon_threadsafe(self, *args: Any, **kwargs: Any) -> asyncio.Handle:
        handle = super().call_soon_threadsafe(*args, **kwargs)
        if getattr(args[0], "__name__", "") != "_set_state":
            self.queued.set()
        return handle


def test_a_call_whose_event_loop_stops_under_it_fails_instead_of_hanging() -> None:
    """An async file system made asynchronous belongs to the loop that first used it
    (here a user's loop in another thread); calls from elsewhere hop there. If that loop
    stops with the call queued, the caller gets an InnerStoreError naming the key, at once."""
    name = f"stops-{time.monotonic_ns()}"
    fs = AsyncFileSystemWrapper(fsspec.filesystem("memory"), asynchronous=True)
    store = ShardingStore(fsspec.FSMap(name, fs), (2, 2))
    home = _Home()
    thread = threading.Thread(target=home.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(_array(store), home).result(timeout=30)  # the sessions' home
    gate = threading.Event()
    home.call_soon_threadsafe(gate.wait, 30)  # busy: what follows queues behind ...
    home.call_soon_threadsafe(home.stop)  # ... and stops before the calls queued meanwhile run
    home.queued.clear()

    def open_the_gate_once_our_call_is_queued() -> None:
        home.queued.wait(30)
        gate.set()

    threading.Thread(target=open_the_gate_once_our_call_is_queued, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(InnerStoreError, match=r"a/c/0/0.*stopped"):
        store.get_sync("a/c/0/0")
    assert time.monotonic() - started < 10
    thread.join(timeout=5)
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.disabled = True  # the user's loop, stopped with our call queued, drops that task
    try:
        home.close()
        gc.collect()
    finally:
        asyncio_log.disabled = False
    fsspec.filesystem("memory").rm(f"/{name}", recursive=True)
