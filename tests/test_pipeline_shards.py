"""The pipeline's shard lane: a selection's chunks routed at once, read and written
shard by shard (a shard's chunks that are a box of its block in the output, or a
whole block of the value, in one numpy operation). It gives what zarr's own
pipeline gives for every selection, codec, key encoding and data type; reads each
shard once; and a damaged chunk fails as it does through zarr's codecs."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import hypothesis.strategies as st
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from zarr.codecs import Crc32cCodec, ZstdCodec

import shardstore.pipeline
import shardstore.shard_buffers
from shardstore import PIPELINE_PATH, ChunkDecodeError, ShardAwarePipeline, ShardingStore
from shardstore.formats.indexed import IndexedFormat
from shardstore.inner import LocalInner
from shardstore.instrument import CountingInner
from shardstore.shard_buffers import ShardBuffers

from .helpers import sample

ZARR_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"


@pytest.fixture(autouse=True)
def _routed_however_few(monkeypatch: pytest.MonkeyPatch) -> None:
    """This module tests the shard-by-shard path: every selection takes it, however few
    chunks it has (outside tests, fewer than ROUTED_FROM go chunk by chunk)."""
    monkeypatch.setattr(shardstore.pipeline, "ROUTED_FROM", 1)


SHAPE, CHUNKS, CPS = (21, 22), (3, 2), (2, 3)  # shards of 6 x 6: whole blocks inside, cut at the edges

LAYOUTS: dict[str, dict[str, Any]] = {
    "raw": {"compressors": None},
    "zstd": {},
    "zstd-crc32c": {"compressors": [ZstdCodec(level=1), Crc32cCodec()]},
    "raw-dots": {"compressors": None, "chunk_key_encoding": {"name": "default", "separator": "."}},
    "raw-v2-keys": {"compressors": None, "chunk_key_encoding": {"name": "v2", "separator": "."}},
    "raw-zarr-v2": {"compressors": None, "zarr_format": 2},
    "raw-big-endian-f8": {
        "compressors": None,
        "serializer": {"name": "bytes", "configuration": {"endian": "big"}},
    },
}

_bound = st.integers(0, 21)
_box = st.tuples(_bound, _bound, _bound, _bound).map(
    lambda t: (slice(min(t[0], t[1]), max(t[0], t[1]) + 1), slice(min(t[2], t[3]), max(t[2], t[3]) + 1))
)
_chunk_rows, _chunk_cols = st.integers(0, 6), st.integers(0, 10)
_whole_chunks = st.tuples(_chunk_rows, _chunk_rows, _chunk_cols, _chunk_cols).map(
    lambda t: (
        slice(3 * min(t[0], t[1]), 3 * max(t[0], t[1]) + 3),
        slice(2 * min(t[2], t[3]), 2 * max(t[2], t[3]) + 2),
    )
)  # whole chunks: each shard's part a box of its block
_selections = st.one_of(
    st.just(("basic", (slice(None), slice(None)))),
    st.just(("basic", (slice(6, 18), slice(0, 12)))),  # whole interior shards
    _box.map(lambda b: ("basic", b)),
    _whole_chunks.map(lambda b: ("basic", b)),
    st.tuples(_box, st.integers(2, 4)).map(lambda t: ("basic", (slice(t[0][0].start, None, t[1]), t[0][1]))),
    st.integers(0, 20).map(lambda i: ("basic", (i, slice(None)))),  # an axis dropped
    st.lists(st.integers(0, 20), min_size=1, max_size=6, unique=True).map(
        lambda rows: ("orthogonal", (sorted(rows)[::-1], slice(None)))
    ),
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 21)), min_size=1, max_size=8, unique=True).map(
        lambda pts: ("coordinate", (np.array([p[0] for p in pts]), np.array([p[1] for p in pts])))
    ),
)


def _shape_of(arr: Any, kind: str, sel: Any) -> tuple[int, ...]:
    return tuple(_get(arr, kind, sel).shape)


def _get(arr: Any, kind: str, sel: Any) -> Any:
    if kind == "basic":
        return arr.get_basic_selection(sel)
    if kind == "orthogonal":
        return arr.get_orthogonal_selection(sel)
    return arr.get_coordinate_selection(sel)


def _set(arr: Any, kind: str, sel: Any, value: Any) -> None:
    if kind == "basic":
        arr.set_basic_selection(sel, value)
    elif kind == "orthogonal":
        arr.set_orthogonal_selection(sel, value)
    else:
        arr.set_coordinate_selection(sel, value)


def _array(root: Path, layout: str, pipeline: str) -> Any:
    kwargs = dict(LAYOUTS[layout])
    dtype = "f8" if "f8" in layout else "i2"
    with zarr.config.set({"codec_pipeline.path": pipeline}):
        return zarr.create_array(
            ShardingStore(str(root / pipeline), CPS),
            name="a",
            shape=SHAPE,
            chunks=CHUNKS,
            dtype=dtype,
            fill_value=-1,
            **kwargs,
        )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    writes=st.lists(
        st.tuples(_selections, st.sampled_from(["data", "fill", "scalar"])), min_size=1, max_size=4
    ),
    reads=st.lists(_selections, min_size=1, max_size=3),
)
def test_any_selection_matches_zarrs_own_pipeline(
    tmp_path_factory: pytest.TempPathFactory, layout: str, writes: list[Any], reads: list[Any]
) -> None:
    root = tmp_path_factory.mktemp("lane")
    arrays = [_array(root, layout, ZARR_PIPELINE), _array(root, layout, PIPELINE_PATH)]
    for n, ((kind, sel), what) in enumerate(writes):
        shape = _shape_of(arrays[0], kind, sel)
        value: Any = {
            "data": (sample(shape, "f8", seed=n) * 100).astype(arrays[0].dtype),
            "fill": -1,
            "scalar": 7,
        }[what]
        for arr, path in zip(arrays, (ZARR_PIPELINE, PIPELINE_PATH), strict=True):
            with zarr.config.set({"codec_pipeline.path": path}):
                _set(zarr.open_array(arr.store, path="a"), kind, sel, value)
    for kind, sel in [*reads, ("basic", (slice(None), slice(None)))]:
        got = []
        for arr, path in zip(arrays, (ZARR_PIPELINE, PIPELINE_PATH), strict=True):
            with zarr.config.set({"codec_pipeline.path": path}):
                got.append(_get(zarr.open_array(ShardingStore(arr.store.inner), path="a"), kind, sel))
        np.testing.assert_array_equal(got[0], got[1], err_msg=f"{layout} {kind} {sel}")
    with zarr.config.set({"codec_pipeline.path": ZARR_PIPELINE}):  # our bytes, zarr's codecs
        theirs = zarr.open_array(ShardingStore(arrays[0].store.inner), path="a")[:]
        ours = zarr.open_array(ShardingStore(arrays[1].store.inner), path="a")[:]
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("layout", ["raw", "zstd"])
def test_chunks_of_shards_whose_indices_are_known_are_read_by_ranges(tmp_path: Path, layout: str) -> None:
    """After a whole read the store knows every index: a chunk row then reads just its
    chunks' bytes (merged ranges), not whole shards, through the same lane."""
    inner = CountingInner(LocalInner(str(tmp_path / "s")))
    store = ShardingStore(inner, (4, 4))
    data = sample((64, 64), "f4")
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(
            store, name="a", shape=data.shape, chunks=(4, 4), dtype="f4", **LAYOUTS[layout]
        )
        arr[:] = data
        arr = zarr.open_array(store, path="a")
        np.testing.assert_array_equal(arr[:], data)
        inner.counts.reset()
        np.testing.assert_array_equal(arr[4:8], data[4:8])
        np.testing.assert_array_equal(arr[9, 3:50], data[9, 3:50])
    stored = sum(f.stat().st_size for f in (tmp_path / "s" / "a" / "c").rglob("*") if f.is_file())
    assert inner.counts.reads >= 4  # four shards' ranges, never an index again
    assert inner.counts.bytes_read <= 2 * stored // 16 + 4096  # two chunk rows of 16, not 4 shards


