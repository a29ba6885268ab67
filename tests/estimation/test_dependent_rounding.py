"""Dependent rounding of bipartite matrices (estimation.dependent_rounding).

A slow, obvious pure-Python reference of the same cycle cancelling is enumerated exactly on
tiny matrices (every branch with its probability): its marginals are ``p`` and every
outcome has exact column sums and floor/ceiling row sums; the compiled kernel gives the
reference's bits for the same uniforms. A fixed-seed test at α = 1e-6 checks unbiasedness on a
larger matrix and has power against a 30% mis-scaled target.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from censusdp.errors import DataError
from censusdp.estimation.integer.dependent import (
    DR_TOL,
    dependent_round,
    keyed_uniforms,
    settle_margins,
)
from censusdp.rng import KeyedRNG

ALPHA = 1e-6


def _matrices(draw, max_groups=3, max_rows=4, max_cols=4, denom=None):
    """Groups of probabilities whose column sums are integers: random rows, the last row of
    each group completing every column to the next integer (in [0, 1) by construction)."""
    n_groups = draw(st.integers(1, max_groups))
    K = draw(st.integers(1, max_cols))
    sizes = [draw(st.integers(1, max_rows)) for _ in range(n_groups)]
    seed = draw(st.integers(0, 2**31 - 1))
    gen = np.random.default_rng(seed)
    blocks = []
    for n in sizes:
        if denom:
            B = gen.integers(0, denom + 1, size=(n, K)) / denom
        else:
            B = gen.random((n, K))
            whole = gen.random((n, K)) < 0.2  # some entries already 0 or 1
            B[whole] = gen.integers(0, 2, size=int(whole.sum()))
        s = B[:-1].sum(axis=0)
        B[-1] = np.ceil(s - DR_TOL) - s if n > 1 else np.round(B[-1])
        B[-1] = np.where(np.abs(B[-1]) < 1e-12, 0.0, B[-1])
        blocks.append(B)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return np.vstack(blocks), starts


@st.composite
def matrices(draw, **kw):
    return _matrices(draw, **kw)


def _snap(w):
    return 0.0 if w <= DR_TOL else (1.0 if w >= 1.0 - DR_TOL else w)


def _fr(w):
    return DR_TOL < w < 1.0 - DR_TOL


def _sweep(W, decide):
    """The kernel's row-pair sweeps in plain Python."""
    n, m = len(W), len(W[0])
    for a in range(n):
        cols = [j for j in range(m) if _fr(W[a][j])]
        for b in range(a + 1, n):
            if len(cols) <= 4:
                break
            c = None
            for j in cols:
                if not (_fr(W[a][j]) and _fr(W[b][j])):
                    continue
                if c is None:
                    c = j
                    continue
                ac, bc, wa, wb = W[a][c], W[b][c], W[a][j], W[b][j]
                alpha = min(1 - ac, bc, 1 - wb, wa)
                beta = min(ac, 1 - bc, wb, 1 - wa)
                step = alpha if decide(alpha, beta) else -beta
                W[a][c], W[b][c] = _snap(ac + step), _snap(bc - step)
                W[b][j], W[a][j] = _snap(wb + step), _snap(wa - step)
                if not (0 < W[a][c] < 1 and 0 < W[b][c] < 1):
                    c = j if (0 < W[a][j] < 1 and 0 < W[b][j] < 1) else None
            cols = [j for j in cols if _fr(W[a][j])]


def _reference(W, decide):
    """The kernel in plain Python on one bordered group ``W`` (a list of lists, modified):
    the sweeps, then the walk; ``decide(alpha, beta)`` returns True for the step ``+α``."""
    _sweep(W, decide)
    n, m = len(W), len(W[0])

    def frac(i, j):
        return DR_TOL < W[i][j] < 1.0 - DR_TOL

    def nbrs(v):  # fractional entries at vertex v in index order, as vertices
        if v < n:
            return [n + j for j in range(m) if frac(v, j)]
        return [i for i in range(n) if frac(i, v - n)]

    def entry(a, b):
        return (a, b - n) if a < n else (b, a - n)

    for r0 in range(n):
        stack = [r0]
        while stack:
            v = stack[-1]
            here = nbrs(v)
            if not here:
                stack.pop()
                continue
            nxt = None
            if len(stack) >= 4 and frac(*entry(v, stack[-4])):
                nxt = stack[-4]
            if nxt is None:
                prev = stack[-2] if len(stack) > 1 else None
                nxt = next(u for u in here if u != prev)
            if nxt not in stack:
                stack.append(nxt)
                continue
            p0 = stack.index(nxt)
            cyc = stack[p0:] + [nxt]
            edges = [entry(a, b) for a, b in zip(cyc[:-1], cyc[1:], strict=True)]
            plus, minus = edges[0::2], edges[1::2]
            alpha = min([1.0 - W[i][j] for i, j in plus] + [W[i][j] for i, j in minus])
            beta = min([W[i][j] for i, j in plus] + [1.0 - W[i][j] for i, j in minus])
            step = alpha if decide(alpha, beta) else -beta
            for t, (i, j) in enumerate(edges):
                W[i][j] += step if t % 2 == 0 else -step
            del stack[p0 + 1 :]
    return [[1 if w > 0.5 else 0 for w in row] for row in W]


