"""The command line as a tool: exit status 0 / 1 / 2 on every path, one-line messages
instead of tracebacks, a closed pipe that is no error, help for every option,
progress bars only where someone watches, and ``info --json``'s layout and write
strategy."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import zarr

import shardstore.progress
from shardstore import ShardingStore
from shardstore.cli import main
from shardstore.formats.indexed import IndexedFormat
from shardstore.progress import StageProgress, progress

COMMANDS = ("ls", "info", "verify", "compact", "layout")
"""The commands that read a store (``convert`` is tested with its own module)."""


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``main(args)`` in process: exit status, stdout, stderr (argparse's exits included)."""
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err


def _subprocess(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardstore", *args], capture_output=True, text=True, timeout=120, **kwargs
    )


def _hierarchy(root: Path, **options: Any) -> str:
    """A sharded array with dead bytes (appended to), an array with its index at the
    start, and an unsharded one; its URL."""
    store = ShardingStore(str(root), chunks_per_shard=(2, 2), write_strategy="append", **options)
    arr = zarr.create_array(store, name="g/a", shape=(8, 8), chunks=(2, 2), dtype="i4", compressors=None)
    arr[:] = np.arange(64).reshape(8, 8)
    arr[0:2, 0:2] = 7  # appended: one shard carries a dead chunk and index
    start = ShardingStore(str(root), chunks_per_shard=(2,), index_location="start")
    zarr.create_array(start, name="start", shape=(4,), chunks=(1,), dtype="u1")[:] = 3
    zarr.create_array(ShardingStore(str(root)), name="plain", shape=(4,), chunks=(4,), dtype="u1")[:] = 1
    return f"file://{root}"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return _hierarchy(tmp_path / "x.zarr")


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# -- exit status 2: nothing to read -------------------------------------------------------


def _args(command: str, where: str) -> list[str]:
    return [command, where, "a", "--to", "codec"] if command == "layout" else [command, where]


