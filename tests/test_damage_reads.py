"""A damaged index gives ShardFormatError naming the shard, on every read path and backend.

The range path checks an index before requesting any range: against itself
(overlaps, absurd sizes, half-empty entries) and, where the read tells the
object's size (local files), against that; elsewhere a range past the end
comes back short and is refused.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore

from shardstore import ShardingStore
from shardstore.errors import ShardFormatError
from shardstore.formats.indexed import MISSING, IndexedFormat

LAYOUT = IndexedFormat((2, 2))
SHARD = "a/c/0/0"

DAMAGE = {
    "past the end": (1, 10_000, 8),
    "huge offset": (1, 2**60, 8),
    "huge nbytes": (1, 0, 2**60),
    "half empty": (1, MISSING, 8),
    "overlap": (1, 0, 9),  # chunk 0 sits at [0, 64)
    "duplicate": (1, 0, 64),
}


def _damage(raw: bytes, position: int, offset: int, nbytes: int) -> bytes:
    index = LAYOUT.decode_index(raw[-LAYOUT.index_nbytes :], SHARD).copy()
    index[position] = (offset, nbytes)
    return raw[: -LAYOUT.index_nbytes] + LAYOUT.encode_index(index)


def _inners(tmp_path: Path, s3: Any | None) -> dict[str, tuple[Any, dict[str, Any] | None]]:
    out: dict[str, tuple[Any, dict[str, Any] | None]] = {
        "dict": ({}, None),
        "local": (LocalStore(tmp_path / "local"), None),
    }
    if s3 is not None:
        out["s3"] = (s3.url(f"damage-{tmp_path.name}"), s3.storage_options)
    return out


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("backend", ["dict", "local", "s3"])
@pytest.mark.parametrize("read_strategy", ["chunk", "shard"])
def test_damaged_index_is_a_format_error(
    request: pytest.FixtureRequest, tmp_path: Path, damage: str, backend: str, read_strategy: str
) -> None:
    s3 = request.getfixturevalue("s3") if backend == "s3" else None
    inner, options = _inners(tmp_path, s3)[backend]
    store = ShardingStore(inner, (2, 2), storage_options=options)
    arr = zarr.create_array(store, name="a", shape=(16, 8), chunks=(4, 4), dtype="f4", compressors=None)
    arr[:] = np.arange(128, dtype="f4").reshape(16, 8)  # shards a/c/0/0 and a/c/1/0
    raw = asyncio.run(store.internals.raw.get(SHARD))
    assert raw is not None
    asyncio.run(store.internals.raw.set(SHARD, _damage(raw, *DAMAGE[damage])))
    reader = zarr.open_array(
        ShardingStore(inner, storage_options=options, read_strategy=read_strategy), path="a", mode="r"
    )
    with pytest.raises(ShardFormatError, match=SHARD):
        reader[:4, 4:]  # chunk 1 of the damaged shard
    np.testing.assert_array_equal(reader[8:, :], np.arange(64, 128, dtype="f4").reshape(8, 8))  # the other
