"""ShardingStore over an Icechunk repository: commits, snapshots, branches, and
several writers (sessions, forks in other processes, dask) losing nothing.

Every test runs on Icechunk's local-filesystem storage and on its S3 storage
against a local S3 API (moto). Icechunk warns that concurrent commits on local
files are unsafe, so the race of two committing processes runs on S3 only.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardstore import (
    PartialShardWriteError,
    ReadOnlyError,
    ShardingStore,
    ShardStoreError,
    StrategyFallbackWarning,
)
from tests.processes import Writers

icechunk = pytest.importorskip("icechunk")

SHAPE = (64, 64)
CHUNKS = (8, 8)
CPS = (4, 4)  # 2 x 2 shards of 4 x 4 chunks
GRID = (8, 8)
CONFLICTS = (icechunk.ConflictError, icechunk.RebaseFailedError)  # unrelated classes in Icechunk 1


# -- repositories ------------------------------------------------------------------


def storage_of(spec: dict[str, str]) -> Any:
    """An Icechunk storage from a picklable description (processes open their own)."""
    if spec["kind"] == "local":
        return icechunk.local_filesystem_storage(spec["path"])
    return icechunk.s3_storage(
        bucket=spec["bucket"],
        prefix=spec["prefix"],
        endpoint_url=spec["endpoint_url"],
        allow_http=True,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
        force_path_style=True,
    )


@pytest.fixture(params=["local", "s3"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    if request.param == "local":
        return {"kind": "local", "path": str(tmp_path / "repo")}
    s3 = request.getfixturevalue("s3")
    return {"kind": "s3", "bucket": s3.bucket, "prefix": uuid.uuid4().hex, "endpoint_url": s3.endpoint_url}


def new_repo(spec: dict[str, str]) -> Any:
    """A repository whose main branch holds an empty int32 array "a" (SHAPE, CHUNKS, CPS)."""
    repo = icechunk.Repository.create(storage_of(spec))
    session = repo.writable_session("main")
    zarr.create_array(
        ShardingStore(session.store, CPS), name="a", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=0
    )
    session.commit("create a")
    return repo


@pytest.fixture
def repo(spec: dict[str, str]) -> Any:
    return new_repo(spec)


def values() -> np.ndarray:
    """Every chunk a different non-zero value (chunk (i, j) holds i * 8 + j + 1)."""
    blocks = np.arange(1, GRID[0] * GRID[1] + 1, dtype="i4").reshape(GRID)
    return np.kron(blocks, np.ones(CHUNKS, dtype="i4")).astype("i4")


def chunk_region(i: int, j: int) -> tuple[slice, slice]:
    return slice(i * CHUNKS[0], (i + 1) * CHUNKS[0]), slice(j * CHUNKS[1], (j + 1) * CHUNKS[1])


def read_main(repo: Any, **where: Any) -> np.ndarray:
    session = repo.readonly_session(**(where or {"branch": "main"}))
    return np.asarray(zarr.open_array(ShardingStore(session.store), path="a", mode="r")[:])


def lost_chunks(got: np.ndarray, want: np.ndarray) -> int:
    """Chunks of ``want`` that ``got`` does not hold."""
    differs = (got != want).reshape(GRID[0], CHUNKS[0], GRID[1], CHUNKS[1]).any(axis=(1, 3))
    return int(differs.sum())


def array_in(session: Any, **kwargs: Any) -> Any:
    return zarr.open_array(ShardingStore(session.store, **kwargs), path="a")


# -- a session: commits, snapshots, branches -------------------------------------------


def test_a_write_is_seen_only_after_its_commit_and_snapshots_read_as_they_were(repo: Any) -> None:
    first = repo.lookup_branch("main")
    session = repo.writable_session("main")
    array_in(session)[:16, :] = 7
    assert read_main(repo).sum() == 0, "an uncommitted write is invisible to readers"
    assert (np.asarray(array_in(session)[:16, :]) == 7).all(), "the session reads its own writes"
    second = session.commit("seven")
    assert (read_main(repo)[:16] == 7).all() and (read_main(repo)[16:] == 0).all()
    assert read_main(repo, snapshot_id=first).sum() == 0, "an older snapshot reads the old values"

    discarded = repo.writable_session("main")
    array_in(discarded)[:, :] = 9
    discarded.discard_changes()
    assert not discarded.has_uncommitted_changes
    assert repo.lookup_branch("main") == second and (read_main(repo)[:16] == 7).all()

    repo.create_branch("dev", snapshot_id=second)
    dev = repo.writable_session("dev")
    array_in(dev)[16:24, :] = 3
    dev.commit("three on dev")
    repo.create_tag("v1", snapshot_id=second)
    assert (read_main(repo, branch="dev")[16:24] == 3).all()
    assert (read_main(repo)[16:24] == 0).all(), "main is untouched by dev"
    assert (read_main(repo, tag="v1") == read_main(repo)).all()


def test_chunks_are_stored_as_shard_objects_in_the_repository(repo: Any) -> None:
    session = repo.writable_session("main")
    array_in(session)[:] = values()
    session.commit("all")
    keys = zarr.core.sync.sync(_keys(repo.readonly_session(branch="main").store))
    chunk_objects = sorted(k for k in keys if k.startswith("a/c/"))
    assert chunk_objects == ["a/c/0/0", "a/c/0/1", "a/c/1/0", "a/c/1/1"], "64 chunks in 4 shards"
    assert (read_main(repo) == values()).all()


async def _keys(store: Any, prefix: str = "") -> list[str]:
    return [k async for k in store.list_prefix(prefix)]


def test_listing_takes_prefixes_that_icechunk_refuses(repo: Any) -> None:
    """Icechunk lists only below a group or an array; zarr and shardstore list any prefix."""
    session = repo.writable_session("main")
    array_in(session)[:8, :] = 1  # 8 chunks in shards a/c/0/0 and a/c/0/1
    store = ShardingStore(session.store)
    want = [f"a/c/0/{j}" for j in range(8)]
    assert sorted(zarr.core.sync.sync(_keys(store, "a/c/"))) == want
    assert sorted(zarr.core.sync.sync(_keys(store, "a/c/0/"))) == want
    assert zarr.core.sync.sync(_keys(store, "nothing/")) == []
    assert zarr.core.sync.sync(_keys(store, "a/c/5/")) == []


def test_the_session_passes_through_for_icechunks_own_helpers(repo: Any) -> None:
    session = repo.writable_session("main")
    fork = session.fork()
    assert ShardingStore(session.store).session.snapshot_id == session.snapshot_id
    assert type(ShardingStore(fork.store).session).__name__ == "ForkSession"
    with pytest.raises(AttributeError, match="no Icechunk session"):
        ShardingStore({}).session  # noqa: B018


def test_a_read_only_session_refuses_writes_naming_the_key(repo: Any) -> None:
    store = ShardingStore(repo.readonly_session(branch="main").store)
    assert store.read_only
    array = zarr.open_array(store, path="a")
    with pytest.raises(ReadOnlyError, match=r"'a/c/0/0' was not written.*read-only"):
        array[:8, :8] = 1
    assert read_main(repo).sum() == 0


def test_append_falls_back_to_whole_shard_rewrites_with_a_warning(repo: Any) -> None:
    session = repo.writable_session("main")
    with pytest.warns(StrategyFallbackWarning, match="append"):
        store = ShardingStore(session.store, write_strategy="append")
    array = zarr.open_array(store, path="a")
    array[:8, :8] = 1
    array[:8, 8:16] = 2
    session.commit("two writes")
    got = read_main(repo)
    assert (got[:8, :8] == 1).all() and (got[:8, 8:16] == 2).all() and got[8:].sum() == 0


def test_threads_of_one_session_writing_one_shard_lose_nothing(repo: Any) -> None:
    import concurrent.futures

    session = repo.writable_session("main")
    want = values()
    stores = [ShardingStore(session.store) for _ in range(4)]  # two session.store objects share locks

    def write(n: int) -> None:
        array = zarr.open_array(stores[n], path="a")
        for i in range(GRID[0]):
            for j in range(GRID[1]):
                if (i * GRID[1] + j) % 4 == n:
                    array[chunk_region(i, j)] = want[chunk_region(i, j)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(4)))
    session.commit("threads")
    assert lost_chunks(read_main(repo), want) == 0


# -- two sessions ----------------------------------------------------------------------


@pytest.mark.parametrize("rebase", [False, True], ids=["plain-commit", "conflict-detector"])
def test_two_sessions_writing_one_shard_conflict_and_the_retry_keeps_both(repo: Any, rebase: bool) -> None:
    a, b = repo.writable_session("main"), repo.writable_session("main")
    array_in(a)[chunk_region(0, 0)] = 1
    array_in(b)[chunk_region(0, 1)] = 2  # the same shard, a/c/0/0
    a.commit("a")
    attempts = commit_with_retry(repo, b, lambda s: array_in(s).__setitem__(chunk_region(0, 1), 2), rebase)
    assert attempts == 2, "the second commit met the first and was redone"
    got = read_main(repo)
    assert (got[chunk_region(0, 0)] == 1).all() and (got[chunk_region(0, 1)] == 2).all()


def commit_with_retry(repo: Any, session: Any, write: Any, rebase: bool, limit: int = 20) -> int:
    """Commit; on Icechunk's conflict, redo the write in a fresh session. The attempts made."""
    for attempt in range(1, limit + 1):
        try:
            session.commit("write", rebase_with=icechunk.ConflictDetector() if rebase else None)
            return attempt
        except CONFLICTS:
            session = repo.writable_session("main")
            write(session)
    raise AssertionError(f"no commit in {limit} attempts")


