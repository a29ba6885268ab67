"""Measured areas: the low-rank update of the tree GLS against the dense GLS with the extra
rows, the privacy accounting, and a fixed-seed coverage / unbiasedness check."""

from __future__ import annotations

import importlib.util
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from censusdp.errors import BudgetError, SpecError
from censusdp.estimation import general_gls
from censusdp.estimation.gls.area_measurements import (
    area_plan,
    area_statement,
    check_disjoint,
    measure_areas,
    update_with_areas,
)
from censusdp.estimation.gls.structured import structured_gls
from censusdp.hierarchy.equivalency import Equivalency
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.product_measure import (
    ProductInvariant,
    ProductMeasurement,
    measure_products,
)
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import Invariant
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

_spec = importlib.util.spec_from_file_location(
    "_area_tests", Path(__file__).with_name("test_areas.py")
)
_areas = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_areas)  # area_cases: random trees, workloads and block → area maps
area_cases, rel_close = _areas.area_cases, _areas.rel_close
_pred = _areas._pred  # replicate(h, copies): independent copies under one root


# ----------------------------------------------------------------------------- reference
def dense_update(h, schema, meas, invs, leaf, area, n_areas, ameas):
    """The GLS of the tree's rows and the areas' rows ``E ⊗ Q`` by the dense sparse-KKT
    solver, on the identified subspace ``W`` of the tree's workload: leaf estimates
    ``(n_leaves, K)`` in cells and the leaves × leaves covariance in ``W`` coordinates, with
    ``V``; None when the tree problem is not identifiable."""
    prob = _areas.dense_problem(h, schema, meas, invs)
    if prob is None:
        return None
    Ar, y, v, Cr, c, V = prob
    E = sp.csr_matrix((np.ones(leaf.size), (area, leaf)), shape=(n_areas, h.leaves.size))
    R = sp.kron(sp.eye(h.leaves.size), sp.csr_matrix(V)).tocsr()
    rows, ys, vs = [Ar], [y], [v]
    for m in ameas:
        B = sp.kron(E, sp.csr_matrix(m.query.dense().astype(float)))
        rows.append((B @ R).tocsr())
        ys.append(np.asarray(m.values, float).reshape(-1))
        vs.append(np.full(B.shape[0], float(m.law.variance)))
    est, cov = general_gls(
        sp.vstack(rows).tocsr(), np.concatenate(ys), np.concatenate(vs),
        Cr if Cr.shape[0] else None, c if Cr.shape[0] else None,
    )  # fmt: skip
    return est.reshape(h.leaves.size, -1) @ V.T, cov, V, E


def _blocks(M, V, cov, n):
    """Diagonal ``K × K`` blocks (cells) of ``(M ⊗ V) cov (M ⊗ V)ᵀ`` for a 0/1 ``M``."""
    G = sp.kron(sp.csr_matrix(M), sp.csr_matrix(V)).tocsr()
    full = G @ (G @ cov).T
    K = V.shape[0]
    return np.stack([full[i * K : (i + 1) * K, i * K : (i + 1) * K] for i in range(n)])


def _area_measurements(schema, meas, n_areas, gen, pick):
    """Area answers (arbitrary values: the estimator is linear) of ``total`` and, when
    ``pick``, of a query the tree measures."""
    qs = [ProductQuery.parse(schema, "total")]
    if pick is not None and meas[pick % len(meas)].query.name != "total":
        qs.append(meas[pick % len(meas)].query)
    return [
        ProductMeasurement(
            "place", q, gen.normal(size=(n_areas, q.n_rows)) * 5, Gaussian(0.5 + i)
        )  # fmt: skip
        for i, q in enumerate(qs)
    ]


def _combined(rel, ameas):
    """The tree's statement with ρ raised by the areas' derived spend."""
    import dataclasses

    from censusdp.mechanisms.privacy import derive_statement

    spent = derive_statement(["place"], [(0, m.query, m.law) for m in ameas]).rho
    return dataclasses.replace(rel.privacy, rho=rel.privacy.rho + spent)


