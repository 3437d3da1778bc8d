"""Unit tests of shardstore.reading.coalescing.ReadCoalescer: one batched read per loop turn."""

from __future__ import annotations

import asyncio

import pytest
from zarr.abc.store import ByteRequest, RangeByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, cpu, default_buffer_prototype

from shardstore.reading.coalescing import ReadCoalescer
from shardstore.tasks import in_flight

from .helpers import turns_until, within

Request = tuple[str, ByteRequest | None]


class FakeFetch:
    """A batched read that records each call: a key's value is its name (ranged if asked),
    ``missing`` keys are None, and a call including a ``failing`` key raises."""

    def __init__(self, failing: frozenset[str] = frozenset(), missing: frozenset[str] = frozenset()) -> None:
        self.calls: list[list[Request]] = []
        self.failing = failing
        self.missing = missing
        self.gate: asyncio.Event | None = None

    async def __call__(self, prototype: BufferPrototype, requests: list[Request]) -> list[Buffer | None]:
        self.calls.append(list(requests))
        if self.gate is not None:
            await self.gate.wait()
        bad = sorted(k for k, _ in requests if k in self.failing)
        if bad:
            raise OSError(f"cannot read {bad}")
        return [self.value(prototype, key, byte_range) for key, byte_range in requests]

    def value(self, prototype: BufferPrototype, key: str, byte_range: ByteRequest | None) -> Buffer | None:
        if key in self.missing:
            return None
        data = key.encode()
        if isinstance(byte_range, RangeByteRequest):
            data = data[byte_range.start : byte_range.end]
        return prototype.buffer.from_bytes(data)


PROTO = default_buffer_prototype()


def as_bytes(value: Buffer | BaseException | None) -> bytes | BaseException | None:
    return value.to_bytes() if isinstance(value, Buffer) else value


async def test_gets_of_one_turn_are_one_batched_call() -> None:
    """Concurrent gets started in one loop turn are served by a single fetch, in order."""
    fetch = FakeFetch()
    reads = ReadCoalescer(fetch)
    keys = [f"a/c/{i}" for i in range(6)]
    got = await within(asyncio.gather(*(reads.get(PROTO, k, None) for k in keys)))
    assert len(fetch.calls) == 1
    assert fetch.calls[0] == [(k, None) for k in keys]
    assert [as_bytes(g) for g in got] == [k.encode() for k in keys]


async def test_each_caller_gets_its_own_result() -> None:
    """Results map back to their callers, byte ranges and missing keys included."""
    fetch = FakeFetch(missing=frozenset({"gone"}))
    reads = ReadCoalescer(fetch)
    got = await within(
        asyncio.gather(
            reads.get(PROTO, "abcdef", RangeByteRequest(1, 3)),
            reads.get(PROTO, "gone", None),
            reads.get(PROTO, "abcdef", None),
            reads.get(PROTO, "xyz", RangeByteRequest(0, 1)),
        )
    )
    assert [as_bytes(g) for g in got] == [b"bc", None, b"abcdef", b"x"]
    assert fetch.calls == [
        [
            ("abcdef", RangeByteRequest(1, 3)),
            ("gone", None),
            ("abcdef", None),
            ("xyz", RangeByteRequest(0, 1)),
        ]
    ]


async def test_a_get_one_turn_later_joins_the_open_batch() -> None:
    """A get started one loop turn after the first (before the batch is fetched) joins it."""
    fetch = FakeFetch()
    reads = ReadCoalescer(fetch)
    first = asyncio.ensure_future(reads.get(PROTO, "a", None))
    await asyncio.sleep(0)  # the first get has opened its batch
    assert fetch.calls == []
    second = asyncio.ensure_future(reads.get(PROTO, "b", None))
    assert [as_bytes(await first), as_bytes(await second)] == [b"a", b"b"]
    assert fetch.calls == [[("a", None), ("b", None)]]


async def test_gets_in_later_turns_are_separate_batches() -> None:
    """Sequential gets each cost one fetch of their own."""
    fetch = FakeFetch()
    reads = ReadCoalescer(fetch)
    assert as_bytes(await reads.get(PROTO, "a", None)) == b"a"
    assert as_bytes(await reads.get(PROTO, "b", None)) == b"b"
    assert fetch.calls == [[("a", None)], [("b", None)]]


async def test_a_get_during_a_fetch_starts_the_next_batch() -> None:
    """Gets arriving while a batch is being fetched go in the next batch, together."""
    fetch = FakeFetch()
    fetch.gate = asyncio.Event()
    reads = ReadCoalescer(fetch)
    first = asyncio.ensure_future(reads.get(PROTO, "a", None))
    await turns_until(lambda: len(fetch.calls) == 1)
    later = [asyncio.ensure_future(reads.get(PROTO, k, None)) for k in ("b", "c")]
    await turns_until(lambda: len(fetch.calls) == 2)
    assert fetch.calls[1] == [("b", None), ("c", None)]
    fetch.gate.set()
    got = await within(asyncio.gather(first, *later))
    assert [as_bytes(g) for g in got] == [b"a", b"b", b"c"]
    assert len(fetch.calls) == 2


