"""``verify``: every shard against every structural rule of its format and, on
request, every chunk decoded through zarr; a damaged shard never stops the run."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import zarr.api.asynchronous
from zarr.core.buffer import default_buffer_prototype

from shardstore.errors import ChunkDecodeError, InnerStoreError, ShardFormatError, ShardingConfigError
from shardstore.keys import join_path
from shardstore.maintenance.common import VERIFY_BATCH, Progress, sizes_of
from shardstore.maintenance.leftovers import owner
from shardstore.metadata import ARRAY_DOC_NAMES, ArrayInfo, Document, load_document
from shardstore.sync_bridge import blocking
from shardstore.tasks import gather

__all__ = ["verify", "verify_async"]

if TYPE_CHECKING:
    from shardstore.addressing import ShardAddress
    from shardstore.store import ShardingStore

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
    damaged.update(await store.internals.unreadable_documents(plain))
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
    hidden = map(owner, await store.internals.raw.temporary_files(prefix))
    journaled = {obj for obj, kind in hidden if kind == "appending"}
    arrays = {s.info.path: s.info for s in shards}
    sizes = {path: await _chunk_nbytes(store, info) for path, info in arrays.items()}
    damaged: dict[str, str] = {}
    readable: list[_Chunks] = []
    total = 0 if progress is None else await sizes_of(store.internals.raw, [s.key for s in shards])
    done = 0
    for start in range(0, len(shards), VERIFY_BATCH):
        batch = shards[start : start + VERIFY_BATCH]
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
        (info, None, batch, await sizes_of(store.internals.raw, batch) if sized else 0)
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
        said = exc.__cause__ if isinstance(exc, ChunkDecodeError) and exc.__cause__ is not None else exc
        return key, f"chunk{where} does not decode: {type(said).__name__}: {said}"
    return None


verify = blocking(verify_async)