@pytest.mark.parametrize(
    ("layout", "damage"),
    [
        ("raw", "short"),
        ("zstd", "garbage"),
        ("zstd-crc32c", "garbage"),
        ("zstd", "a byte after"),
        ("zstd", "a frame's start after"),
        ("zstd", "a whole frame after"),
    ],
)
def test_a_damaged_chunk_in_a_whole_shard_fails_naming_it_as_zarrs_codecs_fail(
    tmp_path: Path, layout: str, damage: str
) -> None:
    """Also where the chunk's bytes are a whole frame and more, which a stream of the
    shard's frames, or a call that decodes a frame, would take without a word. Through
    shardstore's pipeline the error names the chunk; zarr's codecs' error is its cause."""
    errors = []
    for pipeline in (ZARR_PIPELINE, PIPELINE_PATH):
        arr = _array(tmp_path, layout, pipeline)
        with zarr.config.set({"codec_pipeline.path": pipeline}):
            arr[:] = 5
            shard = tmp_path / pipeline / "a" / "c" / "1" / "1"
            info = asyncio.run(ShardingStore(str(tmp_path / pipeline)).internals.array_at("a"))
            assert info is not None and info.shard_format is not None
            fmt = info.shard_format
            chunks = fmt.split(shard.read_bytes(), str(shard))
            chunks[4] = {
                "short": chunks[4][:-1],
                "garbage": b"\xff" * len(chunks[4]),
                "a byte after": chunks[4] + b"j",
                "a frame's start after": chunks[4] + chunks[4][:3],
                "a whole frame after": chunks[4] + chunks[4],
            }[damage]
            shard.write_bytes(fmt.build(chunks))
            with pytest.raises(Exception) as caught:
                zarr.open_array(ShardingStore(str(tmp_path / pipeline)), path="a")[:]
            errors.append(caught.value)
    theirs, ours = errors
    assert isinstance(ours, ChunkDecodeError) and "chunk 'a/c/3/4'" in str(ours)  # (place 4 of shard 1/1)
    assert (type(ours.__cause__), str(ours.__cause__)) == (type(theirs), str(theirs))


