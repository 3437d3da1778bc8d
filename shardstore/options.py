"""The store's runtime options, checked once, and the read policy they resolve to.

Options are never recorded in metadata: two stores over the same data may
choose differently. :class:`ReadPolicy` is what the options mean for one
inner store (remote or not, able to check versions or not), worked out once
so that the read path only follows it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from shardstore.choices import IndexCacheMode, Layout, ReadStrategy, Renumbering, WholeShards, WriteStrategy
from shardstore.errors import ShardingConfigError
from shardstore.inner.base import DEFAULT_ATTEMPTS, Capabilities

__all__ = ["AUTO_WHOLE_SHARD_BYTES", "DEFAULT_FETCH_CONCURRENCY", "ReadPolicy", "StoreOptions"]


AUTO_WHOLE_SHARD_BYTES = {True: 2 * 2**20, False: 16 * 2**20}
"""``read_strategy="auto"`` fetches shards whole up to this uncompressed size
(``whole_shard_bytes=None``): on remote stores (True) on a first read, where one
request for a small shard costs less than the round trip for its index (a few
MiB move in one round trip); on others on a repeated read, one read instead of
many small ones. Larger shards are read by index and merged chunk ranges."""

DEFAULT_FETCH_CONCURRENCY = 64
"""Shards one read or write of many chunks works on at once (its requests in flight
together), and so the number of shards it holds in memory (no more than
``pipeline.HELD_MAX_BYTES`` of them). 64, not 32: a whole read of 1 MiB zstd shards
then decodes groups of 32, and each group's end, where one thread finishes its last
shard while the other waits, comes half as often (64 MiB: 92 against 105 ms, zarrs
74; 32 MiB more held at once)."""

_CHOICES: dict[str, tuple[str, ...]] = {
    "layout": ("transformer", "codec"),
    "write_strategy": ("rewrite", "append"),
    "read_strategy": ("auto", "chunk", "shard"),
    "index_cache": ("auto", "trust", "off", "revalidate"),
    "renumbering": ("migrate", "refuse"),
}


@dataclass(frozen=True)
class StoreOptions:
    """How one store instance reads and writes: the keyword arguments of
    :class:`~shardstore.ShardingStore` of the same names, checked once (their meaning
    is documented there, where users read it)."""

    layout: Layout = "transformer"
    write_strategy: WriteStrategy = "rewrite"
    read_strategy: ReadStrategy = "auto"
    index_cache: IndexCacheMode = "auto"
    index_cache_bytes: int = 64 * 2**20
    shard_cache_bytes: int = 256 * 2**20
    cache_max_age: float = 1.0
    write_attempts: int = DEFAULT_ATTEMPTS
    whole_shard_bytes: int | None = None
    fetch_concurrency: int = DEFAULT_FETCH_CONCURRENCY
    renumbering: Renumbering = "migrate"

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ShardingConfigError(f"{name}={value!r} is not supported; choose one of {list(allowed)}")
        for name in ("index_cache_bytes", "shard_cache_bytes", "cache_max_age"):
            amount = getattr(self, name)
            if not amount >= 0:
                raise ShardingConfigError(f"{name}={amount!r} must be a number >= 0")
        for name in ("write_attempts", "fetch_concurrency"):
            count = getattr(self, name)
            if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
                raise ShardingConfigError(f"{name}={count!r} must be an integer >= 1")
        budget = self.whole_shard_bytes
        if budget is not None and not (
            isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0
        ):
            raise ShardingConfigError(f"whole_shard_bytes={budget!r} must be None or an integer >= 0")

    def as_kwargs(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReadPolicy:
    """What the read path does on one inner store.

    ``whole``: when to fetch a shard whole rather than read ranges of it — on
    every read not served from the shard cache (``"always"``), on a read that
    finds its index uncached or when it is read again and again (``"first"``),
    only when it is read again and again (``"repeat"``) — all only for arrays
    whose uncompressed shard is at most ``whole_limit`` bytes (None: any) — or
    only when one batch wants half of it and its index is not cached
    (``"never"``; also the fallback of the others).
    ``validate``: check cached entries against the object's version where the
    store tells it cheaply; otherwise a cached shard is served for ``max_age``
    seconds (None: until evicted); with ``revalidate`` a cached shard past that
    age is kept and asked for again only if it changed (a conditional read)."""

    index_cache_bytes: int = 0
    shard_cache_bytes: int = 0
    validate: bool = True
    whole: WholeShards = "never"
    whole_limit: int | None = None
    max_age: float | None = None
    revalidate: bool = False

    @classmethod
    def resolve(cls, options: StoreOptions, can: Capabilities) -> ReadPolicy:
        mode = options.index_cache
        checked = mode in ("auto", "revalidate")
        # indices only where a read can check them for free, unless trusted
        caching = mode == "trust" or (checked and (can.versions or can.versioned_ranges))
        # In memory a range read could meet a newer shard than its index came from,
        # while a whole read is one consistent snapshot and costs no more.
        in_memory = can.in_memory
        whole: WholeShards = "never"
        if options.read_strategy == "shard" or in_memory:
            whole = "always"
        elif options.read_strategy == "auto" and mode != "off":
            # remote: small shards on first read, served for cache_max_age; local files:
            # on a repeated read, its version checked by every later read
            if can.remote:
                whole = "first"
            elif can.versions:
                whole = "repeat"
        return cls(
            index_cache_bytes=options.index_cache_bytes if caching else 0,
            shard_cache_bytes=0
            if whole == "never"
            or mode == "off"
            or (in_memory and options.read_strategy != "shard" and mode != "trust")
            else options.shard_cache_bytes,
            validate=checked,
            whole=whole,
            whole_limit=(
                (
                    AUTO_WHOLE_SHARD_BYTES[can.remote]
                    if options.whole_shard_bytes is None
                    else options.whole_shard_bytes
                )
                if options.read_strategy == "auto"
                else None
            ),
            max_age={"trust": None, "revalidate": 0.0}.get(
                mode, 0.0 if can.changes_unseen else options.cache_max_age
            ),
            revalidate=mode == "revalidate",
        )
