"""Convergence diagnostics for the MCMC engine: L-lag coupling meeting times, the
total-variation upper bound, split-R̂ and Monte Carlo standard errors.

References
----------
Biswas, Jacob & Vanetti (2019), "Estimating convergence of Markov chains with L-lag
couplings", NeurIPS, Algorithm 1 (meeting times) and Theorem 2.5 (the bound
d_TV(π_t, π) ≤ E[max(0, ⌈(τ − L − t)/L⌉)]).
Gelman & Rubin (1992); Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021), "Rank-
normalization, folding, and localization: an improved R̂", Bayesian Analysis 16(2), eq. 4
(split-R̂) and §4.2 (rank normalisation, folding).
Flegal & Jones (2010), batch means for Monte Carlo standard errors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special, stats

from censusdp.estimation.conditioning.mcmc import ChainState, MetropolisHastings

__all__ = [
    "CouplingResult",
    "meeting_times",
    "tv_upper_bound",
    "iterations_for_tv",
    "split_rhat",
    "batch_means_se",
    "states_met",
]


def states_met(x: np.ndarray, y: np.ndarray, *, atol: float = 1e-9) -> np.ndarray:
    """Per chain, whether two state batches coincide (exactly for integer states, to
    ``atol · (1 + |x|)`` for real states, whose coupled updates differ by rounding)."""
    if np.issubdtype(x.dtype, np.integer) and np.issubdtype(y.dtype, np.integer):
        return np.all(x == y, axis=1)
    return np.all(np.abs(x - y) <= atol * (1.0 + np.abs(x)), axis=1)


@dataclass(frozen=True)
class CouplingResult:
    """Meeting times of L-lag coupled chains.

    Attributes
    ----------
    meeting_times : numpy.ndarray
        τ per coupled pair (float; ``inf`` when the pair had not met by ``max_iterations``).
    lag : int
    max_iterations : int
    """

    meeting_times: np.ndarray
    lag: int
    max_iterations: int

    @property
    def all_met(self) -> bool:
        return bool(np.all(np.isfinite(self.meeting_times)))

    def tv_bound(self, t: int | np.ndarray) -> float | np.ndarray:
        """:func:`tv_upper_bound` at iteration(s) t (inf when some pair never met)."""
        return tv_upper_bound(self.meeting_times, self.lag, t)


def tv_upper_bound(meeting_times: np.ndarray, lag: int, t: int | np.ndarray) -> float | np.ndarray:
    """The L-lag coupling bound d_TV(π_t, π) ≤ E[max(0, ⌈(τ − L − t)/L⌉)].

    Parameters
    ----------
    meeting_times : array-like
        τ of independent L-lag coupled pairs (``inf`` for a pair that did not meet, which
        makes the bound infinite: run longer).
    lag : int
        L ≥ 1.
    t : int or array-like
        Iteration(s); vectorised.

    Returns
    -------
    float or numpy.ndarray
        The Monte Carlo estimate of the bound at each t (same shape as ``t``).

    References
    ----------
    Biswas, Jacob & Vanetti (2019), Theorem 2.5 / eq. (3).
    """
    if lag < 1:
        raise ValueError("the lag L must be at least 1")
    tau = np.asarray(meeting_times, dtype=np.float64).reshape(-1, 1)
    tt = np.asarray(t, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        terms = np.maximum(0.0, np.ceil((tau - lag - tt.reshape(1, -1)) / lag))
    out = terms.mean(axis=0)
    return float(out[0]) if tt.ndim == 0 else out.reshape(tt.shape)


def iterations_for_tv(meeting_times: np.ndarray, lag: int, bound: float) -> int | None:
    """The smallest t whose :func:`tv_upper_bound` is below ``bound`` (None if never)."""
    tau = np.asarray(meeting_times, dtype=np.float64)
    if not np.all(np.isfinite(tau)):
        return None
    ts = np.arange(0, int(tau.max()) + 1)
    ok = np.flatnonzero(tv_upper_bound(tau, lag, ts) < bound)
    return int(ts[ok[0]]) if ok.size else None


def meeting_times(
    engine: MetropolisHastings,
    x0: np.ndarray,
    y0: np.ndarray,
    lag: int,
    gen: np.random.Generator,
    *,
    max_iterations: int = 100_000,
) -> CouplingResult:
    """Meeting times of ``n_pairs`` independent L-lag coupled chains, all advanced together.

    Chain X starts at ``x0`` and makes L ordinary steps; then X and Y (from ``y0``) make
    coupled steps (:meth:`MetropolisHastings.coupled_step`) until ``X_t = Y_{t−L}``:
    τ = inf{t > L : X_t = Y_{t−L}}. ``x0`` and ``y0`` must be independent draws from the
    initial distribution π₀ (rows are pairs).

    References
    ----------
    Biswas, Jacob & Vanetti (2019), Algorithm 1.
    """
    if lag < 1:
        raise ValueError("the lag L must be at least 1")
    cx: ChainState = engine.init(x0)
    cy: ChainState = engine.init(y0)
    for _ in range(lag):
        engine.step(cx, gen)
    tau = np.full(cx.states.shape[0], np.inf)
    live = np.arange(cx.states.shape[0])
    t = lag
    while live.size and t < max_iterations:
        t += 1
        sx = ChainState(cx.states[live], cx.log_density[live], cx.accepted[live])
        sy = ChainState(cy.states[live], cy.log_density[live], cy.accepted[live])
        engine.coupled_step(sx, sy, gen)
        cx.states[live], cx.log_density[live] = sx.states, sx.log_density
        cy.states[live], cy.log_density[live] = sy.states, sy.log_density
        met = states_met(sx.states, sy.states)
        tau[live[met]] = t
        live = live[~met]
    return CouplingResult(tau, int(lag), int(max_iterations))


def _split(draws: np.ndarray) -> np.ndarray:
    """(n, m, ...) → (n//2, 2m, ...): each chain's two halves as separate chains."""
    half = draws.shape[0] // 2
    if half < 2:
        raise ValueError("split-R̂ needs at least 4 draws per chain")
    return np.concatenate([draws[:half], draws[draws.shape[0] - half :]], axis=1)


def _rhat(draws: np.ndarray) -> np.ndarray:
    n = draws.shape[0]
    means = draws.mean(axis=0)
    b = n * means.var(axis=0, ddof=1)
    w = draws.var(axis=0, ddof=1).mean(axis=0)
    var_plus = (n - 1) / n * w + b / n
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.sqrt(var_plus / w)
    return np.where(w > 0, r, np.where(b > 0, np.inf, 1.0))


def _rank_normal(draws: np.ndarray) -> np.ndarray:
    n_total = draws.shape[0] * draws.shape[1]
    flat = draws.reshape(n_total, -1)
    ranks = stats.rankdata(flat, axis=0)
    z = special.ndtri((ranks - 0.375) / (n_total + 0.25))
    return z.reshape(draws.shape)


def split_rhat(draws: np.ndarray, *, rank: bool = False) -> np.ndarray:
    """Split potential scale reduction factor R̂ per quantity.

    Parameters
    ----------
    draws : numpy.ndarray
        (n_draws, n_chains) or (n_draws, n_chains, p); use ≥ 4 over-dispersed chains.
    rank : bool
        Rank-normalised R̂ of Vehtari et al. (2021): the maximum of the bulk R̂ (on
        normal scores of the pooled ranks) and the tail R̂ (on the folded draws |x − median|).

    Returns
    -------
    numpy.ndarray
        R̂ (scalar array for 2-D input, shape (p,) otherwise); values near 1 indicate
        mixing, > 1.01–1.1 a problem.

    References
    ----------
    Vehtari et al. (2021), eq. (4) and §4.2; Gelman & Rubin (1992).
    """
    x = np.asarray(draws, dtype=np.float64)
    if x.ndim < 2 or x.shape[1] < 2:
        raise ValueError("split_rhat needs draws of shape (n_draws, n_chains[, p])")
    s = _split(x)
    if not rank:
        return _rhat(s)
    bulk = _rhat(_rank_normal(s))
    folded = np.abs(s - np.median(s.reshape(-1, *s.shape[2:]), axis=0))
    tail = _rhat(_rank_normal(folded))
    return np.maximum(bulk, tail)


def batch_means_se(draws: np.ndarray, *, n_batches: int = 20) -> np.ndarray:
    """Monte Carlo standard error of the mean of (n_draws, n_chains, ...) draws.

    Each chain's draws are cut into ``n_batches`` consecutive batches; the batch means of
    all chains are treated as independent, so the SE is their standard deviation over
    √(number of batches). Independent chains make this reliable even when each is short.

    References
    ----------
    Flegal & Jones (2010), "Batch means and spectral variance estimators in MCMC", Ann.
    Statist. 38(2).
    """
    x = np.asarray(draws, dtype=np.float64)
    n = x.shape[0]
    nb = max(1, min(n_batches, n))
    size = n // nb
    batches = x[: nb * size].reshape(nb, size, *x.shape[1:]).mean(axis=1)
    flat = batches.reshape(nb * x.shape[1], *x.shape[2:])
    if flat.shape[0] < 2:
        return np.full(x.shape[2:], np.inf)
    return flat.std(axis=0, ddof=1) / np.sqrt(flat.shape[0])
