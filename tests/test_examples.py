"""Every script in examples/ runs as is: no arguments, exit 0, and says what it shows.

Each runs in a subprocess (``sys.executable``), from an empty working directory,
with ``TMPDIR`` pointing into the test's own temporary directory so that
nothing an example writes escapes it. New examples are picked up from the
glob; the lines below are what the known ones must print.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))

EXPECTED: dict[str, list[str]] = {
    "quickstart.py": [
        "zarr wrote 256 chunks; 6 objects on disk:",
        "read back equal: True",
        "region [100:300, 50:450] equal: True",
        '"chunks_per_shard": [8, 8]',
        "batch():       4 shard writes, 0 reads",
        "batch() read back equal: True",
        "pipeline:      4 shard writes, 0 reads",
        "pipeline read back equal: True | 4 reads in 1 batch",
    ],
    "xarray_dask_cluster.py": [
        "before rechunk_to_shards: 16x16 dask blocks of 32x32",
        "after rechunk_to_shards:  2x2 dask blocks of 256x256 | zarr chunks kept: (32, 32)",
        "cluster: 2 worker processes",
        "xr.open_zarr(...) equals the original Dataset: True",
        "8 shards for 2 x 256 chunks",
    ],
    "s3_moto.py": [
        "write in store.batch(): 4 requests (4 PUT)",
        "6 objects in the bucket:",
        "cold whole-array read equal: True | 4 requests (4 GET)",
        "cold single-chunk read (a[300, 40] = 153641.0): 1 request (1 GET)",
        "one-chunk update, default: 2 requests (1 GET, 1 PUT)",
        "read back after the update equal: True",
        "moto_server stopped",
    ],
    "convert_dataset.py": [
        "convert: 2 arrays, 768 chunks",
        "temperature: shape (512, 512), chunks (32, 32), data and attributes equal: True",
        "counts: shape (8, 256, 256), chunks (1, 32, 32), data and attributes equal: True",
        "group attributes equal: True",
        "objects on disk: 771 unsharded -> 11 sharded",
        "$ shardstore info",
    ],
    "shard_urls.py": [
        "zarr store behind the URL: FsspecStore over ShardFileSystem",
        "zarr.open_array(url) read back equal: True",
        "fsspec 'shard' file system: 64 chunk keys",
        "on disk: 6 objects:",
        "xarray round trip through shard::file://...: equal: True",
    ],
    "zep2_operations.py": ["11 objects on disk", "89 chunks left"],
}
"""Lines (or parts of lines) each known example prints; a new one must at least print something."""

LEAVES_FILES = {"zep2_operations.py"}
"""Examples that keep what they wrote (under a path they print); the others remove it."""


_SHUTDOWN_NOISE = re.compile(
    r"^\S+ \S+ - distributed\.worker - ERROR - Failed to communicate with scheduler during heartbeat\.\n"
    r"(?:(?!\d{4}-\d\d-\d\d ).*\n)*",
    re.MULTILINE,
)
"""A dask worker's heartbeat that meets the scheduler closing at exit logs this error
with its traceback, now and then, on a busy machine (dask/distributed#7105): not
the example's failure."""


def test_the_examples_are_found() -> None:
    assert {p.name for p in SCRIPTS} >= set(EXPECTED)


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_example_runs(script: Path, tmp_path: Path) -> None:
    workdir, tmpdir = tmp_path / "cwd", tmp_path / "tmp"
    workdir.mkdir()
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"{script.name} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
    out = result.stdout
    assert out.strip(), f"{script.name} printed nothing"
    missing = [line for line in EXPECTED.get(script.name, []) if line not in out]
    assert not missing, f"{script.name} did not print {missing}:\n{out}"
    assert "Traceback" not in _SHUTDOWN_NOISE.sub("", result.stderr), result.stderr
    assert not any(workdir.iterdir()), f"{script.name} wrote into its working directory"
    if script.name not in LEAVES_FILES:
        left = sorted(str(p.relative_to(tmpdir)) for p in tmpdir.rglob("*"))
        assert not left, f"{script.name} left {left} in its temporary directory"
