"""Several writers of the same neuroglancer precomputed shards lose nothing.

An array stored with a ``PrecomputedSharding`` (chunk id = compressed Morton code,
shards ``vol/c/<hex>.shard``) puts 64 chunks into 2 shards of 4 minishards, so
every shard holds chunks of every writer. Writers in separate processes (spawn),
each with its own ``ShardingStore``, write disjoint chunks twice, the second time
with other values; afterwards every chunk must hold its writer's last value, read
by a fresh store and, independently, by ``PrecomputedShardedStore``. Zarr writers
and key-value writers of the same shards take turns through the same file locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardstore import PrecomputedShardedStore, ShardingStore
from shardstore.formats.precomputed import PrecomputedSharding, compressed_morton_code, locate_ids
from shardstore.maintenance import leftovers, verify

from .processes import Writers

GRID, CHUNK, WRITERS = 8, 4, 4
SHARDINGS = {
    "murmurhash": PrecomputedSharding(0, "murmurhash3_x86_128", minishard_bits=2, shard_bits=1),
    "identity": PrecomputedSharding(0, "identity", minishard_bits=2, shard_bits=1),
}
"""Two shards of four minishards (preshift_bits 0)."""
POSITIONS = [(r, c) for r in range(GRID) for c in range(GRID)]


def _mine(w: int) -> list[tuple[int, int]]:
    """Diagonals of chunks: with either hash every writer has chunks in every shard."""
    return [(r, c) for r, c in POSITIONS if (r + c) % WRITERS == w]


def _value(r: int, c: int, final: bool) -> int:
    return (r * GRID + c + 1) * (1 if final else -1)


def _chunk_id(r: int, c: int) -> int:
    return int(compressed_morton_code(np.array([(r, c)]), (GRID, GRID))[0])


def _chunk_bytes(r: int, c: int, final: bool) -> bytes:
    """What zarr stores for the chunk (``compressors=None``: the bytes codec only)."""
    return np.full((CHUNK, CHUNK), _value(r, c, final), dtype="<i4").tobytes()


def _shard_of(sharding: PrecomputedSharding, r: int, c: int) -> int:
    return int(locate_ids(sharding, np.array([_chunk_id(r, c)], dtype=np.uint64))[0][0])


def _create(root: str, sharding: PrecomputedSharding) -> None:
    store = ShardingStore(root, chunks_per_shard=sharding)
    zarr.create_array(
        store, name="vol", shape=(GRID * CHUNK,) * 2, chunks=(CHUNK, CHUNK), dtype="i4", compressors=None
    )


def _zarr_writer(root: str, mode: str, w: int, start: Any) -> None:
    store = ShardingStore(root)
    arr = zarr.open_array(store, path="vol")
    start.wait()
    for final in (False, True):
        with store.batch() if mode == "one-batch" else contextlib.nullcontext():
            for r, c in _mine(w):
                with store.batch() if mode == "batch" else contextlib.nullcontext():
                    arr[r * CHUNK : (r + 1) * CHUNK, c * CHUNK : (c + 1) * CHUNK] = _value(r, c, final)


def _kv_writer(root: str, sharding: PrecomputedSharding, w: int, start: Any) -> None:
    kv = PrecomputedShardedStore(str(Path(root) / "vol" / "c"), sharding)
    start.wait()
    for r, c in _mine(w):  # first round: one shard rewrite per chunk
        kv[_chunk_id(r, c)] = _chunk_bytes(r, c, False)
    kv.update({_chunk_id(r, c): _chunk_bytes(r, c, True) for r, c in _mine(w)})  # second: one update


def _lost(root: str, sharding: PrecomputedSharding) -> list[tuple[int, int]]:
    """Chunks not at their last written value: read by a fresh zarr store and, from the
    shard files alone, by the key-value store (the two must agree)."""
    got = np.asarray(zarr.open_array(ShardingStore(root), path="vol", mode="r")[:])
    blocks = got.reshape(GRID, CHUNK, GRID, CHUNK).transpose(0, 2, 1, 3)
    by_zarr = [(r, c) for r, c in POSITIONS if not (blocks[r, c] == _value(r, c, True)).all()]
    kv = PrecomputedShardedStore(str(Path(root) / "vol" / "c"), sharding)
    raw = asyncio.run(kv.get_many([_chunk_id(r, c) for r, c in POSITIONS]))
    by_kv = [p for p, b in zip(POSITIONS, raw, strict=True) if b != _chunk_bytes(*p, True)]
    assert by_kv == by_zarr
    return by_zarr


def _check_clean(root: str, sharding: PrecomputedSharding) -> None:
    """Every chunk listed, the shards intact, nothing left beside them."""
    kv = PrecomputedShardedStore(str(Path(root) / "vol" / "c"), sharding)
    assert sorted(kv) == sorted(_chunk_id(r, c) for r, c in POSITIONS)
    store = ShardingStore(root)
    assert verify(store, decode=True) == {}
    assert leftovers(store) == {}  # no lock file or temporary file left behind
    assert sorted(p.name for p in (Path(root) / "vol" / "c").iterdir()) == ["0.shard", "1.shard"]


@pytest.mark.parametrize("name", sorted(SHARDINGS))
def test_every_writer_has_chunks_in_every_shard_and_minishards_are_shared(name: str) -> None:
    """The setting of the races below: they would prove little if writers never met."""
    sharding = SHARDINGS[name]
    ids = compressed_morton_code(np.array(POSITIONS), (GRID, GRID))
    shards, minishards = locate_ids(sharding, ids)
    assert len(set(ids.tolist())) == GRID * GRID
    for w in range(WRITERS):
        assert {_shard_of(sharding, r, c) for r, c in _mine(w)} == {0, 1}
    writers_of: dict[tuple[int, int], set[int]] = {}
    for (r, c), shard, minishard in zip(POSITIONS, shards.tolist(), minishards.tolist(), strict=True):
        writers_of.setdefault((shard, minishard), set()).add((r + c) % WRITERS)
    assert len(writers_of) == 8  # every minishard of both shards holds chunks of several writers
    assert all(len(writers) >= 2 for writers in writers_of.values())


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("murmurhash", "rewrite"),  # a shard rewrite per chunk: the most contention
        ("murmurhash", "batch"),  # a batch per chunk
        ("murmurhash", "one-batch"),  # a batch per round: each shard once per writer and round
        ("identity", "rewrite"),
        ("identity", "batch"),
    ],
)
def test_processes_writing_the_same_precomputed_shards_lose_nothing(
    writers: Writers, tmp_path: Path, name: str, mode: str
) -> None:
    root, sharding = str(tmp_path), SHARDINGS[name]
    _create(root, sharding)
    writers.together([(_zarr_writer, (root, mode, w)) for w in range(WRITERS)])
    lost = _lost(root, sharding)
    assert len(lost) == 0, f"{len(lost)} chunks lost or stale: {lost[:10]}"
    _check_clean(root, sharding)


def test_zarr_and_key_value_writers_of_the_same_shards_take_turns(writers: Writers, tmp_path: Path) -> None:
    """Two processes write through zarr, two through PrecomputedShardedStore, all into
    the same two shard files: both APIs lock the same files."""
    root, sharding = str(tmp_path), SHARDINGS["murmurhash"]
    _create(root, sharding)
    writers.together(
        [
            (_zarr_writer, (root, "rewrite", 0)),
            (_zarr_writer, (root, "batch", 1)),
            (_kv_writer, (root, sharding, 2)),
            (_kv_writer, (root, sharding, 3)),
        ]
    )
    lost = _lost(root, sharding)
    assert len(lost) == 0, f"{len(lost)} chunks lost or stale: {lost[:10]}"
    _check_clean(root, sharding)


@pytest.mark.parametrize("name", sorted(SHARDINGS))
def test_store_instances_in_threads_lose_nothing(tmp_path: Path, name: str) -> None:
    root, sharding = str(tmp_path), SHARDINGS[name]
    _create(root, sharding)
    arrays = [zarr.open_array(ShardingStore(root), path="vol") for _ in range(2 * WRITERS)]
    barrier = threading.Barrier(2 * WRITERS)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            barrier.wait()
            for final in (False, True):
                for r, c in _mine(i % WRITERS):
                    arrays[i][r * CHUNK : (r + 1) * CHUNK, c * CHUNK : (c + 1) * CHUNK] = _value(r, c, final)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2 * WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _lost(root, sharding) == []
    _check_clean(root, sharding)


def test_a_key_value_read_meeting_a_replaced_shard_reads_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deterministic: between the key-value store's reads of the minishard indices and
    of the chunk data, another store rewrites both shards with other values and the
    first chunk erased, which moves every chunk after it. The data read must be
    refused and redone: the new values, never bytes at the old offsets."""
    root, sharding = str(tmp_path), SHARDINGS["identity"]
    _create(root, sharding)
    ids = np.arange(1, GRID * GRID + 1).reshape(GRID, GRID)
    arr = zarr.open_array(ShardingStore(root), path="vol")
    arr[:] = np.kron(ids, np.ones((CHUNK, CHUNK), "i4"))
    kv = PrecomputedShardedStore(str(tmp_path / "vol" / "c"), sharding)
    wanted = [_chunk_id(r, c) for r, c in POSITIONS]
    original = kv.raw.get_many_versioned
    calls = 0

    def rewrite() -> None:
        new = -ids
        new[0, 0] = 0  # the fill value: the chunk is erased, the ones after it move
        zarr.open_array(ShardingStore(root), path="vol")[:] = np.kron(new, np.ones((CHUNK, CHUNK), "i4"))

    async def rewrite_between(requests: Any, expected: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:  # shard index entries, minishard indices, then (now) the data
            await asyncio.to_thread(rewrite)
        return await original(requests, expected)

    monkeypatch.setattr(kv.raw, "get_many_versioned", rewrite_between)
    got = asyncio.run(kv.get_many(wanted))
    assert calls > 3  # the stale data read was redone
    expected = [None if (r, c) == (0, 0) else _chunk_bytes(r, c, False) for r, c in POSITIONS]
    assert got == expected
