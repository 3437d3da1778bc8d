"""Moving an array's chunks to the places a new grid gives them.

Where a format numbers chunks from their grid position in the grid's shape (the
neuroglancer format: a chunk's id is the compressed Morton code of its position)
a resize can give chunks already stored other places
(:meth:`~shardstore.formats.base.ShardFormat.renumbers`). :func:`migrate` copies every
stored chunk to its new place (:meth:`~shardstore.formats.base.ShardFormat.renumbered`),
into shard objects in a directory of their own below the array's chunk prefix, and
the metadata document naming that directory (written by the caller) is the commit. A process
killed before it leaves the old array whole (plus unread files in the new
directory); one killed after, the new array (plus the old, unread files).
Both kinds are *stale* shard files: never listed or read, deleted with the
array, reported by ``leftovers``.

The copy is checked against other writers: every old shard is read with its
version, and just before the commit it must still be at that version (and no
shard added or removed), and the stored metadata must still name the old
places (no other resize committed meanwhile), or the migration is made again
from scratch. A resize that finds nothing to move checks the metadata too: an
array whose chunks another resize just moved has no shards left where it was
read, and committing that empty place would lose them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass

from zarr.abc.store import RangeByteRequest

from shardstore.addressing import shard_at
from shardstore.errors import ShardConflictError
from shardstore.formats.base import ShardFormat, table_entry
from shardstore.inner import InnerStore
from shardstore.inner.base import STALE
from shardstore.metadata import ArrayInfo
from shardstore.tasks import gather

__all__ = ["Migration", "delete_old", "migrate", "shard_keys"]

log = logging.getLogger(__name__)

_SHARDS_AT_ONCE = 16
"""Old shards read (whole) at once while their chunks are located."""
_COPY_BYTES = 64 * 2**20
"""Chunk bytes one round of the copy holds: new shards are built a group at a time."""


@dataclass(frozen=True)
class Migration:
    """A finished copy, waiting for its commit: the array's sharding naming the new
    directory, and the old shard files to delete once the metadata names it (none,
    and the sharding as it is, when there was nothing to move)."""

    shard_format: ShardFormat
    old_keys: list[str]


@dataclass(frozen=True)
class _Seen:
    """An old shard as the copy read it: the version to check, or a digest of its
    bytes where the inner store tells no version."""

    version: Hashable | None
    digest: bytes


@dataclass(frozen=True)
class _Piece:
    """One chunk to copy: where its bytes are now, and its new place."""

    old_key: str
    start: int
    stop: int
    new_place: int


class _Changed(Exception):
    """Another writer changed an old shard while it was being copied."""


async def migrate(
    inner: InnerStore,
    old: ArrayInfo,
    current: Callable[[], Awaitable[ArrayInfo | None]],
    new_grid: Sequence[int],
    *,
    attempts: int,
) -> Migration:
    """Copy the chunks of ``old`` that lie inside ``new_grid`` to the places that grid
    gives them, in a new directory. ``current()`` reads the array
    afresh for each further attempt (another process may have resized it meanwhile).
    Raises ShardConflictError if other writers changed the old shards during each of
    ``attempts`` copies."""
    for attempt in range(attempts):
        if attempt:
            old = await current() or old
        fmt = old.shard_format
        assert fmt is not None
        old_keys = await shard_keys(inner, old)
        if not old_keys or not fmt.renumbers(old.grid_shape, tuple(new_grid)):
            # nothing stored, or nothing to move: the places stay, if the array is still
            # where it was read (another resize may have moved its chunks, and removed
            # these shards, since: then this one starts again from there)
            if await _still_there(old, current):
                return Migration(fmt, [])
            continue
        directory = f"ids-{'x'.join(map(str, new_grid))}-{secrets.token_hex(4)}"
        target = fmt.in_subdirectory(directory)
        prefix = f"{old.chunk_prefix}{directory}/"
        try:
            seen, pieces, blobs = await _locate(inner, old, old_keys, new_grid)
            written = await _copy(inner, target, prefix, pieces, seen, blobs)
            if (
                await shard_keys(inner, old) != old_keys
                or not await _unchanged(inner, seen)
                or not await _still_there(old, current)
            ):
                raise _Changed
        except _Changed:
            log.debug(
                "array %r: another writer changed its shards during renumbering (attempt %d/%d)",
                old.path,
                attempt + 1,
                attempts,
            )
            await _discard(inner, prefix)
            continue
        except Exception:
            with contextlib.suppress(Exception):  # else left as stale files, which leftovers lists
                await _discard(inner, prefix)
            raise
        log.debug(
            "array %r: %d chunk(s) of %d shard(s) renumbered for a grid of %s into %d shard(s) in %r",
            old.path,
            len(pieces),
            len(old_keys),
            list(new_grid),
            len(written),
            directory,
        )
        return Migration(target, old_keys)
    raise ShardConflictError(
        f"array {old.path or '/'!r}: other writers changed its shards during each of {attempts} attempts "
        "to renumber its chunks for the new shape; the resize was not applied"
    )


async def _still_there(old: ArrayInfo, current: Callable[[], Awaitable[ArrayInfo | None]]) -> bool:
    """Whether the stored metadata still keeps the array's chunks where ``old`` says
    (no other resize committed a renumbering meanwhile)."""
    now = await current()
    return now is not None and now.shard_format == old.shard_format


async def delete_old(
    inner: InnerStore, migration: Migration, path: str, forget: Callable[[str], None] | None = None
) -> None:
    """Remove the old shard files once the metadata names the new directory, each
    also ``forget``-ed (what readers cached of it: a new array at the same path may
    name it again); one that cannot be removed stays as a stale file (unread,
    reported by ``leftovers``)."""
    results = await asyncio.gather(*(inner.delete(k) for k in migration.old_keys), return_exceptions=True)
    if forget is not None:
        for key in migration.old_keys:
            forget(key)
    failed = [k for k, r in zip(migration.old_keys, results, strict=True) if isinstance(r, BaseException)]
    if failed:
        log.warning(
            "array %r: renumbered, but %d old shard file(s) could not be deleted (%r ...): they are "
            "never read; `shardstore verify` lists them",
            path,
            len(failed),
            failed[0],
        )


async def _discard(inner: InnerStore, prefix: str) -> None:
    """Remove what an abandoned copy wrote."""
    await gather(*[inner.delete(k) async for k in inner.list_prefix(prefix)])


async def shard_keys(inner: InnerStore, info: ArrayInfo) -> list[str]:
    """The array's shard files (sorted)."""
    return sorted([k async for k in inner.list_prefix(info.shard_prefix) if shard_at(info, k) is not None])