def _bordered(P):
    B = []
    for row in P.tolist():
        r = sum(row)
        s = np.ceil(r - DR_TOL) - r
        B.append([*row, max(s, 0.0)])
    return B


class _Branch(Exception):
    """The reference reached a decision the enumeration has not fixed yet."""


def _enumerate(P):
    """Exact law of the reference's bits on one group: {bits: probability}, exploring both
    outcomes of every cycle's step with probabilities β/(α + β) and α/(α + β) as fractions."""
    law: dict[tuple, Fraction] = {}

    def explore(path):
        taken = iter(path)
        pr = [Fraction(1)]

        def decide(a, b):
            up = next(taken, None)
            if up is None:
                raise _Branch
            fa, fb = Fraction(a), Fraction(b)
            pr[0] *= (fb if up else fa) / (fa + fb)
            return up

        try:
            bits = _reference(_bordered(P), decide)
        except _Branch:
            explore([*path, True])
            explore([*path, False])
            return
        key = tuple(tuple(r[:-1]) for r in bits)
        law[key] = law.get(key, Fraction(0)) + pr[0]

    explore([])
    return law


@settings(max_examples=40, deadline=None, derandomize=True)
@given(case=matrices(max_groups=1, max_rows=3, max_cols=6))
@example(case=(np.array([[0.3, 0.6, 0.2, 0.9, 0.5, 0.45], [0.7, 0.4, 0.8, 0.1, 0.5, 0.55]]), None))
def test_exact_law_of_the_reference_has_marginals_p_and_controlled_sums(case):
    P, _ = case
    assume(P.shape[0] * (P.shape[1] + 1) <= 14)  # both the sweeps and the walk, enumerable
    law = _enumerate(P)
    assert abs(float(sum(law.values())) - 1.0) < 1e-12
    mean = sum((np.array(b, float) * float(q) for b, q in law.items()), np.zeros(P.shape))
    np.testing.assert_allclose(mean, P, atol=1e-9)
    r = P.sum(axis=1)
    for bits in law:
        Z = np.array(bits)
        assert np.array_equal(Z.sum(axis=0), np.round(P.sum(axis=0)).astype(int))
        assert np.all(
            (Z.sum(axis=1) == np.floor(r + DR_TOL)) | (Z.sum(axis=1) == np.ceil(r - DR_TOL))
        )


@settings(max_examples=80, deadline=None, derandomize=True)
@given(case=matrices(max_rows=6, max_cols=9), seed=st.integers(0, 2**31 - 1))
def test_kernel_gives_the_reference_bits_and_controlled_sums(case, seed):
    P, starts = case
    U = np.random.default_rng(seed).random((P.shape[0], P.shape[1] + 1))
    Z = dependent_round(P, starts, U)
    assert Z.dtype == np.int8
    for g, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        u = iter(U[a:b].reshape(-1).tolist())
        ref = _reference(_bordered(P[a:b]), lambda al, be, u=u: next(u) * (al + be) < be)
        assert np.array_equal(Z[a:b], np.array(ref)[:, :-1]), g
        assert np.array_equal(Z[a:b].sum(axis=0), np.round(P[a:b].sum(axis=0)).astype(int))
        r, z = P[a:b].sum(axis=1), Z[a:b].sum(axis=1)
        assert np.all((z == np.floor(r + DR_TOL)) | (z == np.ceil(r - DR_TOL)))
    # integral entries stay put
    fixed = (P <= DR_TOL) | (P >= 1 - DR_TOL)
    assert np.array_equal(Z[fixed], np.round(P[fixed]).astype(np.int8))


def test_groups_are_independent_of_the_split():
    gen = np.random.default_rng(3)
    P = gen.random((12, 7))
    starts = np.array([0, 3, 7, 12])
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        s = P[a : b - 1].sum(axis=0)
        P[b - 1] = np.ceil(s) - s
    U = gen.random((12, 8))
    whole = dependent_round(P, starts, U)
    parts = np.vstack(
        [
            dependent_round(P[a:b], np.array([0, b - a]), U[a:b])
            for a, b in zip(starts[:-1], starts[1:], strict=True)
        ]
    )
    assert np.array_equal(whole, parts)


def _mc(P, starts, reps, seed):
    gen = np.random.default_rng(seed)
    acc = np.zeros(P.shape)
    for _ in range(reps):
        acc += dependent_round(P, starts, gen.random((P.shape[0], P.shape[1] + 1)))
    return acc / reps


