"""Looking after shards: what they hold, how much of them is dead, whether they are
intact, and compaction.

Appending (``write_strategy="append"``) leaves replaced chunk bytes and old
indices in a shard as dead bytes; :func:`compact` rewrites the shards that
carry any as compact objects.

Every tool here goes on past a damaged shard and says which it was: figures are
taken only from indices that are consistent (with themselves and with the
object's size), so none is ever garbage. :func:`verify` states every problem of
every shard, where reads stop at the first.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import zarr.api.asynchronous
from zarr.abc.store import RangeByteRequest
from zarr.core.buffer import default_buffer_prototype

from shardstore import sync_bridge
from shardstore.errors import (
    InnerStoreError,
    ReadOnlyError,
    ShardFormatError,
    ShardingConfigError,
    ShardStoreError,
)
from shardstore.formats.base import ChunkTable
from shardstore.formats.indexed import MISSING, IndexedFormat, ShardIndex
from shardstore.formats.precomputed import (
    PrecomputedSharding,
    decode_minishard_index,
    decode_shard_index,
    locate_ids,
    minishard_index_range,
    parse_shard,
    shard_number_of_name,
    shard_problems,
)
from shardstore.inner import InnerStore, adapt
from shardstore.keys import join_path
from shardstore.metadata import ARRAY_DOC_NAMES, ArrayInfo, Document, Layout, load_document
from shardstore.precomputed_store import PrecomputedShardedStore
from shardstore.tasks import gather
from shardstore.writing.writer import WriteStrategy

if TYPE_CHECKING:
    from shardstore.addressing import ShardAddress
    from shardstore.store import ShardingStore

__all__ = [
    "ArrayReport",
    "PrecomputedLocation",
    "PrecomputedReport",
    "PrecomputedScale",
    "ShardReport",
    "compact",
    "compact_async",
    "find_precomputed",
    "find_precomputed_async",
    "info",
    "info_async",
    "leftovers",
    "leftovers_async",
    "list_keys",
    "list_keys_async",
    "precomputed_info",
    "precomputed_info_async",
    "precomputed_keys",
    "precomputed_keys_async",
    "precomputed_leftovers",
    "precomputed_leftovers_async",
    "shard_reports",
    "shard_reports_async",
    "verify",
    "verify_async",
    "verify_precomputed",
    "verify_precomputed_async",
]

Progress = Callable[[str, int, int], None]
"""Called with the stage of the work ("shards" checked or compacted, "chunks" decoded),
the bytes of it done so far, and its total bytes (cumulative: ``done`` only grows
within a stage; a total may grow too, if objects grow while they are read).
:class:`shardstore.progress.StageProgress` draws such calls as progress bars."""

_SIZE_BATCH = 256
"""Object sizes asked for at once (for a progress total)."""


async def _sizes(inner: InnerStore, keys: list[str]) -> int:
    """The total size of the objects ``keys`` (gone ones count 0)."""
    total = 0
    for start in range(0, len(keys), _SIZE_BATCH):
        found = await gather(*(inner.getsize(k) for k in keys[start : start + _SIZE_BATCH]))
        total += sum(n for n in found if n is not None)
    return total


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


def live_bytes(index: ShardIndex) -> int:
    """Bytes covered by the index's chunk ranges, overlaps counted once."""
    present = index[index[:, 0] != MISSING]
    if len(present) == 0:
        return 0
    order = np.argsort(present[:, 0])
    starts = present[order, 0].astype(np.int64)
    ends = starts + present[order, 1].astype(np.int64)
    reach = np.maximum.accumulate(ends)
    # a range starts a new run where it begins past everything before it
    new_run = np.concatenate([[True], starts[1:] > reach[:-1]])
    run_ends = np.maximum.reduceat(ends, np.flatnonzero(new_run))
    return int((run_ends - starts[new_run]).sum())


# -- reading indices past damage -------------------------------------------------------

_Read = ChunkTable | ShardFormatError | None
"""A shard's index, why it cannot be trusted, or None: the shard is gone."""


