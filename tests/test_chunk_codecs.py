"""The direct codec path: every chain it runs reads and writes what zarr's own codecs
would (the bytes it writes decode through zarr without shardstore's pipeline), and a
damaged chunk raises a ChunkDecodeError naming it, what zarr's codecs raise its cause."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec
from zarr.core.array_spec import ArrayConfig, ArraySpec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.buffer.cpu import NDBuffer
from zarr.core.dtype import VariableLengthBytes

from shardstore import PIPELINE_PATH, ChunkDecodeError, ShardFormatError, ShardingStore, ShardStoreError
from shardstore.chunk_codecs import ONE_CALL_FROM, _side_by_side, chunk_codec

from .helpers import sample

ZARR_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"

V3_CHAINS: dict[str, dict[str, Any]] = {
    "zstd": {},
    "uncompressed": {"compressors": None},
    "blosc": {"compressors": BloscCodec(cname="lz4", clevel=3, shuffle="shuffle")},
    "gzip-crc32c": {"compressors": [GzipCodec(level=1), Crc32cCodec()]},
    "big-endian": {"serializer": BytesCodec(endian="big")},
    "transposed": {"filters": [TransposeCodec(order=(1, 0))], "compressors": ZstdCodec(level=3)},
}


def _pair(root: Path, name: str, dtype: str, **kwargs: Any) -> tuple[Any, Any]:
    """The same array through shardstore's pipeline and through zarr's own."""
    made = []
    for path in (PIPELINE_PATH, ZARR_PIPELINE):
        with zarr.config.set({"codec_pipeline.path": path}):
            store = ShardingStore(str(root / path), (2, 3))
            made.append(
                zarr.create_array(
                    store, name=name, shape=(21, 29), chunks=(4, 5), dtype=dtype, fill_value=0, **kwargs
                )
            )
    return made[0], made[1]


@pytest.mark.parametrize("dtype", ["f4", "<i2", "u1", "bool", "c8", "f8"])
@pytest.mark.parametrize("chain", sorted(V3_CHAINS))
def test_v3_chains_read_and_write_as_zarrs_codecs_do(tmp_path: Path, chain: str, dtype: str) -> None:
    ours, theirs = _pair(tmp_path, "a", dtype, **V3_CHAINS[chain])
    assert chunk_codec(list(ours._async_array.codec_pipeline), _spec(ours)) is not None
    data = (sample((21, 29), "f8") * 100).astype(dtype)
    for arr in (ours, theirs):
        arr[:] = data
        arr[3:17, 2:11] = data[:14, :9]  # chunks covered in part: read, merged, rewritten
        arr[5, :] = 0  # a row of fill values
        arr[8:12, 10:15] = 0  # a whole chunk of fill values: erased
    np.testing.assert_array_equal(ours[:], theirs[:])
    with zarr.config.set({"codec_pipeline.path": ZARR_PIPELINE}):  # our bytes, zarr's codecs
        np.testing.assert_array_equal(zarr.open_array(ours.store, path="a")[:], theirs[:])
    np.testing.assert_array_equal(ours[2:19:3, 7], theirs[2:19:3, 7])  # drop_axes


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("compressor", ["zstd", "none"])
def test_v2_arrays_read_and_write_as_zarrs_codecs_do(tmp_path: Path, order: str, compressor: str) -> None:
    kwargs: dict[str, Any] = {"zarr_format": 2, "order": order}
    if compressor == "none":
        kwargs["compressors"] = None
    ours, theirs = _pair(tmp_path, "v", ">f8", **kwargs)
    data = sample((21, 29), "f8")
    for arr in (ours, theirs):
        arr[:] = data
        arr[1:20:2, 3] = -1
    np.testing.assert_array_equal(ours[:], theirs[:])
    with zarr.config.set({"codec_pipeline.path": ZARR_PIPELINE}):
        np.testing.assert_array_equal(zarr.open_array(ours.store, path="v")[:], theirs[:])


@pytest.mark.parametrize(
    ("compressors", "selection"),
    [
        ([ZstdCodec(), Crc32cCodec()], np.s_[:]),
        ([ZstdCodec()], np.s_[:]),  # whole shards: their chunks decode together
        ([ZstdCodec()], np.s_[4:8, :]),  # a row of chunks: each shard's decode together
        ([Crc32cCodec(), ZstdCodec()], np.s_[:]),  # a chain zarr's codecs run for shardstore
    ],
    ids=["zstd-crc32c", "zstd-whole-shards", "zstd-part-of-shards", "zarrs-codecs"],
)
def test_a_damaged_chunk_raises_an_error_naming_it_caused_by_zarrs_codecs_own(
    tmp_path: Path, compressors: list[Any], selection: Any
) -> None:
    ours, theirs = _pair(tmp_path, "a", "f4", compressors=compressors)
    for arr in (ours, theirs):
        arr[:] = 1
        _damage(arr, "a/c/1/1")
    with pytest.raises(Exception) as zarrs:
        theirs[selection]
    with pytest.raises(ChunkDecodeError, match=r"chunk 'a/c/1/1': its stored bytes do not decode") as caught:
        ours[selection]
    assert isinstance(caught.value, ShardFormatError)
    cause = caught.value.__cause__
    assert (type(cause), str(cause)) == (type(zarrs.value), str(zarrs.value))
    np.testing.assert_array_equal(ours[:4, :5], 1)  # the other chunks read on


def test_a_write_of_part_of_a_damaged_chunk_raises_an_error_naming_it_and_changes_nothing(
    tmp_path: Path,
) -> None:
    ours, _ = _pair(tmp_path, "a", "f4")
    ours[:] = 1
    _damage(ours, "a/c/1/1")
    shard = tmp_path / PIPELINE_PATH / "a" / "c" / "0" / "0"
    before = shard.read_bytes()
    with pytest.raises(ChunkDecodeError, match=r"chunk 'a/c/1/1': .*a write of part of the chunk") as caught:
        ours[4:6, 5:7] = 2  # part of chunk (1, 1): merged with its stored values
    assert caught.value.__cause__ is not None
    assert shard.read_bytes() == before
    ours[4:8, 5:10] = 3  # the whole chunk: its old bytes are not needed
    np.testing.assert_array_equal(ours[4:8, 5:10], 3)


@pytest.mark.parametrize("cut", [0, 9, 1], ids=["empty", "part-of-a-header", "one-byte-short"])
@pytest.mark.parametrize("zarr_format", [3, 2])
@pytest.mark.parametrize("dtype", ["f4", "M8[s]"], ids=["direct", "zarrs-codecs"])
def test_a_blosc_chunk_its_index_entry_cuts_short_is_named_not_read_past(
    tmp_path: Path, dtype: str, zarr_format: int, cut: int
) -> None:
    """blosc trusts a frame's header for its size: a chunk whose index entry holds fewer
    bytes would be decoded from the bytes after it, values silently wrong (a slab, a
    single chunk) or right by chance (a whole read). Every read names the chunk
    instead, as does a write of part of it, which changes nothing; on the direct path
    and on a chain zarr's codecs decode (datetimes)."""
    blosc: Any = numcodecs.Blosc(cname="lz4") if zarr_format == 2 else BloscCodec(cname="lz4")
    arr = zarr.create_array(
        ShardingStore(str(tmp_path), (4, 4)), name="a", shape=(16, 16), chunks=(2, 2), dtype=dtype,
        zarr_format=zarr_format, compressors=blosc,
    )  # fmt: skip
    arr[:] = np.arange(256).reshape(16, 16).astype(dtype)
    key, shard = ("a/c/0/1", tmp_path / "a/c/0/0") if zarr_format == 3 else ("a/0.1", tmp_path / "a/0.0")
    blob = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(blob[-256:]), dtype="<u8").reshape(16, 2).copy()  # (offset, nbytes) rows
    index[1, 1] = cut if cut != 1 else index[1, 1] - 1  # chunk (0, 1): the shard's second
    blob[-256:] = index.tobytes()
    shard.write_bytes(bytes(blob))
    for selection in (np.s_[0:2, 2:4], np.s_[0:2, :], np.s_[:]):
        with pytest.raises(
            ChunkDecodeError, match=rf"chunk '{key}': its stored bytes do not decode"
        ) as caught:
            zarr.open_array(ShardingStore(str(tmp_path)), path="a")[selection]
        assert "blosc frame" in str(caught.value)
    for selection in (np.s_[0, 3], np.s_[0, :]):  # a chunk alone, a row across shards
        with pytest.raises(ChunkDecodeError, match=rf"chunk '{key}': .*a write of part of the chunk"):
            zarr.open_array(ShardingStore(str(tmp_path)), path="a", mode="r+")[selection] = 5
        assert shard.read_bytes() == bytes(blob)


