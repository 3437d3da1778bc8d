"""The configuration of the neuroglancer precomputed sharded format
(``neuroglancer_uint64_sharded_v1``): its ``sharding`` JSON object, checked, as a
:class:`~shardstore.formats.base.ShardFormat`. Pure, no I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Final, cast

import numpy as np
import numpy.typing as npt
from zarr.abc.store import ByteRequest, RangeByteRequest

from shardstore.errors import ShardingConfigError
from shardstore.formats.base import ChunkTable, ShardFormat, TableFigures
from shardstore.formats.precomputed.ids import (
    compressed_morton_code,
    locate_ids,
    morton_positions,
    renumber,
    renumbered,
    shard_file_name,
    shard_number_of_name,
)
from shardstore.formats.precomputed.params import Encoding, HashName, ShardingParams
from shardstore.formats.precomputed.shard_file import (
    build_shard,
    decode_minishard_index,
    minishard_index_range,
    parse_shard,
    shard_problems,
    split_shard,
)

__all__ = ["MAX_MINISHARD_BITS", "TYPE_NAME", "Encoding", "HashName", "PrecomputedSharding"]

TYPE_NAME: Final = "neuroglancer_uint64_sharded_v1"
_HASHES: Final = ("identity", "murmurhash3_x86_128")
_ENCODINGS: Final = ("raw", "gzip")
_BITS_FIELDS: Final = ("preshift_bits", "minishard_bits", "shard_bits")
_FIELDS: Final = ("@type", *_BITS_FIELDS, "hash", "minishard_index_encoding", "data_encoding")

MAX_MINISHARD_BITS: Final = 32
"""tensorstore's limit: a shard index of ``2**32`` entries is already 64 GiB."""
_DIRECTORY: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


# -- configuration -----------------------------------------------------------------


def _check_fields(obj: Mapping[Any, Any], where: str) -> None:
    """Refuse anything tensorstore or neuroglancer would not read as this sharding."""
    unknown = [k for k in obj if k not in _FIELDS]
    if unknown:
        k = unknown[0]
        raise ShardingConfigError(
            f"{where}: unknown field {k!r} (value {obj[k]!r}); "
            f"a {TYPE_NAME} sharding has only {list(_FIELDS)}"
        )
    if obj.get("@type") != TYPE_NAME:
        found = repr(obj["@type"]) if "@type" in obj else "missing"
        raise ShardingConfigError(f"{where}: field '@type' is {found}, expected {TYPE_NAME!r}")
    bits: dict[str, int] = {}
    for name in _BITS_FIELDS:
        if name not in obj:
            raise ShardingConfigError(f"{where}: field {name!r} is missing (an integer from 0 to 64)")
        value = obj[name]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 64:
            raise ShardingConfigError(f"{where}: field {name!r} is {value!r}, not an integer from 0 to 64")
        bits[name] = value
    if bits["minishard_bits"] > MAX_MINISHARD_BITS:
        raise ShardingConfigError(
            f"{where}: field 'minishard_bits' is {bits['minishard_bits']}, more than {MAX_MINISHARD_BITS} "
            f"(a shard index of 16 * 2**{bits['minishard_bits']} bytes cannot be held)"
        )
    if sum(bits.values()) > 64:
        raise ShardingConfigError(
            f"{where}: fields preshift_bits + minishard_bits + shard_bits are "
            f"{' + '.join(str(v) for v in bits.values())} = {sum(bits.values())}, "
            "more than the 64 bits of a chunk id"
        )
    if "hash" not in obj:
        raise ShardingConfigError(f"{where}: field 'hash' is missing (one of {list(_HASHES)})")
    if obj["hash"] not in _HASHES:
        raise ShardingConfigError(f"{where}: field 'hash' is {obj['hash']!r}, not one of {list(_HASHES)}")
    for name in ("minishard_index_encoding", "data_encoding"):
        if name in obj and obj[name] not in _ENCODINGS:
            raise ShardingConfigError(
                f"{where}: field {name!r} is {obj[name]!r}, not one of {list(_ENCODINGS)}"
            )


