"""Privacy statements are derived from the measurements; a statement passed in that claims
less than they spend is refused (BudgetError)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.budget import PrivacyStatement, statement_for
from censusdp.errors import BudgetError, SpecError
from censusdp.estimation.gls.tree import tree_gls
from censusdp.hierarchy import Table
from censusdp.mechanisms.discrete import DiscreteGaussian, DiscreteLaplace
from censusdp.mechanisms.laws import FLOATING_POINT_NOTE, Gaussian, Laplace
from censusdp.mechanisms.privacy import (
    check_statement,
    derive_statement,
    spends,
)
from censusdp.mechanisms.product_query import ProductQuery, QueryRows
from censusdp.mechanisms.queries import (
    LinearQuery,
    Measurement,
    Query,
    invariant,
    matrix_sensitivity,
    measure,
)
from censusdp.pipelines.estimators import run_estimator
from censusdp.pipelines.spec import EstimatorSpec
from censusdp.schema import Schema


@pytest.fixture(scope="module")
def midwest():
    table = Table.from_midwest()
    return table, table.hierarchy, table.all_levels()


def _tour(midwest, rng, sigma=20):
    table, h, counts = midwest
    plan = [(2, Query.detailed(table.cells), DiscreteGaussian(sigma))]
    meas = measure(h.names, counts, plan, rng.child("tour"))
    inv = [invariant(counts, 1, Query.total(table.cells))]
    return h, table.cells, meas, inv


def test_the_tour_statement_is_derived_from_sigma_20_noise(midwest, rng):
    h, cells, meas, inv = _tour(midwest, rng)
    rel = tree_gls(h, cells, meas, inv)
    assert rel.privacy.accounting == "zcdp" and rel.privacy.rho == 1 / 800  # Δ₂²/(2σ²)
    assert rel.privacy.invariants == ("state: total",)
    assert rel.privacy.guarantee == "induced subspace differential privacy"
    assert rel.privacy.mechanism == "discrete_gaussian"
    assert FLOATING_POINT_NOTE not in rel.privacy.notes


def test_a_statement_claiming_less_than_the_noise_spends_is_refused(midwest, rng):
    """The issue's example: ρ = 1e-9 claimed for σ = 20 discrete Gaussian noise."""
    h, cells, meas, inv = _tour(midwest, rng)
    with pytest.raises(BudgetError, match=r"claims ρ = 1e-09.*spend ρ = 0.00125"):
        tree_gls(h, cells, meas, inv, statement_for("zcdp", 1e-9))
    with pytest.raises(BudgetError, match="no pure ε-DP guarantee"):
        tree_gls(h, cells, meas, inv, statement_for("pure", 100.0))
    # a claim of exactly the spend, or more, is kept (with the invariants named)
    for rho in (1 / 800, 1.0):
        kept = tree_gls(h, cells, meas, inv, statement_for("zcdp", rho)).privacy
        assert kept.rho == rho and kept.invariants == ("state: total",)
    with pytest.raises(BudgetError):
        tree_gls(h, cells, meas, inv, statement_for("zcdp", 1 / 800 * (1 - 1e-6)))


@pytest.mark.parametrize("name", ["topdown", "conditioning", "gls"])
def test_every_registered_estimator_refuses_an_understated_claim(midwest, rng, name):
    h, cells, meas, inv = _tour(midwest, rng)
    claim = statement_for("zcdp", 1e-9, invariants=["state: total"])
    with pytest.raises(BudgetError, match="claims ρ = 1e-09"):
        run_estimator(name, h, cells, meas, inv, claim, rng, EstimatorSpec())


def test_pure_levels_add_epsilon_and_mixed_accountings_compose_in_zcdp():
    names = ["nation", "state", "county"]
    cells = ["a", "b", "c", "d"]
    pairs = Query.marginal("pairs", cells, {"ab": ["a", "b"], "cd": ["c", "d"]})  # Δ₁ = 1
    tot = Query.total(cells)
    det = Query.detailed(cells)
    zeros = np.zeros((1, 1))
    pure = [
        Measurement(0, tot, zeros, Laplace(4.0)),  # ε = 1/4
        Measurement(1, pairs, zeros, DiscreteLaplace(2)),  # ε = 1/2
        Measurement(2, det, zeros, Laplace(1.0)),  # ε = 1
    ]
    st_ = derive_statement(names, pure)
    assert st_.accounting == "pure" and st_.epsilon == 1.75
    assert st_.mechanism == "laplace, discrete_laplace"
    assert FLOATING_POINT_NOTE in st_.notes  # continuous Laplace among them
    mixed = derive_statement(names, [*pure, Measurement(2, tot, zeros, DiscreteGaussian(2))])
    # ε-DP ⇒ (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4), then ρ adds
    assert mixed.accounting == "zcdp"
    assert math.isclose(mixed.rho, (0.25**2 + 0.5**2 + 1.0) / 2 + 1 / 8, rel_tol=1e-15)
    with pytest.raises(BudgetError, match="spend ε = 1.75"):
        check_statement(statement_for("pure", 1.7), st_)
    assert check_statement(statement_for("zcdp", 1.75**2 / 2), st_).rho == 1.75**2 / 2
    with pytest.raises(BudgetError, match=r"ρ = ε²/2"):
        check_statement(statement_for("zcdp", 1.5), st_)


