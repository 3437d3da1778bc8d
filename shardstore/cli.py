"""Command line: ``shardstore`` (also ``python -m shardstore``).

Stores are given as fsspec URLs (``file:///data/x.zarr``, ``s3://bucket/x.zarr``);
``--storage-options`` takes a JSON object for the file system.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from importlib.metadata import version
from typing import Any

from shardstore.errors import ShardingConfigError, ShardStoreError


def _json_object(text: str) -> dict[str, Any]:
    """An argparse type: a bad value is a usage error (exit 2), not a traceback."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return value


_ROOT_DOCUMENTS = ("zarr.json", ".zgroup", ".zarray")


def _store(args: argparse.Namespace, **kwargs: Any) -> Any:
    """The store at ``args.url``, which must hold a zarr hierarchy (a root node, as
    ``zarr.open`` needs): a wrong path is an error, never an empty report."""
    from zarr.core.sync import sync

    from shardstore.store import ShardingStore

    store = ShardingStore(args.url, storage_options=args.storage_options, **kwargs)

    async def root_found() -> bool:
        return any(await asyncio.gather(*(store.exists(name) for name in _ROOT_DOCUMENTS)))

    if not sync(root_found()):
        raise ShardStoreError(
            f"no zarr hierarchy at {args.url!r} (no {', '.join(_ROOT_DOCUMENTS)} at its root)"
        )
    return store


def _warn_damaged(damaged: dict[str, str], consequence: str) -> int:
    """Name each damaged shard on stderr; the exit status: 1 if any."""
    for key in sorted(damaged):  # each problem names its shard
        print(f"warning: {damaged[key]}; {consequence}", file=sys.stderr)
    if damaged:
        print(f"{len(damaged)} damaged shard(s); `shardstore verify` lists every problem", file=sys.stderr)
    return 1 if damaged else 0


def _ls(args: argparse.Namespace) -> int:
    from shardstore.maintenance import list_keys

    keys, damaged = list_keys(_store(args, read_only=True), args.prefix)
    for key in keys:
        print(key)
    return _warn_damaged(damaged, "its chunks are not listed")


def _info(args: argparse.Namespace) -> int:
    from shardstore.maintenance import info

    reports = info(_store(args, read_only=True), args.prefix)
    damaged = {key: problem for r in reports for key, problem in r.damaged.items()}
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
        return _warn_damaged(damaged, "its chunks and dead bytes are not counted")
    print(
        f"{'array':<30} {'sharded':>12} {'shards':>7} {'chunks':>13} {'fill':>6} {'bytes':>14} {'dead':>12}"
    )
    for r in reports:
        cps = "x".join(map(str, r.chunks_per_shard)) if r.chunks_per_shard else "no"
        print(
            f"{r.path or '/':<30} {cps:>12} {r.shards:>7} {r.chunks:>6}/{r.grid_chunks:<6} "
            f"{r.fill_ratio:>6.1%} {r.stored_bytes:>14,} {r.dead_bytes:>12,}"
            + (f"  ({len(r.damaged)} damaged, not counted)" if r.damaged else "")
        )
    return _warn_damaged(damaged, "its chunks and dead bytes are not counted")


def _progress(what: str, done: int, total: int) -> None:
    if not sys.stderr.isatty():  # a log wants the outcome, not a counter
        return
    print(
        f"\rchecking {what}: {done:,}/{total:,}",
        end="" if done < total else "\n",
        file=sys.stderr,
        flush=True,
    )


def _verify(args: argparse.Namespace) -> int:
    from shardstore.maintenance import leftovers, verify

    store = _store(args, read_only=True)
    damaged = verify(store, args.prefix, decode=args.decode, progress=_progress)
    for key, problem in sorted(damaged.items()):
        print(f"DAMAGED {key}: {problem}")
    for key, what in sorted(leftovers(store, args.prefix).items()):
        print(f"LEFTOVER {key}: {what}")
    print(f"{len(damaged)} damaged object(s)" if damaged else "all shards intact", file=sys.stderr)
    return 1 if damaged else 0


