"""Failures end cleanly on every backend: the command line says one line on stderr
and exits 2 (1 for damage), the library raises one ShardStoreError subclass, nothing
is printed at exit, and no secret from ``storage_options`` appears anywhere.

The matrix: an unreachable endpoint, a missing bucket (container), a server that
refuses every request (403, from a proxy in front of the real one), a missing path
and a damaged shard; on local files, S3 (moto), GCS (gcp-storage-emulator) and
Azure (azurite), each started here on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardstore import ShardingStore
from shardstore.errors import ShardFormatError, ShardStoreError
from shardstore.testing.azure import KEY, local_azure
from shardstore.testing.gcs import local_gcs
from shardstore.testing.proxy import Answer, Forward, Traffic, proxied
from shardstore.testing.s3 import local_s3

COMMANDS: dict[str, list[str]] = {
    "info": [],
    "ls": [],
    "verify": [],
    "compact": [],
    "layout": ["a", "--to", "codec"],
    "convert": ["{dst}", "--chunks-per-shard", "2,2"],
}
S3_KEY, S3_SECRET = "AKIASHARDSTORETEST", "s3-secret-8d1f0c2b"


@dataclass
class Case:
    url: str
    options: dict[str, Any]
    secrets: list[str] = field(default_factory=list)


def _refuse(method: str, path: str, headers: dict[str, str], body: bytes | None, forward: Forward) -> Answer:
    xml = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
    return 403, [("Content-Type", "application/xml")], xml


@pytest.fixture(autouse=True)
def _collected() -> Iterator[None]:
    """Collect garbage after each test of this module, while the suite's guard against
    work left behind still listens: an outcome no one retrieved is then reported at the
    test that left it, not at whichever later test the collector happens to run in."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], Case]]:
    """(backend, failure) -> the URL and options that meet it."""
    with ExitStack() as stack:
        s3 = stack.enter_context(local_s3())
        gcs = stack.enter_context(local_gcs())
        azure = stack.enter_context(local_azure())

        def refusing(server: Any) -> str:
            port = urllib.parse.urlsplit(server.endpoint_url).port
            return str(stack.enter_context(proxied(port, Traffic(), _refuse)))

        def s3_options(endpoint: str) -> dict[str, Any]:
            kwargs = {"endpoint_url": endpoint, "region_name": "us-east-1"}
            return {"key": S3_KEY, "secret": S3_SECRET, "client_kwargs": kwargs}

        def azure_options(endpoint: str) -> dict[str, Any]:
            return {"connection_string": azure.connection_string.replace(azure.endpoint_url, endpoint)}

        found: dict[tuple[str, str], Case] = {}
        s3_secrets = [S3_KEY, S3_SECRET]
        found["s3", "unreachable"] = Case(s3.url("x.zarr"), s3_options("http://127.0.0.1:9"), s3_secrets)
        found["s3", "missing-bucket"] = Case(
            "s3://no-such-bucket/x.zarr", s3_options(s3.endpoint_url), s3_secrets
        )
        found["s3", "forbidden"] = Case(s3.url("x.zarr"), s3_options(refusing(s3)), s3_secrets)
        found["s3", "missing-path"] = Case(s3.url("nothing.zarr"), s3_options(s3.endpoint_url), s3_secrets)
        gcs_options = gcs.storage_options
        found["gcs", "unreachable"] = Case(
            gcs.url("x.zarr"), {**gcs_options, "endpoint_url": "http://127.0.0.1:9"}
        )
        found["gcs", "missing-bucket"] = Case("gs://no-such-bucket/x.zarr", gcs_options)
        found["gcs", "forbidden"] = Case(gcs.url("x.zarr"), {**gcs_options, "endpoint_url": refusing(gcs)})
        found["gcs", "missing-path"] = Case(gcs.url("nothing.zarr"), gcs_options)
        found["azure", "unreachable"] = Case(azure.url("x.zarr"), azure_options("http://127.0.0.1:9"), [KEY])
        found["azure", "missing-bucket"] = Case("az://nocontainer/x.zarr", azure.storage_options, [KEY])
        found["azure", "forbidden"] = Case(azure.url("x.zarr"), azure_options(refusing(azure)), [KEY])
        found["azure", "missing-path"] = Case(azure.url("nothing.zarr"), azure.storage_options, [KEY])
        # every request answered after 0.3 s: the writes zarr abandons are still under way
        # when the call that started them fails and the program ends
        slow = str(
            stack.enter_context(proxied(urllib.parse.urlsplit(s3.endpoint_url).port, Traffic(latency_s=0.3)))
        )
        found["s3", "slow"] = Case(s3.url("slow.zarr"), s3_options(slow), s3_secrets)
        local = tmp_path_factory.mktemp("local")
        found["local", "missing-path"] = Case(str(local / "nothing.zarr"), {})
        for backend, url, options in (
            ("local", str(local / "damaged.zarr"), {}),
            ("s3", s3.url("damaged.zarr"), s3_options(s3.endpoint_url)),
            ("gcs", gcs.url("damaged.zarr"), gcs_options),
            ("azure", azure.url("damaged.zarr"), azure.storage_options),
        ):
            _damaged(url, options)
            found[backend, "damaged"] = Case(
                url, options, found.get((backend, "missing-path"), Case("", {})).secrets
            )
        yield found