def test_a_failure_of_sound_chunks_is_raised_as_it_is_not_as_damage(tmp_path: Path) -> None:
    """Only bytes zarr's codecs refuse are named as damage: a read into memory that cannot
    be written, or a value that does not encode, fails as through zarr's own pipeline."""
    ours, _ = _pair(tmp_path, "a", "f4")
    ours[:] = 1
    target = np.zeros((4, 5), dtype="f4")
    target.setflags(write=False)
    with pytest.raises(ValueError, match="read-only") as read:
        ours.get_basic_selection(np.s_[4:8, 5:10], out=NDBuffer.from_numpy_array(target))
    strings = zarr.create_array(
        ShardingStore(str(tmp_path / "s"), (2, 2)),
        name="b",
        shape=(8, 10),
        chunks=(4, 5),
        dtype=VariableLengthBytes(),
    )
    strings[:] = np.full((8, 10), b"ab", dtype=object)
    with pytest.raises(TypeError) as written:  # chunks covered in part: their values merged
        strings[1:7, 1:9] = "text"
    assert not isinstance(read.value, ShardStoreError) and not isinstance(written.value, ShardStoreError)
    np.testing.assert_array_equal(strings[:], np.full((8, 10), b"ab", dtype=object))


def _damage(arr: Any, key: str) -> None:
    """A byte of chunk ``key``'s stored bytes flipped, its shard's index kept sound."""
    prototype = default_buffer_prototype()
    stored = asyncio.run(arr.store.get(key, prototype))
    damaged = bytearray(stored.to_bytes())
    damaged[3] ^= 0xFF
    asyncio.run(arr.store.set(key, prototype.buffer.from_bytes(bytes(damaged))))


