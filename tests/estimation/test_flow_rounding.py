"""The flow rounding below the cut and its variance bounds (estimation.structured_rounding,
estimation.dependent_rounding.flow_round).

Fixed-seed statistical tests at α = 1e-6 (Bonferroni over every tested mean) that also show
power against a deliberately wrong law; exact ``==`` for integrality, conservation and the
floor/ceiling of every node total; the variance formulas checked for equality with their
exact values where they are exact, and against an independent computation elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

import censusdp.estimation.integer.controlled as sr
from censusdp.errors import DataError
from censusdp.estimation.gls.tree import Forest
from censusdp.estimation.integer.controlled import (
    PartitionOptions,
    fresh_variance_bound,
    round_children,
    round_structured_partition,
    total_variance_bound,
)
from censusdp.estimation.integer.dependent import flow_round
from censusdp.hierarchy import Hierarchy
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

ALPHA = 1e-6
#: The rounding below a cut whose bits are pairwise non-positively correlated.
NEGATIVE = PartitionOptions(negative=True)


def _z(m: int) -> float:
    return float(norm.isf(ALPHA / (2 * m)))


# -- the kernel ------------------------------------------------------------------------------
def _triangle_network(C: int, gen):
    """C components, each a 2 × 3 transport network (2 sources, 3 sinks, each source's
    supply and each sink's demand integral), as arcs source i → sink j."""
    f = gen.uniform(0.05, 0.95, (2, 3))
    f[1] = 1.0 - f[0]  # every sink's demand 1, sources' supplies f[0].sum(), 3 − that
    # make the sources' supplies integral: shift mass along one column pair
    s = f[0].sum() - np.floor(f[0].sum())
    f[0, 0] -= s / 2
    f[0, 1] -= s / 2
    f[1, 0] += s / 2
    f[1, 1] += s / 2
    assert np.all((f > 0) & (f < 1))
    i, j = np.meshgrid(np.arange(2), np.arange(3), indexing="ij")
    tail = (np.arange(C)[:, None] * 5 + i.reshape(-1)).reshape(-1)
    head = (np.arange(C)[:, None] * 5 + 2 + j.reshape(-1)).reshape(-1)
    frac = np.tile(f.reshape(-1), C)
    starts = np.arange(C + 1) * 6
    return tail, head, frac, starts, f


def _kernel_z(uniforms) -> float:
    gen = np.random.default_rng(5)
    C = 20_000
    tail, head, frac, starts, f = _triangle_network(C, gen)
    bits = flow_round(tail, head, frac, starts, starts[:-1], uniforms(C * 6))
    b = bits.reshape(C, 2, 3).astype(np.int64)
    # every source's supply and every sink's demand exactly kept
    assert np.all(b.sum(axis=2) == np.rint(f.sum(axis=1)))
    assert np.all(b.sum(axis=1) == 1)
    m = b.mean(axis=0)
    return float((np.abs(m - f) / np.sqrt(f * (1 - f) / C)).max())


def test_flow_kernel_keeps_every_balance_and_is_unbiased():
    gen = np.random.default_rng(6)
    assert _kernel_z(lambda n: gen.random(n)) < _z(6)


def test_flow_kernel_test_has_power_against_skewed_uniforms():
    gen = np.random.default_rng(6)
    assert _kernel_z(lambda n: gen.random(n) ** 1.5) > _z(6)


def test_flow_kernel_refuses_a_fractional_balance():
    with pytest.raises(DataError, match="vertex .* not an integer"):
        flow_round([0, 0], [1, 2], [0.5, 0.3], [0, 2], [0], np.zeros(2))


def _matrix_network(C: int, n: int, K: int, gen):
    """C components, each a parent's (n children × (total, K cells)) matrix as below the cut:
    per child its total arc P → R_i and cell arcs R_i → C_c (one matrix row), then the cells'
    arcs C_c → S and a return arc S → P, every balance integral. Returns the arcs, the
    matrices' starts and the fractions."""
    m = K + 1
    V = 2 + n + K
    p = gen.uniform(0.02, 0.98, (C, n, K))
    t = p.sum(axis=2) % 1.0  # the children's totals' fractions
    q = p.sum(axis=1) % 1.0  # the cells'
    r = q.sum(axis=1) % 1.0  # the return arc's
    rows_t = np.empty((n, m), np.int64)
    rows_h = np.empty((n, m), np.int64)
    rows_t[:, 0], rows_h[:, 0] = 0, 2 + np.arange(n)
    rows_t[:, 1:], rows_h[:, 1:] = (2 + np.arange(n))[:, None], 2 + n + np.arange(K)
    tail1 = np.concatenate([rows_t.reshape(-1), 2 + n + np.arange(K), [1]])
    head1 = np.concatenate([rows_h.reshape(-1), np.ones(K, np.int64), [0]])
    A = tail1.size
    tail = (np.arange(C)[:, None] * V + tail1).reshape(-1)
    head = (np.arange(C)[:, None] * V + head1).reshape(-1)
    frac = np.concatenate(
        [np.concatenate([t[:, :, None], p], axis=2).reshape(C, -1), q, r[:, None]], axis=1
    ).reshape(-1)
    starts = np.arange(C + 1) * A
    return tail, head, frac, starts, starts[:-1]


def _balances(tail, head, x, n_vert):
    return np.bincount(head, x, n_vert) - np.bincount(tail, x, n_vert)


def _matrix_kernel_z(uniforms) -> float:
    gen = np.random.default_rng(11)
    C, n, K = 20_000, 3, 4
    tail, head, frac, starts, mats = _matrix_network(C, n, K, gen)
    bits = flow_round(
        tail,
        head,
        frac,
        starts,
        starts[:-1],
        uniforms(frac.size),
        matrices=(mats, np.full(C, n), K + 1),
    )
    V = C * (2 + n + K)
    # every vertex's balance exactly its fractional parts' (an integer)
    want = np.rint(_balances(tail, head, frac, V))
    assert np.array_equal(_balances(tail, head, bits.astype(float), V), want)
    A = frac.size // C
    b = bits.reshape(C, A).astype(float)
    f = frac.reshape(C, A)
    # the copies are independent: the mean bit's SD is √(Σ f(1 − f)) / C
    sd = np.sqrt((f * (1 - f)).sum(axis=0)) / C
    return float((np.abs(b.mean(axis=0) - f.mean(axis=0)) / sd).max())


def test_matrix_sweeps_keep_every_balance_and_are_unbiased():
    """The 4-cycle sweeps of the matrices then the walk: every balance == and every arc's
    mean its fraction within Bonferroni bounds (α = 1e-6; the fractions differ by copy, so
    the copies' mean fraction is compared with the bits' mean)."""
    gen = np.random.default_rng(12)
    assert _matrix_kernel_z(lambda k: gen.random(k)) < _z(3 * 5 + 4 + 1)


def test_matrix_sweeps_test_has_power_against_skewed_uniforms():
    gen = np.random.default_rng(12)
    assert _matrix_kernel_z(lambda k: gen.random(k) ** 1.5) > _z(3 * 5 + 4 + 1)


def test_matrix_sweeps_depend_on_each_components_own_draws_only():
    """Components rounded apart (each with its uniforms) or together give the same bits, with
    or without the matrices: the partitioning changes no bit."""
    gen = np.random.default_rng(13)
    C, n, K = 40, 5, 6
    tail, head, frac, starts, mats = _matrix_network(C, n, K, gen)
    U = gen.random(frac.size)
    A = frac.size // C
    whole = flow_round(tail, head, frac, starts, starts[:-1], U,
                       matrices=(mats, np.full(C, n), K + 1))  # fmt: skip
    for c in range(C):
        sl = slice(c * A, (c + 1) * A)
        part = flow_round(tail[sl] - tail[sl].min(), head[sl] - tail[sl].min(), frac[sl],
                          np.array([0, A]), np.array([0]), U[sl],
                          matrices=(np.array([0]), np.array([n]), K + 1))  # fmt: skip
        assert np.array_equal(part, whole[sl])


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 6), K=st.integers(1, 7), C=st.integers(1, 4), seed=st.integers(0, 2**32 - 1)
)
def test_matrix_sweeps_keep_balances_and_integral_arcs_on_random_shapes(n, K, C, seed):
    """Random shapes, some fractions already integral: every balance ==, every integral
    arc unmoved, with the matrices as without them."""
    gen = np.random.default_rng(seed)
    tail, head, frac, starts, mats = _matrix_network(C, n, K, gen)
    # make some cell arcs integral (0 or 1), keeping the balances integral by recomputing
    # the totals', cells' and return arcs' fractions
    m, A = K + 1, frac.size // C
    f = frac.reshape(C, A).copy()
    rows = f[:, : n * m].reshape(C, n, m)  # a copy of the matrix part, written back below
    hit = gen.random((C, n, K)) < 0.3
    rows[:, :, 1:][hit] = gen.integers(0, 2, int(hit.sum()))
    rows[:, :, 0] = rows[:, :, 1:].sum(axis=2) % 1.0
    f[:, : n * m] = rows.reshape(C, n * m)
    f[:, n * m : n * m + K] = rows[:, :, 1:].sum(axis=1) % 1.0
    f[:, -1] = f[:, n * m : n * m + K].sum(axis=1) % 1.0
    assert np.all(rows[:, :, 1:][hit] == np.rint(rows[:, :, 1:][hit]))
    frac = f.reshape(-1)
    V = C * (2 + n + K)
    want = np.rint(_balances(tail, head, frac, V))
    U = gen.random(frac.size)
    for mat in (None, (mats, np.full(C, n), m)):
        bits = flow_round(tail, head, frac, starts, starts[:-1], U, matrices=mat)
        assert np.array_equal(_balances(tail, head, bits.astype(float), V), want)
        fixed = (frac < 1e-9) | (frac > 1 - 1e-9)
        assert np.array_equal(bits[fixed], np.rint(frac[fixed]).astype(np.int8))