def session_writer(spec: dict[str, str], n: int, rebase: bool, start: Any) -> int:
    """Process ``n`` of a race: write chunk (0, n) of shard a/c/0/0, then commit at
    the same time as the others, retrying on conflict. Its commit attempts."""
    repo = icechunk.Repository.open(storage_of(spec))

    def write(session: Any) -> None:
        array_in(session)[chunk_region(0, n)] = n + 1

    session = repo.writable_session("main")
    write(session)
    start.wait()
    return commit_with_retry(repo, session, write, rebase)


@pytest.mark.parametrize("rebase", [False, True], ids=["plain-commit", "conflict-detector"])
def test_sessions_in_four_processes_writing_one_shard_lose_nothing(
    s3: Any, writers: Writers, rebase: bool
) -> None:
    """On S3 only: Icechunk's local storage is not safe for concurrent commits."""
    spec = {"kind": "s3", "bucket": s3.bucket, "prefix": uuid.uuid4().hex, "endpoint_url": s3.endpoint_url}
    repo = new_repo(spec)
    attempts = writers.together([(session_writer, (spec, n, rebase)) for n in range(4)])
    got = read_main(repo)
    assert [int(got[chunk_region(0, n)][0, 0]) for n in range(4)] == [1, 2, 3, 4], attempts
    assert max(attempts) > 1, "the commits met (each saw the others' snapshot)"