@pytest.mark.parametrize(
    "compressors", [[Crc32cCodec()], [ZstdCodec(), Crc32cCodec()]], ids=["crc32c", "zstd"]
)
def test_a_checksummed_chunk_is_checked_as_a_view_of_its_shard(compressors: list[Any]) -> None:
    """A shard's chunks reach the codec as views of its bytes (memoryviews), which the
    crc32c library refuses as they are: checked without a copy all the same, and a
    flipped byte is damage."""
    data = np.arange(20, dtype="f4").reshape(4, 5)
    spec = _spec_of(data)
    codec = chunk_codec([BytesCodec(), *compressors], spec)
    assert codec is not None
    stored = codec.encode(data)
    shard = b"head" + stored + b"tail"
    chunk = memoryview(shard)[4 : 4 + len(stored)]
    np.testing.assert_array_equal(codec.decode(chunk, data.shape), data)
    damaged = bytearray(shard)
    damaged[4 + len(stored) - 1] ^= 1  # the checksum's last byte
    with pytest.raises(ValueError, match="crc32c"):
        codec.decode(memoryview(bytes(damaged))[4 : 4 + len(stored)], data.shape)


def _spec(arr: Any) -> ArraySpec:
    """The spec zarr gives each chunk of ``arr``."""
    md = arr._async_array.metadata
    return ArraySpec(
        shape=arr.chunks,
        dtype=md.data_type,
        fill_value=md.fill_value,
        config=ArrayConfig.from_dict({}),
        prototype=default_buffer_prototype(),
    )


