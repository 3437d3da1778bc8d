"""The chunk grid of a v3 array document: regular, or rectilinear (zarr 3.2+).

A regular grid has one chunk shape. A rectilinear grid (``"rectilinear"``,
``kind: "inline"``) gives, per dimension, either one edge length repeated
over the whole extent or a list of edge lengths whose items may be
run-length pairs ``[length, count]``; the edges may run past the extent.
Chunk grid coordinates are integers either way, so chunk keys group into
shards by floor division just the same: only a chunk's place and size in the
array need the edges. Pure functions on parsed JSON.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from shardstore.errors import ShardingConfigError

__all__ = [
    "RECTILINEAR",
    "RECTILINEAR_ZARR",
    "DimSpec",
    "check_rectilinear_supported",
    "covering_edges",
    "dim_specs",
    "is_rectilinear",
    "rectilinear_grid",
    "uniform_edge",
]

RECTILINEAR = "rectilinear"
RECTILINEAR_ZARR = "3.2"
"""The first zarr release that reads and writes rectilinear chunk grids."""

DimSpec = int | tuple[int, ...]
"""One dimension of a rectilinear grid: a repeated edge length, or the explicit edges."""


def _positive(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"a chunk edge length must be a positive integer, not {value!r}")
    return value


def _expand(items: list[Any] | tuple[Any, ...]) -> tuple[int, ...]:
    edges: list[int] = []
    for item in items:
        if isinstance(item, list):
            if len(item) != 2:
                raise ValueError(f"a run of chunk edges is [length, count], not {item!r}")
            edges.extend([_positive(item[0])] * _positive(item[1]))
        else:
            edges.append(_positive(item))
    if not edges:
        raise ValueError("a dimension without chunk edges")
    return tuple(edges)


def is_rectilinear(grid: Any) -> bool:
    return isinstance(grid, dict) and grid.get("name") == RECTILINEAR


def dim_specs(grid: Any) -> tuple[DimSpec, ...] | None:
    """The dimensions of a rectilinear ``chunk_grid`` entry, runs expanded; None if
    ``grid`` is no rectilinear grid. Raises ValueError if it is a malformed one."""
    if not is_rectilinear(grid):
        return None
    config = grid.get("configuration")
    if not isinstance(config, dict) or config.get("kind", "inline") != "inline":
        raise ValueError(f"a rectilinear chunk grid of an unknown kind: {config!r}")
    shapes = config.get("chunk_shapes")
    if not isinstance(shapes, list | tuple):
        raise ValueError(f"rectilinear chunk_shapes must be a list, not {shapes!r}")
    return tuple(_expand(s) if isinstance(s, list | tuple) else _positive(s) for s in shapes)


def covering_edges(spec: DimSpec, extent: int) -> tuple[int, ...]:
    """The edges of the chunks that hold the ``extent`` elements of one dimension."""
    if isinstance(spec, int):
        return (spec,) * math.ceil(extent / spec)
    ends = list(itertools.accumulate(spec))
    if extent > ends[-1]:
        raise ValueError(f"chunk edges {list(spec)} cover {ends[-1]} elements, not the extent {extent}")
    count = next(i + 1 for i, end in enumerate(ends) if end >= extent) if extent else 0
    return spec[:count]


def uniform_edge(spec: DimSpec, extent: int) -> int | None:
    """The one edge length of a dimension whose covering chunks are all that long."""
    if isinstance(spec, int):
        return spec
    edges = set(covering_edges(spec, extent)) or {spec[0]}
    return edges.pop() if len(edges) == 1 else None


def rectilinear_grid(specs: list[int | list[Any]]) -> dict[str, Any]:
    """A rectilinear ``chunk_grid`` entry (dimensions as JSON: an int, or edges/runs)."""
    return {"name": RECTILINEAR, "configuration": {"kind": "inline", "chunk_shapes": specs}}


def check_rectilinear_supported(path: str, version: str) -> None:
    """Refuse a rectilinear grid where zarr ``version`` cannot read one."""
    if _version_tuple(version) < _version_tuple(RECTILINEAR_ZARR):
        raise ShardingConfigError(
            f"array {path or '/'!r} has a rectilinear chunk grid, which needs zarr {RECTILINEAR_ZARR} "
            f"or later (installed: zarr {version}; zarr {RECTILINEAR_ZARR}+ needs Python 3.12+)"
        )


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in itertools.takewhile(str.isdigit, version.split(".")[:2]))
