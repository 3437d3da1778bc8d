"""Resizes keep the data: in the neuroglancer format chunk ids are compressed Morton
codes of grid positions, which depend on the grid shape, so a resize that would
renumber chunks already stored is refused before the metadata changes."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st

from shardstore import ShardingConfigError, ShardingStore
from shardstore.formats.precomputed import PrecomputedSharding, compressed_morton_code, renumbered

from .helpers import sample

SHARDING = PrecomputedSharding(1, "identity", 2, 2)

_grids = st.integers(1, 3).flatmap(
    lambda n: st.tuples(*[st.lists(st.integers(1, 12), min_size=n, max_size=n)] * 2)
)


@given(grids=_grids)
def test_renumbered_says_whether_a_common_position_changes_id(grids: tuple[list[int], list[int]]) -> None:
    old, new = grids
    common = [min(o, n) for o, n in zip(old, new, strict=True)]
    positions = np.array(list(itertools.product(*(range(c) for c in common))))
    moved = (compressed_morton_code(positions, old) != compressed_morton_code(positions, new)).any()
    assert renumbered(old, new) == bool(moved)


def _array(tmp_path: Path) -> tuple[zarr.Array, np.ndarray]:
    store = ShardingStore(str(tmp_path / "s"), chunks_per_shard=SHARDING)
    arr = zarr.create_array(store, name="a", shape=(32, 128), chunks=(16, 16), dtype="i4")
    data = sample((32, 128), "i4")
    arr[:] = data
    return arr, data


def test_a_growth_that_would_renumber_chunks_is_refused_before_anything_changes(tmp_path: Path) -> None:
    arr, data = _array(tmp_path)
    before = (tmp_path / "s" / "a" / "zarr.json").read_bytes()
    shards = {p.name: p.read_bytes() for p in (tmp_path / "s" / "a" / "c").iterdir()}
    with pytest.raises(ShardingConfigError, match=r"'a'.*\[32, 128\] to \[200, 128\].*renumber"):
        arr.resize((200, 128))  # the grid grows from 2 to 13 rows of chunks
    assert (tmp_path / "s" / "a" / "zarr.json").read_bytes() == before
    assert {p.name: p.read_bytes() for p in (tmp_path / "s" / "a" / "c").iterdir()} == shards
    reopened = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
    assert reopened.shape == (32, 128)
    np.testing.assert_array_equal(reopened[:], data)


def test_resizes_that_keep_every_id_go_through(tmp_path: Path) -> None:
    arr, data = _array(tmp_path)
    arr.resize((32, 129))  # columns 8 -> 9 chunks: the new bit comes after every other
    arr.resize((32, 250))
    arr[:, 128:] = 5
    reopened = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
    assert reopened.shape == (32, 250)
    np.testing.assert_array_equal(reopened[:, :128], data)
    np.testing.assert_array_equal(reopened[:, 128:], 5)


def test_an_array_without_chunks_takes_any_shape(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path / "s"), chunks_per_shard=SHARDING)
    arr = zarr.create_array(store, name="a", shape=(0, 16), chunks=(16, 16), dtype="i4")
    arr.resize((200, 128))
    arr[:] = 3
    doc = json.loads((tmp_path / "s" / "a" / "zarr.json").read_text())
    assert doc["shape"] == [200, 128]
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:], 3)


def test_the_indexed_format_resizes_freely(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path / "s"), chunks_per_shard=(2, 2))
    arr = zarr.create_array(store, name="a", shape=(32, 128), chunks=(16, 16), dtype="i4")
    data = sample((32, 128), "i4")
    arr[:] = data
    arr.resize((200, 128))
    arr.resize((200, 300))
    np.testing.assert_array_equal(
        zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:32, :128], data
    )