def test_unbiased_at_alpha_1e6_with_power():
    gen = np.random.default_rng(7)
    n, K = 6, 10
    P = gen.random((n, K))
    s = P[:-1].sum(axis=0)
    P[-1] = np.ceil(s) - s
    starts = np.array([0, n])
    reps = 4000
    mean = _mc(P, starts, reps, 11)
    se = np.sqrt(np.maximum(P * (1 - P), 1e-12) / reps)
    crit = norm.isf(ALPHA / (2 * P.size))  # Bonferroni over the entries
    z = (mean - P) / se
    assert np.abs(z).max() < crit
    # power: the same test rejects a target 30% off (the max |z| over the entries)
    wrong = 0.7 * P
    assert np.abs((mean - wrong) / se).max() > crit


def test_keyed_uniforms_do_not_depend_on_the_range():
    rng = KeyedRNG.reproducible(4, warn=False)
    whole = keyed_uniforms(rng, "t/dr", 10, 0, 10, 5)
    assert whole.shape == (10, 6)
    assert np.array_equal(whole[3:7], keyed_uniforms(rng, "t/dr", 10, 3, 7, 5))


def test_keyed_uniforms_into_out_are_the_same_draws_across_chunks():
    """Drawn into ``out`` chunk by chunk (rows 20..70 of 2,001 cells span four 65,536-item
    chunks, both ends inside one): the same bits as the one-array draw; an ``out`` that is
    not a C-contiguous block of the right size is refused."""
    rng = KeyedRNG.reproducible(5, warn=False)
    want = keyed_uniforms(rng, "t/out", 100, 20, 70, 2000)
    out = np.full((50, 2001), np.nan)
    got = keyed_uniforms(rng, "t/out", 100, 20, 70, 2000, out=out)
    assert got is out and np.array_equal(out, want)
    with pytest.raises(DataError, match="C-contiguous with 100050 entries"):
        keyed_uniforms(rng, "t/out", 100, 20, 70, 2000, out=np.empty((2001, 50)).T)


def test_refusals_name_what_is_wrong():
    P = np.array([[0.5, 0.5], [0.25, 0.5]])  # column 0 sums to 0.75
    with pytest.raises(DataError, match="group 0, column 0"):
        dependent_round(P, np.array([0, 2]), np.zeros((2, 3)))
    with pytest.raises(DataError, match="uniforms of shape"):
        dependent_round(P, np.array([0, 2]), np.zeros((2, 2)))
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        dependent_round(P * 3, np.array([0, 2]), np.zeros((2, 3)))
    with pytest.raises(DataError, match="group starts"):
        dependent_round(P, np.array([0, 1]), np.zeros((2, 3)))


def _integer_margin_fractions(rng, sizes, n_cols):
    """Bits shifted along random 4-cycles within each group: entries in [0, 1], every row
    sum and every group's column sums the bits' integers."""
    p = (rng.random((sum(sizes), n_cols)) < 0.5).astype(float)
    lo = 0
    for n in sizes:
        for _ in range(20 * n * n_cols if n > 1 else 0):
            a, b = lo + rng.choice(n, 2, replace=False)
            c, d = rng.choice(n_cols, 2, replace=False)
            up = min(1 - p[a, c], p[b, c], 1 - p[b, d], p[a, d])
            down = min(p[a, c], 1 - p[b, c], p[b, d], 1 - p[a, d])
            delta = rng.uniform(-down, up)
            p[a, c] += delta
            p[b, c] -= delta
            p[b, d] += delta
            p[a, d] -= delta
        lo += n
    return p


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    n_cols=st.integers(2, 12),
    noise=st.sampled_from([0.0, 1e-9, 1e-7, 1e-5]),
    seed=st.integers(0, 2**32 - 1),
)
def test_settled_margins_round_without_a_stranded_entry(sizes, n_cols, noise, seed):
    """Fractions whose line sums miss their integers by a solver's residual are moved by
    about that residual onto integer lines, and then round with both margins exact."""
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    p = _integer_margin_fractions(rng, sizes, n_cols)
    rows = np.round(p.sum(axis=1))
    cols = np.stack(
        [np.round(p[a:b].sum(axis=0)) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    )
    q = np.clip(p + noise * rng.standard_normal(p.shape), 0.0, 1.0)
    before = q.copy()
    assert settle_margins(q, starts, rows, cols) < 1e-12
    assert np.all((q >= 0.0) & (q <= 1.0))
    assert np.max(np.abs(q - before)) <= 100 * noise * (n_cols + max(sizes)) + 1e-12
    z = dependent_round(q, starts, rng.random((q.shape[0], n_cols + 1)))
    for g, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        np.testing.assert_array_equal(z[a:b].sum(axis=0), cols[g])
    np.testing.assert_array_equal(z.sum(axis=1), rows)
