"""The README's entry points keep working: the demo and the examples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
