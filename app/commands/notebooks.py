"""``censusdp notebooks list`` and ``censusdp notebooks copy DIR [--only NAME]``: the
walkthrough notebooks shipped in the package (:mod:`censusdp.app.notebooks`)."""

from __future__ import annotations

import argparse

from censusdp.app.commands.common import add_overwrite
from censusdp.app.notebooks import find_notebooks, shipped_notebooks

__all__ = ["register"]


def _cmd_list(args: argparse.Namespace) -> int:
    notebooks = shipped_notebooks()
    width = max(len(nb.name) for nb in notebooks)
    for nb in notebooks:
        print(f"{nb.name:<{width}}  {nb.title}".rstrip())
    return 0


def _cmd_copy(args: argparse.Namespace) -> int:
    notebooks = find_notebooks(args.names)
    from censusdp.atomic import output_dir

    with output_dir(
        args.dir, overwrite=args.overwrite, command="notebooks copy", option="DIR"
    ) as tmp:
        for nb in notebooks:
            (tmp / nb.filename).write_bytes(nb.data())
    n = len(notebooks)
    print(
        f"wrote {args.dir} ({n} notebook{'s' * (n != 1)}: {', '.join(nb.name for nb in notebooks)})"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``censusdp notebooks list`` and ``censusdp notebooks copy DIR [--only NAME]``."""
    parser = sub.add_parser(
        "notebooks", help="list the walkthrough notebooks shipped in the package, or copy them"
    )
    nsub = parser.add_subparsers(dest="notebooks_command", metavar="SUBCOMMAND", required=True)
    ls = nsub.add_parser("list", help="the shipped notebooks, NAME and title")
    ls.set_defaults(func=_cmd_list)
    copy = nsub.add_parser(
        "copy",
        help="copy the shipped notebooks (with their outputs) into a new folder",
        description="Copy the shipped notebooks (all, or those named by --only) into the new folder "
        "DIR, to open in Jupyter; an earlier copy is replaced only with --overwrite and only "
        "while none of its notebooks was edited.",
    )
    copy.add_argument("dir", metavar="DIR", help="the new folder to write")
    copy.add_argument(
        "--only",
        dest="names",
        action="append",
        default=[],
        metavar="NAME",
        help="copy only this notebook (repeat for several; all by default)",
    )
    add_overwrite(copy)
    copy.set_defaults(func=_cmd_copy)
