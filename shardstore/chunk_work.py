"""The work a thread does for :class:`~shardstore.pipeline.ShardAwarePipeline`: chunks
decoded into the array zarr reads into, and encoded from the value zarr writes,
chunk by chunk or a whole shard at once.

A shard whose chunks in the selection are a box of its block in the output (its
whole block, or a part such as a slab's row of chunks; for writes, the whole block
of the value) is placed with one numpy operation (:mod:`shardstore.blocks`); every
other chunk is decoded or encoded alone. Each function works on a ``part``
(a range of its items), so that a thread per core takes a share
(:func:`shardstore.tasks.in_threads`); the codecs release the GIL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import zarr.abc.codec
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import NDBuffer

from shardstore.blocks import Box, block_view, chunks_of_block, is_block, stacked_chunks
from shardstore.chunk_codecs import ChunkCodec
from shardstore.formats.base import ABSENT, Allocate, ShardFormat, empty_rows, table_rows
from shardstore.reading.cache import ShardSnapshot
from shardstore.writing.updates import BuiltShard

__all__ = [
    "REPORTS",
    "ShardPart",
    "all_fill",
    "block_of_value",
    "decode_into",
    "encode_block",
    "encode_shards",
    "merge_and_encode",
    "new_chunk",
    "scatter_chunks",
    "scatter_shards",
]

REPORTS = hasattr(zarr.abc.codec, "GetResult")
"""zarr 3.4 and later want each chunk's read reported as present or missing."""
PRESENT: Any = {"status": "present"} if REPORTS else None
MISSING: Any = {"status": "missing"} if REPORTS else None
JOINED_CHUNK_BYTES = 256 << 10
"""Compressed chunks up to this size are decoded one after another and placed as a
whole shard (few handoffs of the GIL a chunk); bigger ones each straight into place."""

ChunkInfo: TypeAlias = tuple[Any, ArraySpec, Any, Any, bool]
"""zarr's description of one chunk of a selection: its byte getter/setter, spec,
selection in the chunk and in the value, and whether the chunk is wholly covered."""

ShardPart: TypeAlias = tuple[npt.NDArray[np.intp], npt.NDArray[np.int64], "ShardSnapshot | None", Box | None]
"""One shard of a selection: its chunks (places in the selection), their places in the
shard, the shard as read (None: not read), and those chunks as a box of its block in
the array (None: not one)."""


def decode_into(
    codec: ChunkCodec,
    stored: Any,
    info: ChunkInfo,
    target: npt.NDArray[Any],
    drop_axes: tuple[int, ...],
) -> Any:
    """One chunk's stored bytes (None: absent, the fill value) decoded into its place in
    ``target``; its report as zarr wants it. Raises where the bytes do not decode."""
    return place_chunk(
        None if stored is None else codec.decode(stored, info[1].shape), info, target, drop_axes
    )


def place_chunk(
    chunk: npt.NDArray[Any] | None, info: ChunkInfo, target: npt.NDArray[Any], drop_axes: tuple[int, ...]
) -> Any:
    """One decoded chunk (None: absent, the fill value) put in its place in ``target``;
    its report as zarr wants it."""
    _, spec, chunk_selection, out_selection, _ = info
    if chunk is None:
        target[out_selection] = spec.fill_value
        return MISSING
    piece = chunk[chunk_selection]
    target[out_selection] = piece.squeeze(axis=drop_axes) if drop_axes else piece
    return PRESENT


def scatter_chunks(
    codec: ChunkCodec,
    items: list[tuple[Any, ...]],
    part: range,
    out: NDBuffer,
    drop_axes: tuple[int, ...],
    reports: list[Any],
    failed: list[int],
) -> None:
    """Decode the chunks ``part`` of ``items`` (each a chunk's info with the held chunk
    in front, its stored bytes as ``.value``) into ``out``, each one's report into
    ``reports``; the places of those that do not decode into ``failed``."""
    target: Any = out.as_ndarray_like()
    for k in part:
        held = items[k][0].value
        try:
            reports[k] = decode_into(
                codec, None if held is None else held.as_numpy_array(), items[k], target, drop_axes
            )
        except Exception:
            failed.append(k)


