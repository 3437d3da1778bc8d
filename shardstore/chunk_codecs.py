"""The common chunk codec chains, run straight between bytes and numpy arrays.

zarr decodes a chunk through a chain of codec objects, each call awaited and
each result wrapped in a zarr buffer: per chunk that costs more than decoding a
small chunk does. For the chains nearly every array has — ``bytes`` (either
byte order), optionally ``transpose``, then ``zstd``, ``blosc`` or ``gzip`` and
a ``crc32c`` checksum; or a zarr v2 array's compressor with no filters — a
:class:`ChunkCodec` does the same work with numpy and numcodecs directly, and
produces the same bytes any zarr reader decodes. :func:`chunk_codec` says
whether an array's chain is one of those (None: zarr's codecs serve it).

zstd goes through the ``zstandard`` package where it is installed (the
``shardstore[fast]`` extra): it keeps one compression context per thread, where
numcodecs builds one per chunk, which for small chunks is most of the work; and its
C backend compresses or decompresses the many chunks of a shard in one call, letting
go of the GIL once a shard instead of once a chunk. Big chunks are compressed by
numcodecs (see :data:`NUMCODECS_FROM`). Any of these frames any zstd reader reads.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numcodecs
import numpy as np
import numpy.typing as npt
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec
from zarr.codecs._v2 import V2Codec

from shardstore.formats.base import Allocate, empty_rows
from shardstore.zstd_frames import content_sizes

zstandard: Any
try:
    import zstandard
except ImportError:  # the ``fast`` extra is not installed: numcodecs alone
    zstandard = None

__all__ = ["ChunkCodec", "FrameDamage", "chunk_codec", "frame_check"]

_SHUFFLES = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
NUMCODECS_FROM = 512 << 10
"""Chunks of this many bytes or more are compressed by numcodecs even where zstandard
is installed: past it numcodecs' own zstd (1.5.6) takes 25-40 % less time than
zstandard's (1.5.7) on float data here, while below it zstandard's kept context wins
(numcodecs builds one per chunk)."""
_KINDS = "biufc"
"""numpy kinds the direct path handles: fixed-size numbers and booleans."""
ONE_CALL_FROM = 32
"""Calls that decode this many frames or more decompress them in one call that lets go of
the GIL once, after one numpy walk of their headers (:func:`content_sizes`: 29-59 µs
for 64, a few more for more), and are read where that call put them. A call per frame,
or a stream over them, takes the GIL back at every frame's end: with a thread per core
each decoding a shard, that is a handoff of the GIL a frame (4,096 in a 64 MiB read of
16 KiB chunks): the threads kept 1.68 cores busy, 1.84 with one call a shard, a whole
64 MiB read of shards of 64 such chunks about 5 % faster (alternated in one process,
60 rounds twice: 97.6 and 95.9 ms against 102.4 and 103.3; zarrs 73). Fewer frames (a
slab's row of eight chunks a shard, decoded by the caller's thread alone) are each
decompressed on their own: the one-shot call checks the frame whole, where a walk of
the headers in Python cost more than a frame's decode (a 1 MiB slab, alternated, 150
rounds twice: 4.67 and 4.58 ms against 4.83 and 4.75 streamed after such a walk)."""


def _value(option: Any) -> Any:
    """An enum option's value (zarr 3.1 uses enums where zarr 3.4 uses strings)."""
    return getattr(option, "value", option)


_THREAD_CONTEXTS = threading.local()
"""Each thread's zstandard contexts (:meth:`_Zstd._contexts`)."""