# -- a session changed under a store -------------------------------------------------


def _rebased(repo: Any, session: Any) -> None:
    """Another session commits chunk (0, 0) = 7; ``session`` rebases onto it."""
    other = repo.writable_session("main")
    array_in(other)[chunk_region(0, 0)] = 7
    other.commit("7s")
    session.rebase(icechunk.ConflictDetector())


def _merged(repo: Any, session: Any) -> None:
    """A fork of ``session`` rewrites shard a/c/0/0 whole with 7s; merged back."""
    fork = session.fork()
    array_in(fork)[:32, :32] = 7
    session.merge(fork)


def _discarded(repo: Any, session: Any) -> None:
    """``session`` writes 99s into chunk (0, 0), then discards its changes."""
    array_in(session)[chunk_region(0, 0)] = 99
    session.discard_changes()


@pytest.mark.parametrize(
    ("change", "seven"),
    [(_rebased, True), (_merged, True), (_discarded, False)],
    ids=["rebase", "merge", "discard"],
)
def test_a_store_kept_across_a_change_of_its_session_writes_on_what_the_session_now_holds(
    repo: Any, change: Any, seven: bool
) -> None:
    """``rebase``, ``merge`` and ``discard_changes`` replace what a session serves with
    no write through a store: a store that had read the shard before (a shard cached
    for a second) put the old chunk back with a one-element write, and lost the other
    session's chunk, or the fork's, or committed values that were discarded."""
    seed = repo.writable_session("main")
    array_in(seed)[:] = 1
    seed.commit("ones")
    session = repo.writable_session("main")
    array = array_in(session)
    for _ in range(3):  # read again and again: the shard is cached
        assert (array[:4, :4] == 1).all()
    change(repo, session)
    array[0, 0] = 3  # zarr reads the rest of chunk (0, 0) through the store
    session.commit("one element")
    got = read_main(repo)
    want = np.ones(SHAPE, dtype="i4")
    if seven:
        want[chunk_region(0, 0)] = 7
        if change is _merged:
            want[:32, :32] = 7
    want[0, 0] = 3
    assert lost_chunks(got, want) == 0, got[:8, :8]


