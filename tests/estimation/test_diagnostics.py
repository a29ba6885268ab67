"""L-lag coupling TV bounds against exact answers (matrix powers, AR(1)), and split-R̂."""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import integrate, stats

from censusdp.estimation.conditioning.diagnostics import (
    iterations_for_tv,
    meeting_times,
    split_rhat,
    tv_upper_bound,
)
from censusdp.estimation.conditioning.mcmc import (
    DoubleGeometricStep,
    GaussianStep,
    MetropolisHastings,
    ProductTarget,
    TreeLayout,
    TreeMoves,
    maximal_coupling,
)
from censusdp.hierarchy import Hierarchy


class _TwoSidedGeometric:
    """Discrete Laplace log-mass ∝ −|k|/t (test-local; only log_density is needed)."""

    is_integer = True

    def __init__(self, t: float) -> None:
        self.t = t

    def log_density(self, x):
        return -np.abs(np.asarray(x, dtype=np.float64)) / self.t


def test_tv_upper_bound_formula():
    tau = np.array([3.0, 7.0, 12.0])
    # L = 2: t = 0 → ceil((τ−2)/2) = [1, 3, 5] → mean 3
    assert tv_upper_bound(tau, 2, 0) == 3.0
    np.testing.assert_allclose(tv_upper_bound(tau, 2, np.array([0, 3, 10])), [3.0, 5 / 3, 0.0])
    assert iterations_for_tv(tau, 2, 0.5) == 8
    assert tv_upper_bound(np.array([np.inf, 2.0]), 1, 5) == np.inf


def _simplex_chain(total: int, y: np.ndarray, t: float, a: float):
    """Engine over leaf tables z ∈ ℤ³, z ≥ 0, Σ z = total (root invariant), noise e = y − z."""
    h = Hierarchy.from_parents(["r", "l"], [["R"], ["a", "b", "c"]], [None, np.zeros(3)])
    one = np.ones((1, 1), dtype=np.int64)
    lay = TreeLayout.build(h, 1, [(1, one)])
    target = ProductTarget(
        [_TwoSidedGeometric(t)], np.r_[np.zeros(3, np.int64), -np.ones(3, np.int64)]
    )
    z0 = np.array([total, 0, 0])
    lower = np.r_[np.full(3, -np.inf), -z0]
    eng = MetropolisHastings(
        target, TreeMoves(lay, [(0, one)], DoubleGeometricStep(a)), lower=lower
    )
    s0 = np.r_[y - z0, np.zeros(3)].astype(np.int64)
    return eng, s0


def _exact_tv(total: int, y: np.ndarray, t: float, a: float, times):
    states = [z for z in itertools.product(range(total + 1), repeat=3) if sum(z) == total]
    index = {z: k for k, z in enumerate(states)}
    logp = np.array([-np.abs(y - np.array(z)).sum() / t for z in states])
    P = np.zeros((len(states), len(states)))
    pmf = lambda k: (1 - a) / (1 + a) * a ** abs(k)  # noqa: E731
    pairs = [(i, j) for i in range(3) for j in range(3) if i != j]
    for s, z in enumerate(states):
        for i, j in pairs:  # TreeMoves on one level: i uniform, j uniform among the others
            for d in range(-total - 1, total + 2):
                w = pmf(d) / len(pairs)
                z2 = list(z)
                z2[i] += d
                z2[j] -= d
                if d == 0 or min(z2) < 0:
                    P[s, s] += w
                    continue
                s2 = index[tuple(z2)]
                acc = min(1.0, math.exp(logp[s2] - logp[s]))
                P[s, s2] += w * acc
                P[s, s] += w * (1 - acc)
        P[s, s] += 1 - P[s].sum()  # the mass of |δ| > total + 1 (always rejected)
    pi = np.exp(logp - logp.max())
    pi /= pi.sum()
    mu = np.zeros(len(states))
    mu[index[(total, 0, 0)]] = 1.0
    out, t_prev = [], 0
    for tt in times:
        mu = mu @ np.linalg.matrix_power(P, tt - t_prev)
        t_prev = tt
        out.append(0.5 * np.abs(mu - pi).sum())
    return np.array(out)


LAG = 20


def test_coupling_bound_dominates_exact_tv_on_enumerable_chain(rng):
    total, y, t, a = 6, np.array([1, 2, 3]), 1.5, 0.6
    times = [0, 5, 10, 20, 40, 80]
    exact = _exact_tv(total, y, t, a, times)
    eng, s0 = _simplex_chain(total, y, t, a)
    n_pairs = 400
    start = np.tile(s0, (n_pairs, 1))
    res = meeting_times(eng, start, start.copy(), LAG, rng.generator("test/simplex"))
    assert res.all_met
    tau = res.meeting_times
    terms = np.maximum(0, np.ceil((tau[:, None] - LAG - np.array(times)) / LAG))
    se = terms.std(axis=0, ddof=1) / np.sqrt(n_pairs)
    bound = res.tv_bound(np.array(times))
    # up to Monte Carlo error: 3 SE, and the estimator's resolution 1/n_pairs where SE = 0
    assert np.all(bound + 3 * se + 1.0 / n_pairs >= exact)
    assert exact[0] > 0.5 and bound[-2] < 0.2  # informative, not vacuous


def test_ar1_coupling_bound_dominates_exact_tv(rng):
    """X' = φX + N(0,1) from x₀ = 8, maximally coupled innovations (same machinery)."""
    phi, x0, lag, n = 0.8, 8.0, 2, 4000
    gen = rng.generator("test/ar1")
    step = GaussianStep(1.0)
    x = np.full(n, x0)
    y = np.full(n, x0)
    for _ in range(lag):
        x = phi * x + step.sample(gen, n)
    tau = np.full(n, np.inf)
    live = np.ones(n, dtype=bool)
    t = lag
    while live.any():
        t += 1
        dx, dy, _ = maximal_coupling(step, phi * (x - y), gen)
        x, y = phi * x + dx, phi * y + dy
        met = live & (np.abs(x - y) < 1e-12)
        tau[met] = t
        live &= ~met
    v = 1 / (1 - phi**2)
    for tt in (0, 3, 6, 10):
        m, s2 = phi**tt * x0, (1 - phi ** (2 * tt)) * v
        if tt == 0:
            exact = 1.0
        else:

            def f(u, m=m, s2=s2):
                p = stats.norm.pdf(u, m, math.sqrt(s2))
                return abs(p - stats.norm.pdf(u, 0, math.sqrt(v)))

            exact = 0.5 * integrate.quad(f, -30, 40, points=[m], limit=200)[0]
        terms = np.maximum(0, np.ceil((tau - lag - tt) / lag))
        se = terms.std(ddof=1) / np.sqrt(n)
        assert tv_upper_bound(tau, lag, tt) + 3 * se >= exact


def test_rhat_near_one_when_converged_and_large_when_not(rng):
    gen = rng.generator("test/rhat")
    good = gen.normal(size=(1000, 4))
    assert abs(float(split_rhat(good)) - 1) < 0.01
    assert abs(float(split_rhat(good, rank=True)) - 1) < 0.01
    # over-dispersed starts, AR(1) chains stopped early
    start = np.array([-10.0, -3.0, 3.0, 10.0])
    x = np.empty((50, 4))
    cur = start.copy()
    for k in range(50):
        cur = 0.95 * cur + gen.normal(scale=0.3, size=4)
        x[k] = cur
    assert float(split_rhat(x)) > 1.1
    assert float(split_rhat(x, rank=True)) > 1.1
