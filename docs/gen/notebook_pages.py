"""The notebooks' pages (the gen-files plugin runs this): every ``notebooks/*.ipynb`` of the
repository is put into the site's sources as ``notebooks/NAME.ipynb``, as committed, and the
mkdocs-jupyter plugin renders it with its stored outputs (``execute: false``: a build never
runs a notebook; ``docs/gen/execute_notebooks.py`` refreshes the outputs)."""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

for path in sorted(NOTEBOOKS.glob("*.ipynb")):
    with mkdocs_gen_files.open(f"notebooks/{path.name}", "wb") as f:
        f.write(path.read_bytes())
