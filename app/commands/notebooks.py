"""``censusdp notebooks list`` and ``censusdp notebooks copy DIR``: the walkthrough notebooks
shipped in the package (``censusdp.notebooks``, the repository's ``notebooks/`` folder).

A pip user has no clone: ``list`` names the shipped notebooks with their titles, ``copy``
writes them (all, or those named by ``--only``) into a new folder through
:func:`censusdp.atomic.output_dir`, whole or not at all, with its ownership manifest; an
earlier copy is replaced only with ``--overwrite`` and only while none of its notebooks was
edited since (censusdp never writes over a file it cannot prove it wrote). Each notebook is
committed with its outputs and imports only from :mod:`censusdp.prelude`. Reading the list
needs the package's resources and :mod:`json` only (no numpy, no estimation stack).
"""

from __future__ import annotations

import argparse

from censusdp.app.commands.common import add_overwrite
from censusdp.app.commands.spec import ShippedFile, print_listing, shipped_files
from censusdp.errors import SpecError

__all__ = ["PACKAGE", "find_notebooks", "register", "shipped_notebooks"]

#: The package whose data files are the notebooks (mapped to ``notebooks/`` in a clone).
PACKAGE = "censusdp.notebooks"


def _title(text: str) -> str:
    import json

    for cell in json.loads(text).get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else source
        for line in text.splitlines():
            if line.startswith("#"):
                return line.lstrip("#").strip()
    return ""


def shipped_notebooks() -> list[ShippedFile]:
    """Every shipped notebook, by name; its summary is the text of its first Markdown
    heading (empty when it has none)."""
    return shipped_files({"notebook": (PACKAGE, "")}, ".ipynb", _title)


def find_notebooks(names: list[str]) -> list[ShippedFile]:
    """The shipped notebooks called ``names`` (all when empty; ``-`` and ``_`` are the same,
    a trailing ``.ipynb`` is ignored), in the order given.

    Raises
    ------
    SpecError
        For a name that is not shipped, listing the names to use.
    """
    shipped = shipped_notebooks()
    if not names:
        return shipped
    by_name = {nb.name.replace("-", "_"): nb for nb in shipped}
    found = []
    for name in names:
        nb = by_name.get(name.removesuffix(".ipynb").replace("-", "_"))
        if nb is None:
            raise SpecError(
                f"notebooks copy: no shipped notebook {name!r}; the shipped notebooks are "
                f"{', '.join(n.name for n in shipped)} (see censusdp notebooks list)"
            )
        if nb not in found:
            found.append(nb)
    return found


def _cmd_list(args: argparse.Namespace) -> int:
    print_listing([(nb.name, nb.summary) for nb in shipped_notebooks()])
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
