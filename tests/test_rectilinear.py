"""Rectilinear (variable-size) chunk grids (zarr 3.2+, ``array.rectilinear_chunks``).

Chunk grid coordinates stay integers, so chunks group into shards by floor
division: the transformer layout shards any rectilinear grid; the codec layout
(zarr's ``sharding_indexed``, one inner chunk shape) those with one chunk size
per dimension, and refuses the others. On a zarr without rectilinear grids, an
array that has one is refused with a message naming the zarr it needs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st

from shardstore import ShardingConfigError, ShardingStore
from shardstore.chunk_grids import covering_edges, dim_specs, rectilinear_grid, uniform_edge
from shardstore.convert import convert
from shardstore.maintenance import info, verify
from shardstore.metadata import array_info

from .helpers import inner_keys, logical_keys, sample

HAS_RECTILINEAR = zarr.config.get("array.rectilinear_chunks", None) is not None
needs_rectilinear = pytest.mark.skipif(
    not HAS_RECTILINEAR, reason=f"zarr {zarr.__version__} has no rectilinear chunk grids (3.2+)"
)

EDGES = [[5, 10, 5, 10], [10, 5, 10]]  # rows 0-4, 5-14, 15-19, 20-29; columns 0-9, 10-14, 15-24
SHAPE = (30, 25)


@pytest.fixture
def rectilinear() -> Iterator[None]:
    if not HAS_RECTILINEAR:
        yield
        return
    with zarr.config.set({"array.rectilinear_chunks": True}):
        yield


# -- the pure geometry -----------------------------------------------------------------

_runs = st.lists(st.integers(1, 9), min_size=1, max_size=8)


@given(edges=_runs, data=st.data())
def test_covering_edges_are_the_fewest_that_cover_the_extent(edges: list[int], data: st.DataObject) -> None:
    extent = data.draw(st.integers(0, sum(edges)))
    covering = covering_edges(tuple(edges), extent)
    assert list(covering) == edges[: len(covering)]
    assert sum(covering) >= extent
    assert not covering or sum(covering[:-1]) < extent
    with pytest.raises(ValueError, match="cover"):
        covering_edges(tuple(edges), sum(edges) + 1)


@given(step=st.integers(1, 9), extent=st.integers(0, 60))
def test_a_repeated_edge_covers_any_extent(step: int, extent: int) -> None:
    covering = covering_edges(step, extent)
    assert set(covering) <= {step} and len(covering) == -(-extent // step)
    assert uniform_edge(step, extent) == step


def test_runs_expand_and_malformed_grids_are_refused() -> None:
    grid = rectilinear_grid([[[4, 3], 2], 7])
    assert dim_specs(grid) == ((4, 4, 4, 2), 7)
    assert dim_specs({"name": "regular", "configuration": {"chunk_shape": [2]}}) is None
    for bad in ([[0]], [[[4, 3, 1]]], [[]], [-2], ["x"]):
        with pytest.raises(ValueError):
            dim_specs(rectilinear_grid(bad))
    assert uniform_edge((4, 4, 4, 2), 12) == 4  # the short edge lies past the extent
    assert uniform_edge((4, 4, 4, 2), 13) is None


@given(
    edges=st.lists(_runs, min_size=1, max_size=3),
    cut=st.lists(st.floats(0, 1), min_size=3, max_size=3),
)
def test_chunk_regions_tile_the_array(edges: list[list[int]], cut: list[float]) -> None:
    shape = [int(sum(e) * c) for e, c in zip(edges, cut, strict=False)]
    doc = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": "uint8",
        "chunk_grid": rectilinear_grid(edges),
        "chunk_key_encoding": {"name": "default"},
        "codecs": [{"name": "bytes"}],
    }
    found = array_info("a", "zarr.json", doc)
    assert found is not None and found.edges is not None
    covered = np.zeros(shape, "u1")
    for coords in itertools.product(*(range(g) for g in found.grid_shape)):
        covered[found.chunk_region(coords)] += 1
    assert (covered == 1).all()


# -- through the store -------------------------------------------------------------------


def _write(store: ShardingStore, edges: list[list[int]] = EDGES) -> np.ndarray:
    data = sample(SHAPE, "i4")
    arr = zarr.create_array(store, name="a", shape=SHAPE, chunks=edges, dtype="i4", fill_value=0)
    arr[:] = data
    arr[3:17, 2:12] = -1  # across chunks of every size
    data[3:17, 2:12] = -1
    return data


@needs_rectilinear
@pytest.mark.usefixtures("rectilinear")
def test_the_transformer_layout_shards_any_rectilinear_grid(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path / "t"), (2, 2))
    data = _write(store)
    # a 4 x 3 grid of chunks in 2 x 2 shards
    assert sorted(k for k in inner_keys(store) if "/c/" in k) == ["a/c/0/0", "a/c/0/1", "a/c/1/0", "a/c/1/1"]
    assert logical_keys(store, "a/c/") == [f"a/c/{i}/{j}" for i in range(4) for j in range(3)]
    reopened = zarr.open_array(ShardingStore(str(tmp_path / "t")), path="a")
    assert reopened.metadata.chunk_grid.to_dict()["name"] == "rectilinear"
    np.testing.assert_array_equal(reopened[:], data)
    np.testing.assert_array_equal(reopened[4:21, 9:16], data[4:21, 9:16])
    with pytest.raises(Exception, match=r"shardstore"):  # plain zarr fails loudly
        zarr.open_array(zarr.storage.LocalStore(tmp_path / "t"), path="a")[:]


@needs_rectilinear
@pytest.mark.usefixtures("rectilinear")
def test_the_codec_layout_is_read_by_plain_zarr(tmp_path: Path) -> None:
    """One chunk size per dimension: the shards form a rectilinear grid that zarr's
    own sharding codec reads, without shardstore."""
    store = ShardingStore(str(tmp_path / "c"), (2, 2), layout="codec")
    data = _write(store, [[10, 10, 10], [5] * 5])
    stored = json.loads((tmp_path / "c" / "a" / "zarr.json").read_text())
    assert stored["chunk_grid"]["name"] == "rectilinear"
    assert stored["codecs"][0]["name"] == "sharding_indexed"
    assert stored["codecs"][0]["configuration"]["chunk_shape"] == [10, 5]
    plain = zarr.open_array(zarr.storage.LocalStore(tmp_path / "c"), path="a")
    np.testing.assert_array_equal(plain[:], data)
    served = zarr.open_array(ShardingStore(str(tmp_path / "c")), path="a")
    assert served.metadata.chunk_grid.to_dict()["name"] == "rectilinear"
    np.testing.assert_array_equal(served[:], data)


@needs_rectilinear
@pytest.mark.usefixtures("rectilinear")
def test_the_codec_layout_refuses_chunks_of_several_sizes(tmp_path: Path) -> None:
    store = ShardingStore(str(tmp_path / "c"), (2, 2), layout="codec")
    with pytest.raises(ShardingConfigError, match=r"'a'.*dimension 0.*\[5, 10\].*layout='transformer'"):
        zarr.create_array(store, name="a", shape=SHAPE, chunks=EDGES, dtype="i4")
    assert [k for k in inner_keys(store) if k.startswith("a/")] == []  # nothing half-made


@needs_rectilinear
@pytest.mark.usefixtures("rectilinear")
def test_info_verify_and_convert_understand_rectilinear_arrays(tmp_path: Path) -> None:
    source = zarr.storage.LocalStore(tmp_path / "src")
    data = sample(SHAPE, "i4")
    zarr.create_array(source, name="a", shape=SHAPE, chunks=EDGES, dtype="i4", fill_value=0)[:] = data
    report = convert(ShardingStore(source), ShardingStore(str(tmp_path / "dst"), (2, 2)))
    assert (report.chunks, report.shards_written) == (12, 4)
    dst = ShardingStore(str(tmp_path / "dst"))
    np.testing.assert_array_equal(zarr.open_array(dst, path="a")[:], data)
    (found,) = info(dst)
    assert (found.grid_chunks, found.chunks, found.shards, found.chunks_per_shard) == (12, 12, 4, [2, 2])
    assert verify(dst, decode=True) == {}
    # a chunk that does not decode is found in its own region
    raw = dst.internals.raw
    damaged = bytearray(asyncio_get(raw, "a/c/1/1"))
    damaged[0] ^= 0xFF  # the first chunk's first byte (zstd frame magic)
    asyncio_set(raw, "a/c/1/1", bytes(damaged))
    # the shard holds chunks (2, 2) and (3, 2): the grid has three columns
    assert set(verify(ShardingStore(str(tmp_path / "dst")), decode=True)) in ({"a/c/2/2"}, {"a/c/3/2"})


def asyncio_get(raw: Any, key: str) -> bytes:
    import asyncio

    value = asyncio.run(raw.get(key))
    assert value is not None
    return bytes(value)


def asyncio_set(raw: Any, key: str, value: bytes) -> None:
    import asyncio

    asyncio.run(raw.set(key, value))


def test_a_zarr_without_rectilinear_grids_is_told_which_zarr_it_needs() -> None:
    """The document is written by hand: any zarr can try to open it."""
    doc = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(SHAPE),
        "data_type": "int32",
        "chunk_grid": rectilinear_grid(EDGES),
        "chunk_key_encoding": {"name": "default"},
        "fill_value": 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
    }
    inner = {"zarr.json": json.dumps({"zarr_format": 3, "node_type": "group"}).encode()}
    inner["a/zarr.json"] = json.dumps(doc).encode()
    store = ShardingStore(inner, None)
    if HAS_RECTILINEAR:
        with zarr.config.set({"array.rectilinear_chunks": True}):
            assert zarr.open_array(store, path="a").shape == SHAPE
    else:
        with pytest.raises(ShardingConfigError, match=r"'a'.*rectilinear.*zarr 3\.2.*installed: zarr 3\.1"):
            zarr.open_array(store, path="a")


@needs_rectilinear
@pytest.mark.usefixtures("rectilinear")
@pytest.mark.parametrize(("layout", "edges"), [("transformer", EDGES), ("codec", [[10, 10, 10], [5] * 5])])
def test_shard_aware_pipeline_over_rectilinear_grids(
    tmp_path: Path, layout: str, edges: list[list[int]]
) -> None:
    from shardstore import PIPELINE_PATH, ShardAwarePipeline

    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        store = ShardingStore(str(tmp_path / "s"), (2, 2), layout=layout)  # type: ignore[arg-type]
        data = _write(store, edges)
        arr = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
        assert isinstance(arr._async_array.codec_pipeline, ShardAwarePipeline)
        np.testing.assert_array_equal(arr[4:21, 7:19], data[4:21, 7:19])
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:], data)


@needs_rectilinear
@pytest.mark.usefixtures("rectilinear")
def test_chunks_of_one_shard_of_different_shapes_but_as_many_elements_read_each_as_its_own(
    tmp_path: Path,
) -> None:
    """Chunks of a shard are decoded together only where they have one shape: a 2x3
    and a 3x2 chunk decode to as many bytes, and must not be read as each other."""
    from shardstore import PIPELINE_PATH

    data = np.arange(25, dtype="i4").reshape(5, 5)
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(
            ShardingStore(str(tmp_path / "s"), (2, 2)), name="a", shape=(5, 5), chunks=[[2, 3], [3, 2]],
            dtype="i4", fill_value=0,
        )  # fmt: skip
        arr[:] = data
        arr = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
        rows, cols = np.array([0, 1, 3, 4]), np.array([0, 2, 3, 4])  # in chunks (0, 0) and (1, 1)
        np.testing.assert_array_equal(arr.get_coordinate_selection((rows, cols)), data[rows, cols])
        np.testing.assert_array_equal(arr.vindex[[0, 3], [0, 4]], data[[0, 3], [0, 4]])
        np.testing.assert_array_equal(arr[:], data)