def scatter_shards(
    codec: ChunkCodec,
    chunks: Sequence[ChunkInfo],
    shards: Sequence[ShardPart],
    block: tuple[int, ...] | None,
    part: range,
    out: NDBuffer,
    drop_axes: tuple[int, ...],
    reports: list[Any],
    failed: list[tuple[int, bytes | None]],
    empty: Allocate = empty_rows,
) -> None:
    """Decode the chunks of the shards ``part`` of ``shards`` into ``out``, each one's
    report into ``reports``; the chunks that do not decode (with their bytes) into
    ``failed``, for zarr's codecs to say what is wrong. Chunks decoded side by side
    before they go into place are decoded into memory ``empty`` gives."""
    target: Any = out.as_ndarray_like()
    spec = chunks[0][1]
    for k in part:
        members, places, snapshot, box = shards[k]
        assert snapshot is not None
        table = snapshot.index
        if box is not None and isinstance(table, np.ndarray):
            region = block_view(target, box.corner, box.extent, tuple(spec.shape))
            # the box's chunks in its C order: the order of their places in the block
            rows = table if is_block(box, block) else table[np.sort(places)]
            stacked = None if region is None else _block_of(codec, snapshot.data, rows, spec, empty)
            if region is not None and stacked is not None:
                region[...] = chunks_of_block(stacked, box.extent)
                present = (table[places, 0] != ABSENT).tolist()
                for n, here in zip(members.tolist(), present, strict=True):
                    reports[n] = PRESENT if here else MISSING
                continue
        data = memoryview(snapshot.data)
        entries = _entries(table, places)
        if _scattered_together(
            codec, chunks, members.tolist(), entries, data, target, drop_axes, reports, empty
        ):
            continue
        for n, (offset, nbytes) in zip(members.tolist(), entries, strict=True):
            stored = None if offset == ABSENT else data[offset : offset + nbytes]
            try:
                reports[n] = decode_into(codec, stored, chunks[n], target, drop_axes)
            except Exception:
                failed.append((n, None if stored is None else bytes(stored)))


def _scattered_together(
    codec: ChunkCodec,
    chunks: Sequence[ChunkInfo],
    members: list[int],
    entries: list[tuple[int, int]],
    data: memoryview,
    target: npt.NDArray[Any],
    drop_axes: tuple[int, ...],
    reports: list[Any],
    empty: Allocate,
) -> bool:
    """Decode the chunks ``members`` of one shard (stored at ``entries`` of its bytes
    ``data``) in one call and put each in its place; False where that cannot be done
    (the caller then decodes them one by one, and names a damaged one): a chain
    without such a call, a lone chunk, big chunks (each is decoded straight into
    place, not held twice), chunks of different shapes (a rectilinear grid), damage."""
    shape = tuple(chunks[members[0]][1].shape) if members else ()
    if len(members) < 2 or codec.dtype.itemsize * math.prod(shape) > JOINED_CHUNK_BYTES:
        return False
    if any(tuple(chunks[n][1].shape) != shape for n in members):
        return False
    rows = np.array(entries, dtype=np.uint64).reshape(-1, 2)
    present = rows[:, 0] != ABSENT
    try:
        decoded = codec.decode_stacked(data, rows[present], shape, empty)
        if decoded is None:
            return False
        each = iter(decoded)
        for n, here in zip(members, present.tolist(), strict=True):
            reports[n] = place_chunk(next(each) if here else None, chunks[n], target, drop_axes)
    except Exception:  # (what zarr's codecs would say, the chunk-by-chunk path finds out)
        return False
    return True


