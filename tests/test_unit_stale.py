"""Unit tests of shardstore.reading.stale.until_fresh: the one retry of every ranged read path."""

from __future__ import annotations

import logging

import pytest

from shardstore.errors import ShardConflictError
from shardstore.reading.stale import STALE_READS, Attempt, until_fresh


async def test_only_the_stale_items_are_tried_again() -> None:
    seen: list[tuple[list[str], bool, bool]] = []

    async def attempt(todo: list[str], now: Attempt) -> list[str]:
        seen.append((list(todo), now.first, now.last))
        return [t for t in todo if t == "b"] if now.first else []

    await until_fresh(attempt, ["a", "b", "c"], shard_of=str, what="chunks")
    assert seen == [(["a", "b", "c"], True, False), (["b"], False, False)]


async def test_nothing_to_read_makes_no_attempt() -> None:
    async def attempt(todo: list[str], now: Attempt) -> list[str]:
        raise AssertionError("no attempt expected")

    await until_fresh(attempt, [], shard_of=str, what="chunks")


async def test_a_shard_that_keeps_changing_ends_in_a_conflict_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: list[Attempt] = []

    async def attempt(todo: list[tuple[str, int]], now: Attempt) -> list[tuple[str, int]]:
        attempts.append(now)
        return todo  # every attempt meets a changed shard

    with caplog.at_level(logging.DEBUG, logger="shardstore"), pytest.raises(ShardConflictError) as raised:
        await until_fresh(attempt, [("s/0.shard", 1), ("s/1.shard", 2)], shard_of=lambda t: t[0], what="x")
    assert len(attempts) == STALE_READS
    assert [a.last for a in attempts] == [False] * (STALE_READS - 1) + [True]
    assert "'s/0.shard', 's/1.shard'" in str(raised.value)
    assert f"{STALE_READS} attempts to read x" in str(raised.value)
    again = [r for r in caplog.records if "met a shard changed" in r.getMessage()]
    assert len(again) == STALE_READS - 1
