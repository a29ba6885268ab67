"""Exact conditional laws of ℓ₂ (Gaussian-type) product targets along a line.

For a target ``log π(s) = −½ Σ_i p_i s_i² + const`` (independent Gaussian noise, or the
discrete Gaussian on integer states; ``p_i = 1/σ_i²``, 0 for a flat coordinate) and a move
direction with coefficients ``c`` on the touched coordinates, the conditional law of the step
δ on the line ``s + δ c`` has the log-density

    f(δ) = −½ Σ_k p_k (a_k + c_k δ)² = −½ P (δ − μ)² + f(μ),
    P = Σ_k p_k c_k²,   μ = −Σ_k p_k a_k c_k / P,   a_k = s_{idx_k},

restricted to optional bounds ``[lo, hi]`` (non-negativity of the released table, a box).
This is the conditional of the noise posterior of conditioning (Gao, Gong & Yu, "Subspace
differential privacy", the flat-prior target π(z | y) ∝ Π p(y − Q z)) along a move that keeps
consistency and the invariants.

* **Continuous lines** — a truncated normal N(μ, 1/P) on [lo, hi], drawn by inversion of its
  CDF (Devroye 1986, §II.2). The CDF is evaluated in log space (``log_ndtr``) and inverted
  with ``ndtri_exp`` on the tail the interval lies in, so intervals far in a tail (tens of
  standard deviations from μ) are drawn accurately; the only loss is on intervals that
  straddle μ, where draws beyond about 8.2 standard deviations on the upper side (mass
  < 1e-15) are limited by the double-precision resolution of probabilities near 1.
* **Integer lines** — the discrete Gaussian with real centre μ on the integers of [lo, hi],
  drawn by inversion of its CDF on an explicit window: the window is the integers within
  ``W = ⌈√(2·L/P)⌉ + 1`` (L = 50) of the mode ``m = clip(round(μ), lo, hi)``, clipped to
  [lo, hi]. The pmf is log-concave and decays away from m at least like ``exp(−½ P j²)``, so
  the mass left out of the window is at most ``2 e^{−L} / (1 − e^{−√(2LP)})`` of the
  normaliser: below 1e-17 relative for every line of σ = 1/√P ≤ 10⁴ (that is the only
  approximation besides float64 rounding of the CDF, ~1e-15 relative per probability). The
  window has ``2W + 1 ≈ 20σ`` entries, so memory grows with σ.
* **Flat lines** (P = 0, every touched coordinate flat) — uniform on [lo, hi] (on its
  integers for integer lines) when both bounds are finite, as for
  :class:`~censusdp.estimation.conditioning.line_conditional.LaplaceLine`; otherwise improper, and the
  draw is δ = 0. A continuous line whose range is one point, or an empty range, is improper
  too (δ = 0).

The interface is that of :class:`~censusdp.estimation.conditioning.line_conditional.LaplaceLine`
(``build``, ``sample`` with common uniforms, ``log_pdf``, ``subset``, ``distance``,
``proper``, ``log_norm``), so :func:`~censusdp.estimation.conditioning.line_conditional.couple_lines`
couples two Gaussian lines with the same code.

References
----------
Devroye (1986), *Non-Uniform Random Variate Generation*, §II.2 (inversion) and §III.2
(discrete inversion by sequential search); Gao, Gong & Yu, "Subspace differential privacy"
(the conditioning target); Canonne, Kamath & Steinke (2020) for the discrete Gaussian.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr, ndtri_exp

from censusdp.estimation.conditioning.line_conditional import (
    invert_rows,
    line_inputs,
    same_bounds,
    take_rows,
)

__all__ = ["GaussianLine", "WINDOW_LOG_TAIL", "tail_bound"]

#: L of the integer window: it reaches ``√(2L/P)`` from the mode (mass outside ≤ e^{−L} scale)
WINDOW_LOG_TAIL = 50.0


def _log_diff_ndtr(zlo: np.ndarray, zhi: np.ndarray) -> np.ndarray:
    """``log(Φ(zhi) − Φ(zlo))`` for ``zlo ≤ zhi``, accurate in both tails (−inf if equal)."""
    upper = zlo > 0  # both in the upper tail: use Φ(−zlo) − Φ(−zhi)
    big = np.where(upper, log_ndtr(-zlo), log_ndtr(zhi))
    small = np.where(upper, log_ndtr(-zhi), log_ndtr(zlo))
    with np.errstate(divide="ignore", invalid="ignore"):
        return big + np.log(-np.expm1(small - big))


@dataclass(frozen=True)
class GaussianLine:
    """The conditional law of δ on a batch of lines (see the module docstring).

    Build with :meth:`build`; draw with :meth:`sample`; evaluate with :meth:`log_pdf`.

    Attributes
    ----------
    a, c, prec : numpy.ndarray
        (n, K) float64 current values, direction coefficients and precisions ``p_k`` (0 on
        inactive terms: ``c_k = 0`` or a flat coordinate).
    lo, hi : numpy.ndarray
        (n,) bounds on δ (±inf where none); integer lines have integer bounds.
    integer : bool
        δ ∈ ℤ rather than ℝ.
    P, mu : numpy.ndarray
        (n,) precision and centre of the line (μ = 0 where P = 0).
    log_norm : numpy.ndarray
        (n,) log normaliser ``log ∫ e^f`` (or ``log Σ e^f``) over [lo, hi], f summed over
        the active terms (as for :class:`~censusdp.estimation.conditioning.line_conditional.LaplaceLine`).
    log_norm_centred : numpy.ndarray
        (n,) the same for ``f(δ) − f(μ) = −½ P (δ − μ)²`` (what :meth:`log_pdf` uses, free of
        the cancellation in f(μ)).
    proper : numpy.ndarray
        (n,) bool: the line has finite, positive mass and more than one point (continuous).
    window : numpy.ndarray
        (n, J) integer lines: the support points drawn from (NaN padding outside [lo, hi]);
        (n, 0) for continuous lines.
    window_logw : numpy.ndarray
        (n, J) ``−½ P (k − μ)²`` on the window (−inf on padding).
    """

    a: np.ndarray
    c: np.ndarray
    prec: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    integer: bool
    P: np.ndarray
    mu: np.ndarray
    log_norm: np.ndarray
    log_norm_centred: np.ndarray
    proper: np.ndarray
    window: np.ndarray
    window_logw: np.ndarray

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls,
        a: np.ndarray,
        c: np.ndarray,
        prec: np.ndarray,
        lo: np.ndarray | None = None,
        hi: np.ndarray | None = None,
        *,
        integer: bool = False,
    ) -> GaussianLine:
        """The conditional law for current values ``a``, coefficients ``c`` and precisions
        ``prec ≥ 0``, (n, K); bounds and ``integer`` as for
        :meth:`~censusdp.estimation.conditioning.line_conditional.LaplaceLine.build`."""
        a, c, prec, lo, hi = line_inputs(a, c, prec, lo, hi, integer)
        n = a.shape[0]
        P = np.einsum("nk,nk->n", prec, c * c)
        curved = P > 0
        Ps = np.where(curved, P, 1.0)
        mu = np.where(curved, -np.einsum("nk,nk->n", prec, a * c) / Ps, 0.0)
        # f(μ) = −½ Σ p (a + c μ)²: evaluated directly (no Σpa² − b²/P cancellation)
        f_mu = -0.5 * np.einsum("nk,nk->n", prec, (a + c * mu[:, None]) ** 2)
        finite_box = np.isfinite(lo) & np.isfinite(hi)
        nonempty = hi >= lo
        # flat lines: uniform over a finite range
        with np.errstate(divide="ignore", invalid="ignore"):
            flat_norm = np.where(integer, np.log(hi - lo + 1.0), np.log(hi - lo))
        flat_norm = np.where(finite_box & nonempty, flat_norm, np.nan)
        if integer:
            window, logw = _window(mu, P, lo, hi)
            with np.errstate(divide="ignore"):
                mx = np.max(logw, axis=1, initial=-np.inf)
                safe = np.where(np.isfinite(mx), mx, 0.0)
                centred = safe + np.log(np.sum(np.exp(logw - safe[:, None]), axis=1))
        else:
            window = np.zeros((n, 0))
            logw = np.zeros((n, 0))
            sd = 1.0 / np.sqrt(Ps)
            zlo, zhi = (lo - mu) / sd, (hi - mu) / sd
            with np.errstate(invalid="ignore"):
                centred = 0.5 * np.log(2.0 * np.pi / Ps) + _log_diff_ndtr(np.minimum(zlo, zhi), zhi)
            centred = np.where(nonempty, centred, -np.inf)
        centred = np.where(curved, centred, flat_norm)
        log_norm = np.where(curved, f_mu, 0.0) + centred
        proper = np.isfinite(centred) & nonempty
        if not integer:
            proper &= hi > lo  # one point: no density along the line, δ stays 0
        centred = np.where(proper, centred, -np.inf)
        log_norm = np.where(proper, log_norm, -np.inf)
        return cls(
            a, c, prec, lo, hi, bool(integer), P, mu, log_norm, centred, proper, window, logw
        )

    # ------------------------------------------------------------------ evaluation
    def log_pdf(self, delta: np.ndarray) -> np.ndarray:
        """Normalised log-density (log-mass for integer lines) of δ, per line."""
        delta = np.asarray(delta, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            val = -0.5 * self.P * (delta - self.mu) ** 2 - self.log_norm_centred
        inside = (delta >= self.lo) & (delta <= self.hi) & self.proper
        if self.integer:
            inside &= delta == np.round(delta)
        return np.where(inside, val, -np.inf)

    def sample(
        self, gen: np.random.Generator | None = None, u: np.ndarray | None = None
    ) -> np.ndarray:
        """One exact draw of δ per line (0 on improper lines), by inversion of the CDF;
        parameters as for :meth:`~censusdp.estimation.conditioning.line_conditional.LaplaceLine.sample`."""
        n = self.P.size
        if u is None:
            u = gen.random(n)
        u = np.asarray(u, dtype=np.float64)
        curved = self.P > 0
        with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
            span = self.hi - self.lo
            if self.integer:
                flat = self.lo + np.minimum(np.floor(u * (span + 1.0)), span)
                out = np.where(curved, self._sample_window(u), flat)
            else:
                flat = self.lo + u * span
                out = np.where(curved, self._sample_truncnorm(u), flat)
            out = np.clip(out, self.lo, self.hi)
        return np.where(self.proper, out, 0.0)

    def _sample_truncnorm(self, u: np.ndarray) -> np.ndarray:
        """Inverse CDF of N(μ, 1/P) truncated to [lo, hi], in log space on the tail the
        interval lies in (Devroye 1986, §II.2)."""
        u = np.where(u > 0, u, np.finfo(np.float64).tiny)  # u = 0 exactly: no infinite draw
        sd = 1.0 / np.sqrt(np.where(self.P > 0, self.P, 1.0))
        zlo, zhi = (self.lo - self.mu) / sd, (self.hi - self.mu) / sd
        upper = zlo > 0
        # lower form: Φ(z) = Φ(zlo) + u (Φ(zhi) − Φ(zlo)), in logs relative to Φ(zhi)
        l_lo, l_hi = log_ndtr(zlo), log_ndtr(zhi)
        ratio_low = np.exp(l_lo - l_hi)
        z_low = ndtri_exp(l_hi + np.log(u + (1.0 - u) * ratio_low))
        # upper form: Φ(−z) = Φ(−zlo) − u (Φ(−zlo) − Φ(−zhi)), relative to Φ(−zlo)
        m_lo, m_hi = log_ndtr(-zlo), log_ndtr(-zhi)
        z_up = -ndtri_exp(m_lo + np.log1p(u * np.expm1(m_hi - m_lo)))
        z = np.where(upper, z_up, z_low)
        return self.mu + sd * np.clip(z, zlo, zhi)

    def _sample_window(self, u: np.ndarray) -> np.ndarray:
        """Sequential-search inversion of the discrete CDF on the window (Devroye §III.2)."""
        if self.window.shape[1] == 0:
            return np.zeros(u.size)
        w = np.exp(self.window_logw - self.log_norm_centred[:, None])
        j, _, _ = invert_rows(np.where(np.isfinite(w), w, 0.0), np.isfinite(self.window_logw), u)
        return np.nan_to_num(self.window[np.arange(u.size), j])

    subset = take_rows  # the lines at ``rows``

    def distance(self, other: GaussianLine, shift: np.ndarray) -> np.ndarray:
        """How far ``other`` (shifted by ``shift``) is from this line, per line.

        ``√P · |μ_x − (μ_y − shift)|``: the centres' difference in standard deviations of
        the line, and +inf where the precisions or the (shifted) bounds differ. 0 means
        identical conditionals up to the shift (both laws are fixed by P, μ and the bounds).
        Without bounds ``d_TV = 2Φ(d/2) − 1 ≤ d/√(2π)``; under common bounds this module
        does not bound d_TV by d, but :func:`couple_lines`'s fallback error is at most the
        pair's actual d_TV (and at most 1/(1000·e)) either way.
        """
        shift = np.asarray(shift, dtype=np.float64)
        d = np.sqrt(self.P) * np.abs(self.mu - (other.mu - shift))
        same_p = np.isclose(self.P, other.P, rtol=1e-12, atol=0.0)
        flat = (self.P == 0) & (other.P == 0)
        d = np.where(flat, 0.0, d)
        return np.where(same_p & same_bounds(self, other, shift), d, np.inf)


def _window(
    mu: np.ndarray, P: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Integer support windows around each curved line's mode (see the module docstring):
    points (NaN padding) and their centred log-weights ``−½ P (k − μ)²`` (−inf padding)."""
    curved = P > 0
    if not curved.any():
        return np.zeros((P.size, 0)), np.zeros((P.size, 0))
    half = np.where(
        curved, np.ceil(np.sqrt(2.0 * WINDOW_LOG_TAIL / np.where(curved, P, 1.0))) + 1.0, 0.0
    )
    width = int(2 * half.max() + 1)
    with np.errstate(invalid="ignore"):
        # floor(μ + ½), not round-half-even: translation-equivariant, so two chains whose
        # lines differ by an integer shift get windows that differ by the same shift
        mode = np.clip(np.floor(mu + 0.5), lo, hi)
    mode = np.where(np.isfinite(mode), mode, 0.0)
    k = mode[:, None] - half[:, None] + np.arange(width, dtype=np.float64)[None, :]
    live = (
        curved[:, None]
        & (k >= lo[:, None])
        & (k <= hi[:, None])
        & (k <= (mode + half)[:, None])
        & (hi >= lo)[:, None]
    )
    logw = np.where(live, -0.5 * P[:, None] * (k - mu[:, None]) ** 2, -np.inf)
    return np.where(live, k, np.nan), logw


def tail_bound(P: float) -> float:
    """The bound on the relative mass left out of an integer window of precision P."""
    return 2.0 * math.exp(-WINDOW_LOG_TAIL) / -math.expm1(-math.sqrt(2.0 * WINDOW_LOG_TAIL * P))