def _block_of(
    codec: ChunkCodec,
    data: bytes | memoryview,
    table: npt.NDArray[np.uint64],
    spec: ArraySpec,
    empty: Allocate,
) -> npt.NDArray[Any] | None:
    """The chunks at the rows ``table`` of a shard's index, in that order, as one
    ``(n, *chunk)`` array (the fill value where absent): a view of the shard's bytes
    where they are stored raw side by side, else decoded one after another and
    joined. None where the caller decodes them one by one: big chunks (each straight
    into place), or where one does not decode (to name it)."""
    shape = tuple(spec.shape)
    if codec.raw and (stacked := stacked_chunks(data, table, codec.dtype, shape)) is not None:
        return stacked
    size = codec.dtype.itemsize * math.prod(shape)
    if size > JOINED_CHUNK_BYTES:
        return None  # big chunks: each decoded straight into place, no copy in between
    present = table[:, 0] != ABSENT
    try:
        decoded = codec.decode_stacked(data, table[present], shape, empty)
    except ValueError:
        return None
    if decoded is not None:
        if present.all():
            return decoded
        stacked = np.full((len(table), *shape), spec.fill_value, dtype=codec.dtype)
        stacked[present] = decoded
        return stacked
    view = memoryview(data)
    fill: bytes | None = None
    parts: list[Any] = []
    for offset, nbytes in table.tolist():
        if offset == ABSENT:
            if fill is None:
                fill = np.full(shape, spec.fill_value, dtype=codec.dtype).tobytes()
            parts.append(fill)
            continue
        try:
            part = codec.decode_bytes(view[offset : offset + nbytes])
        except Exception:
            return None
        if memoryview(part).nbytes != size:
            return None
        parts.append(part)
    # one join, then one copy into place: a thread per core decodes with few GIL handoffs
    stacked = np.frombuffer(b"".join(parts), dtype=codec.dtype).reshape((len(parts), *shape))
    return stacked if codec.in_order else np.stack([codec.arrange(p, shape) for p in parts])