def _damaged(url: str, options: dict[str, Any]) -> None:
    """An array whose shard a/c/0/0 is cut short (its index no longer fits)."""
    store = ShardingStore(url, (2, 2), storage_options=options or None)
    zarr.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="i4")[:] = np.arange(64).reshape(
        8, 8
    )
    raw = store.internals.raw
    blob = asyncio.run(raw.get("a/c/0/0"))
    assert blob is not None
    asyncio.run(raw.set("a/c/0/0", blob[:-7]))


MATRIX = [
    (backend, failure, command)
    for backend in ("local", "s3", "gcs", "azure")
    for failure in ("unreachable", "missing-bucket", "forbidden", "missing-path", "damaged")
    for command in COMMANDS
    if not (backend == "local" and failure in ("unreachable", "missing-bucket", "forbidden"))
    # damage is a report (verify, info, ls, compact); layout and convert do not look at shards
    and not (failure == "damaged" and command in ("layout", "convert"))
    # clients retry a refused connection for up to ~20 s; every command meets it on the same
    # first metadata read, so `info` (in a process of its own, below) stands for them
    and failure != "unreachable"
]


def _arguments(case: Case, failure: str, command: str, tmp_path: Path) -> list[str]:
    extra = [a.format(dst=str(tmp_path / "dst.zarr")) for a in COMMANDS[command]]
    args = [command, case.url, *extra, *(["-q"] if failure == "damaged" else [])]
    return args + (["--storage-options", json.dumps(case.options)] if case.options else [])


def _check(failure: str, command: str, code: int, out: str, err: str, secrets: list[str]) -> None:
    said = err.splitlines()
    if failure == "damaged":  # a report: the other shards are done, exit 1, one line (-q)
        assert code == 1, out + err
        assert len(said) == 1 and "damaged" in said[0], err
    else:
        assert code == 2, out + err
        assert len(said) == 1 and said[0].startswith(f"shardstore {command}: "), err
    for secret in secrets:
        assert secret not in err and secret not in out


@pytest.mark.parametrize(("backend", "failure", "command"), MATRIX)
def test_a_failing_command_says_one_line_and_exits(
    cases: dict[tuple[str, str], Case],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    backend: str,
    failure: str,
    command: str,
) -> None:
    from shardstore.cli import main

    case = cases[backend, failure]
    code = main(_arguments(case, failure, command, tmp_path))
    said = capsys.readouterr()
    _check(failure, command, code, said.out, said.err, case.secrets)


EXITS = [
    (backend, failure)
    for backend in ("local", "s3", "gcs", "azure")
    for failure in ("unreachable", "missing-bucket", "forbidden", "missing-path", "damaged")
    if not (backend == "local" and failure in ("unreachable", "missing-bucket", "forbidden"))
    # gcsfs and the Azure SDK retry a refused connection for 70-80 s before giving up (one
    # line then too, checked by hand): S3's unreachable endpoint stands for them here
    and not (backend in ("gcs", "azure") and failure == "unreachable")
]


