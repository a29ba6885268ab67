"""``censusdp spec list`` and ``censusdp spec show NAME``: the TOML files shipped in the package.

Three kinds are shipped, each in its package folder:

- ``spec``: run and privatize specs (``censusdp/experiments/*.toml``, e.g. ``midwest_demo``,
  the demo's spec);
- ``schema``: attribute schemas (``censusdp/schemas/*.toml``, the names
  :func:`censusdp.schema.available_schemas` lists);
- ``codebook``: NHGIS codebooks (``censusdp/pipelines/codebooks/*.toml``, the names
  :func:`censusdp.pipelines.io.codebook.available_codebooks` lists).

A file is named ``KIND/NAME`` (``schema/ppdd``) or by ``NAME`` alone when only one kind has
it. ``show`` prints the file to stdout as shipped; ``--out FILE`` copies it through
:func:`censusdp.atomic.output_file` instead (a new path, or an earlier censusdp output with
``--overwrite``; never anything else), so a user can start a spec of their own from it. The
listing reads the package's resources only (no numpy, no estimation stack).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable

from censusdp.app.commands.common import add_overwrite
from censusdp.errors import SpecError

__all__ = ["KINDS", "ShippedFile", "find_shipped", "print_listing", "register", "shipped_files"]

#: Kind -> (package, folder inside it; "" for the package's own folder) of the shipped TOML
#: files (by package: in an editable install the subpackages live outside ``censusdp/``).
KINDS: dict[str, tuple[str, str]] = {
    "spec": ("censusdp.experiments", ""),
    "schema": ("censusdp", "schemas"),
    "codebook": ("censusdp.pipelines", "codebooks"),
}


@dataclass(frozen=True)
class ShippedFile:
    """One file shipped in the package (a TOML file, or a notebook of
    :mod:`censusdp.app.commands.notebooks`).

    Attributes
    ----------
    kind : str
        A key of :data:`KINDS` (``notebook`` for the notebooks).
    name : str
        The file's stem (``midwest_demo``).
    summary : str
        Its first comment line, without ``#`` (empty when it starts with none); a
        notebook's title.
    folder : Traversable
        The package folder that holds it.
    suffix : str
        ``.toml`` or ``.ipynb``.
    """

    kind: str
    name: str
    summary: str
    folder: Traversable = field(compare=False, repr=False)
    suffix: str = ".toml"

    @property
    def qualified(self) -> str:
        """``KIND/NAME``, unique among the shipped files."""
        return f"{self.kind}/{self.name}"

    @property
    def filename(self) -> str:
        """``NAME.SUFFIX``."""
        return self.name + self.suffix

    def text(self) -> str:
        """The file's text, as shipped (UTF-8)."""
        return self.folder.joinpath(self.filename).read_text(encoding="utf-8")

    def data(self) -> bytes:
        """The file's bytes, as shipped."""
        return self.folder.joinpath(self.filename).read_bytes()


def _summary(text: str) -> str:
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    return first.lstrip("#").strip() if first.startswith("#") else ""


def shipped_files(
    kinds: Mapping[str, tuple[str, str]] = KINDS,
    suffix: str = ".toml",
    summary: Callable[[str], str] = _summary,
) -> list[ShippedFile]:
    """Every shipped file ending in ``suffix`` in the folders of ``kinds`` (kind -> (package,
    folder), as :data:`KINDS`), by kind then name, with ``summary`` of its text."""
    out = []
    for kind, (package, folder) in kinds.items():
        root = resources.files(package)
        where = root.joinpath(folder) if folder else root
        names = sorted(p.name for p in where.iterdir() if p.name.endswith(suffix))
        for name in names:
            text = where.joinpath(name).read_text(encoding="utf-8")
            out.append(ShippedFile(kind, name.removesuffix(suffix), summary(text), where, suffix))
    return out


def print_listing(rows: list[tuple[str, str]]) -> None:
    """Print ``NAME  SUMMARY`` lines, the names padded to one width."""
    width = max(len(name) for name, _ in rows)
    for name, summary in rows:
        print(f"{name:<{width}}  {summary}".rstrip())


def find_shipped(name: str) -> ShippedFile:
    """The shipped file called ``name`` (``KIND/NAME``, or ``NAME`` when unambiguous;
    ``-`` and ``_`` are the same, and a trailing ``.toml`` is ignored).

    Raises
    ------
    SpecError
        For an unknown or ambiguous name, listing the names to use.
    """
    files = shipped_files()
    wanted = name.removesuffix(".toml").replace("-", "_")
    kind, sep, stem = wanted.rpartition("/")
    found = [f for f in files if f.name.replace("-", "_") == stem and (not sep or f.kind == kind)]
    if len(found) == 1:
        return found[0]
    if found:
        raise SpecError(
            f"spec show: {name!r} is shipped as {len(found)} kinds; name one of "
            f"{', '.join(f.qualified for f in found)}"
        )
    raise SpecError(
        f"spec show: no shipped file {name!r}; the shipped files are "
        f"{', '.join(f.qualified for f in files)} (see censusdp spec list)"
    )


def _cmd_list(args: argparse.Namespace) -> int:
    cut = [(f.qualified, f.summary if len(f.summary) <= 90 else f.summary[:87] + "...")
           for f in shipped_files()]  # fmt: skip
    print_listing(cut)
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
