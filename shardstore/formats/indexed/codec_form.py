"""The ``sharding_indexed`` codec form of an array's metadata (layout "codec").

Our shards are byte for byte the ``sharding_indexed`` codec v1.0 format, so
one array can be described two ways: as a plain chunked array with our
storage transformer (layout "transformer"), or as standard zarr v3 metadata
whose only codec is ``sharding_indexed`` (outer chunk = shard, inner chunk =
zarr's chunk), which zarr-python, tensorstore and zarrs read without
shardstore. These pure functions convert between the forms and decide
whether a codec-form document, written by any tool, can be served as plain
chunks: only when each inner chunk is a byte range of the shard, that is,
when ``sharding_indexed`` is the array's only codec and its index is in a
format we read (the index configuration is checked where it becomes a format:
``shardstore.formats.codec_form_of``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from shardstore.chunk_grids import DimSpec, covering_edges, dim_specs, rectilinear_grid, uniform_edge
from shardstore.errors import ShardingConfigError
from shardstore.formats.base import ShardFormat

__all__ = [
    "SHARDING_CODEC",
    "CodecForm",
    "codec_layout_problem",
    "is_codec",
    "parse_codec_form",
    "to_codec_form",
    "to_plain_form",
]

Document = dict[str, Any]
"""A parsed JSON metadata document (``zarr.json``, ``.zarray``, ...)."""
SHARDING_CODEC = "sharding_indexed"
_DEFAULT_INDEX_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]


@dataclass(frozen=True)
class CodecForm:
    """What a ``sharding_indexed`` array document says, or why it cannot be served."""

    inner_chunks: tuple[int, ...] | None = None
    index: Document | None = None
    """The shard index's configuration (chunks per shard, location, codecs)."""
    inner_codecs: list[Any] | None = None
    unservable: str | None = None
    """Why the array's inner chunks are not byte ranges we can serve (None: they are)."""
    shard_format: ShardFormat | None = None
    """The format that configuration describes, once checked."""


def is_codec(entry: Any, name: str) -> bool:
    return entry == name or (isinstance(entry, dict) and entry.get("name") == name)


def _config(entry: Any) -> Document:
    config = entry.get("configuration") if isinstance(entry, dict) else None
    return config if isinstance(config, dict) else {}