@pytest.mark.parametrize("level", [0, 1, 5])
@pytest.mark.parametrize("checksum", [False, True])
def test_zstd_writes_the_bytes_numcodecs_writes_with_or_without_zstandard(
    monkeypatch: pytest.MonkeyPatch, level: int, checksum: bool
) -> None:
    import numcodecs

    from shardstore import chunk_codecs

    assert chunk_codecs.zstandard is not None, "the test extra installs zstandard (shardstore[fast])"
    data = (sample((64, 48), "f8") * 1000).astype("f4")
    want = bytes(numcodecs.Zstd(level=level, checksum=checksum).encode(data))
    codec = chunk_codec([BytesCodec(), ZstdCodec(level=level, checksum=checksum)], _spec_of(data))
    assert codec is not None
    assert codec.encode(data) == want
    np.testing.assert_array_equal(codec.decode(want, data.shape), data)
    monkeypatch.setattr(chunk_codecs, "zstandard", None)  # numcodecs alone, as without the extra
    assert codec.encode(data) == want
    np.testing.assert_array_equal(codec.decode(want, data.shape), data)


def test_zstd_frames_without_their_size_and_from_many_threads_decode() -> None:
    from concurrent.futures import ThreadPoolExecutor

    import zstandard

    data = (sample((32, 32), "f8") * 1000).astype("f4")
    codec = chunk_codec([BytesCodec(), ZstdCodec()], _spec_of(data))
    assert codec is not None
    streamed = zstandard.ZstdCompressor().compressobj()
    frame = streamed.compress(data.tobytes()) + streamed.flush()  # no content size in its header
    np.testing.assert_array_equal(codec.decode(frame, data.shape), data)
    frames = [codec.encode(data + i) for i in range(64)]
    with ThreadPoolExecutor(4) as pool:  # one compression context per thread
        decoded = list(pool.map(lambda f: codec.decode(f, data.shape), frames))
    for i, got in enumerate(decoded):
        np.testing.assert_array_equal(got, data + i)
    with pytest.raises(Exception):  # noqa: B017  damage: numcodecs says what, as zarr would
        codec.decode(frames[0][:-9], data.shape)


def _spec_of(data: np.ndarray[Any, Any]) -> ArraySpec:
    arr = zarr.create_array({}, shape=data.shape, chunks=data.shape, dtype=data.dtype, fill_value=0)
    return _spec(arr)


def _zstd_codec(shape: tuple[int, ...], dtype: str, level: int = 0, checksum: bool = False) -> Any:
    endian = "big" if dtype.startswith(">") else "little"
    spec = _spec_of(np.zeros(shape, np.dtype(dtype).newbyteorder("=")))
    return chunk_codec([BytesCodec(endian=endian), ZstdCodec(level=level, checksum=checksum)], spec)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["f4", ">f8", "u1", "<i2"]),
    st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
    st.integers(1, 6),
    st.sampled_from([-1, 0, 3, 9]),
    st.booleans(),
    st.data(),
)
def test_chunks_encoded_together_are_the_frames_each_gets_alone_and_decode_together(
    dtype: str, shape: tuple[int, ...], n: int, level: int, checksum: bool, data: Any
) -> None:
    codec = _zstd_codec(shape, dtype, level, checksum)
    assert codec is not None
    stacked = (sample((n, *shape), "f8", seed=n) * 50).astype(dtype)
    places = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    together = codec.encode_stacked(stacked, places)
    assert [bytes(frame) for frame in together] == [codec.encode(stacked[p]) for p in places]
    blob, segments = _joined(together)
    decoded = codec.decode_stacked(blob, segments, shape)
    assert decoded is not None
    np.testing.assert_array_equal(decoded, stacked[places])


@pytest.mark.parametrize("count", [3, ONE_CALL_FROM])
def test_chunks_decode_together_from_frames_without_their_size(count: int) -> None:
    codec = _zstd_codec((8, 8), "f4")
    chunks = [(sample((8, 8), "f8", seed=i) * 9).astype("f4") for i in range(count)]
    decoded = codec.decode_stacked(*_joined(_streamed_frame(chunk.tobytes()) for chunk in chunks), (8, 8))
    np.testing.assert_array_equal(decoded, np.stack(chunks))


def _joined(frames: Any) -> tuple[bytes, np.ndarray]:
    """Frames one after another, and their segments (rows of offset and length)."""
    pieces = [bytes(frame) for frame in frames]
    sizes = np.array([len(piece) for piece in pieces], dtype=np.uint64)
    return b"".join(pieces), np.stack([np.cumsum(sizes) - sizes, sizes], axis=1)