async def _read_indices(store: ShardingStore, shards: list[ShardAddress]) -> list[_Read]:
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
class _Surveyed:
    shard: ShardAddress
    report: ShardReport
    index: ChunkTable | None
    """None where damaged."""


async def _survey(store: ShardingStore, shards: list[ShardAddress]) -> list[_Surveyed]:
    # Sizes after indices: a concurrent append then only adds dead bytes, never a
    # range past the size read.
    indices = await _read_indices(store, shards)
    sizes = await gather(*(store.internals.raw.getsize(s.key) for s in shards))
    return [
        _surveyed(s, index, size)
        for s, index, size in zip(shards, indices, sizes, strict=True)
        if index is not None and size is not None
    ]


def _surveyed(shard: ShardAddress, index: ChunkTable | ShardFormatError, nbytes: int) -> _Surveyed:
    """The shard's report, its figures from a consistent index only (an index past the
    end of the object would make dead bytes negative or absurd)."""
    problem = _inconsistency(shard, index, nbytes)
    if problem is not None or isinstance(index, ShardFormatError):
        return _Surveyed(shard, ShardReport(shard.key, shard.info.path, nbytes, 0, 0, 0, problem), None)
    if isinstance(index, dict):  # a format rebuilt whole on every write: nothing dead
        live, chunks, dead = sum(n for _, n in index.values()), len(index), 0
    else:
        assert shard.indexed is not None
        live = live_bytes(index)
        chunks = int((index[:, 0] != MISSING).sum())
        dead = nbytes - shard.indexed.index_nbytes - live
    return _Surveyed(shard, ShardReport(shard.key, shard.info.path, nbytes, chunks, live, dead), index)


def _inconsistency(shard: ShardAddress, index: ChunkTable | ShardFormatError, nbytes: int) -> str | None:
    if isinstance(index, ShardFormatError):
        return str(index)
    if shard.indexed is None or isinstance(index, dict):
        return None  # checked whole when its table was parsed
    try:
        shard.indexed.check_ranges(index, nbytes, shard.key)
    except ShardFormatError as exc:
        return str(exc)
    return None


async def list_keys_async(store: ShardingStore, prefix: str = "") -> tuple[list[str], dict[str, str]]:
    """The logical keys under ``prefix`` as zarr sees them (sorted), and the shards
    whose chunks could not be listed (key -> why): a listing that goes on past them."""
    shards, plain = await store.internals.shards_under(prefix)
    keys, damaged = list(plain), {}
    for shard, index in zip(shards, await _read_indices(store, shards), strict=True):
        if isinstance(index, ShardFormatError):
            damaged[shard.key] = str(index)
        elif index is not None:
            keys.extend(k for _, k in shard.present_keys(index) if k.startswith(prefix))
    return sorted(keys), damaged


async def shard_reports_async(store: ShardingStore, prefix: str = "") -> list[ShardReport]:
    """One report per shard object under ``prefix`` (damaged ones with ``damage`` set)."""
    shards, _ = await store.internals.shards_under(prefix)
    return [s.report for s in await _survey(store, shards)]


async def compact_async(
    store: ShardingStore, prefix: str = "", *, min_dead_bytes: int = 1, progress: Progress | None = None
) -> list[ShardReport]:
    """Rewrite every intact shard under ``prefix`` with at least ``min_dead_bytes`` dead bytes.

    Returns the reports of the shards rewritten, as they were before, and of the
    damaged shards, left as they are (``damage`` set): rewriting one would keep
    only what its broken index points at. ``progress`` is told of the bytes of the
    shards rewritten (stage "shards"), as each is done.
    """
    if store.read_only:  # before surveying: as any write would
        raise ReadOnlyError(f"store was opened in read-only mode and does not support writing: {store!r}")
    shards, _ = await store.internals.shards_under(prefix)
    surveyed = await _survey(store, shards)
    doomed = [s for s in surveyed if s.index is not None and s.report.dead_bytes >= min_dead_bytes]
    total, done = sum(s.report.nbytes for s in doomed), 0

    async def rewrite(surveyed: _Surveyed) -> None:
        nonlocal done
        await store.internals.compact_shard(surveyed.shard)
        done += surveyed.report.nbytes
        if progress is not None:
            progress("shards", done, total)

    await gather(*(rewrite(s) for s in doomed))
    return [s.report for s in doomed] + [s.report for s in surveyed if s.index is None]


