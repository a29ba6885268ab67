"""The rounding module's shared kernels, on their own: the fractional split, the invariant
rows and the laminarity check that the schema rounding reuses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.errors import SpecError
from censusdp.estimation.integer.laminar import TOL, check_laminar, invariant_rows, split_fraction
from censusdp.mechanisms.queries import Invariant, Query

CELLS = ["a", "b", "c", "d"]
NAMES = ["nation", "state", "county"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=30))
def test_split_fraction_is_floor_and_fraction_with_snapping(values):
    v = np.array(values)
    base, frac = split_fraction(v, TOL)
    assert base.dtype == np.int64
    assert ((frac >= 0) & (frac < 1)).all()
    assert np.allclose(base + frac, v, atol=2 * TOL, rtol=0)
    near = np.abs(v - np.round(v)) < TOL / 2  # within tol of an integer: no fraction left
    assert (frac[near] == 0).all() and (base[near] == np.round(v[near])).all()


def _invariant(level: int, query: Query) -> Invariant:
    return Invariant(level, query, np.zeros((1, query.matrix.shape[0])))


def test_invariant_rows_lists_each_row_as_a_cell_set():
    marg = Query.marginal("ab_cd", CELLS, {"ab": ["a", "b"], "cd": ["c", "d"]})
    rows = invariant_rows(NAMES, CELLS, [_invariant(1, marg), _invariant(0, Query.total(CELLS))])
    assert [(lv, r.tolist()) for lv, r, _ in rows] == [
        (1, [True, True, False, False]),
        (1, [False, False, True, True]),
        (0, [True, True, True, True]),
    ]


def test_invariant_rows_refuses_a_level_outside_and_a_signed_query():
    with pytest.raises(SpecError, match="level 3"):
        invariant_rows(NAMES, CELLS, [_invariant(3, Query.total(CELLS))])
    signed = Query("diff", np.array([[1.0, -1.0, 0.0, 0.0]]), ("a - b",))
    with pytest.raises(SpecError, match="0/1 query"):
        invariant_rows(NAMES, CELLS, [_invariant(1, signed)])


def test_check_laminar_accepts_nested_sets_and_refuses_crossing_ones():
    total = _invariant(0, Query.total(CELLS))
    halves = _invariant(1, Query.marginal("h", CELLS, {"ab": ["a", "b"], "cd": ["c", "d"]}))
    check_laminar(NAMES, invariant_rows(NAMES, CELLS, [total, halves]))  # nested: fine
    crossing = _invariant(1, Query.marginal("x", CELLS, {"bc": ["b", "c"], "ad": ["a", "d"]}))
    with pytest.raises(SpecError, match="laminar"):
        check_laminar(NAMES, invariant_rows(NAMES, CELLS, [halves, crossing]))
