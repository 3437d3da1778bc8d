"""shardstore in a few lines: shard an array, re-open it, and use the ZEP 2 operations.

Run: python examples/zep2_operations.py [DIRECTORY]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile

import fsspec
import numpy as np
import zarr
from zarr.core.buffer import default_buffer_prototype

from shardstore import ShardingStore


def main(directory: str) -> None:
    url = f"file://{directory}/example.zarr"

    # 1. Write through the store: 100 chunks of 100 x 100 land in 9 shard objects.
    store = ShardingStore(fsspec.get_mapper(url), chunks_per_shard=(4, 4))
    arr = zarr.create_array(store, name="a", shape=(1000, 1000), chunks=(100, 100), dtype="f4")
    arr[:] = np.arange(1_000_000, dtype="f4").reshape(1000, 1000)
    on_disk = sorted(
        os.path.relpath(os.path.join(d, f), directory) for d, _, fs in os.walk(directory) for f in fs
    )
    print(f"{len(on_disk)} objects on disk:", *on_disk, sep="\n  ")

    # 2. Re-open with no configuration: it is recorded in a/zarr.json.
    again = zarr.open_array(ShardingStore(fsspec.get_mapper(url)), path="a")
    print("a[123, 456] =", again[123, 456])

    # 3. The ZEP 2 abstract-store operations, on logical chunk keys.
    async def zep2() -> None:
        keys = [k async for k in store.list_prefix("a/c/1/")]
        print(f"list_prefix('a/c/1/'): {len(keys)} chunk keys, e.g. {keys[:3]}")
        print("list_dir('a/c/'):", [k async for k in store.list_dir("a/c/")])
        first, last = await store.get_partial_values(
            default_buffer_prototype(), [("a/c/0/0", None), ("a/c/9/9", None)]
        )
        print(f"two chunks fetched in one batch: {len(first or b'')} and {len(last or b'')} encoded bytes")
        await store.erase_values(["a/c/0/0"])
        print("after erase_values(['a/c/0/0']): a[0, 0] reads the fill value", again[0, 0])
        await store.erase_prefix("a/c/9/")
        print(
            "after erase_prefix('a/c/9/'):", len([k async for k in store.list_prefix("a/c/")]), "chunks left"
        )

    asyncio.run(zep2())


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="shardstore-example-")
    main(target)
    print(f"the store is in {target} (remove it when done)")
