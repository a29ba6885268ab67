"""The experiments page, made from every experiment's ``INFO`` metadata when the site is built
(:func:`censusdp.experiments.registry.readme_table`, the table ``censusdp experiment --list``
prints the same data as): a new experiment is one module with ``INFO`` and ``run(ctx)``, and
it appears here without an edit."""

from __future__ import annotations

INTRO = """\
# Experiments

Each study is `censusdp experiment NAME [--quick] [--all] [--data PATH] [--out DIR] [--seed N]`
and writes `metrics.json`, PNG figures and `report.md` (default `results/NAME/`). Numbers in
reports are computed in the run. `--quick` forms run in about a minute or less; `--all` runs
every unit a study covers instead of its default one (said in the table). Wall times of the
full runs were measured on the 2-core development machine while other jobs were running.

This table is generated when the site is built from each experiment's `INFO` metadata
(`censusdp experiment --list` prints the same). Studies that read a public file (IPUMS NHGIS
county tables, NYC TLC trips; the *data* column names it) take it with `--data PATH`; without
it they stop with one line naming the file and where it comes from. Everything else, the demo
and the test suite run without any data.

"""

OUTRO = """
The real-data study of TopDown-style's county bias and its results are on
[TopDown-style fidelity on real data](topdown-fidelity.md).
"""


def experiments_markdown() -> str:
    """The whole experiments page: the introduction and the table from the metadata."""
    from censusdp.experiments.registry import readme_table

    return INTRO + readme_table() + "\n" + OUTRO