@pytest.mark.parametrize("command", COMMANDS)
def test_no_hierarchy_is_exit_2_naming_the_path(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "etc-like"  # a directory of files, none of them zarr's
    other.mkdir()
    (other / "hosts").write_text("127.0.0.1 localhost\n")
    (other / "passwd.d").mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("not a store")
    cases = {
        tmp_path / "missing": "no such file or directory",
        empty: "no zarr.json, .zgroup, .zarray at its root",
        other: "no zarr.json, .zgroup, .zarray at its root",
        a_file: "it is a file, not a directory",
    }
    for where, why in cases.items():
        for spelled in (str(where), f"file://{where}"):
            code, out, err = _run(capsys, *_args(command, spelled))
            line = _one_line(err)
            assert (code, out) == (2, ""), (spelled, err)
            assert line.startswith(f"shardstore {command}: no zarr hierarchy at {spelled!r}")
            assert why in line


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_protocol_is_exit_2(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, *_args(command, "nosuchprotocol://bucket/x.zarr"))
    assert (code, out) == (2, "")
    assert "'nosuchprotocol://bucket/x.zarr'" in _one_line(err) and "Protocol not known" in err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("bad", ["{bad json", "[1, 2]", '"text"'])
def test_bad_storage_options_are_a_one_line_usage_error(
    command: str, bad: str, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, *_args(command, url), "--storage-options", bad)
    line = _one_line(err)
    assert (code, out) == (2, "")
    assert line.startswith(f"shardstore {command}: error: argument --storage-options: not ")
    assert f"`shardstore {command} --help`" in line


def test_usage_errors_are_one_line_exit_2(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for args, expected in (
        ([], "required: COMMAND"),
        (["nosuchcommand"], "invalid choice: 'nosuchcommand'"),
        (["ls"], "required: URL"),
        (["verify", url, "--nosuchoption"], "unrecognized arguments: --nosuchoption"),
        (["info", url, "--write-strategy", "sometimes"], "argument --write-strategy: invalid choice"),
        (["layout", url, "g/a", "--to", "sideways"], "argument --to: invalid choice: 'sideways'"),
        (["layout", url, "g/a"], "required: --to"),
    ):
        code, out, err = _run(capsys, *args)
        assert (code, out) == (2, "") and expected in _one_line(err), (args, err)


def test_layout_names_its_array_argument(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # the array path forgotten: argparse names the missing argument
    code, out, err = _run(capsys, "layout", url, "--to", "codec")
    assert (code, out) == (2, "")
    assert "the following arguments are required: ARRAY" in _one_line(err)
    # the help calls it what it is
    _, usage, _ = _run(capsys, "layout", "--help")
    assert "URL ARRAY" in usage and re.search(r"ARRAY\s+path of the zarr v3 array", usage)
    # a path that is no array (a group, nothing): the argument is named, and why
    for path in ("g", "nothing/here"):
        code, out, err = _run(capsys, "layout", url, path, "--to", "codec")
        line = _one_line(err)
        assert (code, out) == (2, "")
        assert f"argument ARRAY: no zarr v3 array at {path!r}" in line and "shardstore info" in line
    # an unsharded array: refused with the reason
    code, _, err = _run(capsys, "layout", url, "plain", "--to", "codec")
    assert code == 2 and "'plain' cannot switch layout" in _one_line(err)
    # and the real thing, with and without a leading slash
    assert _run(capsys, "layout", url, "g/a", "--to", "codec")[:2] == (0, "g/a: layout codec\n")
    code, out, _ = _run(capsys, "layout", url, "/g/a", "--to", "codec")
    assert (code, out) == (0, "g/a: layout codec already; nothing written\n")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--version")
    assert code == 0 and re.fullmatch(r"shardstore \d+\.\d+\S*\n", out)


# -- exit status 0 and 1 ----------------------------------------------------------------


def test_exit_0_on_intact_data(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["ls", url], ["info", url], ["info", url, "--json"]):
        code, out, err = _run(capsys, *args)
        assert code == 0 and out and err == "", (args, err)
    assert _run(capsys, "verify", url, "--decode") == (0, "", "all shards intact\n")
    assert _run(capsys, "compact", url)[:2] == (0, "1 shard(s) compacted, 80 bytes freed\n")


def test_exit_1_on_damage_from_every_command_that_meets_it(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = tmp_path / "x.zarr" / "g" / "a" / "c" / "1" / "1"
    shard.write_bytes(shard.read_bytes()[:-5])
    for command in ("ls", "info", "verify", "compact"):
        code, out, err = _run(capsys, command, url)
        assert code == 1 and "g/a/c/1/1" in out + err and "Traceback" not in err, (command, err)
    code, out, _ = _run(capsys, "verify", url)
    assert code == 1 and out.startswith("DAMAGED g/a/c/1/1: shard: truncated")


def test_help_documents_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--help")
    assert code == 0
    epilog = out[out.index("exit status:") :]
    for status, meaning in (("0", "success"), ("1", "damage found"), ("2", "usage error")):
        assert re.search(rf"^  {status}\s+{meaning}", epilog, re.MULTILINE), epilog
    assert "cannot be read" in epilog and "closed output pipe" in epilog
    page = (Path(__file__).resolve().parent.parent / "docs" / "guide" / "cli.md").read_text()
    section = " ".join(page[page.index("## Exit status") :].split())
    assert section.startswith("## Exit status 0 success; 1 damage found") and "2 a usage error" in section
    assert "130 interrupted" in section and "closed output pipe" in section


# -- every option has help ------------------------------------------------------------------


def _undocumented(help_text: str) -> list[str]:
    """Entries of an argparse help screen's argument sections given without a help text.

    An entry starts at two spaces' indent; its help follows on the same line after
    two or more spaces, or on the next line, indented deeper."""
    lines = help_text.splitlines()
    missing = []
    in_section = False
    for i, line in enumerate(lines):
        if line.endswith(":") and not line.startswith(" "):
            in_section = line in ("options:", "optional arguments:", "positional arguments:")
            continue
        if not in_section or not re.match(r"  \S", line):
            continue
        entry = line.strip()
        if re.search(r"\S\s{2,}\S", entry):
            continue  # help on the same line
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if not re.match(r"\s{4,}\S", following) or following.strip().startswith("-"):
            missing.append(entry)
    return missing


def _subcommands(capsys: pytest.CaptureFixture[str]) -> list[str]:
    _, out, _ = _run(capsys, "--help")
    return re.findall(r"^    (\w+)\s", out, re.MULTILINE)


def test_the_help_parser_sees_a_missing_help_text() -> None:
    screen = "usage: x\n\noptions:\n  -h, --help  show this\n  --bare\n  --fine FINE\n                 ok\n"
    assert _undocumented(screen) == ["--bare"]


def test_every_option_of_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    commands = _subcommands(capsys)
    assert set(COMMANDS) | {"demo", "convert"} <= set(commands)
    _, top, _ = _run(capsys, "--help")
    assert _undocumented(top) == []
    for command in commands:
        code, screen, _ = _run(capsys, command, "--help")
        assert code == 0 and "options:" in screen
        assert _undocumented(screen) == [], command
    for command, options in {
        "layout": ["--to", "--storage-options"],
        "info": ["--json", "--write-strategy", "--quiet", "--sharding"],
        "verify": ["--decode", "--quiet"],
        "compact": ["--quiet"],
        "ls": ["--quiet", "--sharding"],
    }.items():
        _, screen, _ = _run(capsys, command, "--help")
        for option in options:
            assert option in screen, (command, option)


# -- a closed output pipe ----------------------------------------------------------------------


def _many_keys(root: Path, n: int = 20_000, per_shard: int = 1000) -> str:
    """A 1-d array of ``n`` one-byte chunks; its shards written directly (fast)."""
    store = ShardingStore(str(root), chunks_per_shard=(per_shard,))
    zarr.create_array(store, name="big", shape=(n,), chunks=(1,), dtype="u1", compressors=None)
    fmt = IndexedFormat((per_shard,))
    index = np.stack([np.arange(per_shard), np.ones(per_shard)], axis=1).astype(np.uint64)
    body = bytes(range(256)) * (per_shard // 256 + 1)
    for s in range(n // per_shard):
        (root / "big" / "c").mkdir(parents=True, exist_ok=True)
        (root / "big" / "c" / str(s)).write_bytes(body[:per_shard] + fmt.encode_index(index))
    return f"file://{root}"


def test_a_closed_pipe_ends_ls_quietly(tmp_path: Path) -> None:
    url = _many_keys(tmp_path / "many.zarr")  # ~200 kB of keys: more than a pipe buffers
    with subprocess.Popen(
        [sys.executable, "-m", "shardstore", "ls", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == b"big/c/0\n"  # `| head -1`
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 0
    assert err == b""


def test_a_closed_pipe_through_a_shell(tmp_path: Path) -> None:
    url = _many_keys(tmp_path / "many.zarr")
    shell = f"{sys.executable} -m shardstore ls {url} | head -1; echo status=${{PIPESTATUS[0]}} >&2"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    assert done.stdout == "big/c/0\n"
    assert done.stderr == "status=0\n"


@pytest.mark.parametrize("command", ["verify", "ls"])
def test_a_closed_pipe_keeps_the_status_of_the_damage_found(tmp_path: Path, command: str) -> None:
    """``verify URL | head -1`` on a damaged store exits 1, as without the pipe: the
    reader going away drops the rest of the output, not what the command found."""
    root = tmp_path / "damaged.zarr"
    _many_keys(root, n=10_000, per_shard=2)  # more keys and reports than a pipe buffers
    for shard in (root / "big" / "c").iterdir():
        if int(shard.name) % 5 == 0:
            shard.write_bytes(b"cut")
    with subprocess.Popen(
        [sys.executable, "-m", "shardstore", command, "--quiet", f"file://{root}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        assert proc.wait(timeout=120) == 1, first


# -- progress --------------------------------------------------------------------------------------


class Recorder:
    """Stands in for a tqdm bar: what it was made with and told."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs
        self.total = kwargs["total"]
        self.n = 0
        self.closed = False

    def update(self, n: int) -> None:
        self.n += n

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    """Bars made from now on, as :class:`Recorder` s in place of tqdm's."""
    made: list[Recorder] = []

    def tqdm(**kwargs: Any) -> Recorder:
        made.append(Recorder(kwargs))
        return made[-1]

    monkeypatch.setattr(shardstore.progress, "_tqdm", lambda: tqdm)
    return made


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


_BAR = re.compile(r"\r|\d+(\.\d+)?\s?[kMG]?B/s|%\|")
"""What a progress bar writes: carriage returns, rates, tqdm's bar."""


def test_the_helper_drives_tqdm_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    with progress(3 * 2**20, "checking shards", enabled=True, file=out) as bar:
        bar.update(2**20)
        bar.update(2 * 2**20)
    text = out.getvalue()
    assert "checking shards" in text and "/3.00M" in text and "B/s" in text, text
    # what it asks of tqdm: bytes, scaled, every update passed on, closed at the end
    made = _recording(monkeypatch)
    with progress(1000, "compacting", enabled=True, file=io.StringIO()) as bar:
        bar.update(400)
        bar.update(600)
        bar.set_total(2000)
    (recorded,) = made
    assert recorded.kwargs["unit"] == "B" and recorded.kwargs["unit_scale"] is True
    assert recorded.kwargs["total"] == 1000 and recorded.kwargs["desc"] == "compacting"
    assert recorded.n == 1000 and recorded.total == 2000 and recorded.closed
    monkeypatch.undo()
    # off: asked to be, into something that is no terminal, or without tqdm
    for enabled, stream in ((False, _Terminal()), (None, io.StringIO())):
        with progress(100, "x", enabled, file=stream) as bar:
            bar.update(100)
        assert stream.getvalue() == ""
    monkeypatch.setattr(shardstore.progress, "_tqdm", lambda: None)
    silent = io.StringIO()
    with progress(100, "x", enabled=True, file=silent) as bar:
        bar.update(50)
        bar.set_total(200)
    assert silent.getvalue() == ""


def test_stage_progress_draws_one_bar_per_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    with StageProgress(True, {"shards": "checking shards", "chunks": "decoding chunks"}, file=out) as stages:
        stages("shards", 512, 2048)
        stages("shards", 2048, 2048)
        stages("chunks", 100, 100)
    text = out.getvalue()
    assert "checking shards" in text and "/2.00k" in text and "decoding chunks" in text
    made = _recording(monkeypatch)
    with StageProgress(True, file=io.StringIO()) as stages:
        stages("shards", 512, 2048)
        stages("shards", 4096, 4096)  # grew while read
        stages("chunks", 100, 100)
    assert [(r.kwargs["desc"], r.n, r.total, r.closed) for r in made] == [
        ("shards", 4096, 4096, True),
        ("chunks", 100, 100, True),
    ]
    quiet = io.StringIO()
    with StageProgress(None, file=quiet) as stages:
        stages("shards", 1, 1)
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("command", ["verify", "compact"])
def test_progress_only_on_a_terminal_and_never_with_quiet(
    command: str, url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(shardstore.progress, "DELAY", 0.0)  # draw at once, however short the run
    runs = {}
    for name, stream, extra in (
        ("pipe", io.StringIO(), []),
        ("terminal", _Terminal(), []),
        ("quiet terminal", _Terminal(), ["--quiet"]),
    ):
        if command == "compact":  # something to compact every time
            store = ShardingStore(url, write_strategy="append")
            zarr.open_array(store, path="g/a")[0:2, 0:2] = 9
        monkeypatch.setattr(sys, "stderr", stream)
        code = main([command, url, *extra])
        monkeypatch.undo()
        monkeypatch.setattr(shardstore.progress, "DELAY", 0.0)
        assert code == 0
        runs[name] = stream.getvalue()
    assert not _BAR.search(runs["pipe"]) and not _BAR.search(runs["quiet terminal"])
    assert _BAR.search(runs["terminal"]), runs["terminal"]  # the test would see a bar
    verb = {"verify": "checking shards", "compact": "compacting shards"}[command]
    assert verb in runs["terminal"] and verb not in runs["pipe"] + runs["quiet terminal"]


def test_no_progress_into_a_pipe_from_a_real_process(url: str) -> None:
    done = _subprocess("verify", url, "--decode")
    assert done.returncode == 0 and done.stderr == "all shards intact\n"
    done = _subprocess("compact", url)
    assert done.returncode == 0 and done.stderr.startswith("compacted ") and not _BAR.search(done.stderr)


# -- --quiet -----------------------------------------------------------------------------------


def test_quiet_keeps_results_and_drops_notes(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, "verify", url, "--quiet") == (0, "", "")
    code, out, err = _run(capsys, "compact", url, "-q")
    assert (code, out, err) == (0, "1 shard(s) compacted, 80 bytes freed\n", "")
    shard = tmp_path / "x.zarr" / "g" / "a" / "c" / "0" / "1"
    shard.write_bytes(shard.read_bytes()[:-5])
    for command in ("ls", "info"):
        loud = _run(capsys, command, url)
        quiet = _run(capsys, command, url, "--quiet")
        assert loud[:2] == quiet[:2] and loud[0] == 1
        assert "warning: " in loud[2]
        assert quiet[2] == "1 damaged shard(s); `shardstore verify` lists every problem\n"
    code, out, err = _run(capsys, "verify", url, "-q")
    assert code == 1 and out.startswith("DAMAGED g/a/c/0/1") and err == "1 damaged object(s)\n"


@pytest.mark.parametrize("name", ["zarr.json", ".zarray"])
def test_an_array_whose_metadata_cannot_be_read_is_damage_to_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Its shards would pass for objects of their own (ls listed them as chunk keys,
    verify said all was intact, convert copied them as chunks): each command names
    the document instead, and convert writes nothing."""
    root = tmp_path / "x.zarr"
    store = ShardingStore(str(root), chunks_per_shard=(2, 2))
    group = zarr.open_group(store, mode="w", zarr_format=3 if name == "zarr.json" else 2)
    for array, value in (("a", 1), ("b", 2)):
        group.create_array(array, shape=(8, 8), chunks=(2, 2), dtype="u1")[:] = value
    document = root / "a" / name
    document.write_bytes(document.read_bytes()[:40])  # cut short, as by a crashed copy
    url, key = f"file://{root}", f"a/{name}"
    code, out, err = _run(capsys, "verify", url)
    assert code == 1 and out.startswith(f"DAMAGED {key}: metadata document '{key}' is not a JSON object")
    for command in ("ls", "info"):
        code, out, err = _run(capsys, command, url)
        assert code == 1 and f"warning: metadata document '{key}'" in err, command
    code, out, err = _run(capsys, "info", url, "--json")
    reports = {r["path"]: r for r in json.loads(out)}
    assert list(reports["a"]["damaged"]) == [key] and reports["b"]["chunks"] == 16
    code, _, err = _run(capsys, "convert", url, str(tmp_path / "out.zarr"), "--unshard")
    assert code == 2 and key in _one_line(err)
    assert not (tmp_path / "out.zarr").exists()


# -- info --json: layout and write strategy -----------------------------------------------------------


def _reports(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, Any]]:
    code, out, _ = _run(capsys, "info", *args, "--json")
    assert code == 0
    return {r["path"]: r for r in json.loads(out)}


def test_info_json_reports_layout_and_write_strategy(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    reports = _reports(capsys, url)
    assert {p: (r["layout"], r["write_strategy"]) for p, r in reports.items()} == {
        "g/a": ("transformer", "rewrite"),  # what a store opened with the default would do
        "start": ("transformer", "rewrite"),
        "plain": (None, "rewrite"),  # unsharded: zarr rewrites each chunk object
    }
    appending = _reports(capsys, url, "--write-strategy", "append")
    assert {p: r["write_strategy"] for p, r in appending.items()} == {
        "g/a": "append",  # local files append in place
        "start": "rewrite",  # an index at the start cannot be appended after
        "plain": "rewrite",
    }
    assert _run(capsys, "layout", url, "g/a", "--to", "codec")[0] == 0
    assert _reports(capsys, url, "--write-strategy", "append")["g/a"]["layout"] == "codec"
    assert _reports(capsys, url, "--write-strategy", "append")["g/a"]["write_strategy"] == "append"
    code, table, _ = _run(capsys, "info", url, "--write-strategy", "append")
    assert code == 0 and re.search(r"^g/a .* codec\s+append$", table, re.MULTILINE), table


def test_info_json_write_strategy_where_nothing_appends(capsys: pytest.CaptureFixture[str]) -> None:
    base = "memory://test-cli-info"
    try:
        store = ShardingStore(base, chunks_per_shard=(2,), layout="codec")
        zarr.create_array(store, name="a", shape=(4,), chunks=(1,), dtype="u1")[:] = 1
        (report,) = _reports(capsys, base, "--write-strategy", "append").values()
        assert (report["layout"], report["write_strategy"]) == ("codec", "rewrite")
    finally:
        fsspec.filesystem("memory").rm("/test-cli-info", recursive=True)
