"""verify names every damage that breaks reads, and no tool stops at a damaged shard.

A small 2-d array (4 shards of 2x2 chunks) is written, one corruption applied
to a shard file on disk, and ``verify`` must name that shard and say what is
wrong; ``info``, ``ls``, ``shard_reports`` and ``compact`` go on past it and
never print a figure taken from a broken index.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec

from shardstore import ShardingStore
from shardstore.formats.indexed import MISSING, IndexedFormat
from shardstore.maintenance import compact, info, leftovers, list_keys, shard_reports, verify

from .helpers import run_cli

SHARD = "a/c/0/1"  # chunks a/c/0/2, a/c/0/3, a/c/1/2, a/c/1/3
OTHER = "a/c/1/0"


def _array(tmp_path: Path, compressed: bool = False, **options: Any) -> Path:
    root = tmp_path / "x.zarr"
    store = ShardingStore(str(root), chunks_per_shard=(2, 2), **options)
    compressors = "auto" if compressed else None
    arr = zarr.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="i4", compressors=compressors)
    arr[:] = np.arange(64, dtype="i4").reshape(8, 8)
    return root


LAYOUT = IndexedFormat((2, 2))


def _index(path: Path) -> Any:
    raw = path.read_bytes()[-LAYOUT.index_nbytes :]
    return np.frombuffer(raw, dtype="<u8").reshape(4, 2).copy()


def _set_entry(path: Path, position: int, offset: int, nbytes: int) -> None:
    index = _index(path)
    index[position] = (offset, nbytes)
    path.write_bytes(path.read_bytes()[: -LAYOUT.index_nbytes] + LAYOUT.encode_index(index))


def _entry(position: int, change: Callable[[Any], tuple[int, int]]) -> Callable[[Path], None]:
    """A corruption of one index entry: ``change(index)`` gives its new (offset, nbytes)."""
    return lambda path: _set_entry(path, position, *change(_index(path)))


def _into_the_index(path: Path) -> None:
    _set_entry(path, 3, path.stat().st_size - LAYOUT.index_nbytes - 4, 8)


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "zero nbytes": (_entry(1, lambda ix: (int(ix[1, 0]), 0)), "zero-length entries"),
    "overlap": (_entry(1, lambda ix: (int(ix[0, 0]) + 1, int(ix[1, 1]))), "overlapping ranges: chunk 0"),
    "duplicated": (_entry(1, lambda ix: (int(ix[0, 0]), int(ix[0, 1]))), "duplicated entries: chunk 0"),
    "past the end": (_entry(1, lambda ix: (10_000, 8)), "truncated: the object"),
    "huge offset": (_entry(1, lambda ix: (2**60, 8)), "impossible ranges"),
    "huge nbytes": (_entry(1, lambda ix: (0, 2**60)), "impossible ranges"),
    "half empty": (_entry(1, lambda ix: (MISSING, 8)), "only one of offset/nbytes marked empty: chunk 1"),
    "into the index": (_into_the_index, "ranges into the index"),
    "all zero": (lambda p: p.write_bytes(bytes(p.stat().st_size)), "zero-length entries"),
    "truncated file": (lambda p: p.write_bytes(p.read_bytes()[:10]), "truncated: 10 bytes"),
}
FIXED_SIZE = {
    "short entry": (_entry(1, lambda ix: (int(ix[1, 0]), int(ix[1, 1]) - 4)), "short entries"),
    "long entry": (_entry(3, lambda ix: (int(ix[3, 0]), int(ix[3, 1]) + 4)), "long entries"),
}


def _damage(root: Path, key: str, name: str) -> str:
    corrupt, expected = {**CORRUPTIONS, **FIXED_SIZE}[name]
    corrupt(root / key)
    return expected


@pytest.mark.parametrize("compressed", [False, True], ids=["bytes", "zstd"])
@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_verify_names_each_corruption(tmp_path: Path, name: str, compressed: bool) -> None:
    root = _array(tmp_path, compressed)
    expected = _damage(root, SHARD, name)
    damaged = verify(ShardingStore(str(root)))
    assert list(damaged) == [SHARD] and expected in damaged[SHARD], damaged


@pytest.mark.parametrize("name", sorted(FIXED_SIZE))
def test_verify_knows_the_chunk_size_of_uncompressed_arrays(tmp_path: Path, name: str) -> None:
    root = _array(tmp_path)
    expected = _damage(root, SHARD, name)
    damaged = verify(ShardingStore(str(root)))
    assert list(damaged) == [SHARD] and expected in damaged[SHARD]
    assert "every chunk of this array encodes to 16 bytes" in damaged[SHARD]


def test_a_bad_checksum_is_named(tmp_path: Path) -> None:
    root = _array(tmp_path, index_checksum=True)
    shard = root / SHARD
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    shard.write_bytes(bytes(raw))
    damaged = verify(ShardingStore(str(root)))
    assert list(damaged) == [SHARD] and "index checksum mismatch" in damaged[SHARD]


def test_an_object_shorter_than_its_index_at_the_start_says_is_truncated(tmp_path: Path) -> None:
    root = _array(tmp_path, index_location="start")
    (root / SHARD).write_bytes((root / SHARD).read_bytes()[:-5])
    damaged = verify(ShardingStore(str(root)))
    assert list(damaged) == [SHARD] and "truncated: the object (123 bytes)" in damaged[SHARD]
    assert "chunk 3 (offset 112, nbytes 16)" in damaged[SHARD]


@pytest.mark.parametrize("compressed", [False, True], ids=["bytes", "zstd"])
@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("checksum", [False, True])
def test_intact_arrays_pass(tmp_path: Path, compressed: bool, location: str, checksum: bool) -> None:
    root = _array(tmp_path, compressed, index_location=location, index_checksum=checksum)
    assert verify(ShardingStore(str(root)), decode=True) == {}


@pytest.mark.parametrize("version", [2, 3])
def test_fixed_chunk_sizes_with_a_crc32c_codec_and_in_v2(tmp_path: Path, version: int) -> None:
    """A codec that adds bytes is counted; zarr v2 without compressor has fixed sizes too."""
    store = ShardingStore(str(tmp_path), chunks_per_shard=(2, 2))
    compressors = [Crc32cCodec()] if version == 3 else None
    arr = zarr.create_array(
        store, name="a", shape=(4, 4), chunks=(2, 2), dtype="u2", compressors=compressors, zarr_format=version
    )
    arr[:] = 1
    assert verify(store, decode=True) == {}
    key = "a/c/0/0" if version == 3 else "a/0.0"
    _entry(0, lambda ix: (int(ix[0, 0]), int(ix[0, 1]) - 1))(tmp_path / key)
    size = 2 * 2 * 2 + (4 if version == 3 else 0)
    assert f"short entries (every chunk of this array encodes to {size} bytes)" in verify(store)[key]


def test_every_problem_of_a_shard_is_listed() -> None:
    layout = IndexedFormat((2, 2))
    index = np.array([[0, 8], [MISSING, 8], [10_000, 8], [0, 0]], dtype=np.uint64)
    problems = layout.problems(bytes(16) + layout.encode_index(index), "s", chunk_nbytes=16)
    kinds = ["only one of offset/nbytes", "truncated", "zero-length", "short entries"]
    assert [next(k for k in kinds if k in p) for p in problems] == kinds


def test_every_damaged_shard_is_reported_and_decode_goes_on(tmp_path: Path) -> None:
    root = _array(tmp_path)
    _damage(root, SHARD, "zero nbytes")
    _damage(root, OTHER, "all zero")
    damaged = verify(ShardingStore(str(root)), decode=True)
    assert "zero-length" in damaged[SHARD] and "zero-length" in damaged[OTHER]
    # the chunks behind the empty entries do not decode, in both shards
    lost = {k for k, v in damaged.items() if "does not decode" in v}
    assert lost == {"a/c/0/3", "a/c/2/0", "a/c/2/1", "a/c/3/0", "a/c/3/1"}
    assert "stored in shard 'a/c/1/0'" in damaged["a/c/2/0"]


def test_a_torn_append_is_damage_and_compact_repairs_it(tmp_path: Path) -> None:
    root = _array(tmp_path, write_strategy="append")
    shard = root / SHARD
    good = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"\x07" * 100)  # a crash halfway through an append
    journal = shard.with_name(f".{shard.name}.appending")
    journal.write_text(f"{shard.stat().st_ino} {good}")
    store = ShardingStore(str(root))
    damaged = verify(store, decode=True)
    assert list(damaged) == [SHARD] and "torn tail" in damaged[SHARD] and "100 bytes" in damaged[SHARD]
    assert "append journal of 'a/c/0/1'" in leftovers(store)["a/c/0/.1.appending"]
    assert "repairs it" in leftovers(store)["a/c/0/.1.appending"]
    compact(ShardingStore(str(root)))
    assert verify(store, decode=True) == {} and leftovers(store) == {}
    assert shard.stat().st_size == good


def test_leftovers_are_reported_but_are_no_damage(tmp_path: Path) -> None:
    root = _array(tmp_path)
    (root / "a/c/0/.1.appending").write_text("1 2")  # names another file: ignored by reads
    (root / "a/c/0/.1.lock").write_bytes(b"")
    (root / "a/c/1/.0.0123456789abcdef0123456789abcdef.partial").write_bytes(b"half")
    store = ShardingStore(str(root))
    assert verify(store, decode=True) == {}
    found = leftovers(store, "a/")
    assert sorted(found) == [
        "a/c/0/.1.appending",
        "a/c/0/.1.lock",
        "a/c/1/.0.0123456789abcdef0123456789abcdef.partial",
    ]
    assert "lock file of 'a/c/0/1'" in found["a/c/0/.1.lock"]
    assert "write to 'a/c/1/0'" in found["a/c/1/.0.0123456789abcdef0123456789abcdef.partial"]
    assert leftovers(ShardingStore({})) == {}


@pytest.mark.parametrize("name", ["past the end", "huge offset", "overlap", "truncated file"])
def test_other_tools_go_on_past_a_damaged_shard(tmp_path: Path, name: str) -> None:
    root = _array(tmp_path, write_strategy="append")
    store = ShardingStore(str(root), write_strategy="append")
    compact(store)  # the first write may have come in several appends (timing): none dead now
    zarr.open_array(store, path="a")[6:8, 6:8] = 7  # dead bytes in shard a/c/1/1 only
    _damage(root, SHARD, name)
    keys, damaged = list_keys(store, "a/")
    assert list(damaged) == [SHARD] and SHARD in damaged[SHARD]
    assert "a/c/0/0" in keys and "a/c/0/2" not in keys and len(keys) == 12 + 1  # zarr.json
    reports = {r.key: r for r in shard_reports(store)}
    assert reports[SHARD].damage and (reports[SHARD].chunks, reports[SHARD].dead_bytes) == (0, 0)
    assert all(0 <= r.dead_bytes <= r.nbytes for r in reports.values())
    (array,) = info(store)
    assert list(array.damaged) == [SHARD] and array.chunks == 12 and array.shards == 4
    assert 0 < array.dead_bytes < array.stored_bytes
    done = compact(store)
    assert {r.key for r in done if r.damage is None} == {"a/c/1/1"}
    assert [r.key for r in done if r.damage is not None] == [SHARD]


# -- command line ----------------------------------------------------------------------


def test_cli_verify_exits_1_naming_every_damaged_shard(tmp_path: Path) -> None:
    root = _array(tmp_path, write_strategy="append")
    assert run_cli("verify", str(root), "--decode").returncode == 0
    _damage(root, SHARD, "duplicated")
    _damage(root, OTHER, "truncated file")
    (root / "a/c/1/.1.lock").write_bytes(b"")
    result = run_cli("verify", str(root), "--decode")
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith(f"DAMAGED {SHARD}: shard: duplicated entries") for line in lines)
    assert any(line.startswith(f"DAMAGED {OTHER}: shard: truncated") for line in lines)
    assert any(line.startswith("LEFTOVER a/c/1/.1.lock: lock file") for line in lines)
    assert "Traceback" not in result.stderr


def test_cli_info_and_ls_go_on_and_print_no_absurd_figure(tmp_path: Path) -> None:
    root = _array(tmp_path)
    _damage(root, SHARD, "huge offset")
    results = {" ".join(args): run_cli(*args, str(root)) for args in (["info"], ["info", "--json"], ["ls"])}
    for result in results.values():
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert f"shard {SHARD!r}" in result.stderr
    table = results["info"].stdout
    assert "1 damaged" in table and all(
        int(n.replace(",", "")) < 2**16 for n in re.findall(r"\d[\d,]*", table)
    )
    (report,) = json.loads(results["info --json"].stdout)
    assert report["damaged"].keys() == {SHARD}
    assert all(v < 2**16 for v in report.values() if isinstance(v, int))
    assert "a/c/0/0" in results["ls"].stdout.split() and "a/c/0/2" not in results["ls"].stdout.split()


def test_cli_exit_status_2_for_usage_errors_and_unreadable_stores(tmp_path: Path) -> None:
    assert run_cli("info", str(tmp_path / "nothing")).returncode == 2
    assert "no zarr hierarchy" in run_cli("verify", str(tmp_path)).stderr
    bad = run_cli("ls", str(tmp_path), "--storage-options", "{not json")
    assert bad.returncode == 2 and "not JSON" in bad.stderr and "Traceback" not in bad.stderr
    assert run_cli("--version").stdout.startswith("shardstore ")
