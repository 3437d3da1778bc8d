"""PrecomputedVolume: read a neuroglancer precomputed volume (``info`` file plus
scales) chunk by chunk, as tensorstore's ``neuroglancer_precomputed`` driver does.

The ``info`` file at the volume's root is a ``neuroglancer_multiscale_volume``:
``data_type``, ``num_channels``, ``type`` and ``scales``, each scale with its
``key`` (a directory below the root), ``size``, ``voxel_offset``,
``chunk_sizes``, ``encoding``, ``resolution`` and optionally ``sharding``.

A scale's chunks are numbered by their compressed Morton code (x bits first) in
the grid of ``ceil(size / chunk_size)`` chunks; sharded scales keep them in
``<shard>.shard`` files read through :class:`~shardstore.PrecomputedShardedStore`,
unsharded ones in files named ``{x0}-{x1}_{y0}-{y1}_{z0}-{z1}`` by absolute voxel
bounds. A ``raw`` chunk is a little-endian C-order ``[channel, z, y, x]`` array
(x fastest) clipped to the volume: a chunk at the upper edge stores only the
voxels inside it, and any other byte count is damage (tensorstore refuses it too).

Arrays come back with tensorstore's axis order ``[x, y, z, channel]``, and regions
are given in tensorstore's absolute voxel coordinates: the volume spans
``[voxel_offset, voxel_offset + size)`` on each axis. Voxels of absent chunks read
as 0, tensorstore's fill value for this driver.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from zarr.core.sync import sync

from shardstore.errors import ShardFormatError, ShardingConfigError
from shardstore.formats.precomputed import PrecomputedSharding, compressed_morton_code
from shardstore.inner import InnerStore, adapt
from shardstore.inner.base import failure
from shardstore.inner.subdirectory import SubdirectoryInner
from shardstore.neuroglancer.store import PrecomputedShardedStore

__all__ = ["PrecomputedScale", "PrecomputedVolume", "scale_directory"]

INFO_KEY: Final = "info"
VOLUME_TYPE: Final = "neuroglancer_multiscale_volume"
DATA_TYPES: Final = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "float32")
"""The data types tensorstore's driver accepts."""
ENCODINGS: Final = ("raw", "jpeg", "png", "compressed_segmentation")
"""The chunk encodings of the format; only ``raw`` is read here."""
SUPPORTED_ENCODINGS: Final = ("raw",)
AXES: Final = ("x", "y", "z")

Triple = tuple[int, int, int]
Region = tuple[slice, slice, slice]


# -- the info file ---------------------------------------------------------------------


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _triple(obj: Mapping[str, Any], name: str, where: str, *, low: int | None) -> Triple:
    value = obj[name]
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(_integer(v) and (low is None or v >= low) for v in value)
    ):
        kind = "integers" if low is None else f"integers >= {low}"
        raise ShardingConfigError(f"{where}: field {name!r} is {value!r}, not a list of 3 {kind}")
    return (value[0], value[1], value[2])


def _required(obj: Mapping[str, Any], name: str, where: str, what: str) -> Any:
    if name not in obj:
        raise ShardingConfigError(f"{where}: field {name!r} is missing ({what})")
    return obj[name]


@dataclass(frozen=True)
class _ScaleInfo:
    """One entry of ``scales``, checked (the encoding only for its type)."""

    index: int
    key: str
    size: Triple
    voxel_offset: Triple
    chunk_sizes: tuple[Triple, ...]
    encoding: str
    resolution: tuple[float, float, float]
    sharding: PrecomputedSharding | None


def _check_scale_key(key: Any, where: str) -> str:
    if not isinstance(key, str) or not key:
        raise ShardingConfigError(f"{where}: field 'key' is {key!r}, not a non-empty string")
    if key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        raise ShardingConfigError(
            f"{where}: field 'key' is {key!r}: only plain relative paths below the volume "
            "(no '.', '..', empty segments or leading '/') are read"
        )
    return key


def scale_directory(obj: Any, index: int, info: str = "info") -> tuple[str, PrecomputedSharding | None]:
    """Where scale ``index`` of the ``info`` file keeps its chunks: its checked ``key``
    (a directory below the volume) and its sharding (None: one file per chunk). What
    every reader of an ``info`` file needs, volumes and the tools alike."""
    where = f"{info}: scales[{index}]"
    if not isinstance(obj, Mapping):
        raise ShardingConfigError(f"{where} is {obj!r}, not a JSON object")
    key = _check_scale_key(_required(obj, "key", where, "the scale's directory"), where)
    raw = obj.get("sharding")
    where = f"{info}: scale {key!r}: field 'sharding'"
    return key, None if raw is None else PrecomputedSharding.from_json(raw, where)