# -- forks -----------------------------------------------------------------------------


def fork_writer(fork: Any, n: int, layout: str, start: Any) -> Any:
    """Write this fork's part of ``values()``: whole shards ("shards": shard n) or
    every 4th chunk ("chunks"). The fork, to be merged."""
    want = values()
    array = array_in(fork)
    start.wait()
    if layout == "shards":
        i, j = divmod(n, 2)
        region = (slice(i * 32, (i + 1) * 32), slice(j * 32, (j + 1) * 32))
        array[region] = want[region]
    else:
        for i in range(GRID[0]):
            for j in range(GRID[1]):
                if (i * GRID[1] + j) % 4 == n:
                    array[chunk_region(i, j)] = want[chunk_region(i, j)]
    return fork


def test_forks_in_four_processes_writing_whole_shards_lose_nothing(repo: Any, writers: Writers) -> None:
    session = repo.writable_session("main")
    forks = [session.fork() for _ in range(4)]
    done = writers.together([(fork_writer, (fork, n, "shards")) for n, fork in enumerate(forks)])
    session.merge(*done)
    session.commit("four forks")
    assert lost_chunks(read_main(repo), values()) == 0


def test_forks_writing_parts_of_shards_are_refused_before_the_commit(repo: Any, writers: Writers) -> None:
    before = repo.lookup_branch("main")
    session = repo.writable_session("main")
    forks = [session.fork() for _ in range(4)]
    with pytest.raises(PartialShardWriteError, match=r"shard 'a/c/0/0' of array 'a'.*1 of the 16 chunks"):
        writers.together([(fork_writer, (fork, n, "chunks")) for n, fork in enumerate(forks)])
    assert repo.lookup_branch("main") == before, "nothing was committed"
    assert read_main(repo).sum() == 0


def test_a_fork_may_write_a_shard_chunk_by_chunk_inside_one_batch(repo: Any) -> None:
    session = repo.writable_session("main")
    fork = session.fork()
    store = ShardingStore(fork.store)
    array = zarr.open_array(store, path="a")
    want = values()
    with store.batch():
        for i in range(4):
            for j in range(4):
                array[chunk_region(i, j)] = want[chunk_region(i, j)]
    with pytest.raises(PartialShardWriteError, match="a/c/0/1"):  # half a shard, then the rest
        array[:32, 32:48] = want[:32, 32:48]
    session.merge(fork)
    session.commit("one shard")
    got = read_main(repo)
    assert (got[:32, :32] == want[:32, :32]).all() and got[:, 32:].sum() == 0 and got[32:].sum() == 0