def test_flow_kernel_refuses_a_matrix_that_is_not_one():
    gen = np.random.default_rng(14)
    tail, head, frac, starts, mats = _matrix_network(2, 3, 2, gen)
    with pytest.raises(DataError, match="arc .* breaks its matrix"):
        # rows of 4 slots over rows of 3: a row's arcs do not share a vertex
        flow_round(tail, head, frac, starts, starts[:-1], gen.random(frac.size),
                   matrices=(mats, np.full(2, 2), 4))  # fmt: skip
    with pytest.raises(DataError, match="increasing starts"):
        flow_round(tail, head, frac, starts, starts[:-1], gen.random(frac.size),
                   matrices=(mats[::-1], np.full(2, 3), 3))  # fmt: skip


# -- the partition scheme on many copies ------------------------------------------------------
SCHEMA = Schema.from_dict({"name": "t", "attributes": [{"name": "a", "labels": ["x", "y", "z"]}]})


def _copies(C: int, integral_cut: bool, seed: int = 2):
    """C copies of one small subtree (cut node → 2 children → 2 and 3 grandchildren; 3
    cells), its real values, and the cut nodes' integers drawn cell by cell ⌊X⌋ + Bernoulli
    (frac X) (any joint law with the right marginals will do for unbiasedness)."""
    gen = np.random.default_rng(seed)
    leaf = gen.uniform(-0.5, 3.0, (5, 3))
    if integral_cut:
        leaf[0] += np.ceil(leaf.sum(axis=0)) - leaf.sum(axis=0)
    kids = np.stack([leaf[:2].sum(axis=0), leaf[2:].sum(axis=0)])
    cut = leaf.sum(axis=0, keepdims=True)
    names = ["all", "cut", "child", "leaf"]
    codes = [["all"], [f"c{i}" for i in range(C)],
             [f"c{i}/{j}" for i in range(C) for j in range(2)],
             [f"c{i}/{j}" for i in range(C) for j in range(5)]]  # fmt: skip
    parents = [None, np.zeros(C, np.int64), np.repeat(np.arange(C), 2),
               np.repeat(np.arange(2 * C), np.tile([2, 3], C))]  # fmt: skip
    h = Hierarchy.from_parents(names, codes, parents)
    f = Forest.of(h, 1, [(0, C), (0, 2 * C), (0, 5 * C)])
    X = np.repeat(cut, C, axis=0)
    fr = X - np.floor(X)
    N = (np.floor(X) + (gen.random(X.shape) < fr)).astype(np.int64)
    est = [np.tile(kids, (C, 1)), np.tile(leaf, (C, 1))]
    return h, f, N, est, (cut, kids, leaf)


