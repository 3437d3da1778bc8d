"""Chunk updates: what a write asks of one chunk, and how updates to one shard
are grouped and merged before they become a commit. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from shardstore.addressing import ChunkAddress, ShardAddress
from shardstore.formats.base import ShardFormat

__all__ = [
    "BuiltShard",
    "ShardToBuild",
    "ShardUpdates",
    "Splice",
    "Update",
    "UpdatesByShard",
    "add_update",
    "apply_updates",
    "covers_shard",
    "independent_of_old",
    "merge_updates",
    "rebuilt_pieces",
    "rebuilt_shard",
    "replaces_shard",
]


@dataclass(frozen=True)
class Splice:
    """Overwrite part of a chunk's bytes from ``start`` (a ZEP 2 partial write)."""

    start: int
    data: bytes


Update: TypeAlias = bytes | memoryview | Splice | None
"""New bytes for a chunk (a view of a new shard's), a splice into its current bytes, or
None to erase it."""
ShardUpdates: TypeAlias = dict[int, list[Update]]
"""The updates to one shard: index position -> that chunk's updates, oldest first."""
UpdatesByShard: TypeAlias = dict[str, tuple[ShardAddress, ShardUpdates]]
"""Updates grouped per shard key, as one zarr call's keys are before their commits."""