class _Zstd:
    """zstd through ``zstandard`` with a context per thread, else numcodecs; the frames
    carry their content size, as numcodecs' do, and any frame numcodecs reads is read."""

    def __init__(self, level: int, checksum: bool) -> None:
        self.level, self.checksum = level, checksum
        self._numcodecs = numcodecs.Zstd(level=level, checksum=checksum)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Zstd) and (self.level, self.checksum) == (other.level, other.checksum)

    def __hash__(self) -> int:
        return hash((self.level, self.checksum))

    def _contexts(self) -> tuple[Any, Any]:
        """This thread's compressor for this level and checksum, and a decompressor:
        made once a thread and kept, not once a codec (every read or write builds
        its codecs anew, and a new context costs more than a small chunk's decode)."""
        kept: dict[tuple[int, bool], tuple[Any, Any]] | None = getattr(_THREAD_CONTEXTS, "kept", None)
        if kept is None:
            kept = _THREAD_CONTEXTS.kept = {}
        contexts = kept.get((self.level, self.checksum))
        if contexts is None:
            contexts = kept[self.level, self.checksum] = (
                zstandard.ZstdCompressor(level=self.level, write_checksum=self.checksum),
                zstandard.ZstdDecompressor(),
            )
        return contexts

    def encode(self, data: Any) -> Any:
        if zstandard is None or memoryview(data).nbytes >= NUMCODECS_FROM:
            return self._numcodecs.encode(data)
        return self._contexts()[0].compress(data)

    def decode(self, data: Any) -> Any:
        if zstandard is not None:
            try:
                return self._contexts()[1].decompress(data, allow_extra_data=False)
            except zstandard.ZstdError:  # a frame without its size (streamed), more, or damage
                pass
        return self._numcodecs.decode(data)

    @property
    def in_bulk(self) -> bool:
        """Whether :meth:`encode_many` and :meth:`decode_many` can run: zstandard's C
        backend (its pure-Python one has no calls for many frames)."""
        return zstandard is not None and zstandard.backend == "cext"

    def encode_many(self, data: Any, segments: npt.NDArray[np.uint64]) -> list[memoryview]:
        """The pieces ``segments`` (rows of offset and length; at least one, none
        empty) of the bytes ``data`` each compressed, in one call that lets go of the
        GIL once: a thread per core then compresses without handing the GIL back and
        forth each chunk. The frames are those :meth:`encode` writes."""
        frames = self._contexts()[0].multi_compress_to_buffer(
            zstandard.BufferWithSegments(data, _native(segments)), threads=1
        )
        return [memoryview(frames[i]) for i in range(len(frames))]

    def decode_many(
        self, data: Any, segments: npt.NDArray[np.uint64], size: int, empty: Allocate
    ) -> npt.NDArray[np.uint8]:
        """The frames at ``segments`` (rows of offset and length; at least one) of
        ``data`` decompressed, each to exactly ``size`` bytes, as ``(n, size)`` rows:
        one by one into the rows ``empty`` gives, or in one call that lets go of the
        GIL once (see ONE_CALL_FROM), where they stay (read-only). Raises ValueError on
        damage (a frame that does not decompress, or not to ``size`` bytes, or not one
        whole frame and nothing more: which one, the caller finds out)."""
        try:
            if len(segments) < ONE_CALL_FROM:
                rows = empty(len(segments), size)
                self._each_into(memoryview(data), segments.tolist(), size, memoryview(rows.reshape(-1)))
                return rows
            said = content_sizes(np.frombuffer(data, dtype=np.uint8), segments)
            if said is None:
                raise ValueError("a chunk's bytes are not one zstd frame and nothing after it")
            if ((said != size) & (said != -1)).any():
                raise ValueError(f"a frame says it holds other than {size} bytes")
            chunks = self._contexts()[1].multi_decompress_to_buffer(
                zstandard.BufferWithSegments(data, _native(segments)),
                decompressed_sizes=np.full(len(segments), size, dtype=np.uint64),
                threads=1,
            )  # (each to exactly its size, or ZstdError)
        except zstandard.ZstdError as exc:
            raise ValueError(str(exc)) from exc
        return _side_by_side(chunks, len(segments), size, empty)

    def _each_into(self, data: memoryview, pieces: list[list[int]], size: int, into: memoryview) -> None:
        """:meth:`decode_many` of the frames at ``pieces`` one by one, each once the size
        its header says is checked (none: a streamed frame, held to ``size``), then
        copied into place. zstd's one-shot call refuses anything but one whole frame: a
        frame cut short, bytes after it, a checksum that does not match (not for a frame
        that says it holds nothing, which ``size`` > 0 rules out first)."""
        if size <= 0:
            raise ValueError("a chunk of no bytes is no zstd frame's to hold")
        decompress = self._contexts()[1].decompress
        for i, (offset, nbytes) in enumerate(pieces):
            if offset + nbytes > len(data):  # (a slice would end quietly at the end)
                raise ValueError("a chunk's bytes run past the end of the shard's")
            frame = data[offset : offset + nbytes]
            said = zstandard.frame_content_size(frame)
            if said != size and said != -1:  # (checked first: zstd makes room for what it says)
                raise ValueError(f"a frame says it holds {said} bytes, not {size}")
            into[i * size : (i + 1) * size] = decompress(frame, max_output_size=size, allow_extra_data=False)


