"""MkDocs hook: lay out the import package ``censusdp`` as one tree for the API reference.

The subpackages live in top-level folders (``hierarchy/`` is ``censusdp.hierarchy``, mapped
by ``[tool.setuptools.package-dir]`` in pyproject.toml), a layout that griffe, the reader
behind mkdocstrings, does not follow. Before the build, this hook makes
``build/docs-api/censusdp/`` (a copy of the modules of ``censusdp/`` and one symbolic link
per mapped subpackage), read from pyproject.toml so a new subpackage needs no edit here, and
mkdocstrings reads the source from there (``paths`` in mkdocs.yml). Only those links,
copies and the folders holding them are ever removed, and only under ``build/docs-api``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "docs-api"


def _clear(folder: Path) -> None:
    """Remove the links (never what they point to), the copied modules, then the emptied
    folders."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_symlink() or (path.suffix == ".py" and path.parent == folder / "censusdp"):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def package_tree() -> Path:
    """``build/docs-api`` holding ``censusdp`` as one tree; returns the folder."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mapping = config["tool"]["setuptools"]["package-dir"]
    if TREE.exists():
        _clear(TREE)
    package = TREE / "censusdp"
    package.mkdir(parents=True, exist_ok=True)
    # the package's own modules are copied (griffe resolves a linked __init__.py back to the
    # real folder, which lacks the subpackages); the subpackages are linked
    for entry in (ROOT / mapping["censusdp"]).glob("*.py"):
        (package / entry.name).write_bytes(entry.read_bytes())
    for name, folder in mapping.items():
        parts = name.split(".")
        if len(parts) == 2:  # nested ones (pipelines.codebooks) sit inside their parent
            (package / parts[1]).symlink_to(ROOT / folder)
    return TREE


def on_config(config):  # noqa: ANN001, ANN201 (the MkDocs hook signature)
    package_tree()
    return config


if __name__ == "__main__":
    # `make docs` lays the tree out before MkDocs starts: mkdocstrings drops a `paths` entry
    # that does not exist yet when its configuration is read, before any hook runs
    package_tree()
