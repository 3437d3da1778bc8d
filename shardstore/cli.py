"""Command line: ``shardstore`` (also ``python -m shardstore``).

Stores are given as fsspec URLs (``file:///data/x.zarr``, ``s3://bucket/x.zarr``);
``--storage-options`` takes a JSON object for the file system.

``ls``, ``info`` and ``verify`` also read the neuroglancer precomputed sharded
format: a precomputed volume (an ``info`` file listing its scales), a sharded
mesh or skeleton directory (an ``info`` file with a ``sharding``), or a directory
of ``.shard`` files with ``--sharding '<json>'`` (or ``--sharding @file.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from shardstore._version import __version__
from shardstore.errors import InnerStoreError, ShardingConfigError, ShardStoreError
from shardstore.metadata import ROOT_DOCUMENTS, is_metadata_key
from shardstore.tasks import gather

if TYPE_CHECKING:
    from shardstore.maintenance.inspection import Inspection


def _json_object(text: str) -> dict[str, Any]:
    """An argparse type: a bad value is a usage error (exit 2), not a traceback."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return value


def _sharding_json(text: str) -> dict[str, Any]:
    """``--sharding``: a JSON object, or ``@file`` holding one."""
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise argparse.ArgumentTypeError(f"cannot read {text[1:]!r}: {exc}") from None
    return _json_object(text)


def _no_zarr(url: str) -> str:
    return f"no zarr hierarchy at {url!r} (no {', '.join(ROOT_DOCUMENTS)} at its root)"


def _nothing_there(url: str, storage_options: dict[str, Any] | None) -> str | None:
    """Why ``url`` holds no hierarchy where its file system tells cheaply (nothing
    there, or a file), for the error message; None where it does not tell."""
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(url, **(storage_options or {}))
        if fs.isfile(path):
            return f"no zarr hierarchy at {url!r}: it is a file, not a directory"
        if not fs.exists(path):
            return f"no zarr hierarchy at {url!r}: no such file or directory"
    except Exception:  # only a hint: the plain message stands
        return None
    return None


def _opened(what: Callable[[], Any], url: str) -> Any:
    """``what()``, an fsspec file system failing to open ``url`` (unknown protocol,
    missing driver, bad storage options) an error naming it, never a traceback."""
    try:
        return what()
    except ShardStoreError:
        raise
    except (ValueError, TypeError, ImportError, OSError) as exc:
        raise ShardStoreError(f"cannot open {url!r}: {type(exc).__name__}: {exc}") from None


def _zarr_store(args: argparse.Namespace, **kwargs: Any) -> Any:
    """The store at ``args.url`` if it holds a zarr hierarchy (a root node, as
    ``zarr.open`` needs), else None."""
    import shardstore.sync_bridge as sync_bridge
    from shardstore.store import ShardingStore

    store = _opened(lambda: ShardingStore(args.url, storage_options=args.storage_options, **kwargs), args.url)

    async def root_found() -> bool:
        return any(await gather(*(store.exists(name) for name in ROOT_DOCUMENTS)))

    try:
        found = sync_bridge.run(root_found())
    except InnerStoreError as exc:  # unreachable, no permission, no credentials
        raise ShardStoreError(f"cannot read {args.url!r}: {exc}") from None
    return store if found else None


def _store(args: argparse.Namespace, **kwargs: Any) -> Any:
    """The store at ``args.url``, which must hold a zarr hierarchy: a wrong path is an
    error, never an empty report."""
    store = _zarr_store(args, **kwargs)
    if store is None:
        raise ShardStoreError(_nothing_there(args.url, args.storage_options) or _no_zarr(args.url))
    return store


