"""The shards of one write that their commits encode (:class:`~shardstore.writing.updates.ShardToBuild`),
kept within the write's call.

Their encodings read the value zarr gives the write, which may be the caller's own
array, and the caller may change it as soon as the call returns. A commit outlives
its write when the write is cancelled (other writers may share it), and must then
write the value as it was given, as a commit of shards encoded ahead of it does. So
when the call ends, however it ends, the shards handed to a commit that has not
encoded them yet are encoded, on the caller's thread; an encoding under way is
waited for; every other shard is encoded by nobody; and no shard is encoded from
the value after that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from shardstore.errors import ShardStoreError

__all__ = ["ShardBuilds"]

T = TypeVar("T")


class _Build(Generic[T]):
    """One shard's encoding: done once, by its commit or by the write's end, whichever
    comes first; what it gave (or raised) let go of once the commit has it."""

    def __init__(self, build: Callable[[], T], builds: ShardBuilds) -> None:
        self._build: Callable[[], T] | None = build
        self._builds = builds
        self._lock = threading.Lock()
        self._handed = False
        self._kept: tuple[T | None, BaseException | None] | None = None

    def __call__(self) -> T:
        """The encoding, for the commit (once)."""
        with self._lock:
            if self._build is not None:
                if self._builds.ended:
                    raise ShardStoreError(
                        "the write ended before this shard's commit encoded it: "
                        "it keeps its previous contents"
                    )
                build, self._build = self._build, None
                return build()
            if self._kept is None:
                raise ShardStoreError("this shard was not encoded: its write ended first")
            (result, error), self._kept = self._kept, None
            if error is not None:
                raise error
            return cast(T, result)

    def hand(self) -> None:
        """A commit that will call this has started."""
        with self._lock:
            self._handed = True

    def settle(self) -> None:
        """At the write's end: encode now if handed and not encoded yet, else drop the
        encoding (an encoding under way ends first: it holds the lock)."""
        with self._lock:
            if self._build is None:
                return
            build, self._build = self._build, None
            if not self._handed:
                return
            try:
                self._kept = (build(), None)
            except Exception as exc:  # (the commit raises it)
                self._kept = (None, exc)
            except BaseException:  # (interrupted on the caller's thread: the commit fails)
                self._kept = (None, ShardStoreError("this shard's encoding was interrupted"))
                raise


class ShardBuilds:
    """The shards one write's commits encode (see the module docstring): each given to
    its :class:`~shardstore.writing.updates.ShardToBuild` as :meth:`build` makes it,
    and :meth:`close` when the write's call ends."""

    def __init__(self) -> None:
        self._builds: list[_Build[Any]] = []
        self.ended = False

    def build(self, build: Callable[[], T]) -> tuple[Callable[[], T], Callable[[], None]]:
        """``build``, to be called once by the shard's commit, and what to call once
        that commit has started (a ShardToBuild's ``build`` and ``handed``)."""
        kept = _Build(build, self)
        self._builds.append(kept)
        return kept, kept.hand

    def close(self) -> None:
        """Settle every shard (see the module docstring): none is encoded from the value
        once this has returned or raised."""
        try:
            for build in self._builds:
                build.settle()
        finally:
            self.ended = True
            self._builds.clear()
