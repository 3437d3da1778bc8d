"""Closing, at exit, the HTTP sessions of the async file systems shardstore made.

An async fsspec file system (s3fs, gcsfs, adlfs) keeps a session bound to the
event loop that first used it. Its own finalizer closes that session at exit on
a loop of its choosing — after zarr's loop has stopped, or on fsspec's loop —
and prints tracebacks ("Loop is not running", "attached to a different loop",
"Task was destroyed but it is pending!"). The instances shardstore makes for
its own loops are closed here instead, on their loop while it still runs, and
their finalizers detached, so a program ends without a word.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import weakref
from typing import Any

__all__ = ["close_all", "track"]

_MADE: list[tuple[weakref.ref[Any], str]] = []
"""Each file system made, with the name of its attribute holding its home loop."""
_LOCK = threading.Lock()
_HOOK: list[weakref.finalize[Any, Any]] = []
_CLOSE_TIMEOUT_S = 2.0


def track(fs: Any, home_attribute: str) -> None:
    """Close ``fs`` at exit, on the loop named by its attribute ``home_attribute``."""
    with _LOCK:
        _MADE[:] = [(ref, name) for ref, name in _MADE if ref() is not None]
        _MADE.append((weakref.ref(fs), home_attribute))
    # weakref's own exit hook, which runs every finalizer, is registered with the first
    # finalizer made in the process: make one now, then register this hook again, so
    # that it runs first (atexit runs the last registered first)
    if not _HOOK:
        _HOOK.append(weakref.finalize(track, _nothing))
    atexit.unregister(close_all)
    atexit.register(close_all)


def _nothing() -> None:
    """(A finalizer that does nothing, see :func:`track`.)"""


def close_all() -> None:
    """Close every tracked file system's session on its loop, if that still runs
    (waiting at most 2 s each), and detach its finalizers."""
    with _LOCK:
        made = [(ref(), name) for ref, name in _MADE]
        _MADE.clear()
    for fs, name in made:
        if fs is None:
            continue
        home = getattr(fs, name, None)
        if home is not None and not home.is_closed() and home.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_close(fs), home).result(timeout=_CLOSE_TIMEOUT_S)
        _detach_finalizers(fs)


async def _close(fs: Any) -> None:
    """The clients of gcsfs (``_session``), adlfs (``service_client``) and s3fs (``_s3``)."""
    session = getattr(fs, "_session", None)
    if session is not None and not getattr(session, "closed", True):
        await session.close()
    client = getattr(fs, "service_client", None)
    if client is not None and hasattr(client, "close"):
        await client.close()
    s3 = getattr(fs, "_s3", None)
    if s3 is not None and hasattr(s3, "__aexit__"):
        await s3.__aexit__(None, None, None)


def _detach_finalizers(fs: Any) -> None:
    registry: dict[Any, Any] = getattr(weakref.finalize, "_registry", {})
    for finalizer, info in list(registry.items()):
        if getattr(info, "weakref", lambda: None)() is fs:
            finalizer.detach()
