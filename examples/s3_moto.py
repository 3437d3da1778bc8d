"""A sharded zarr array on an S3 API: a local moto_server on 127.0.0.1, with request counts.

Shows ``ShardingStore("s3://bucket/...", storage_options=...)`` writing and
reading a sharded array through s3fs, and how many HTTP requests each step
costs: a default write, a write in ``store.batch()``, a cold whole-array read,
a single-chunk read and a one-chunk update (a conditional GET + PUT). The S3
API is ``shardstore.testing.s3.local_s3``: it starts ``moto_server`` on
127.0.0.1 itself, counts every request in a proxy, and stops the server by its
PID. Nothing leaves this machine and nothing is written to disk.

Run: python examples/s3_moto.py   (needs the s3 and test extras: s3fs, moto[server])
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import s3fs
import zarr

from shardstore import ShardingStore
from shardstore.testing.s3 import LocalS3, local_s3


def requests(s3: LocalS3) -> str:
    by_method: Counter[str] = Counter(s3.counts)
    s3.reset()
    detail = ", ".join(f"{n} {method}" for method, n in sorted(by_method.items()))
    total = sum(by_method.values())
    return f"{total} request{'' if total == 1 else 's'} ({detail or 'none'})"


def store_objects(s3: LocalS3, url: str) -> list[str]:
    fs = s3fs.S3FileSystem(**s3.storage_options)
    found = [str(p) for p in fs.find(url)]
    s3.reset()  # the listing is not part of the example's counts
    return found


def main(s3: LocalS3) -> None:
    url = s3.url("example.zarr")  # s3://shardstore/example.zarr
    print("S3 API on", s3.endpoint_url, "| store:", url)
    data = np.arange(512 * 512, dtype="f4").reshape(512, 512)

    store = ShardingStore(url, chunks_per_shard=(8, 8), storage_options=s3.storage_options)
    arr = zarr.create_array(store, name="a", shape=data.shape, chunks=(32, 32), dtype="f4")
    print("create_array (metadata):", requests(s3))

    arr[:] = data  # zarr writes chunk by chunk: each shard is committed in several bursts (count varies)
    print("write, default (256 chunks into 4 shards):", requests(s3))
    with store.batch():
        arr[:] = data + 1
    print("write in store.batch():", requests(s3))

    objects = sorted(p.removeprefix(f"{s3.bucket}/") for p in store_objects(s3, url))
    print(f"{len(objects)} objects in the bucket:", *objects, sep="\n  ")

    # A fresh store: no config given, nothing cached.
    fresh = zarr.open_array(ShardingStore(url, storage_options=s3.storage_options), path="a", mode="r")
    print("open_array (metadata):", requests(s3))
    print("cold whole-array read equal:", np.array_equal(fresh[:], data + 1), "|", requests(s3))

    other = zarr.open_array(ShardingStore(url, storage_options=s3.storage_options), path="a", mode="r")
    s3.reset()
    value = np.asarray(other[300, 40]).item()
    print(f"cold single-chunk read (a[300, 40] = {value}):", requests(s3))

    arr[0:32, 0:32] = -1  # one chunk: the shard read with its ETag, then a PUT carrying If-Match
    print("one-chunk update, default:", requests(s3))
    again = zarr.open_array(ShardingStore(url, storage_options=s3.storage_options), path="a", mode="r")[:]
    expected = data + 1
    expected[0:32, 0:32] = -1
    print("read back after the update equal:", np.array_equal(again, expected))


if __name__ == "__main__":
    with local_s3(bucket="shardstore") as server:  # moto_server started here, stopped by PID on exit
        main(server)
    print("moto_server stopped")
