"""Surveying shards: each shard's index read past damage, with its size, as a
:class:`ShardReport`; and the keys a listing finds in them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from shardstore.errors import ShardFormatError
from shardstore.formats.base import ChunkTable
from shardstore.sync_bridge import blocking
from shardstore.tasks import gather

__all__ = [
    "ShardReport",
    "Surveyed",
    "list_keys",
    "list_keys_async",
    "read_indices_past_damage",
    "shard_reports",
    "shard_reports_async",
    "survey",
]

if TYPE_CHECKING:
    from shardstore.addressing import ShardAddress
    from shardstore.store import ShardingStore


@dataclass(frozen=True)
class ShardReport:
    """One shard object as ``info``/``verify`` see it."""

    key: str
    array: str
    nbytes: int
    """Size of the shard object."""
    chunks: int
    """Chunks present in its index."""
    live_bytes: int
    """Bytes its index points at (shared ranges counted once)."""
    dead_bytes: int
    """Bytes neither index nor live chunk: replaced chunks, old indices."""
    damage: str | None = None
    """Why the index cannot be trusted; then nothing is counted from it (chunks, live and
    dead bytes 0) and the shard is never compacted: see :func:`verify`."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- reading indices past damage -------------------------------------------------------

_Read = ChunkTable | ShardFormatError | None
"""A shard's index, why it cannot be trusted, or None: the shard is gone."""


async def read_indices_past_damage(store: ShardingStore, shards: list[ShardAddress]) -> list[_Read]:
    """Fresh indices in one batch; if a damaged shard fails the batch, each is read
    alone, so that a damaged shard costs only itself."""
    try:
        return list(await store.internals.read_indices(shards))
    except ShardFormatError:
        return list(await gather(*(_read_index(store, s) for s in shards)))


async def _read_index(store: ShardingStore, shard: ShardAddress) -> _Read:
    try:
        (index,) = await store.internals.read_indices([shard])
    except ShardFormatError as exc:
        return exc
    return index


@dataclass(frozen=True, eq=False)
class Surveyed:
    shard: ShardAddress
    report: ShardReport
    index: ChunkTable | None
    """None where damaged."""


async def survey(store: ShardingStore, shards: list[ShardAddress]) -> list[Surveyed]:
    # Sizes after indices: a concurrent append then only adds dead bytes, never a
    # range past the size read.
    indices = await read_indices_past_damage(store, shards)
    sizes = await gather(*(store.internals.raw.getsize(s.key) for s in shards))
    return [
        _surveyed(s, index, size)
        for s, index, size in zip(shards, indices, sizes, strict=True)
        if index is not None and size is not None
    ]


def _surveyed(shard: ShardAddress, index: ChunkTable | ShardFormatError, nbytes: int) -> Surveyed:
    """The shard's report, its figures from a consistent index only (an index past the
    end of the object would make dead bytes negative or absurd)."""
    problem = _inconsistency(shard, index, nbytes)
    if problem is not None or isinstance(index, ShardFormatError):
        return Surveyed(shard, ShardReport(shard.key, shard.info.path, nbytes, 0, 0, 0, problem), None)
    chunks, live, dead = shard.shard_format.table_figures(index, nbytes)
    return Surveyed(shard, ShardReport(shard.key, shard.info.path, nbytes, chunks, live, dead), index)


def _inconsistency(shard: ShardAddress, index: ChunkTable | ShardFormatError, nbytes: int) -> str | None:
    if isinstance(index, ShardFormatError):
        return str(index)
    try:
        shard.shard_format.check_table(index, nbytes, shard.key)
    except ShardFormatError as exc:
        return str(exc)
    return None


async def list_keys_async(store: ShardingStore, prefix: str = "") -> tuple[list[str], dict[str, str]]:
    """The logical keys under ``prefix`` as zarr sees them (sorted), and the shards
    whose chunks could not be listed (key -> why): a listing that goes on past them;
    metadata documents that cannot be read too (the keys below one are listed as stored)."""
    shards, plain = await store.internals.shards_under(prefix)
    keys, damaged = list(plain), await store.internals.unreadable_documents(plain)
    for shard, index in zip(shards, await read_indices_past_damage(store, shards), strict=True):
        if isinstance(index, ShardFormatError):
            damaged[shard.key] = str(index)
        elif index is not None:
            keys.extend(k for _, k in shard.present_keys(index) if k.startswith(prefix))
    return sorted(keys), damaged


async def shard_reports_async(store: ShardingStore, prefix: str = "") -> list[ShardReport]:
    """One report per shard object under ``prefix`` (damaged ones with ``damage`` set)."""
    shards, _ = await store.internals.shards_under(prefix)
    return [s.report for s in await survey(store, shards)]


list_keys = blocking(list_keys_async)


shard_reports = blocking(shard_reports_async)
