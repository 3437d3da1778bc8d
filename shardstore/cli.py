"""Command line: ``shardstore demo`` (and ``python -m shardstore``)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shardstore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="write a sample array sharded and unsharded, compare")
    demo.add_argument("--dir", help="where to write (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from shardstore.demo import run_demo

        return run_demo(args.dir)
    return 2


if __name__ == "__main__":
    sys.exit(main())
