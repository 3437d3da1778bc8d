"""The command line's ``info``, ``ls`` and ``verify`` on the neuroglancer precomputed
sharded format, against data tensorstore writes: a volume (an ``info`` file listing
scales), a bare directory of ``.shard`` files given ``--sharding``, and a mesh-style
directory (an ``info`` file with a top-level ``sharding``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstore.cli import main

from .helpers import sharding as sharding_json

ts = pytest.importorskip("tensorstore")


def _sharding(**fields: Any) -> dict[str, Any]:
    """``helpers.sharding`` with this file's defaults (one minishard bit, two shard bits,
    gzip for both encodings), any of its JSON fields replaced by ``fields``."""
    return {**sharding_json(0, 1, 2, index="gzip", data="gzip"), **fields}


def _kvstore(directory: Path, sharding: dict[str, Any]) -> Any:
    return ts.KvStore.open(
        {
            "driver": "neuroglancer_uint64_sharded",
            "base": {"driver": "file", "path": f"{directory}/"},
            "metadata": sharding,
        }
    ).result()


def _write_ids(directory: Path, sharding: dict[str, Any], chunks: dict[int, bytes]) -> None:
    kv = _kvstore(directory, sharding)
    with ts.Transaction() as txn:
        for chunk_id, value in chunks.items():
            kv.with_transaction(txn)[chunk_id.to_bytes(8, "big")] = value


def _ids_by_tensorstore(directory: Path, sharding: dict[str, Any]) -> list[int]:
    return sorted(int.from_bytes(k, "big") for k in _kvstore(directory, sharding).list().result())


VOLUME_SHARDING = _sharding()


def _volume(root: Path) -> Path:
    """A volume of two scales: ``1_1_1`` sharded (12 of its 25 chunks written), ``2_2_2``
    unsharded (4 of its 9 chunks written)."""
    spec: dict[str, Any] = {
        "driver": "neuroglancer_precomputed",
        "kvstore": {"driver": "file", "path": str(root)},
        "multiscale_metadata": {"data_type": "uint8", "num_channels": 1, "type": "image"},
    }
    fine = ts.open(
        {
            **spec,
            "scale_metadata": {
                "size": [40, 40, 8],
                "chunk_size": [8, 8, 8],
                "encoding": "raw",
                "resolution": [1, 1, 1],
                "sharding": VOLUME_SHARDING,
            },
        },
        create=True,
    ).result()
    fine[0:20, 0:30, :, :] = np.arange(20 * 30 * 8, dtype=np.uint8).reshape(20, 30, 8, 1)
    coarse = ts.open(
        {
            **spec,
            "scale_metadata": {
                "size": [20, 20, 4],
                "chunk_size": [8, 8, 4],
                "encoding": "raw",
                "resolution": [2, 2, 2],
            },
        },
        create=True,
    ).result()
    coarse[0:10, 0:10, :, :] = 1
    return root


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _shard_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.shard"))


# -- a volume --------------------------------------------------------------------------


def test_volume_info_equals_the_truth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _volume(tmp_path / "vol")
    truth = _ids_by_tensorstore(root / "1_1_1", VOLUME_SHARDING)
    assert len(truth) == 12
    shards = _shard_files(root / "1_1_1")
    coarse_files = sorted(p for p in (root / "2_2_2").iterdir())
    assert len(coarse_files) == 4

    code, out, err = _cli(capsys, "info", str(root), "--json")
    assert code == 0 and err == ""
    fine, coarse = json.loads(out)
    assert fine == {
        "path": "1_1_1",
        "format": "neuroglancer_precomputed",
        "sharded": True,
        "sharding": VOLUME_SHARDING,
        "shards": len(shards),
        "chunks": len(truth),
        "stored_bytes": sum(p.stat().st_size for p in shards),
        "grid_chunks": 25,
        "damaged": {},
        "fill_ratio": len(truth) / 25,
    }
    assert coarse["path"] == "2_2_2" and coarse["sharded"] is False and coarse["sharding"] is None
    assert (coarse["shards"], coarse["chunks"], coarse["grid_chunks"]) == (0, 4, 9)
    assert coarse["stored_bytes"] == sum(p.stat().st_size for p in coarse_files)

    code, out, err = _cli(capsys, "info", f"file://{root}")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("scale 1_1_1: neuroglancer_uint64_sharded_v1, preshift_bits 0, hash identity")
    size = sum(p.stat().st_size for p in shards)
    assert lines[1] == f"  {len(shards)} shard files, 12/25 chunks (48.0%), {size:,} bytes"
    assert lines[2] == "scale 2_2_2: unsharded"
    assert lines[3].startswith("  4/9 chunk files (44.4%), ")


def test_volume_ls_lists_exactly_the_ids_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _volume(tmp_path / "vol")
    truth = _ids_by_tensorstore(root / "1_1_1", VOLUME_SHARDING)
    code, out, err = _cli(capsys, "ls", str(root))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[:12] == [f"1_1_1/{i}" for i in truth]  # ascending
    assert lines[12:] == [f"2_2_2/{p.name}" for p in sorted((root / "2_2_2").iterdir())]
    # a prefix selects a scale, and keys under it
    assert _cli(capsys, "ls", str(root), "1_1_1")[1].splitlines() == [f"1_1_1/{i}" for i in truth]
    assert _cli(capsys, "ls", str(root), "1_1_1/1")[1].splitlines() == [
        f"1_1_1/{i}" for i in truth if str(i).startswith("1")
    ]
    code, out, _ = _cli(capsys, "info", str(root), "2_2_2", "--json")
    assert code == 0 and [r["path"] for r in json.loads(out)] == ["2_2_2"]
    code, _, err = _cli(capsys, "ls", str(root), "nope")
    assert code == 2 and "no scale" in err and "'1_1_1'" in err


def test_volume_verify_intact_then_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _volume(tmp_path / "vol")
    code, out, err = _cli(capsys, "verify", str(root))
    assert (code, out, err) == (0, "", "all shards intact\n")

    truncated, flipped, *_ = _shard_files(root / "1_1_1")
    truncated.write_bytes(truncated.read_bytes()[:-5])
    blob = bytearray(flipped.read_bytes())
    blob[7] ^= 0x80  # the top byte of minishard 0's start: it now ends before it starts
    flipped.write_bytes(bytes(blob))

    code, out, err = _cli(capsys, "verify", str(root))
    assert code == 1 and "2 damaged object(s)" in err
    damaged = out.splitlines()
    assert len(damaged) == 2
    assert damaged[0].startswith(f"DAMAGED 1_1_1/{truncated.name}: shard: truncated")
    assert damaged[1].startswith(f"DAMAGED 1_1_1/{flipped.name}: shard: ")
    assert "ending before they start" in damaged[1]

    # info and ls go on past the damaged shards, name them, and exit 1
    survivors = sorted(
        i for p in _shard_files(root / "1_1_1") if p not in (truncated, flipped) for i in _ids_in_one_shard(p)
    )
    code, out, err = _cli(capsys, "ls", str(root), "1_1_1")
    assert code == 1 and out.splitlines() == [f"1_1_1/{i}" for i in survivors]
    assert f"1_1_1/{truncated.name}" in err and f"1_1_1/{flipped.name}" in err
    code, out, err = _cli(capsys, "info", str(root), "--json")
    fine = json.loads(out)[0]
    assert code == 1 and fine["chunks"] == len(survivors) and fine["shards"] == 4
    assert sorted(fine["damaged"]) == sorted(f"1_1_1/{p.name}" for p in (truncated, flipped))


def _ids_in_one_shard(shard: Path) -> list[int]:
    """The ids tensorstore finds in one shard file, copied alone into a directory."""
    alone = shard.parent.parent / f"alone-{uuid.uuid4().hex}"
    alone.mkdir()
    (alone / shard.name).write_bytes(shard.read_bytes())
    return _ids_by_tensorstore(alone, VOLUME_SHARDING)


# -- a directory of shards -------------------------------------------------------------

DIR_SHARDING = _sharding(hash="murmurhash3_x86_128", preshift_bits=1, minishard_bits=2, shard_bits=3)
DIR_CHUNKS = {i: bytes([i % 251]) * (i % 50) for i in (*range(0, 300, 7), 2**40, 2**64 - 1)}


def test_directory_with_sharding_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "shards"
    _write_ids(d, DIR_SHARDING, DIR_CHUNKS)
    shards = _shard_files(d)
    assert sorted(DIR_CHUNKS) == _ids_by_tensorstore(d, DIR_SHARDING)
    (tmp_path / "sharding.json").write_text(json.dumps(DIR_SHARDING))
    for given in (json.dumps(DIR_SHARDING), f"@{tmp_path / 'sharding.json'}"):
        code, out, err = _cli(capsys, "ls", str(d), "--sharding", given)
        assert (code, err) == (0, "") and out.splitlines() == [str(i) for i in sorted(DIR_CHUNKS)]

        code, out, err = _cli(capsys, "info", str(d), "--json", "--sharding", given)
        assert (code, err) == (0, "")
        (report,) = json.loads(out)
        assert report["path"] == "" and report["sharding"] == DIR_SHARDING
        assert report["shards"] == len(shards) and report["chunks"] == len(DIR_CHUNKS)
        assert report["stored_bytes"] == sum(p.stat().st_size for p in shards)
        assert report["grid_chunks"] is None and report["fill_ratio"] is None

        assert _cli(capsys, "verify", str(d), "--sharding", given) == (0, "", "all shards intact\n")

    code, out, _ = _cli(capsys, "info", str(d), "--sharding", json.dumps(DIR_SHARDING))
    assert out.splitlines()[1] == (
        f"  {len(shards)} shard files, {len(DIR_CHUNKS)} chunks, "
        f"{sum(p.stat().st_size for p in shards):,} bytes"
    )

    # damage: a flipped byte inside a gzip stream, a truncated file
    first, second = shards[:2]
    blob = bytearray(first.read_bytes())
    blob[-10] ^= 0xFF  # inside the last minishard index's deflate stream or its crc
    first.write_bytes(bytes(blob))
    second.write_bytes(second.read_bytes()[:20])
    code, out, err = _cli(capsys, "verify", str(d), "--sharding", json.dumps(DIR_SHARDING))
    assert code == 1
    assert [line.split(":")[0] for line in out.splitlines()] == [
        f"DAMAGED {first.name}",
        f"DAMAGED {second.name}",
    ]
    assert "truncated: 20 bytes" in out


def test_mesh_style_info_with_top_level_sharding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "mesh"
    _write_ids(d, DIR_SHARDING, DIR_CHUNKS)
    (d / "info").write_text(json.dumps({"@type": "neuroglancer_multilod_draco", "sharding": DIR_SHARDING}))
    code, out, _ = _cli(capsys, "ls", str(d))
    assert code == 0 and out.splitlines() == [str(i) for i in sorted(DIR_CHUNKS)]
    assert _cli(capsys, "verify", str(d))[0] == 0


def test_fsspec_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fsspec

    root = _volume(tmp_path / "vol")
    fs = fsspec.filesystem("memory")
    base = f"/precomputed-{uuid.uuid4().hex}"
    for path in root.rglob("*"):
        if path.is_file():
            fs.pipe(f"{base}/{path.relative_to(root).as_posix()}", path.read_bytes())
    try:
        truth = _ids_by_tensorstore(root / "1_1_1", VOLUME_SHARDING)
        code, out, _ = _cli(capsys, "ls", f"memory://{base}", "1_1_1")
        assert code == 0 and out.splitlines() == [f"1_1_1/{i}" for i in truth]
        code, out, _ = _cli(capsys, "info", f"memory://{base}", "--json")
        assert code == 0 and json.loads(out)[0]["chunks"] == len(truth)
        assert _cli(capsys, "verify", f"memory://{base}")[0] == 0
    finally:
        fs.rm(base, recursive=True)


# -- what is not precomputed data ------------------------------------------------------


def test_exit_2_for_nothing_there_and_bad_shardings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in ("info", "ls", "verify"):
        for where in (empty, tmp_path / "missing"):
            code, out, err = _cli(capsys, command, str(where))
            assert code == 2 and out == ""
            assert len(err.splitlines()) == 1 and repr(str(where)) in err and "no zarr hierarchy" in err

    # an 'info' file that is not neuroglancer's: nothing precomputed there either
    (empty / "info").write_text("just some notes")
    assert _cli(capsys, "ls", str(empty))[0] == 2

    # --sharding pointing at a directory with no shard file of that sharding
    code, _, err = _cli(capsys, "ls", str(empty), "--sharding", json.dumps(_sharding()))
    assert code == 2 and "no shard file" in err
    (empty / "1.shard").write_bytes(b"x")  # shard_bits 8: names have 2 hex digits
    code, _, err = _cli(capsys, "ls", str(empty), "--sharding", json.dumps(_sharding(shard_bits=8)))
    assert code == 2 and "'1.shard'" in err and "--sharding" in err

    # an invalid sharding, given or in a volume's info
    code, _, err = _cli(capsys, "info", str(empty), "--sharding", json.dumps(_sharding(hash="md5")))
    assert code == 2 and "'hash'" in err and "md5" in err
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "info").write_text(json.dumps({"scales": [{"key": "s0", "sharding": _sharding(shard_bits=99)}]}))
    code, _, err = _cli(capsys, "verify", str(vol))
    assert code == 2 and "s0" in err and "shard_bits" in err

    # not JSON at all: a usage error from argparse
    for bad in ("{not json", f"@{tmp_path / 'no-such-file.json'}"):
        with pytest.raises(SystemExit) as exc:
            main(["ls", str(empty), "--sharding", bad])
        assert exc.value.code == 2

    # a prefix only selects scales of a volume
    d = tmp_path / "shards"
    _write_ids(d, DIR_SHARDING, {1: b"a"})
    code, _, err = _cli(capsys, "ls", str(d), "x", "--sharding", json.dumps(DIR_SHARDING))
    assert code == 2 and "prefix" in err


def test_closed_output_pipe_is_not_an_error(tmp_path: Path) -> None:
    d = tmp_path / "many"
    sharding = _sharding(minishard_bits=4, shard_bits=1)
    _write_ids(d, sharding, {i: b"" for i in range(20_000)})
    with subprocess.Popen(
        [sys.executable, "-m", "shardstore", "ls", str(d), "--sharding", json.dumps(sharding)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == b"0\n"
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 0
    assert err == b""
