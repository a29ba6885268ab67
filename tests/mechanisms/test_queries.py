"""Queries: shapes, and the privacy guard against invariants that determine every measured
value (rank test of the invariants at or below each measured level)."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.app.cli import main
from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.estimation.gls.tree import tree_gls
from censusdp.hierarchy import Table
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.queries import (
    Query,
    exact_rank,
    exactly_released,
    guard_exact_release,
    invariant,
    measure,
)
from censusdp.rng import KeyedRNG

CELLS = ("a", "b", "c")
NAMES = ("nation", "state", "county")
DET, TOT = Query.detailed(CELLS), Query.total(CELLS)
PRIVACY = PrivacyStatement("zcdp", rho=1.0, invariants=("county: detailed",))


def test_exactly_released_levels():
    # detailed held at the leaves fixes every level above (summing) and the leaves
    assert exactly_released(NAMES, [(1, DET), (2, DET)], [(2, DET)]) == {
        "state": ("detailed",),
        "county": ("detailed",),
    }
    # state totals held: the county cells stay protected
    assert exactly_released(NAMES, [(2, DET)], [(1, TOT)]) == {}
    # county totals held fix the state totals, not the state cells
    assert exactly_released(NAMES, [(1, TOT), (1, DET)], [(2, TOT)]) == {}
    assert exactly_released(NAMES, [(1, TOT)], [(2, TOT)]) == {"state": ("total",)}
    # an invariant above a level never determines it
    assert exactly_released(NAMES, [(2, TOT)], [(1, DET)]) == {}


def test_guard_refuses_then_says_so_when_acknowledged():
    with pytest.raises(SpecError, match="acknowledge_exact_release") as info:
        guard_exact_release(NAMES, [(1, DET)], [(2, DET)], PRIVACY)
    assert "'state'" in str(info.value) and "county: detailed" in str(info.value)
    ok = guard_exact_release(NAMES, [(1, DET)], [(2, DET)], PRIVACY, acknowledge=True)
    assert "released exactly and carry no privacy protection" in ok.text()
    assert guard_exact_release(NAMES, [(1, DET)], [(2, DET)], ok) is ok  # acknowledged
    # a level that keeps protected values: nothing to refuse or add
    partial = guard_exact_release(NAMES, [(1, TOT), (2, DET)], [(2, TOT)], PRIVACY)
    assert partial is PRIVACY


def test_tree_gls_refuses_a_leaf_table_held_exactly():
    """The probe's case: detailed invariant at the leaves released the table with SE 0."""
    table = Table.from_midwest()
    h, counts = table.hierarchy, table.all_levels()
    q = Query.detailed(table.cells)
    meas = measure(h.names, counts, [(1, q, Gaussian(10.0))], KeyedRNG.reproducible(1))
    invs = [invariant(counts, 2, q)]
    privacy = PrivacyStatement("zcdp", rho=1.0, invariants=("county: detailed",))
    with pytest.raises(SpecError, match="no privacy protection"):
        tree_gls(h, table.cells, meas, invs, privacy)
    ack = guard_exact_release(h.names, [(1, q)], [(2, q)], privacy, acknowledge=True)
    rel = tree_gls(h, table.cells, meas, invs, ack)
    assert np.allclose(rel.estimates[2], counts[2]) and np.all(rel.variances[2] == 0)
    assert "carry no privacy protection" in rel.privacy.text()


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.integers(0, 1), min_size=3, max_size=3)),
        min_size=1,
        max_size=4,
    ),
    st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.integers(0, 1), min_size=3, max_size=3)),
        min_size=0,
        max_size=4,
    ),
)
def test_exactly_released_matches_a_float_rank_reference(measured, held):
    def q(i, row):
        return Query(f"q{i}", np.array([row], dtype=np.int64), ("r",))

    meas = [(k, q(i, row)) for i, (k, row) in enumerate(measured)]
    invs = [(k, q(100 + i, row)) for i, (k, row) in enumerate(held)]
    want = {}
    for k in sorted({k for k, _ in meas}):
        below = [m.matrix for j, m in invs if j >= k]
        if not below:
            continue
        inv = np.vstack(below)
        mine = [m for j, m in meas if j == k]
        both = np.vstack([inv, *(m.matrix for m in mine)])
        if np.linalg.matrix_rank(both) == np.linalg.matrix_rank(inv):
            want[NAMES[k]] = tuple(m.name for m in mine)
    assert exactly_released(NAMES, meas, invs) == want
    assert exact_rank(np.vstack([m.matrix for _, m in meas])) == np.linalg.matrix_rank(
        np.vstack([m.matrix for _, m in meas])
    )


SPEC = """
[data]
source = "csv"
path = "d.csv"
cells = ["pop"]
[hierarchy]
levels = ["nation", "state", "county"]
codes = {{ state = "fips:2", county = "fips" }}
[privacy]
accounting = "zcdp"
rho = 1.0
[queries]
state = ["detailed"]
[invariants]
county = "detailed"
{ack}
[mechanism]
noise = "discrete_gaussian"
[estimators]
run = ["gls"]
"""


@pytest.mark.parametrize("command", ["run", "privatize"])
def test_the_cli_refuses_an_unacknowledged_exact_release(tmp_path, capsys, command):
    (tmp_path / "d.csv").write_text("fips,pop\n01001,10\n01003,20\n02001,5\n02003,7\n")
    (tmp_path / "s.toml").write_text(SPEC.format(ack=""))
    if command == "run":
        argv = ["run", str(tmp_path / "s.toml"), "--out", str(tmp_path / "o"), "--seed", "1"]
    else:  # privatize reads NHGIS files: the same spec through its [data] source
        (tmp_path / "n.csv").write_text("gisjoin,pop_sf\nG0100010,10\nG0100030,20\n")
        (tmp_path / "s.toml").write_text(
            SPEC.format(ack="")
            .replace('source = "csv"', 'source = "nhgis"')
            .replace('codes = { state = "fips:2", county = "fips" }', "")
        )
        argv = ["privatize", str(tmp_path / "n.csv"), "--spec", str(tmp_path / "s.toml")]
        argv += ["-o", str(tmp_path / "o.csv"), "--seed", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no privacy protection" in err and "acknowledge_exact_release" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.csv").exists()


def test_an_acknowledged_exact_release_says_so_in_the_statement(tmp_path, capsys):
    (tmp_path / "d.csv").write_text("fips,pop\n01001,10\n01003,20\n02001,5\n02003,7\n")
    (tmp_path / "s.toml").write_text(SPEC.format(ack="acknowledge_exact_release = true"))
    out = tmp_path / "o"
    assert main(["run", str(tmp_path / "s.toml"), "--out", str(out), "--seed", "1"]) == 0
    capsys.readouterr()
    manifest = json.loads((out / "release" / "manifest.json").read_text())
    text = manifest["privacy"]["gls"]["text"]
    assert "NO PRIVACY PROTECTION at state (detailed)" in text
    assert manifest["spec"]["invariants"]["acknowledge_exact_release"] is True
    assert "no privacy protection" in (out / "evaluation" / "report.md").read_text()
    assert "NO PRIVACY PROTECTION" in (out / "release" / "privacy.md").read_text()


def test_acknowledge_must_be_a_boolean(tmp_path):
    import tomllib

    from censusdp.pipelines.specs import parse_spec

    doc = tomllib.loads(
        textwrap.dedent(SPEC.format(ack='acknowledge_exact_release = "yes"')).replace(
            'path = "d.csv"\n', ""
        )
    )
    with pytest.raises(SpecError, match="invariants.acknowledge_exact_release"):
        parse_spec(doc)
