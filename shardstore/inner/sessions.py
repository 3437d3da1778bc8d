"""Closing, at exit, the HTTP sessions of the async file systems shardstore drives.

An async fsspec file system (s3fs, gcsfs, adlfs) keeps a session bound to one
event loop. Its own finalizer closes that session at exit on a loop of its
choosing, and some print tracebacks doing so ("Loop is not running", "attached
to a different loop", "Non-thread-safe operation invoked on an event loop",
"Task was destroyed but it is pending!"). The instances shardstore drives are
closed here instead, on their home loop while it still runs, and their
finalizers detached, so a program ends without a word.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any

from shardstore.tasks import run_at_exit

__all__ = ["close_all", "track"]

HomeOf = Callable[[Any], "asyncio.AbstractEventLoop | None"]

_MADE: list[tuple[weakref.ref[Any], HomeOf]] = []
"""Each file system driven, with how to find its home loop."""
_LOCK = threading.Lock()
_CLOSE_TIMEOUT_S = 2.0


def track(fs: Any, home_of: HomeOf) -> None:
    """Close ``fs`` at exit, on its home loop (``home_of(fs)``)."""
    with _LOCK:
        _MADE[:] = [(ref, home) for ref, home in _MADE if ref() is not None and ref() is not fs]
        _MADE.append((weakref.ref(fs), home_of))
    run_at_exit(close_all)  # after the calls in flight are settled, before weakref's finalizers


def close_all() -> None:
    """Close every tracked file system's session on its loop, if that still runs
    (waiting at most 2 s each), and detach its finalizers."""
    with _LOCK:
        made = [(ref(), home_of) for ref, home_of in _MADE]
        _MADE.clear()
    for fs, home_of in made:
        if fs is None:
            continue
        home = None
        with contextlib.suppress(Exception):  # (a forked copy: no loop of this process)
            home = home_of(fs)
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
