"""Shared fixtures: every kind of inner store the contract names, a local S3 API, writer
processes, a dask cluster, and the guard against asyncio work left behind."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import zarr
from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
from hypothesis import HealthCheck, settings

from shardstore import ShardingStore

from .processes import Writers

# asserts in the shared helper modules explain themselves as a test's do (before they are imported)
pytest.register_assert_rewrite("tests.helpers", "tests.fault_cases")

# gcsfs 2026 asks a bucket's type over gRPC first and waits 60 s a call for the GCS
# emulator, which has none; set before gcsfs is imported, inherited by spawned writers
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

# The suite passes every time: hypothesis draws the same examples on every run (a
# property's failure is a bug found once, not a flake), and no example is timed (a
# loaded machine, two test processes on two cores, stalls any of them). Exploring with
# fresh examples is a run by hand: pytest --hypothesis-profile=explore
settings.register_profile(
    "repeatable", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile(config.getoption("hypothesis_profile", None) or "repeatable")


InnerFactory = Callable[[Path], Any]

INNERS: dict[str, InnerFactory] = {
    "dict": lambda tmp: {},
    "zarr-memory": lambda tmp: zarr.storage.MemoryStore(),
    "zarr-local": lambda tmp: zarr.storage.LocalStore(tmp / "local"),
    # a wrapper hides the LocalStore: served as any zarr store (batched reads raise for
    # a missing key there, where get returns None)
    "zarr-wrapped-local": lambda tmp: zarr.storage.WrapperStore(zarr.storage.LocalStore(tmp / "wrapped")),
    "fsspec-local": lambda tmp: fsspec.get_mapper(f"file://{tmp}/fsmap"),
    "fsspec-memory": lambda tmp: fsspec.get_mapper(f"memory://{tmp.name}"),
    "fsspec-async": lambda tmp: fsspec.FSMap(
        f"async-{tmp.name}", AsyncFileSystemWrapper(fsspec.filesystem("memory"))
    ),
}


@pytest.fixture(params=sorted(INNERS))
def inner(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    made = INNERS[request.param](tmp_path)
    yield made
    if request.param in ("fsspec-memory", "fsspec-async"):
        memory = fsspec.filesystem("memory")
        if memory.exists(made.root):
            memory.rm(made.root, recursive=True)


@pytest.fixture
def make_store(inner: Any) -> Callable[..., ShardingStore]:
    def make(chunks_per_shard: Any = (2, 2), **kwargs: Any) -> ShardingStore:
        return ShardingStore(inner, chunks_per_shard, **kwargs)

    return make


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """A local S3 API (moto_server behind a counting proxy on 127.0.0.1), per test module."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from shardstore.testing.s3 import local_s3

    with local_s3() as server:
        yield server


@pytest.fixture(scope="module")
def dask_threads_per_worker() -> int:
    """Threads in each worker process of ``client``'s cluster; a module may override it."""
    return 1


@pytest.fixture(scope="module")
def client(dask_threads_per_worker: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A dask.distributed client of a LocalCluster of two worker processes, per test
    module; the scheduler's and workers' scratch space in pytest's temporary directory,
    not the system's."""
    distributed = pytest.importorskip("distributed")
    import dask

    with (
        dask.config.set({"temporary-directory": str(tmp_path_factory.mktemp("dask"))}),
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=dask_threads_per_worker, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="session")
def writers() -> Iterator[Writers]:
    """Writer processes for races between processes, kept for the whole session."""
    made = Writers()
    yield made
    made.close()


class _PendingTasks(logging.Handler):
    """Collects asyncio's "Task was destroyed but it is pending!" (and its other
    complaints about work left behind), which asyncio logs rather than raises."""

    WORDS = ("Task was destroyed but it is pending", "was never retrieved", "Task exception was never")

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[str] = []

    LIBRARIES = ("ClientSession.close", "close_service_client", "close_session")
    """Not ours: fsspec file systems' finalizers closing, when garbage-collected, a session
    whose loop (pytest-asyncio's loop of an earlier test) has ended; at the exit of a
    program shardstore closes its own (``inner/sessions.py``)."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if any(word in message for word in self.WORDS) and not any(f in message for f in self.LIBRARIES):
            self.found.append(message.splitlines()[0])


@pytest.fixture(autouse=True)
def _no_task_left_behind() -> Iterator[None]:
    """Every test fails if asyncio reports a task it had to destroy pending, or an
    exception no one retrieved, while it ran: every task shardstore starts ends
    before the call that started it."""
    guard = _PendingTasks()
    logger = logging.getLogger("asyncio")
    logger.addHandler(guard)
    try:
        yield  # (tasks a test drops are destroyed, and reported, as their last reference goes)
    finally:
        logger.removeHandler(guard)
    assert not guard.found, f"asyncio found work left behind: {guard.found}"
