"""A local file written from pieces (a shard's index and chunks, not joined): every byte
in order, whatever ``writev`` takes at a time, and the same object the format builds."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardstore.inner.local as local_module
from shardstore.formats.indexed.format import IndexedFormat
from shardstore.inner.local import LocalInner


class _ShortWrites:
    """Stands in for ``os`` inside shardstore.inner.local: each ``writev`` takes at most
    ``most`` bytes of at most ``pieces`` pieces (what a file system may do)."""

    def __init__(self, most: int, pieces: int) -> None:
        self.most, self.pieces, self.calls = most, pieces, 0

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def writev(self, fd: int, buffers: list[memoryview]) -> int:
        self.calls += 1
        assert len(buffers) <= local_module._IOV_MAX
        data = b"".join(bytes(b) for b in buffers[: self.pieces])[: self.most]
        return os.write(fd, data)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), max_size=40),
    most=st.integers(1, 500),
    pieces=st.integers(1, 5),
)
def test_pieces_are_written_whole_and_in_order_whatever_each_writev_takes(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], most: int, pieces: int
) -> None:
    rng = np.random.default_rng(len(sizes) * 1000 + most)
    parts: list[bytes | memoryview] = [rng.bytes(n) for n in sizes]
    parts = [memoryview(p) if k % 2 else p for k, p in enumerate(parts)]  # bytes and views alike
    path = tmp_path_factory.mktemp("w") / "shard"
    short = _ShortWrites(most, pieces)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local_module, "os", short)
        mp.setattr(local_module, "_IOV_MAX", 3)
        LocalInner._write(path, parts)
    assert path.read_bytes() == b"".join(parts)
    assert short.calls >= -(-sum(sizes) // most)  # (it did go through the short writes)


def test_a_writev_that_writes_nothing_is_an_error_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_module, "os", _ShortWrites(0, 1))
    with pytest.raises(OSError, match="wrote nothing"):
        LocalInner._write(tmp_path / "shard", [b"abc", b"def"])
    assert list(tmp_path.iterdir()) == []  # (the temporary file is gone too)


@pytest.mark.parametrize("index_location", ["start", "end"])
def test_a_shards_pieces_are_the_object_it_builds(index_location: str) -> None:
    fmt = IndexedFormat((2, 3), index_location, True)  # type: ignore[arg-type]
    chunks: dict[int, bytes | memoryview] = {0: b"a" * 5, 2: memoryview(b"bb"), 5: b"c" * 9}
    pieces = fmt.pieces(chunks)
    assert b"".join(pieces) == fmt.build(chunks)
    assert [bytes(p) for p in (pieces[1:] if index_location == "start" else pieces[:-1])] == [
        bytes(chunks[p]) for p in sorted(chunks)
    ]  # the chunks themselves, in place order
    assert fmt.split(fmt.build(chunks), "k") == {p: bytes(c) for p, c in chunks.items()}