async def test_a_failing_batch_is_retried_read_by_read() -> None:
    """If the batch fails, each read is made alone: only the failing key's get fails."""
    fetch = FakeFetch(failing=frozenset({"bad"}))
    reads = ReadCoalescer(fetch)
    got = await within(
        asyncio.gather(
            reads.get(PROTO, "a", None),
            reads.get(PROTO, "bad", None),
            reads.get(PROTO, "c", RangeByteRequest(0, 1)),
            return_exceptions=True,
        )
    )
    assert as_bytes(got[0]) == b"a"
    assert isinstance(got[1], OSError) and "bad" in str(got[1])
    assert as_bytes(got[2]) == b"c"
    assert fetch.calls[0] == [("a", None), ("bad", None), ("c", RangeByteRequest(0, 1))]
    assert sorted(fetch.calls[1:], key=lambda call: call[0][0]) == [  # then each alone
        [("a", None)],
        [("bad", None)],
        [("c", RangeByteRequest(0, 1))],
    ]


async def test_every_failing_key_fails_its_own_get_with_its_own_error() -> None:
    """Two failing keys: each get raises the error of its own read."""
    fetch = FakeFetch(failing=frozenset({"x", "y"}))
    reads = ReadCoalescer(fetch)
    got = await within(
        asyncio.gather(
            reads.get(PROTO, "x", None),
            reads.get(PROTO, "ok", None),
            reads.get(PROTO, "y", None),
            return_exceptions=True,
        )
    )
    assert "['x']" in str(got[0])
    assert as_bytes(got[1]) == b"ok"
    assert "['y']" in str(got[2])
    assert len(fetch.calls) == 4


async def test_a_failing_single_read_is_not_retried() -> None:
    """A batch of one read that fails raises at once: no second attempt."""
    fetch = FakeFetch(failing=frozenset({"bad"}))
    reads = ReadCoalescer(fetch)
    with pytest.raises(OSError, match="bad"):
        await within(reads.get(PROTO, "bad", None))
    assert fetch.calls == [[("bad", None)]]


async def test_a_cancelled_get_does_not_disturb_the_others() -> None:
    """Cancelling one get of a batch leaves the batch and the other gets alone."""
    fetch = FakeFetch()
    fetch.gate = asyncio.Event()
    reads = ReadCoalescer(fetch)
    gets = [asyncio.ensure_future(reads.get(PROTO, k, None)) for k in ("a", "b", "c")]
    await turns_until(lambda: len(fetch.calls) == 1)
    gets[1].cancel()
    fetch.gate.set()
    got = await within(asyncio.gather(*gets, return_exceptions=True))
    assert as_bytes(got[0]) == b"a"
    assert isinstance(got[1], asyncio.CancelledError)
    assert as_bytes(got[2]) == b"c"
    assert len(fetch.calls) == 1


async def _a_batch_under_way() -> tuple[list[asyncio.Future[Buffer | None]], asyncio.Task[None]]:
    """Two gets, and their batch, whose fetch waits at its gate."""
    fetch = FakeFetch()
    fetch.gate = asyncio.Event()
    reads = ReadCoalescer(fetch)
    gets = [asyncio.ensure_future(reads.get(PROTO, k, None)) for k in ("a", "b")]
    await turns_until(lambda: len(fetch.calls) == 1)
    (batch,) = [t for t in in_flight() if "ReadCoalescer._run" in repr(t)]
    return gets, batch


async def test_a_batch_whose_gets_are_all_cancelled_is_cancelled() -> None:
    """Nobody waits for its answer any more: its fetch ends too (it would otherwise run on
    after the calls that started it, perhaps past the end of their program)."""
    gets, batch = await _a_batch_under_way()
    for get in gets:
        get.cancel()
    await asyncio.gather(*gets, return_exceptions=True)
    await turns_until(batch.done)
    assert batch.cancelled()


async def test_gets_cancelled_before_their_batch_starts_fetch_nothing() -> None:
    fetch = FakeFetch()
    reads = ReadCoalescer(fetch)
    get = asyncio.ensure_future(reads.get(PROTO, "a", None))
    await asyncio.sleep(0)  # queued in the open batch
    get.cancel()
    await asyncio.gather(get, return_exceptions=True)
    await turns_until(lambda: not [t for t in in_flight() if "ReadCoalescer._run" in repr(t)])
    assert fetch.calls == []


async def test_a_cancelled_batch_cancels_its_gets() -> None:
    """A batch cancelled from outside (at exit: :func:`shardstore.tasks.settle`) leaves no
    get waiting for ever."""
    gets, batch = await _a_batch_under_way()
    batch.cancel()
    got = await within(asyncio.gather(*gets, return_exceptions=True))
    assert all(isinstance(g, asyncio.CancelledError) for g in got)


class OtherBuffer(cpu.Buffer):
    """A distinct output buffer type."""


async def test_gets_for_different_buffer_types_are_batched_apart() -> None:
    """A batch shares one output buffer type: other types get their own batch."""
    other = BufferPrototype(buffer=OtherBuffer, nd_buffer=cpu.NDBuffer)
    fetch = FakeFetch()
    reads = ReadCoalescer(fetch)
    got = await within(
        asyncio.gather(
            reads.get(PROTO, "a", None),
            reads.get(other, "b", None),
            reads.get(PROTO, "c", None),
        )
    )
    assert sorted(fetch.calls) == [[("a", None), ("c", None)], [("b", None)]]
    assert type(got[1]) is OtherBuffer
    assert type(got[0]) is not OtherBuffer
    assert [as_bytes(g) for g in got] == [b"a", b"b", b"c"]