def _streamed_frame(data: bytes) -> bytes:
    """A zstd frame whose header does not say its content size (as a stream writes it)."""
    import zstandard

    streamed = zstandard.ZstdCompressor().compressobj()
    return streamed.compress(data) + streamed.flush()


@pytest.mark.parametrize("count", [4, ONE_CALL_FROM])
@pytest.mark.parametrize("gap", [0, 3])
def test_chunks_decode_together_into_the_memory_given_or_zstds(gap: int, count: int) -> None:
    """A few frames are decoded one by one into the rows the caller's allocator gives;
    many in one call, into memory zstd allocates, which the rows stay in (read-only):
    either way, with gaps between the frames or not."""
    codec = _zstd_codec((8, 8), "f4")
    chunks = [(sample((8, 8), "f8", seed=i) * 9).astype("f4") for i in range(count)]
    frames = [codec.encode(chunk) for chunk in chunks]
    blob = (b"x" * gap).join(frames)
    sizes = np.array([len(f) for f in frames], dtype=np.uint64)
    starts = np.cumsum(sizes + gap) - sizes - gap
    given: list[np.ndarray] = []

    def empty(count: int, nbytes: int) -> np.ndarray:
        given.append(np.empty((count, nbytes), dtype=np.uint8))
        return given[-1]

    decoded = codec.decode_stacked(blob, np.stack([starts, sizes], 1), (8, 8), empty)
    np.testing.assert_array_equal(decoded, np.stack(chunks))
    if count < ONE_CALL_FROM:
        assert (
            len(given) == 1 and given[0].shape == (count, 8 * 8 * 4) and np.shares_memory(decoded, given[0])
        )
    else:
        assert given == [] and not decoded.flags.writeable


def test_rows_of_one_call_outlive_the_call_and_its_buffers_objects() -> None:
    """The rows one call decoded are a view of zstd's buffer: they keep it alive after
    every object of the call is gone and the memory around is reused."""
    codec = _zstd_codec((64,), "f8")
    chunks = np.stack([sample((64,), "f8", seed=i) for i in range(ONE_CALL_FROM)])
    blob, segments = _joined(codec.encode_stacked(chunks, range(ONE_CALL_FROM)))
    kept = [codec.decode_stacked(blob, segments, (64,)) for _ in range(20)]
    gc.collect()
    churn = [np.full(1 << 17, i, dtype=np.uint8) for i in range(64)]  # (freed memory reused)
    assert len(churn) == 64
    for decoded in kept:
        np.testing.assert_array_equal(decoded, chunks)


class _Part(np.ndarray):
    """A stand-in for a frame's part of a buffer zstandard decompressed into: its bytes
    and its offset in that buffer."""

    offset: int


class _Parts(list[_Part]):
    """A stand-in for zstandard's BufferWithSegmentsCollection."""

    def size(self) -> int:
        return sum(part.nbytes for part in self)


def _part(memory: np.ndarray, offset: int) -> _Part:
    part = memory.view(_Part)
    part.offset = offset
    return part


@pytest.mark.parametrize("layout", ["one buffer", "apart", "ends lined up"])
def test_frames_in_one_buffer_are_viewed_others_copied_into_the_rows_given(layout: str) -> None:
    """Frames one call decompressed that lie side by side in one buffer are a view of
    it, which keeps it alive; others are copied into the rows the caller's allocator
    gives: each in a buffer of its own, or in several buffers with the first frame and
    the last where they would be in one (the frames between elsewhere)."""
    pieces = [bytes([i]) * 8 for i in range(4)]
    memory = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    own = [np.frombuffer(piece, dtype=np.uint8) for piece in pieces]
    if layout == "one buffer":
        parts = _Parts(_part(memory[i * 8 : (i + 1) * 8], i * 8) for i in range(4))
    elif layout == "apart":
        parts = _Parts(_part(own[i], 0) for i in range(4))
    else:  # the last frame a buffer of its own, which happens to follow the first's
        junk = np.full(32, 0xAB, dtype=np.uint8)
        junk[:8], junk[24:] = own[0], own[3]
        parts = _Parts([_part(junk[:8], 0), _part(own[1], 0), _part(own[2], 0), _part(junk[24:], 0)])
    given: list[np.ndarray] = []

    def empty(count: int, nbytes: int) -> np.ndarray:
        given.append(np.empty((count, nbytes), dtype=np.uint8))
        return given[-1]

    rows = _side_by_side(parts, 4, 8, empty)
    del parts
    gc.collect()
    assert [bytes(row) for row in rows] == pieces
    if layout == "one buffer":
        assert given == [] and not rows.flags.writeable and np.shares_memory(rows, memory)
    else:
        assert len(given) == 1 and np.shares_memory(rows, given[0])