def list_keys(store: ShardingStore, prefix: str = "") -> tuple[list[str], dict[str, str]]:
    return sync_bridge.run(list_keys_async(store, prefix))


def shard_reports(store: ShardingStore, prefix: str = "") -> list[ShardReport]:
    return sync_bridge.run(shard_reports_async(store, prefix))


def compact(
    store: ShardingStore, prefix: str = "", *, min_dead_bytes: int = 1, progress: Progress | None = None
) -> list[ShardReport]:
    return sync_bridge.run(compact_async(store, prefix, min_dead_bytes=min_dead_bytes, progress=progress))


# -- info ------------------------------------------------------------------------------


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
    ``stored_bytes`` only."""
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
    surveyed = await _survey(store, shards)
    arrays = sorted({k.rpartition("/")[0] for k in plain if k.rpartition("/")[2] in ARRAY_DOC_NAMES})
    reports = []
    for path in arrays:
        info = await store.internals.array_at(path)
        if info is not None:
            mine = [s for s in surveyed if s.shard.info.path == path]
            reports.append(
                await _array_report(
                    store, info, mine, [k for k in plain if info.coords(k) is not None], appends
                )
            )
    return reports


async def _array_report(
    store: ShardingStore, info: ArrayInfo, shards: list[_Surveyed], chunk_keys: list[str], appends: bool
) -> ArrayReport:
    """``chunk_keys``: the array's chunk objects, if it is unsharded; ``appends``:
    whether the store would append to shards that can take it."""
    fmt = info.shard_format
    objects = await gather(*(store.getsize(k) for k in chunk_keys))
    return ArrayReport(
        path=info.path,
        sharded=fmt is not None,
        chunks_per_shard=list(fmt.chunks_per_shard) if isinstance(fmt, IndexedFormat) else None,
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


def info(
    store: ShardingStore, prefix: str = "", *, write_strategy: WriteStrategy | None = None
) -> list[ArrayReport]:
    return sync_bridge.run(info_async(store, prefix, write_strategy=write_strategy))


# -- verify: the structural rules --------------------------------------------------------

_SIZE_PRESERVING = {"bytes": 0, "transpose": 0, "crc32c": 4}
"""v3 codecs whose output size follows from their input's: the bytes each adds."""


def _encoded_chunk_nbytes(doc: Document, info: ArrayInfo) -> int | None:
    """The size of every encoded chunk where the array's codecs fix one (nothing
    compresses), from the metadata document zarr reads; None where sizes vary."""
    if info.itemsize is None or (info.edges is not None and any(len(set(dim)) > 1 for dim in info.edges)):
        return None
    if doc.get("zarr_format") == 2:
        added = None if doc.get("compressor") or doc.get("filters") else 0
    else:
        added = _added_bytes(doc.get("codecs") or [])
    return None if added is None else math.prod(info.chunks) * info.itemsize + added


def _added_bytes(codecs: list[Any]) -> int | None:
    """What v3 codecs add to a chunk's raw bytes, where that is fixed."""
    names = [c.get("name") if isinstance(c, dict) else c for c in codecs]
    added = [_SIZE_PRESERVING.get(n) if isinstance(n, str) else None for n in names]
    return sum(a for a in added if a is not None) if names and None not in added else None


async def _chunk_nbytes(store: ShardingStore, info: ArrayInfo) -> int | None:
    for name in ARRAY_DOC_NAMES:  # zarr.json first, as zarr reads them
        raw = await store.get(join_path(info.path, name), default_buffer_prototype())
        doc = None if raw is None else load_document(raw.to_bytes())
        if doc is not None:
            return _encoded_chunk_nbytes(doc, info)
    return None