def _compact(args: argparse.Namespace) -> int:
    from shardstore.maintenance import compact

    reports = compact(_store(args), args.prefix)
    done = [r for r in reports if r.damage is None]
    for report in done:
        print(f"compacted {report.key}: {report.dead_bytes:,} dead bytes removed", file=sys.stderr)
    print(f"{len(done)} shard(s) compacted, {sum(r.dead_bytes for r in done):,} bytes freed")
    return _warn_damaged({r.key: r.damage for r in reports if r.damage is not None}, "left as it is")


def _convert(args: argparse.Namespace) -> int:
    from shardstore.convert import convert
    from shardstore.store import ShardingStore

    if args.unshard == bool(args.chunks_per_shard):
        raise ShardingConfigError("convert needs exactly one of --chunks-per-shard N,N,... and --unshard")
    try:
        cps = None if args.unshard else [int(n) for n in args.chunks_per_shard.split(",")]
    except ValueError:
        raise ShardingConfigError(
            f"--chunks-per-shard {args.chunks_per_shard!r} is not a comma-separated list of integers"
        ) from None
    src = ShardingStore(args.src, storage_options=args.storage_options, read_only=True)
    dst = ShardingStore(
        args.dst,
        cps,
        storage_options=args.dst_storage_options,
        layout=args.layout,
        index_location=args.index_location,
        index_checksum=args.index_checksum,
    )

    def progress(done: int, total: int) -> None:
        print(f"\rcopying chunks: {done:,}/{total:,}", end="", file=sys.stderr, flush=True)

    report = convert(src, dst, progress=progress)
    print(file=sys.stderr)
    print(f"{report.arrays} array(s), {report.chunks:,} chunks, {report.bytes:,} chunk bytes copied")
    return 0


def _layout(args: argparse.Namespace) -> int:
    from shardstore.layouts import switch_layout

    changed = switch_layout(_store(args), args.prefix, args.to)
    print(f"{args.prefix or '/'}: layout {args.to}" + ("" if changed else " already; nothing written"))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shardstore", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('shardstore')}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="write a sample array sharded and unsharded, compare")
    demo.add_argument("--dir", help="where to write (default: a temporary directory)")
    for name, helptext in (
        ("ls", "logical keys, as zarr sees them"),
        ("info", "arrays, shards, chunks present, fill ratio, dead bytes"),
        ("verify", "check every shard index and chunk range; exit 1 naming damaged keys"),
        ("compact", "rewrite shards that carry dead bytes"),
        ("layout", "switch a v3 array between layouts 'transformer' and 'codec' (metadata only)"),
    ):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("url", help="the store, as an fsspec URL")
        cmd.add_argument("prefix", nargs="?", default="", help="only keys under this prefix")
        cmd.add_argument("--storage-options", type=_json_object, help="JSON object of file-system options")
        if name == "info":
            cmd.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "verify":
            cmd.add_argument("--decode", action="store_true", help="also decode every chunk through zarr")
        if name == "layout":
            cmd.add_argument("--to", required=True, choices=["transformer", "codec"])
    conv = sub.add_parser("convert", help="copy a hierarchy, re-sharded or un-sharded, chunk bytes unchanged")
    conv.add_argument("src", help="source store URL")
    conv.add_argument("dst", help="destination store URL (must be empty)")
    conv.add_argument("--chunks-per-shard", help="e.g. 8,8: shard every array of that rank")
    conv.add_argument("--unshard", action="store_true", help="write plain chunks")
    conv.add_argument("--layout", choices=["transformer", "codec"], default="transformer")
    conv.add_argument("--index-location", choices=["end", "start"], default="end")
    conv.add_argument("--index-checksum", action="store_true", help="crc32c over each shard index")
    conv.add_argument(
        "--storage-options", type=_json_object, help="JSON object of the source's file-system options"
    )
    conv.add_argument(
        "--dst-storage-options",
        type=_json_object,
        help="JSON object of the destination's file-system options",
    )
    args = parser.parse_args(argv)
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
        return handlers[args.command](args)
    except ShardStoreError as exc:
        print(f"shardstore {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``| head``): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