def _round(f, h, N, est, rng):
    return round_structured_partition(
        f, [0, 0, 0], h.sizes[1:], SCHEMA, N, np.zeros(N.shape[0]), est, rng, NEGATIVE
    )


def _scheme_z(C: int, integral_cut: bool, monkeypatch=None) -> tuple[float, int]:
    h, f, N, est, (cut, kids, leaf) = _copies(C, integral_cut)
    out = _round(f, h, N, est, KeyedRNG.reproducible(3, warn=False))
    worst, m = 0.0, 0
    for k, x in ((0, kids), (1, leaf)):
        c = out.counts[k].reshape(C, -1, 3)
        # every node's cells and total, per copy
        vals = np.concatenate([c, c.sum(axis=2, keepdims=True)], axis=2).astype(float)
        real = np.concatenate([x, x.sum(axis=1, keepdims=True)], axis=1)
        sd = vals.std(axis=0, ddof=1)
        live = sd > 0
        z = np.abs(vals.mean(axis=0) - real)[live] / (sd[live] / np.sqrt(C))
        worst = max(worst, float(z.max(initial=0.0)))
        m += int(live.sum())
        # integral, floor or ceil of the real value, children sum to the parent exactly
        assert np.all((c == np.floor(x)) | (c == np.ceil(x)))
    assert np.array_equal(f.sum_children(0, out.counts[0].reshape(-1, 3)), N)
    assert np.array_equal(f.sum_children(1, out.counts[1].reshape(-1, 3)), out.counts[0])
    return worst, m


