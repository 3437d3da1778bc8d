"""Unit tests of shardstore.catalog.ArrayCatalog over a counted in-memory inner store."""

from __future__ import annotations

import asyncio
import functools
import json

import zarr
from zarr.core.buffer import default_buffer_prototype

from shardstore import ShardingStore
from shardstore.catalog import ArrayCatalog
from shardstore.inner import MappingInner
from shardstore.instrument import CountingInner
from shardstore.keys import ChunkKeyGrammar


@functools.cache
def documents() -> dict[str, bytes]:
    """Metadata documents as shardstore stores them, made by zarr through a ShardingStore:
    ``g/a`` (v3, default keys), ``g/v2e`` (v3, v2 keys), ``old`` (v2), all sharded 2 x 2,
    and ``plain1d`` (v3, unsharded: the policy has no 1-d entry)."""
    raw: dict[str, bytes] = {}
    store = ShardingStore(raw, chunks_per_shard=(2, 2))
    zarr.create_array(store, name="g/a", shape=(8, 6), chunks=(2, 3), dtype="u2")
    zarr.create_array(
        store,
        name="g/v2e",
        shape=(8, 8),
        chunks=(2, 2),
        dtype="u1",
        chunk_key_encoding={"name": "v2", "separator": "."},
    )
    zarr.create_array(store, name="old", shape=(8, 8), chunks=(4, 2), dtype="u1", zarr_format=2)
    zarr.create_array(store, name="plain1d", shape=(8,), chunks=(2,), dtype="u1")
    return dict(raw)


@functools.cache
def codec_document() -> bytes:
    """A v3 array sharded by zarr's own ``sharding_indexed`` codec: shards of 4 x 4,
    inner chunks of 2 x 2."""
    memory = zarr.storage.MemoryStore()
    zarr.create_array(memory, name="s", shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="u1")
    buf = asyncio.run(memory.get("s/zarr.json", default_buffer_prototype()))
    assert buf is not None
    return buf.to_bytes()


def counted_catalog(
    docs: dict[str, bytes] | None = None,
) -> tuple[ArrayCatalog, CountingInner, dict[str, bytes]]:
    mapping = dict(documents() if docs is None else docs)
    counted = CountingInner(MappingInner(mapping))
    return ArrayCatalog(counted), counted, mapping


async def shape_at(catalog: ArrayCatalog, path: str) -> tuple[int, ...] | None:
    info = await catalog.lookup(path)
    return None if info is None else info.shape


def test_the_documents_are_what_the_tests_expect() -> None:
    """The fixture documents: array documents where expected, sharding recorded in them."""
    docs = documents()
    assert {"g/a/zarr.json", "g/v2e/zarr.json", "old/.zarray", "plain1d/zarr.json"} <= set(docs)
    assert json.loads(docs["old/.zarray"])["zarr_format"] == 2
    assert json.loads(docs["g/a/zarr.json"])["storage_transformers"][0]["name"] == "sharding"


# -- remember --------------------------------------------------------------------------


def test_remember_a_v3_array_document() -> None:
    """A v3 array document gives the array's geometry, key encoding and sharding."""
    catalog, counted, _ = counted_catalog()
    before = catalog.generation
    info = catalog.remember("g/a", "zarr.json", documents()["g/a/zarr.json"])
    assert info is not None
    assert (info.path, info.shape, info.chunks) == ("g/a", (8, 6), (2, 3))
    assert info.grammar == ChunkKeyGrammar("default", "/")
    assert info.shard_format is not None and info.shard_format.chunks_per_shard == (2, 2)
    assert info.itemsize == 2
    assert catalog.generation == before + 1
    assert counted.counts.reads == 0


def test_remember_a_v2_array_document() -> None:
    """A v2 ``.zarray`` gives v2 keys with its separator."""
    catalog, _, _ = counted_catalog()
    info = catalog.remember("old", ".zarray", documents()["old/.zarray"])
    assert info is not None
    assert (info.path, info.shape, info.chunks) == ("old", (8, 8), (4, 2))
    assert info.grammar == ChunkKeyGrammar("v2", ".")
    assert info.shard_format is not None and info.shard_format.chunks_per_shard == (2, 2)