# -- verify: leftovers -----------------------------------------------------------------

_LEFTOVERS = {
    "appending": "append journal of {obj!r}: an append to it is running, or crashed; shardstore "
    "serves the shard as committed and the next write to it repairs it",
    "lock": "lock file of {obj!r}: a writer of it is running, or died holding it; the next writer "
    "takes it over and removes it",
    "partial": "temporary file of a write to {obj!r} that is running, or died before its rename: "
    "never read; delete it when no writer runs",
}

_STALE_SHARD = (
    "shard file outside the directory its array's metadata names: left by a resize that "
    "renumbered the array's chunks and was interrupted (or ran beside another one); never "
    "read; delete it when no resize of the array runs"
)


def _owner(hidden: str) -> tuple[str, str]:
    """(object key, kind) of one of the hidden files beside objects: ``.<name>.appending``,
    ``.<name>.lock``, ``.<name>.<32 hex>.partial``."""
    folder, _, name = hidden.rpartition("/")
    stem, _, kind = name.rpartition(".")
    if kind == "partial":
        stem = stem.rpartition(".")[0]
    return join_path(folder, stem[1:]), kind


async def leftovers_async(store: ShardingStore, prefix: str = "") -> dict[str, str]:
    """Hidden files writers keep beside objects under ``prefix`` (local directories),
    key -> what it is. Running writers have them too; what a crash leaves stays until
    the object's next write (a partial write until deleted). Never damage by itself."""
    found = await store.internals.raw.temporary_files(prefix)
    hidden = {key: _LEFTOVERS[kind].format(obj=obj) for key in found for obj, kind in [_owner(key)]}
    stale = await store.internals.stale_shard_files(prefix)
    return hidden | {key: _STALE_SHARD for key in stale}


def leftovers(store: ShardingStore, prefix: str = "") -> dict[str, str]:
    return sync_bridge.run(leftovers_async(store, prefix))


# -- verify ----------------------------------------------------------------------------

_VERIFY_BATCH = 16
"""Whole shards read at once while verifying: requests in flight, memory bounded."""
_DECODE_BATCH = 64
"""Chunks of an unsharded array decoded at once."""
_Chunks = tuple[ArrayInfo, str | None, list[str], int]
"""Chunk keys of one array decoded together: one shard's (and its key), or a batch of
chunk objects (None); and their bytes (the shard's; chunk objects' only where
progress is reported, else 0)."""


async def verify_async(
    store: ShardingStore, prefix: str = "", *, decode: bool = False, progress: Progress | None = None
) -> dict[str, str]:
    """Check every shard under ``prefix`` against every structural rule and, with
    ``decode``, decode every chunk through zarr. Returns damaged key -> every problem
    found in it (empty: all is well); a damaged shard never stops the run. A torn tail
    left by a crashed append is damage (to any reader but shardstore); other
    leftovers are :func:`leftovers`."""
    shards, plain = await store.internals.shards_under(prefix)
    damaged, readable = await _check_shards(store, shards, prefix, progress)
    if decode:
        plain_chunks = await _plain_chunks(store, plain, sized=progress is not None)
        failed = await _undecodable(store, readable + plain_chunks, progress)
        for key, problem in failed.items():  # a chunk key may also be the key of a shard
            damaged[key] = f"{damaged[key]}; {problem}" if key in damaged else problem
    return damaged