def test_every_cell_and_every_total_below_the_cut_is_unbiased():
    """10⁵ copies of a subtree rounded from random cut integers: every node's cells and total
    within Bonferroni bounds of the real values (α = 1e-6)."""
    worst, m = _scheme_z(100_000, integral_cut=False)
    assert worst < _z(m)


def test_unbiasedness_of_the_scheme_has_power_against_skewed_draws(monkeypatch):
    monkeypatch.setattr(sr, "aes_uniform_draws", lambda g, n: g.random(n) ** 1.5)
    worst, m = _scheme_z(100_000, integral_cut=False)
    assert worst > _z(m)


def test_with_integral_cut_cells_every_total_is_its_floor_or_ceiling_and_its_variance_exact():
    """No error at the cut to share out: every node's total is the floor or ceiling of its
    real total (==), the bound equals the exact ψ(1 − ψ) (==) and matches the simulation."""
    C = 20_000
    h, f, N, est, (cut, kids, leaf) = _copies(C, integral_cut=True)
    out = _round(f, h, N, est, KeyedRNG.reproducible(4, warn=False))
    for k, x in ((0, kids), (1, leaf)):
        t = out.counts[k].reshape(C, -1, 3).sum(axis=2)
        real = x.sum(axis=1)
        assert np.all((t == np.floor(real)) | (t == np.ceil(real)))
        psi = real - np.floor(real)
        assert np.array_equal(out.spread[k].reshape(C, -1)[0], psi * (1 - psi))
        emp = t.var(axis=0, ddof=1)
        # the sample variance of a two-point variable: SE √((μ4 − σ⁴)/C), μ4 ≤ σ² here
        se = np.sqrt(np.maximum(psi * (1 - psi), 1e-12) / C)
        assert np.all(np.abs(emp - psi * (1 - psi)) < _z(8) * se)


def test_total_bound_covers_the_simulated_variance_when_the_cut_shares_its_error():
    C = 40_000
    h, f, N, est, (cut, kids, leaf) = _copies(C, integral_cut=False)
    fr = cut - np.floor(cut)
    # the cut's total error has variance ≤ Σ f(1 − f) (independent cells here)
    vt = np.full(C, float((fr * (1 - fr)).sum()))
    out = round_structured_partition(
        f, [0, 0, 0], h.sizes[1:], SCHEMA, N, vt, est, KeyedRNG.reproducible(5, warn=False),
        NEGATIVE,
    )  # fmt: skip
    for k in (0, 1):
        t = out.counts[k].reshape(C, -1, 3).sum(axis=2)
        emp = t.var(axis=0, ddof=1)
        bound = out.spread[k].reshape(C, -1)[0]
        assert np.all(emp <= bound * (1 + _z(8) * np.sqrt(2 / C)) + 1e-12), (k, emp, bound)