def check_update_case(h, schema, meas, invs, extra, leaf, area, n_areas, pick) -> str:
    """Every level's updated estimates and node covariances, and the areas', equal the dense
    GLS with the areas' rows (1e-9); consistency and invariants hold after the update."""
    gen = np.random.default_rng(leaf.size * 7 + n_areas)
    ameas = _area_measurements(schema, meas, n_areas, gen, pick)
    ref = dense_update(h, schema, meas, invs, leaf, area, n_areas, ameas)
    if ref is None:
        return "refused"
    est_ref, cov, V, E = ref
    eq = _areas._equivalency(h, leaf, area, n_areas)
    rel = structured_gls(h, schema, meas, invs, acknowledge_exact_release=True)
    qd = np.concatenate([m.query.dense().astype(float) for m in ameas])
    if np.abs(qd - qd @ V @ V.T).max() > 1e-9:  # the areas would measure beyond W: refused
        with pytest.raises(SpecError, match="no level of the tree measures"):
            update_with_areas(rel, eq, ameas, _combined(rel, ameas))
        return "outside"
    leaf_rows = [x.query.dense().astype(float) for x in [*meas, *invs] if x.level == h.names[-1]]
    U = scipy.linalg.orth(np.concatenate(leaf_rows).T) if leaf_rows else np.zeros((len(V), 0))
    if np.abs(qd - qd @ U @ U.T).max() > 1e-9:  # beyond what the leaves measure: refused
        with pytest.raises(SpecError, match="does not measure"):
            update_with_areas(rel, eq, ameas, _combined(rel, ameas))
        return "flat"
    got = update_with_areas(rel, eq, ameas, _combined(rel, ameas))
    upd = got.release
    n = h.leaves.size
    rel_close(upd.estimates[-1].reshape(n, -1), est_ref)
    for k in range(h.depth):
        anc = h.ancestor_index(h.names[-1], h.names[k])
        M = sp.csr_matrix((np.ones(n), (anc, np.arange(n))), shape=(h.sizes[k], n)).toarray()
        rel_close(upd.estimates[k].reshape(h.sizes[k], -1), M @ est_ref)
        ref_cov = _blocks(M, V, cov, h.sizes[k])
        for i in range(h.sizes[k]):
            rel_close(upd.node_covariance(k, i).dense_cells(), ref_cov[i])
    area_cov = _blocks(E.toarray(), V, cov, n_areas)
    sums = E.toarray() @ est_ref
    rel_close(got.areas.level("place").reshape(n_areas, -1), sums)
    for a in range(n_areas):
        rel_close(got.areas.node_covariance("place", a).dense_cells(), area_cov[a])
    for inv in invs:  # invariants still hold
        k = h.level_index(inv.level)
        rel_close(inv.query.apply(upd.estimates[k]), inv.values, 1e-8)
    for k in range(h.depth - 1):  # parent = Σ children
        up = h.aggregate_up(k + 1, upd.estimates[k + 1])
        rel_close(up, upd.estimates[k])
    return "compared"


