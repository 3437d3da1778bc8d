"""``info``, ``ls``, ``verify`` and leftovers of neuroglancer precomputed data: the
sharded scales of a precomputed volume (an ``info`` file listing ``scales``), the
shard directory of a mesh or skeleton source (an ``info`` file with a top-level
``sharding``), or a bare directory of ``.shard`` files with its sharding given.
``info`` and ``ls`` read shard and minishard indices only (through the wing's
store, as reads do); ``verify`` reads every shard file whole.
:class:`PrecomputedLocation` answers the command line's
:class:`~shardstore.maintenance.inspection.Inspection`."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import numpy as np

from shardstore.errors import ShardFormatError, ShardStoreError
from shardstore.formats.precomputed import (
    PrecomputedSharding,
    locate_ids,
    parse_shard,
    shard_number_of_name,
    shard_problems,
)
from shardstore.inner import InnerStore, adapt
from shardstore.keys import join_path
from shardstore.maintenance.common import VERIFY_BATCH, Progress, sizes_of
from shardstore.maintenance.leftovers import LEFTOVERS, owner
from shardstore.neuroglancer.store import PrecomputedShardedStore
from shardstore.neuroglancer.volume import scale_directory
from shardstore.sync_bridge import blocking
from shardstore.tasks import gather

__all__ = [
    "PrecomputedLocation",
    "PrecomputedReport",
    "ScaleDirectory",
    "find_precomputed",
    "find_precomputed_async",
    "precomputed_info",
    "precomputed_info_async",
    "precomputed_keys",
    "precomputed_keys_async",
    "precomputed_leftovers",
    "precomputed_leftovers_async",
    "verify_precomputed",
    "verify_precomputed_async",
]

_INFO: Final = "info"
_UNSHARDED_CHUNK = re.compile(r"\d+-\d+_\d+-\d+_\d+-\d+")
"""The name of a chunk file of an unsharded scale: ``x0-x1_y0-y1_z0-z1``."""
_PRECOMPUTED_BATCH = 64
"""Shards whose indices are read at once (``info``, ``ls``)."""


@dataclass(frozen=True, eq=False)
class ScaleDirectory:
    """One directory holding chunks in the precomputed format: a scale of a volume, or
    a directory of shard files."""

    path: str
    """The scale's key (its directory under the volume's root); "" for the directory given."""
    inner: InnerStore
    """Its directory."""
    store: PrecomputedShardedStore | None
    """Its shards; None for an unsharded scale (one file per chunk)."""
    grid_chunks: int | None = None
    """Chunks in the scale's chunk grid, where the volume's ``info`` says."""

    def key(self, name: str) -> str:
        """A file of this scale as reports name it: relative to the location given."""
        return join_path(self.path, name)


@dataclass(frozen=True, eq=False)
class PrecomputedLocation:
    """What a URL holds in the precomputed format."""

    url: str
    scales: list[ScaleDirectory]
    volume: bool
    """Whether the scales are those of a volume's ``info`` (else one shard directory)."""

    def under(self, prefix: str) -> list[ScaleDirectory]:
        """The scales whose keys lie under ``prefix`` or that hold it (``8_8_8/12``).
        Only a volume's scales are selected by prefix; ShardStoreError if none is."""
        if not prefix:
            return self.scales
        if not self.volume:
            raise ShardStoreError(
                f"prefix {prefix!r}: a prefix selects scales of a precomputed volume, and {self.url!r} "
                "is one directory of shards"
            )
        chosen = [
            s for s in self.scales if f"{s.path}/".startswith(prefix) or prefix.startswith(f"{s.path}/")
        ]
        if not chosen:
            raise ShardStoreError(
                f"no scale of the precomputed volume at {self.url!r} under prefix {prefix!r} "
                f"(its scales: {', '.join(repr(s.path) for s in self.scales)})"
            )
        return chosen

    # -- what the command line asks (maintenance.inspection.Inspection) ---------------

    not_counted = "its chunks are not counted"

    def keys(self, prefix: str) -> tuple[list[str], dict[str, str]]:
        return precomputed_keys(self, prefix)

    def info(self, prefix: str, *, as_json: bool, write_strategy: Any = None) -> tuple[str, dict[str, str]]:
        """Per scale (or the one directory of shards): its sharding, shard files, chunk
        ids present and bytes. (``write_strategy``: only zarr arrays have one.)"""
        reports = precomputed_info(self, prefix)
        damaged = {key: problem for r in reports for key, problem in r.damaged.items()}
        if as_json:
            return json.dumps([r.to_dict() for r in reports], indent=2), damaged
        lines = []
        for r in reports:
            what = f"scale {r.path}" if self.volume else f"shards at {self.url}"
            lines.append(f"{what}: {_sharding_text(r.sharding) if r.sharding else 'unsharded'}")
            chunks = f"{r.chunks:,}" + (f"/{r.grid_chunks:,}" if r.grid_chunks else "")
            fill = "" if r.fill_ratio is None else f" ({r.fill_ratio:.1%})"
            files = f"{r.shards:,} shard files, {chunks} chunks" if r.sharded else f"{chunks} chunk files"
            lines.append(
                f"  {files}{fill}, {r.stored_bytes:,} bytes"
                + (f"  ({len(r.damaged)} damaged, not counted)" if r.damaged else "")
            )
        return "\n".join(lines), damaged

    def check(
        self, prefix: str, *, decode: bool = True, progress: Progress | None = None
    ) -> tuple[dict[str, str], dict[str, str]]:
        """Every shard file read whole and checked; gzip chunk data is always decoded."""
        return verify_precomputed(self, prefix, progress=progress), precomputed_leftovers(self, prefix)