@pytest.mark.parametrize(("backend", "failure"), EXITS)
def test_nothing_more_is_printed_when_the_process_ends(
    cases: dict[tuple[str, str], Case], tmp_path: Path, backend: str, failure: str
) -> None:
    """The same in a process of its own: no traceback of a session, task or coroutine
    closed at exit follows the line (resource warnings on, so a leak would say so). The
    S3 unreachable row is the report that opened this matrix: ``info`` on an endpoint
    nothing listens on, with a key and secret, said one line and then 20-40 more."""
    case = cases[backend, failure]
    done = subprocess.run(
        [sys.executable, "-m", "shardstore", *_arguments(case, failure, "info", tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONWARNINGS": "default"},
    )
    _check(failure, "info", done.returncode, done.stdout, done.stderr, case.secrets)


LIBRARY = [(backend, "forbidden") for backend in ("s3", "gcs", "azure")]


@pytest.mark.parametrize(("backend", "failure"), LIBRARY)
def test_the_library_raises_one_store_error_naming_the_key(
    cases: dict[tuple[str, str], Case], backend: str, failure: str
) -> None:
    case = cases[backend, failure]
    store = ShardingStore(case.url, (2, 2), storage_options=case.options)
    with pytest.raises(ShardStoreError, match=r"inner store failed to read '.*'") as opened:
        zarr.open_array(store, path="a")
    with pytest.raises(ShardStoreError, match=r"inner store failed to \w+ '.*'") as written:
        zarr.create_array(store, name="b", shape=(4,), chunks=(2,), dtype="i4")

    async def listed() -> list[str]:
        return [k async for k in store.list_prefix("")]

    with pytest.raises(ShardStoreError, match=r"inner store failed to \w+ '.*'") as listing:
        asyncio.run(listed())
    for error in (opened.value, written.value, listing.value):
        for secret in case.secrets:
            assert secret not in str(error) and secret not in repr(error)


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "azure"])
def test_a_damaged_shard_is_a_format_error_naming_it(
    cases: dict[tuple[str, str], Case], backend: str
) -> None:
    case = cases[backend, "damaged"]
    arr = zarr.open_array(ShardingStore(case.url, storage_options=case.options or None), path="a")
    with pytest.raises(ShardFormatError, match="a/c/0/0"):
        arr[:2, :2]
    np.testing.assert_array_equal(arr[4:, 4:], np.arange(64).reshape(8, 8)[4:, 4:])  # other shards read


# -- the library, in a process of its own -----------------------------------------------------

CALLS = {
    "open_group": "zarr.open_group(store, mode='r')",
    "open_array": "zarr.open_array(store, path='a', mode='r')",
    "create_array": "zarr.create_array(store, name='b', shape=(8, 8), chunks=(2, 2), dtype='i4')",
    "open_zarr": "import xarray; xarray.open_zarr(store)",
}
_SHORT_RETRIES = """
import asyncio, gcsfs.retry, azure.storage.blob._shared.policies_async as azure_retries
async def _soon(*args, **kwargs):
    await asyncio.sleep(0.05)
gcsfs.retry.asyncio = type("asyncio", (), {"sleep": staticmethod(_soon)})
azure_retries.AsyncStorageRetryPolicy.sleep = _soon
"""
"""gcsfs and the Azure SDK wait 1-3 minutes, in all, retrying a refused connection (Azure
Storage waits 15 s, then 18 s, then 24 s): in the child of an unreachable GCS or Azure row
each wait is cut to 50 ms. What is checked is the same: reads that zarr abandons while
others retry end in silence."""
_CHILD = """
import asyncio.base_events, json, sys
_made = asyncio.base_events.BaseEventLoop.__init__
def _lenient(loop, *args, **kwargs):
    _made(loop, *args, **kwargs)
    loop.slow_callback_duration = 60.0
asyncio.base_events.BaseEventLoop.__init__ = _lenient
import zarr
from shardstore import ShardingStore, ShardStoreError
url, options, chunks_per_shard, calls = json.loads(sys.argv[1])
if url.startswith("slow:"):  # a local directory whose writes take 0.3 s each, in a thread
    import asyncio, time
    class Slow(zarr.storage.WrapperStore):
        async def set(self, key, value):
            await asyncio.to_thread(time.sleep, 0.3)
            await super().set(key, value)
    url = Slow(zarr.storage.LocalStore(url.removeprefix("slow:")))
store = ShardingStore(url, chunks_per_shard, storage_options=options or None)
for call in calls:
    try:
        exec(call)
    except Exception as exc:
        kind = "store error" if isinstance(exc, ShardStoreError) else "other"
        kind = "not found" if isinstance(exc, FileNotFoundError) else kind
        print(f"{kind}: {type(exc).__name__}: {' '.join(str(exc).splitlines())}", flush=True)
    else:
        print("no error", flush=True)
"""