def _entries(table: Any, places: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """``(offset, nbytes)`` of each place in a shard's table (offset ABSENT: absent)."""
    return table_rows(table, places).tolist()  # type: ignore[no-any-return]


def new_chunk(
    codec: ChunkCodec, info: ChunkInfo, old: Any, source: npt.NDArray[Any], drop_axes: tuple[int, ...]
) -> bytes | None:
    """A chunk's new stored bytes (None: zarr would store none) from the value
    ``source`` and, for a chunk covered in part, its old bytes ``old`` (None: absent;
    unused for a chunk zarr says the selection covers).
    Raises where the old bytes do not decode."""
    _, spec, chunk_selection, out_selection, complete = info
    piece = source if source.shape == () else source[out_selection]
    if drop_axes:
        piece = piece[tuple(None if i in drop_axes else slice(None) for i in range(len(spec.shape)))]
    if complete and piece.shape == tuple(spec.shape):
        chunk = piece
    elif old is None or complete:  # (zarr's "complete" edge chunk: its part outside the array is fill)
        chunk = np.full(spec.shape, spec.fill_value, dtype=codec.dtype.newbyteorder("="))
        chunk[chunk_selection] = piece
    else:
        chunk = codec.decode(old, spec.shape).copy()
        chunk[chunk_selection] = piece
    return None if all_fill(chunk, spec) else codec.encode(chunk)


def merge_and_encode(
    codec: ChunkCodec,
    items: list[tuple[Any, ...]],
    part: range,
    value: NDBuffer,
    drop_axes: tuple[int, ...],
    encoded: list[bytes | Exception | None],
) -> None:
    """The new bytes of the chunks ``part`` of ``items`` (each a chunk's info with the
    held chunk in front, its old bytes as ``.value``) into ``encoded``; the error
    instead where old bytes do not decode."""
    source: Any = value.as_ndarray_like()
    for k in part:
        held = items[k][0].value
        try:
            encoded[k] = new_chunk(
                codec, items[k], None if held is None else held.as_numpy_array(), source, drop_axes
            )
        except Exception as exc:
            encoded[k] = exc


def encode_shards(
    codec: ChunkCodec,
    chunks: Sequence[ChunkInfo],
    shards: Sequence[ShardPart],
    block: tuple[int, ...] | None,
    part: range,
    value: NDBuffer,
    drop_axes: tuple[int, ...],
    encoded: list[dict[int, Any] | BuiltShard],
    failed: list[tuple[int, bytes | None]],
    shard_format: ShardFormat | None = None,
    empty: Allocate = empty_rows,
) -> None:
    """The new bytes of the chunks of the shards ``part`` of ``shards`` (by place; None:
    no chunk) into ``encoded[k]``; a shard that is a whole block of a value stored raw
    is cut out of the value in one copy (into the shard object itself, built by
    ``shard_format`` in memory ``empty`` gives, where every chunk is stored). Chunks
    whose old bytes do not decode go to ``failed`` (with those bytes)."""
    source: Any = value.as_ndarray_like()
    spec = chunks[0][1]
    wholes: dict[int, npt.NDArray[Any]] = {}
    for k in part:
        whole = block_of_value(codec, spec, source, shards[k][3], block)
        if whole is not None:
            wholes[k] = whole
    # built in place: only shards none of whose chunks may be the fill value (an
    # emptied chunk would leave its shard in the allocation, held until all are committed)
    full = [k for k, whole in wholes.items() if not _may_hold_fill(whole, spec)]
    dense = dict(zip(full, _dense_shards(codec, spec, shard_format, len(full), empty), strict=False))
    for k in part:
        members, places, snapshot, _ = shards[k]
        if k in wholes:
            assert block is not None
            encoded[k] = _block_chunks(codec, wholes[k], block, spec, dense.get(k))
            continue
        data = None if snapshot is None else memoryview(snapshot.data)
        olds = _entries(snapshot.index, places) if snapshot is not None else [(ABSENT, 0)] * len(places)
        values: dict[int, Any] = {}
        for n, place, (offset, nbytes) in zip(members.tolist(), places.tolist(), olds, strict=True):
            old = None if data is None or offset == ABSENT else data[offset : offset + nbytes]
            try:
                values[place] = new_chunk(codec, chunks[n], old, source, drop_axes)
            except Exception:
                failed.append((n, None if old is None else bytes(old)))
        encoded[k] = values


def block_of_value(
    codec: ChunkCodec, spec: ArraySpec, source: Any, box: Box | None, block: tuple[int, ...] | None
) -> npt.NDArray[Any] | None:
    """The region of the value ``source`` that is a shard's whole block (``box``), viewed
    as ``(b0, c0, b1, c1, ...)``, where its chunks are encoded from one copy of it
    (:func:`encode_block`); None elsewhere: big chunks are each encoded from the value,
    and a block the array's edge cuts is not whole."""
    shape = tuple(spec.shape)
    small = codec.raw or codec.dtype.itemsize * math.prod(shape) <= JOINED_CHUNK_BYTES
    if block is not None and source.shape != () and small and is_block(box, block):
        return block_view(source, box.corner, block, shape)
    return None


def encode_block(
    codec: ChunkCodec,
    whole: npt.NDArray[Any],
    block: tuple[int, ...],
    spec: ArraySpec,
    shard_format: ShardFormat | None,
    empty: Allocate,
) -> dict[int, Any] | BuiltShard:
    """One shard's chunks encoded from its whole block (:func:`block_of_value`), as
    :func:`encode_shards` does: on its own, by the commit that writes it."""
    dense = [] if _may_hold_fill(whole, spec) else _dense_shards(codec, spec, shard_format, 1, empty)
    return _block_chunks(codec, whole, block, spec, dense[0] if dense else None)


def _dense_shards(
    codec: ChunkCodec, spec: ArraySpec, shard_format: ShardFormat | None, count: int, empty: Allocate
) -> list[tuple[memoryview, memoryview]]:
    """New shard objects for ``count`` whole blocks stored raw (see
    :meth:`ShardFormat.dense_shards`); none where the chunks are not stored raw or the
    format has no such layout."""
    chunk_nbytes = codec.dtype.itemsize * math.prod(spec.shape)
    if not (codec.raw and count and chunk_nbytes and shard_format is not None):
        return []
    return shard_format.dense_shards(chunk_nbytes, count, empty) or []


def _block_chunks(
    codec: ChunkCodec,
    whole: npt.NDArray[Any],
    block: tuple[int, ...],
    spec: ArraySpec,
    dense: tuple[memoryview, memoryview] | None,
) -> dict[int, Any] | BuiltShard:
    """The new bytes of every chunk of a shard's whole block (by place; None: no chunk),
    from one copy of the block in the shard's order: stored raw, views of that copy,
    copied into the ``dense`` shard object given where it fits and then, if every
    chunk is stored, that shard itself."""
    ndim = len(block)
    order = tuple(range(0, 2 * ndim, 2)) + tuple(range(1, 2 * ndim, 2))
    in_order = whole.transpose(order)
    # always a copy: raw chunks are views of it, and a commit can outlive the call that
    # wrote it (a cancelled write), when the caller may have reused its array
    if dense is not None and dense[1].nbytes == in_order.size * codec.dtype.itemsize:
        stacked = np.frombuffer(dense[1], dtype=codec.dtype).reshape(in_order.shape)
        stacked[...] = in_order
    else:
        dense = None
        stacked = np.array(in_order, dtype=codec.dtype, order="C", copy=True)
    stacked = stacked.reshape((-1, *spec.shape))
    empty = _fill_chunks(stacked, spec)
    if dense is not None and not empty:
        return BuiltShard(*dense, stacked[0].nbytes)
    if codec.raw:
        raw = memoryview(stacked.reshape(-1).view(np.uint8))
        size = raw.nbytes // len(stacked)
        return {p: None if p in empty else raw[p * size : (p + 1) * size] for p in range(len(stacked))}
    kept = [p for p in range(len(stacked)) if p not in empty]
    values: dict[int, Any] = dict.fromkeys(empty)
    values.update(zip(kept, codec.encode_stacked(stacked, kept), strict=True))
    return values


def _may_hold_fill(whole: npt.NDArray[Any], spec: ArraySpec) -> bool:
    """Whether a chunk of a shard's block (viewed as ``(b0, c0, b1, c1, ...)``) may be
    one zarr stores none of: one whose first element is the fill value (see
    :func:`_fill_chunks`), found without copying the block."""
    if spec.config.write_empty_chunks or whole.size == 0:
        return False
    fill = spec.fill_value
    firsts = whole[tuple(slice(None) if axis % 2 == 0 else 0 for axis in range(whole.ndim))]
    return bool(np.isnan(firsts).any() if fill != fill else (firsts == fill).any())


def _fill_chunks(stacked: npt.NDArray[Any], spec: ArraySpec) -> set[int]:
    """Which chunks (``stacked[p]``) zarr would store none of (see :func:`all_fill`),
    found with a few numpy operations over all of them."""
    if spec.config.write_empty_chunks or stacked[0].size == 0:
        return set()
    fill = spec.fill_value
    flat = stacked.reshape(len(stacked), -1)
    first = flat[:, 0]
    maybe = np.flatnonzero(np.isnan(first) if fill != fill else first == fill)
    if len(maybe) == 0:
        return set()
    rows = flat[maybe]
    same = (np.isnan(rows) if fill != fill else rows == fill).all(axis=1)
    return {int(p) for p in maybe[same].tolist() if all_fill(stacked[p], spec)}


def all_fill(chunk: npt.NDArray[Any], spec: ArraySpec) -> bool:
    """Whether zarr would store no chunk for these values: ``write_empty_chunks`` off
    and every element the fill value, by zarr's own test (-0.0 is no 0.0); the
    first element, or a sample, settles most chunks at once."""
    if spec.config.write_empty_chunks:
        return False
    fill = spec.fill_value
    first = chunk.flat[0] if chunk.size else fill
    if not (first == fill or (first != first and fill != fill)):  # (NaN)
        return False
    if fill == fill and (chunk.flat[:: max(1, chunk.size // 61)] != fill).any():
        return False  # a sample of the values differs (a data chunk that starts as the fill does)
    return bool(spec.prototype.nd_buffer.from_ndarray_like(chunk).all_equal(fill))
