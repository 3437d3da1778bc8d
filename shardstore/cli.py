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


def _sharding_json(text: str) -> dict[str, Any]:
    """``--sharding``: a JSON object, or ``@file`` holding one."""
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise argparse.ArgumentTypeError(f"cannot read {text[1:]!r}: {exc}") from None
    return _json_object(text)


_ROOT_DOCUMENTS = ("zarr.json", ".zgroup", ".zarray")


def _no_zarr(url: str) -> str:
    return f"no zarr hierarchy at {url!r} (no {', '.join(_ROOT_DOCUMENTS)} at its root)"


def _zarr_store(args: argparse.Namespace, **kwargs: Any) -> Any:
    """The store at ``args.url`` if it holds a zarr hierarchy (a root node, as
    ``zarr.open`` needs), else None."""
    from zarr.core.sync import sync

    from shardstore.store import ShardingStore

    store = ShardingStore(args.url, storage_options=args.storage_options, **kwargs)

    async def root_found() -> bool:
        return any(await asyncio.gather(*(store.exists(name) for name in _ROOT_DOCUMENTS)))

    return store if sync(root_found()) else None


def _store(args: argparse.Namespace, **kwargs: Any) -> Any:
    """The store at ``args.url``, which must hold a zarr hierarchy: a wrong path is an
    error, never an empty report."""
    store = _zarr_store(args, **kwargs)
    if store is None:
        raise ShardStoreError(_no_zarr(args.url))
    return store


def _location(args: argparse.Namespace) -> Any:
    """What ``ls``, ``info`` and ``verify`` look at: with ``--sharding``, the directory of
    neuroglancer precomputed shard files at ``args.url``; else the zarr hierarchy there
    (opened read-only), or failing that the neuroglancer precomputed data its ``info``
    file describes (a :class:`~shardstore.maintenance.PrecomputedLocation`)."""
    from shardstore.maintenance import find_precomputed

    if args.sharding is not None:
        return find_precomputed(args.url, args.storage_options, args.sharding)
    store = _zarr_store(args, read_only=True)
    if store is not None:
        return store
    found = find_precomputed(args.url, args.storage_options)
    if found is None:
        raise ShardStoreError(
            f"{_no_zarr(args.url)}, nor neuroglancer precomputed data (no 'info' file listing scales or "
            "giving a sharding; for a directory of .shard files pass --sharding)"
        )
    return found


def _precomputed(location: Any) -> bool:
    from shardstore.maintenance import PrecomputedLocation

    return isinstance(location, PrecomputedLocation)


def _warn_damaged(damaged: dict[str, str], consequence: str) -> int:
    """Name each damaged shard on stderr; the exit status: 1 if any."""
    for key in sorted(damaged):  # each problem names its shard
        print(f"warning: {damaged[key]}; {consequence}", file=sys.stderr)
    if damaged:
        print(f"{len(damaged)} damaged shard(s); `shardstore verify` lists every problem", file=sys.stderr)
    return 1 if damaged else 0


def _ls(args: argparse.Namespace) -> int:
    from shardstore.maintenance import list_keys, precomputed_keys

    location = _location(args)
    if _precomputed(location):
        keys, damaged = precomputed_keys(location, args.prefix)
    else:
        keys, damaged = list_keys(location, args.prefix)
    for key in keys:
        print(key)
    return _warn_damaged(damaged, "its chunks are not listed")


def _info(args: argparse.Namespace) -> int:
    from shardstore.maintenance import info

    location = _location(args)
    if _precomputed(location):
        return _precomputed_info(args, location)
    reports = info(location, args.prefix)
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


def _sharding_text(sharding: dict[str, Any]) -> str:
    return ", ".join(f"{name} {value}" if name != "@type" else str(value) for name, value in sharding.items())


def _precomputed_info(args: argparse.Namespace, location: Any) -> int:
    """``info`` of neuroglancer precomputed data: per scale (or the one directory of
    shards) its sharding, shard files, chunk ids present and bytes."""
    from shardstore.maintenance import precomputed_info

    reports = precomputed_info(location, args.prefix)
    damaged = {key: problem for r in reports for key, problem in r.damaged.items()}
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
        return _warn_damaged(damaged, "its chunks are not counted")
    for r in reports:
        what = f"scale {r.path}" if location.volume else f"shards at {location.url}"
        print(f"{what}: {_sharding_text(r.sharding) if r.sharding else 'unsharded'}")
        chunks = f"{r.chunks:,}" + (f"/{r.grid_chunks:,}" if r.grid_chunks else "")
        fill = "" if r.fill_ratio is None else f" ({r.fill_ratio:.1%})"
        files = f"{r.shards:,} shard files, {chunks} chunks" if r.sharded else f"{chunks} chunk files"
        print(
            f"  {files}{fill}, {r.stored_bytes:,} bytes"
            + (f"  ({len(r.damaged)} damaged, not counted)" if r.damaged else "")
        )
    return _warn_damaged(damaged, "its chunks are not counted")


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
    from shardstore.maintenance import leftovers, precomputed_leftovers, verify, verify_precomputed

    location = _location(args)
    if _precomputed(location):  # every shard file read whole: gzip chunk data always decoded
        damaged = verify_precomputed(location, args.prefix, progress=_progress)
        found = precomputed_leftovers(location, args.prefix)
    else:
        damaged = verify(location, args.prefix, decode=args.decode, progress=_progress)
        found = leftovers(location, args.prefix)
    for key, problem in sorted(damaged.items()):
        print(f"DAMAGED {key}: {problem}")
    for key, what in sorted(found.items()):
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
