"""The capped-simplex projection against an exhaustive search over the faces of the QP."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.errors import DataError
from censusdp.estimation.integer.capped_simplex import project_capped_simplex


def _faces(z: np.ndarray, cap: np.ndarray, total: float) -> np.ndarray:
    """argmin ‖x − z‖² over {0 ≤ x ≤ cap, Σ x = total} by trying every face: each value at
    0, at its cap or free (the free ones share one shift, the stationarity condition of the
    face); the best feasible point of all 3^m faces is the minimum (a convex QP attains it
    on some face). Slow and obvious."""
    best, arg = np.inf, None
    for state in itertools.product(range(3), repeat=z.size):
        s = np.asarray(state)
        fixed = np.where(s == 2, cap, 0.0)
        free = s == 1
        if free.any():
            shift = (z[free].sum() + fixed[~free].sum() - total) / free.sum()
            x = np.where(free, z - shift, fixed)
        else:
            x = fixed
        if abs(x.sum() - total) > 1e-9 or (x < -1e-12).any() or (x > cap + 1e-12).any():
            continue
        d = float(((x - z) ** 2).sum())
        if d < best:
            best, arg = d, x
    assert arg is not None
    return arg


@st.composite
def groups(draw):
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    zs, caps, totals = [], [], []
    for m in sizes:
        cap = draw(st.lists(st.integers(0, 5), min_size=m, max_size=m))
        z = draw(st.lists(st.floats(-6, 9, allow_nan=False, width=32), min_size=m, max_size=m))
        totals.append(draw(st.integers(0, sum(cap))))
        zs += z
        caps += cap
    return np.asarray(zs, float), np.asarray(caps, float), np.asarray(totals, float), sizes


@settings(max_examples=30, deadline=None)
@given(groups())
def test_projection_equals_the_exhaustive_search(problem) -> None:
    z, cap, total, sizes = problem
    x = project_capped_simplex(z, cap, total, np.asarray(sizes))
    lo = 0
    for p, m in enumerate(sizes):  # the slow reference, group by group
        want = _faces(z[lo : lo + m], cap[lo : lo + m], total[p])
        assert np.allclose(x[lo : lo + m], want, rtol=0, atol=1e-9)
        assert abs(x[lo : lo + m].sum() - total[p]) < 1e-9
        lo += m
    assert ((x >= 0) & (x <= cap)).all()


def test_a_large_level_meets_every_target_and_bound() -> None:
    gen = np.random.default_rng(7)
    count = gen.integers(1, 40, 3000)
    cap = gen.integers(0, 30, int(count.sum())).astype(float)
    grp = np.repeat(np.arange(count.size), count)
    room = np.bincount(grp, weights=cap)
    total = np.floor(gen.random(count.size) * (room + 1)).clip(max=room)
    z = gen.normal(cap * 0.8, 4.0)
    x = project_capped_simplex(z, cap, total, count)
    assert ((x >= 0) & (x <= cap)).all()
    assert np.abs(np.bincount(grp, weights=x) - total).max() < 1e-9 * max(1.0, room.max())
    # the KKT conditions: one shift per group, x = clip(z − θ, 0, cap)
    free = (x > 0) & (x < cap)
    theta = np.bincount(grp, weights=np.where(free, z - x, 0.0)) / np.maximum(
        np.bincount(grp, weights=free), 1
    )
    ok = np.bincount(grp, weights=free) > 0
    assert np.allclose(x[ok[grp]], np.clip(z - theta[grp], 0, cap)[ok[grp]], atol=1e-9)


def test_an_infeasible_target_is_a_data_error_naming_the_group() -> None:
    with pytest.raises(DataError, match="group 1: the target must lie in"):
        project_capped_simplex(
            np.zeros(3), np.array([1.0, 1.0, 2.0]), np.array([1.0, 3.0]), np.array([2, 1])
        )
