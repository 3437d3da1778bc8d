"""Shard formats: how one shard object holds its chunks and finds them again.

``base`` is the interface every format implements (:class:`ShardFormat`), and
``findings`` what they share in naming damage. Each format is a wing, a package
of its own: ``indexed`` (ZEP 2 / ``sharding_indexed``) and ``precomputed``
(neuroglancer's ``neuroglancer_uint64_sharded_v1``). :data:`FORMATS` is the
registry: metadata names a format by its ``type`` and gets its class here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardstore.errors import ShardingConfigError
from shardstore.formats.base import ShardFormat
from shardstore.formats.indexed import IndexedFormat
from shardstore.formats.precomputed import PrecomputedSharding

__all__ = ["FORMATS", "ShardFormat", "format_from_config"]

FORMATS: dict[str, type[ShardFormat]] = {cls.type_name: cls for cls in (IndexedFormat, PrecomputedSharding)}
"""Every shard format by the ``type`` that names it in a configuration."""


def format_from_config(kind: Any, config: Mapping[str, Any], where: str) -> ShardFormat:
    """The format a configuration of type ``kind`` describes; ShardingConfigError
    naming ``where`` for a type no wing implements."""
    cls = FORMATS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ShardingConfigError(f"{where}: unknown shard format type {kind!r} (known: {sorted(FORMATS)})")
    return cls.from_config(config, where)
