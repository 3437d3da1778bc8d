"""Read coalescing: concurrent single-key reads become one batched read.

zarr reads an array as many concurrent ``get()`` calls, one per chunk. Those
arriving in the same event-loop turn are served by one
``get_partial_values`` call, which reads each shard's index once and fetches
all the chunk ranges in one inner batch. If the batch fails, each read is
retried alone, so one corrupt shard fails only the reads that touch it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeAlias

from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

from shardstore.tasks import gather, spawn

__all__ = ["ReadCoalescer"]

Fetch: TypeAlias = Callable[
    [BufferPrototype, list[tuple[str, ByteRequest | None]]], Awaitable[list[Buffer | None]]
]


@dataclass(eq=False)
class _Batch:
    prototype: BufferPrototype
    requests: list[tuple[str, ByteRequest | None]] = field(default_factory=list)
    futures: list[asyncio.Future[Buffer | None]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def abandoned(self) -> bool:
        """Whether every read of the batch was cancelled: nobody waits for its answer."""
        return all(f.cancelled() for f in self.futures)


class ReadCoalescer:
    """Gathers the ``get()`` calls of one event-loop turn into one call of
    ``fetch(prototype, requests)`` (per loop and buffer prototype). A batch whose
    reads are all cancelled is cancelled too; a batch cancelled (at exit, say)
    cancels its reads."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._lock = threading.Lock()
        self._pending: dict[tuple[asyncio.AbstractEventLoop, type], _Batch] = {}

    async def get(
        self, prototype: BufferPrototype, key: str, byte_range: ByteRequest | None
    ) -> Buffer | None:
        loop = asyncio.get_running_loop()
        slot = (loop, prototype.buffer)  # batches share an output buffer type
        future: asyncio.Future[Buffer | None] = loop.create_future()
        with self._lock:
            batch = self._pending.get(slot)
            if batch is None:
                batch = self._pending[slot] = _Batch(prototype)
                batch.task = spawn(self._run(slot, batch))
            batch.requests.append((key, byte_range))
            batch.futures.append(future)
        try:
            return await future
        except asyncio.CancelledError:
            with self._lock:  # (a batch still taking reads is not cancelled: more may join)
                if self._pending.get(slot) is not batch and batch.abandoned() and batch.task is not None:
                    batch.task.cancel()
            raise

    async def _run(self, slot: tuple[asyncio.AbstractEventLoop, type], batch: _Batch) -> None:
        try:
            try:
                await asyncio.sleep(0)  # one loop turn: reads already under way join
            finally:
                with self._lock:
                    del self._pending[slot]
            if not batch.abandoned():
                await self._serve(batch)
        except BaseException:  # cancelled: no answer will come
            for future in batch.futures:
                future.cancel()
            raise

    async def _serve(self, batch: _Batch) -> None:
        try:
            values = await self._fetch(batch.prototype, batch.requests)
        except Exception as exc:
            if len(batch.requests) == 1:
                if not batch.futures[0].done():
                    batch.futures[0].set_exception(exc)
            else:  # isolate the failure: each read alone, each with its own outcome
                await gather(*(self._alone(batch, i) for i in range(len(batch.requests))))
            return
        for future, value in zip(batch.futures, values, strict=True):
            if not future.done():
                future.set_result(value)

    async def _alone(self, batch: _Batch, i: int) -> None:
        future = batch.futures[i]
        if future.done():  # its reader was cancelled meanwhile
            return
        try:
            (value,) = await self._fetch(batch.prototype, [batch.requests[i]])
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(value)
