"""Metadata handling: the sharding config in array metadata documents.

Stored documents carry the config as a ZEP 2 storage transformer entry, and
beside it a marker codec (v3) or filter (v2) named after shardstore that no
plain reader knows: zarr-python 3.1 honours ``storage_transformers`` only in
``open_array`` (and ignores the key in a v2 ``.zarray``), so without the
marker a plain reader would decode shards as chunks. The documents zarr reads
have both removed and the documents zarr writes get both back. Pure functions
over parsed JSON; the store does the I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeAlias

import numpy as np

from shardstore.choices import Layout
from shardstore.chunk_grids import DimSpec, covering_edges, dim_specs
from shardstore.errors import ShardingConfigError
from shardstore.formats import (
    DEFAULT_TYPE,
    ShardFormat,
    codec_form_of,
    format_from_config,
    format_from_object,
    to_plain_form,
)
from shardstore.keys import ChunkKeyGrammar, join_path

__all__ = [
    "ArrayInfo",
    "ChunksPerShard",
    "Document",
    "ShardingPolicy",
    "array_info",
    "dump_document",
    "inject_sharding",
    "is_metadata_key",
    "load_document",
    "present_document",
    "unreadable_document",
]

Document = dict[str, Any]
"""A parsed JSON metadata document (``zarr.json``, ``.zarray``, ...)."""

V3_NAME = "zarr.json"
V2_ARRAY = ".zarray"
V2_CONSOLIDATED = ".zmetadata"
METADATA_NAMES = frozenset({V3_NAME, V2_ARRAY, ".zgroup", ".zattrs", V2_CONSOLIDATED})
ARRAY_DOC_NAMES = (V3_NAME, V2_ARRAY)
ROOT_DOCUMENTS = (V3_NAME, ".zgroup", V2_ARRAY)
"""One of these at a URL's root makes it a zarr hierarchy."""
DRAFT_DOC = ".array.json"
"""The v3 draft's array document (zarr-python 2.x's experimental v3): the chunks of
the array at ``data/root/<p>`` are described by ``meta/root/<p>.array.json``."""
_DRAFT_DATA, _DRAFT_META = "data/root", "meta/root"

TRANSFORMER_NAME = "sharding"
MARKER = "shardstore.sharding"
"""The name of the codec (v3) or filter (v2) that makes plain readers fail naming
shardstore: zarr-python raises ``Unknown codec: 'shardstore.sharding'`` (v3) or
numcodecs ``codec not available`` (v2) wherever it parses the array's metadata."""
_DRAFT_EXTENSION_SUFFIX = "storage_transformers/sharding/1.0"

ShardingChoice: TypeAlias = Sequence[int] | ShardFormat
"""Chunks per shard (the indexed format), or a shard format itself."""
ChunksPerShard: TypeAlias = (
    ShardingChoice | Mapping[str, ShardingChoice] | Callable[[str, Document], ShardingChoice | None] | None
)


def load_document(raw: bytes) -> Document | None:
    """The JSON object in ``raw``, or None for anything else (passed through untouched)."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def is_metadata_key(key: str) -> bool:
    """Whether ``key`` names a metadata document (of any zarr version)."""
    return key.rpartition("/")[2] in METADATA_NAMES


def unreadable_document(key: str, raw: bytes) -> str | None:
    """Why the metadata document ``key`` cannot be read (None: it is a JSON object, or
    not a metadata document): zarr cannot open what it describes, and shardstore
    cannot tell whether the objects below it are shards or chunks."""
    if not is_metadata_key(key) or load_document(raw) is not None:
        return None
    return (
        f"metadata document {key!r} is not a JSON object ({len(raw)} bytes): zarr cannot open "
        "what it describes, and the objects below it are not known as shards or chunks"
    )


def dump_document(doc: Document) -> bytes:
    return json.dumps(doc, indent=2, allow_nan=True).encode()


def _is_our_entry(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    return entry.get("name") == TRANSFORMER_NAME or str(entry.get("extension", "")).endswith(
        _DRAFT_EXTENSION_SUFFIX
    )


def _format_from_entry(path: str, entry: Document, ndim: int) -> ShardFormat:
    """Read our entry in its own form or the ZEP 2 draft's (type beside configuration)."""
    where = f"array {path or '/'!r}"
    config = entry.get("configuration")
    if not isinstance(config, dict):
        raise ShardingConfigError(f"{where}: sharding transformer has no configuration object")
    kind = config.get("type", entry.get("type", DEFAULT_TYPE))
    return format_from_config(kind, config, where).for_array(path, ndim)


