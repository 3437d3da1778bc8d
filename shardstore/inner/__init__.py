"""Adapters that give every kind of wrapped storage the same small async API.

shardstore needs only whole and ranged reads (singly and batched), writes,
read-modify-writes, appends, deletes, sizes and listings. Each adapter maps
those onto its storage's own primitives: a zarr ``Store`` (an Icechunk
session's among them), an fsspec file system (its async API where it has one, threads otherwise; S3 with
conditional writes), local files (replaced atomically, under per-shard file
locks), or a plain mapping. Failures other than "not found"
become :class:`~shardstore.errors.InnerStoreError` naming the key.

May import: ``errors``, ``sync_bridge``, ``tasks`` and the storage libraries;
nothing that knows shards, formats or zarr arrays.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.mapping import FSMap
from zarr.abc.store import Store
from zarr.storage import FsspecStore, LocalStore

from shardstore.inner.azure import AzureInner, is_azure
from shardstore.inner.base import (
    STALE,
    UNCHANGED,
    AppendBuilder,
    Change,
    ChunkBytes,
    InnerStore,
    slice_range,
)
from shardstore.inner.fsspec_fs import FsspecInner
from shardstore.inner.gcs import GCSInner, is_gcs
from shardstore.inner.icechunk import IcechunkInner, is_icechunk
from shardstore.inner.local import LocalInner
from shardstore.inner.s3 import S3Inner, is_s3, s3_storage_options
from shardstore.inner.zarr_store import MappingInner, ZarrInner

if TYPE_CHECKING:  # obstore is optional: ObstoreInner is imported on first use (__getattr__)
    from shardstore.inner.obstore import ObstoreInner as ObstoreInner

__all__ = [
    "STALE",
    "UNCHANGED",
    "AppendBuilder",
    "Change",
    "ChunkBytes",
    "FsspecInner",
    "IcechunkInner",
    "InnerStore",
    "LocalInner",
    "MappingInner",
    "S3Inner",
    "ZarrInner",
    "adapt",
    "slice_range",
]


def __getattr__(name: str) -> Any:
    if name == "ObstoreInner":
        from shardstore.inner.obstore import ObstoreInner

        return ObstoreInner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def adapt(inner: Any, storage_options: dict[str, Any] | None = None) -> InnerStore:
    """The adapter for whatever the user passed as the inner store."""
    if isinstance(inner, InnerStore):
        return inner
    if isinstance(inner, str | os.PathLike):
        url = str(inner)
        fs, root = fsspec.url_to_fs(url, **s3_storage_options(url, storage_options or {}))
        return _from_fs(fs, root)
    if storage_options:
        raise TypeError("storage_options only apply when the inner store is given as a URL")
    if isinstance(inner, FSMap):
        return _from_fs(inner.fs, inner.root)
    if isinstance(inner, LocalStore):
        return LocalInner(inner.root)
    if isinstance(inner, FsspecStore):  # ours creates parent directories; zarr's does not
        return _from_fs(getattr(inner.fs, "sync_fs", inner.fs), inner.path)
    if is_icechunk(inner):
        return IcechunkInner(inner)
    if isinstance(inner, Store):
        return ZarrInner(inner)
    if isinstance(inner, MutableMapping):
        return MappingInner(inner)
    raise TypeError(
        f"cannot wrap {type(inner).__name__}: pass an fsspec mapper, a URL, a zarr Store or a MutableMapping"
    )


def _from_fs(fs: fsspec.AbstractFileSystem, root: str) -> InnerStore:
    if isinstance(fs, LocalFileSystem):
        return LocalInner(root)
    if is_s3(fs):
        return S3Inner(fs, root)
    if is_gcs(fs):
        return GCSInner(fs, root)
    if is_azure(fs):
        return AzureInner(fs, root)
    return FsspecInner(fs, root)
