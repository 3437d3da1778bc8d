"""The shards of one write that their commits encode (:class:`~shardstore.writing.updates.ShardToBuild`),
kept within the write's call.

Their encodings read the value zarr gives the write, which may be the caller's own
array, and the caller may change it as soon as the call returns. A commit outlives
its write when the write is cancelled (other writers may share it), and must then
write the value as it was given, as a commit of shards encoded ahead of it does. So
the call does not return before every shard it has handed to a commit is encoded
(those its commits have not encoded yet are encoded then, on the caller's thread),
and no shard is encoded from the value after it has returned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar, cast

from shardstore.errors import ShardStoreError

__all__ = ["ShardBuilds"]

T = TypeVar("T")


class _Build(Generic[T]):
    """One shard's encoding: done once, by its commit or by the write's end, whichever
    comes first; its result (or error) let go of once the commit has it."""

    def __init__(self, build: Callable[[], T], builds: ShardBuilds) -> None:
        self._build: Callable[[], T] | None = build
        self._builds = builds
        self._lock = threading.Lock()
        self._kept: tuple[T | None, Exception | None] | None = None

    def __call__(self) -> T:
        """The encoding, for the commit (once)."""
        with self._lock:
            if self._build is not None:
                if self._builds.ended:
                    raise ShardStoreError("a shard was not handed to its commit before its write ended")
                build, self._build = self._build, None
                return build()
            if self._kept is None:
                raise ShardStoreError("a shard's encoding was asked for twice: its write's value is gone")
            (result, error), self._kept = self._kept, None
            if error is not None:
                raise error
            return cast(T, result)

    def keep(self) -> None:
        """Encode now, unless the commit has begun to (then wait for it to end)."""
        with self._lock:
            if self._build is None:
                return
            build, self._build = self._build, None
            try:
                self._kept = (build(), None)
            except Exception as exc:  # (the commit raises it)
                self._kept = (None, exc)


class ShardBuilds:
    """The shards one write's commits encode (see the module docstring): use
    :meth:`build` for each, :meth:`hand` as they go to their commits, and
    :meth:`close` when the write's call ends, however it ends."""

    def __init__(self) -> None:
        self._handed: list[_Build[Any]] = []
        self.ended = False

    def build(self, build: Callable[[], T]) -> Callable[[], T]:
        """``build``, to be called once, by the commit."""
        return _Build(build, self)

    def hand(self, builds: Iterable[Callable[[], Any]]) -> None:
        """These are about to go to their commits, which may outlive the call."""
        self._handed.extend(build for build in builds if isinstance(build, _Build))

    def close(self) -> None:
        """Encode what was handed and is not encoded yet (commits that outlive the call
        then write the value as it was given); none is encoded after this returns."""
        for build in self._handed:
            build.keep()
        self._handed.clear()
        self.ended = True
