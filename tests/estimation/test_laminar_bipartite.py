"""The flat "bipartite" rounding on the compiled kernel: every leaf parent's (children × cells)
matrix in one :func:`controlled_round` call (one group per parent, uniforms keyed by global
row), checked against a matrix-by-matrix reference, and its law re-tested: every cell
⌊x⌋/⌈x⌉, leaf totals, parent cells and parent totals within floor/ceil (exact when integer),
unbiased within 4 standard errors, and the variances :func:`bipartite_variances` reports
matched by simulation — with the power to reject a wrong law in both."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.estimation.integer.laminar import (
    TOL,
    bipartite_variances,
    controlled_round,
    round_bipartite,
    rounding_variance,
    tracked_sums,
)
from censusdp.hierarchy.forest import whole_forest
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.rng import KeyedRNG

Z = 4.9  # two-sided normal quantile at α = 1e-6


def _groups(seed: int, sizes: list[int], K: int, hold: str) -> np.ndarray:
    """Stacked matrices of large values (lognormal magnitudes, real fractions); ``hold``
    makes each group's rows, columns or total integers in exact arithmetic."""
    g = np.random.default_rng(seed)
    out = []
    for n in sizes:
        f = g.uniform(0.0, 1.0, (n, K))
        if hold == "rows":
            f[:, -1] = 0.0
            f[:, -1] = (np.ceil(f.sum(1)) - f.sum(1)) % 1.0
        elif hold == "cols" and n:
            f[-1] = 0.0
            f[-1] = (np.ceil(f.sum(0)) - f.sum(0)) % 1.0
        elif hold == "total" and n:
            f[-1, -1] = 0.0
            f[-1, -1] = (math.ceil(f.sum()) - f.sum()) % 1.0
        out.append(np.floor(g.lognormal(9.0, 2.0, (n, K))) + f)
    return np.concatenate(out, axis=0)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    K=st.integers(1, 9),
    hold=st.sampled_from(("none", "rows", "cols", "total")),
)
def test_all_groups_at_once_equal_each_group_alone(seed, sizes, K, hold):
    """The vectorised bookkeeping (segmented sums, held lines, argmax) gives each group what
    a call with that group alone and its own rows of the uniforms gives."""
    x = _groups(seed, sizes, K, hold)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    u = np.random.default_rng(seed).random((x.shape[0] + len(sizes), K + 2))
    got = controlled_round(x, u, TOL, starts)
    for g, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        alone = controlled_round(x[a:b], u[a + g : b + g + 1], TOL)
        assert np.array_equal(got[a:b], alone), g


def _problem():
    gen = np.random.default_rng(7)
    h = random_hierarchy(gen, [(2, 2), (3, 5)])
    K = 4
    x = gen.integers(0, 9, size=(h.leaves.size, K)) + gen.uniform(0, 1, (h.leaves.size, K))
    par = h.leaves.parent
    x[h.levels[1].child_start, 0] -= np.bincount(par, x.sum(1)) % 1.0  # parent totals held
    return h, x


def _variance_z(samples: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|sample variance − want| over the sample variance's standard error (per column)."""
    s2 = samples.var(0, ddof=1)
    c = samples - samples.mean(0)
    se = np.sqrt(np.maximum((c**4).mean(0) - s2**2, 0.0) / samples.shape[0])
    return np.abs(s2 - want) / np.maximum(se, 1e-12)


def _within(got: np.ndarray, real: np.ndarray) -> bool:
    return bool(np.all((got >= np.floor(real + 1e-9)) & (got <= np.ceil(real - 1e-9))))


def test_bipartite_law_unbiased_and_its_variances_by_simulation():
    h, x = _problem()
    real = h.aggregate(x)
    rng = KeyedRNG.reproducible(5, warn=False)
    R = 3000
    draws = [round_bipartite(h, x, rng.child(str(r))) for r in range(R)]
    for got in draws:
        assert np.all((got[-1] == np.floor(x)) | (got[-1] == np.ceil(x)))
        assert _within(got[-1].sum(1), real[-1].sum(1))  # each leaf's total
        assert _within(got[1], real[1])  # each parent's cells
        assert np.array_equal(got[1].sum(1), np.rint(real[1].sum(1)).astype(np.int64))
    leaves = np.stack([d[-1] for d in draws]).astype(float)
    se = np.sqrt(rounding_variance(x) / R)
    mean = leaves.mean(0)
    assert np.all(np.abs(mean - x) < 4 * se + 1e-12)  # unbiased within 4 SE
    wrong = x + 0.05 * (x - np.floor(x) < 0.95)  # fractions off by 0.05: rejected (power)
    assert np.any(np.abs(mean - wrong) > 4 * se)

    masks, _ = tracked_sums([f"c{j}" for j in range(x.shape[1])])
    par, leaf = bipartite_variances(x, real[1], masks, TOL)
    rv = [*whole_forest(h, 0, h.depth - 2).aggregate(par), leaf]
    # the nation's cells: sums of the independently rounded parents' cells
    nation = np.stack([d[0][0] for d in draws]).astype(float)
    K = x.shape[1]
    assert np.all(_variance_z(nation, rv[0][0, :K]) < Z)
    # power: independent rounding of every leaf cell would give Σ f(1 − f) over the leaves
    assert np.any(_variance_z(nation, rounding_variance(x).sum(0)) > Z)
    # leaf totals and parent cells: within floor/ceil, so variance f(1 − f) (reported)
    assert np.all(_variance_z(leaves.sum(2), rv[-1][:, K]) < Z)
    parents = np.stack([d[1] for d in draws]).astype(float)
    assert np.all(_variance_z(parents, rv[1][:, :K]) < Z)