def parse_codec_form(doc: Document) -> CodecForm | None:
    """None unless ``doc`` is a v3 array using the sharding codec; else its inner
    geometry and shard layout, or the reason it cannot be served as plain chunks."""
    codecs = doc.get("codecs")
    if not isinstance(codecs, list) or not any(is_codec(c, SHARDING_CODEC) for c in codecs):
        return None
    if len(codecs) != 1:
        return CodecForm(
            unservable="sharding_indexed is not the array's only codec (an array-to-array codec "
            "before it or a bytes-to-bytes codec after it changes what an inner chunk's bytes are)"
        )
    config = _config(codecs[0])
    inner_codecs = config.get("codecs")
    grid = doc.get("chunk_grid")
    try:
        shard_shape = _config(grid).get("chunk_shape") if is_codec(grid, "regular") else _uniform_shape(doc)
    except (TypeError, ValueError):
        shard_shape = None
    inner = config.get("chunk_shape")
    if not (isinstance(shard_shape, list) and isinstance(inner, list) and len(inner) == len(shard_shape)):
        return CodecForm(
            unservable="the sharding codec's chunk_shape does not match a regular chunk grid (or a "
            "rectilinear one whose shards along each dimension are all one size)"
        )
    if not all(isinstance(c, int) and c > 0 for c in inner) or any(
        s % c for s, c in zip(shard_shape, inner, strict=True)
    ):
        return CodecForm(
            unservable=f"inner chunk_shape {inner} does not divide the shard shape {shard_shape}"
        )
    if not isinstance(inner_codecs, list) or any(is_codec(c, SHARDING_CODEC) for c in inner_codecs):
        return CodecForm(unservable="nested sharding (a sharding codec inside the sharding codec)")
    cps = [s // c for s, c in zip(shard_shape, inner, strict=True)]
    index = {
        "chunks_per_shard": cps,
        "index_location": config.get("index_location", "end"),
        # missing means [bytes, crc32c]: zarr-python's reading of such documents
        "index_codecs": config.get("index_codecs", _DEFAULT_INDEX_CODECS),
    }
    return CodecForm(tuple(inner), index, inner_codecs)


def _specs(doc: Document) -> list[tuple[DimSpec, int]] | None:
    """A rectilinear grid's dimensions with their extents (None: not rectilinear)."""
    specs = dim_specs(doc.get("chunk_grid"))
    if specs is None:
        return None
    shape = [int(n) for n in doc["shape"]]
    if len(specs) != len(shape):
        raise ValueError(f"a rectilinear grid of {len(specs)} dimensions for the shape {shape}")
    return list(zip(specs, shape, strict=True))


def _uniform_shape(doc: Document) -> list[int] | None:
    """The one chunk size of each dimension of a rectilinear grid, if it has one."""
    specs = _specs(doc)
    if specs is None:
        return None
    sizes = [uniform_edge(spec, n) for spec, n in specs]
    return None if None in sizes else [int(s) for s in sizes if s is not None]


def _grid_of(doc: Document, sizes: list[int]) -> dict[str, Any]:
    """``doc``'s rectilinear grid remade of chunks ``sizes``: a dimension given as one
    repeated size stays so; one given as edges lists as many as cover the extent."""
    dims: list[int | list[Any]] = [
        size if isinstance(spec, int) else [[size, max(-(-n // size), 1)]]
        for (spec, n), size in zip(_specs(doc) or [], sizes, strict=True)
    ]
    return rectilinear_grid(dims)


def codec_layout_problem(doc: Document) -> str | None:
    """Why a plain array document cannot take the codec layout (None: it can). zarr's
    codec has one inner chunk shape: a rectilinear grid must be one size per dimension."""
    try:
        specs = _specs(doc)
    except (KeyError, TypeError, ValueError) as exc:
        return f"has a malformed rectilinear chunk grid: {exc}"
    for axis, (spec, n) in enumerate(specs or []):
        if uniform_edge(spec, n) is None:
            return (
                f"needs chunks of one size along each dimension (the sharding codec has one inner "
                f"chunk shape), and dimension {axis} of its rectilinear grid has chunk edges "
                f"{sorted(set(covering_edges(spec, n)))}"
            )
    return None


def to_plain_form(doc: Document, form: CodecForm) -> Document:
    """The plain chunked array zarr sees above the store: inner chunks, inner codecs
    (a rectilinear grid of shards shows its chunks as a rectilinear grid)."""
    assert form.inner_chunks is not None and form.inner_codecs is not None
    plain = copy.deepcopy(doc)
    inner = list(form.inner_chunks)
    if is_codec(doc.get("chunk_grid"), "regular"):
        plain["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": inner}}
    else:
        plain["chunk_grid"] = _grid_of(doc, inner)
    plain["codecs"] = copy.deepcopy(form.inner_codecs)
    return plain


def to_codec_form(doc: Document, index: Document) -> Document:
    """Standard ``sharding_indexed`` metadata for a plain v3 array document, its shard
    index as ``index`` configures it (chunks per shard, location, codecs); raises
    ShardingConfigError if :func:`codec_layout_problem` finds one."""
    problem = codec_layout_problem(doc)
    if problem is not None:
        raise ShardingConfigError(f"an array stored in the codec layout {problem}")
    uniform = _uniform_shape(doc)
    inner = uniform if uniform is not None else list(_config(doc.get("chunk_grid")).get("chunk_shape") or [])
    sharded = copy.deepcopy(doc)
    cps = list(index["chunks_per_shard"])
    shard_shape = [c * n for c, n in zip(inner, cps, strict=True)]
    if uniform is None:
        sharded["chunk_grid"] = {"name": "regular", "configuration": {"chunk_shape": shard_shape}}
    else:
        sharded["chunk_grid"] = _grid_of(doc, shard_shape)
    sharded["codecs"] = [
        {
            "name": SHARDING_CODEC,
            "configuration": {
                "chunk_shape": inner,
                "codecs": copy.deepcopy(doc.get("codecs") or []),
                "index_codecs": index["index_codecs"],
                "index_location": index["index_location"],
            },
        }
    ]
    return sharded
