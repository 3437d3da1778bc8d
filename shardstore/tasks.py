"""Structured concurrency: every coroutine a call starts has ended when the call
returns or raises.

``asyncio.gather`` leaves the other awaitables running (or, for coroutines not
yet started, suspended) when one fails: they finish later, or are closed when
garbage-collected, perhaps after their event loop has ended, which prints
"Task was destroyed but it is pending!" or a store error about a loop that is
gone. :func:`gather` cancels them and waits for them instead, then raises the
first error, with what the others raised as notes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["gather"]

T = TypeVar("T")


async def gather(*awaitables: Awaitable[T]) -> list[T]:
    """The results of ``awaitables``, run concurrently, in order. If one fails, or this
    call is cancelled, the rest are cancelled and awaited before the first error is
    raised (the others' errors added to it as notes)."""
    if len(awaitables) == 1:  # the common case needs no task
        return [await awaitables[0]]
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException as first:
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for other in outcomes:
            if isinstance(other, Exception) and other is not first:
                first.add_note(f"also failed at the same time: {type(other).__name__}: {other}")
        raise