def _library_calls(
    case: Case, calls: list[str], chunks_per_shard: Any = (2, 2), *, short_retries: bool = False
) -> list[str]:
    """What a program making ``calls``, one after the other, on a ShardingStore prints
    (stdout and stderr, as lines), warnings and asyncio's debug mode on. Debug mode also
    reports each step of a task that takes over 0.1 s of wall-clock time, which a loaded
    machine (the suite's other processes) makes happen at random: a timing, which tests
    never assert, so the child raises that bound; everything else debug mode reports (a
    task destroyed pending, an exception never retrieved, a coroutine never awaited) is
    still said."""
    program = (_SHORT_RETRIES if short_retries else "") + _CHILD
    done = subprocess.run(
        [sys.executable, "-c", program, json.dumps([case.url, case.options, chunks_per_shard, calls])],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONWARNINGS": "default", "PYTHONASYNCIODEBUG": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said = (done.stdout + done.stderr).splitlines()
    for secret in case.secrets:
        assert secret not in done.stdout + done.stderr
    return said


@pytest.mark.parametrize("call", ["open_group", "create_array"])
def test_a_library_call_on_an_unreachable_s3_endpoint_says_one_line(
    cases: dict[tuple[str, str], Case], call: str
) -> None:
    """zarr reads (or writes) several metadata keys at once, raises the first error and
    abandons the rest, which botocore goes on retrying: what they started is cancelled at
    exit, on its own loop, before that loop is closed. One call, one line, in a process of
    its own."""
    said = _library_calls(cases["s3", "unreachable"], [CALLS[call]])
    assert len(said) == 1 and said[0].startswith("store error: InnerStoreError: "), "\n".join(said)


@pytest.mark.parametrize("backend", ["s3", "gcs", "azure"])
@pytest.mark.parametrize("failure", ["unreachable", "missing-bucket", "forbidden"])
def test_failing_library_calls_say_one_line_each_and_nothing_follows(
    cases: dict[tuple[str, str], Case], backend: str, failure: str
) -> None:
    """Each of zarr's and xarray's ways in (open a group, open an array, create an array,
    xarray's open_zarr) fails with one error, and nothing is printed between the errors or
    after them, to the end of the program (a process for each backend and failure)."""
    case = cases[backend, failure]
    short = failure == "unreachable"
    if short and backend == "s3":  # botocore's own setting (the calls above keep its default)
        case = Case(
            case.url, {**case.options, "config_kwargs": {"retries": {"max_attempts": 2}}}, case.secrets
        )
    said = _library_calls(case, list(CALLS.values()), short_retries=short and backend != "s3")
    # (zarr's own "not found" for a read of a bucket that does not exist, as over any store)
    expected = (
        ("store error: InnerStoreError: ", "not found: ") if failure == "missing-bucket" else "store error: "
    )
    assert len(said) == len(CALLS) and all(line.startswith(expected) for line in said), "\n".join(said)


@pytest.mark.parametrize("backend", ["local", "slow-local", "slow-s3"])
def test_a_refused_create_raises_one_error_and_nothing_follows(
    cases: dict[tuple[str, str], Case], tmp_path: Path, backend: str
) -> None:
    """The array's metadata is refused (a sharding of the wrong rank) while zarr writes its
    parent group's metadata beside it. Slow: every write takes 0.3 s (in a worker thread of
    zarr's, or a request to S3), so that write is still under way when the error is raised
    and the program ends."""
    local = str(tmp_path / "x.zarr")
    case = {
        "local": Case(local, {}),
        "slow-local": Case(f"slow:{local}", {}),
        "slow-s3": cases["s3", "slow"],
    }[backend]
    said = _library_calls(case, [CALLS["create_array"]], {"b": [2, 2, 2]})
    assert len(said) == 1 and said[0].startswith("store error: ShardingConfigError: "), "\n".join(said)
    assert "'b'" in said[0]


@pytest.mark.parametrize("slow", [False, True])
def test_a_refused_rectilinear_codec_create_raises_one_error_and_nothing_follows(
    tmp_path: Path, slow: bool
) -> None:
    """The codec layout refuses chunks of several sizes along a dimension, while zarr writes
    the array's parent group beside it."""
    if zarr.config.get("array.rectilinear_chunks", None) is None:
        pytest.skip(f"zarr {zarr.__version__} has no rectilinear chunk grids (3.2+)")
    call = (
        "with zarr.config.set({'array.rectilinear_chunks': True}):\n"
        "    store = ShardingStore(url, chunks_per_shard, layout='codec')\n"
        "    edges = [[5, 10, 5, 10], [10, 5, 10]]\n"
        "    zarr.create_array(store, name='a', shape=(30, 25), chunks=edges, dtype='i4')"
    )
    said = _library_calls(Case(f"{'slow:' if slow else ''}{tmp_path / 'x.zarr'}", {}), [call])
    assert len(said) == 1 and said[0].startswith("store error: ShardingConfigError: "), "\n".join(said)