def _parse_scale(obj: Any, index: int) -> _ScaleInfo:
    key, sharding = scale_directory(obj, index)
    where = f"info: scale {key!r}"
    _required(obj, "size", where, "3 integers")
    size = _triple(obj, "size", where, low=0)
    offset = _triple(obj, "voxel_offset", where, low=None) if "voxel_offset" in obj else (0, 0, 0)
    chunk_sizes = _required(obj, "chunk_sizes", where, "a list of [x, y, z] chunk shapes")
    if not isinstance(chunk_sizes, list) or not chunk_sizes:
        raise ShardingConfigError(
            f"{where}: field 'chunk_sizes' is {chunk_sizes!r}, not a non-empty list of [x, y, z] shapes"
        )
    shapes = tuple(
        _triple({"chunk_sizes": c}, "chunk_sizes", f"{where}: chunk_sizes[{i}]", low=1)
        for i, c in enumerate(chunk_sizes)
    )
    encoding = _required(obj, "encoding", where, f"one of {list(ENCODINGS)}")
    if not isinstance(encoding, str):
        raise ShardingConfigError(f"{where}: field 'encoding' is {encoding!r}, not one of {list(ENCODINGS)}")
    resolution = _required(obj, "resolution", where, "3 numbers, nm per voxel")
    if (
        not isinstance(resolution, list)
        or len(resolution) != 3
        or not all(isinstance(r, int | float) and not isinstance(r, bool) for r in resolution)
    ):
        raise ShardingConfigError(f"{where}: field 'resolution' is {resolution!r}, not a list of 3 numbers")
    if sharding is not None:
        if len(shapes) != 1:
            raise ShardingConfigError(
                f"{where}: field 'chunk_sizes' has {len(shapes)} chunk shapes; a sharded scale has one"
            )
        bits = sum(max(-(-s // c) - 1, 0).bit_length() for s, c in zip(size, shapes[0], strict=True))
        if bits > 64:
            raise ShardingConfigError(
                f"{where}: field 'size' {list(size)} with chunk size {list(shapes[0])} needs chunk ids of "
                f"{bits} bits, more than the 64 of a sharded scale"
            )
    return _ScaleInfo(
        index=index,
        key=key,
        size=size,
        voxel_offset=offset,
        chunk_sizes=shapes,
        encoding=encoding,
        resolution=(float(resolution[0]), float(resolution[1]), float(resolution[2])),
        sharding=sharding,
    )


def _parse_info(raw: bytes, where: str) -> tuple[dict[str, Any], list[_ScaleInfo]]:
    try:
        info = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ShardingConfigError(f"{where}: not a JSON document: {e}") from None
    if not isinstance(info, dict):
        raise ShardingConfigError(f"{where}: {info!r} is not a JSON object")
    if "@type" in info and info["@type"] != VOLUME_TYPE:
        raise ShardingConfigError(f"{where}: field '@type' is {info['@type']!r}, expected {VOLUME_TYPE!r}")
    kind = _required(info, "type", where, "'image' or 'segmentation'")
    if not isinstance(kind, str):
        raise ShardingConfigError(f"{where}: field 'type' is {kind!r}, not a string")
    data_type = _required(info, "data_type", where, f"one of {list(DATA_TYPES)}")
    if data_type not in DATA_TYPES:
        raise ShardingConfigError(
            f"{where}: field 'data_type' is {data_type!r}, not one of {list(DATA_TYPES)}"
        )
    channels = _required(info, "num_channels", where, "an integer >= 1")
    if not _integer(channels) or channels < 1:
        raise ShardingConfigError(f"{where}: field 'num_channels' is {channels!r}, not an integer >= 1")
    scales = _required(info, "scales", where, "a list of scales")
    if not isinstance(scales, list):
        raise ShardingConfigError(f"{where}: field 'scales' is {scales!r}, not a list")
    parsed = [_parse_scale(s, i) for i, s in enumerate(scales)]
    keys = [s.key for s in parsed]
    if len(set(keys)) != len(keys):
        twice = next(k for k in keys if keys.count(k) > 1)
        raise ShardingConfigError(f"{where}: field 'scales' has two scales with key {twice!r}")
    return info, parsed


# -- a scale's directory ---------------------------------------------------------------


# -- scales ----------------------------------------------------------------------------


class PrecomputedScale:
    """One scale of a :class:`PrecomputedVolume`, read chunk by chunk.

    Coordinates are tensorstore's: axes ``[x, y, z, channel]``, voxel positions
    absolute, the scale spanning ``[voxel_offset, voxel_offset + size)``. Chunks
    are addressed by their grid position ``(gx, gy, gz)``, chunk ``g`` covering
    ``voxel_offset + g * chunk_size`` up to the next chunk or the volume's end.
    Scales come from :meth:`PrecomputedVolume.scale`, not from this constructor.

    Attributes:
        index: The scale's place in the ``info`` file's ``scales``.
        key: Its directory below the volume (its ``key``).
        size: Voxels along x, y and z.
        voxel_offset: The absolute voxel position of its first voxel.
        chunk_size: The chunk shape read (the first of ``chunk_sizes``).
        chunk_sizes: Every chunk shape the ``info`` file lists.
        encoding: The chunk encoding (only ``"raw"`` is read).
        resolution: Nanometres per voxel along x, y and z.
        num_channels: Channels per voxel.
        dtype: The voxels' data type.
        sharding: Its sharding, or None for one file per chunk.
    """

    def __init__(self, volume_inner: InnerStore, info: Mapping[str, Any], scale: _ScaleInfo) -> None:
        where = f"info: scale {scale.key!r}"
        if scale.encoding not in SUPPORTED_ENCODINGS:
            known = "a known" if scale.encoding in ENCODINGS else "an unknown"
            raise ShardingConfigError(
                f"{where}: field 'encoding' is {scale.encoding!r}, {known} encoding that cannot be read "
                f"(only {list(SUPPORTED_ENCODINGS)} chunks are)"
            )
        self.index = scale.index
        self.key = scale.key
        self.size = scale.size
        self.voxel_offset = scale.voxel_offset
        self.chunk_size = scale.chunk_sizes[0]
        self.chunk_sizes = scale.chunk_sizes
        self.encoding = scale.encoding
        self.resolution = scale.resolution
        self.num_channels: int = info["num_channels"]
        self.dtype: np.dtype[Any] = np.dtype(info["data_type"])
        self.sharding = scale.sharding
        self._stored = self.dtype.newbyteorder("<")
        self._inner = volume_inner
        self.store: PrecomputedShardedStore | None = (
            None
            if scale.sharding is None
            else PrecomputedShardedStore(
                SubdirectoryInner(volume_inner, scale.key), scale.sharding, read_only=True
            )
        )
        """The scale's chunks by id (sharded scales only): raw bytes as stored."""

    def __repr__(self) -> str:
        return (
            f"PrecomputedScale(key={self.key!r}, size={self.size}, voxel_offset={self.voxel_offset}, "
            f"chunk_size={self.chunk_size}, {self.dtype}, channels={self.num_channels}, "
            f"{'unsharded' if self.sharding is None else 'sharded'})"
        )

    @property
    def grid_shape(self) -> Triple:
        """Chunks along x, y and z: ``ceil(size / chunk_size)``."""
        x, y, z = (-(-s // c) for s, c in zip(self.size, self.chunk_size, strict=True))
        return (x, y, z)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(x, y, z, channel)`` extent of the whole scale."""
        return (*self.size, self.num_channels)

    @property
    def bounds(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """Absolute ``[start, stop)`` voxel bounds along x, y and z."""
        x, y, z = ((o, o + s) for o, s in zip(self.voxel_offset, self.size, strict=True))
        return (x, y, z)

    # -- chunks ------------------------------------------------------------------------

    def _positions(self, positions: Any) -> npt.NDArray[np.int64]:
        pos = np.asarray(positions)
        if pos.size == 0:
            return np.zeros((0, 3), dtype=np.int64)
        if pos.ndim != 2 or pos.shape[1] != 3 or pos.dtype.kind not in "iu":
            raise ValueError(
                f"scale {self.key!r}: chunk grid positions are (n, 3) integers (x, y, z), "
                f"not an array of {pos.dtype} shaped {pos.shape}"
            )
        grid = np.array(self.grid_shape)
        outside = ((pos < 0) | (pos >= grid)).any(axis=1)
        if outside.any():
            bad = tuple(int(v) for v in pos[int(np.flatnonzero(outside)[0])])
            raise IndexError(
                f"scale {self.key!r}: chunk grid position {bad} is outside the grid {self.grid_shape}"
            )
        return pos.astype(np.int64)

    def chunk_id(self, grid_position: Sequence[int]) -> int:
        """The uint64 id of the chunk at ``(gx, gy, gz)``: its compressed Morton code."""
        pos = self._positions([list(grid_position)])
        return int(compressed_morton_code(pos, self.grid_shape)[0])

    def chunk_bounds(self, grid_position: Sequence[int]) -> tuple[Triple, Triple]:
        """Absolute ``(start, stop)`` voxel corners of a chunk, clipped to the volume."""
        return self._bounds(self._positions([list(grid_position)])[0].tolist())

    def _bounds(self, g: Sequence[int]) -> tuple[Triple, Triple]:
        start = [o + int(i) * c for o, i, c in zip(self.voxel_offset, g, self.chunk_size, strict=True)]
        stop = [
            min(s + c, o + n)
            for s, c, o, n in zip(start, self.chunk_size, self.voxel_offset, self.size, strict=True)
        ]
        return (start[0], start[1], start[2]), (stop[0], stop[1], stop[2])

    def chunk_file(self, grid_position: Sequence[int]) -> str:
        """The key (below the volume's root) of an unsharded chunk:
        ``{key}/{x0}-{x1}_{y0}-{y1}_{z0}-{z1}``, absolute voxel bounds."""
        return self._file(self._positions([list(grid_position)])[0].tolist())

    def _file(self, g: Sequence[int]) -> str:
        start, stop = self._bounds(g)
        return f"{self.key}/" + "_".join(f"{a}-{b}" for a, b in zip(start, stop, strict=True))

    async def read_chunks(
        self, positions: Iterable[Sequence[int]] | npt.NDArray[np.integer[Any]]
    ) -> list[npt.NDArray[Any] | None]:
        """The chunks at grid positions ``(gx, gy, gz)``, each a new ``(x, y, z, channel)``
        array clipped to the volume (edge chunks are smaller), or None where absent;
        all read in one batch. A chunk whose byte count is not that of its clipped
        shape raises ShardFormatError naming it and its shard (or file)."""
        pos = self._positions(
            positions if isinstance(positions, np.ndarray) else [list(p) for p in positions]
        )
        if not len(pos):
            return []
        if self.store is not None:
            ids = compressed_morton_code(pos, self.grid_shape).tolist()
            store = self.store
            raws = await store.get_many(ids)
            places = [
                partial(lambda i: f"chunk {i} in shard {self.key + '/' + store.shard_key(i)!r}", i)
                for i in ids
            ]
        else:
            keys = [self._file(p) for p in pos.tolist()]
            with failure("read", keys[0]):
                raws = await self._inner.get_many([(k, None) for k in keys])
            places = [partial(lambda k: f"chunk file {k!r}", k) for k in keys]
        return [
            None if raw is None else self._decode(raw, p, place)
            for raw, p, place in zip(raws, pos.tolist(), places, strict=True)
        ]

    def _decode(self, raw: bytes, position: list[int], place: Callable[[], str]) -> npt.NDArray[Any]:
        start, stop = self._bounds(position)
        x, y, z = (b - a for a, b in zip(start, stop, strict=True))
        expected = x * y * z * self.num_channels * self.dtype.itemsize
        if len(raw) != expected:
            raise ShardFormatError(
                f"scale {self.key!r}: {place()} (grid position {tuple(position)}): {len(raw)} bytes, "
                f"expected {expected} (raw {self.dtype} [channel, z, y, x] = {[self.num_channels, z, y, x]})"
            )
        czyx = np.frombuffer(raw, dtype=self._stored).reshape(self.num_channels, z, y, x)
        return np.array(czyx.transpose(3, 2, 1, 0), dtype=self.dtype, order="C")

    # -- regions -----------------------------------------------------------------------

    def _region(self, region: Region | None) -> list[tuple[int, int]]:
        bounds = list(self.bounds)
        if region is None:
            return bounds
        if not isinstance(region, tuple) or len(region) != 3:
            raise TypeError(f"scale {self.key!r}: a region is 3 slices (x, y, z), not {region!r}")
        out = []
        for axis, s, (lo, hi) in zip(AXES, region, bounds, strict=True):
            if not isinstance(s, slice):
                raise TypeError(f"scale {self.key!r}: region {axis} is {s!r}, not a slice")
            if s.step not in (None, 1):
                raise ValueError(f"scale {self.key!r}: region {axis} has step {s.step!r}; only 1 is read")
            start = lo if s.start is None else operator.index(s.start)
            stop = hi if s.stop is None else operator.index(s.stop)
            if not lo <= start <= stop <= hi:
                raise IndexError(
                    f"scale {self.key!r}: region {axis} [{start}, {stop}) is not within the volume's "
                    f"[{lo}, {hi}) (coordinates are absolute, voxel_offset included)"
                )
            out.append((start, stop))
        return out

    async def read_async(self, region: Region | None = None) -> npt.NDArray[Any]:
        """As :meth:`read`, in the running event loop."""
        want = self._region(region)
        out = np.zeros((*(b - a for a, b in want), self.num_channels), dtype=self.dtype)
        if out.size == 0:
            return out
        ranges = [
            range((a - o) // c, -(-(b - o) // c))
            for (a, b), o, c in zip(want, self.voxel_offset, self.chunk_size, strict=True)
        ]
        positions = list(itertools.product(*ranges))
        chunks = await self.read_chunks(positions)
        for position, chunk in zip(positions, chunks, strict=True):
            if chunk is None:
                continue
            start, _ = self._bounds(position)
            src, dst = [], []
            for (a, b), s, n in zip(want, start, chunk.shape[:3], strict=True):
                lo, hi = max(a, s), min(b, s + n)
                src.append(slice(lo - s, hi - s))
                dst.append(slice(lo - a, hi - a))
            out[tuple(dst)] = chunk[tuple(src)]
        return out

    def read(self, region: Region | None = None) -> npt.NDArray[Any]:
        """A ``(x, y, z, channel)`` array of the voxels in ``region`` (3 slices in
        absolute voxel coordinates, as tensorstore indexes this driver: the scale
        spans ``[voxel_offset, voxel_offset + size)``; open ends are the bounds;
        step 1; None: everything). Absent chunks read as 0."""
        return sync(self.read_async(region))


# -- volumes ---------------------------------------------------------------------------


class PrecomputedVolume:
    """A neuroglancer precomputed volume (info file + scales) read chunk by chunk.

    ``inner``: the volume's root, holding ``info`` and a directory per scale; anything
    :class:`~shardstore.ShardingStore` accepts (a path, a URL with ``storage_options``,
    an fsspec mapper, a zarr store or a mapping). The info file is read and checked
    once, here: a malformed one raises ShardingConfigError naming the field.
    """

    def __init__(self, inner: Any, *, storage_options: dict[str, Any] | None = None) -> None:
        self._inner: InnerStore = adapt(inner, storage_options)
        where = f"{self._inner!r}: {INFO_KEY!r}"
        with failure("read", INFO_KEY):
            raw = sync(self._inner.get(INFO_KEY))
        if raw is None:
            raise ShardingConfigError(f"{where} is missing: not a neuroglancer precomputed volume")
        self.info, self._scales = _parse_info(raw, "info")
        self._opened: dict[int, PrecomputedScale] = {}

    def __repr__(self) -> str:
        return f"PrecomputedVolume({self._inner!r}, scales={self.scale_keys})"

    @property
    def scale_keys(self) -> list[str]:
        """The ``key`` of every scale, in the ``info`` file's order."""
        return [s.key for s in self._scales]

    @property
    def dtype(self) -> np.dtype[Any]:
        """The voxels' data type (``data_type``)."""
        dtype: np.dtype[Any] = np.dtype(self.info["data_type"])
        return dtype

    @property
    def num_channels(self) -> int:
        """Channels per voxel (``num_channels``)."""
        channels: int = self.info["num_channels"]
        return channels

    def scale(self, key_or_index: str | int) -> PrecomputedScale:
        """A scale by its ``key`` or its index in ``scales``; ShardingConfigError if its
        encoding cannot be read."""
        if isinstance(key_or_index, str):
            found = [s for s in self._scales if s.key == key_or_index]
            if not found:
                raise KeyError(f"no scale with key {key_or_index!r}; the scales are {self.scale_keys}")
            info = found[0]
        else:
            index = operator.index(key_or_index)
            if not -len(self._scales) <= index < len(self._scales):
                raise IndexError(f"scale index {index} is out of range: the volume has {len(self._scales)}")
            info = self._scales[index]
        if info.index not in self._opened:
            self._opened[info.index] = PrecomputedScale(self._inner, self.info, info)
        return self._opened[info.index]
