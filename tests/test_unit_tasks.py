"""Nothing a call starts outlives it: shardstore.tasks.gather, and calls hopped to
an async file system's home loop."""

from __future__ import annotations

import asyncio

import pytest

from shardstore.tasks import gather


async def test_gather_returns_results_in_order() -> None:
    async def after(delay: float, value: int) -> int:
        await asyncio.sleep(delay)
        return value

    assert await gather(after(0.02, 1), after(0.0, 2), after(0.01, 3)) == [1, 2, 3]


async def test_gather_cancels_and_awaits_the_rest_when_one_fails() -> None:
    ended: list[str] = []

    async def slow(name: str) -> None:
        try:
            await asyncio.sleep(10)
        finally:
            ended.append(name)

    async def failing() -> None:
        await asyncio.sleep(0)
        raise OSError("boom")

    with pytest.raises(OSError, match="boom"):
        await gather(slow("a"), failing(), slow("b"))
    assert sorted(ended) == ["a", "b"]  # both had ended when gather raised


async def test_gather_notes_the_other_errors() -> None:
    async def failing(message: str) -> None:
        raise OSError(message)

    with pytest.raises(OSError) as raised:
        await gather(failing("first"), failing("second"))
    assert any("second" in note for note in raised.value.__notes__)


def test_a_cancelled_call_on_a_home_loop_ends_there_and_leaves_no_error_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An async file system's call runs on its home loop; cancelling the caller cancels
    it there, and its failure is never left for asyncio to report as never retrieved."""
    import gc
    import threading

    from shardstore.inner.fsspec_fs import _hop

    home = asyncio.new_event_loop()
    thread = threading.Thread(target=home.run_forever, daemon=True)
    thread.start()
    ended: list[str] = []

    async def failing_read() -> None:
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        raise OSError("Forbidden")

    async def caller() -> None:
        call = asyncio.ensure_future(_hop(failing_read(), home))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    try:
        asyncio.run(caller())
        gc.collect()
    finally:
        home.call_soon_threadsafe(home.stop)
        thread.join()
        home.close()
    assert ended == ["cancelled"]
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