async def _check_shards(
    store: ShardingStore, shards: list[ShardAddress], prefix: str, progress: Progress | None
) -> tuple[dict[str, str], list[_Chunks]]:
    """Damaged shards (key -> problems), and the chunks that reads can locate."""
    hidden = map(_owner, await store.internals.raw.temporary_files(prefix))
    journaled = {obj for obj, kind in hidden if kind == "appending"}
    arrays = {s.info.path: s.info for s in shards}
    sizes = {path: await _chunk_nbytes(store, info) for path, info in arrays.items()}
    damaged: dict[str, str] = {}
    readable: list[_Chunks] = []
    total = 0 if progress is None else await _sizes(store.internals.raw, [s.key for s in shards])
    done = 0
    for start in range(0, len(shards), _VERIFY_BATCH):
        batch = shards[start : start + _VERIFY_BATCH]
        checked = await gather(
            *(_check_shard(store, s, sizes[s.info.path], s.key in journaled) for s in batch)
        )
        for shard, (problems, keys, nbytes) in zip(batch, checked, strict=True):
            if problems:
                damaged[shard.key] = "shard: " + "; ".join(problems)
            readable.append((shard.info, shard.key, keys, nbytes))
            done += nbytes
        if progress is not None:
            total = max(total, done)  # shards may grow while read
            progress("shards", done, total)
    return damaged, readable


async def _check_shard(
    store: ShardingStore, shard: ShardAddress, chunk_nbytes: int | None, journaled: bool
) -> tuple[list[str], list[str], int]:
    """One shard's problems, the keys of the chunks that reads can locate in it, and
    the bytes read."""
    # The size first: an append between the two only makes the shard read longer.
    size = await store.internals.raw.getsize(shard.key) if journaled else None
    blob = await store.internals.raw.get(shard.key)  # as committed
    if blob is None:
        return [], [], 0
    problems = shard.shard_format.problems(blob, shard.key, chunk_nbytes)
    if size is not None and size > len(blob):
        problems.append(
            f"torn tail: a crashed append left {size - len(blob)} bytes after the committed "
            f"{len(blob)}-byte shard (its journal says so); shardstore serves the shard as committed "
            "and its next write (or compact) repairs it, other readers see a damaged shard until then"
        )
    try:
        index = shard.shard_format.parse(blob, shard.key)
    except ShardFormatError as exc:  # reads refuse it: damage, whether or not a rule above names it
        return problems or [str(exc)], [], len(blob)
    return problems, [key for _, key in shard.present_keys(index)], len(blob)


async def _plain_chunks(store: ShardingStore, keys: list[str], *, sized: bool = False) -> list[_Chunks]:
    """The chunk objects of unsharded arrays among ``keys``, grouped by array; with
    ``sized``, each group's bytes are counted (else 0)."""
    by_array: dict[str, tuple[ArrayInfo, list[str]]] = {}
    for key in keys:
        info = await store.internals.array_of_key(key)
        coords = None if info is None else info.coords(key)
        if info is not None and coords is not None and info.in_grid(coords):
            by_array.setdefault(info.path, (info, []))[1].append(key)
    groups = [
        (info, found[i : i + _DECODE_BATCH])
        for info, found in by_array.values()
        for i in range(0, len(found), _DECODE_BATCH)
    ]
    return [
        (info, None, batch, await _sizes(store.internals.raw, batch) if sized else 0)
        for info, batch in groups
    ]


async def _undecodable(
    store: ShardingStore, groups: list[_Chunks], progress: Progress | None
) -> dict[str, str]:
    """What zarr cannot decode, every one: chunk key (or array, if zarr cannot open it) -> why."""
    arrays: dict[str, Any] = {}
    failed: dict[str, str] = {}
    done, total = 0, sum(nbytes for *_, nbytes in groups)
    for info, shard, keys, nbytes in groups:
        if info.path not in arrays:
            arrays[info.path] = await _open_array(store, info.path)
        arr = arrays[info.path]
        if isinstance(arr, str):
            failed[info.path or "/"] = arr
        else:
            where = "" if shard is None else f" (stored in shard {shard!r})"
            found = await gather(*(_decode_chunk(arr, info, key, where) for key in keys))
            failed.update(f for f in found if f is not None)
        done += nbytes
        if progress is not None:
            progress("chunks", done, total)
    return failed


