"""``censusdp hierarchy describe FILE --level NAME=COLUMN[:PREFIXLEN]``: nodes and fan-out per
level (:func:`censusdp.hierarchy.describe.describe_file`)."""

from __future__ import annotations

import argparse
import json

__all__ = ["register"]


def _cmd_describe(args: argparse.Namespace) -> int:
    from censusdp.hierarchy.builders import parse_level_spec
    from censusdp.hierarchy.describe import describe_file, format_description

    specs = [parse_level_spec(s) for s in args.level]
    d = describe_file(args.file, specs, duplicates="first" if args.allow_duplicates else "error")
    print(json.dumps(d, indent=2) if args.json else format_description(d))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``censusdp hierarchy describe FILE --level NAME=COLUMN[:PREFIXLEN] ... [--json]``."""
    hier = sub.add_parser("hierarchy", help="inspect a geographic hierarchy")
    hsub = hier.add_subparsers(dest="hierarchy_command", metavar="SUBCOMMAND", required=True)
    p = hsub.add_parser(
        "describe",
        help="nodes and fan-out per level of the hierarchy defined by code columns",
        description="Build the hierarchy of a CSV or Parquet file (one row per leaf) from "
        "code columns read as strings, and print nodes and fan-out per level. The nation "
        "is an implicit root.",
    )
    p.add_argument("file", help="CSV or Parquet file")
    p.add_argument(
        "--level",
        action="append",
        required=True,
        metavar="NAME=COLUMN[:PREFIXLEN]",
        help="a level, top first; repeat (e.g. --level state=fips:2 --level county=fips)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--allow-duplicates",
        action="store_true",
        help="a leaf code on several rows (long tables) counts once instead of an error",
    )
    p.set_defaults(func=_cmd_describe)