@dataclass(frozen=True)
class BuiltShard:
    """A shard object built whole by the writer of every chunk in it (see
    :meth:`~shardstore.formats.base.ShardFormat.dense_shards`): committed as it is where
    nothing else is pending for the shard, else as the updates of its chunks."""

    blob: memoryview
    data: memoryview
    """The data area of ``blob``: chunk ``p`` at ``p * chunk_nbytes``."""
    chunk_nbytes: int

    def updates(self) -> ShardUpdates:
        """Its chunks as updates (views of ``blob``), to merge with others."""
        size = self.chunk_nbytes
        return {p: [self.data[p * size : (p + 1) * size]] for p in range(len(self.data) // size)}


@dataclass(frozen=True)
class ShardToBuild:
    """A shard every chunk of which a write decides, encoded by its own commit: where the
    inner store makes each change on a worker thread (``Capabilities.changes_in_threads``)
    a thread encodes a shard and writes it at once, so no thread waits for a group's
    encoding to end before its commits begin, and a shard is held only from its
    encoding to its commit (one that must wait its turn, behind a pending commit or in
    a batch, is encoded first)."""

    build: Callable[[], dict[int, bytes | memoryview | None] | BuiltShard]
    """The shard's chunks by place (None: no chunk), or the shard built whole: called
    once."""
    handed: Callable[[], None] = lambda: None
    """Told once a commit that will call ``build`` has started (it may outlive the
    write's call: see :mod:`shardstore.writing.builds`)."""

    def updates(self) -> ShardUpdates | BuiltShard:
        """Built now, on the calling thread, as :class:`BuiltShard` or updates."""
        built = self.build()
        return built if isinstance(built, BuiltShard) else {place: [value] for place, value in built.items()}


def apply_updates(old: bytes | memoryview | None, updates: list[Update]) -> bytes | memoryview | None:
    value: bytes | memoryview | None = None if old is None else bytes(old)
    for update in updates:
        if isinstance(update, Splice):
            buf = bytearray(value or b"")
            if update.start > len(buf):  # as a file written past its end: a gap of zeros
                buf.extend(bytes(update.start - len(buf)))
            buf[update.start : update.start + len(update.data)] = update.data
            value = bytes(buf)
        else:
            value = update
    return value


def independent_of_old(updates: list[Update]) -> bool:
    """Whether the chunk's new value can be known without reading the old one."""
    return bool(updates) and not isinstance(updates[0], Splice)


def _gives_value(updates: list[Update] | None) -> bool:
    """Whether updates leave the chunk a value (not erased) known without reading the
    old one: they start from a whole value or an erase, and do not end erasing it (a
    splice after an erase writes into empty bytes)."""
    return (
        updates is not None
        and len(updates) > 0
        and not isinstance(updates[0], Splice)
        and updates[-1] is not None
    )


def merge_updates(into: ShardUpdates, updates: Mapping[int, list[Update]]) -> None:
    """Add updates after those already queued: a full value replaces, a splice stacks."""
    if not into:  # nothing queued yet (a new batch: the common case), either way a copy
        into.update({pos: list(ups) for pos, ups in updates.items()})
        return
    for pos, ups in updates.items():
        if independent_of_old(ups):
            into[pos] = list(ups)
        else:
            into.setdefault(pos, []).extend(ups)


def add_update(by_shard: UpdatesByShard, chunk: ChunkAddress, update: Update) -> None:
    """Group an update with the others to its shard, in order."""
    merge_updates(by_shard.setdefault(chunk.shard.key, (chunk.shard, {}))[1], {chunk.position: [update]})


def covers_shard(shard: ShardAddress, updates: ShardUpdates) -> bool:
    """Whether updates give every chunk of the shard a value without reading it: never
    for a shard the array's edge cuts (see :func:`replaces_shard`), nor for shards of
    chunk ids, whose members are spread over the grid."""
    return _every_place(shard, updates, _gives_value, cut_by_edge=False)


def replaces_shard(shard: ShardAddress, updates: ShardUpdates, *, cut_by_edge: bool = False) -> bool:
    """Whether updates decide every chunk of the shard, a value or an erase, so that
    the new shard owes nothing to the old one. A shard the array's edge cuts, only with
    ``cut_by_edge`` (every in-array chunk decided): its places past the edge may hold
    chunks written by another process that grew the array since this one read its
    metadata, which a new shard made without reading the old one would drop."""
    return _every_place(shard, updates, lambda ups: ups is not None and independent_of_old(ups), cut_by_edge)


def _every_place(
    shard: ShardAddress, updates: ShardUpdates, test: Callable[[list[Update] | None], bool], cut_by_edge: bool
) -> bool:
    needed = shard.places_in_grid()
    block = shard.shard_format.grid_block
    if needed is None or (not cut_by_edge and (block is None or len(needed) < math.prod(block))):
        return False
    if len(updates) < len(needed):  # the common case while a shard fills up: O(1)
        return False
    get = updates.get
    return all(map(test, map(get, needed)))


def rebuilt_shard(
    fmt: ShardFormat, key: str, old: bytes | None, updates: Mapping[int, list[Update]], *, keep_empty: bool
) -> bytes | None:
    """The shard ``key`` as one compact object of format ``fmt``: its old chunks with
    ``updates`` applied; None (delete it) once no chunk is left, unless ``keep_empty``
    (an emptied shard stays, empty, where deletes are not ordered against other
    writers: see ``Capabilities.ordered_deletes``)."""
    pieces = rebuilt_pieces(fmt, key, old, updates, keep_empty=keep_empty)
    return None if pieces is None else b"".join(pieces)  # (one bytes object: itself, not copied)


def rebuilt_pieces(
    fmt: ShardFormat, key: str, old: bytes | None, updates: Mapping[int, list[Update]], *, keep_empty: bool
) -> list[bytes | memoryview] | None:
    """:func:`rebuilt_shard`'s object as the pieces to write one after another
    (:meth:`ShardFormat.pieces`): a local file takes them without their join."""
    if old is None and all(len(ups) == 1 and not isinstance(ups[0], Splice) for ups in updates.values()):
        # a new shard of new values (a whole write): no chunk to apply anything to
        new = {
            chunk: value
            for chunk, (value,) in updates.items()
            if value is not None and not isinstance(value, Splice)
        }
        return fmt.pieces(new) if new else None
    chunks: dict[int, bytes | memoryview] = {} if old is None else dict(fmt.split(old, key))
    for chunk, ups in updates.items():
        value = apply_updates(chunks.get(chunk), ups)
        if value is None:
            chunks.pop(chunk, None)
        else:
            chunks[chunk] = value
    if not chunks:
        return fmt.pieces({}) if keep_empty and old is not None else None
    return fmt.pieces(chunks)