async def _locate(
    inner: InnerStore, old: ArrayInfo, keys: list[str], new_grid: Sequence[int]
) -> tuple[dict[str, _Seen], list[_Piece], dict[str, bytes]]:
    """Read each old shard (a few at a time) and say where each of its chunks goes;
    the shards read are kept while they fit in one round of the copy."""
    fmt = old.shard_format
    assert fmt is not None
    seen: dict[str, _Seen] = {}
    pieces: list[_Piece] = []
    kept_blobs: dict[str, bytes] = {}
    held = 0
    for start in range(0, len(keys), _SHARDS_AT_ONCE):
        batch = keys[start : start + _SHARDS_AT_ONCE]
        read = await inner.get_many_versioned([(k, None) for k in batch], [None] * len(batch))
        for key, (blob, version) in zip(batch, read, strict=True):
            if blob is None or blob is STALE:
                raise _Changed  # deleted since it was listed
            seen[key] = _Seen(version, hashlib.blake2b(blob, digest_size=16).digest())
            if held + len(blob) <= _COPY_BYTES:
                kept_blobs[key] = blob
                held += len(blob)
            table = fmt.parse(blob, key)
            places = fmt.table_places(table)
            kept, new_places = fmt.renumbered(places, old.grid_shape, tuple(new_grid))
            for place, new_place in zip(places[kept].tolist(), new_places.tolist(), strict=True):
                offset, nbytes = table_entry(table, place) or (0, 0)
                pieces.append(_Piece(key, offset, offset + nbytes, new_place))
    return seen, pieces, kept_blobs


async def _copy(
    inner: InnerStore,
    target: ShardFormat,
    prefix: str,
    pieces: list[_Piece],
    seen: dict[str, _Seen],
    blobs: dict[str, bytes],
) -> list[str]:
    """Build and write the new shards, a group of them at a time; their keys."""
    by_shard: dict[tuple[int, ...], list[_Piece]] = {}
    for shard, piece in zip(target.shards_of([p.new_place for p in pieces]), pieces, strict=True):
        by_shard.setdefault(shard, []).append(piece)
    written: list[str] = []
    group: dict[tuple[int, ...], list[_Piece]] = {}
    size = 0
    for number, members in sorted(by_shard.items()):
        group[number] = members
        size += sum(p.stop - p.start for p in members)
        if size >= _COPY_BYTES:
            written += await _write_group(inner, target, prefix, group, seen, blobs)
            group, size = {}, 0
    if group:
        written += await _write_group(inner, target, prefix, group, seen, blobs)
    return written


async def _write_group(
    inner: InnerStore,
    target: ShardFormat,
    prefix: str,
    group: dict[tuple[int, ...], list[_Piece]],
    seen: dict[str, _Seen],
    blobs: dict[str, bytes],
) -> list[str]:
    """Write one group of new shards, their chunks taken from the old shards kept in
    memory or read by range at the version the copy saw."""
    pieces = [p for members in group.values() for p in members]
    far = [p for p in pieces if p.old_key not in blobs]
    read = await inner.get_many_versioned(
        [(p.old_key, RangeByteRequest(p.start, p.stop)) for p in far],
        [seen[p.old_key].version for p in far],
    )
    data = {p.new_place: blobs[p.old_key][p.start : p.stop] for p in pieces if p.old_key in blobs}
    for piece, (value, _) in zip(far, read, strict=True):
        if value is None or value is STALE or len(value) != piece.stop - piece.start:
            raise _Changed
        data[piece.new_place] = value
    keys = [prefix + target.shard_file(shard) for shard in group]
    shards = [target.build({p.new_place: data[p.new_place] for p in members}) for members in group.values()]
    await gather(*(inner.set(k, blob) for k, blob in zip(keys, shards, strict=True)))
    return keys


async def _unchanged(inner: InnerStore, seen: dict[str, _Seen]) -> bool:
    """Whether every old shard is still as the copy read it: by version where the
    store tells one (one tiny checked read each), else by its bytes."""
    keys = list(seen)
    checks = await inner.get_many_versioned(
        [(k, None if seen[k].version is None else RangeByteRequest(0, 1)) for k in keys],
        [seen[k].version for k in keys],
    )
    for key, (value, version) in zip(keys, checks, strict=True):
        if value is None or value is STALE:
            return False
        if seen[key].version is None and hashlib.blake2b(value, digest_size=16).digest() != seen[key].digest:
            return False
        if seen[key].version is not None and version is not None and version != seen[key].version:
            return False
    return True
