"""Shared fixtures: every kind of inner store the contract names."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import zarr
from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper

from shardstore import ShardingStore

# gcsfs 2026 asks a bucket's type over gRPC first and waits 60 s a call for the GCS
# emulator, which has none; set before gcsfs is imported, inherited by spawned writers
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

InnerFactory = Callable[[Path], Any]

INNERS: dict[str, InnerFactory] = {
    "dict": lambda tmp: {},
    "zarr-memory": lambda tmp: zarr.storage.MemoryStore(),
    "zarr-local": lambda tmp: zarr.storage.LocalStore(tmp / "local"),
    # a wrapper hides the LocalStore: served as any zarr store (batched reads raise for
    # a missing key there, where get returns None)
    "zarr-wrapped-local": lambda tmp: zarr.storage.WrapperStore(zarr.storage.LocalStore(tmp / "wrapped")),
    "fsspec-local": lambda tmp: fsspec.get_mapper(f"file://{tmp}/fsmap"),
    "fsspec-memory": lambda tmp: fsspec.get_mapper(f"memory://{tmp.name}"),
    "fsspec-async": lambda tmp: fsspec.FSMap(
        f"async-{tmp.name}", AsyncFileSystemWrapper(fsspec.filesystem("memory"))
    ),
}


@pytest.fixture(params=sorted(INNERS))
def inner(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    made = INNERS[request.param](tmp_path)
    yield made
    if request.param in ("fsspec-memory", "fsspec-async"):
        memory = fsspec.filesystem("memory")
        if memory.exists(made.root):
            memory.rm(made.root, recursive=True)


@pytest.fixture
def make_store(inner: Any) -> Callable[..., ShardingStore]:
    def make(chunks_per_shard: Any = (2, 2), **kwargs: Any) -> ShardingStore:
        return ShardingStore(inner, chunks_per_shard, **kwargs)

    return make


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """A local S3 API (moto_server behind a counting proxy on 127.0.0.1), per test module."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from shardstore.testing.s3 import local_s3

    with local_s3() as server:
        yield server
