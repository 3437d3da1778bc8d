"""Smoke test of an installed shardstore wheel, run by `.ci/run docs` in a fresh
virtualenv holding only the wheel and its dependencies, from a directory outside
the checkout (so that the installed package is the one imported).

Checks: the package imports from site-packages with its version; `shardstore
--version` prints it; `py.typed` is installed; the entry points are registered
(the `shard` fsspec protocol, the zarr codec pipeline); a small sharded array is
written to a temporary directory and read back, by a fresh store with no
configuration and by a `shard::` URL.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import fsspec
import numpy as np
import zarr

import shardstore
from shardstore import ShardingStore


def main() -> None:
    package = Path(shardstore.__file__).resolve().parent
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert package.parent == site, f"shardstore imported from {package}, not from {site}"
    assert shardstore.__version__ == importlib.metadata.version("shardstore"), shardstore.__version__
    assert "__version__" in shardstore.__all__

    command = Path(sys.executable).with_name("shardstore")
    printed = subprocess.run([str(command), "--version"], capture_output=True, text=True, check=True).stdout
    assert printed == f"shardstore {shardstore.__version__}\n", printed

    assert (package / "py.typed").is_file(), "py.typed is not installed"
    files = importlib.metadata.files("shardstore") or []
    assert any(str(f).endswith("shardstore/py.typed") for f in files), "py.typed is not in the wheel's RECORD"
    assert any("licenses/LICENSE" in str(f) for f in files), "LICENSE is not in the wheel"

    assert fsspec.get_filesystem_class("shard").__module__ == "shardstore.fsspec_protocol"
    pipelines = importlib.metadata.entry_points(group="zarr.codec_pipeline")
    assert any(e.value == "shardstore.pipeline:ShardAwarePipeline" for e in pipelines)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "x.zarr"
        store = ShardingStore(str(root), chunks_per_shard=(4, 4))
        data = np.arange(64 * 64, dtype="f4").reshape(64, 64)
        arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(8, 8), dtype="f4")
        arr[:] = data  # 64 chunks in 4 shards
        shards = sorted(p.relative_to(root).as_posix() for p in (root / "a" / "c").rglob("*") if p.is_file())
        assert shards == ["a/c/0/0", "a/c/0/1", "a/c/1/0", "a/c/1/1"], shards
        config = json.loads((root / "a" / "zarr.json").read_text())["storage_transformers"][0]
        assert config["configuration"]["chunks_per_shard"] == [4, 4], config
        again = zarr.open_array(ShardingStore(str(root)), path="a", mode="r")
        assert np.array_equal(again[:], data)
        by_url = zarr.open_array(f"shard::file://{root}", path="a", mode="r")
        assert np.array_equal(by_url[8:24, 40:64], data[8:24, 40:64])

    print(f"smoke test passed: shardstore {shardstore.__version__} from {package}, zarr {zarr.__version__}")


if __name__ == "__main__":
    main()