def test_frames_that_compress_well_come_in_several_buffers_and_decode_alike() -> None:
    """zstandard puts frames that compress well in several buffers of one call (its
    first sized by the compressed bytes): they are copied, and decode as those that
    hardly compress, which are viewed."""
    codec = _zstd_codec((32, 32), "f4")
    noisy = np.stack([sample((32, 32), "f8", seed=i).astype("f4") for i in range(ONE_CALL_FROM)])
    smooth = np.stack([np.full((32, 32), i, dtype="f4") for i in range(ONE_CALL_FROM)])
    for chunks, viewed in ((noisy, True), (smooth, False)):
        decoded = codec.decode_stacked(*_joined(codec.encode_stacked(chunks, range(ONE_CALL_FROM))), (32, 32))
        assert decoded is not None
        np.testing.assert_array_equal(decoded, chunks)
        assert decoded.flags.writeable is not viewed


def test_many_frames_decode_in_one_call_a_few_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call a frame takes the GIL back at each frame's end: many frames (a shard's, by
    one of a thread per core) are decoded in one call, a few (a slab's row) one by one."""
    from shardstore import chunk_codecs

    each: list[int] = []
    real = chunk_codecs._Zstd._each_into

    def counted(self: Any, data: Any, pieces: list[list[int]], size: int, into: memoryview) -> None:
        each.append(len(pieces))
        real(self, data, pieces, size, into)

    monkeypatch.setattr(chunk_codecs._Zstd, "_each_into", counted)
    codec = _zstd_codec((8, 8), "f4")
    for count in (ONE_CALL_FROM - 1, ONE_CALL_FROM):
        chunks = np.stack([(sample((8, 8), "f8", seed=i) * 9).astype("f4") for i in range(count)])
        decoded = codec.decode_stacked(*_joined(codec.encode_stacked(chunks, range(count))), (8, 8))
        np.testing.assert_array_equal(decoded, chunks)
    assert each == [ONE_CALL_FROM - 1]


@pytest.mark.parametrize("count", [2, ONE_CALL_FROM])  # (one by one, and in one call)
@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "too short",
        "outside the shard",
        "two frames",
        "trailing bytes",
        "trailing frame start",
        "last unfinished",
        "streamed, too short",
        "streamed, too long",
    ],
)
def test_chunks_decoded_together_raise_value_error_on_damage(damage: str, count: int) -> None:
    """The last of ``count`` chunks is damaged."""
    codec = _zstd_codec((8, 8), "f4", checksum=damage == "last unfinished")
    chunk = sample((8, 8), "f4")
    frame = codec.encode(chunk)
    last, shift = frame, 0  # (the last chunk's bytes, and how far its place is off)
    if damage == "truncated":
        last = frame[:-5]
    elif damage == "too short":  # a whole frame, of fewer elements than the chunk has
        last = codec.encode(chunk[:7])
    elif damage == "outside the shard":
        shift = 1
    elif damage == "trailing bytes":  # more than the frame in the chunk's bytes
        last = frame + b"junk"
    elif damage == "trailing frame start":  # what a stream reads as a frame yet to come
        last = frame + frame[:3]
    elif damage == "last unfinished":  # its checksum cut off: a stream just ends there
        last = frame[:-4]
    elif damage.startswith("streamed"):  # no size in its header to check first
        last = _streamed_frame(np.resize(chunk, 63 if damage.endswith("short") else 65).tobytes())
    else:  # what numcodecs would read as one chunk
        half = codec.encode(chunk[:4])
        last = half + half
    before = len(frame) * (count - 1)
    segments = np.array(
        [[k * len(frame), len(frame)] for k in range(count - 1)] + [[before + shift, len(last)]],
        dtype=np.uint64,
    )
    with pytest.raises(ValueError):
        codec.decode_stacked(frame * (count - 1) + last, segments, (8, 8))