# -- the formulas --------------------------------------------------------------------------------
def test_fresh_bound_is_exact_without_a_shift_and_capped_at_a_quarter():
    psi = np.array([0.0, 0.1, 0.3, 0.5, 0.9])
    assert np.array_equal(fresh_variance_bound(psi, np.zeros(5)), psi * (1 - psi))
    assert np.array_equal(fresh_variance_bound(psi[1:], np.full(4, 10.0)), np.full(4, 0.25))
    # a small shift: the Chebyshev and Cauchy–Schwarz terms, computed independently
    p, v = 0.3, 0.001
    q = v / 0.3**2
    want = p * (1 - p) + (0.25 - p * (1 - p)) * q + abs(1 - 2 * p) * np.sqrt(v * q)
    assert fresh_variance_bound(np.array([p]), np.array([v]))[0] == pytest.approx(want, rel=1e-14)


def test_fresh_bound_holds_by_enumeration():
    """E[r(1 − r)] for a two-point shift, exactly, against the bound."""
    for psi in (0.05, 0.3, 0.5, 0.8):
        for a in (0.01, 0.2, 0.7):
            for w in (0.2, 0.5):  # Y = a(1 − w)/w w.p. w, else −a
                up = a * (1 - w) / w
                vals = np.array([up, -a])
                prob = np.array([w, 1 - w])
                r = (psi + vals) % 1.0
                exact = float(prob @ (r * (1 - r)))
                v = float(prob @ vals**2)
                assert exact <= fresh_variance_bound(np.array([psi]), np.array([v]))[0] + 1e-15


def test_total_bound_equals_its_formula():
    A = np.array([[0.6, 0.4], [1.0, 1.0], [0.0, 1.0]])
    v = np.full((3, 2), 0.25)
    sd = np.array([0.1, 0.3, 0.2])
    psi = np.array([0.0, 0.0, 0.0])
    got = total_variance_bound(A, v, sd, psi, True)
    # row 0: S2 = .13, Ā = .5, P = M = .0025 → min(.13, (.05 + .05 + .05)²) = .0225
    # row 1: Ā = 1, P = M = 0 → min(.5, .3²) = .09; row 2: Ā = .5, P = M = .0625 →
    # min(.25, (.1 + .25 + .25)²) = .25
    vy = np.array([0.0225, 0.09, 0.25])
    assert got == pytest.approx(vy + fresh_variance_bound(psi, vy), rel=1e-13)
    # an uneven row, computed term by term
    a = np.array([0.9, 0.1, 0.1])
    abar = (a * 0.25).sum() / 0.75
    P = sum(0.25 * (x - abar) ** 2 for x in a if x > abar)
    M = sum(0.25 * (x - abar) ** 2 for x in a if x < abar)
    want = min(0.25 * (a**2).sum(), (abar * 0.0 + np.sqrt(P) + np.sqrt(M)) ** 2)
    assert want < 0.25 * (a**2).sum() and want < (abar * 0.0 + np.sqrt(2 * (P + M))) ** 2
    got = total_variance_bound(a[None], np.full((1, 3), 0.25), np.array([0.0]), np.zeros(1), True)
    assert got[0] == pytest.approx(want + 0.25, rel=1e-13)
    # without the non-positive correlations: Minkowski
    got = total_variance_bound(A, v, sd, psi, False)
    vy = np.array([min(0.5**2, (0.05 + 0.1) ** 2), min(1.0, 0.3**2), min(0.25, (0.1 + 0.5) ** 2)])
    assert got == pytest.approx(vy + fresh_variance_bound(psi, vy), rel=1e-13)