def _inspection(args: argparse.Namespace) -> Inspection:
    """What ``ls``, ``info`` and ``verify`` look at: with ``--sharding``, the directory of
    neuroglancer precomputed shard files at ``args.url``; else the zarr hierarchy there
    (opened read-only), or failing that the neuroglancer precomputed data its ``info``
    file describes."""
    from shardstore.maintenance.inspection import ZarrInspection
    from shardstore.neuroglancer.tools import find_precomputed

    if args.sharding is not None:
        given: Inspection = _opened(
            lambda: find_precomputed(args.url, args.storage_options, args.sharding), args.url
        )
        return given
    store = _zarr_store(args, read_only=True)
    if store is not None:
        return ZarrInspection(store)
    found = find_precomputed(args.url, args.storage_options)
    if found is None:
        nothing = _nothing_there(args.url, args.storage_options)
        if nothing is not None:
            raise ShardStoreError(nothing)
        raise ShardStoreError(
            f"{_no_zarr(args.url)}, nor neuroglancer precomputed data (no 'info' file listing scales or "
            "giving a sharding; for a directory of .shard files pass --sharding)"
        )
    return found


def _warn_damaged(
    damaged: dict[str, str], consequence: str, quiet: bool = False, *, below: str = "nothing below it is read"
) -> int:
    """Name each damaged shard on stderr, with ``consequence`` (a metadata document that
    cannot be read: with ``below``); ``quiet``: only count them. The exit status: 1 if any."""
    for key in sorted(damaged) if not quiet else ():  # each problem names its object
        print(f"warning: {damaged[key]}; {below if is_metadata_key(key) else consequence}", file=sys.stderr)
    if damaged:
        shards = sum(not is_metadata_key(k) for k in damaged)
        counted = [
            f"{n} {what}"
            for n, what in (
                (shards, "damaged shard(s)"),
                (len(damaged) - shards, "unreadable metadata document(s)"),
            )
            if n
        ]
        print(f"{', '.join(counted)}; `shardstore verify` lists every problem", file=sys.stderr)
    return 1 if damaged else 0


def _ls(args: argparse.Namespace) -> int:
    keys, damaged = _inspection(args).keys(args.prefix)
    for key in keys:
        print(key)
    return _warn_damaged(
        damaged, "its chunks are not listed", args.quiet, below="the keys below it are listed as stored"
    )


def _info(args: argparse.Namespace) -> int:
    inspection = _inspection(args)
    text, damaged = inspection.info(args.prefix, as_json=args.json, write_strategy=args.write_strategy)
    print(text)
    return _warn_damaged(damaged, inspection.not_counted, args.quiet, below="nothing below it is counted")


def _progress(args: argparse.Namespace, **stages: str) -> Any:
    """Progress bars of the stages named (stage -> description) on stderr: only on a
    terminal, never with ``--quiet``."""
    from shardstore.progress import StageProgress

    return StageProgress(False if args.quiet else None, stages)


def _verify(args: argparse.Namespace) -> int:
    inspection = _inspection(args)
    with _progress(args, shards="checking shards", chunks="decoding chunks") as progress:
        damaged, found = inspection.check(args.prefix, decode=args.decode, progress=progress)
    for key, problem in sorted(damaged.items()):
        print(f"DAMAGED {key}: {problem}")
    for key, what in sorted(found.items()):
        print(f"LEFTOVER {key}: {what}")
    if damaged:
        print(f"{len(damaged)} damaged object(s)", file=sys.stderr)
    elif not args.quiet:
        print("all shards intact", file=sys.stderr)
    return 1 if damaged else 0


def _compact(args: argparse.Namespace) -> int:
    from shardstore.maintenance import compact

    store = _store(args)
    with _progress(args, shards="compacting shards") as progress:
        reports = compact(store, args.prefix, progress=progress)
    done = [r for r in reports if r.damage is None]
    for report in done if not args.quiet else ():
        print(f"compacted {report.key}: {report.dead_bytes:,} dead bytes removed", file=sys.stderr)
    print(f"{len(done)} shard(s) compacted, {sum(r.dead_bytes for r in done):,} bytes freed")
    damaged = {r.key: r.damage for r in reports if r.damage is not None}
    return _warn_damaged(damaged, "left as it is", args.quiet)


