"""The README's first command and the documented entry points keep working: the demo and the examples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent


def test_demo_runs_and_checks_read_back(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "shardstore", "demo", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "re-opened without config: ok" in out
    assert out.count("equal") >= 2 and "DIFFERENT" not in out
    assert (tmp_path / "sharded.zarr" / "data" / "zarr.json").exists()


def test_example_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "zep2_operations.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "11 objects on disk" in out
    assert "89 chunks left" in out


def _sharded_dir(tmp_path: Path, **kwargs: object) -> str:
    import numpy as np
    import zarr

    from shardstore import ShardingStore

    url = f"file://{tmp_path}/x.zarr"
    store = ShardingStore(url, chunks_per_shard=(2, 2), **kwargs)  # type: ignore[arg-type]
    arr = zarr.create_array(store, name="g/a", shape=(8, 8), chunks=(2, 2), dtype="i4", compressors=None)
    arr[:] = np.arange(64).reshape(8, 8)
    arr[0:2, 0:2] = 7  # with append: one dead chunk and index
    zarr.create_array(store, name="plain", shape=(4,), chunks=(2,), dtype="u1")[:] = 1
    return url


def test_cli_ls_and_info(tmp_path: Path) -> None:
    url = _sharded_dir(tmp_path)
    listed = run_cli("ls", url, "g/a/c/1/").stdout.split()
    assert listed == [f"g/a/c/1/{j}" for j in range(4)]
    import json

    reports = {r["path"]: r for r in json.loads(run_cli("info", url, "--json").stdout)}
    assert (
        reports["g/a"]["shards"] == 4
        and reports["g/a"]["chunks"] == 16
        and reports["g/a"]["fill_ratio"] == 1.0
    )
    assert reports["plain"]["sharded"] is False and reports["plain"]["chunks"] == 2


def test_cli_verify_names_damaged_shards(tmp_path: Path) -> None:
    url = _sharded_dir(tmp_path)
    assert run_cli("verify", url, "--decode").returncode == 0
    shard = tmp_path / "x.zarr" / "g" / "a" / "c" / "1" / "0"
    shard.write_bytes(shard.read_bytes()[:-5])
    result = run_cli("verify", url)
    assert result.returncode == 1
    assert "g/a/c/1/0" in result.stdout and "DAMAGED" in result.stdout


def test_cli_compact_removes_dead_bytes(tmp_path: Path) -> None:
    url = _sharded_dir(tmp_path, write_strategy="append")
    import json

    from shardstore import ShardingStore
    from shardstore.maintenance import shard_reports

    dead = json.loads(run_cli("info", url, "--json").stdout)[0]["dead_bytes"]
    assert dead > 0
    # at least the shard rewritten after the whole write; others too where zarr's writes
    # of one shard reached it in more than one commit
    carrying = sum(r.dead_bytes > 0 for r in shard_reports(ShardingStore(url), "g/a/"))
    assert carrying >= 1
    result = run_cli("compact", url)
    assert result.returncode == 0 and f"{carrying} shard(s) compacted, {dead:,} bytes freed" in result.stdout
    assert json.loads(run_cli("info", url, "--json").stdout)[0]["dead_bytes"] == 0
    assert run_cli("verify", url, "--decode").returncode == 0
