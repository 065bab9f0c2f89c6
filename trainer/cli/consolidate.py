"""`python -m trainer consolidate <folder> <file>`: a sharded checkpoint folder as one file (strategies/
sharded_consolidate.py does the work). Not a config subcommand: it builds no model and starts no process group."""

from __future__ import annotations

import argparse
import sys

from strategies.exceptions import CheckpointError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainer consolidate",
        description="Turn a sharded (ZeRO-2/3, model_parallel) checkpoint folder into one checkpoint file that loads "
                    "on one device.")
    parser.add_argument("folder", help="a committed sharded checkpoint folder (local path or URL)")
    parser.add_argument("file", help="the checkpoint file to write (local path or URL)")
    return parser


def main(argv: list[str]) -> None:
    """Exit 2 with one line naming the problem (no traceback) when `folder` is not a committed sharded checkpoint."""
    args = _parser().parse_args(argv)
    from strategies.checkpoint_io.sharded.consolidate import consolidate

    try:
        consolidate(args.folder, args.file)
    except CheckpointError as exc:
        print(f"trainer consolidate: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"wrote {args.file}")
