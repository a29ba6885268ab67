"""Pages the site's build generates (the gen-files plugin runs this): the spec reference from
the spec parsers and the experiments table from the experiments' metadata."""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiments_page import experiments_markdown  # noqa: E402
from specref import spec_reference_markdown  # noqa: E402

with mkdocs_gen_files.open("reference/spec.md", "w") as f:
    f.write(spec_reference_markdown())
with mkdocs_gen_files.open("experiments.md", "w") as f:
    f.write(experiments_markdown())
