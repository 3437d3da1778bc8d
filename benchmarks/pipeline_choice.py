"""A user's pipeline choice: what zarr's ``codec_pipeline.path`` set to another
pipeline than shardstore's costs ShardingStore arrays, and what the two settings
``PipelineChoiceWarning`` names give back.

Each configuration runs in a process of its own (zarr picks a pipeline when it
opens an array; the warning is said once per process). Data: --size x --size
float32 (default 4096: 64 MiB; 2048 with --quick), random values, chunks
64 x 64, 8 x 8 per shard, zstd, on local files. Rows: the configuration, then
the array: "shardstore" (ShardingStore), "codec" (zarr's ShardingCodec,
``shards=``) and "unsharded" zarr, each under that configuration. Columns:
whole write and whole read seconds (best of --repeats, default 2), each
ShardingStore time as a multiple of the default's, and whether
``PipelineChoiceWarning`` was said. tensorstore has no zarr pipeline to choose;
zarrs is one of the choices.

    python benchmarks/pipeline_choice.py [--quick] [--size N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np
import zarr

CONFIGS: dict[str, dict[str, str]] = {
    "default (shardstore's)": {},
    "zarr's Batched as main": {"codec_pipeline.path": "zarr.core.codec_pipeline.BatchedCodecPipeline"},
    "zarr's Fused as main": {"codec_pipeline.path": "zarr.core.codec_pipeline.FusedCodecPipeline"},
    "zarrs as main": {"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"},
    "ours + Fused fallback": {
        "codec_pipeline.path": "shardstore.pipeline.ShardAwarePipeline",
        "codec_pipeline.fallback_path": "zarr.core.codec_pipeline.FusedCodecPipeline",
    },
    "ours + zarrs fallback": {
        "codec_pipeline.path": "shardstore.pipeline.ShardAwarePipeline",
        "codec_pipeline.fallback_path": "zarrs.ZarrsCodecPipeline",
    },
}


def available(config: dict[str, str]) -> bool:
    """Whether every pipeline the configuration names exists on this stack."""
    import importlib

    for path in config.values():
        module, _, name = path.rpartition(".")
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return False
    return True


def measure(config: dict[str, str], size: int, repeats: int) -> dict[str, Any]:
    """In this process: each variant's best whole write and read under ``config``."""
    from shardstore import PipelineChoiceWarning, ShardingStore

    data = np.random.default_rng(0).random((size, size), dtype="f4")
    out: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as said, zarr.config.set(config):
        warnings.simplefilter("always")
        for variant in ("shardstore", "codec", "unsharded"):
            writes, reads = [], []
            for _ in range(repeats):
                root = tempfile.mkdtemp(prefix=f"pipeline-choice-{variant}-")
                store: Any = (
                    ShardingStore(root, (8, 8)) if variant == "shardstore" else zarr.storage.LocalStore(root)
                )
                shards = (512, 512) if variant == "codec" else None
                arr = zarr.create_array(
                    store, name="a", shape=data.shape, chunks=(64, 64), shards=shards, dtype="f4"
                )
                started = time.perf_counter()
                arr[:] = data
                writes.append(time.perf_counter() - started)
                reopened: Any = (
                    ShardingStore(root) if variant == "shardstore" else zarr.storage.LocalStore(root)
                )
                arr = zarr.open_array(reopened, path="a", mode="r")
                started = time.perf_counter()
                got = arr[:]
                reads.append(time.perf_counter() - started)
                if not np.array_equal(got, data):
                    raise AssertionError(f"{variant}: the read differs from what was written")
            out[variant] = {"write": min(writes), "read": min(reads)}
    out["warned"] = any(issubclass(w.category, PipelineChoiceWarning) for w in said)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2048 x 2048 (16 MiB)")
    parser.add_argument("--size", type=int, default=None, help="side of the array (default 4096)")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many (default 2)")
    parser.add_argument("--config", help=argparse.SUPPRESS)  # one configuration, in a child process
    args = parser.parse_args()
    size = args.size or (2048 if args.quick else 4096)
    if args.config is not None:
        print(json.dumps(measure(CONFIGS[args.config], size, args.repeats)))
        return
    results = {}
    for name, config in CONFIGS.items():
        if not available(config):
            print(f"{name}: not on this stack, skipped")
            continue
        child = [
            sys.executable,
            __file__,
            "--config",
            name,
            "--size",
            str(size),
            "--repeats",
            str(args.repeats),
        ]
        run = subprocess.run(child, capture_output=True, text=True, check=True)
        results[name] = json.loads(run.stdout.strip().splitlines()[-1])
    base = results["default (shardstore's)"]["shardstore"]
    print(
        f"{size}x{size} float32 ({size * size * 4 / 2**20:.0f} MiB), chunks 64x64, 8x8 per shard, zstd, "
        f"local files; best of {args.repeats}; zarr {zarr.__version__}"
    )
    header = f"{'configuration':<24} {'array':<11} {'write s':>8} {'read s':>8}"
    print(f"{header} {'write vs default':>17} {'warned':>7}")
    for name, row in results.items():
        for variant in ("shardstore", "codec", "unsharded"):
            t = row[variant]
            ratio = f"{t['write'] / base['write']:.2f}x" if variant == "shardstore" else ""
            warned = ("yes" if row["warned"] else "no") if variant == "shardstore" else ""
            print(f"{name:<24} {variant:<11} {t['write']:>8.3f} {t['read']:>8.3f} {ratio:>17} {warned:>7}")


if __name__ == "__main__":
    main()
