"""``censusdp spec list`` and ``censusdp spec show NAME [--out FILE]``: the TOML files shipped
in the package (:mod:`censusdp.app.specs`)."""

from __future__ import annotations

import argparse

from censusdp.app.commands.common import add_overwrite
from censusdp.app.specs import find_shipped, shipped_files

__all__ = ["register"]


def _cmd_list(args: argparse.Namespace) -> int:
    files = shipped_files()
    width = max(len(f.qualified) for f in files)
    for f in files:
        summary = f.summary if len(f.summary) <= 90 else f.summary[:87] + "..."
        print(f"{f.qualified:<{width}}  {summary}".rstrip())
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    shipped = find_shipped(args.name)
    text = shipped.text()
    if args.out is None:
        print(text, end="")
        return 0
    from censusdp.atomic import output_file

    with output_file(
        args.out,
        overwrite=args.overwrite,
        formats=(".toml",),
        command=f"spec show {shipped.qualified}",
        option="--out",
    ) as tmp:
        tmp.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} (a copy of the shipped {shipped.qualified}.toml)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``censusdp spec list`` and ``censusdp spec show NAME [--out FILE]``."""
    spec = sub.add_parser(
        "spec", help="list or print the specs, schemas and codebooks shipped in the package"
    )
    ssub = spec.add_subparsers(dest="spec_command", metavar="SUBCOMMAND", required=True)
    ls = ssub.add_parser("list", help="the shipped files, KIND/NAME and their first line")
    ls.set_defaults(func=_cmd_list)
    show = ssub.add_parser(
        "show",
        help="print a shipped file (TOML) to stdout, or copy it with --out",
        description="Print a shipped spec, schema or codebook as shipped; --out FILE copies "
        "it to a new .toml file (an earlier copy only with --overwrite).",
    )
    show.add_argument("name", help="KIND/NAME or NAME, as censusdp spec list prints them")
    show.add_argument("--out", help="write the file here (.toml) instead of printing it")
    add_overwrite(show)
    show.set_defaults(func=_cmd_show)
