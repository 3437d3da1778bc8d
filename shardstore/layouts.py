"""Switching a sharded zarr v3 array between the two layouts, metadata only.

The shard objects are the same bytes in both layouts ("transformer": a plain
array plus our storage-transformer entry; "codec": standard
``sharding_indexed`` metadata), so a switch rewrites the array's
``zarr.json`` (and its copies in consolidated metadata above it) and never
touches a shard. Where the bytes would mean something else in the other
form, the switch is refused with the reason.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from shardstore.choices import Layout
from shardstore.errors import ShardingConfigError
from shardstore.keys import join_path
from shardstore.metadata import (
    V2_ARRAY,
    V3_NAME,
    Document,
    array_info,
    consolidated_arrays,
    dump_document,
    inject_sharding,
    load_document,
    present_document,
)
from shardstore.sync_bridge import blocking

if TYPE_CHECKING:
    from shardstore.store import ShardingStore

__all__ = ["switch_layout", "switch_layout_async"]


def switched_document(path: str, doc: Document, to: Layout) -> Document | None:
    """``doc`` (a stored v3 array document) in the ``to`` layout; None if it is in it
    already. Raises ShardingConfigError where it cannot be switched."""
    where = f"array {path or '/'!r}"
    info = array_info(path, V3_NAME, doc)
    if info is None:
        raise ShardingConfigError(f"{where}: {V3_NAME} does not describe an array")
    if info.shard_format is None:
        raise ShardingConfigError(
            f"{where} cannot switch layout: {info.passthrough_reason or 'it is not sharded'}"
        )
    if info.form == to:
        return None
    plain = copy.deepcopy(doc)
    present_document(path, V3_NAME, plain, lambda _: False)
    if to == "codec" and plain.get("storage_transformers"):
        raise ShardingConfigError(
            f"{where} cannot switch to layout 'codec': it has other storage transformers "
            f"{plain['storage_transformers']!r}, which standard sharding metadata cannot carry"
        )
    plain.pop("storage_transformers", None)
    inject_sharding(plain, info.shard_format, to)
    return plain


async def switch_layout_async(store: ShardingStore, path: str, to: Layout) -> bool:
    """Rewrite the metadata of the v3 array at ``path`` into layout ``to``; False if it
    was in it already. Shard objects are not read or written."""
    if to not in ("transformer", "codec"):
        raise ShardingConfigError(f"layout must be 'transformer' or 'codec', not {to!r}")
    inner = store.internals.raw
    path = path.strip("/")
    raw = await inner.get(join_path(path, V3_NAME))
    if raw is None:
        if await inner.exists(join_path(path, V2_ARRAY)):
            raise ShardingConfigError(
                f"array {path or '/'!r} is a zarr v2 array: only layout 'transformer' can describe it"
            )
        raise ShardingConfigError(f"no zarr v3 array at {path or '/'!r}")
    doc = load_document(raw)
    if doc is None:
        raise ShardingConfigError(f"array {path or '/'!r}: {V3_NAME} is not a JSON object")
    new = switched_document(path, doc, to)
    if new is None:
        return False
    await store.internals.metadata_written(join_path(path, V3_NAME), dump_document(new))
    # copies of the document consolidated in the groups above it
    parts = path.split("/") if path else []
    for depth in range(len(parts)):
        group = "/".join(parts[:depth])
        key = join_path(group, V3_NAME)
        group_raw = await inner.get(key)
        group_doc = None if group_raw is None else load_document(group_raw)
        children = {} if group_doc is None else consolidated_arrays(V3_NAME, group_doc)
        rel = "/".join(parts[depth:])
        if group_doc is not None and rel in children:
            children[rel].clear()
            children[rel].update(copy.deepcopy(new))
            await inner.set(key, dump_document(group_doc))
    return True


switch_layout = blocking(switch_layout_async)
