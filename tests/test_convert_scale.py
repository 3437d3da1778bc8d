"""``convert`` at scale: one writer per destination shard on threads or a dask
cluster, resumable after an interruption (shards checked by their index, not by
existence), a summary of what it did, and a source without a hierarchy refused."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.core.sync import sync

from shardstore import ShardingStore
from shardstore import convert as convert_module
from shardstore.cli import main as cli
from shardstore.convert import ConvertReport, Unit, convert, copy_unit, terminal_progress
from shardstore.errors import ShardingConfigError, ShardStoreError

pytestmark = pytest.mark.filterwarnings(
    "ignore::shardstore.errors.UnshardedArrayWarning", "ignore:Both zarr.json:UserWarning"
)

ARRAYS = {  # path: (shape, chunks, dtype, zarr_format)
    "g/a": ((64, 64), (8, 8), "f4", 3),  # sharded 2x2 in the source: 16 shards of 4 chunks
    "g/sub/c": ((4, 32, 32), (1, 8, 8), "i4", 3),  # 3-d: unsharded in the destination (one block)
    "x": ((100,), (10,), "i8", 3),  # 1-d coordinate: unsharded (one block)
    "old/v": ((30, 30), (5, 5), "u2", 2),  # zarr v2, 6x6 chunks
}
CHUNKS = 64 + 64 + 10 + 36
SHARDS = 4 + 4  # destination shards (4, 4): g/a 2x2, old/v 2x2
BLOCKS = 2


def _data(path: str) -> np.ndarray[Any, Any]:
    shape, _, dtype, _ = ARRAYS[path]
    return (np.arange(int(np.prod(shape))) % 1000 + len(path)).astype(dtype).reshape(shape)


def _source(root: Path) -> Path:
    """A hierarchy of v3 and v2 arrays, a nested group and attributes; ``g/a`` sharded."""
    store = ShardingStore(str(root), {"g/a": [2, 2]})
    group = zarr.open_group(store, mode="w")
    group.attrs["title"] = "survey"
    group.create_group("g").attrs["level"] = 1
    zarr.open_group(store, path="old", mode="w", zarr_format=2).attrs["legacy"] = True
    for path, (shape, chunks, dtype, fmt) in ARRAYS.items():
        arr = zarr.create_array(store, name=path, shape=shape, chunks=chunks, dtype=dtype, zarr_format=fmt)
        arr[:] = _data(path)
    return root


_V2_DOCUMENTS = {".zarray", ".zgroup", ".zattrs", ".zmetadata"}
SHARD_FILES = [
    "g/a/c/0/0",
    "g/a/c/0/1",
    "g/a/c/1/0",
    "g/a/c/1/1",
    "old/v/0.0",
    "old/v/0.1",
    "old/v/1.0",
    "old/v/1.1",
]


def _files(root: Path) -> int:
    """Objects in a directory store (not the hidden files writers keep beside them)."""
    return sum(1 for p in root.rglob("*") if p.is_file() and (p.name[0] != "." or p.name in _V2_DOCUMENTS))


def _check_copy(dst: Path) -> None:
    store = ShardingStore(str(dst))  # a fresh store: configs read from the metadata
    for path in ARRAYS:
        np.testing.assert_array_equal(zarr.open_array(store, path=path)[:], _data(path))
    root = zarr.open_group(store, mode="r")
    assert root.attrs["title"] == "survey" and root["g"].attrs["level"] == 1
    assert zarr.open_group(store, path="old", mode="r").attrs["legacy"] is True


def _dst(root: Path) -> ShardingStore:
    return ShardingStore(str(root), (4, 4))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _source(tmp_path_factory.mktemp("scale") / "src")


def test_convert_on_threads_gives_equal_data_in_fewer_objects(source: Path, tmp_path: Path) -> None:
    report = convert(ShardingStore(str(source), read_only=True), _dst(tmp_path / "dst"), workers=2)
    assert (report.arrays, report.chunks, report.chunks_copied) == (4, CHUNKS, CHUNKS)
    assert (report.shards_written, report.shards_skipped) == (SHARDS, 0)
    assert (report.blocks_written, report.blocks_skipped) == (BLOCKS, 0)
    assert report.objects_before == _files(source) and report.objects_after == _files(tmp_path / "dst")
    assert report.objects_after < report.objects_before
    assert report.bytes > 0 and report.bytes_after > report.bytes and report.seconds > 0
    _check_copy(tmp_path / "dst")
    assert all((tmp_path / "dst" / key).is_file() for key in SHARD_FILES)


class _Stop(Exception):
    pass


def test_interrupted_then_resumed_skips_complete_shards_and_rewrites_partial_ones(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst = tmp_path / "dst"
    copied = []

    def fail_after_four(src: ShardingStore, dst: ShardingStore, unit: Unit) -> tuple[int, int]:
        if len(copied) == 4:
            raise _Stop  # a fault: every unit after the fourth fails
        copied.append(unit.name)
        return copy_unit(src, dst, unit)

    monkeypatch.setattr(convert_module, "copy_unit", fail_after_four)
    with pytest.raises(_Stop):
        convert(ShardingStore(str(source), read_only=True), _dst(dst), workers=1)
    monkeypatch.undo()
    assert copied == SHARD_FILES[:4]  # units run in key order
    assert [key for key in SHARD_FILES if (dst / key).exists()] == SHARD_FILES[:4]
    assert not (dst / "zarr.json").exists()  # group documents come last: no half hierarchy opens
    # Complete shards of g/a: one made partial (a chunk removed), one damaged (truncated).
    sync(ShardingStore(str(dst)).delete("g/a/c/0/0"))
    damaged = dst / "g" / "a" / "c" / "1" / "1"
    damaged.write_bytes(damaged.read_bytes()[:-5])
    assert (dst / "g" / "a" / "c" / "0" / "0").exists()  # it exists, but is not complete

    report = convert(ShardingStore(str(source), read_only=True), _dst(dst), workers=2)
    assert report.shards_skipped == 4 - 2
    assert report.shards_written == SHARDS - report.shards_skipped
    assert (report.blocks_written, report.blocks_skipped) == (BLOCKS, 0)
    assert report.chunks == CHUNKS and report.chunks_copied == CHUNKS - 16 * (4 - 2)
    _check_copy(dst)
    assert cli(["verify", str(dst)]) == 0

    again = convert(ShardingStore(str(source), read_only=True), _dst(dst))
    assert (again.shards_written, again.shards_skipped, again.blocks_skipped) == (0, SHARDS, BLOCKS)
    assert again.bytes == 0 and again.objects_after == report.objects_after


def test_resume_refuses_another_conversion(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "dst"
    with pytest.raises(_Stop):
        convert(
            ShardingStore(str(source), read_only=True), _dst(dst), workers=1, progress=lambda d, t: _raise()
        )
    with pytest.raises(ShardingConfigError, match="not empty and holds no interrupted conversion"):
        convert(ShardingStore(str(source), read_only=True), ShardingStore(str(dst), (2, 2)))
    with pytest.raises(ShardingConfigError, match="not empty"):
        convert(ShardingStore(str(source), read_only=True), _dst(dst), resume=False)
    assert cli(["convert", str(source), str(dst), "--chunks-per-shard", "4,4", "--no-resume"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert cli(["convert", str(source), str(dst), "--chunks-per-shard", "4,4", "--workers", "2"]) == 0
    _check_copy(dst)


def _raise() -> None:
    raise _Stop


def test_source_without_a_hierarchy_is_exit_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for src in ("file:///nope", str(tmp_path)):
        assert cli(["convert", src, str(tmp_path / "dst"), "--chunks-per-shard", "2,2"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1
        assert f"no zarr hierarchy at {src!r}" in err
        assert not (tmp_path / "dst").exists()
    assert cli(["convert", "file:///nope", str(tmp_path / "dst"), "--unshard", "--workers", "0"]) == 2


def test_scheduler_without_dask_names_the_extra(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails
    args = ["convert", str(source), str(tmp_path / "dst"), "--unshard", "--scheduler", "tcp://127.0.0.1:1"]
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert "shardstore[dask]" in err and len(err.splitlines()) == 1


def test_progress_bar_counts_bytes_only_when_asked() -> None:
    with terminal_progress(False) as off:
        assert off is None
    with terminal_progress(file=io.StringIO()) as piped:  # not a terminal: nothing
        assert piped is None
    pytest.importorskip("tqdm")
    shown = io.StringIO()
    with terminal_progress(True, file=shown) as bar:
        assert bar is not None
        bar(1024, 4096)
        bar(4096, 4096)
    assert "converting" in shown.getvalue()


# -- on a dask cluster -----------------------------------------------------------------------------

distributed = pytest.importorskip("distributed")
# ``client``: conftest's cluster, one thread in each of its two worker processes


def _opened_on_workers() -> int:
    from shardstore import convert as module

    return len(module._WORKER_STORES)


def test_convert_on_a_local_cluster(client: Any, source: Path, tmp_path: Path) -> None:
    report = convert(ShardingStore(f"file://{source}", read_only=True), _dst(tmp_path / "dst"), client=client)
    assert (report.shards_written, report.blocks_written, report.chunks_copied) == (SHARDS, BLOCKS, CHUNKS)
    assert sum(client.run(_opened_on_workers).values()) >= 1  # the units ran on the workers
    _check_copy(tmp_path / "dst")
    memory: dict[str, bytes] = {}
    with pytest.raises(ShardStoreError, match="memory"):
        convert(
            ShardingStore(f"file://{source}", read_only=True), ShardingStore(memory, (4, 4)), client=client
        )
    assert not memory  # refused before anything was written


def test_cli_convert_with_scheduler_prints_a_summary(
    client: Any,
    source: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The command line makes a client of its own beside the test's, which stays the
    process's default: the results are gathered on the loop of the client that made the
    futures (on the default client's loop they may never arrive: the hang this once was)."""
    made = distributed.as_completed
    loops: list[bool] = []

    def as_completed(futures: list[Any], *args: Any, **kwargs: Any) -> Any:
        mine = futures[0].client.loop if futures else None  # (a resumed run may have no units)
        loops.append(kwargs.get("loop") is mine is not distributed.default_client().loop)
        return made(futures, *args, **kwargs)

    monkeypatch.setattr(distributed, "as_completed", as_completed)
    address = client.scheduler.address
    assert cli(["convert", str(source), str(tmp_path / "dst"), "--chunks-per-shard", "4,4",
                "--scheduler", address]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    assert f"4 array(s), {CHUNKS:,} chunks: {SHARDS} shard(s) written, 0 already complete" in out
    assert f"objects {_files(source):,} -> {_files(tmp_path / 'dst'):,}" in out
    assert "MiB/s" in out and "\r" not in err  # no counters into a pipe
    _check_copy(tmp_path / "dst")
    assert cli(["convert", str(source), str(tmp_path / "dst"), "--chunks-per-shard", "4,4",
                "--scheduler", address]) == 0  # fmt: skip
    assert f"0 shard(s) written, {SHARDS} already complete" in capsys.readouterr().out
    assert loops[0]


def test_report_summary_lines() -> None:
    report = ConvertReport(2, 100, 2**21, 100, 3, 1, 0, 0, 200, 5, 10**6, 10**6, 2.0)
    assert report.summary() == [
        "2 array(s), 100 chunks: 3 shard(s) written, 1 already complete",
        "objects 200 -> 5, bytes 1,000,000 -> 1,000,000",
        "100 chunks, 2,097,152 bytes copied in 2.00 s (1.0 MiB/s)",
    ]


def test_convert_to_s3_on_the_cluster_then_resume(client: Any, s3: Any, source: Path) -> None:
    dst = ShardingStore(s3.url("converted.zarr"), (4, 4), storage_options=s3.storage_options)
    report = convert(ShardingStore(str(source), read_only=True), dst, client=client)
    assert (report.shards_written, report.blocks_written, report.chunks_copied) == (SHARDS, BLOCKS, CHUNKS)
    back = ShardingStore(s3.url("converted.zarr"), storage_options=s3.storage_options)
    for path in ARRAYS:
        np.testing.assert_array_equal(zarr.open_array(back, path=path)[:], _data(path))
    again = convert(ShardingStore(str(source), read_only=True), dst, workers=2)
    assert (again.shards_skipped, again.blocks_skipped, again.bytes) == (SHARDS, BLOCKS, 0)
    assert again.objects_after == report.objects_after < report.objects_before