def test_a_commit_that_outlives_its_cancelled_write_keeps_what_was_written(tmp_path: Path) -> None:
    """A commit outlives a cancelled write (other writers may share it), and the caller
    may reuse its array at once: the commit writes the value as it was given (a raw
    shard's block cut out of it in one copy, by the commit or, where the commit has
    not come to it yet, by the write's call before it returns; never the caller's
    own array)."""

    class Gated(LocalInner):
        entered: asyncio.Event
        release: asyncio.Event
        done: asyncio.Event

        async def update(self, key: str, change: Any, **kwargs: Any) -> None:
            await self.gated(super().update(key, change, **kwargs))

        async def update_many(self, changes: Any, **kwargs: Any) -> Any:
            return await self.gated(super().update_many(changes, **kwargs))

        async def gated(self, commit: Any) -> Any:
            self.entered.set()
            await self.release.wait()
            try:
                return await commit
            finally:
                self.done.set()

    async def main() -> np.ndarray:
        inner = Gated(str(tmp_path / "s"))
        inner.entered, inner.release, inner.done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
            arr = await zarr.api.asynchronous.create_array(
                ShardingStore(inner, (4,)), name="a", shape=(4,), chunks=(1,), dtype="i4", compressors=None
            )
            value = np.arange(1, 5, dtype="i4")  # one shard, a whole block: C-contiguous already
            write = asyncio.ensure_future(arr.setitem(slice(None), value))
            await inner.entered.wait()
            write.cancel()
            with pytest.raises(asyncio.CancelledError):
                await write
            value[:] = -5  # the caller reuses its array
            inner.release.set()
            await inner.done.wait()
            reread = await zarr.api.asynchronous.open_array(
                store=ShardingStore(str(tmp_path / "s")), path="a"
            )
            return np.asarray(await reread.getitem(slice(None)))

    np.testing.assert_array_equal(asyncio.run(main()), [1, 2, 3, 4])


