"""The front door: ``censusdp.prelude`` exports what a user needs, the README tour runs from
it in at most three import lines and derives its privacy statement, and no library module
imports the prelude (it sits above every layer)."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest

import censusdp.estimation
import censusdp.prelude as prelude
from censusdp.budget import statement_for
from censusdp.errors import BudgetError
from censusdp.rng import KeyedRNG

ROOT = Path(__file__).resolve().parents[2]


def _tour(block: int = 0) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## A short tour") : text.index("## Layout")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) > block, "the README tour lacks a python block"
    return blocks[block]


def test_the_prelude_exports_every_name_it_lists_and_the_ones_a_user_needs():
    assert len(prelude.__all__) == len(set(prelude.__all__))
    for name in prelude.__all__:
        assert getattr(prelude, name) is not None
    needed = {
        "Table", "Hierarchy", "from_gisjoin", "add_level", "Schema", "ProductQuery", "Query",
        "measure", "invariant", "Laplace", "Gaussian", "DiscreteLaplace", "DiscreteGaussian",
        "KeyedRNG", "tree_gls", "condition", "topdown", "round_release", "derive_statement",
        "PrivacyStatement", "PureDP", "ZCDP", "read_release", "load_spec", "run_spec",
    }  # fmt: skip
    assert needed <= set(prelude.__all__)
    for name in ("condition", "lattice_intervals", "conditioned_mechanism"):
        assert name in censusdp.estimation.__all__
    assert callable(censusdp.estimation.topdown.topdown)


def test_the_readme_tour_is_at_most_three_import_lines_from_the_prelude():
    code = _tour()
    tree = ast.parse(code)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    lines = [ln for ln in code.splitlines() if ln.startswith(("import ", "from "))]
    assert 1 <= len(lines) <= 3 and len(imports) == len(lines)
    assert all(isinstance(n, ast.ImportFrom) and n.module == "censusdp.prelude" for n in imports)
    assert "statement_for" not in code and "PrivacyStatement" not in code


def test_the_readme_tour_runs_and_derives_its_statement(monkeypatch):
    # the tour draws from a secure key; the test makes it reproducible
    monkeypatch.setattr(KeyedRNG, "secure", lambda: KeyedRNG.reproducible(7, warn=False))
    scope: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_tour(), "README.md (tour)", "exec"), scope)
    release, integer = scope["release"], scope["integer"]
    assert release.privacy.rho == 1 / 800 == integer.privacy.rho  # Δ₂²/(2σ²) at σ = 20
    assert release.privacy.invariants == ("state: total",)
    printed = out.getvalue()
    assert "induced subspace differential privacy" in printed and "0.00125" in printed
    state = scope["counts"][1].sum(axis=1)
    assert (integer.totals("state") == state).all()  # invariants exact, as integers
    # the acceptance point: a statement claiming less than the noise spends is refused
    h, cells, meas, inv = scope["h"], scope["cells"], scope["meas"], scope["inv"]
    assert release.privacy.budget == prelude.ZCDP(1 / 800)
    with pytest.raises(BudgetError, match="claims ρ = 1e-09"):
        prelude.tree_gls(h, cells, meas, inv, statement_for(prelude.ZCDP(1e-9)))


def test_the_readme_census_histogram_tour_runs_on_a_schema_and_derives_its_statement(
    monkeypatch,
):
    monkeypatch.setattr(KeyedRNG, "secure", lambda: KeyedRNG.reproducible(7, warn=False))
    code = _tour(1)
    assert len([ln for ln in code.splitlines() if "import" in ln]) <= 3
    scope: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md (census histogram tour)", "exec"), scope)
    release, schema, counts = scope["release"], scope["schema"], scope["counts"]
    # 5 measured levels × 4 product queries, each Δ₂ = 1 at σ = 4: ρ = 20/32, derived
    assert release.privacy.rho == pytest.approx(20 / 32, rel=1e-12)
    assert release.privacy.invariants == ("state: total",)
    total = prelude.ProductQuery.parse(schema, "total")
    got = release.query_estimates("state", total)[:, 0]
    assert np.abs(got - counts[1].reshape(len(got), -1).sum(axis=1)).max() < 1e-6
    assert out.getvalue().splitlines()[0] == "252 1.0"
    se = release.query_standard_errors("tract", scope["race_table"])
    assert np.all(np.isfinite(se)) and np.all(se > 0)


def test_no_library_module_imports_the_prelude():
    users = []
    for pkg in ("censusdp", "hierarchy", "mechanisms", "estimation", "pipelines", "experiments"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name == "prelude.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                mods = (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else []
                )
                if any(m == "censusdp.prelude" for m in mods):
                    users.append(str(path.relative_to(ROOT)))
    assert users == []