def test_remember_none_records_an_absent_document() -> None:
    """A deleted (absent) document describes nothing, and is known to be absent."""
    catalog, counted, _ = counted_catalog()
    before = catalog.generation
    assert catalog.remember("g/a", "zarr.json", None) is None
    assert catalog.generation == before + 1
    assert catalog.remember("g/a", ".zarray", None) is None

    async def go() -> None:
        assert await catalog.lookup("g/a") is None  # both known absent: nothing read

    asyncio.run(go())
    assert counted.counts.reads == 0


def test_remember_ignores_documents_that_cannot_describe_arrays() -> None:
    """Group attributes and the like are not recorded and change nothing."""
    catalog, _, _ = counted_catalog()
    before = catalog.generation
    assert catalog.remember("g", ".zattrs", b"{}") is None
    assert catalog.remember("g", ".zgroup", b'{"zarr_format": 2}') is None
    assert catalog.generation == before


async def test_a_remembered_group_document_means_no_array_without_reading() -> None:
    """A v3 group document at a path says no array is there: lookup reads nothing."""
    catalog, counted, _ = counted_catalog()
    assert catalog.remember("g", "zarr.json", documents()["g/zarr.json"]) is None
    assert await catalog.lookup("g") is None
    assert counted.counts.reads == 0


async def test_a_remembered_v3_document_answers_lookup_without_reading() -> None:
    """A document written through the store is known: looking the path up reads nothing."""
    catalog, counted, _ = counted_catalog()
    remembered = catalog.remember("g/a", "zarr.json", documents()["g/a/zarr.json"])
    assert await catalog.lookup("g/a") == remembered
    assert counted.counts.reads == 0


async def test_a_remembered_v2_document_reads_only_the_missing_v3_one() -> None:
    """With ``.zarray`` known, lookup reads only ``zarr.json`` (which would win if present)."""
    catalog, counted, _ = counted_catalog()
    remembered = catalog.remember("old", ".zarray", documents()["old/.zarray"])
    assert await catalog.lookup("old") == remembered
    assert dict(counted.counts.read_keys) == {"old/zarr.json": 1}


async def test_zarr_json_wins_over_zarray_at_one_path() -> None:
    """Where both documents exist, the v3 one describes the array (as zarr reads it)."""
    docs = dict(documents())
    docs["g/a/.zarray"] = docs["old/.zarray"]
    catalog, _, _ = counted_catalog(docs)
    info = await catalog.lookup("g/a")
    assert info is not None and info.grammar.kind == "default" and info.shape == (8, 6)


# -- lookup ------------------------------------------------------------------------------


async def test_lookup_reads_the_documents_once_and_caches_them() -> None:
    """The first lookup reads both array documents in one batch; later ones read nothing."""
    catalog, counted, _ = counted_catalog()
    before = catalog.generation
    info = await catalog.lookup("g/a")
    assert info is not None and info.shape == (8, 6)
    assert counted.counts.read_batches == 1
    assert dict(counted.counts.read_keys) == {"g/a/zarr.json": 1, "g/a/.zarray": 1}
    assert catalog.generation > before
    generation = catalog.generation

    assert await catalog.lookup("g/a") == info
    assert counted.counts.reads == 2
    assert catalog.generation == generation  # a cached answer changes nothing


async def test_lookup_caches_that_nothing_is_there() -> None:
    """A path without array documents is read once, then known to be no array."""
    catalog, counted, _ = counted_catalog()
    assert await catalog.lookup("nothing/here") is None
    assert await catalog.lookup("nothing/here") is None
    assert counted.counts.reads == 2
    assert counted.counts.read_batches == 1


async def test_lookup_refresh_rereads_and_bumps_the_generation() -> None:
    """refresh=True forgets what was known of the path and reads it again."""
    catalog, counted, mapping = counted_catalog()
    assert await shape_at(catalog, "plain1d") == (8,)
    doc = json.loads(mapping["plain1d/zarr.json"])
    doc["shape"] = [20]
    mapping["plain1d/zarr.json"] = json.dumps(doc).encode()

    assert await shape_at(catalog, "plain1d") == (8,)  # cached
    generation = catalog.generation
    info = await catalog.lookup("plain1d", refresh=True)
    assert info is not None and info.shape == (20,)
    assert catalog.generation > generation
    assert counted.counts.read_keys["plain1d/zarr.json"] == 2