def test_a_write_reads_only_the_chunks_it_covers_in_part(tmp_path: Path) -> None:
    inner = CountingInner(LocalInner(str(tmp_path / "s")))
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(
            ShardingStore(inner, (4,)), name="a", shape=(64,), chunks=(4,), dtype="i4", compressors=None
        )
        arr[:] = np.arange(64, dtype="i4")
        arr = zarr.open_array(ShardingStore(inner, (4,), read_strategy="chunk"), path="a")
        inner.counts.reset()
        arr[0:15] = 8  # chunks 0-2 whole, chunk 3 (the shard's last) in part
    assert inner.counts.bytes_read == 4 * 16 + 16  # the shard's index, then chunk 3 alone
    expected = np.arange(64, dtype="i4")
    expected[0:15] = 8
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")[:], expected)


@pytest.mark.parametrize("layout", [*sorted(LAYOUTS), "crc32c"])
def test_intact_chunks_never_go_to_zarrs_codecs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """Every codec chain the pipeline runs itself decodes intact chunks itself (whole
    reads, boxes, cut chunks, chunks a write covers in part): zarr's codecs see only
    chunks that do not decode. (A chunk the pipeline fails on is handed to them, and
    the data still comes out right: only this shows that the fast path ran.)"""
    kwargs = LAYOUTS[layout] if layout in LAYOUTS else {"compressors": [Crc32cCodec()]}
    arr = zarr.create_array(
        ShardingStore(str(tmp_path / "s"), CPS), name="a", shape=SHAPE, chunks=CHUNKS,
        dtype="f8" if "f8" in layout else "i2", fill_value=-1, **kwargs,
    )  # fmt: skip
    data = (sample(SHAPE, "f8", seed=5) * 100).astype(arr.dtype)
    arr[:] = data
    handed: list[int] = []
    for name in ("read_batch", "write_batch"):
        one = getattr(ShardAwarePipeline, name)

        async def counted(self: Any, items: Any, *args: Any, one: Any = one) -> Any:
            items = list(items)
            handed.append(len(items))
            return await one(self, items, *args)

        monkeypatch.setattr(ShardAwarePipeline, name, counted)
    arr = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
    arr[1:20, 3:21] = 9  # chunks covered in part: their old bytes decoded
    data[1:20, 3:21] = 9
    for sel in [(slice(None), slice(None)), (slice(3, 12), slice(2, 10)), (slice(1, 17), slice(5, 9))]:
        np.testing.assert_array_equal(arr[sel], data[sel], err_msg=str(sel))
    assert handed == []


@pytest.mark.parametrize("layout", ["raw", "zstd"])
def test_a_slabs_chunks_are_placed_a_shard_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """A row of chunks across the array (a slab), and a box of whole chunks across
    shard corners, are parts of each shard's block: each shard's chunks go into the
    output in one operation, none alone; a chunk that was never written is the fill
    value there."""
    import shardstore.chunk_work as chunk_work

    arr = _array(tmp_path, layout, PIPELINE_PATH)
    data = (sample(SHAPE, "f8", seed=3) * 100).astype("i2")
    arr[:] = data
    arr[3:6, 4:6] = -1  # one chunk of fill values: not stored
    data[3:6, 4:6] = -1

    alone: list[Any] = []  # (a failure there would be caught: zarr's codecs redo the chunk)
    for name in ("place_chunk", "decode_into"):
        one = getattr(chunk_work, name)
        monkeypatch.setattr(chunk_work, name, lambda *args, one=one: alone.append(args) or one(*args))
    reread = zarr.open_array(ShardingStore(arr.store.inner), path="a")
    for sel in [(slice(3, 6), slice(None)), (slice(3, 12), slice(2, 10)), (slice(0, 18), slice(4, 6))]:
        np.testing.assert_array_equal(reread[sel], data[sel], err_msg=str(sel))
    assert alone == []


