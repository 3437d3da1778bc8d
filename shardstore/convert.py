"""Copying a whole hierarchy into another store: re-sharded, un-sharded, or into
the other layout.

A copy of logical keys between two ShardingStores: the source shows zarr's
view (plain chunk keys, whatever its sharding), the destination applies its
own ``chunks_per_shard``, layout and index options as the metadata arrives.
Chunk bytes are copied as zarr wrote them, never decoded. Order matters:
array documents first (they decide the destination's sharding), then the
chunks in one batch (each shard written once), then group documents,
attributes and consolidated metadata (which need the arrays' configs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from shardstore.errors import ShardingConfigError
from shardstore.metadata import ARRAY_DOC_NAMES, METADATA_NAMES, V3_NAME, load_document

if TYPE_CHECKING:
    from shardstore.store import ShardingStore

__all__ = ["ConvertReport", "convert", "convert_async"]

_READ_BATCH = 256
"""Chunks read per ``get_partial_values`` call while copying."""

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ConvertReport:
    """What one conversion copied."""

    arrays: int
    chunks: int
    bytes: int
    """Chunk bytes copied."""


def _is_array_document(name: str, raw: bytes) -> bool:
    if name not in ARRAY_DOC_NAMES:
        return False
    doc = load_document(raw)
    return doc is not None and (name != V3_NAME or doc.get("node_type") == "array")


async def convert_async(
    src: ShardingStore, dst: ShardingStore, *, progress: Progress | None = None
) -> ConvertReport:
    """Copy every key of ``src`` into ``dst`` (which must be empty)."""
    async for _ in dst.list_prefix(""):
        raise ShardingConfigError(f"destination {dst!r} is not empty: convert writes into an empty store")
    keys = sorted([k async for k in src.list_prefix("")])
    proto = default_buffer_prototype()
    metadata = [k for k in keys if k.rpartition("/")[2] in METADATA_NAMES]
    docs = dict(
        zip(metadata, await src.get_partial_values(proto, [(k, None) for k in metadata]), strict=True)
    )
    arrays = [
        k for k, v in docs.items() if v is not None and _is_array_document(k.rpartition("/")[2], v.to_bytes())
    ]
    for key in arrays:  # every config checked before anything is written
        dst.internals.check_new_array(key, docs[key].to_bytes())  # type: ignore[union-attr]
    for key in arrays:
        await dst.set(key, docs[key])  # type: ignore[arg-type]
    chunks = [k for k in keys if k not in docs]
    copied = nbytes = 0
    async with dst.batch():
        for start in range(0, len(chunks), _READ_BATCH):
            part = chunks[start : start + _READ_BATCH]
            values = await src.get_partial_values(proto, [(k, None) for k in part])
            await asyncio.gather(*(dst.set(k, v) for k, v in zip(part, values, strict=True) if v is not None))
            copied += len(part)
            nbytes += sum(len(v) for v in values if v is not None)
            if progress is not None:
                progress(copied, len(chunks))
    for key in metadata:
        value = docs[key]
        if key not in arrays and value is not None:
            await dst.set(key, value)
    return ConvertReport(len(arrays), copied, nbytes)


def convert(src: ShardingStore, dst: ShardingStore, *, progress: Progress | None = None) -> ConvertReport:
    """Synchronous :func:`convert_async`."""
    report: ConvertReport = sync(convert_async(src, dst, progress=progress))
    return report