def test_total_bound_holds_for_a_two_point_parent_by_enumeration():
    """One cell of a parent rounded up w.p. φ: the child's total error is exactly a·e + η;
    its variance by enumeration over e and the child's own floor/ceiling is at most the
    bound."""
    for phi in (0.2, 0.5, 0.7):
        for a in (0.3, 0.6, 1.0):
            for f in (0.1, 0.45):
                # child's conditional fraction p = f + a e; its total rounds to floor/ceil
                out = []
                for e, pe in ((1 - phi, phi), (-phi, 1 - phi)):
                    p = f + a * e
                    if not 0.0 <= p <= 1.0:
                        break
                    out += [(1 - f, pe * p), (-f, pe * (1 - p))]
                else:
                    err = np.array([d for d, _ in out])
                    pr = np.array([w for _, w in out])
                    exact = float(pr @ err**2)
                    b = total_variance_bound(
                        np.array([[a]]), np.array([[phi * (1 - phi)]]),
                        np.array([np.sqrt(phi * (1 - phi))]), np.array([f]), True,
                    )[0]  # fmt: skip
                    assert exact <= b + 1e-15


# -- the systematic sampling of the non-negative product ----------------------------------------
def test_conditioned_systematic_sampling_has_the_exact_conditional_law():
    """round_children: given the parent's integer, each child's bit has the conditional mean
    of Madow's systematic sampling; averaged over a fine grid of the uniform and over the
    parent's two values with their probabilities it is f exactly (up to the grid)."""
    x = np.array([[0.3, 1.45], [0.5, 0.2], [0.4, 2.75]])  # 3 children, 2 cells
    S = x.sum(axis=0)  # 1.2, 4.4: m = 1 and 4 fractional units
    G = 4096
    v = (np.arange(G) + 0.5) / G
    means = np.zeros((2, 3, 2))
    for up in (0, 1):
        N = (np.floor(S) + up).astype(np.int64)
        parent = np.tile(N, (G, 1))
        xs = np.tile(x, (G, 1))
        count = np.full(G, 3)
        vv = np.repeat(v[:, None], 2, axis=1)
        where = ("t", None, 0, ["a", "b"])
        out, _ = round_children(parent, xs, count, vv, None, where, 1e-9)
        o = out.reshape(G, 3, 2)
        assert np.all(o.sum(axis=1) == N)  # the children sum to the parent
        means[up] = o.mean(axis=0)
    phi = S - np.floor(S)
    mean = (1 - phi) * means[0] + phi * means[1]
    assert np.all(np.abs(mean - x) < 2.0 / G)


def test_runs_of_subtrees_rounded_at_a_time_change_no_bit(monkeypatch):
    """The networks are rounded a run of subtrees at a time (bounded temporaries); each
    subtree is its own component with its own keyed draws, so the run length changes no
    bit (a run of one subtree each against all at once)."""
    C = 50
    h, f, N, est, _ = _copies(C, integral_cut=False)
    vt = np.full(C, 0.3)
    args = (f, [0, 0, 0], h.sizes[1:], SCHEMA, N, vt, est, KeyedRNG.reproducible(9, warn=False))
    whole = round_structured_partition(*args, NEGATIVE)
    monkeypatch.setattr(sr, "_FLOW_ARCS", 1)
    runs = round_structured_partition(*args, NEGATIVE)
    for a, b in zip(whole.counts + whole.spread, runs.counts + runs.spread, strict=True):
        assert np.array_equal(a, b)


def test_per_thread_scratch_changes_no_bit(monkeypatch):
    """The networks are built in per-thread scratch reused from partition to partition
    (stale, larger buffers included), and partitions round on two threads at once: the
    integers and bounds equal those with no scratch kept (every buffer fresh), partitions
    of several subtrees and of one (drawn straight into the arcs) alike."""
    from concurrent.futures import ThreadPoolExecutor

    cases = []
    for C, seed in ((40, 1), (1, 2), (25, 3), (1, 4)):
        h, f, N, est, _ = _copies(C, integral_cut=False, seed=seed)
        rng = KeyedRNG.reproducible(seed, warn=False)
        cases.append((f, [0, 0, 0], h.sizes[1:], SCHEMA, N, np.full(C, 0.3), est, rng))

    def run(args):
        out = round_structured_partition(*args, NEGATIVE)
        return out.counts + out.spread

    with monkeypatch.context() as m:
        m.setattr(sr, "_SCRATCH_BYTES", 0)
        want = [run(c) for c in cases]
    with ThreadPoolExecutor(2) as ex:
        got = list(ex.map(run, cases * 6))
    for i, g in enumerate(got):
        for a, b in zip(want[i % len(cases)], g, strict=True):
            assert np.array_equal(a, b)