class _Recording(LocalInner):
    """Records what each commit's change gives the store to write, by shard key."""

    def __init__(self, root: str, *, writes_buffers: bool = True, by_commit: bool = True) -> None:
        super().__init__(root)
        self.capabilities = dataclasses.replace(
            LocalInner.capabilities, writes_buffers=writes_buffers, changes_in_threads=by_commit
        )
        self.written: dict[str, Any] = {}

    def _update(self, path: Path, change: Any, read_old: bool) -> None:
        def recorded(old: bytes | None) -> Any:
            new = change(old)
            self.written[path.relative_to(self.root).as_posix()] = new
            return new

        super()._update(path, recorded, read_old)


@pytest.mark.parametrize("writes_buffers", [True, False])
@pytest.mark.parametrize("index_location", ["start", "end"])
def test_a_raw_whole_block_is_copied_once_into_the_shard_object_it_commits(
    tmp_path: Path, writes_buffers: bool, index_location: str
) -> None:
    """A shard stored raw whose every chunk a write gives is built around one copy of
    its block: the object holds the chunks in order and the index, exactly what the
    format builds of those chunks; it is written as it is where the inner store takes
    any buffer, else as bytes. A shard with a chunk of fill values leaves it out, and
    is given as its index and chunks, not joined, where the store takes any buffers.
    (The chunks are stored big-endian: the copy is also the byte swap.)"""
    inner = _Recording(str(tmp_path / "s"), writes_buffers=writes_buffers)
    store = ShardingStore(inner, CPS, index_location=index_location, index_checksum=True)  # type: ignore[arg-type]
    value = np.arange(1, 18 * 18 + 1, dtype="i4").reshape(18, 18)
    value[0:3, 0:2] = 0  # chunk (0, 0) is all fill: shard (0, 0) stores 5 chunks of 6
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(
            store, name="a", shape=(18, 18), chunks=CHUNKS, dtype="i4", compressors=None, fill_value=0,
            serializer={"name": "bytes", "configuration": {"endian": "big"}},
        )  # fmt: skip
        arr[:] = value
        np.testing.assert_array_equal(arr[:], value)
    fmt = IndexedFormat(CPS, index_location, True)  # type: ignore[arg-type]
    shards = {key: new for key, new in inner.written.items() if "/c/" in f"/{key}"}
    assert len(shards) == 9
    for key, new in shards.items():
        i, j = (int(c) for c in key.split("/")[-2:])
        block = value[i * 6 : (i + 1) * 6, j * 6 : (j + 1) * 6]
        chunks = {
            p: block[a * 3 : (a + 1) * 3, b * 2 : (b + 1) * 2].astype(">i4").tobytes()
            for p, (a, b) in enumerate(np.ndindex(CPS))
            if (i, j, a, b) != (0, 0, 0, 0)
        }
        assert (b"".join(new) if isinstance(new, list) else bytes(new)) == fmt.build(chunks)
        built = (i, j) != (0, 0)
        assert isinstance(new, memoryview) == (built and writes_buffers), key
        assert isinstance(new, list) == (not built and writes_buffers), key  # index and chunks, unjoined