def test_no_measurements_no_statement():
    with pytest.raises(SpecError, match="no measurements"):
        derive_statement(["n"], [])


def test_every_query_kind_answers_the_one_query_protocol():
    schema = Schema.load("sex_age5")
    q = ProductQuery.parse(schema, "sex * ageband")  # one cell per person
    dense = q.dense()
    assert q.sensitivity(1) == np.abs(dense).sum(axis=0).max() == 1
    assert q.sensitivity(2) == np.sqrt((dense**2).sum(axis=0)).max()
    np.testing.assert_array_equal(q.gram(), dense @ dense.T)
    flat = q.to_query()
    total = ProductQuery.parse(schema, "total")
    rows = QueryRows(schema, (q, total), np.array([0, 1, 0]), np.array([0, 0, 1]), ("a", "t", "b"))
    for query in (q, flat, rows):
        assert isinstance(query, LinearQuery)
        for norm in (1, 2):
            want = _slow_sensitivity(query.dense() if query is rows else dense_of(query), norm)
            assert query.sensitivity(norm) == pytest.approx(want, rel=1e-12)
    np.testing.assert_array_equal(flat.gram(), q.gram())
    assert rows.sensitivity(1) == 2  # each person in one row of each query
    assert matrix_sensitivity(sp.csr_matrix(dense), 2) == matrix_sensitivity(dense, 2)
    with pytest.raises(SpecError, match="norm must be 1 or 2"):
        q.sensitivity(3)


def dense_of(query) -> np.ndarray:
    return query.matrix if hasattr(query, "matrix") else query.dense()


def _slow_sensitivity(matrix: np.ndarray, norm: int) -> float:
    best = 0.0
    for j in range(matrix.shape[1]):
        col = [abs(float(matrix[i, j])) for i in range(matrix.shape[0])]
        best = max(best, sum(col) if norm == 1 else math.sqrt(sum(c * c for c in col)))
    return best


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.lists(st.integers(0, 3), min_size=3, max_size=3), min_size=1, max_size=4),
            st.sampled_from(["laplace", "gaussian", "discrete_laplace", "discrete_gaussian"]),
            st.floats(0.5, 50.0),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_derived_total_matches_a_slow_reference(items):
    laws = {
        "laplace": Laplace,
        "gaussian": Gaussian,
        "discrete_laplace": DiscreteLaplace,
        "discrete_gaussian": DiscreteGaussian,
    }
    meas, pure, rho = [], [], []
    for k, (rows, name, scale) in enumerate(items):
        m = np.array(rows, dtype=np.float64)
        if not m.any():
            m[0, 0] = 1.0
        q = Query(f"q{k}", m, tuple(f"r{i}" for i in range(m.shape[0])))
        law = laws[name](scale)
        meas.append(Measurement(0, q, np.zeros((1, m.shape[0])), law))
        if law.accounting == "pure":
            pure.append(_slow_sensitivity(m, 1) / law.scale)
        else:
            rho.append(_slow_sensitivity(m, 2) ** 2 / (2 * law.sigma**2))
    got = derive_statement(["n"], meas)
    assert [s.label for s in spends(["n"], meas)] == [f"n/q{k}" for k in range(len(items))]
    if not rho:
        assert math.isclose(got.epsilon, math.fsum(pure), rel_tol=1e-12)
    else:
        want = math.fsum(rho) + math.fsum(e * e / 2 for e in pure)
        assert math.isclose(got.rho, want, rel_tol=1e-12)


def test_a_statement_passed_keeps_its_own_wording_but_gains_the_invariants(midwest, rng):
    h, cells, meas, inv = _tour(midwest, rng)
    claim = PrivacyStatement("zcdp", rho=2.0, delta=1e-10, notes=("stated by the agency",))
    got = tree_gls(h, cells, meas, inv, claim).privacy
    assert got.rho == 2.0 and got.delta == 1e-10 and "stated by the agency" in got.notes
    assert got.invariants == ("state: total",)