def test_chains_other_than_zstd_alone_or_without_zstandard_go_chunk_by_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardstore import chunk_codecs

    stacked = sample((3, 4, 4), "f4")
    spec = _spec_of(stacked[0])
    segments = np.array([[0, 10]], dtype=np.uint64)
    for chain in ([BytesCodec(), GzipCodec()], [BytesCodec(), ZstdCodec(), Crc32cCodec()]):
        codec = chunk_codec(chain, spec)
        assert codec is not None
        assert codec.decode_stacked(b"x" * 10, segments, (4, 4)) is None
        assert codec.encode_stacked(stacked, [2, 0]) == [codec.encode(stacked[2]), codec.encode(stacked[0])]
    codec = chunk_codec([BytesCodec(), ZstdCodec()], spec)
    monkeypatch.setattr(chunk_codecs, "zstandard", None)
    assert codec is not None and codec.decode_stacked(b"x" * 10, segments, (4, 4)) is None
    assert [bytes(f) for f in codec.encode_stacked(stacked, [1])] == [codec.encode(stacked[1])]


def test_big_chunks_are_compressed_by_numcodecs_and_small_ones_in_one_context() -> None:
    import numcodecs

    from shardstore.chunk_codecs import NUMCODECS_FROM

    big = sample((NUMCODECS_FROM // 4 // 256, 256), "f4")
    codec = _zstd_codec(big.shape, "f4")
    assert codec.encode(big) == bytes(numcodecs.Zstd(level=0).encode(big))
    np.testing.assert_array_equal(codec.decode(codec.encode(big), big.shape), big)
    small = big[:16]
    small_codec = _zstd_codec(small.shape, "f4")
    contexts = small_codec.compressors[0]._contexts()
    assert small_codec.encode(small) == contexts[0].compress(small)


def test_zstd_contexts_are_kept_per_thread_across_codecs() -> None:
    """Every read builds its codecs anew: a thread keeps its zstandard contexts across
    them (one per level and checksum), and no two threads share one."""
    import threading

    from shardstore.chunk_codecs import _Zstd

    here = _Zstd(3, False)._contexts()
    assert _Zstd(3, False)._contexts() is here
    assert _Zstd(5, False)._contexts()[0] is not here[0]
    assert _Zstd(3, True)._contexts()[0] is not here[0]
    elsewhere: list[Any] = []
    thread = threading.Thread(target=lambda: elsewhere.append(_Zstd(3, False)._contexts()))
    thread.start()
    thread.join()
    assert elsewhere[0][0] is not here[0] and elsewhere[0][1] is not here[1]


def test_chunks_decode_together_only_where_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's small chunks a read wants decode in one call; big ones (past
    JOINED_CHUNK_BYTES) each straight into place, never held twice."""
    from shardstore.chunk_codecs import ChunkCodec
    from shardstore.chunk_work import JOINED_CHUNK_BYTES

    together: list[int] = []
    real = ChunkCodec.decode_stacked

    def counted(self: ChunkCodec, data: Any, segments: Any, shape: tuple[int, ...], *rest: Any) -> Any:
        together.append(len(segments))
        return real(self, data, segments, shape, *rest)

    monkeypatch.setattr(ChunkCodec, "decode_stacked", counted)
    monkeypatch.setattr("shardstore.pipeline.ROUTED_FROM", 1)  # (16 chunks: shard by shard all the same)
    big = (JOINED_CHUNK_BYTES // 4 // 128 + 1, 128)  # f4 chunks just past the limit
    for name, chunks in (("small", (8, 8)), ("big", big)):
        shape = (chunks[0] * 4, chunks[1] * 4)
        data = sample(shape, "f4")
        with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
            arr = zarr.create_array(
                ShardingStore(str(tmp_path / name), (2, 2)), name="a", shape=shape, chunks=chunks, dtype="f4"
            )
            arr[:] = data
            together.clear()
            row = slice(chunks[0], chunks[0] + 1)  # a row across the chunks of two shards, in part
            np.testing.assert_array_equal(arr[row, :], data[row, :])
        assert together == ([2, 2] if name == "small" else []), name
