"""Synchronous calls into the async store, from any thread, inside a running event loop or not.

zarr's own ``sync()`` runs a coroutine on zarr's I/O loop and refuses to run on
that loop. zarr 3.4 expects a store's ``get_sync``/``set_sync``/``delete_sync``
to work also when called by code running *inside* an event loop, which stays
blocked until the call returns. Such a call runs on a bridge loop of ours, in
its own thread, and the caller's loop is recorded as *blocked* while it waits:
whatever the call needs must not wait on that loop. The inner adapters ask
:func:`blocked` before hopping to a loop (an async file system whose sessions
live on the blocked loop is used through an instance of the bridge's own), and
code that would wait for work queued on the caller's own loop (a commit, a lock
held there) asks :func:`refuse_to_wait` first, which raises
:class:`~shardstore.errors.SyncCallError` rather than deadlock.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, ParamSpec, TypeVar

from zarr.core.sync import sync as zarr_sync

from shardstore.errors import SyncCallError

__all__ = ["blocked", "blocking", "context_serving", "in_a_thread", "refuse_to_wait", "run", "serving"]

T = TypeVar("T")
P = ParamSpec("P")

_guard = threading.Lock()
_blocked: dict[asyncio.AbstractEventLoop, int] = {}
"""Loops whose thread waits in :func:`run`, with how many calls wait there."""
_bridges: list[asyncio.AbstractEventLoop] = []
_callers: contextvars.ContextVar[tuple[asyncio.AbstractEventLoop, ...]] = contextvars.ContextVar(
    "shardstore_sync_callers", default=()
)
"""The loops whose synchronous calls the running code serves (nested calls add one each)."""


def serving() -> tuple[asyncio.AbstractEventLoop, ...]:
    """The loops whose synchronous calls the running code serves (see :func:`run`)."""
    return _callers.get()


def context_serving(loops: Iterable[asyncio.AbstractEventLoop]) -> contextvars.Context:
    """A fresh context for work handed to another loop on behalf of code that serves
    the synchronous calls made on ``loops``: it still refuses to wait on them."""
    context = contextvars.Context()
    context.run(_callers.set, tuple(loops))
    return context


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def blocked(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop``'s thread is waiting for a synchronous call: nothing can run there now."""
    return loop in _blocked


def refuse_to_wait(loop: asyncio.AbstractEventLoop, key: str, what: str) -> None:
    """Raise SyncCallError if the running code serves a synchronous call made on
    ``loop``: ``what`` (for ``key``) runs there, and cannot until the call returns."""
    if loop in _callers.get():
        raise SyncCallError(
            f"{key}: a synchronous store call made inside a running event loop would wait for "
            f"{what} on that same loop, which is blocked until the call returns (a deadlock); "
            f"await the store's async methods there instead, or let pending writes finish first"
        )


async def _serve(coro: Coroutine[Any, Any, T], callers: tuple[asyncio.AbstractEventLoop, ...]) -> T:
    _callers.set(callers)  # the task's own context: seen by everything it awaits or starts
    return await coro


def _start_bridge() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="shardstore-sync", daemon=True).start()
    _bridges.append(loop)
    return loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion and return its result, from synchronous code.

    Outside an event loop this is zarr's ``sync()`` (zarr's I/O loop, where
    zarr's own synchronous API runs). Inside one, the coroutine runs on a bridge
    loop that is not itself blocked (a new one if every bridge is), so a sync call
    made from a coroutine, even one running on a bridge, never waits for itself.
    """
    caller = _running_loop()
    if caller is None:
        return zarr_sync(coro)
    with _guard:
        _blocked[caller] = _blocked.get(caller, 0) + 1
        bridge = next((b for b in _bridges if b not in _blocked), None) or _start_bridge()
    try:
        future = asyncio.run_coroutine_threadsafe(_serve(coro, (*_callers.get(), caller)), bridge)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # KeyboardInterrupt while waiting: stop the call too
            raise
    finally:
        with _guard:
            _blocked[caller] -= 1
            if not _blocked[caller]:
                del _blocked[caller]


def blocking(function: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """The synchronous front door of an async function ``name_async``: a function
    ``name`` with the same parameters that runs it through :func:`run`. One door
    for every tool, so that no synchronous twin repeats its signature and defaults."""

    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        return run(function(*args, **kwargs))

    call.__name__ = function.__name__.removesuffix("_async")
    call.__qualname__ = function.__qualname__.removesuffix("_async")
    call.__doc__ = f"Synchronous :func:`{function.__name__}`: {function.__doc__ or ''}".strip()
    return call


def in_a_thread(function: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """The async front door of a blocking function ``name``: a coroutine function
    ``name_async`` with the same parameters that runs it in a worker thread
    (``asyncio.to_thread``), so that an event loop goes on meanwhile."""

    @functools.wraps(function)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.to_thread(function, *args, **kwargs)

    call.__name__ = f"{function.__name__}_async"
    call.__qualname__ = f"{function.__qualname__}_async"
    call.__doc__ = f":func:`{function.__name__}` from a coroutine, run in a thread: {function.__doc__ or ''}"
    return call


def _forget_after_fork() -> None:
    """A forked child has none of its parent's threads: its bridges are gone."""
    global _guard
    _guard = threading.Lock()
    _blocked.clear()
    _bridges.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