async def _open_array(store: ShardingStore, path: str) -> Any:
    """The array as zarr opens it, or why zarr cannot."""
    try:
        return await zarr.api.asynchronous.open_array(store=store, path=path, mode="r")
    except InnerStoreError:
        raise  # the storage failing is no finding about the data
    except Exception as exc:  # whatever zarr raises is a finding, not a crash
        if type(exc).__name__ == "RectilinearChunksDisabledError":  # zarr's setting, not the data
            raise ShardingConfigError(f"array {path or '/'!r}: {exc}") from exc
        return f"zarr cannot open the array: {type(exc).__name__}: {exc}"


async def _decode_chunk(arr: Any, info: ArrayInfo, key: str, where: str) -> tuple[str, str] | None:
    coords = info.coords(key)
    assert coords is not None
    region = info.chunk_region(coords)
    try:
        await arr.getitem(region)
    except InnerStoreError:
        raise
    except Exception as exc:  # any codec's error is a finding about this chunk
        return key, f"chunk{where} does not decode: {type(exc).__name__}: {exc}"
    return None


def verify(
    store: ShardingStore, prefix: str = "", *, decode: bool = False, progress: Progress | None = None
) -> dict[str, str]:
    return sync_bridge.run(verify_async(store, prefix, decode=decode, progress=progress))


# -- neuroglancer precomputed ------------------------------------------------------------
#
# ``info``, ``ls`` and ``verify`` of the neuroglancer precomputed sharded format
# (``neuroglancer_uint64_sharded_v1``): the sharded scales of a precomputed volume (an
# ``info`` file listing ``scales``), the shard directory of a mesh or skeleton source
# (an ``info`` file with a top-level ``sharding``), or a bare directory of ``.shard``
# files with its sharding given. ``info`` and ``ls`` read shard and minishard indices
# only; ``verify`` reads every shard file whole.

_INFO: Final = "info"
_UNSHARDED_CHUNK = re.compile(r"\d+-\d+_\d+-\d+_\d+-\d+")
"""The name of a chunk file of an unsharded scale: ``x0-x1_y0-y1_z0-z1``."""
_PRECOMPUTED_BATCH = 64
"""Shards whose indices are read at once (``info``, ``ls``)."""


@dataclass(frozen=True, eq=False)
class PrecomputedScale:
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
    scales: list[PrecomputedScale]
    volume: bool
    """Whether the scales are those of a volume's ``info`` (else one shard directory)."""

    def under(self, prefix: str) -> list[PrecomputedScale]:
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
        found = PrecomputedLocation(url, [PrecomputedScale("", root, store)], volume=False)
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
            url, [PrecomputedScale("", root, _sharded(root, doc["sharding"], f"{where}: sharding"))], False
        )
    return None


def _scale(
    url: str, storage_options: dict[str, Any] | None, scale: Any, i: int, where: str
) -> PrecomputedScale:
    key = scale.get("key") if isinstance(scale, dict) else None
    if not isinstance(key, str) or not key.strip("/"):
        raise ShardStoreError(f"{where}: scale {i} has no 'key' naming its directory: {scale!r}")
    inner = adapt(_join_url(url, key), storage_options)
    sharding = scale.get("sharding")
    if sharding is not None and not isinstance(sharding, dict):
        raise ShardingConfigError(f"{where}: scale {key!r}: 'sharding' is {sharding!r}, not a JSON object")
    store = None if sharding is None else _sharded(inner, sharding, f"{where}: scale {key!r}: sharding")
    return PrecomputedScale(key.strip("/"), inner, store, _grid_chunks(scale))


def find_precomputed(
    url: str, storage_options: dict[str, Any] | None = None, sharding: Mapping[str, Any] | None = None
) -> PrecomputedLocation | None:
    return sync_bridge.run(find_precomputed_async(url, storage_options, sharding))


async def _stray_shard_files(scale: PrecomputedScale) -> list[str]:
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


async def _surveyed_shard(scale: PrecomputedScale, name: str) -> _PrecomputedShard | None:
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