def _convert(args: argparse.Namespace) -> int:
    from shardstore.convert import convert, terminal_progress
    from shardstore.store import ShardingStore

    if args.unshard == bool(args.chunks_per_shard):
        raise ShardingConfigError("convert needs exactly one of --chunks-per-shard N,N,... and --unshard")
    try:
        cps = None if args.unshard else [int(n) for n in args.chunks_per_shard.split(",")]
    except ValueError:
        raise ShardingConfigError(
            f"--chunks-per-shard {args.chunks_per_shard!r} is not a comma-separated list of integers"
        ) from None
    if args.workers is not None and args.workers < 1:
        raise ShardStoreError(f"--workers {args.workers}: at least 1")
    src_url, dst_url = args.src, args.dst
    client: Any = None
    if args.scheduler is not None:
        try:
            import distributed
        except ImportError:
            raise ShardStoreError(
                "--scheduler needs dask.distributed, which is not installed: pip install 'shardstore[dask]'"
            ) from None
        # the workers resolve local paths: make them absolute (and shared by the cluster)
        src_url, dst_url = (u if "://" in u or "::" in u else os.path.abspath(u) for u in (src_url, dst_url))
        try:
            client = distributed.Client(args.scheduler)  # type: ignore[no-untyped-call]
        except (OSError, ValueError, TypeError) as exc:
            raise ShardStoreError(f"cannot reach the dask scheduler at {args.scheduler!r}: {exc}") from None
    src = ShardingStore(src_url, storage_options=args.storage_options, read_only=True)
    dst = ShardingStore(
        dst_url,
        cps,
        storage_options=args.dst_storage_options,
        layout=args.layout,
        index_location=args.index_location,
        index_checksum=args.index_checksum,
    )
    try:
        with terminal_progress(False if args.quiet else None) as bar:
            report = convert(src, dst, progress=bar, workers=args.workers, client=client, resume=args.resume)
    except KeyboardInterrupt:
        print(
            "shardstore convert: the shards written so far are kept; run the same command again to resume",
            file=sys.stderr,
        )
        raise
    finally:
        if client is not None:
            client.close()
    for line in report.summary():
        print(line)
    return 0


def _layout(args: argparse.Namespace) -> int:
    import shardstore.sync_bridge as sync_bridge
    from shardstore.layouts import switch_layout

    store = _store(args)
    path = args.array.strip("/")
    if sync_bridge.run(store.internals.array_at(path)) is None:
        raise ShardStoreError(
            f"argument ARRAY: no zarr v3 array at {path or '/'!r} in {args.url!r} "
            f"(the path of an array in the hierarchy, e.g. 'group/array'; `shardstore info {args.url}` "
            "lists them)"
        )
    changed = switch_layout(store, path, args.to)
    print(f"{path or '/'}: layout {args.to}" + ("" if changed else " already; nothing written"))
    return 0


EXIT_STATUS = """\
exit status:
  0    success
  1    damage found: verify found a damaged shard, or ls, info or compact skipped one
  2    usage error (a missing or bad argument or option, --storage-options that is
       not a JSON object) or a store that cannot be read (nothing at the URL, a file,
       no zarr hierarchy there, an unknown protocol, an I/O error)
  130  interrupted (Ctrl-C)

A closed output pipe (`shardstore ls URL | head`) is not an error: the exit status is
that of what the command found (verify: 1 on damage). convert, verify and
compact draw progress bars on stderr when it is a terminal and tqdm is installed
(pip install 'shardstore[progress]'); --quiet turns them off.
"""


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (with where to look), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


_QUIET = {
    "ls": "no per-shard warnings on stderr: damaged shards are only counted",
    "info": "no per-shard warnings on stderr: damaged shards are only counted",
    "verify": "no progress bar and no 'all shards intact' note on stderr (DAMAGED and LEFTOVER lines, "
    "the count of damaged objects and the exit status stay)",
    "compact": "no progress bar and no per-shard lines on stderr (the summary and the exit status stay)",
}


