"""content_sizes: each chunk's frame content size, where its bytes are one zstd frame
and nothing after it, read from the frames' headers: every kind of block, header and
frame zstd writers make, and the damage a stream decoding a shard's frames together
would not notice. Each test runs both ways: frames alike read at once, and the walk a
block a step that reads any."""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore import zstd_frames

SKIPPABLE = 0x184D2A50
ALIKE, WALKED = zstd_frames._alike, zstd_frames._walked


@pytest.fixture(autouse=True, params=["alike first", "walked"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test once as frames come, once with every frame walked a block a step."""
    if request.param == "walked":
        monkeypatch.setattr(zstd_frames, "_alike", lambda data, segments: None)
    return str(request.param)


def _content(kind: str, nbytes: int) -> bytes:
    rng = np.random.default_rng(nbytes)
    return {
        "random": rng.integers(0, 256, nbytes, dtype=np.uint8),  # raw blocks
        "constant": np.full(nbytes, 7, dtype=np.uint8),  # RLE blocks
        "smooth": (np.arange(nbytes) // 97 % 256).astype(np.uint8),  # compressed blocks
    }[kind].tobytes()


def _frame(data: bytes, checksum: bool, streamed: bool) -> bytes:
    compressor = zstandard.ZstdCompressor(write_checksum=checksum)
    if not streamed:
        return compressor.compress(data)
    stream = compressor.compressobj()  # (no content size in its header)
    return stream.compress(data) + stream.flush()


def _shard(frames: list[bytes], gap: bytes = b"") -> tuple[np.ndarray, np.ndarray]:
    """Frames one after another (``gap`` before each), and their segments."""
    blob = b"".join(gap + frame for frame in frames)
    sizes = np.array([len(frame) for frame in frames], dtype=np.uint64)
    starts = np.cumsum(sizes + len(gap)) - sizes
    return np.frombuffer(blob, dtype=np.uint8), np.stack([starts, sizes], axis=1).astype(np.uint64)


def _with_header(frame: bytes, single_segment: int, size_flag: int, dictionary_flag: int, said: int) -> bytes:
    """``frame`` (of zstandard's, single segment, 2-byte content size) with its header
    rewritten to the flags given, saying ``said`` bytes where it has a content size:
    the same blocks after a header of another size."""
    descriptor = frame[4]
    assert (descriptor >> 5) & 1 and descriptor >> 6 == 1, "a single-segment frame of a 2-byte size"
    blocks = frame[4 + 1 + 2 :]
    size_bytes = (1 << size_flag) if size_flag else single_segment
    header = bytes([(size_flag << 6) | (single_segment << 5) | (descriptor & 0b100) | dictionary_flag])
    header += b"" if single_segment else b"\x48"  # (a window descriptor)
    header += b"\x01" * (4 if dictionary_flag == 3 else dictionary_flag)
    header += (said - (256 if size_bytes == 2 else 0)).to_bytes(size_bytes, "little")
    return frame[:4] + header + blocks


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["random", "constant", "smooth"]), st.sampled_from([1, 300, 40_000, 300_000])
        ),
        min_size=1,
        max_size=4,
    ),
    st.booleans(),
    st.booleans(),
    st.sampled_from([b"", b"gap"]),
)
def test_frames_zstd_writes_fill_their_pieces(
    contents: list[tuple[str, int]], checksum: bool, streamed: bool, gap: bytes
) -> None:
    """Raw, RLE and compressed blocks, one or many (past 128 KiB), a checksum or none,
    the content size said or not, pieces end to end or apart: all whole frames."""
    frames = [_frame(_content(kind, nbytes), checksum, streamed) for kind, nbytes in contents]
    data, segments = _shard(frames, gap)
    said = zstd_frames.content_sizes(data, segments)
    assert said is not None
    assert said.tolist() == [-1 if streamed else nbytes for _, nbytes in contents]


def test_numcodecs_frames_fill_their_pieces() -> None:
    frames = [bytes(numcodecs.Zstd(level=level).encode(_content("smooth", 20_000))) for level in (1, 5, 22)]
    said = zstd_frames.content_sizes(*_shard(frames))
    assert said is not None and said.tolist() == [20_000] * 3


@pytest.mark.parametrize("single_segment", [0, 1])
@pytest.mark.parametrize("size_flag", [0, 1, 2, 3])
@pytest.mark.parametrize("dictionary_flag", [0, 1, 2, 3])
def test_every_frame_header_size_is_walked(single_segment: int, size_flag: int, dictionary_flag: int) -> None:
    """A window descriptor or not, a content size of 0, 1, 2, 4 or 8 bytes and a
    dictionary id of 0, 1, 2 or 4: the content size is read where it is, and the blocks
    found after the header, whatever its size (one byte more or less and they are not)."""
    said = {0: 200, 1: 300, 2: 2**25 + 7, 3: 2**40 + 3}[size_flag] if size_flag or single_segment else -1
    frame = _with_header(
        _frame(_content("smooth", 300), False, False),
        single_segment,
        size_flag,
        dictionary_flag,
        max(said, 0),
    )
    got = zstd_frames.content_sizes(*_shard([frame, frame]))
    assert got is not None and got.tolist() == [said, said]
    for wrong in (frame + b"\x00", frame[:-1]):
        assert zstd_frames.content_sizes(*_shard([frame, wrong])) is None


@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize(
    "damage",
    [
        "cut short",
        "checksum cut off",
        "a byte after",
        "a frame's start after",
        "a whole frame after",
        "a skippable frame after",
        "a skippable frame",
        "no magic number",
        "a reserved bit",
        "a reserved block",
        "outside the data",
        "too short for a frame",
    ],
)
def test_anything_but_one_whole_frame_does_not_fill_its_piece(checksum: bool, damage: str) -> None:
    """Damage in the first piece of two, or the last: each is found."""
    frame = _frame(_content("smooth", 4000), checksum, False)
    bad = {
        "cut short": frame[:-5],
        "checksum cut off": frame[:-4],
        "a byte after": frame + b"j",
        "a frame's start after": frame + frame[:7],
        "a whole frame after": frame + frame,
        "a skippable frame after": frame
        + SKIPPABLE.to_bytes(4, "little")
        + (2).to_bytes(4, "little")
        + b"xx",
        "a skippable frame": SKIPPABLE.to_bytes(4, "little") + (len(frame)).to_bytes(4, "little") + frame,
        "no magic number": b"\x00" + frame[1:],
        "a reserved bit": frame[:4] + bytes([frame[4] | 0b1000]) + frame[5:],
        "a reserved block": frame[:7] + bytes([frame[7] | 0b110]) + frame[8:],
        "outside the data": frame,
        "too short for a frame": frame[:7],
    }[damage]
    if damage == "a reserved block":
        assert frame[4] & ~0b100 == 0x60 and (frame[7] >> 1) & 3 != 3  # (its first block header at byte 7)
    if damage == "checksum cut off" and not checksum:
        bad = frame[:-1]
    for pieces in ([bad, frame], [frame, bad]):
        data, segments = _shard(pieces)
        if damage == "outside the data":
            segments[-1, 1] += 1
        assert zstd_frames.content_sizes(data, segments) is None, pieces.index(bad)


def test_a_frame_that_covers_the_next_pieces_frame_does_not_fill_its_piece() -> None:
    """A piece holding two frames and the start of a skippable one that covers the next
    piece's frame: decoded as one stream, the pieces' total output is right and every
    frame header said the right size, but the next piece's frame is never read."""
    frame, other = (_frame(_content("smooth", 4000 + i), False, False) for i in (0, 1))
    swallow = frame + other + SKIPPABLE.to_bytes(4, "little") + len(frame).to_bytes(4, "little")
    assert zstd_frames.content_sizes(*_shard([swallow, frame])) is None


def _mangled(frame: bytes, how: int, at: int) -> bytes:
    """``frame`` as is, cut short, with bytes after it, or with one byte changed."""
    if how == 1:
        return frame[: at % len(frame)]
    if how == 2:
        return frame + bytes([at % 256]) * (1 + at % 5)
    if how == 3:
        k = at % min(len(frame), 24)  # (the header and first block header)
        return frame[:k] + bytes([frame[k] ^ (1 << (at % 8))]) + frame[k + 1 :]
    return frame


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["random", "constant", "smooth"]),
            st.sampled_from([1, 300, 40_000, 300_000]),
            st.sampled_from([0, 0, 1, 2, 3]),
            st.integers(0, 2**16),
            st.sampled_from([(False, False), (False, False), (True, False), (False, True)]),
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_frames_read_alike_say_what_the_walk_says(
    pieces: list[tuple[str, int, int, int, tuple[bool, bool]]],
) -> None:
    """Whatever the pieces (whole frames or damaged ones, with headers alike or not),
    reading them as frames alike says nothing or what the walk says."""
    frames = [_mangled(_frame(_content(kind, n), *flags), how, at) for kind, n, how, at, flags in pieces]
    data, segments = _shard(frames)
    alike, walked = ALIKE(data, segments), WALKED(data, segments)
    if alike is not None:
        assert walked is not None and alike.tolist() == walked.tolist()


def test_frames_one_writer_makes_are_read_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's chunks as a writer makes them (one header, one block each) need no walk."""
    monkeypatch.setattr(zstd_frames, "_alike", ALIKE)
    monkeypatch.setattr(zstd_frames, "_walked", lambda data, segments: pytest.fail("walked"))
    for level in (1, 5):
        frames = [
            bytes(numcodecs.Zstd(level=level).encode(_content("smooth", 16_384 + k))) for k in range(64)
        ]
        said = zstd_frames.content_sizes(*_shard(frames))
        assert said is not None and said.tolist() == [16_384 + k for k in range(64)]
