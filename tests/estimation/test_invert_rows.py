"""invert_rows, the inverse-CDF kernel of both line families, against a slow reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.estimation.conditioning.line_conditional import invert_rows


def _reference(p: np.ndarray, ok: np.ndarray, u: float) -> int:
    """One row, by a Python scan: the first j whose running mass exceeds u·total, then back
    to the last support entry at or before it (0 if none)."""
    total = float(np.cumsum(p)[-1])
    run, j = 0.0, len(p) - 1
    for k, x in enumerate(p):
        run += x
        if run > u * total:
            j = k
            break
    while j > 0 and not ok[j]:
        j -= 1
    return j


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from([0.0, 0.0, 1e-300, 0.25, 1.0, 3.0]), min_size=4, max_size=4),
            st.floats(0.0, 1.0, exclude_max=True),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_matches_the_reference(rows):
    p = np.array([r[0] for r in rows])
    u = np.array([r[1] for r in rows])
    ok = p > 0
    j, cdf, target = invert_rows(p, ok, u)
    assert j.tolist() == [_reference(p[i], ok[i], u[i]) for i in range(len(rows))]
    assert np.array_equal(cdf, np.cumsum(p, axis=1)) and np.array_equal(target, u * cdf[:, -1])


def test_never_lands_off_the_support_and_is_monotone_in_u():
    p = np.array([[0.5, 0.0, 0.5, 0.0]] * 5)
    u = np.array([0.0, 0.49, 0.5, 0.99, 1 - 1e-16])
    j, _, _ = invert_rows(p, p > 0, u)
    assert j.tolist() == [0, 0, 2, 2, 2]
    # power: without the support mask the last rows would land on the empty entry 3
    k, _, _ = invert_rows(p, np.ones_like(p, bool), np.array([1.0] * 5))
    assert k.tolist() == [3] * 5
