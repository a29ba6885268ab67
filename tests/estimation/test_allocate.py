"""The allocation optimiser: its gradient against finite differences, its optimum and
certificate against a brute-force grid, and never worse than the start."""

from __future__ import annotations

import tomllib
from fractions import Fraction

import numpy as np
import pytest

from censusdp.errors import SpecError
from censusdp.estimation.gls.allocate import (
    Objective,
    Target,
    _Evaluator,
    _queries,
    allocation_from_shares,
    evaluate_allocation,
    optimise_allocation,
)
from censusdp.hierarchy.shape_classes import shape_classes
from censusdp.hierarchy.synthetic import random_hierarchy, synthetic_state
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.schema import Allocation, Schema

TINY = """
name = "tiny"
strategy = ["total", "sex", "detailed"]
[[attributes]]
name = "sex"
labels = ["M", "F"]
[[attributes]]
name = "age"
labels = ["young", "middle", "old"]
[[attributes.recodes]]
name = "band"
[attributes.recodes.groups]
"under 65" = ["young", "middle"]
"65+" = ["old"]
[allocation]
rho = "1/2"
[allocation.levels]
L1 = "1/2"
L2 = "1/2"
[allocation.queries]
L1 = [0, 0, 1]
L2 = ["1/2", 0, "1/2"]
"""


@pytest.fixture(scope="module")
def tiny():
    schema = Schema.from_dict(tomllib.loads(TINY), "tiny")
    h = random_hierarchy(np.random.default_rng(3), [(2, 3), (1, 3)])
    inv = [("L0", ProductQuery.parse(schema, "total"))]
    return schema, h, inv


def _values(ev: _Evaluator, x: np.ndarray) -> np.ndarray:
    return ev.values(ev._predict(ev.plan(x), []))


def test_gradient_equals_finite_differences_pl94():
    """The two-prediction gradient (d/dε of the covariance) equals central differences of
    the objective in every share tried, on a pl94 state (rel 1e-5)."""
    schema = Schema.load("pl94")
    h = synthetic_state(5, blocks=400).hierarchy
    inv = [(lvl, ProductQuery.parse(schema, "total")) for lvl in ("nation", "state")]
    obj = Objective(
        (
            Target("tract", "total", 1.0, 4000.0),
            Target("block_group", "hispanic * cenrace", 2.0, 1500 / 126),
            Target("block_group", "adult", 1.0, 1200.0),
        )
    )
    variables = _queries(schema, schema.allocation)
    ev = _Evaluator(shape_classes(h), schema, variables, inv, obj, float(schema.allocation.rho))
    x = np.array([float(s) for *_, s in variables])
    f, g = ev(x, np.eye(3))
    for i in (0, 14, 32, 45, 53, 64):  # one or two queries of every level
        step = 1e-4 * x[i]
        up, down = x.copy(), x.copy()
        up[i] += step
        down[i] -= step
        fd = (_values(ev, up) - _values(ev, down)) / (2 * step)
        np.testing.assert_allclose(g[:, i], fd, rtol=1e-5, atol=1e-9 * np.abs(g).max())
    assert np.all(g <= 1e-12 * np.abs(g).max())  # more budget never hurts a variance


def _grid(n: int) -> np.ndarray:
    """Barycentric points of the 2-simplex with step 1/n."""
    return np.array([(i, j, n - i - j) for i in range(n + 1) for j in range(n + 1 - i)]) / n


@pytest.mark.parametrize("kind", ["sum", "max"])
def test_optimum_and_certificate_against_a_brute_force_grid(tiny, kind):
    """Three shares on a tiny tree: the certified lower bound is below every grid point,
    and the optimiser's objective is below the grid's best (a 1/18 grid of the floored
    simplex; continuous Gaussian calibration for both, as the solver uses)."""
    schema, h, inv = tiny
    obj = Objective((Target("L2", "sex", 1.0, 5.0), Target("L1", "total", 3.0, 20.0)), kind=kind)
    res = optimise_allocation(h, schema, obj, inv, floor=0.05, tolerance=1e-4)
    assert res.certified and res.gap <= 1e-4 and res.iterations >= 2
    variables = _queries(schema, schema.allocation)
    s0 = np.array([float(s) for *_, s in variables])
    lo = 0.05 * s0
    ev = _Evaluator(shape_classes(h), schema, variables, inv, obj, 0.5)
    grid = [obj.combine(_values(ev, lo + (1 - lo.sum()) * p)) for p in _grid(18)]
    assert res.bound <= min(grid) * (1 + 1e-9)
    assert min(F for F, _ in res.history) <= min(grid) * (1 + 1e-9)
    assert res.after < res.before


def test_never_worse_than_the_start(tiny):
    """Optimising from an optimised allocation keeps it (or improves within tolerance), and
    the exact shares written sum to one with every measured query above its floor."""
    schema, h, inv = tiny
    obj = Objective((Target("L2", "detailed", 1.0, 2.0),))
    first = optimise_allocation(h, schema, obj, inv, floor=0.1, tolerance=1e-6)
    again = optimise_allocation(h, schema, obj, inv, start=first.allocation, floor=0.5)
    assert again.after <= again.before == pytest.approx(first.after, rel=1e-12)
    a = first.allocation
    assert sum(a.levels.values()) == 1 and all(sum(q) == 1 for q in a.queries.values())
    rhos = {(lvl, t): r for lvl, t, r in a.query_rhos(schema.strategy)}
    start = {(lvl, t): r for lvl, t, r in schema.allocation.query_rhos(schema.strategy)}
    assert rhos.keys() == start.keys() and sum(rhos.values()) == a.rho
    assert all(rhos[k] >= start[k] * Fraction(1, 10) * (1 - 1e-6) for k in start)


def test_allocation_from_shares_is_exact():
    schema = Schema.load("pl94")
    x = np.array([float(s) for *_, s in _queries(schema, schema.allocation)])
    a = allocation_from_shares(schema, schema.allocation, x)
    assert a.rho == schema.allocation.rho and sum(a.levels.values()) == 1
    got = np.array([float(r / a.rho) for *_, r in a.query_rhos(schema.strategy)])
    np.testing.assert_allclose(got, x, rtol=1e-6)


def test_refusals(tiny):
    schema, h, inv = tiny
    with pytest.raises(SpecError, match="unknown level"):
        evaluate_allocation(h, schema, schema.allocation, Objective((Target("L9", "sex"),)), inv)
    with pytest.raises(SpecError, match="'sum' or 'max'"):
        Objective((Target("L1", "sex"),), kind="mean")
    with pytest.raises(SpecError, match="floor"):
        optimise_allocation(h, schema, Objective((Target("L1", "sex"),)), inv, floor=1.0)
    # a target no measurement identifies: "band" at L1 when only totals are measured there
    only_total = Allocation(Fraction(1), {"L1": Fraction(1)}, {"L1": (Fraction(1), 0, 0)})
    with pytest.raises(SpecError, match="not identified"):
        evaluate_allocation(h, schema, only_total, Objective((Target("L1", "band"),)), inv)
