"""``info``: per array, its shards, chunks present, fill ratio, stored and dead bytes,
layout and write strategy."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from shardstore.choices import Layout, WriteStrategy
from shardstore.errors import ShardingConfigError
from shardstore.maintenance.survey import Surveyed, survey
from shardstore.metadata import ARRAY_DOC_NAMES, ArrayInfo
from shardstore.sync_bridge import blocking
from shardstore.tasks import gather

__all__ = ["ArrayReport", "info", "info_async"]

if TYPE_CHECKING:
    from shardstore.store import ShardingStore


@dataclass(frozen=True)
class ArrayReport:
    """One array as ``info`` reports it."""

    path: str
    sharded: bool
    chunks_per_shard: list[int] | None
    grid_chunks: int
    """Chunks in the array's chunk grid."""
    chunks: int
    """Chunks present (in intact shards' indices, or as objects for an unsharded array)."""
    shards: int
    stored_bytes: int
    dead_bytes: int
    """In intact shards."""
    damaged: dict[str, str] = field(default_factory=dict)
    """Shards whose index cannot be trusted (key -> why): counted in ``shards`` and
    ``stored_bytes`` only; or the array's metadata document, if it cannot be read
    (then nothing is counted)."""
    layout: Layout | None = None
    """How its sharding is recorded: "transformer" (our storage-transformer entry) or
    "codec" (standard ``sharding_indexed`` metadata); None where shardstore does not
    shard it."""
    write_strategy: WriteStrategy = "rewrite"
    """How writes through the store would commit to its shards: "append" only where
    the store asks for it, its inner store can append in place (local files) and the
    array's shards can take appends (index at the end); else "rewrite" (unsharded
    arrays: zarr rewrites each chunk object whole)."""

    @property
    def fill_ratio(self) -> float:
        return self.chunks / self.grid_chunks if self.grid_chunks else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fill_ratio": self.fill_ratio}


async def info_async(
    store: ShardingStore, prefix: str = "", *, write_strategy: WriteStrategy | None = None
) -> list[ArrayReport]:
    """Per array under ``prefix``: shards, chunks present, fill ratio, stored and dead
    bytes, layout, and the write strategy in effect for a store asking for
    ``write_strategy`` (default: the strategy ``store`` was opened with)."""
    if write_strategy not in (None, "rewrite", "append"):
        raise ShardingConfigError(f"write_strategy={write_strategy!r}: choose 'rewrite' or 'append'")
    asked = store.internals.write_strategy if write_strategy is None else write_strategy
    appends = asked == "append" and store.internals.raw.capabilities.append
    shards, plain = await store.internals.shards_under(prefix)
    surveyed = await survey(store, shards)
    arrays = sorted({k.rpartition("/")[0] for k in plain if k.rpartition("/")[2] in ARRAY_DOC_NAMES})
    unreadable = await store.internals.unreadable_documents(plain)
    reports = []
    for path in arrays:
        damaged = {k: why for k, why in unreadable.items() if k.rpartition("/")[0] == path}
        info = None if damaged else await store.internals.array_at(path)
        if damaged:  # (listed with nothing counted: what is below it is not known)
            reports.append(ArrayReport(path, False, None, 0, 0, 0, 0, 0, damaged))
        elif info is not None:
            mine = [s for s in surveyed if s.shard.info.path == path]
            reports.append(
                await _array_report(
                    store, info, mine, [k for k in plain if info.coords(k) is not None], appends
                )
            )
    return reports


async def _array_report(
    store: ShardingStore, info: ArrayInfo, shards: list[Surveyed], chunk_keys: list[str], appends: bool
) -> ArrayReport:
    """``chunk_keys``: the array's chunk objects, if it is unsharded; ``appends``:
    whether the store would append to shards that can take it."""
    fmt = info.shard_format
    objects = await gather(*(store.getsize(k) for k in chunk_keys))
    return ArrayReport(
        path=info.path,
        sharded=fmt is not None,
        chunks_per_shard=None if fmt is None or fmt.grid_block is None else list(fmt.grid_block),
        grid_chunks=int(np.prod(info.grid_shape)),
        chunks=len(chunk_keys)
        + sum(len(s.shard.present_keys(s.index)) for s in shards if s.index is not None),
        shards=len(shards),
        stored_bytes=sum(s.report.nbytes for s in shards) + sum(objects),
        dead_bytes=sum(s.report.dead_bytes for s in shards),
        damaged={s.report.key: s.report.damage for s in shards if s.report.damage is not None},
        layout=None if fmt is None else info.form,
        write_strategy="append" if appends and fmt is not None and fmt.appendable else "rewrite",
    )


info = blocking(info_async)