@pytest.mark.parametrize("writes_buffers", [True, False])
def test_compressed_shards_reach_a_local_file_as_their_index_and_chunks_unjoined(
    tmp_path: Path, writes_buffers: bool
) -> None:
    """Where the inner store takes any buffers, a shard of compressed chunks is handed
    to it as its index and its chunks, for one ``writev`` instead of a join; elsewhere
    as bytes. Either way it is the object the format builds of those chunks."""
    inner = _Recording(str(tmp_path / "s"), writes_buffers=writes_buffers)
    store = ShardingStore(inner, CPS)  # type: ignore[arg-type]
    value = np.arange(18 * 18, dtype="f4").reshape(18, 18) + 1
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(store, name="a", shape=(18, 18), chunks=CHUNKS, dtype="f4", fill_value=0)
        arr[:] = value
        np.testing.assert_array_equal(arr[:], value)
    fmt = IndexedFormat(CPS, "end", False)  # type: ignore[arg-type]
    shards = {key: new for key, new in inner.written.items() if "/c/" in f"/{key}"}
    assert len(shards) == 9
    for key, new in shards.items():
        assert isinstance(new, list) == writes_buffers, key
        if isinstance(new, list):
            chunks = fmt.split(b"".join(new), key)
            assert [bytes(p) for p in new[:-1]] == [chunks[p] for p in sorted(chunks)]  # as encoded
            new = b"".join(new)
        assert fmt.build(fmt.split(new, key)) == new


def test_a_shard_built_whole_inside_a_batch_merges_with_later_writes_to_it(tmp_path: Path) -> None:
    inner = CountingInner(LocalInner(str(tmp_path / "s")))
    store = ShardingStore(inner, (2, 2))
    expected = np.arange(64, dtype="i4").reshape(8, 8)
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="i4", compressors=None)
        inner.counts.reset()
        with store.batch():
            arr[:] = expected  # four shards, each built whole, so complete: committed at once
            arr[0:1, 0:1] = -1  # part of a chunk of a buffered shard
            arr[4:6, 4:6] = -2  # a whole chunk of another
            expected[0:1, 0:1] = -1
            expected[4:6, 4:6] = -2
            np.testing.assert_array_equal(arr[:], expected)  # (reads see the batch)
        assert inner.counts.writes == 4 + 2  # each shard once as it was complete, two again at the end
    reopened = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
    np.testing.assert_array_equal(reopened[:], expected)