def test_a_fork_may_replace_a_shard_whose_chunks_are_partly_fill(repo: Any) -> None:
    """Fill-value chunks of an aligned write are erased, not written: still a whole shard."""
    session = repo.writable_session("main")
    array_in(session)[:32, :32] = 5
    session.commit("fives")
    session = repo.writable_session("main")
    fork = session.fork()
    block = np.zeros((32, 32), dtype="i4")
    block[:8, :8] = 6
    array_in(fork)[:32, :32] = block
    array_in(fork)[32:, 32:] = 0  # erase a whole shard that holds nothing
    session.merge(fork)
    session.commit("mostly fill")
    got = read_main(repo)
    assert (got[:32, :32] == block).all()


def test_a_fork_refuses_a_shrink_that_splits_shards_and_keeps_nothing_of_it(repo: Any) -> None:
    session = repo.writable_session("main")
    array_in(session)[:] = values()
    session.commit("all")
    fork = repo.writable_session("main").fork()
    with pytest.raises(PartialShardWriteError, match="of array 'a'"):
        array_in(fork).resize((40, 40))  # drops chunks of shards it keeps in part
    assert not fork.has_uncommitted_changes
    assert array_in(fork).shape == SHAPE


# -- crashes -----------------------------------------------------------------------------


def doomed_writer(spec: dict[str, str], commit: bool, ready: Any) -> None:
    """Write everything, commit or not, say so, then wait to be killed."""
    repo = icechunk.Repository.open(storage_of(spec))
    session = repo.writable_session("main")
    array_in(session)[:] = values()
    if commit:
        session.commit("all")
    ready.set()
    threading.Event().wait()  # killed here, by PID


@pytest.mark.parametrize("commit", [False, True], ids=["before-commit", "after-commit"])
def test_a_killed_writer_leaves_the_branch_whole(repo: Any, spec: dict[str, str], commit: bool) -> None:
    before = repo.lookup_branch("main")
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    process = ctx.Process(target=doomed_writer, args=(spec, commit, ready))
    process.start()
    try:
        assert ready.wait(120), "the writer never got as far as its kill point"
    finally:
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        process.join()
    got = read_main(repo)
    if commit:
        assert repo.lookup_branch("main") != before and lost_chunks(got, values()) == 0
    else:
        assert repo.lookup_branch("main") == before and got.sum() == 0


# -- dask ----------------------------------------------------------------------------------


@pytest.fixture
def local_repo(tmp_path: Path) -> Any:
    """The repository on local storage only (the cluster's tests need no second run on S3)."""
    return new_repo({"kind": "local", "path": str(tmp_path / "repo")})


def test_dask_on_a_cluster_through_a_session_fails_before_the_commit(local_repo: Any, client: Any) -> None:
    """A writable session cannot be sent to workers (Icechunk refuses to pickle it)."""
    da = pytest.importorskip("dask.array")
    before = local_repo.lookup_branch("main")
    session = local_repo.writable_session("main")
    with pytest.raises(Exception) as refused:
        da.from_array(values(), chunks=(24, 24)).store(array_in(session), lock=False)
    causes: list[BaseException] = [refused.value]
    while (cause := causes[-1].__cause__ or causes[-1].__context__) is not None:
        causes.append(cause)
    assert any("Session.fork()" in str(c) for c in causes), causes
    assert local_repo.lookup_branch("main") == before


@pytest.mark.parametrize("blocks", [(24, 24), (32, 32)], ids=["unaligned", "shard-aligned"])
def test_icechunk_store_dask_through_forks_loses_nothing_or_fails_before_the_commit(
    local_repo: Any, client: Any, blocks: tuple[int, int]
) -> None:
    da = pytest.importorskip("dask.array")
    store_dask = pytest.importorskip("icechunk.dask").store_dask
    before = local_repo.lookup_branch("main")
    session = local_repo.writable_session("main")
    target = array_in(session.fork())
    source = da.from_array(values(), chunks=blocks)
    if blocks == (24, 24):
        with pytest.raises(PartialShardWriteError, match=r"shardstore\.rechunk_to_shards"):
            store_dask(sources=[source], targets=[target])
        assert local_repo.lookup_branch("main") == before
        return
    session.merge(store_dask(sources=[source], targets=[target]))
    session.commit("dask")
    assert lost_chunks(read_main(local_repo), values()) == 0


