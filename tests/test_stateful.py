"""Random operation sequences through zarr, compared with an unsharded model.

zarr's own state machines: ``ZarrHierarchyStateMachine`` creates, writes,
resizes, deletes and lists arrays and groups through zarr and compares data
and exact listings with a MemoryStore; ``ZarrStoreStateMachine`` does the
same at the key-value level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import pytest
import zarr
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from zarr.testing.stateful import ZarrHierarchyStateMachine, ZarrStoreStateMachine

from shardstore import ShardingStore

SETTINGS = settings(
    max_examples=20,  # x 25 steps x every inner kind: about 40 s of the suite
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def shard_by_two(path: str, metadata: dict[str, Any]) -> list[int] | None:
    ndim = len(metadata["shape"])
    return [2] * ndim if ndim else None


INNERS = {
    "zarr-memory": lambda tmp: zarr.storage.MemoryStore(),
    "zarr-local": lambda tmp: zarr.storage.LocalStore(tmp / "local"),
    "dict": lambda tmp: {},
    "fsspec-local": lambda tmp: fsspec.get_mapper(f"file://{tmp}/data"),
    "fsspec-memory": lambda tmp: fsspec.get_mapper(f"memory://{tmp.name}"),
}


@pytest.mark.parametrize("inner_kind", sorted(INNERS))
def test_zarr_hierarchy_state_machine(inner_kind: str, tmp_path: Path) -> None:
    store = ShardingStore(INNERS[inner_kind](tmp_path), chunks_per_shard=shard_by_two)

    def machine() -> ZarrHierarchyStateMachine:
        return ZarrHierarchyStateMachine(store)

    run_state_machine_as_test(machine, settings=SETTINGS)  # type: ignore[no-untyped-call]


def test_zarr_store_state_machine() -> None:
    store = ShardingStore(zarr.storage.MemoryStore(), chunks_per_shard=shard_by_two)
    run_state_machine_as_test(lambda: ZarrStoreStateMachine(store), settings=SETTINGS)  # type: ignore[no-untyped-call]
