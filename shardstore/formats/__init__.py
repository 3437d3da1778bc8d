"""Shard formats: how one shard object holds its chunks and finds them again. Pure:
the ground floor of the package, no I/O.

``base`` is the interface every format implements (:class:`ShardFormat`: the
object's layout, where its index parts are, how a zarr array's grid maps onto
shards, whether a resize renumbers chunks), and ``findings`` what formats share in
naming damage. Each format is a package of its own: ``indexed`` (ZEP 2 /
``sharding_indexed``, with zarr's codec form of its metadata) and ``precomputed``
(neuroglancer's ``neuroglancer_uint64_sharded_v1``). :data:`FORMATS` is the
registry: metadata names a format by its ``type`` and gets its class here, and
:func:`codec_form_of` reads the standard ``sharding_indexed`` codec form of an
array document (written by any tool) as the format it describes. Nothing outside
this package asks which format it has: it asks the format.

May import: ``errors``, ``chunk_grids`` and numpy; nothing else of shardstore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from shardstore.errors import ShardingConfigError
from shardstore.formats.base import ShardFormat
from shardstore.formats.indexed import IndexedFormat
from shardstore.formats.indexed.codec_form import CodecForm, parse_codec_form, to_plain_form
from shardstore.formats.precomputed import PrecomputedSharding

__all__ = [
    "DEFAULT_TYPE",
    "FORMATS",
    "CodecForm",
    "ShardFormat",
    "codec_form_of",
    "format_from_config",
    "format_from_object",
    "to_plain_form",
]

FORMATS: dict[str, type[ShardFormat]] = {cls.type_name: cls for cls in (IndexedFormat, PrecomputedSharding)}
"""Every shard format by the ``type`` that names it in a configuration."""
DEFAULT_TYPE = IndexedFormat.type_name
"""The format of a configuration that names none (ZEP 2's transformer has one)."""


def format_from_config(kind: Any, config: Mapping[str, Any], where: str) -> ShardFormat:
    """The format a configuration of type ``kind`` describes; ShardingConfigError
    naming ``where`` for a type no wing implements."""
    cls = FORMATS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ShardingConfigError(f"{where}: unknown shard format type {kind!r} (known: {sorted(FORMATS)})")
    return cls.from_config(config, where)


def format_from_object(obj: Mapping[str, Any], where: str) -> ShardFormat:
    """The format a JSON object of its own describes, naming its type by ``@type`` (a
    neuroglancer ``sharding`` object); ShardingConfigError naming ``where``."""
    return format_from_config(obj.get("@type"), obj, where)


def codec_form_of(doc: Mapping[str, Any]) -> CodecForm | None:
    """None unless ``doc`` is a zarr v3 array whose codecs are the standard sharding
    codec; else its inner geometry with the shard format its index configuration
    describes, or the reason its inner chunks cannot be served as byte ranges."""
    form = parse_codec_form(dict(doc))
    if form is None or form.index is None:
        return form
    try:
        return replace(form, shard_format=IndexedFormat.from_config(form.index, "the sharding codec"))
    except ShardingConfigError as exc:
        return CodecForm(unservable=str(exc))
