"""Contradictory invariants are refused before estimating (a DataError naming the level,
the node and the invariants), exactly — against a dense rational-rank reference."""

from __future__ import annotations

import flint
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError
from censusdp.estimation.gls.tree import check_invariants, tree_gls
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.queries import Invariant, Measurement, Query, invariant

CELLS = ["a", "b", "c"]
PRIVACY = PrivacyStatement("zcdp", rho=1.0, invariants=("state: total", "county: total"))


def _tree() -> Hierarchy:
    return Hierarchy.from_parents(
        ["nation", "state", "county"],
        [["US"], ["S0", "S1"], ["S0C0", "S0C1", "S1C0", "S1C1", "S1C2"]],
        [None, np.zeros(2, int), np.array([0, 0, 1, 1, 1])],
    )


def _counts(h: Hierarchy, scale: int = 100) -> list[np.ndarray]:
    gen = np.random.default_rng(5)
    return h.aggregate(gen.integers(0, scale, size=(h.leaves.size, len(CELLS))))


def _meas(h, counts):
    q = Query.detailed(CELLS)
    return [Measurement(2, q, counts[2].astype(float) + 0.5, Gaussian(1.0))]


def test_consistent_invariants_pass_including_redundant_ones():
    h = _tree()
    counts = _counts(h)
    invs = [
        invariant(counts, 0, Query.total(CELLS)),  # implied by the state totals
        invariant(counts, 1, Query.total(CELLS)),
        invariant(counts, 1, Query.detailed(CELLS)),
        invariant(counts, 2, Query.total(CELLS)),
    ]
    check_invariants(h, invs)
    rel = tree_gls(h, CELLS, _meas(h, counts), invs, PRIVACY)
    np.testing.assert_allclose(rel.estimates[1], counts[1], rtol=0, atol=1e-9)


def test_state_total_contradicting_its_counties_is_refused_before_estimating():
    h = _tree()
    counts = _counts(h, scale=10**9)
    state = invariant(counts, 1, Query.total(CELLS))
    wrong = Invariant(1, state.query, state.values + np.array([[0], [1]]))  # S1 off by one
    county = invariant(counts, 2, Query.total(CELLS))
    with pytest.raises(DataError) as info:
        tree_gls(h, CELLS, _meas(h, counts), [wrong, county], PRIVACY)
    msg = str(info.value)
    assert "node 'S1' of level 'state'" in msg
    assert "state: total" in msg and "county: total (summed)" in msg
    assert not any(str(int(v)) in msg for v in wrong.values.ravel())


def test_two_invariants_of_one_level_disagreeing_are_refused():
    h = _tree()
    counts = _counts(h)
    detailed = invariant(counts, 1, Query.detailed(CELLS))
    total = invariant(counts, 1, Query.total(CELLS))
    bad = Invariant(1, total.query, total.values - np.array([[1], [0]]))
    with pytest.raises(
        DataError, match=r"node 'S0' of level 'state': state: detailed, state: total"
    ):
        tree_gls(h, CELLS, _meas(h, counts), [detailed, bad], PRIVACY)


def test_real_valued_invariants_use_a_relative_tolerance():
    h = _tree()
    counts = [c.astype(float) * 0.1 for c in _counts(h)]
    state = Invariant(1, Query.total(CELLS), counts[1].sum(axis=1, keepdims=True))
    county = Invariant(2, Query.total(CELLS), counts[2].sum(axis=1, keepdims=True))
    check_invariants(h, [state, county])
    off = Invariant(1, state.query, state.values + 1e-3)
    with pytest.raises(DataError, match="contradict"):
        check_invariants(h, [off, county])


def _dense_consistent(h: Hierarchy, invs: list[Invariant], K: int) -> bool:
    """Slow obvious reference: rank [C] == rank [C | t] over the leaf cells, rationally."""
    n = h.leaves.size
    rows, rhs = [], []
    for inv in invs:
        anc = h.ancestor_index(h.depth - 1, inv.level)
        for v in range(h.levels[inv.level].size):
            under = np.flatnonzero(anc == v)
            for r in range(inv.query.n_rows):
                row = np.zeros((n, K), dtype=np.int64)
                row[under] = inv.query.matrix[r]
                rows.append(row.ravel().tolist())
                rhs.append(int(inv.values[v, r]))
    c = flint.fmpz_mat(rows)
    augmented = flint.fmpz_mat([r + [t] for r, t in zip(rows, rhs, strict=True)])
    return c.rank() == augmented.rank()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    K=st.integers(1, 3),
    picks=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=5),
    delta=st.integers(-1, 1),
)
def test_refused_exactly_when_the_dense_system_has_no_solution(seed, K, picks, delta):
    gen = np.random.default_rng(seed)
    h = random_hierarchy(gen, [(1, 3), (1, 3), (1, 2)])
    cells = [f"c{i}" for i in range(K)]
    marg = Query("first", np.eye(K, dtype=np.int64)[:1], ("first",))
    qs = [Query.total(cells), Query.detailed(cells), marg]
    counts = h.aggregate(gen.integers(0, 20, size=(h.leaves.size, K)))
    invs = [invariant(counts, lvl, qs[q]) for lvl, q in dict.fromkeys(picks)]
    target = invs[int(gen.integers(len(invs)))]
    values = target.values.copy()
    values[int(gen.integers(values.shape[0])), int(gen.integers(values.shape[1]))] += delta
    invs[invs.index(target)] = Invariant(target.level, target.query, values)
    if _dense_consistent(h, invs, K):
        check_invariants(h, invs)
    else:
        with pytest.raises(DataError, match="contradict"):
            check_invariants(h, invs)
