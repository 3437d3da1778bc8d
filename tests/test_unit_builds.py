"""ShardBuilds: the encodings of one write's shards by their commits stay within the
write's call, however it ends."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from shardstore.errors import ShardStoreError
from shardstore.writing.builds import ShardBuilds


def test_a_commit_that_encodes_its_shard_gets_it_once() -> None:
    builds = ShardBuilds()
    build, handed = builds.build(lambda: "encoded")
    handed()
    assert build() == "encoded"
    builds.close()
    with pytest.raises(ShardStoreError, match="not encoded"):
        build()


def test_the_end_encodes_what_was_handed_and_drops_the_rest() -> None:
    """A commit that outlives the call gets what the call's end encoded for it; a shard
    no commit was started for is encoded by nobody, before or after."""
    calls: list[str] = []

    def encoding(name: str) -> Callable[[], str]:
        def encode() -> str:
            calls.append(name)
            return name

        return encode

    builds = ShardBuilds()
    handed_build, handed = builds.build(encoding("handed"))
    dropped_build, _ = builds.build(encoding("dropped"))
    handed()
    builds.close()
    assert calls == ["handed"]
    assert handed_build() == "handed"
    with pytest.raises(ShardStoreError):
        dropped_build()
    assert calls == ["handed"]


def test_the_end_waits_for_an_encoding_under_way() -> None:
    """An encoding a commit has begun ends before the call's end returns (however long
    it is held up), so the value is not read after."""
    began, go_on = threading.Event(), threading.Event()

    def slow() -> str:
        began.set()
        assert go_on.wait(timeout=30)
        return "x"

    builds = ShardBuilds()
    build, handed = builds.build(slow)
    handed()
    commit = threading.Thread(target=build)
    commit.start()
    assert began.wait(timeout=30)
    closing = threading.Thread(target=builds.close)
    closing.start()
    closing.join(timeout=0.2)
    assert closing.is_alive()  # (held up by the encoding: it cannot return while go_on is unset)
    go_on.set()
    closing.join(timeout=30)
    commit.join(timeout=30)
    assert not closing.is_alive() and builds.ended


def test_an_end_interrupted_encodes_nothing_after_it() -> None:
    """Interrupted while it encodes (Ctrl-C on the caller's thread), the end still ends:
    the shard it was encoding fails its commit, and the handed shards it did not reach
    are encoded by nobody, their commits failing, not reading the value later."""
    calls: list[str] = []

    def interrupted() -> str:
        raise KeyboardInterrupt

    builds = ShardBuilds()
    first, first_handed = builds.build(interrupted)

    def late() -> str:
        calls.append("second")
        return "late"

    second, second_handed = builds.build(late)
    first_handed()
    second_handed()
    with pytest.raises(KeyboardInterrupt):
        builds.close()
    assert builds.ended
    with pytest.raises(ShardStoreError, match="interrupted"):
        first()
    with pytest.raises(ShardStoreError, match="ended before"):
        second()
    assert calls == []


def test_an_encoding_error_at_the_end_goes_to_the_commit() -> None:
    def failing() -> str:
        raise ValueError("cannot encode")

    builds = ShardBuilds()
    build, handed = builds.build(failing)
    handed()
    builds.close()  # (does not raise: the commit does)
    with pytest.raises(ValueError, match="cannot encode"):
        build()