def test_partition_options_and_the_old_keywords_give_the_same_integers():
    """The settings once passed one by one are fields of PartitionOptions; for one release
    the keywords still work, applied over the options (a changed label draws other streams,
    so a keyword that were ignored would show), and an unknown one is refused by name."""
    C = 20
    h, f, N, est, _ = _copies(C, integral_cut=False)
    vt = np.full(C, 0.3)
    args = (f, [0, 0, 0], h.sizes[1:], SCHEMA, N, vt, est, KeyedRNG.reproducible(4, warn=False))
    new = round_structured_partition(*args, PartitionOptions(negative=True, label="x"))
    for old in (
        round_structured_partition(*args, negative=True, label="x"),
        round_structured_partition(*args, PartitionOptions(label="x"), negative=True),
    ):
        for a, b in zip(new.counts + new.spread, old.counts + old.spread, strict=True):
            assert np.array_equal(a, b)
        assert old.negative is True
    default = round_structured_partition(*args, NEGATIVE)
    assert any(not np.array_equal(a, b) for a, b in zip(new.counts, default.counts, strict=True))
    with pytest.raises(TypeError, match=r"'negativ'.*PartitionOptions"):
        round_structured_partition(*args, negativ=True)


def test_the_top_as_one_network_keeps_every_total_within_floor_and_ceiling():
    """Down to the cut (total invariants only) the levels are one network with the root's
    cells free: every node's total is the floor or ceiling of its real total (==), its
    variance exactly ψ(1 − ψ) (==), the invariants ==, children = parent cell by cell."""
    from types import SimpleNamespace

    from censusdp.estimation.integer.controlled import round_structured
    from censusdp.hierarchy.synthetic import random_hierarchy
    from censusdp.mechanisms.product_measure import ProductInvariant
    from censusdp.mechanisms.product_query import ProductQuery

    gen = np.random.default_rng(21)
    h = random_hierarchy(gen, [(3, 4), (2, 5), (2, 3)])
    leaf = gen.uniform(-0.5, 4.0, (h.leaves.size, 3))
    anc = h.ancestor_index(-1, 1)
    first = np.r_[0, np.cumsum(np.bincount(anc))[:-1]]
    s1 = np.bincount(anc, leaf.sum(axis=1))
    leaf[first, 0] += np.ceil(s1) - s1  # the states' totals integral (invariant)
    est = h.aggregate(leaf)
    tot = ProductQuery.parse(SCHEMA, "total")
    invs = [ProductInvariant(k, tot, np.rint(tot.apply(est[k]))) for k in (0, 1)]
    rel = SimpleNamespace(hierarchy=h, schema=SCHEMA, estimates=[x.reshape(-1, 3) for x in est])
    for seed in range(20):
        out = round_structured(rel, KeyedRNG.reproducible(seed, warn=False), invariants=invs, cut=2)
        assert out.top_network
        for k in range(h.depth):
            c, x = out.counts[k], est[k]
            assert np.all((c == np.floor(x)) | (c == np.ceil(x)))
            if k:
                assert np.array_equal(h.aggregate_up(k, c), out.counts[k - 1])
        for k in (0, 1, 2):
            t, real = out.counts[k].sum(axis=1), est[k].sum(axis=1)
            assert np.all((t == np.floor(real + 1e-9)) | (t == np.ceil(real - 1e-9))), k
            psi = real - np.floor(real)
            psi[(psi < 1e-9) | (psi > 1 - 1e-9)] = 0.0
            assert np.array_equal(out.spread[k], psi * (1 - psi)), k
        for iv in invs:
            assert np.array_equal(iv.query.apply(out.counts[h.level_index(iv.level)]), iv.values)