async def test_lookup_of_a_v3_draft_array_reads_its_meta_document() -> None:
    """Under ``data/root`` the array is described by ``meta/root/<path>.array.json``."""
    draft = {"shape": [4, 4], "data_type": "uint8", "chunk_grid": {"chunk_shape": [2, 2], "separator": "/"}}
    catalog, counted, _ = counted_catalog({"meta/root/x.array.json": json.dumps(draft).encode()})
    info = await catalog.lookup("data/root/x")
    assert info is not None and info.grammar == ChunkKeyGrammar("draft", "/") and info.chunks == (2, 2)
    assert dict(counted.counts.read_keys) == {"meta/root/x.array.json": 1}
    assert await catalog.lookup("data/root/x") == info
    assert counted.counts.reads == 1


async def test_document_fetches_one_document_once() -> None:
    """document() reads a single named document if unknown, then answers from memory."""
    catalog, counted, _ = counted_catalog()
    info = await catalog.document("old", ".zarray")
    assert info is not None and info.grammar.kind == "v2"
    assert await catalog.document("old", ".zarray") == info
    assert dict(counted.counts.read_keys) == {"old/.zarray": 1}


# -- array_for_key ---------------------------------------------------------------------


async def test_array_for_a_v3_default_chunk_key() -> None:
    """``g/a/c/1/2`` is a chunk key of ``g/a``: only that array's documents are read."""
    catalog, counted, _ = counted_catalog()
    info = await catalog.array_for_key("g/a/c/1/2")
    assert info is not None and info.path == "g/a"
    assert info.coords("g/a/c/1/2") == (1, 2)
    assert set(counted.counts.read_keys) == {"g/a/zarr.json", "g/a/.zarray"}
    assert await catalog.array_for_key("g/a/c/3/1") == info
    assert counted.counts.reads == 2


async def test_array_for_a_v3_array_with_v2_keys() -> None:
    """A v3 array with the v2 key encoding owns dotted keys."""
    catalog, _, _ = counted_catalog()
    info = await catalog.array_for_key("g/v2e/1.2")
    assert info is not None and info.path == "g/v2e" and info.grammar == ChunkKeyGrammar("v2", ".")
    assert await catalog.array_for_key("g/v2e/c/1/2") is None  # not its encoding


async def test_array_for_a_v2_chunk_key() -> None:
    """A v2 array's ``1.0`` keys resolve to it."""
    catalog, _, _ = counted_catalog()
    info = await catalog.array_for_key("old/1.0")
    assert info is not None and info.path == "old" and info.coords("old/1.0") == (1, 0)


async def test_array_for_a_key_of_another_rank_still_matches() -> None:
    """A key encoded like the array's chunk keys matches whatever its rank."""
    catalog, _, _ = counted_catalog()
    info = await catalog.array_for_key("g/a/c/7")
    assert info is not None and info.path == "g/a"
    assert info.coords("g/a/c/7") is None  # but it is no chunk of this 2-d array


async def test_array_for_non_chunk_keys_is_none() -> None:
    """Metadata keys are not looked up at all; keys in another encoding, or under no
    array, resolve to nothing."""
    catalog, counted, _ = counted_catalog()
    assert await catalog.array_for_key("g/a/zarr.json") is None
    assert await catalog.array_for_key("g/a/.zattrs") is None
    assert counted.counts.reads == 0
    assert await catalog.array_for_key("plain1d/0") is None  # v3 default keys are c/0
    assert await catalog.array_for_key("nowhere/c/0/0") is None
    assert await catalog.array_for_key("g/a/c/x/1") is None


