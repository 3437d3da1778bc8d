"""Dask and xarray writes aligned to shards: one task per shard, no shared shard.

Writers whose regions split shards are safe (shard updates take turns or
retry), but each shard is then read and rewritten once per writer. Blocks
that each cover whole shards write every shard once, with no waiting on
another writer. :func:`rechunk_to_shards` gives a dask array, a DataArray or a
Dataset such blocks, keeping zarr's chunks as they were.
"""

from __future__ import annotations

from typing import Any, TypeVar

import zarr

import shardstore.sync_bridge as sync_bridge
from shardstore.keys import join_path
from shardstore.store import ShardingStore

__all__ = ["rechunk_to_shards", "shard_shape"]

T = TypeVar("T")


def shard_shape(array: zarr.Array[Any]) -> tuple[int, ...]:
    """The elements one shard of ``array`` covers (its chunk shape if unsharded)."""
    if array.shards is not None:  # zarr's own sharding codec
        return tuple(array.shards)
    cps = None
    if isinstance(array.store, ShardingStore):
        cps = sync_bridge.run(array.store.internals.chunks_per_shard_for(array.path, array.shape))
    return tuple(c * n for c, n in zip(array.chunks, cps or (1,) * array.ndim, strict=True))


def rechunk_to_shards(obj: T, target: zarr.Array[Any] | ShardingStore, group: str = "") -> T:
    """``obj`` rechunked so that each block covers whole shards of its target.

    - a dask array and the ``zarr.Array`` it will be stored into;
    - an xarray Dataset or DataArray and the ``ShardingStore`` (and group) it
      will be written to: each variable's zarr chunks are its
      ``encoding["chunks"]``, or else its current dask chunks (the first
      block along each dimension); they are kept as its
      ``encoding["chunks"]``, and its dask blocks become whole shards as the
      array exists in the store or as the store's ``chunks_per_shard`` would
      shard it. Unsharded variables keep their chunks.
    """
    if isinstance(target, zarr.Array):
        return obj.rechunk(shard_shape(target))  # type: ignore[attr-defined, no-any-return]
    import xarray as xr

    if isinstance(obj, xr.DataArray):
        name = obj.name if obj.name is not None else "__xarray_dataarray_variable__"
        ds = rechunk_to_shards(obj.to_dataset(name=name), target, group)
        return ds[name].rename(obj.name)  # type: ignore[return-value]
    if not isinstance(obj, xr.Dataset):
        raise TypeError(
            f"rechunk_to_shards takes a dask array, DataArray or Dataset, not {type(obj).__name__}"
        )
    out = obj.copy()
    for name, var in obj.variables.items():
        if var.chunks is None:
            continue
        chunks = tuple(var.encoding.get("chunks") or (c[0] for c in var.chunks))
        path = join_path(group.strip("/"), str(name))
        cps = sync_bridge.run(target.internals.chunks_per_shard_for(path, var.shape, str(var.dtype)))
        if cps is None:
            continue
        new = var.chunk(dict(zip(var.dims, (c * n for c, n in zip(chunks, cps, strict=True)), strict=True)))
        new.encoding = {**var.encoding, "chunks": chunks}
        out[name] = new
    return out
