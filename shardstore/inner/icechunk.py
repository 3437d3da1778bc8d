"""An Icechunk session's store as the inner store.

Icechunk (the ``icechunk`` package) is a zarr store with commits: writes go
to the session's change set and become visible to others only with
``session.commit``, which fails with Icechunk's ``ConflictError`` when the
branch moved meanwhile. Inside one session, writers of this process take
turns on a shard as everywhere else, so nothing needs more than the zarr
store adapter, except for forks.

A fork (``session.fork()``, sent to another process and merged back with
``session.merge(*forks)``) is merged object by object, the last fork's object
winning: Icechunk sees a shard as one chunk. A fork that rewrote a shard
keeping chunks it did not write would, once merged, put those old chunks back
over another fork's new ones. So a fork's store says ``merged_by_key``, and
the writer refuses such writes (whole shards only).

Icechunk is optional: this module imports nothing of it, and recognises its
stores by their class and the session they carry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import replace
from typing import Any

from zarr.abc.store import ByteRequest, Store

from shardstore.errors import PartialShardWriteError
from shardstore.inner.base import DEFAULT_ATTEMPTS, Change, InnerStore, failure
from shardstore.inner.zarr_store import ZarrInner

__all__ = ["IcechunkInner", "is_icechunk"]


def is_icechunk(store: object) -> bool:
    """Whether ``store`` is an Icechunk session's store (``session.store``)."""
    return (
        isinstance(store, Store)
        and type(store).__name__ == "IcechunkStore"
        and type(store).__module__.split(".")[0] == "icechunk"
    )


def _refused_prefix(exc: Exception) -> bool:
    """Whether Icechunk refused to list a prefix that is no group or array."""
    return "bad key prefix" in str(exc)


class IcechunkInner(ZarrInner):
    """The store of an Icechunk session or of a fork of one."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self._icechunk: Any = store  # (typed as any zarr Store above)
        self.forked = type(store.session).__name__ == "ForkSession"
        """Written in a fork, merged into its session later, object by object."""
        self.capabilities = replace(self.capabilities, merged_by_key=self.forked, changes_unseen=True)

    async def get_many(self, requests: Sequence[tuple[str, ByteRequest | None]]) -> list[bytes | None]:
        """One ``get`` per key: Icechunk's ``get_partial_values`` fails on a missing key
        (it hands zarr's buffer None) where ``get`` says None."""
        return await InnerStore.get_many(self, requests)

    async def update(
        self, key: str, change: Change, *, read_old: bool = True, attempts: int = DEFAULT_ATTEMPTS
    ) -> None:
        """In a fork, only updates that replace the object whole (the writer refuses the
        others first, saying more; this catches any other road)."""
        if self.forked and read_old:
            raise PartialShardWriteError(
                f"{key!r} was not written through {self!r}: a read-modify-write in a fork would, once "
                "merged, replace another fork's version of it; write whole shards from forks"
            )
        await super().update(key, change, read_old=read_old, attempts=attempts)

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        """Every key under ``prefix``. Icechunk lists only below a group or an array
        (a prefix such as ``a/c/`` or one that names nothing is refused), so such a
        prefix is listed from the nearest node above it, after ``list_dir``, which
        takes any prefix, has shown that something is there."""
        with failure("list", prefix):
            try:
                keys = [key async for key in self.store.list_prefix(prefix)]
            except Exception as exc:
                if not _refused_prefix(exc):
                    raise
                keys = await self._listed_from_above(prefix)
        for key in keys:
            yield key

    async def _listed_from_above(self, prefix: str) -> list[str]:
        directory = prefix[: prefix.rfind("/") + 1]
        if not [name async for name in self.store.list_dir(directory)]:
            return []
        parts = directory.rstrip("/").split("/") if directory else []
        for depth in range(len(parts) - 1, -1, -1):
            above = "/".join(parts[:depth]) + "/" if depth else ""
            try:
                return [key async for key in self.store.list_prefix(above) if key.startswith(prefix)]
            except Exception as exc:
                if not _refused_prefix(exc):
                    raise
        return []

    @property
    def lock_scope(self) -> Hashable:
        """One scope for every Icechunk store of the process: two stores of one session
        (each ``session.store`` is a new object, and a session's repr names only its
        branch and snapshot) must take turns on a shard; stores of other sessions
        then take turns too, which costs nothing but waiting."""
        return "icechunk"

    def __repr__(self) -> str:
        session = self.session
        kind = "fork" if self.forked else "read-only session" if self.read_only else "session"
        branch = f" of branch {session.branch!r}" if session.branch else ""
        return f"<Icechunk {kind}{branch} at snapshot {session.snapshot_id}>"

    @property
    def session(self) -> Any:
        """The Icechunk session (or fork) whose store this is."""
        return self._icechunk.session

    @property
    def read_only(self) -> bool:
        """A read-only session (``repo.readonly_session``) or a read-only store."""
        return bool(self.store.read_only)
