"""Unit tests of shardstore.routing.KeyRouter: where each kind of key goes."""

from __future__ import annotations

import asyncio

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from shardstore import ChunkKeyError
from shardstore.addressing import ChunkAddress
from shardstore.catalog import ArrayCatalog
from shardstore.inner import MappingInner
from shardstore.instrument import CountingInner
from shardstore.routing import Destination, KeyRouter
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


async def _outcome(route: KeyRouter, key: str, writing: bool) -> Destination | str:
    try:
        return await route.route(key, writing=writing)
    except ChunkKeyError as exc:
        return str(exc)


_DIRECTORIES = st.one_of(
    st.sampled_from(["g/a/c/1", "g/a/c", "old", "old/3", "g/v2e", "plain1d/c", ""]),
    st.lists(st.sampled_from(["g", "a", "v2e", "old", "c", "0", "3", "1.2", "c1"]), max_size=4).map("/".join),
)

_NAMES = st.one_of(st.integers(0, 9).map(str), st.sampled_from(["1.2", "c", "01", "zarr.json"]))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(_DIRECTORIES, st.lists(_NAMES, min_size=1, max_size=4), st.booleans()),
        min_size=1,
        max_size=8,
    )
)
def test_keys_of_one_directory_route_as_if_each_were_looked_up_afresh(
    cases: list[tuple[str, list[str], bool]],
) -> None:
    """The router remembers, per directory, the array of keys whose last segment is an
    integer: every such key must go where a router looking it up afresh sends it."""

    async def compare() -> None:
        shared, _, _ = router()
        for directory, names, writing in cases:
            for name in names:
                key = f"{directory}/{name}" if directory else name
                fresh, _, _ = router()
                assert await _outcome(shared, key, writing) == await _outcome(fresh, key, writing)

    asyncio.run(compare())


async def test_a_directorys_array_is_looked_up_again_once_the_catalog_changes() -> None:
    route, catalog, _ = router()
    assert isinstance(await route.route("g/a/c/0/0"), ChunkAddress)
    catalog.remember("g/a", "zarr.json", None)  # the array's document deleted
    assert await route.route("g/a/c/0/1") == "inner"  # same directory, not yet routed