def _side_by_side(chunks: Any, n: int, size: int, empty: Allocate) -> npt.NDArray[np.uint8]:
    """The ``n`` frames of ``size`` bytes one call of zstandard decompressed (its
    BufferWithSegmentsCollection), as rows of one array: a read-only view of the buffer
    that call decompressed them into where they all lie in one, side by side, else
    copied into rows ``empty`` gives. zstandard's thread sizes its first buffer by the
    compressed bytes and starts another where a frame does not fit (offsets from 0
    again, a frame at least in each): frames that compress well come in several, those
    that hardly compress (random floats) in one. It gives a view of each frame's part
    only, so the view is made from the first part's address, and keeps the collection,
    which keeps its buffers, alive: a copy cost 40 µs and a pass over the bytes a shard
    of 64 chunks of 16 KiB; this, 10 µs."""
    last = n - 1
    first = _address(chunks[0])
    if (
        len(chunks) == n
        and chunks.size() == n * size
        and chunks[last].offset == last * size  # (in a later buffer: (n - 2) * size at most)
        and _address(chunks[last]) == first + last * size
    ):
        return np.asarray(_Rows(chunks, first, n, size))
    rows = empty(n, size)
    into = memoryview(rows.reshape(-1))
    for i in range(n):
        into[i * size : (i + 1) * size] = chunks[i]  # (ValueError if not ``size`` bytes)
    return rows


def _address(part: Any) -> int:
    """Where a bytes-like object's bytes begin in memory."""
    return int(np.frombuffer(part, dtype=np.uint8).__array_interface__["data"][0])


class _Rows:
    """``n`` rows of ``size`` bytes at ``address`` that ``owner`` keeps alive, as numpy
    takes an array (read-only) from an object: the array keeps this object."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, owner: Any, address: int, n: int, size: int) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "data": (address, True),
            "shape": (n, size),
            "typestr": "|u1",
            "version": 3,
        }


def _native(segments: npt.NDArray[np.uint64]) -> bytes:
    """Rows of (offset, length) as zstandard's BufferWithSegments takes them (native
    64-bit integers)."""
    return np.ascontiguousarray(segments, dtype=np.uint64).tobytes()


class FrameDamage(ValueError):
    """A chunk's stored bytes are damaged in a way its decoder would not see itself."""


BLOSC_HEADER = 16
"""Bytes of a blosc frame's header; its last four hold the whole frame's size."""


class _Blosc:
    """numcodecs' Blosc, decoding only a frame that holds as many bytes as its header
    says: blosc trusts the header, and reads on past a frame cut short (an index entry
    too small) into whatever follows it, the rest of its shard where a chunk is a view
    of it: values silently wrong."""

    def __init__(self, codec: numcodecs.Blosc) -> None:
        self.codec = codec

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Blosc) and self.codec == other.codec

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.codec.get_config().items())))

    def encode(self, data: Any) -> Any:
        return self.codec.encode(data)

    def decode(self, data: Any) -> Any:
        self.check(data)
        return self.codec.decode(data)

    @staticmethod
    def check(data: Any) -> None:
        """FrameDamage where ``data`` is shorter than its header or the size it gives."""
        view = memoryview(data).cast("B")
        claimed = int.from_bytes(view[12:BLOSC_HEADER], "little") if view.nbytes >= BLOSC_HEADER else None
        if claimed is None or claimed > view.nbytes:
            said = "no whole header" if claimed is None else f"a header that says {claimed}"
            raise FrameDamage(f"a blosc frame of {view.nbytes} bytes with {said}")


