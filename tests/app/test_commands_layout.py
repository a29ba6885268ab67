"""argparse lives only in :mod:`censusdp.app.commands`: the library holds typed functions.

The check walks the syntax tree of every module of every package folder pyproject.toml maps
(so a new package is covered without editing this test) and collects the modules that
import :mod:`argparse` or name ``Namespace``.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ROOT / "app" / "commands"


def _library_folders() -> list[Path]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return sorted({ROOT / d for d in doc["tool"]["setuptools"]["package-dir"].values()})


def _uses_argparse(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "argparse":
            return True
        if isinstance(node, ast.Name | ast.Attribute) and "Namespace" in (
            getattr(node, "id", None),
            getattr(node, "attr", None),
        ):
            return True
    return False


def _modules(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*.py") if ".venv" not in p.parts]


def test_no_module_outside_app_commands_uses_argparse():
    folders = _library_folders()
    assert ROOT / "app" in folders and ROOT / "pipelines" in folders  # the walk covers them
    found = sorted(
        str(p.relative_to(ROOT))
        for folder in folders
        for p in _modules(folder)
        if COMMANDS not in p.parents and _uses_argparse(p)
    )
    assert found == []


def test_the_walk_sees_argparse_where_it_is():
    """Power: the same walk finds the parsers in app/commands (one module per sub-command)."""
    seen = {p.stem for p in _modules(COMMANDS) if _uses_argparse(p)}
    assert {"run", "privatize", "predict", "allocate", "nmf", "experiment", "common"} <= seen