def _parser() -> argparse.ArgumentParser:
    """The command line (``shardstore --help``; each command's ``--help``)."""
    parser = _Parser(
        prog="shardstore",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")
    demo = sub.add_parser(
        "demo",
        help="write a sample array sharded and unsharded, compare",
        description="Write a sample array sharded and unsharded, read both back and compare.",
    )
    demo.add_argument("--dir", help="where to write (default: a temporary directory)")
    for name, helptext in (
        ("ls", "logical keys, as zarr sees them"),
        ("info", "arrays, shards, chunks present, fill ratio, dead bytes, layout, write strategy"),
        ("verify", "check every shard index and chunk range; exit 1 naming damaged keys"),
        ("compact", "rewrite shards that carry dead bytes"),
        ("layout", "switch a v3 array between layouts 'transformer' and 'codec' (metadata only)"),
    ):
        cmd = sub.add_parser(
            name,
            help=helptext,
            description=f"{helptext[0].upper()}{helptext[1:]}.",
            epilog=EXIT_STATUS,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        cmd.add_argument(
            "url",
            metavar="URL",
            help="the store: an fsspec URL (file:///data/x.zarr, s3://bucket/x.zarr) or a local path",
        )
        if name == "layout":
            cmd.add_argument(
                "array",
                metavar="ARRAY",
                help="path of the zarr v3 array to switch within the hierarchy, e.g. 'group/array' "
                "('/' for an array at the root)",
            )
        else:
            cmd.add_argument(
                "prefix",
                metavar="PREFIX",
                nargs="?",
                default="",
                help="only keys under this prefix, e.g. 'group/array' (default: the whole hierarchy)",
            )
        cmd.add_argument(
            "--storage-options",
            type=_json_object,
            metavar="JSON",
            help="file-system options for fsspec, a JSON object, e.g. '{\"anon\": true}'",
        )
        if name in _QUIET:
            cmd.add_argument("-q", "--quiet", action="store_true", help=_QUIET[name])
        if name == "info":
            cmd.add_argument("--json", action="store_true", help="machine-readable output: a JSON list")
            cmd.add_argument(
                "--write-strategy",
                choices=["rewrite", "append"],
                default="rewrite",
                help="report, per array, the write strategy a store opened with this "
                "write_strategy would use: 'append' only where the storage can append in place "
                "(local files) and the shards keep their index at the end (default: %(default)s)",
            )
        if name == "verify":
            cmd.add_argument(
                "--decode",
                action="store_true",
                help="also decode every chunk through zarr (neuroglancer precomputed shards: "
                "gzip chunk data is always decoded)",
            )
        if name in ("ls", "info", "verify"):
            cmd.add_argument(
                "--sharding",
                type=_sharding_json,
                help="URL is a directory of neuroglancer precomputed .shard files with this "
                "neuroglancer_uint64_sharded_v1 sharding: a JSON object, or @FILE holding one "
                "(a precomputed volume is recognised by its 'info' file without it)",
            )
        if name == "layout":
            cmd.add_argument(
                "--to",
                required=True,
                choices=["transformer", "codec"],
                help="the layout to switch to: 'transformer' (shardstore's storage-transformer entry) "
                "or 'codec' (standard sharding_indexed metadata that zarr, tensorstore and zarrs "
                "read without shardstore)",
            )
    conv = sub.add_parser(
        "convert",
        help="copy a hierarchy, re-sharded or un-sharded, chunk bytes unchanged",
        description="Copy a whole hierarchy into another store, re-sharded, un-sharded or re-laid;\n"
        "chunk bytes are copied as they are. One writer per destination shard, on threads\n"
        "or on a dask cluster (--scheduler). Resumable: run the same command again after an\n"
        "interruption and the shards already complete (checked by their index) are skipped.\n"
        "Prints arrays, chunks, shards written and skipped, objects and bytes before and\n"
        "after, time and throughput.",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    conv.add_argument("src", metavar="SRC", help="source store: an fsspec URL or a local path")
    conv.add_argument(
        "dst",
        metavar="DST",
        help="destination store: an fsspec URL or a local path; empty, or holding an interrupted "
        "conversion of SRC with the same options (resumed)",
    )
    conv.add_argument(
        "--chunks-per-shard", metavar="N,N,...", help="e.g. 8,8: shard every array of that rank"
    )
    conv.add_argument("--unshard", action="store_true", help="write plain chunks")
    conv.add_argument(
        "--layout",
        choices=["transformer", "codec"],
        default="transformer",
        help="how sharded v3 arrays record their sharding: shardstore's storage-transformer entry, "
        "or standard sharding_indexed metadata that zarr, tensorstore and zarrs read without "
        "shardstore (default: %(default)s)",
    )
    conv.add_argument(
        "--index-location",
        choices=["end", "start"],
        default="end",
        help="where each shard keeps its index (default: %(default)s)",
    )
    conv.add_argument("--index-checksum", action="store_true", help="crc32c over each shard index")
    conv.add_argument(
        "--storage-options",
        type=_json_object,
        metavar="JSON",
        help="JSON object of the source's file-system options",
    )
    conv.add_argument(
        "--dst-storage-options",
        type=_json_object,
        metavar="JSON",
        help="JSON object of the destination's file-system options",
    )
    conv.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="threads copying shards at once (default: one per CPU, at most 8); ignored with --scheduler",
    )
    conv.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="copy on the dask.distributed cluster of this scheduler (e.g. tcp://10.0.0.5:8786), one "
        "task per destination shard; its workers must reach SRC and DST (local paths: a shared file "
        "system). Needs pip install 'shardstore[dask]'",
    )
    conv.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        help="refuse a non-empty DST instead of resuming the interrupted conversion it holds",
    )
    conv.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar on stderr (the summary and the exit status stay)",
    )
    return parser