@dataclass(frozen=True)
class PrecomputedSharding(ShardingParams, ShardFormat):
    """The ``sharding`` object of a neuroglancer precomputed scale (or kvstore metadata),
    checked, as a :class:`~shardstore.formats.base.ShardFormat`: chunks are uint64 ids,
    their bytes raw (the format applies ``data_encoding`` itself)."""

    type_name: ClassVar[str] = TYPE_NAME

    directory: str = ""
    """Where a zarr array's shard files are, below its chunk prefix ("": there
    itself). A resize that renumbers the chunks writes them to a new directory, and
    the metadata naming it is the commit: not part of the neuroglancer format."""

    def __post_init__(self) -> None:
        _check_fields(self.to_json(), type(self).__name__)
        if self.directory and _DIRECTORY.fullmatch(self.directory) is None:
            raise ShardingConfigError(
                f"{type(self).__name__}: directory {self.directory!r} is not a plain name "
                "(letters, digits, '.', '_' and '-', not starting with '.')"
            )

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "sharding") -> PrecomputedSharding:
        """Read and check a sharding JSON object; ShardingConfigError names ``where``,
        the field and its value. Missing encodings are ``"raw"``; extra keys are refused."""
        if not isinstance(obj, Mapping):
            raise ShardingConfigError(f"{where}: {obj!r} is not a JSON object")
        _check_fields(obj, where)
        return cls(
            preshift_bits=obj["preshift_bits"],
            hash=cast(HashName, obj["hash"]),
            minishard_bits=obj["minishard_bits"],
            shard_bits=obj["shard_bits"],
            minishard_index_encoding=cast(Encoding, obj.get("minishard_index_encoding", "raw")),
            data_encoding=cast(Encoding, obj.get("data_encoding", "raw")),
        )

    def to_json(self) -> dict[str, Any]:
        """As tensorstore writes it: ``@type`` and every field, defaults included."""
        return {
            "@type": TYPE_NAME,
            "preshift_bits": self.preshift_bits,
            "hash": self.hash,
            "minishard_bits": self.minishard_bits,
            "shard_bits": self.shard_bits,
            "minishard_index_encoding": self.minishard_index_encoding,
            "data_encoding": self.data_encoding,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> PrecomputedSharding:
        """The sharding object, its ``@type`` spelled ``type`` as in a ZEP 2 storage
        transformer configuration (``@type`` is accepted too), and the ``directory``
        of the shard files if they are not in the chunk prefix itself."""
        obj = dict(config)
        if "type" in obj:
            obj.setdefault("@type", obj.pop("type"))
        directory = obj.pop("directory", "")
        if not isinstance(directory, str):
            raise ShardingConfigError(f"{where}: field 'directory' is {directory!r}, not a string")
        sharding = cls.from_json(obj, where)
        try:
            return replace(sharding, directory=directory)
        except ShardingConfigError as exc:
            raise ShardingConfigError(f"{where}: {exc}") from None

    places_follow_grid: ClassVar[bool] = True

    def renumbers(self, old_grid: tuple[int, ...], new_grid: tuple[int, ...]) -> bool:
        return renumbered(old_grid, new_grid)

    def renumbered(
        self, places: npt.NDArray[np.uint64], old_grid: tuple[int, ...], new_grid: tuple[int, ...]
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.uint64]]:
        return renumber(places, old_grid, new_grid)

    @property
    def subdirectory(self) -> str:
        return self.directory

    def in_subdirectory(self, directory: str) -> PrecomputedSharding:
        return replace(self, directory=directory)

    def shards_of(self, places: Sequence[int]) -> list[tuple[int, ...]]:
        shards, _ = locate_ids(self, np.asarray(places, dtype=np.uint64))
        return [(int(s),) for s in shards.tolist()]

    def for_array(self, path: str, ndim: int) -> PrecomputedSharding:
        """This format, if it can hold a zarr array's chunks: zarr's codecs encode them, so the
        format stores them as they are (``data_encoding: "raw"``)."""
        if self.data_encoding != "raw":
            raise ShardingConfigError(
                f"array {path or '/'!r}: a zarr array in the {self.type_name} format needs "
                f'data_encoding "raw" (zarr\'s codecs compress its chunks), not {self.data_encoding!r}'
            )
        return self

    def to_config(self) -> dict[str, Any]:
        obj = self.to_json()
        directory = {"directory": self.directory} if self.directory else {}
        return {"type": obj.pop("@type"), **obj, **directory}

    def parse(self, blob: bytes | memoryview, key: str) -> dict[int, tuple[int, int]]:
        """Where each chunk's stored bytes lie in a whole shard file, checked."""
        return parse_shard(self, blob, key)

    # -- key mapping: chunk ids by compressed Morton code, shard files by hash -----

    def locate(self, coords: tuple[int, ...], grid_shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        chunk_id = compressed_morton_code(np.array([coords]), grid_shape)
        return (int(locate_ids(self, chunk_id)[0][0]),), int(chunk_id[0])

    named_shards: ClassVar[bool] = True

    def shard_file(self, shard: tuple[int, ...]) -> str:
        return shard_file_name(self, shard[0])

    def shard_of_file(self, name: str) -> tuple[int, ...] | None:
        number = shard_number_of_name(self, name)
        return None if number is None else (number,)

    def members(
        self, table: ChunkTable, shard: tuple[int, ...], grid_shape: tuple[int, ...]
    ) -> list[tuple[int, tuple[int, ...]]]:
        ids = np.fromiter(table, dtype=np.uint64, count=len(table))
        coords = morton_positions(ids, grid_shape)
        inside = np.all(coords < np.asarray(grid_shape, dtype=np.int64), axis=1)
        return sorted(
            (i, tuple(c)) for i, c in zip(ids[inside].tolist(), coords[inside].tolist(), strict=True)
        )

    def index_request(self) -> ByteRequest:
        """The shard index: the first-level index, at the start of every shard file."""
        return RangeByteRequest(0, self.shard_index_nbytes)

    # -- the table, a minishard at a time --------------------------------------------

    one_index: ClassVar[bool] = False

    def index_parts(self, places: Sequence[int]) -> list[int]:
        """The minishard of each chunk id."""
        _, minishards = locate_ids(self, np.asarray(places, dtype=np.uint64))
        return [int(m) for m in minishards.tolist()]

    def part_request(self, part: int) -> RangeByteRequest:
        """The minishard's 16-byte entry in the shard index."""
        return RangeByteRequest(16 * part, 16 * part + 16)

    def read_part(self, part: int, raw: bytes | memoryview, key: str) -> ChunkTable | RangeByteRequest:
        """Where the minishard's index lies (an empty minishard: an empty table)."""
        where = minishard_index_range(self, raw, part, key)
        return RangeByteRequest(where.start, where.stop) if len(where) else {}

    def decode_part(self, part: int, raw: bytes | memoryview, key: str) -> dict[int, tuple[int, int]]:
        rows = decode_minishard_index(self, raw, key)
        return {int(i): (int(o), int(n)) for i, o, n in rows.tolist()}

    def table_places(self, table: ChunkTable) -> npt.NDArray[np.uint64]:
        return np.array(sorted(table), dtype=np.uint64)

    def check_table(self, table: ChunkTable, nbytes: int, key: str) -> None:
        """(Minishard ranges are checked as they are read.)"""

    def table_figures(self, table: ChunkTable, nbytes: int) -> TableFigures:
        """Rebuilt whole on every write: nothing is dead."""
        assert isinstance(table, dict)
        return TableFigures(len(table), sum(n for _, n in table.values()), 0)

    def build(self, chunks: Mapping[int, bytes | memoryview]) -> bytes:
        return build_shard(self, chunks)

    def split(self, blob: bytes, key: str) -> dict[int, bytes]:
        return split_shard(self, blob, key)

    def problems(self, blob: bytes, key: str, chunk_nbytes: int | None = None) -> list[str]:
        return shard_problems(self, blob, key)
