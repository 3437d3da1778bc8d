"""``shardstore convert``: a whole hierarchy re-sharded, un-sharded or re-laid, chunk bytes unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore

from shardstore import ShardingStore
from shardstore.cli import main as cli
from shardstore.convert import convert

DATA = np.arange(600, dtype="f4").reshape(30, 20)


def _source(root: Path) -> None:
    store = ShardingStore(str(root), (2, 2))
    group = zarr.open_group(store, mode="w")
    group.attrs["title"] = "kept"
    group.create_array("x/a", shape=DATA.shape, chunks=(5, 5), dtype="f4")[:] = DATA
    group.create_array("b", shape=(7,), chunks=(2,), dtype="i2")[:] = 3  # rank 1: stays unsharded
    zarr.consolidate_metadata(store)


def _chunk_bytes(store: ShardingStore, key: str) -> bytes:
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    value = sync(store.get(key, default_buffer_prototype()))
    assert value is not None
    return value.to_bytes()


def test_convert_to_the_codec_layout_is_readable_by_plain_zarr(tmp_path: Path) -> None:
    _source(tmp_path / "src")
    assert cli(["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--chunks-per-shard", "3,2",
                "--layout", "codec", "--index-checksum"]) == 0  # fmt: skip
    plain = zarr.open_group(LocalStore(tmp_path / "dst"), mode="r")
    assert plain["x/a"].shards == (15, 10) and plain.attrs["title"] == "kept"  # type: ignore[union-attr]
    np.testing.assert_array_equal(plain["x/a"][:], DATA)  # type: ignore[index]
    np.testing.assert_array_equal(plain["b"][:], 3)  # type: ignore[index]
    src, dst = ShardingStore(str(tmp_path / "src")), ShardingStore(str(tmp_path / "dst"))
    assert _chunk_bytes(src, "x/a/c/3/2") == _chunk_bytes(dst, "x/a/c/3/2")  # copied, never re-encoded
    consolidated = zarr.open_consolidated(LocalStore(tmp_path / "dst"))
    assert consolidated["x/a"].shards == (15, 10)  # type: ignore[union-attr]


def test_convert_unshard_writes_plain_chunks(tmp_path: Path) -> None:
    _source(tmp_path / "src")
    report = convert(ShardingStore(str(tmp_path / "src")), ShardingStore(str(tmp_path / "un")))
    assert (report.arrays, report.chunks) == (2, 24 + 4)
    assert len(list((tmp_path / "un" / "x" / "a" / "c").rglob("*"))) == 6 + 24  # 6 row dirs, 24 chunks
    np.testing.assert_array_equal(zarr.open_array(LocalStore(tmp_path / "un"), path="x/a")[:], DATA)


def test_convert_refuses_before_writing_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    v2 = zarr.create_array(ShardingStore(str(tmp_path / "src")), name="v", shape=(9, 9), chunks=(3, 3),
                           dtype="u1", zarr_format=2)  # fmt: skip
    v2[:] = 7
    assert cli(["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--chunks-per-shard", "3,3",
                "--layout", "codec"]) == 2  # fmt: skip
    assert "zarr v2" in capsys.readouterr().err and not (tmp_path / "dst").exists()
    assert cli(["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--chunks-per-shard", "3,3"]) == 0
    np.testing.assert_array_equal(zarr.open_array(ShardingStore(str(tmp_path / "dst")), path="v")[:], 7)
    assert cli(["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--unshard"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (
        cli(["convert", str(tmp_path / "src"), str(tmp_path / "x"), "--unshard", "--chunks-per-shard", "2,2"])
        == 2
    )
    assert cli(["convert", str(tmp_path / "src"), str(tmp_path / "x"), "--chunks-per-shard", "2,x"]) == 2