@dataclass(frozen=True)
class ChunkCodec:
    """One array's chunk codec chain, run with numpy and numcodecs.

    ``dtype`` is the stored one (with its byte order); ``transpose`` the order the
    ``transpose`` codec gives the axes (None: none); ``fortran`` a zarr v2 array of
    order "F"; ``compressors`` the numcodecs codecs in encoding order; ``checksum``
    a trailing crc32c."""

    dtype: np.dtype[Any]
    transpose: tuple[int, ...] | None
    fortran: bool
    compressors: tuple[Any, ...]
    checksum: bool

    @property
    def raw(self) -> bool:
        """Whether a chunk is stored as its elements in C order, nothing else: then the
        chunks of a shard are slices of its bytes."""
        return self.in_order and not (self.compressors or self.checksum)

    def decode_bytes(self, stored: Any) -> Any:
        """A chunk's elements as stored (the ``bytes`` codec's order), checksum checked
        and decompressed: any bytes-like object. Raises ValueError on damage."""
        data = stored
        if self.checksum:
            view = memoryview(stored)
            data = view[:-4]
            # (google_crc32c refuses a memoryview; a numpy array over the same bytes it takes)
            summed = google_crc32c.value(np.frombuffer(data, dtype=np.uint8)) if len(view) >= 4 else None
            if summed != int.from_bytes(view[-4:], "little"):
                raise ValueError("crc32c checksum mismatch")
        for codec in reversed(self.compressors):
            data = codec.decode(data)
        return data

    @property
    def in_order(self) -> bool:
        """Whether a chunk's stored elements are in the chunk's C order (no transpose)."""
        return self.transpose is None and not self.fortran

    def decode(self, stored: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        """A chunk's array from its stored bytes (read-only where it could be a view).
        Raises ValueError on damage; the caller then lets zarr's codecs say what."""
        return self.arrange(self.decode_bytes(stored), shape)

    def arrange(self, elements: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        """A chunk's array from its elements as stored (:meth:`decode_bytes`), a view."""
        flat = np.frombuffer(elements, dtype=self.dtype)
        if self.transpose is not None:
            stored_shape = tuple(shape[i] for i in self.transpose)
            return flat.reshape(stored_shape).transpose(np.argsort(self.transpose))
        if self.fortran:
            return flat.reshape(shape[::-1]).T
        return flat.reshape(shape)

    @property
    def _bulk(self) -> _Zstd | None:
        """The zstd codec where it is all the chain does to the elements in C order:
        then many chunks are encoded or decoded in one call."""
        if not self.in_order or self.checksum or len(self.compressors) != 1:
            return None
        zstd = self.compressors[0]
        return zstd if isinstance(zstd, _Zstd) and zstd.in_bulk else None

    def encode_stacked(self, stacked: npt.NDArray[Any], places: Sequence[int]) -> list[Any]:
        """The stored bytes of the chunks ``stacked[p]`` for each of ``places``
        (``stacked``: chunks side by side in C order, of the stored dtype)."""
        bulk = self._bulk
        size = stacked[0].nbytes if len(stacked) else 0
        if bulk is None or not places or size == 0 or not stacked.flags.c_contiguous:
            return [self.encode(stacked[p]) for p in places]
        segments = np.empty((len(places), 2), dtype=np.uint64)
        segments[:, 0] = np.asarray(places, dtype=np.uint64) * np.uint64(size)
        segments[:, 1] = size
        return bulk.encode_many(memoryview(stacked.reshape(-1).view(np.uint8)), segments)

    def decode_stacked(
        self,
        data: Any,
        segments: npt.NDArray[np.uint64],
        shape: tuple[int, ...],
        empty: Allocate = empty_rows,
    ) -> npt.NDArray[Any] | None:
        """The chunks stored at ``segments`` (rows of offset and length) of ``data``,
        decoded side by side as one ``(n, *shape)`` array, where the chain does that in
        one call (None: it does not; decode them one by one): in memory ``empty(n, chunk
        bytes)`` gives, or read-only in the memory zstd decompressed many frames into
        (:meth:`_Zstd.decode_many`). Raises ValueError on damage, without saying which
        chunk."""
        bulk = self._bulk
        size = self.dtype.itemsize * math.prod(shape)
        if bulk is None or len(segments) == 0 or size == 0:
            return None
        rows = bulk.decode_many(data, segments, size, empty)
        return rows.view(self.dtype).reshape((len(segments), *shape))

    def encode(self, chunk: np.ndarray[Any, Any]) -> bytes:
        if self.transpose is not None:
            chunk = chunk.transpose(self.transpose)
        data: Any = np.ascontiguousarray(chunk.T if self.fortran else chunk, dtype=self.dtype)
        for codec in self.compressors:
            data = codec.encode(data)
        out = bytes(data)
        if self.checksum:
            out += google_crc32c.value(out).to_bytes(4, "little")
        return out


def frame_check(codecs: Sequence[Any]) -> Callable[[Any], None] | None:
    """What finds damage to a chunk's stored bytes that the decoder of a chain of zarr
    codec objects (in order) would not see itself, raising FrameDamage: a blosc frame
    cut short (see :class:`_Blosc`), where blosc reads the stored bytes. None: nothing."""
    outer = codecs[-1] if codecs else None
    if isinstance(outer, V2Codec):  # (its compressor runs last)
        outer = outer.compressor
    return _Blosc.check if isinstance(outer, BloscCodec | numcodecs.Blosc) else None


def chunk_codec(codecs: Sequence[Any], spec: Any) -> ChunkCodec | None:
    """The direct form of a chain of zarr codec objects (a pipeline's, in order) for
    chunks described by the ArraySpec ``spec``; None where it has a codec this module
    does not run, a data type numpy cannot hold as fixed-size numbers, or no fill value."""
    try:
        native = spec.dtype.to_native_dtype()
    except AttributeError:
        return None
    if not isinstance(native, np.dtype) or native.kind not in _KINDS or spec.fill_value is None:
        return None
    dtype, transpose, fortran, checksum = native, None, False, False
    compressors: list[Any] = []
    for n, codec in enumerate(codecs):
        if isinstance(codec, TransposeCodec) and n == 0:
            transpose = tuple(codec.order)
        elif isinstance(codec, BytesCodec):
            endian = _value(codec.endian)
            if endian is not None:
                dtype = native.newbyteorder("<" if endian == "little" else ">")
        elif isinstance(codec, V2Codec) and not codec.filters:
            fortran = _value(spec.config.order) == "F"
            compressor: Any = codec.compressor
            if isinstance(compressor, numcodecs.Zstd):
                compressor = _Zstd(compressor.level, compressor.checksum)
            elif isinstance(compressor, numcodecs.Blosc):
                compressor = _Blosc(compressor)
            if compressor is not None:
                compressors.append(compressor)
        elif isinstance(codec, ZstdCodec) and not checksum:
            compressors.append(_Zstd(codec.level, codec.checksum))
        elif isinstance(codec, BloscCodec) and not checksum:
            compressors.append(
                _Blosc(
                    numcodecs.Blosc(
                        cname=_value(codec.cname),
                        clevel=codec.clevel,
                        shuffle=_SHUFFLES[_value(codec.shuffle)],
                        blocksize=codec.blocksize,
                    )
                )
            )
        elif isinstance(codec, GzipCodec) and not checksum:
            compressors.append(numcodecs.GZip(level=codec.level))
        elif isinstance(codec, Crc32cCodec) and not checksum:
            checksum = True
        else:
            return None
    return ChunkCodec(
        dtype=dtype,
        transpose=transpose,
        fortran=fortran,
        compressors=tuple(compressors),
        checksum=checksum,
    )