def _run(n: int, derandomize: bool) -> dict:
    seen = {"compared": 0, "refused": 0, "outside": 0, "flat": 0}

    @settings(
        max_examples=n,
        deadline=None,
        derandomize=derandomize,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(area_cases(max_cells=10, max_leaves=7), st.one_of(st.none(), st.integers(0, 20)))
    def run(case, pick):
        seen[check_update_case(*case, pick)] += 1

    run()
    return seen


def test_update_equals_dense_gls_with_area_rows():
    """Hypothesis cases (random schemas ≤ 10 cells and marginal workloads, per-node
    variances, invariants at random levels, trees of depth 2–4, random block → area maps,
    areas measuring the total and a query of the workload): every node's estimate and
    covariance at every level, and every area's, equal the dense GLS with the extra rows
    ``E ⊗ Q`` to 1e-9; invariants and consistency hold after the update."""
    seen = _run(10, derandomize=True)
    assert seen["compared"] >= 5, seen


@pytest.mark.slow
def test_update_equals_dense_gls_with_area_rows_many():
    """The same on 250 random (not derandomized) cases."""
    seen = _run(250, derandomize=False)
    assert seen["compared"] >= 120, seen


# ----------------------------------------------------------------------------- privacy
def _tree_plan(h, s):
    q = {t: ProductQuery.parse(s, t) for t in ["total", "sex * ageband", "detailed"]}
    dg = DiscreteGaussian.from_sigma2
    n = h.names
    return [
        (n[-3], q["total"], dg(Fraction(4))),
        (n[-2], q["sex * ageband"], dg(Fraction(9))),
        (n[-1], q["detailed"], dg(Fraction(4))),
    ]


def test_area_budget_is_derived_and_composed():
    """Each area query spends its equal share of ρ exactly (Δ₂² = 1 for a total: a person
    is in one area); the statement composes the tree's spend and the areas', names them,
    and an update with a statement that leaves the areas out is refused."""
    s = Schema.load("sex_age5")
    h = random_hierarchy(np.random.default_rng(0), [(2, 2), (2, 3)])
    plan = area_plan(s, Fraction(1, 10), ["total", "sex"])
    for q, law in plan:
        assert law.privacy(q.l2_sensitivity) == pytest.approx(0.05, rel=1e-12)
    tree = _tree_plan(h, s)
    stmt = area_statement(h.names, tree, "place", plan)
    tree_only = area_statement(h.names[:-1], tree[:-1], h.names[-1], [(tree[-1][1], tree[-1][2])])
    assert stmt.rho == pytest.approx(tree_only.rho + 0.1, rel=1e-12)
    assert "place/total" in " ".join(stmt.notes) and "place/sex" in " ".join(stmt.notes)
    counts = np.random.default_rng(1).integers(0, 5, size=(h.leaves.size, *s.shape))
    rng = KeyedRNG.reproducible(3, warn=False)
    meas = measure_products(h.aggregate(counts), tree, rng, level_names=h.names)
    rel = structured_gls(h, s, meas, [])
    eq = _areas._equivalency(h, np.arange(h.leaves.size), np.arange(h.leaves.size) % 2, 2)
    ameas = measure_areas(eq, counts, plan, rng.child("areas"))
    with pytest.raises(BudgetError, match="place"):
        update_with_areas(rel, eq, ameas, rel.privacy)
    assert update_with_areas(rel, eq, ameas, stmt).release.privacy == stmt
    with pytest.raises(SpecError, match="positive"):
        area_plan(s, 0.0)


def test_overlapping_areas_are_refused():
    """Two areas sharing a block would make a person count twice: refused, naming both."""
    eq = Equivalency("place", np.array(["A", "B"], dtype=object), np.array([0, 0, 1]),
                     np.array([0, 1, 1]), 3, "places.csv")  # fmt: skip
    with pytest.raises(SpecError, match=r"places.csv: places 'A' and 'B' share a block"):
        check_disjoint(eq)


# ----------------------------------------------------------------------------- coverage
def _coverage_run(copies: int, seed: int):
    """``copies`` independent simulated releases (one tree over independent copies of a
    small tree under an unmeasured root, zero counts: the estimate is the error), each copy
    with one area crossing its two states, measured with its own budget and combined with
    the tree. Returns the areas' total errors and SEs per copy ``(copies, 1)``, the prior
    (unmeasured) SEs and the update."""
    s = Schema.load("sex_age5")
    h = _pred.replicate(random_hierarchy(np.random.default_rng(5), [(2, 2), (2, 3)]), copies)
    tree = _tree_plan(h, s)
    rng = KeyedRNG.reproducible(seed, warn=False)
    zeros = [np.zeros((n, *s.shape), np.int64) for n in h.sizes]
    meas = measure_products(zeros, tree, rng, level_names=h.names)
    inv = [ProductInvariant(h.names[1], tree[0][1], np.zeros((h.sizes[1], 1)))]
    rel = structured_gls(h, s, meas, inv)
    per = h.leaves.size // copies
    leaf = np.arange(h.leaves.size)
    keep = leaf % per % 2 == 0  # one area per copy, in both of its states
    eq = _areas._equivalency(h, leaf[keep], leaf[keep] // per, copies)
    # σ² = 25: the areas' discrete Gaussian noise is near-normal (at σ² = 2 its lattice alone
    # puts 93% of errors inside ±1.645 SE, whatever the SE)
    plan = area_plan(s, Fraction(1, 50), ["total"])
    ameas = measure_areas(eq, zeros[-1], plan, rng.child("areas"))
    stmt = area_statement(h.names, tree, "place", plan, [
        Invariant(1, tree[0][1].to_query(), np.zeros((h.sizes[1], 1)))])  # fmt: skip
    got = update_with_areas(rel, eq, ameas, stmt)
    err = got.areas.query_estimates("place", "total")[:, :1]
    se = got.areas.query_standard_errors("place", "total")[:, :1]
    prior = got.prior_areas.query_standard_errors("place", "total")[:, :1]
    return err, se, prior, got


def _z_checks(err, se):
    """Per column (pooled over independent copies): mean within 4 SE of zero, Σz² within
    χ²_N's 1e-6 band, 90% intervals covering within 4.9 binomial SD of 90%; and the same
    variance test rejects SEs 30% too large or too small (power)."""
    N = err.shape[0]
    band = 4.89 * np.sqrt(2 * N)  # two-sided α = 1e-6, normal approximation of χ²_N
    for a in range(err.shape[1]):
        z = err[:, a] / se[:, a]
        assert abs(z.mean()) <= 4 / np.sqrt(N), (a, z.mean())
        assert abs((z**2).sum() - N) <= band, (a, (z**2).sum(), N)
        for wrong in (1.3, 1 / 1.3):
            assert abs(((z / wrong) ** 2).sum() - N) > band
        cover = float(np.mean(np.abs(z) <= 1.6448536269514722))
        assert abs(cover - 0.9) <= 4.89 * np.sqrt(0.09 / N), (a, cover)


def test_measured_areas_cover_and_are_unbiased():
    """500 simulated releases: the measured areas' errors are unbiased and their exact SEs
    right (variance test with power against a 30% wrong scale); measuring shrinks them."""
    err, se, prior, _ = _coverage_run(500, seed=11)
    _z_checks(err, se)
    assert np.all(se < prior)


@pytest.mark.slow
def test_measured_areas_cover_and_are_unbiased_2000():
    """The same on 2,000 simulated releases (four runs of 500: the dense update's memory
    grows as nodes × areas)."""
    runs = [_coverage_run(500, seed=12 + i) for i in range(4)]
    err, se, prior = (np.concatenate([r[i] for r in runs]) for i in range(3))
    _z_checks(err, se)
    assert np.all(se < prior)