def transformer_entry(fmt: ShardFormat) -> Document:
    """Our transformer entry: the format's own configuration."""
    return {"name": TRANSFORMER_NAME, "configuration": fmt.to_config()}


@dataclass(frozen=True)
class ArrayInfo:
    """What the store needs to know of one array: geometry, key encoding, sharding."""

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    grammar: ChunkKeyGrammar
    shard_format: ShardFormat | None
    codec_sharded: bool = False
    """A ``sharding_indexed`` array passed through untouched: zarr shards it itself
    (it created it through this store), or its inner chunks cannot be served."""
    itemsize: int | None = None
    """Bytes per element where the data type has a fixed size, else None."""
    form: Layout = "transformer"
    """How the sharding is recorded: our transformer entry, or standard codec metadata."""
    passthrough_reason: str | None = None
    """Why a ``sharding_indexed`` array is passed through rather than served."""
    edges: tuple[tuple[int, ...], ...] | None = None
    """A rectilinear grid's chunk edges per dimension, those covering ``shape`` (None:
    a regular grid of ``chunks``, which then holds each dimension's largest edge)."""

    @property
    def nominal_shard_nbytes(self) -> int | None:
        """A full shard's size before compression, where the data type tells it."""
        if self.itemsize is None or self.shard_format is None:
            return None
        return self.shard_format.nominal_nbytes(math.prod(self.chunks) * self.itemsize)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @cached_property
    def grid_shape(self) -> tuple[int, ...]:
        if self.edges is not None:
            return tuple(len(e) for e in self.edges)
        # A zero-length chunk (zarr allows it for zero-length dimensions) holds nothing.
        return tuple(-(-s // c) if c > 0 else 0 for s, c in zip(self.shape, self.chunks, strict=True))

    def chunk_region(self, coords: tuple[int, ...]) -> tuple[slice, ...]:
        """Where the chunk at ``coords`` lies in the array (clipped to its shape)."""
        if self.edges is None:
            starts = [c * n for c, n in zip(coords, self.chunks, strict=True)]
            ends = [s + n for s, n in zip(starts, self.chunks, strict=True)]
        else:
            starts = [sum(e[:c]) for c, e in zip(coords, self.edges, strict=True)]
            ends = [s + e[c] for s, c, e in zip(starts, coords, self.edges, strict=True)]
        return tuple(slice(a, min(b, n)) for a, b, n in zip(starts, ends, self.shape, strict=True))

    @cached_property
    def prefix(self) -> str:
        """Every key of the array starts with this (``""`` for a root array)."""
        return join_path(self.path, "")

    @property
    def chunk_prefix(self) -> str:
        """Every chunk (and shard) key of the array starts with this."""
        return self.prefix + self.grammar.common_prefix(self.ndim)

    @property
    def shard_prefix(self) -> str:
        """Every shard key of the array starts with this: the chunk prefix, or for
        chunks numbered by id the directory below it that the sharding names."""
        directory = "" if self.shard_format is None else self.shard_format.subdirectory
        return f"{self.chunk_prefix}{directory}/" if directory else self.chunk_prefix

    def tail(self, key: str) -> str | None:
        return key[len(self.prefix) :] if key.startswith(self.prefix) else None

    def coords(self, key: str) -> tuple[int, ...] | None:
        """Grid coordinates if ``key`` is one of this array's chunk keys (any position)."""
        tail = self.tail(key)
        return None if tail is None else self.grammar.decode_rank(tail, self.ndim)

    def looks_like_chunk_key(self, key: str) -> bool:
        """Encoded like a chunk key of this array, whatever the rank."""
        tail = self.tail(key)
        return tail is not None and self.grammar.decode(tail) is not None

    def key(self, coords: tuple[int, ...] | list[int]) -> str:
        return self.prefix + self.grammar.encode(coords)

    def in_grid(self, coords: tuple[int, ...]) -> bool:
        return all(0 <= c < g for c, g in zip(coords, self.grid_shape, strict=True))


def _v3_grammar(doc: Document) -> ChunkKeyGrammar | None:
    enc = doc.get("chunk_key_encoding", {"name": "default"})
    name = enc.get("name") if isinstance(enc, dict) else None
    sep = (enc.get("configuration") or {}).get("separator") if isinstance(enc, dict) else None
    if name == "default":
        return ChunkKeyGrammar("default", sep or "/")
    if name == "v2":
        return ChunkKeyGrammar("v2", sep or ".")
    return None


def draft_document_key(path: str) -> str | None:
    """Where the v3 draft keeps the metadata of the array whose chunks are under
    ``path`` (``data/root/g/a`` -> ``meta/root/g/a.array.json``); None if nowhere."""
    if path == _DRAFT_DATA or path.startswith(_DRAFT_DATA + "/"):
        return _DRAFT_META + path[len(_DRAFT_DATA) :] + DRAFT_DOC
    return None


def array_info(path: str, name: str, doc: Document) -> ArrayInfo | None:
    """The array described by a stored metadata document, or None if it is no array we can key.

    Raises ShardingConfigError when the document carries a sharding config that
    is invalid for the array: its shards cannot be read safely.
    """
    try:
        if name == V3_NAME:
            if doc.get("node_type") != "array":
                return None
            grammar = _v3_grammar(doc)
            grid = doc.get("chunk_grid", {})
            chunks = (
                grid.get("configuration", {}).get("chunk_shape") if grid.get("name") == "regular" else None
            )
            specs = dim_specs(grid)
            codec = codec_form_of(doc)
        elif name == V2_ARRAY:
            grammar = ChunkKeyGrammar("v2", doc.get("dimension_separator") or ".")
            chunks, codec, specs = doc.get("chunks"), None, None
        elif name == DRAFT_DOC:
            grid = doc.get("chunk_grid", {})
            grammar = ChunkKeyGrammar("draft", grid.get("separator", "/"))
            regular = grid.get("type", "regular") == "regular"
            chunks, codec, specs = grid.get("chunk_shape") if regular else None, None, None
        else:
            return None
        shape = tuple(int(s) for s in doc["shape"])
        transformers = doc.get("storage_transformers") or []
        edges = None
        if specs is not None and len(specs) == len(shape):
            edges = tuple(covering_edges(s, n) for s, n in zip(specs, shape, strict=True))
            chunks = [max(e, default=_first(s)) for e, s in zip(edges, specs, strict=True)]
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    if grammar is None or chunks is None or grammar.separator not in ("/", "."):
        return None
    chunks = tuple(int(c) for c in chunks)
    if len(chunks) != len(shape):
        return None
    itemsize = _itemsize(doc.get("data_type", doc.get("dtype")))
    ours = [t for t in transformers if _is_our_entry(t)] if isinstance(transformers, list) else []
    if ours:
        fmt = _format_from_entry(path, ours[0], len(shape))
        return ArrayInfo(path, shape, chunks, grammar, fmt, itemsize=itemsize, edges=edges)
    if codec is None:
        return ArrayInfo(path, shape, chunks, grammar, None, itemsize=itemsize, edges=edges)
    if codec.unservable is not None or codec.inner_chunks is None:
        reason = codec.unservable
        return ArrayInfo(
            path, shape, chunks, grammar, None, True, itemsize, passthrough_reason=reason, edges=edges
        )
    return ArrayInfo(path, shape, codec.inner_chunks, grammar, codec.shard_format, False, itemsize, "codec")


def _first(spec: DimSpec) -> int:
    return spec if isinstance(spec, int) else spec[0]


def _itemsize(dtype: object) -> int | None:
    if not isinstance(dtype, str):  # structured and extension types: size unknown
        return None
    try:
        size = np.dtype(dtype).itemsize
    except (TypeError, ValueError):
        return None
    return size or None


def present_document(path: str, name: str, doc: Document, passthrough: Callable[[str], bool]) -> bool:
    """Make ``doc`` (and the array documents consolidated in it) what zarr must see
    above the store, in place: our transformer entries removed, codec-form arrays
    shown as their plain chunks unless ``passthrough(array path)``. True if
    anything changed."""
    changed = name in ARRAY_DOC_NAMES and _present_one(path, doc, passthrough)
    for rel, child in consolidated_arrays(name, doc).items():
        changed |= _present_one(join_path(path, rel), child, passthrough)
    return changed


def _present_one(path: str, doc: Document, passthrough: Callable[[str], bool]) -> bool:
    if _strip_one(doc):
        return True
    form = codec_form_of(doc) if doc.get("node_type") == "array" else None
    if form is None or form.unservable is not None or passthrough(path):
        return False
    plain = to_plain_form(doc, form)
    doc.clear()
    doc.update(plain)
    return True


def _is_v3(doc: Document) -> bool:
    return doc.get("zarr_format") == 3 or "node_type" in doc


def _strip_one(doc: Document) -> bool:
    """Remove our transformer entry and, with it, the marker (a marker alone is left:
    without the config the store cannot serve the array, so zarr had better fail)."""
    transformers = doc.get("storage_transformers")
    if not isinstance(transformers, list) or not any(_is_our_entry(t) for t in transformers):
        return False
    rest = [t for t in transformers if not _is_our_entry(t)]
    if rest or _is_v3(doc):
        doc["storage_transformers"] = rest
    else:  # zarr v2 has no such key: leave the document as zarr wrote it
        del doc["storage_transformers"]
    _remove_marker(doc)
    return True


def _marker_slot(doc: Document) -> tuple[str, str]:
    """Where the marker goes: the list and the entry's name field (v3 codec, v2 filter).
    Last in the list: the first step of decoding, before any codec sees shard bytes."""
    return ("codecs", "name") if _is_v3(doc) else ("filters", "id")


def _unmarked(doc: Document) -> list[Any]:
    key, field = _marker_slot(doc)
    entries = doc.get(key) or []
    return [e for e in entries if not (isinstance(e, dict) and e.get(field) == MARKER)]


def _add_marker(doc: Document) -> None:
    key, field = _marker_slot(doc)
    doc[key] = [*_unmarked(doc), {field: MARKER}]


def _remove_marker(doc: Document) -> None:
    key, _ = _marker_slot(doc)
    rest = _unmarked(doc)
    if len(rest) != len(doc.get(key) or []):
        doc[key] = rest if rest or key == "codecs" else None  # no v2 filters is null


def inject_sharding(doc: Document, fmt: ShardFormat, form: Layout = "transformer") -> None:
    """Record ``fmt`` in a plain array document in place, replacing any earlier
    entry: as our transformer entry plus the marker, or (``form="codec"``, zarr v3
    only) as standard ``sharding_indexed`` metadata, which plain readers are meant
    to read (no marker)."""
    if form == "codec":
        sharded = fmt.codec_document(doc)
        doc.clear()
        doc.update(sharded)
        return
    rest = [t for t in doc.get("storage_transformers") or [] if not _is_our_entry(t)]
    doc["storage_transformers"] = [transformer_entry(fmt), *rest]
    _add_marker(doc)


def consolidated_arrays(name: str, doc: Document) -> dict[str, Document]:
    """Array documents inside consolidated metadata, by array path relative to the group."""
    if name == V3_NAME:
        meta = doc.get("consolidated_metadata")
        entries = meta.get("metadata") if isinstance(meta, dict) else None
        if not isinstance(entries, dict):
            return {}
        return {p: d for p, d in entries.items() if isinstance(d, dict) and d.get("node_type") == "array"}
    if name == V2_CONSOLIDATED:
        entries = doc.get("metadata")
        if not isinstance(entries, dict):
            return {}
        suffix = "/" + V2_ARRAY
        return {
            ("" if k == V2_ARRAY else k[: -len(suffix)]): d
            for k, d in entries.items()
            if isinstance(d, dict) and (k == V2_ARRAY or k.endswith(suffix))
        }
    return {}


@dataclass(frozen=True)
class ShardingPolicy:
    """Decides the sharding of arrays created through the store (never of existing ones)."""

    chunks_per_shard: ChunksPerShard = None
    index_location: str = "end"
    index_checksum: bool = False

    def __post_init__(self) -> None:
        cps = self.chunks_per_shard
        if isinstance(cps, np.ndarray) and cps.ndim == 1:  # (computed with numpy)
            cps = cps.tolist()
            object.__setattr__(self, "chunks_per_shard", cps)
        ok = (
            cps is None
            or isinstance(cps, ShardFormat)
            or callable(cps)
            or isinstance(cps, Mapping)
            or (isinstance(cps, Sequence) and not isinstance(cps, str | bytes))
        )
        if not ok:
            raise ShardingConfigError(
                f"chunks_per_shard must be a sequence of ints, a shard format, a mapping from array "
                f"path to either, a callable or None, not {type(cps).__name__}"
            )
        if self.index_location not in ("start", "end"):
            raise ShardingConfigError(f"index_location must be 'start' or 'end', not {self.index_location!r}")
        if isinstance(cps, Sequence) and not isinstance(cps, str | bytes):
            object.__setattr__(self, "chunks_per_shard", tuple(cps))  # (4, 4) == [4, 4]
        if isinstance(cps, Mapping) and "@type" in cps:  # a format's own JSON object, not paths
            object.__setattr__(self, "chunks_per_shard", format_from_object(cps, "chunks_per_shard"))

    def names(self, path: str) -> bool:
        """Whether the user asked for this array by path (a mapping entry)."""
        cps = self.chunks_per_shard
        return isinstance(cps, Mapping) and any(k.strip("/") == path for k in cps)

    def format_for(self, path: str, doc: Document, ndim: int) -> ShardFormat | None:
        cps = self.chunks_per_shard
        if cps is None:
            return None
        if isinstance(cps, ShardFormat):  # one of grid blocks, as a sequence: its rank only
            same_rank = cps.grid_block is None or len(cps.grid_block) == ndim
            chosen: Any = cps if same_rank else None
        elif callable(cps):
            try:
                chosen = cps(path, doc)
            except Exception as exc:  # (the user's function: said as a configuration error)
                raise ShardingConfigError(
                    f"array {path or '/'!r}: chunks_per_shard({path!r}, metadata) raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        elif isinstance(cps, Mapping):
            chosen = next((v for k, v in cps.items() if k.strip("/") == path), None)
        else:
            chosen = cps if len(cps) == ndim else None  # other ranks stay unsharded
        if chosen is None:
            return None
        if isinstance(chosen, Mapping):  # a format's own JSON object as a mapping value
            chosen = format_from_object(chosen, f"array {path or '/'!r}: chunks_per_shard")
        if isinstance(chosen, ShardFormat):
            return chosen.for_array(path, ndim)
        if isinstance(chosen, str | bytes) or not isinstance(chosen, Sequence):
            raise ShardingConfigError(f"array {path or '/'!r}: chunks_per_shard {chosen!r} is not a sequence")
        where = f"array {path or '/'!r}"
        config = {
            "chunks_per_shard": list(chosen),
            "index_location": self.index_location,
            "index_checksum": self.index_checksum,
        }
        return format_from_config(DEFAULT_TYPE, config, where).for_array(path, ndim)