async def test_array_for_key_refresh_sees_a_new_array() -> None:
    """A key under a path known to hold nothing resolves once refreshed after the array appears."""
    catalog, _, mapping = counted_catalog()
    assert await catalog.array_for_key("new/c/0") is None
    mapping["new/zarr.json"] = documents()["plain1d/zarr.json"]
    assert await catalog.array_for_key("new/c/0") is None  # cached: nothing there
    info = await catalog.array_for_key("new/c/0", refresh=True)
    assert info is not None and info.path == "new"


# -- forget ------------------------------------------------------------------------------


async def test_forget_drops_paths_at_and_below_the_prefix() -> None:
    """forget("g/") drops ``g`` and everything below it, nothing else; they are read again."""
    catalog, counted, _ = counted_catalog()
    for path in ("", "g", "g/a", "g/v2e", "old"):
        await catalog.lookup(path)
    counted.counts.reset()
    before = catalog.generation
    catalog.forget("g/")
    assert catalog.generation == before + 1
    for path in ("", "old"):
        await catalog.lookup(path)
    assert counted.counts.reads == 0  # kept
    for path in ("g", "g/a", "g/v2e"):
        await catalog.lookup(path)
    assert counted.counts.read_batches == 3  # dropped: read again


async def test_forget_does_not_drop_siblings_sharing_a_name_prefix() -> None:
    """forget("g/") keeps ``gx`` (a directory prefix, not a string prefix)."""
    catalog, counted, _ = counted_catalog()
    await catalog.lookup("gx")
    counted.counts.reset()
    catalog.forget("g/")
    await catalog.lookup("gx")
    assert counted.counts.reads == 0


async def test_forget_everything() -> None:
    """forget("") drops every path."""
    catalog, counted, _ = counted_catalog()
    await catalog.lookup("")
    await catalog.lookup("old")
    counted.counts.reset()
    catalog.forget("")
    await catalog.lookup("")
    await catalog.lookup("old")
    assert counted.counts.read_batches == 2


# -- sharded_array_around ------------------------------------------------------------------


async def test_sharded_array_around_a_prefix() -> None:
    """The sharded array whose directory is or holds the prefix; None where there is none."""
    catalog, _, _ = counted_catalog()
    for prefix in ("g/a/", "g/a/c/", "g/a/c/1/"):
        found = await catalog.sharded_array_around(prefix)
        assert found is not None and found.path == "g/a", prefix
    found = await catalog.sharded_array_around("old/")
    assert found is not None and found.path == "old"
    assert await catalog.sharded_array_around("g/") is None  # a group
    assert await catalog.sharded_array_around("") is None
    assert await catalog.sharded_array_around("plain1d/") is None  # an array, but not sharded


# -- zarr_shards / zarr_sharded ----------------------------------------------------------


def test_a_codec_sharded_array_is_served_unless_zarr_shards_it_itself() -> None:
    """Standard codec metadata is served as our layout, but where zarr wrote that sharding
    itself through the store the array passes through untouched."""
    catalog, _, _ = counted_catalog()
    raw = codec_document()

    served = catalog.remember("s", "zarr.json", raw)
    assert served is not None and served.form == "codec" and not served.codec_sharded
    assert served.shard_format is not None and served.shard_format.chunks_per_shard == (2, 2)
    assert served.chunks == (2, 2)  # the inner chunks
    assert not catalog.zarr_sharded("s")

    catalog.zarr_shards("s", True)
    assert catalog.zarr_sharded("s")
    assert not catalog.zarr_sharded("other")
    passed = catalog.remember("s", "zarr.json", raw)
    assert passed is not None and passed.shard_format is None and passed.codec_sharded
    assert passed.form == "transformer"

    catalog.zarr_shards("s", False)
    assert not catalog.zarr_sharded("s")
    again = catalog.remember("s", "zarr.json", raw)
    assert again is not None and again.form == "codec" and again.shard_format is not None


def test_zarr_shards_leaves_our_own_sharding_alone() -> None:
    """Only codec-form arrays are affected by zarr_shards: our transformer form is kept."""
    catalog, _, _ = counted_catalog()
    catalog.zarr_shards("g/a", True)
    info = catalog.remember("g/a", "zarr.json", documents()["g/a/zarr.json"])
    assert info is not None and info.shard_format is not None and not info.codec_sharded
