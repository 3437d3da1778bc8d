"""What the command line's ``ls``, ``info`` and ``verify`` ask of the data at a URL,
whatever its format: :class:`Inspection`. A zarr hierarchy answers through
:class:`ZarrInspection`; each format wing with tools of its own (the neuroglancer
format: ``neuroglancer/tools.py``) answers with its own implementation, so
the command line holds no format's knowledge."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Protocol

from shardstore.maintenance.common import Progress
from shardstore.maintenance.info import info
from shardstore.maintenance.leftovers import leftovers
from shardstore.maintenance.survey import list_keys
from shardstore.maintenance.verify import verify

if TYPE_CHECKING:
    from shardstore.choices import WriteStrategy
    from shardstore.store import ShardingStore

__all__ = ["Findings", "Inspection", "ZarrInspection"]

Findings = dict[str, str]
"""Object key -> what was found (damage, or what a leftover file is)."""


class Inspection(Protocol):
    """The data at one URL as the tools see it."""

    not_counted: str
    """What ``info`` leaves out of its figures for a damaged shard."""

    def keys(self, prefix: str) -> tuple[list[str], Findings]:
        """The keys present under ``prefix``, and the damaged shards they could not be
        listed from."""
        ...

    def info(
        self, prefix: str, *, as_json: bool, write_strategy: WriteStrategy | None
    ) -> tuple[str, Findings]:
        """The ``info`` report as text (a table, or JSON), and the damaged shards not counted."""
        ...

    def check(self, prefix: str, *, decode: bool, progress: Progress | None) -> tuple[Findings, Findings]:
        """Every problem of every damaged object, and the leftovers beside them."""
        ...


class ZarrInspection:
    """A zarr hierarchy through a :class:`~shardstore.ShardingStore`."""

    not_counted = "its chunks and dead bytes are not counted"

    def __init__(self, store: ShardingStore) -> None:
        self.store = store

    def keys(self, prefix: str) -> tuple[list[str], Findings]:
        return list_keys(self.store, prefix)

    def info(
        self, prefix: str, *, as_json: bool, write_strategy: WriteStrategy | None
    ) -> tuple[str, Findings]:
        reports = info(self.store, prefix, write_strategy=write_strategy)
        damaged = {key: problem for r in reports for key, problem in r.damaged.items()}
        if as_json:
            return json.dumps([r.to_dict() for r in reports], indent=2), damaged
        lines = [
            f"{'array':<30} {'sharded':>12} {'shards':>7} {'chunks':>13} {'fill':>6} {'bytes':>14} "
            f"{'dead':>12} {'layout':>11} {'writes':>7}"
        ]
        for r in reports:
            by_id = "neuroglancer" if r.sharded else "no"  # sharded by chunk id: no grid block per shard
            cps = "x".join(map(str, r.chunks_per_shard)) if r.chunks_per_shard else by_id
            lines.append(
                f"{r.path or '/':<30} {cps:>12} {r.shards:>7} {r.chunks:>6}/{r.grid_chunks:<6} "
                f"{r.fill_ratio:>6.1%} {r.stored_bytes:>14,} {r.dead_bytes:>12,} "
                f"{r.layout or '-':>11} {r.write_strategy:>7}"
                + (f"  ({len(r.damaged)} damaged, not counted)" if r.damaged else "")
            )
        return "\n".join(lines), damaged

    def check(self, prefix: str, *, decode: bool, progress: Progress | None) -> tuple[Findings, Findings]:
        return verify(self.store, prefix, decode=decode, progress=progress), leftovers(self.store, prefix)