async def _ids_from_indices(scale: PrecomputedScale, name: str, size: int) -> list[int]:
    """The chunk ids a shard file's minishard indices list, each checked to lie inside
    the ``size``-byte file and to hash to this shard and minishard."""
    assert scale.store is not None
    sharding, key = scale.store.sharding, scale.key(name)
    head = await scale.inner.get(name, RangeByteRequest(0, sharding.shard_index_nbytes))
    table = decode_shard_index(sharding, head or b"", key)
    present = [m for m in range(sharding.num_minishards) if table[m, 1] > table[m, 0]]
    places = [minishard_index_range(sharding, (head or b"")[16 * m : 16 * m + 16], m, key) for m in present]
    for m, place in zip(present, places, strict=True):
        if place.stop > size:
            raise ShardFormatError(
                f"shard {key!r}: truncated: minishard {m} index at [{place.start}, {place.stop}) "
                f"lies past the end of the {size}-byte object"
            )
    raws = (
        await scale.inner.get_many([(name, RangeByteRequest(p.start, p.stop)) for p in places])
        if places
        else []
    )
    shard = shard_number_of_name(sharding, name)
    ids: list[int] = []
    for m, place, raw in zip(present, places, raws, strict=True):
        if raw is None or len(raw) != len(place):
            raise ShardFormatError(f"shard {key!r}: minishard {m} index cut short")
        rows = decode_minishard_index(sharding, raw, key)
        if ((rows[:, 1] + rows[:, 2]) > np.uint64(size)).any():
            raise ShardFormatError(f"shard {key!r}: truncated: chunks past the end of the {size}-byte object")
        shards, minishards = locate_ids(sharding, rows[:, 0])
        if (minishards != np.uint64(m)).any() or (shard is not None and (shards != np.uint64(shard)).any()):
            raise ShardFormatError(f"shard {key!r}: minishard {m} lists chunks of another minishard or shard")
        ids.extend(rows[:, 0].tolist())
    return sorted(ids)


async def _survey_scale(scale: PrecomputedScale) -> list[_PrecomputedShard]:
    if scale.store is None:
        return []
    names = await scale.store.shard_keys()
    found: list[_PrecomputedShard | None] = []
    for start in range(0, len(names), _PRECOMPUTED_BATCH):
        batch = names[start : start + _PRECOMPUTED_BATCH]
        found.extend(await gather(*(_surveyed_shard(scale, n) for n in batch)))
    return [s for s in found if s is not None]


async def _unsharded_chunks(scale: PrecomputedScale) -> dict[str, int]:
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


def precomputed_info(location: PrecomputedLocation, prefix: str = "") -> list[PrecomputedReport]:
    return sync_bridge.run(precomputed_info_async(location, prefix))


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


def precomputed_keys(location: PrecomputedLocation, prefix: str = "") -> tuple[list[str], dict[str, str]]:
    return sync_bridge.run(precomputed_keys_async(location, prefix))


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
            total += await _sizes(scale.inner, [name for s, name in todo if s is scale])
    for start in range(0, len(todo), _VERIFY_BATCH):
        batch = todo[start : start + _VERIFY_BATCH]
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


def verify_precomputed(
    location: PrecomputedLocation, prefix: str = "", *, progress: Progress | None = None
) -> dict[str, str]:
    return sync_bridge.run(verify_precomputed_async(location, prefix, progress=progress))


async def precomputed_leftovers_async(location: PrecomputedLocation, prefix: str = "") -> dict[str, str]:
    """Files beside the shards that no reader looks at, key -> what: writers' hidden
    files (as :func:`leftovers`) and ``.shard`` files the sharding never names."""
    found: dict[str, str] = {}
    for scale in location.under(prefix):
        for hidden in await scale.inner.temporary_files(""):
            obj, kind = _owner(hidden)
            found[scale.key(hidden)] = _LEFTOVERS[kind].format(obj=scale.key(obj))
        for name in await _stray_shard_files(scale):
            found[scale.key(name)] = (
                "a .shard file whose name this sharding never gives (another padding, case or "
                "shard number): no reader looks at it"
            )
    return found


def precomputed_leftovers(location: PrecomputedLocation, prefix: str = "") -> dict[str, str]:
    return sync_bridge.run(precomputed_leftovers_async(location, prefix))
