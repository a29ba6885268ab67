"""The ``run`` route's statement prices a changed record as the other routes do (issue 33.4).

With invariants, two databases that share them differ at least by changing one record (a
removal and an addition). For counting queries and a law with ρ = Δ₂²/(2σ²), that change
costs 2ρ (:func:`censusdp.pipelines.plan.plan_change_factor`), not the 4ρ of group privacy
that a statement without a derived factor falls back to. These tests run the CLI on a small
state → county file and read what the release says; one builds a plan with a signed query,
where 2ρ does not hold, to show the factor is derived from the matrices and not asserted.
"""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
from run_specs import SMALL_DATA, SMALL_SPEC

from censusdp.app.cli import main
from censusdp.budget import PrivacyStatement
from censusdp.mechanisms.queries import Query
from censusdp.pipelines.plan import build_plan, plan_change_factor

#: zCDP, discrete Gaussian, state totals held invariant, counties measured.
ZSPEC = (
    SMALL_SPEC.replace(
        'accounting = "pure"\nepsilon = 1.0\nlevel_shares = { state = 0.5, county = 0.5 }',
        'accounting = "zcdp"\nrho = 0.5\ndelta = 1e-6\nlevel_shares = { county = 1.0 }',
    )
    .replace('state = ["detailed"]\n', "")
    .replace('"discrete_laplace"', '"discrete_gaussian"')
    .replace("[mechanism]", '[invariants]\nstate = "total"\n[mechanism]')
)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    (ws / "data.csv").write_text(SMALL_DATA)
    (ws / "spec.toml").write_text(ZSPEC)
    cwd = os.getcwd()
    os.chdir(ws)
    try:
        assert main(["run", "spec.toml", "--out", "o", "--seed", "3"]) == 0
    finally:
        os.chdir(cwd)
    return ws / "o" / "release"


def test_the_run_statement_says_2rho_for_a_changed_record(released):
    manifest = json.loads((released / "manifest.json").read_text())
    text = (released / "privacy.md").read_text()
    ((name, doc),) = manifest["privacy"].items()
    st = PrivacyStatement.from_dict(doc)
    assert doc["change_factor"] == 2.0
    assert st.rho == 0.5 and st.change_loss().rho == 1.0
    # the neighbour relation and the change's cost, in the text the release carries
    assert "neighbouring databases differ by adding or removing one record" in doc["text"]
    assert (
        "changing one record (a removal and an addition), which costs at most 2ρ: ρ = 1"
        in (doc["text"])
    )
    assert doc["text"] in text
    # a 4ρ bound (group privacy) must not come back: ρ = 2 would be its figure
    assert "4ρ" not in text and "ρ = 2 (zCDP)" not in text


def test_the_plan_derives_the_factor_from_its_matrices():
    """Counting queries: 2 (the derived bound); a signed query: None, i.e. group privacy (4ρ),
    because a change inside one node reaches ‖Q(e_c − e_c')‖² = 4Δ² (brute force)."""
    cells = ["a", "b", "c"]
    counting = [Query.detailed(cells), Query.total(cells)]
    signed = Query("diff", np.array([[1, -1, 0]]), ("a-b",))
    assert plan_change_factor("discrete_gaussian", counting) == 2.0
    assert plan_change_factor("discrete_gaussian", counting + [signed]) is None
    worst = max(
        float(((signed.matrix[:, i] - signed.matrix[:, j]) ** 2).sum())
        for i, j in itertools.permutations(range(3), 2)
    )
    assert worst == 4 * signed.sensitivity(2) ** 2  # 2Δ² would understate this change

    def plan(queries):
        return build_plan(
            ["nation", "state"],
            {"state": queries},
            {"nation": [Query.total(cells)]},
            {("state", q.name): 0.25 for q in queries},
            accounting="zcdp",
            noise="discrete_gaussian",
        ).privacy

    ok, bad = plan(counting), plan([Query.detailed(cells), signed])
    assert ok.change_loss().rho == 2 * ok.rho and "at most 2ρ" in ok.text()
    assert bad.change_loss().rho == 4 * bad.rho and "at most 4ρ" in bad.text()
