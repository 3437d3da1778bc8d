"""Unit tests of shardstore.routing.KeyRouter: where each kind of key goes."""

from __future__ import annotations

import pytest

from shardstore import ChunkKeyError
from shardstore.addressing import ChunkAddress
from shardstore.catalog import ArrayCatalog
from shardstore.inner import MappingInner
from shardstore.instrument import CountingInner
from shardstore.routing import KeyRouter
from tests.test_unit_catalog import documents


def router() -> tuple[KeyRouter, ArrayCatalog, CountingInner]:
    counted = CountingInner(MappingInner(dict(documents())))
    catalog = ArrayCatalog(counted)
    return KeyRouter(catalog), catalog, counted


@pytest.mark.parametrize("key", ["zarr.json", "g/zarr.json", "g/a/zarr.json", "old/.zarray", "old/.zattrs"])
async def test_metadata_documents_go_to_the_gateway_without_a_lookup(key: str) -> None:
    route, _, counted = router()
    assert await route.route(key) == "metadata"
    assert counted.counts.reads == 0


async def test_a_chunk_key_of_a_sharded_array_is_an_address_in_its_shard() -> None:
    route, _, _ = router()
    where = await route.route("g/a/c/3/1")  # chunks 2 x 3 of (8, 6), 2 x 2 per shard
    assert isinstance(where, ChunkAddress)
    assert where.shard.key == "g/a/c/1/0"
    assert where.position == 3  # (1, 1) in the shard, C order
    v2 = await route.route("old/3.1")
    assert isinstance(v2, ChunkAddress) and v2.shard.key == "old/1.0" and v2.position == 3


@pytest.mark.parametrize("key", ["plain1d/c/2", "elsewhere/x", "g/a/notes.txt"])
async def test_keys_of_unsharded_arrays_and_other_keys_pass_through(key: str) -> None:
    route, _, _ = router()
    assert await route.route(key) == "inner"


async def test_a_chunk_key_of_the_wrong_rank_is_absent_for_reads_and_refused_for_writes() -> None:
    route, _, _ = router()
    assert await route.route("g/a/c/1/1/1") == "absent"
    with pytest.raises(ChunkKeyError, match=r"g/a/c/1/1/1.*not a chunk key of this 2-d array"):
        await route.route("g/a/c/1/1/1", writing=True)


async def test_a_write_outside_the_grid_is_refused_naming_key_and_grid() -> None:
    route, _, _ = router()
    with pytest.raises(ChunkKeyError, match=r"g/a/c/4/0.*outside the chunk grid.*\[4, 2\]"):
        await route.route("g/a/c/4/0", writing=True)


async def test_addresses_are_remembered_until_the_catalog_changes() -> None:
    route, catalog, counted = router()
    first = await route.route("g/a/c/0/0")
    reads = counted.counts.reads
    assert await route.route("g/a/c/0/0") is first
    assert counted.counts.reads == reads
    catalog.remember("g/a", "zarr.json", None)  # the array's document deleted
    again = await route.route("g/a/c/0/0")
    assert again is not first
