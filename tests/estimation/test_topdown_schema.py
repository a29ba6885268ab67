"""TopDown-style on schema histograms: the sparse multi-pass solves against cvxpy, the driver.

The reference is the obvious dense formulation of every pass in cvxpy (full cells × rows
query matrices, Clarabel for the L2 passes, HiGHS branch and bound with boolean variables for
the rounding passes), given the same inputs as the fast path's pass (the earlier passes'
answers and bands it produced); each pass's optimal objective and the answers it fixes must
agree within solver tolerance.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from censusdp.errors import SpecError
from censusdp.estimation.topdown.schema import (
    TopDownOptions,
    bureau_pl94_ordering,
    structural_zero_mask,
    topdown_schema,
)
from censusdp.estimation.topdown.sparse import ChildrenLayout, l1_multipass, l2_multipass
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.product_measure import (
    ProductInvariant,
    ProductMeasurement,
    measure_products,
)
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.execute import open_executor
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema
from tests.schema_strategies import query_texts, schemas


# ------------------------------------------------------------------------- references
def ref_l2_pass(n, m, parent, zero, terms, invs, bands):
    """min Σ w (X Qᵀ − y)² over X ≥ 0 (n × m), Σ X = parent, zeros, X Hᵀ = t, bands."""
    X = cp.Variable((n, m), nonneg=True)
    obj = sum(cp.sum(cp.multiply(w, cp.square(X @ Q.T - y))) for Q, y, w in terms)
    cons = []
    if parent is not None:
        cons.append(cp.sum(X, axis=0) == parent)
    if zero is not None and zero.any():
        cons.append(X[:, zero] == 0)
    cons += [X @ H.T == t for H, t in invs]
    for G, lo, hi in bands:
        cons += [X @ G.T >= lo, X @ G.T <= hi]
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL")
    assert prob.status == cp.OPTIMAL, prob.status
    x = X.value
    return sum(float(np.sum(w * (x @ Q.T - y) ** 2)) for Q, y, w in terms), x


def ref_l1_pass(xt, parent, inactive, pens, detailed, invs, fixed):
    """min Σ |Y Qᵀ − round(f Qᵀ)| (+ Σ(1 − 2f)Y for detailed), Y boolean, constraints."""
    n, m = xt.shape
    floor = np.floor(xt)
    f = xt - floor
    Y = cp.Variable((n, m), boolean=True)
    obj = sum(cp.sum(cp.abs(Y @ Q.T - np.rint(f @ Q.T))) for Q in pens)
    if detailed:
        obj = obj + cp.sum(cp.abs(Y - np.rint(f))) + cp.sum(cp.multiply(1 - 2 * f, Y))
    cons = []
    if parent is not None:
        cons.append(cp.sum(Y, axis=0) == parent - floor.sum(axis=0))
    if inactive.any():
        cons.append(Y[:, inactive] == 0)
    cons += [Y @ H.T == np.rint(t - floor @ H.T) for H, t in invs]
    cons += [Y @ Q.T == a for Q, a in fixed]
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="HIGHS")
    assert prob.status == cp.OPTIMAL, prob.status
    return float(prob.value)


# ------------------------------------------------------------------------- problems
@st.composite
def parent_problems(draw):
    """A small schema, 2–5 children, a parent histogram split among them, noisy answers of
    total, one or two random product queries and detailed; sometimes structural zeros and
    child-total invariants."""
    schema = draw(schemas(max_attributes=3, max_domain=5, max_cells=40))
    m = schema.n_cells
    n = draw(st.integers(2, 5))
    gen = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    zero = None
    if m > 1 and draw(st.booleans()):
        zero = gen.random(m) < 0.25
        zero[0] &= not zero.all()  # at least one cell may be filled
    parent = gen.integers(0, 7, m) * (gen.random(m) < 0.7)
    if zero is not None:
        parent[zero] = 0
    if parent.sum() == 0:
        parent[np.flatnonzero(zero is None or ~zero)[0] if zero is not None else 0] = 3
    truth = np.stack([gen.multinomial(int(p), np.full(n, 1 / n)) for p in parent], axis=1)
    texts = ["total", *draw(st.lists(query_texts(schema), min_size=1, max_size=2)), "detailed"]
    queries = list({q.name: q for q in (ProductQuery.parse(schema, t) for t in texts)}.values())
    meas = []
    for q in queries:
        var = float(gen.uniform(0.5, 4.0))
        vals = q.apply(truth.reshape(n, *schema.shape)) + gen.normal(0, np.sqrt(var), (n, q.n_rows))
        meas.append((q, vals, var))
    invs = []
    if draw(st.booleans()):
        invs.append((queries[0], queries[0].apply(truth.reshape(n, *schema.shape))))
    return schema, n, parent, zero, meas, invs


def _compare(problem, method):
    schema, n, parent, zero, meas, invs = problem
    m = schema.n_cells
    names = [q.name for q, _, _ in meas]
    passes = [["total"], names[1:]]
    layout = ChildrenLayout(n, m, parent, zero)
    xt, l2 = l2_multipass(layout, meas, invs, passes, method=method)
    dense = {q.name: q.dense().astype(np.float64) for q, _, _ in meas}
    bands = []
    inv_ref = [(q.dense().astype(np.float64), v) for q, v in invs]
    for p in l2:
        terms = []
        for nm in p.queries:
            q, y, var = next(t for t in meas if t[0].name == nm)
            rows = layout.block(q).rows
            terms.append(
                (dense[nm][rows], np.asarray(y)[:, rows], np.full((n, rows.size), 1 / var))
            )
        obj, _ = ref_l2_pass(n, m, parent, zero, terms, inv_ref, bands)
        assert p.objective == pytest.approx(obj, rel=1e-5, abs=1e-5), (p.status, p.queries)
        for nm in p.queries:
            rows = layout.block(next(t[0] for t in meas if t[0].name == nm)).rows
            bands.append((dense[nm][rows], p.answers[nm] - p.tol, p.answers[nm] + p.tol))
    # the L2 output: non-negative, summing to the parent, zero off the active cells
    assert xt.min() >= 0
    # the projected-gradient path meets the parent exactly; an interior-point solve (Clarabel)
    # to its tolerance — the L1 step below makes the integers exact either way
    atol = 1e-9 if method == "structured" else 1e-6 * max(1.0, float(np.abs(parent).max()))
    np.testing.assert_allclose(xt.sum(axis=0), parent, atol=atol)
    # rounding: total, then the random queries, then detailed
    rq = [[meas[0][0]], [q for q, _, _ in meas[1:-1]], [meas[-1][0]]]
    counts, l1 = l1_multipass(layout, xt, invs, rq)
    assert counts.dtype == np.int64 and counts.min() >= 0
    assert np.array_equal(counts.sum(axis=0), parent)
    for q, v in invs:
        assert np.array_equal(q.apply(counts.reshape(n, *schema.shape)), v)
    if zero is not None:
        assert not counts[:, zero].any()
    y = counts - np.floor(xt)
    inactive = np.ones(m, bool)
    inactive[layout.active] = False
    fixed = []
    for p, qs in zip(l1, [r for r in rq if r], strict=True):
        pens = [dense[q.name] for q in qs if q.name != "detailed"]
        det = any(q.name == "detailed" for q in qs)
        obj = ref_l1_pass(xt, parent, inactive, pens, det, inv_ref, fixed)
        assert p.objective == pytest.approx(obj, abs=1e-6), p.queries
        fixed += [(dense[q.name], y @ dense[q.name].T) for q in qs]


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=8, **_SETTINGS)
@given(parent_problems())
def test_fast_path_equals_cvxpy_reference(problem):
    """Every L2 pass (closed form, structured with its augmented Lagrangian) and every
    rounding pass matches the dense cvxpy reference; outputs integer, non-negative,
    consistent, invariants exact."""
    _compare(problem, "structured")


@settings(max_examples=6, **_SETTINGS)
@given(parent_problems())
def test_auto_path_equals_cvxpy_reference(problem):
    _compare(problem, "auto")


@settings(max_examples=6, **_SETTINGS)
@given(parent_problems())
def test_clarabel_path_equals_cvxpy_reference(problem):
    _compare(problem, "clarabel")


@pytest.mark.slow
@settings(max_examples=60, **_SETTINGS)
@given(parent_problems())
def test_fast_path_equals_cvxpy_reference_many(problem):
    """The acceptance form: ≥ 50 random parents."""
    _compare(problem, "structured")


# ------------------------------------------------------------------------- driver
def _tree_problem(seed: int, noise: float, invariant: bool = True):
    gen = np.random.default_rng(seed)
    h = random_hierarchy(gen, [(2, 3), (2, 3), (1, 3)])
    schema = Schema.load("sex_age5")
    leaf = gen.poisson(4.0, size=(h.sizes[-1], schema.n_cells))
    counts = [c.reshape(-1, *schema.shape) for c in h.aggregate(leaf)]
    texts = ["total", "sex", "age5", "sex * ageband", "detailed"]
    qs = [ProductQuery.parse(schema, t) for t in texts]
    plan = [(lv, q, Gaussian(noise)) for lv in h.names for q in qs]
    meas = measure_products(dict(zip(h.names, counts, strict=True)), plan,
                            KeyedRNG.reproducible(seed, warn=False))  # fmt: skip
    invs = [ProductInvariant(h.names[0], qs[0], qs[0].apply(counts[0]))] if invariant else []
    ordering = {lv: ((("total",), tuple(texts[1:])), (("total",), ("sex",), ("detailed",)))
                for lv in h.names}  # fmt: skip
    return h, schema, counts, meas, invs, ordering


def test_topdown_schema_integer_consistent_invariants_exact():
    h, schema, counts, meas, invs, ordering = _tree_problem(5, 4.0)
    rel = topdown_schema(h, schema, meas, invs, options=TopDownOptions(ordering=ordering))
    assert rel.integer and rel.estimator == "topdown"
    for k, est in enumerate(rel.estimates):
        assert est.dtype == np.int64 and est.min() >= 0
        if k:
            assert np.array_equal(h.aggregate_up(k, est), rel.estimates[k - 1])
    assert rel.estimates[0].sum() == counts[0].sum()
    assert "L0: total" in rel.privacy.invariants


def test_topdown_schema_exact_answers_give_the_truth():
    """With noiseless answers every pass is solved by the truth, and the rounding keeps it."""
    h, schema, counts, meas, invs, ordering = _tree_problem(6, 1.0)
    exact = [ProductMeasurement(mm.level, mm.query,
                                mm.query.apply(counts[h.level_index(mm.level)]), mm.law)
             for mm in meas]  # fmt: skip
    rel = topdown_schema(h, schema, exact, invs, options=TopDownOptions(ordering=ordering))
    for k, est in enumerate(rel.estimates):
        assert np.array_equal(est, counts[k].reshape(est.shape)), h.names[k]


def test_structural_zeros_are_held():
    h, schema, counts, meas, invs, ordering = _tree_problem(7, 4.0)
    zero = structural_zero_mask(schema, [("sex * ageband", ("F", "65+"))])
    assert zero.sum() == 5
    rel = topdown_schema(
        h, schema, meas, [], options=TopDownOptions(ordering=ordering, structural_zeros=zero)
    )
    for est in rel.estimates:
        assert not est[:, zero].any()


def test_unordered_measured_query_is_refused():
    h, schema, counts, meas, invs, ordering = _tree_problem(8, 4.0)
    bad = {lv: ((("total",), ("sex",)), o[1]) for lv, o in ordering.items()}
    with pytest.raises(SpecError, match="in no L2 pass"):
        topdown_schema(h, schema, meas, invs, options=TopDownOptions(ordering=bad))
    with pytest.raises(SpecError, match="structural_zeros has 3 cells"):
        topdown_schema(h, schema, meas, invs,
                       options=TopDownOptions(ordering=ordering, structural_zeros=np.ones(3, bool)))  # fmt: skip


def test_bureau_pl94_ordering():
    """Strategy1b_ST_CTY_TR_BG_isoTot_Ordering_dsepJune3: isolated total below the root, one
    pass at the root and the blocks; every pl94 strategy query is in an L2 pass."""
    names = ("nation", "state", "county", "tract", "block_group", "block")
    o = bureau_pl94_ordering(names)
    assert o["nation"][0] == (o["county"][0][1],) and "total" not in o["nation"][0][0]
    for lv in names[1:-1]:
        assert o[lv][0][0] == ("total",) and o[lv][1][0] == ("total",)
        assert o[lv][1][1][-1] == "detailed"
    assert o["block"][0][0][0] == "total" and len(o["block"][0]) == 1
    schema = Schema.load("pl94")
    for lv in names[1:]:
        assert set(schema.strategy) <= {q for p in o[lv][0] for q in p}


def test_executor_and_chunks_do_not_change_the_result():
    """Per-parent problems are pure: runs of parents solved by threads, finishing in any
    order, give the same release as solving them in turn."""
    h, schema, counts, meas, invs, ordering = _tree_problem(9, 4.0)
    base = topdown_schema(h, schema, meas, invs, options=TopDownOptions(ordering=ordering))
    with open_executor("threads", workers=3) as ex:
        opts = TopDownOptions(ordering=ordering, executor=ex, chunks=3)
        rel = topdown_schema(h, schema, meas, invs, opts)
    for a, b in zip(base.estimates, rel.estimates, strict=True):
        assert np.array_equal(a, b)


def test_options_given_one_by_one_as_before_equal_topdown_options():
    """The pre-TopDownOptions keyword arguments still run (one release), over ``options``,
    and give the same release; progress reports one line per level; a keyword that is no
    option is refused."""
    h, schema, counts, meas, invs, ordering = _tree_problem(10, 4.0)
    base = topdown_schema(h, schema, meas, invs, TopDownOptions(ordering=ordering, chunks=2))
    lines: list[str] = []
    rel = topdown_schema(h, schema, meas, invs, TopDownOptions(chunks=2), ordering=ordering,
                         progress=lines.append)  # fmt: skip
    for a, b in zip(base.estimates, rel.estimates, strict=True):
        assert np.array_equal(a, b)
    assert [ln.split(":")[0] for ln in lines] == list(h.names)
    assert base.diagnostics["levels"].keys() == rel.diagnostics["levels"].keys()
    with pytest.raises(TypeError, match="'slak'; its options are the fields of TopDownOptions"):
        topdown_schema(h, schema, meas, invs, slak=0.1)