def test_only_shards_with_no_chunk_of_fill_values_are_built_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shards built in place share one allocation until all are committed: a shard
    that may leave out a chunk of fill values is copied on its own instead, so that
    a write of mostly empty shards holds no memory for them."""
    asked: list[int] = []
    real = IndexedFormat.dense_shards
    monkeypatch.setattr(
        IndexedFormat,
        "dense_shards",
        lambda self, size, count, empty: (asked.append(count), real(self, size, count, empty))[1],
    )
    value = np.arange(1, 18 * 18 + 1, dtype="i4").reshape(18, 18)
    value[6:12, :] = 0  # shards (1, *): all fill values
    value[12, 0] = 0  # shard (2, 0): its first chunk starts with one
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(
            ShardingStore(LocalInner(str(tmp_path / "s")), CPS), name="a", shape=(18, 18), chunks=CHUNKS,
            dtype="i4", compressors=None, fill_value=0,
        )  # fmt: skip
        arr[:] = value
        np.testing.assert_array_equal(arr[:], value)
    assert sum(asked) == 5  # shards (0, *) and (2, 1), (2, 2)
    assert not (tmp_path / "s" / "a" / "c" / "1").exists()


class _Spied(ShardBuffers):
    made: ClassVar[list[_Spied]] = []

    def __init__(self) -> None:
        super().__init__()
        self.built = 0
        self.made.append(self)

    def empty(self, count: int, nbytes: int) -> np.ndarray:
        self.built += 1
        return super().empty(count, nbytes)


@pytest.fixture
def shard_buffers(monkeypatch: pytest.MonkeyPatch) -> list[_Spied]:
    """Each write's ShardBuffers (those that built shards in place; reads have theirs
    too), none given memory an earlier call left; groups of one shard (half
    ``fetch_concurrency=2``)."""
    monkeypatch.setattr(shardstore.pipeline, "GROUP_BYTES", 0)
    monkeypatch.setattr(shardstore.pipeline, "ShardBuffers", _Spied)
    monkeypatch.setattr(shardstore.shard_buffers, "SPARE_BYTES", 0)
    monkeypatch.setattr(shardstore.shard_buffers, "TRACKED_FROM", 0)  # (small shards here)
    monkeypatch.setattr(shardstore.shard_buffers, "_SPARE", shardstore.shard_buffers._Spare())
    monkeypatch.setattr(_Spied, "made", [])
    return _Spied.made


def _writes(made: list[_Spied]) -> list[_Spied]:
    return [buffers for buffers in made if buffers.built]


@pytest.mark.parametrize("by_commit", [False, True])
def test_a_group_built_in_place_takes_the_memory_of_one_committed_before_it(
    tmp_path: Path, shard_buffers: list[_Spied], by_commit: bool
) -> None:
    """Nine shards in nine groups, two at a time: each group from the third on is
    built in the memory of a group whose commit has ended, and every shard holds
    its own block, written and overwritten. Shards encoded by their commits are
    built one at a time here: each in the memory of the one committed before it."""
    inner = LocalInner(str(tmp_path / "s"))
    inner.capabilities = dataclasses.replace(inner.capabilities, changes_in_threads=by_commit)
    store = ShardingStore(inner, CPS, fetch_concurrency=2)
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(store, name="a", shape=(18, 18), chunks=CHUNKS, dtype="i4", compressors=None)
        for value in (np.arange(1, 18 * 18 + 1, dtype="i4").reshape(18, 18), np.full((18, 18), -3, "i4")):
            arr[:] = value
            reopened = zarr.open_array(ShardingStore(str(tmp_path / "s")), path="a")
            np.testing.assert_array_equal(reopened[:], value)
    assert [buffers.allocated for buffers in _writes(shard_buffers)] == ([1, 1] if by_commit else [2, 2])


@pytest.mark.parametrize("by_commit", [False, True])
@pytest.mark.parametrize("writes_buffers", [True, False])
def test_memory_a_written_shard_is_still_held_in_is_never_built_in_again(
    tmp_path: Path, shard_buffers: list[_Spied], writes_buffers: bool, by_commit: bool
) -> None:
    """Memory is built in again only when nothing refers to it: a store that keeps
    each shard object it was given (a memoryview of that memory, where it takes any
    buffer) keeps all of it from later groups, and every object it kept still holds
    its own shard; one given bytes (a copy) lets the memory go at once."""
    inner = _Recording(str(tmp_path / "s"), writes_buffers=writes_buffers, by_commit=by_commit)
    store = ShardingStore(inner, CPS, fetch_concurrency=2)
    value = np.arange(1, 18 * 18 + 1, dtype="i4").reshape(18, 18)
    with zarr.config.set({"codec_pipeline.path": PIPELINE_PATH}):
        arr = zarr.create_array(store, name="a", shape=(18, 18), chunks=CHUNKS, dtype="i4", compressors=None)
        arr[:] = value
    fmt = IndexedFormat(CPS, "end", False)
    shards = {key: new for key, new in inner.written.items() if "/c/" in f"/{key}"}
    assert len(shards) == 9
    for key, new in shards.items():
        assert isinstance(new, memoryview) == writes_buffers
        i, j = (int(c) for c in key.split("/")[-2:])
        block = value[i * 6 : (i + 1) * 6, j * 6 : (j + 1) * 6]
        chunks = {
            p: block[a * 3 : (a + 1) * 3, b * 2 : (b + 1) * 2].tobytes()
            for p, (a, b) in enumerate(np.ndindex(CPS))
        }
        assert bytes(new) == fmt.build(chunks), key
    assert [buffers.allocated for buffers in _writes(shard_buffers)] == [
        9 if writes_buffers else 1 if by_commit else 2
    ]