@contextlib.contextmanager
def _warnings_as_lines(command: str) -> Iterator[None]:
    """Warnings the store gives (a fallback, an array left unsharded) as one line
    each on stderr, like the command's other messages: no source lines."""

    def show(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
        print(f"shardstore {command}: {category.__name__}: {message}", file=sys.stderr)

    shown, warnings.showwarning = warnings.showwarning, show
    try:
        yield
    finally:
        warnings.showwarning = shown


def _rectilinear_grids_readable() -> contextlib.AbstractContextManager[object]:
    """The tools read whatever arrays they are pointed at: zarr 3.2+ reads rectilinear
    chunk grids only with its experimental flag set."""
    import zarr

    if zarr.config.get("array.rectilinear_chunks", None) is None:
        return contextlib.nullcontext()  # a zarr without rectilinear grids
    readable: contextlib.AbstractContextManager[object] = zarr.config.set({"array.rectilinear_chunks": True})
    return readable


class _Dropping:
    """``sys.stdout`` whose reader may go away (``| head``): what is written after is
    dropped, and the command runs on to its end, its exit status that of the work
    (``verify | head -1`` on a damaged store: 1), not of the pipe."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            _output_dropped()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _output_dropped()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _output_dropped() -> None:
    """Standard output goes nowhere from now on (nothing more to fail at exit either)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@contextlib.contextmanager
def _reader_may_leave() -> Iterator[None]:
    stdout = sys.stdout
    sys.stdout = _Dropping(stdout)
    try:
        yield
    finally:
        sys.stdout = stdout


def main(argv: list[str] | None = None) -> int:
    """Run the command line; the exit status (see :data:`EXIT_STATUS`)."""
    args = _parser().parse_args(argv)
    _quiet_libraries()
    if args.command == "demo":
        from shardstore.demo import run_demo

        return run_demo(args.dir)
    handlers = {
        "ls": _ls,
        "info": _info,
        "verify": _verify,
        "compact": _compact,
        "layout": _layout,
        "convert": _convert,
    }
    try:
        with _warnings_as_lines(args.command), _rectilinear_grids_readable(), _reader_may_leave():
            code = handlers[args.command](args)
            sys.stdout.flush()  # a reader gone away shows here, not at exit
        return code
    except ShardStoreError as exc:
        return _failed(args.command, str(exc))
    except BrokenPipeError:  # the reader went away (``| head``) outside sys.stdout: not an error
        _output_dropped()
        return 0
    except OSError as exc:  # the storage failing outside shardstore's own wrapping
        return _failed(args.command, f"I/O error: {type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        # zarr's event loop still holds the work cut short: no "Task was destroyed" or "never
        # awaited" noise as it is collected at exit
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        warnings.simplefilter("ignore")
        return _failed(args.command, "interrupted", 130)


def _quiet_libraries() -> None:
    """Client libraries log their retries and give-ups (gcsfs: "_request out of retries",
    with a traceback); unless the program set up logging, Python prints those on
    stderr, around the one line that says what failed. A handler that drops them
    keeps stderr to that line; configured logging (``logging.basicConfig``) sees all."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())


def _failed(command: str, message: str, code: int = 2) -> int:
    """One line on stderr naming the command; the exit status."""
    print(f"shardstore {command}: {' '.join(message.splitlines())}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