def _sharding_text(sharding: dict[str, Any]) -> str:
    return ", ".join(f"{name} {value}" if name != "@type" else str(value) for name, value in sharding.items())


def _join_url(url: str, key: str) -> str:
    return f"{url.rstrip('/')}/{key.strip('/')}"


def _grid_chunks(scale: Mapping[str, Any]) -> int | None:
    size, chunk_sizes = scale.get("size"), scale.get("chunk_sizes")
    if (
        isinstance(size, list)
        and isinstance(chunk_sizes, list)
        and len(chunk_sizes) == 1
        and isinstance(chunk_sizes[0], list)
        and len(size) == len(chunk_sizes[0])
        and all(isinstance(n, int) and n >= 0 for n in size)
        and all(isinstance(n, int) and n > 0 for n in chunk_sizes[0])
    ):
        return math.prod(-(-int(n) // int(c)) for n, c in zip(size, chunk_sizes[0], strict=True))
    return None


def _sharded(inner: InnerStore, sharding: Mapping[str, Any], where: str) -> PrecomputedShardedStore:
    return PrecomputedShardedStore(inner, PrecomputedSharding.from_json(sharding, where), read_only=True)


async def _read_info(inner: InnerStore) -> dict[str, Any] | None:
    """The JSON object in the ``info`` file at the root, or None (none, or not JSON)."""
    raw = await inner.get(_INFO)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:  # (UnicodeDecodeError too) someone else's file of that name
        return None
    return doc if isinstance(doc, dict) else None


async def find_precomputed_async(
    url: str, storage_options: dict[str, Any] | None = None, sharding: Mapping[str, Any] | None = None
) -> PrecomputedLocation | None:
    """The precomputed data at ``url``: with ``sharding`` (the format's JSON object), the
    directory of shard files there; else what an ``info`` file at the root describes
    (the scales of a volume, or the shard directory of a mesh or skeleton source).
    None where there is no such ``info`` file; ShardStoreError for one that names an
    invalid sharding, and for a ``sharding`` given where no shard file of it lies."""
    root = adapt(url, storage_options)
    if sharding is not None:
        store = _sharded(root, sharding, "--sharding")
        found = PrecomputedLocation(url, [ScaleDirectory("", root, store)], volume=False)
        if not await store.shard_keys():
            strays = await _stray_shard_files(found.scales[0])
            raise ShardStoreError(
                f"no shard file of the sharding given at {url!r}"
                + (
                    f" (names this sharding never gives: {', '.join(map(repr, sorted(strays)[:4]))}: "
                    "is --sharding right?)"
                    if strays
                    else ""
                )
            )
        return found
    doc = await _read_info(root)
    if doc is None:
        return None
    where = f"{_join_url(url, _INFO)}"
    scales = doc.get("scales")
    if isinstance(scales, list):
        return PrecomputedLocation(
            url, [_scale(url, storage_options, s, i, where) for i, s in enumerate(scales)], True
        )
    if isinstance(doc.get("sharding"), dict):  # a sharded mesh or skeleton source
        return PrecomputedLocation(
            url, [ScaleDirectory("", root, _sharded(root, doc["sharding"], f"{where}: sharding"))], False
        )
    return None


def _scale(
    url: str, storage_options: dict[str, Any] | None, scale: Any, i: int, where: str
) -> ScaleDirectory:
    key, sharding = scale_directory(scale, i, where)
    inner = adapt(_join_url(url, key), storage_options)
    store = None if sharding is None else PrecomputedShardedStore(inner, sharding, read_only=True)
    return ScaleDirectory(key, inner, store, _grid_chunks(scale))


find_precomputed = blocking(find_precomputed_async)


async def _stray_shard_files(scale: ScaleDirectory) -> list[str]:
    """``.shard`` files of a scale's directory that its sharding never names (another
    padding, case or shard number): no reader looks at them."""
    if scale.store is None:
        return []
    sharding = scale.store.sharding
    return [
        name
        async for name in scale.inner.list_dir("")
        if name.endswith(".shard") and shard_number_of_name(sharding, name) is None
    ]


# -- precomputed: what the indices say -------------------------------------------------


@dataclass(frozen=True)
class _PrecomputedShard:
    key: str
    nbytes: int
    ids: list[int]
    damage: str | None = None


async def _surveyed_shard(scale: ScaleDirectory, name: str) -> _PrecomputedShard | None:
    """A shard's size and chunk ids from its indices (None: the file is gone). Where the
    indices do not hold together, the whole file is read once more and checked, so that
    a file replaced between reads is never reported as damaged."""
    assert scale.store is not None
    key = scale.key(name)
    size = await scale.inner.getsize(name)
    if size is None:
        return None
    try:
        return _PrecomputedShard(key, size, await _ids_from_indices(scale, name, size))
    except ShardFormatError:
        pass
    blob = await scale.inner.get(name)
    if blob is None:
        return None
    try:
        return _PrecomputedShard(key, len(blob), sorted(parse_shard(scale.store.sharding, blob, key)))
    except ShardFormatError as exc:
        return _PrecomputedShard(key, len(blob), [], str(exc))


async def _ids_from_indices(scale: ScaleDirectory, name: str, size: int) -> list[int]:
    """The chunk ids a shard file's minishard indices list (read by the store, as reads
    do), each checked to lie inside the ``size``-byte file and to hash to this shard
    and minishard."""
    assert scale.store is not None
    sharding, key = scale.store.sharding, scale.key(name)
    shard = shard_number_of_name(sharding, name)
    ids: list[int] = []
    for m, table in (await scale.store.minishards(name)).items():
        if not table:
            continue
        listed = np.array(list(table), dtype=np.uint64)
        if any(offset + nbytes > size for offset, nbytes in table.values()):
            raise ShardFormatError(f"shard {key!r}: truncated: chunks past the end of the {size}-byte object")
        shards, minishards = locate_ids(sharding, listed)
        if (minishards != np.uint64(m)).any() or (shard is not None and (shards != np.uint64(shard)).any()):
            raise ShardFormatError(f"shard {key!r}: minishard {m} lists chunks of another minishard or shard")
        ids.extend(table)
    return sorted(ids)


async def _survey_scale(scale: ScaleDirectory) -> list[_PrecomputedShard]:
    if scale.store is None:
        return []
    names = await scale.store.shard_keys()
    found: list[_PrecomputedShard | None] = []
    for start in range(0, len(names), _PRECOMPUTED_BATCH):
        batch = names[start : start + _PRECOMPUTED_BATCH]
        found.extend(await gather(*(_surveyed_shard(scale, n) for n in batch)))
    return [s for s in found if s is not None]


async def _unsharded_chunks(scale: ScaleDirectory) -> dict[str, int]:
    """The chunk files of an unsharded scale: name -> size."""
    names = sorted([n async for n in scale.inner.list_dir("") if _UNSHARDED_CHUNK.fullmatch(n)])
    sizes: list[int | None] = []
    for start in range(0, len(names), _PRECOMPUTED_BATCH):
        batch = names[start : start + _PRECOMPUTED_BATCH]
        sizes.extend(await gather(*(scale.inner.getsize(n) for n in batch)))
    return {n: s for n, s in zip(names, sizes, strict=True) if s is not None}


@dataclass(frozen=True)
class PrecomputedReport:
    """One scale (or directory of shards) as ``info`` reports it."""

    path: str
    """The scale's key; "" for a directory of shards given by itself."""
    sharding: dict[str, Any] | None
    """Its sharding JSON object (every field, as tensorstore writes it); None: unsharded."""
    shards: int
    """Shard files."""
    chunks: int
    """Chunk ids present (in intact shards), or chunk files of an unsharded scale."""
    stored_bytes: int
    """Bytes of its shard files (or chunk files)."""
    grid_chunks: int | None
    """Chunks in its chunk grid, where the volume's ``info`` says."""
    damaged: dict[str, str] = field(default_factory=dict)
    """Shard files whose indices cannot be trusted (key -> why): counted in ``shards``
    and ``stored_bytes`` only."""

    @property
    def sharded(self) -> bool:
        return self.sharding is not None

    @property
    def fill_ratio(self) -> float | None:
        return None if not self.grid_chunks else self.chunks / self.grid_chunks

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": "neuroglancer_precomputed",
            "sharded": self.sharded,
            **asdict(self),
            "fill_ratio": self.fill_ratio,
        }


async def precomputed_info_async(location: PrecomputedLocation, prefix: str = "") -> list[PrecomputedReport]:
    """Per scale under ``prefix`` (a volume's; a directory of shards has one): its
    sharding, shard files, chunk ids present and bytes stored. Reads indices only."""
    reports = []
    for scale in location.under(prefix):
        if scale.store is None:
            files = await _unsharded_chunks(scale)
            reports.append(
                PrecomputedReport(scale.path, None, 0, len(files), sum(files.values()), scale.grid_chunks)
            )
            continue
        shards = await _survey_scale(scale)
        reports.append(
            PrecomputedReport(
                path=scale.path,
                sharding=scale.store.sharding.to_json(),
                shards=len(shards),
                chunks=sum(len(s.ids) for s in shards),
                stored_bytes=sum(s.nbytes for s in shards),
                grid_chunks=scale.grid_chunks,
                damaged={s.key: s.damage for s in shards if s.damage is not None},
            )
        )
    return reports


precomputed_info = blocking(precomputed_info_async)


async def precomputed_keys_async(
    location: PrecomputedLocation, prefix: str = ""
) -> tuple[list[str], dict[str, str]]:
    """The chunks present under ``prefix``: per scale in the ``info`` file's order, its
    chunk ids ascending (``<scale key>/<id>``; a directory of shards: ``<id>``), or the
    chunk files of an unsharded scale by name; and the shard files whose chunks could
    not be listed (key -> why)."""
    keys: list[str] = []
    damaged: dict[str, str] = {}
    for scale in location.under(prefix):
        if scale.store is None:
            keys.extend(scale.key(name) for name in await _unsharded_chunks(scale))
            continue
        ids: list[int] = []
        for shard in await _survey_scale(scale):
            ids.extend(shard.ids)
            if shard.damage is not None:
                damaged[shard.key] = shard.damage
        keys.extend(scale.key(str(i)) for i in sorted(ids))
    return [k for k in keys if k.startswith(prefix)], damaged


precomputed_keys = blocking(precomputed_keys_async)


async def verify_precomputed_async(
    location: PrecomputedLocation, prefix: str = "", *, progress: Progress | None = None
) -> dict[str, str]:
    """Read every shard file of the sharded scales under ``prefix`` whole and check it
    against every rule of the format (gzip chunk data decoded too): shard file key ->
    every problem found (empty: all intact). Unsharded scales have no shards to check."""
    todo = [
        (scale, name)
        for scale in location.under(prefix)
        if scale.store is not None
        for name in await scale.store.shard_keys()
    ]
    damaged: dict[str, str] = {}
    total, done = 0, 0
    if progress is not None:
        for scale in {id(scale): scale for scale, _ in todo}.values():
            total += await sizes_of(scale.inner, [name for s, name in todo if s is scale])
    for start in range(0, len(todo), VERIFY_BATCH):
        batch = todo[start : start + VERIFY_BATCH]
        blobs = await gather(*(scale.inner.get(name) for scale, name in batch))
        for (scale, name), blob in zip(batch, blobs, strict=True):
            assert scale.store is not None
            key = scale.key(name)
            if blob is None:
                continue  # deleted since it was listed
            done += len(blob)
            problems = shard_problems(scale.store.sharding, blob, key)
            if problems:
                damaged[key] = "shard: " + "; ".join(problems)
        if progress is not None:
            total = max(total, done)
            progress("shards", done, total)
    return damaged


verify_precomputed = blocking(verify_precomputed_async)


async def precomputed_leftovers_async(location: PrecomputedLocation, prefix: str = "") -> dict[str, str]:
    """Files beside the shards that no reader looks at, key -> what: writers' hidden
    files (as :func:`leftovers`) and ``.shard`` files the sharding never names."""
    found: dict[str, str] = {}
    for scale in location.under(prefix):
        for hidden in await scale.inner.temporary_files(""):
            obj, kind = owner(hidden)
            found[scale.key(hidden)] = LEFTOVERS[kind].format(obj=scale.key(obj))
        for name in await _stray_shard_files(scale):
            found[scale.key(name)] = (
                "a .shard file whose name this sharding never gives (another padding, case or "
                "shard number): no reader looks at it"
            )
    return found


precomputed_leftovers = blocking(precomputed_leftovers_async)