def test_xarray_and_dask_on_threads_through_one_session_lose_nothing(local_repo: Any) -> None:
    """Threads share the session: blocks that split shards take turns on them."""
    xr = pytest.importorskip("xarray")
    da = pytest.importorskip("dask.array")
    dask = pytest.importorskip("dask")
    session = local_repo.writable_session("main")
    store = ShardingStore(session.store, CPS)
    data = xr.Dataset({"v": (("y", "x"), da.from_array(values(), chunks=(24, 24)))})
    with dask.config.set(scheduler="threads"):  # (the module's cluster is not the default here)
        data.to_zarr(store, group="ds", encoding={"v": {"chunks": CHUNKS}}, zarr_format=3, consolidated=False)
    session.commit("xarray")
    got = xr.open_zarr(
        ShardingStore(local_repo.readonly_session(branch="main").store), group="ds", consolidated=False
    )
    assert lost_chunks(got["v"].values, values()) == 0


# -- the tools ------------------------------------------------------------------------------


def test_info_ls_verify_and_compact_work_on_a_session(repo: Any) -> None:
    from shardstore import compact, info, verify
    from shardstore.maintenance import list_keys

    session = repo.writable_session("main")
    array_in(session)[:32, :] = values()[:32, :]  # two shards of four
    store = ShardingStore(session.store)
    (report,) = info(store)
    assert (report.path, report.sharded, report.chunks, report.shards) == ("a", True, 32, 2)
    keys, damaged = list_keys(store)
    assert damaged == {} and len([k for k in keys if k.startswith("a/c/")]) == 32
    assert verify(store, decode=True) == {}
    compact(store)
    session.commit("half")
    assert verify(ShardingStore(repo.readonly_session(branch="main").store), decode=True) == {}


def test_convert_on_a_cluster_into_a_session_or_fork_is_refused(repo: Any, tmp_path: Path) -> None:
    """Workers would write into copies of the session that never reach its commit."""
    from shardstore.convert import convert

    plain = zarr.storage.LocalStore(tmp_path / "plain")
    zarr.create_array(plain, name="b", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=0)[:] = values()
    session = repo.writable_session("main")
    for target in (session.store, session.fork().store):
        with pytest.raises(ShardStoreError, match=r"Icechunk session.*convert without a client"):
            convert(ShardingStore(plain), ShardingStore(target), client=object())  # type: ignore[arg-type]
    assert not session.has_uncommitted_changes


def test_convert_into_a_session_and_out_of_a_snapshot(spec: dict[str, str], tmp_path: Path) -> None:
    from shardstore.convert import convert

    repo = icechunk.Repository.create(storage_of(spec))  # empty: convert writes into empty stores
    plain = zarr.storage.LocalStore(tmp_path / "plain")
    zarr.create_array(plain, name="b", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=0)[:] = values()
    session = repo.writable_session("main")
    report = convert(ShardingStore(plain), ShardingStore(session.store, (2, 2)), workers=2)
    assert report.chunks == 64
    snapshot = session.commit("converted")
    shards = zarr.core.sync.sync(_keys(repo.readonly_session(branch="main").store))
    assert len([k for k in shards if k.startswith("b/c/")]) == 16, "64 chunks in 16 shards of 2 x 2"

    back = zarr.storage.LocalStore(tmp_path / "back")
    convert(ShardingStore(repo.readonly_session(snapshot_id=snapshot).store), ShardingStore(back, None))
    assert (np.asarray(zarr.open_array(back, path="b")[:]) == values()).all()
