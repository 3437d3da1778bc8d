"""Convert an unsharded zarr hierarchy into a sharded copy, then inspect it with ``shardstore info``.

Shows a group with two arrays written by plain zarr (one object per chunk),
copied by ``shardstore.convert.convert`` into a ``ShardingStore`` whose
``chunks_per_shard`` names each array by path (chunk bytes are copied as zarr
wrote them, never decoded; each shard written once), then compares data,
attributes and object counts, and prints ``shardstore info`` for both copies
(``shardstore.cli.main``, the function behind the ``shardstore`` command).

Run: python examples/convert_dataset.py   (writes into a temporary directory it removes)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import zarr

from shardstore import ShardingStore
from shardstore.cli import main as shardstore_cli
from shardstore.convert import convert


def objects(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def make_plain(root: Path) -> None:
    """A plain zarr v3 group with a 2-d and a 3-d array: 256 + 512 chunk objects."""
    group = zarr.open_group(zarr.storage.LocalStore(root), mode="w")
    group.attrs["title"] = "survey"
    temperature = group.create_array("temperature", shape=(512, 512), chunks=(32, 32), dtype="f4")
    temperature[:] = np.linspace(-5, 30, 512 * 512, dtype="f4").reshape(512, 512)
    temperature.attrs["units"] = "degC"
    counts = group.create_array("counts", shape=(8, 256, 256), chunks=(1, 32, 32), dtype="i4")
    counts[:] = np.arange(8 * 256 * 256, dtype="i4").reshape(8, 256, 256) % 1000


def main(directory: Path) -> None:
    src_root, dst_root = directory / "plain.zarr", directory / "sharded.zarr"
    make_plain(src_root)

    src = ShardingStore(str(src_root), read_only=True)  # an unsharded hierarchy is served as it is
    dst = ShardingStore(str(dst_root), chunks_per_shard={"temperature": [8, 8], "counts": [2, 8, 8]})
    report = convert(src, dst)
    print(f"convert: {report.arrays} arrays, {report.chunks} chunks, {report.bytes:,} chunk bytes copied")

    plain = zarr.open_group(zarr.storage.LocalStore(src_root), mode="r")
    sharded = zarr.open_group(ShardingStore(str(dst_root)), mode="r")  # a fresh store: no config
    for name in ("temperature", "counts"):
        a, b = plain[name], sharded[name]
        assert isinstance(a, zarr.Array) and isinstance(b, zarr.Array)
        same = np.array_equal(a[:], b[:]) and a.chunks == b.chunks and dict(a.attrs) == dict(b.attrs)
        print(f"{name}: shape {b.shape}, chunks {b.chunks}, data and attributes equal: {same}")
    print("group attributes equal:", dict(plain.attrs) == dict(sharded.attrs))
    print(f"objects on disk: {objects(src_root)} unsharded -> {objects(dst_root)} sharded")

    for label, root in (("unsharded source", src_root), ("sharded copy", dst_root)):
        print(f"\n$ shardstore info file://{root}   # {label}")
        status = shardstore_cli(["info", f"file://{root}"])
        assert status == 0, f"shardstore info exited {status}"


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="shardstore-convert-") as tmp:
        main(Path(tmp))
