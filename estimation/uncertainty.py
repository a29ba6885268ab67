"""Normal and lattice intervals and coverage for linear (GLS) releases (their standard errors
are the release's own: :meth:`~censusdp.estimation.release.Release.standard_errors`).

A GLS estimate is linear in the noise, so its error covariance is exact; with Gaussian noise
the error is exactly normal and ``estimate ± z_{1−α/2} · se`` covers at the nominal rate. With
integer (discrete Gaussian or Laplace) noise of small scale the error is lattice-valued and
normal intervals under-cover (0.786 for a nominal 0.90 at σ = 0.5 in the audit):
:func:`lattice_intervals` builds intervals from the error's law instead (exact for the node's
own integer noise, a randomized boundary where the law has atoms, integer rounding included),
and uses the normal interval only where the law is provably close to normal; the rule is
returned with the intervals. Rounding adds the variance p(1 − p) ≤ 1/4 of a value
with fractional part p (conditionally on the real-valued estimate; it is unbiased, so the
variances add).

Lattice intervals
-----------------
A GLS error is linear in the noise: the error of a released number c·ẑ_v of node v is
E = Σ_i w_i e_i over all measured answers, with w_i = Cov(q_iᵀ ẑ, cᵀ ẑ_v) / Var(e_i)
(the GLS weights are the inverse noise variances). For the node's own answers q_i the
weights come from the node's covariance, w = Q Cov_v c / Var(e). The error is modelled
as E = X + R:

* X = h·S, S the sum of the m own answers of largest weight h (one integer noise law,
  equal |w_i|): its law is computed exactly (convolution powers of the integer pmf,
  tails cut below 1e-16);
* R, every other term, is independent of X with variance t² = Var(E) − h² m Var(e)
  (the reported variance fixes it exactly) and is taken to be normal: it is a sum of
  the many small-weight terms of the parent, siblings and invariants. This is the one
  approximation; its effect on coverage is at most the mass of X's atoms at the
  interval's ends times the Kolmogorov distance of R from normal (small when R has
  many terms).

Without rounding there are two cases. When R stays within half a lattice gap,
P(|R| ≥ h/2) = 2Φ(−h/(2t)) ≤ 1e-6 (for discrete Gaussian noise R is sub-Gaussian, so
this is a rigorous bound up to the ratio of scale to variance, CKS 2020 Cor. 9), the
error is located by X alone: X is a lattice variable, and no deterministic interval
has coverage exactly 1 − α, so the boundary atoms are included at random (Stevens
1950): with U uniform and independent, V = F(X−) + U·P(X) is exactly Uniform(0, 1),
the atoms with α/2 ≤ V ≤ 1 − α/2 are a run h·[j_lo, j_hi], and the interval
``[ẑ − h j_hi − h/2, ẑ − h j_lo + h/2]`` (no widening when t = 0) covers with
probability 1 − α up to that 1e-6. This is the audit's case (many small remainder
terms, t ≪ h), and it uses no normal approximation. Otherwise E has the continuous
law Σ_j P(S = j) N(h j, t²) and the interval is ``[ẑ − q_{1−α/2}, ẑ − q_{α/2}]`` with its
quantiles (exact under the normal model of R). After unbiased rounding that keeps the
number within floor/ceil of its real value (every cell; node totals in the ``totals`` and
``bipartite`` modes), the integer error is D = ⌊E⌋ + Bernoulli(frac E) (the truth is
an integer), of law P(D = k) = E[Λ(E − k)], Λ(u) = max(0, 1 − |u|), always with atoms:
the randomized rule again. The randomized boundary is chosen over the conservative
rule (keep every boundary atom) because that one over-covers by up to the mass of an
atom (about 20 points at σ = 0.5); ``boundary="conservative"`` gives it (coverage
≥ 1 − α), and the method then reads ``"lattice-conservative"``.

``method="auto"`` uses the normal interval ``ẑ ∓ z·se`` when the law is close to normal:
when the lattice ripple of its CDF, (h / (π s √(2π)))·exp(−2π² t²/h²) with s the
standard error (h = 1, t = 0 after rounding: the error is then an integer), is at most
``tolerance`` (default 0.0025, i.e. coverage within about half a point); otherwise the
lattice law. With continuous noise (or no integer noise at the node) X is absent and,
before rounding, the normal interval is the model's exact one.

References
----------
Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022 — the projected noise law is public,
so the covariance of every released number is exact (§4).
Stevens, "Fiducial limits of the parameter of a discontinuous distribution", Biometrika 37,
1950 — randomized intervals for discrete laws.
Canonne, Kamath & Steinke, "The discrete Gaussian for differential privacy", NeurIPS 2020.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy.special import ndtr
from scipy.stats import norm

from censusdp.errors import SpecError
from censusdp.estimation.integer.laminar import rounding_variance
from censusdp.estimation.release import Release
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.mechanisms.queries import Measurement
from censusdp.rng import KeyedRNG

__all__ = [
    "normal_intervals",
    "coverage",
    "Intervals",
    "lattice_intervals",
]


def _z(alpha: float) -> float:
    if not 0.0 < alpha < 1.0:
        raise SpecError(f"alpha must be in (0, 1), got {alpha}")
    return float(norm.ppf(1.0 - alpha / 2.0))


def normal_intervals(
    estimates: np.ndarray, ses: np.ndarray, alpha: float = 0.1
) -> tuple[np.ndarray, np.ndarray]:
    """``estimate ∓ z_{1−α/2} · se``, elementwise (NaN where either is NaN).

    Raises
    ------
    SpecError
        ``alpha`` not in (0, 1).
    """
    half = _z(alpha) * np.asarray(ses, dtype=float)
    est = np.asarray(estimates, dtype=float)
    return est - half, est + half


def coverage(
    estimates: np.ndarray, truths: np.ndarray, ses: np.ndarray, alpha: float = 0.1
) -> float:
    """Share of ``|estimate − truth| ≤ z_{1−α/2} · se`` (entries with se = 0 must be exact)."""
    est, tru, se = (np.asarray(a, dtype=float) for a in (estimates, truths, ses))
    if not (est.shape == tru.shape == se.shape):
        raise SpecError("estimates, truths and ses must have the same shape")
    if est.size == 0:
        raise SpecError("coverage of an empty set is undefined")
    hit = np.abs(est - tru) <= _z(alpha) * se + 1e-9 * (1.0 + np.abs(tru))
    return float(hit.mean())


# ------------------------------------------------------------------ lattice-exact intervals
#: Rounding modes (``diagnostics["rounding"]`` of a rounded release) that keep every node
#: total within floor/ceil of its real value; every mode keeps every cell so.
_KEEPS_NODE_TOTALS = frozenset({"totals", "bipartite"})

#: Mass a truncated integer noise pmf may lose in each tail (see :func:`_integer_pmf`).
_TAIL = 1e-16

#: Largest P(|R| ≥ h/2) for which the remainder is treated as confined to half a lattice gap.
_GAP_TAIL = 1e-6


@dataclass(frozen=True, eq=False)
class Intervals:
    """``1 − alpha`` intervals for the released numbers of one level, with the rule used.

    Attributes
    ----------
    level : str
    what : {"cells", "totals"}
        Cells (n_nodes, n_cells) or node totals (n_nodes, 1).
    alpha : float
    lower, upper : numpy.ndarray
        Bounds for the true value (closed).
    method : numpy.ndarray
        Per entry: ``"normal"`` (estimate ∓ z·se), ``"lattice"`` (equal-tailed quantiles of
        the error law, continuous there), ``"lattice-randomized"`` (the error law has atoms;
        Stevens' randomized boundary) or ``"invariant"`` (se 0: released exactly).
    rounded : bool
        Intervals around integer (rounded) estimates.
    rule : str
        The rule in words, to be published with the intervals.
    """

    level: str
    what: str
    alpha: float
    lower: np.ndarray
    upper: np.ndarray
    method: np.ndarray
    rounded: bool
    rule: str

    def covers(self, truth: np.ndarray) -> np.ndarray:
        """Boolean array: ``lower ≤ truth ≤ upper`` (``truth`` shaped like the bounds)."""
        t = np.asarray(truth, dtype=float).reshape(self.lower.shape)
        return (self.lower <= t) & (t <= self.upper)

    def methods(self) -> dict[str, int]:
        """How many entries each method produced."""
        names, counts = np.unique(self.method, return_counts=True)
        return {str(n): int(c) for n, c in zip(names, counts, strict=True)}


def _integer_pmf(law: NoiseLaw, m: int) -> tuple[int, np.ndarray]:
    """The pmf of the sum of ``m`` iid draws of an integer noise law, as (offset, masses).

    Masses on ``offset, offset + 1, …``; each tail cut where its mass is below ``_TAIL``
    (the laws here are symmetric and log-concave, so a tail beyond the cut is at most the
    last kept mass over (1 − ratio) of consecutive masses — checked below).
    """
    sd = math.sqrt(law.variance)
    half = int(math.ceil(45.0 * sd)) + 3
    k = np.arange(-half, half + 1, dtype=np.float64)
    logp = np.asarray(law.log_density(k), dtype=np.float64)
    p = np.exp(logp - logp.max())
    p /= p.sum()
    out, off = np.ones(1), 0
    base, boff, n = p, -half, m
    while n:  # convolution power by repeated squaring
        if n & 1:
            out, off = np.convolve(out, base), off + boff
            out, off = _trim(out, off)
        n >>= 1
        if n:
            base, boff = _trim(np.convolve(base, base), 2 * boff)
    return off, out / out.sum()


def _trim(p: np.ndarray, off: int) -> tuple[np.ndarray, int]:
    c = np.cumsum(p)
    lo = int(np.searchsorted(c, _TAIL * c[-1], side="right"))
    hi = int(np.searchsorted(c, c[-1] * (1.0 - _TAIL), side="left"))
    return p[lo : hi + 1], off + lo


def _lattice_cdf(x: np.ndarray, atoms: np.ndarray, p: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Σ_j p_j Φ((x − a_j)/t) for every entry (rows): atoms (n, J), p (n, J), t (n,)."""
    return (p * ndtr((x[:, None] - atoms) / t[:, None])).sum(axis=1)


def _mixture_quantiles(atoms: np.ndarray, p: np.ndarray, t: np.ndarray, q: float) -> np.ndarray:
    """The q-quantile of the continuous law Σ_j p_j N(a_j, t²) of every row (bisection)."""
    lo = atoms.min(axis=1) - 9.0 * t
    hi = atoms.max(axis=1) + 9.0 * t
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        below = _lattice_cdf(mid, atoms, p, t) < q
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def _stevens(
    atoms: np.ndarray, p: np.ndarray, alpha: float, u: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Randomized equal-tailed acceptance region of a discrete law (Stevens 1950).

    With V(a) = F(a−) + U·p(a) and U ~ Uniform(0, 1) independent of the error E, V(E) is
    exactly uniform, and V is nondecreasing in a; the atoms with α/2 ≤ V(a) ≤ 1 − α/2 are
    a run ``[a_lo, a_hi]`` that contains E with probability exactly 1 − α.
    Atoms (n, J) sorted along rows; ``u`` (n,). ``u = None`` gives the conservative region
    (each tail's boundary atom kept: F(a) ≥ α/2 and F(a−) ≤ 1 − α/2; coverage ≥ 1 − α).
    """
    before = np.cumsum(p, axis=1) - p
    u_lo = np.ones(atoms.shape[0]) if u is None else u
    u_hi = np.zeros(atoms.shape[0]) if u is None else u
    ok = (
        (before + u_lo[:, None] * p >= alpha / 2.0)
        & (before + u_hi[:, None] * p <= 1.0 - alpha / 2.0)
        & (p > 0)
    )
    any_ok = ok.any(axis=1)
    j_lo = np.argmax(ok, axis=1)
    j_hi = ok.shape[1] - 1 - np.argmax(ok[:, ::-1], axis=1)
    rows = np.arange(atoms.shape[0])
    a_lo = np.where(any_ok, atoms[rows, j_lo], np.nan)
    a_hi = np.where(any_ok, atoms[rows, j_hi], np.nan)
    return a_lo, a_hi


def _normal_distance(h: np.ndarray, s: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Size of the lattice ripple of the CDF of h·S + R against its normal approximation.

    For a lattice variable of spacing h and standard deviation s plus an independent
    N(0, t²), Poisson summation gives F(x) = Φ(x/s) + ripple, the ripple's first Fourier
    term of amplitude (h / (π s √(2π)))·exp(−2π² t²/h²) (the characteristic function of R
    at the lattice frequency 2π/h damps it). A normal interval's coverage is off by at most
    about twice this amount.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        d = h / (math.pi * s * math.sqrt(2.0 * math.pi)) * np.exp(-2.0 * math.pi**2 * t**2 / h**2)
    return np.where((h > 0) & (s > 0), d, 0.0)


def lattice_intervals(
    release: Release,
    measurements: Sequence[Measurement],
    level: str | int,
    alpha: float = 0.1,
    *,
    what: Literal["cells", "totals"] = "cells",
    rounded: Release | None = None,
    rng: KeyedRNG | None = None,
    method: Literal["auto", "normal", "lattice"] = "auto",
    boundary: Literal["randomized", "conservative"] = "randomized",
    tolerance: float = 0.0025,
) -> Intervals:
    """Intervals that cover at the nominal rate when the noise is integer-valued and small.

    The error of a released number c·ẑ_v is linear in the noise and modelled as E = X + R:
    X = h·S, S the sum of the m own answers of largest weight h under one integer law (its
    law exact: convolution powers of the pmf, tails cut below 1e-16), and R the rest,
    normal with variance t² = Var(E) − h² m Var(e) (the one approximation). Where R stays
    within half a lattice gap (P(|R| ≥ h/2) ≤ 1e-6) the interval is X's randomized
    equal-tailed region widened by h/2 (Stevens 1950: coverage exactly 1 − α, no normal
    approximation); otherwise the quantiles of Σ_j P(S = j) N(h j, t²). After unbiased
    rounding the integer error D has P(D = k) = E[Λ(E − k)], Λ(u) = max(0, 1 − |u|): the
    randomized rule again. ``method="auto"`` takes the normal interval ``ẑ ∓ z·se`` where
    the lattice ripple (h / (π s √(2π)))·exp(−2π² t²/h²) is at most ``tolerance``. The
    derivation, step by step, is in this module's docstring (§ Lattice intervals).

    Parameters
    ----------
    release : Release
        The real-valued GLS release, computed with ``covariance=True`` (the weights of a
        node's own answers come from its covariance).
    measurements : sequence of Measurement
        The measurements the release was estimated from (only those of ``level`` are used).
    level : str or int
    alpha : float
        1 − nominal coverage.
    what : {"cells", "totals"}
        Intervals for every cell or for every node total.
    rounded : Release, optional
        The integer release :func:`~censusdp.estimation.integer.laminar.round_release` made from
        ``release``: the intervals are then around its values (its reported variances serve
        the normal rule for cells).
    rng : KeyedRNG
        Source of the uniforms of the randomized boundary (needed when it is used).
    method : {"auto", "normal", "lattice"}
    boundary : {"randomized", "conservative"}
        ``"conservative"`` keeps every boundary atom (coverage ≥ 1 − α; the method then
        reads ``"lattice-conservative"``).
    tolerance : float
        Largest lattice ripple for which ``"auto"`` takes the normal interval (default
        0.0025: coverage within about half a point).

    Returns
    -------
    Intervals
        Bounds, the method of every entry and the rule in words.

    Raises
    ------
    SpecError
        Bad alpha, what, method or boundary; a release without covariances or variances;
        Euclidean geometry with unequal scales; rounded totals from a rounding mode that
        does not keep node totals within floor/ceil; the randomized rule without ``rng``.

    References
    ----------
    Stevens, "Fiducial limits of the parameter of a discontinuous distribution",
    Biometrika 37, 1950 — the randomized interval for discrete laws.
    Canonne, Kamath & Steinke, "The discrete Gaussian for differential privacy",
    NeurIPS 2020 — the integer noise laws.
    Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022 — the projected noise law is
    public, so the error law of every released number is known.
    """
    z = _z(alpha)
    _check_choices(what, method, boundary)
    k = release.hierarchy.level_index(level)
    name = release.hierarchy.names[k]
    cov_c, var, C = _level_errors(release, k, what)
    real = release.estimates[k].astype(float) @ C
    est, var_normal = _released(rounded, k, what, var, real, C)
    law = _error_law(measurements, k, name, cov_c, var)
    fixed = var <= 1e-12 * (1.0 + np.abs(real))
    use_normal = _normal_rule(law, var_normal, rounded is not None, method, tolerance)
    half = z * np.sqrt(np.maximum(var_normal, 0.0))
    lower, upper = est - half, est + half
    meth = np.where(use_normal, "normal", "").astype(object)
    rows, law = _lattice_rows(
        law, ~use_normal & ~fixed, use_normal, meth, rounded is not None, method, tolerance
    )
    if np.any(rows):
        idx = np.flatnonzero(rows.ravel())
        uniforms = _LazyUniforms(rng, boundary, name, what, law.h.size)
        lo_err, hi_err, kind = _lattice_errors(
            law, idx, rounded is not None, alpha, boundary, uniforms
        )
        flat_lo, flat_hi = lower.ravel(), upper.ravel()
        e = est.ravel()[idx]
        flat_lo[idx] = e - hi_err
        flat_hi[idx] = e - lo_err
        meth.ravel()[idx] = kind
    # a held figure is released exactly: the integer it equals (the GLS float carries a few
    # ulps of its solve), or the real value itself when the invariant is not an integer
    held = np.where(np.abs(est - np.round(est)) <= 1e-9 * (1.0 + np.abs(est)), np.round(est), est)
    lower[fixed], upper[fixed] = held[fixed], held[fixed]
    meth[fixed] = "invariant"
    return Intervals(
        level=name,
        what=what,
        alpha=float(alpha),
        lower=lower,
        upper=upper,
        method=np.asarray(meth, dtype=str),
        rounded=rounded is not None,
        rule=_rule(alpha, what, name, rounded is not None, method, z, tolerance, boundary),
    )


@dataclass(frozen=True, eq=False)
class _ErrorLaw:
    """The model E = X + R of the error of every entry (n, nq) of one level.

    X = h·S with S the sum of ``m`` draws of ``laws[law]`` (``law`` −1: no lattice part),
    R normal with standard deviation ``t``; ``s`` is the standard error of E.
    """

    h: np.ndarray
    m: np.ndarray
    law: np.ndarray
    laws: tuple[NoiseLaw, ...]
    t: np.ndarray
    s: np.ndarray


def _check_choices(what: str, method: str, boundary: str) -> None:
    if what not in ("cells", "totals"):
        raise SpecError(f"what must be 'cells' or 'totals', got {what!r}")
    if method not in ("auto", "normal", "lattice"):
        raise SpecError(f"method must be 'auto', 'normal' or 'lattice', got {method!r}")
    if boundary not in ("randomized", "conservative"):
        raise SpecError(f"boundary must be 'randomized' or 'conservative', got {boundary!r}")


def _level_errors(release: Release, k: int, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node of level ``k``: Cov(ẑ_v)·C (n, K, q), the variances of the q released
    numbers (n, q) and C, the identity (cells) or a column of ones (totals)."""
    K = len(release.cells)
    if release.variances is None:
        raise SpecError(f"the {release.estimator!r} release has no variances; intervals need them")
    if release.diagnostics.get("geometry") == "euclidean":
        raise SpecError(
            "lattice intervals need the weighted (GLS) geometry: the weights of the answers "
            "are the inverse noise variances only there"
        )
    if release.covariances is not None:
        cov = np.asarray(release.covariances[k], dtype=float)
    elif K == 1:
        cov = np.asarray(release.variances[k], dtype=float)[:, :, None]
    else:
        raise SpecError(
            "lattice intervals need each node's covariance: estimate with "
            "tree_gls(..., covariance=True)"
        )
    C = np.eye(K) if what == "cells" else np.ones((K, 1))
    cov_c = cov @ C  # (n, K, q)
    var = np.maximum(np.einsum("kq,nkq->nq", C, cov_c), 0.0)
    return cov_c, var, C


def _released(
    rounded: Release | None, k: int, what: str, var: np.ndarray, real: np.ndarray, C: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The numbers the intervals are around and the variance of their normal rule."""
    if rounded is None:
        return real, var
    mode = rounded.diagnostics.get("rounding")
    if what == "totals" and mode not in _KEEPS_NODE_TOTALS:
        raise SpecError(
            f"rounding mode {mode!r} does not keep node totals within floor/ceil of their "
            f"real values, so their error law is not known; round with one of "
            f"{sorted(_KEEPS_NODE_TOTALS)} for intervals on rounded totals"
        )
    est = rounded.estimates[k].astype(float) @ C
    if what == "cells" and rounded.variances is not None:
        return est, np.asarray(rounded.variances[k], dtype=float)
    return est, var + rounding_variance(real)


def _error_law(
    measurements: Sequence[Measurement], k: int, name: str, cov_c: np.ndarray, var: np.ndarray
) -> _ErrorLaw:
    """X: the own answers of largest |weight| under one integer law; R: the rest.

    The weights of the node's own answers are w = Q Cov_v c / Var(e) (the GLS weights are
    the inverse noise variances); t² = Var(E) − h² m Var(e).
    """
    n, nq = var.shape
    hmax = np.zeros((n, nq))
    mcount = np.zeros((n, nq), dtype=np.int64)
    law_of = np.full((n, nq), -1, dtype=np.int64)
    laws: list[NoiseLaw] = []
    for meas in measurements:
        if meas.level != k or not getattr(meas.law, "is_integer", False):
            continue
        nv = getattr(meas, "node_variance", None)
        v_ans = np.full(n, meas.law.variance) if nv is None else np.asarray(nv, dtype=float)
        Q = np.asarray(meas.query.matrix, dtype=float)
        w = np.abs(np.einsum("rk,nkq->nrq", Q, cov_c)) / v_ans[:, None, None]
        wmax = w.max(axis=1)
        m_here = (w >= wmax[:, None, :] * (1.0 - 1e-9)).sum(axis=1)
        if nv is not None and np.ptp(v_ans) > 0:
            raise SpecError(
                f"level {name!r}, query {meas.query.name!r}: lattice intervals need one "
                "integer noise law per query (node_variance differs by node)"
            )
        better = wmax > hmax * (1.0 + 1e-9)
        hmax = np.where(better, wmax, hmax)
        mcount = np.where(better, m_here, mcount)
        law_of = np.where(better, len(laws), law_of)
        laws.append(meas.law)
    var_x = np.zeros((n, nq))
    for j, law in enumerate(laws):
        sel = law_of == j
        var_x[sel] = hmax[sel] ** 2 * mcount[sel] * law.variance
    t2 = var - var_x
    if np.any(t2 < -1e-7 * (1.0 + var)):
        raise SpecError(
            f"level {name!r}: the node covariances do not match these measurements (an own "
            "answer explains more variance than the estimate has); pass the measurements "
            "the release was estimated from"
        )
    t = np.sqrt(np.maximum(t2, 0.0))
    t = np.where(t2 <= 1e-10 * np.maximum(var, 1e-300), 0.0, t)
    return _ErrorLaw(hmax, mcount, law_of, tuple(laws), t, np.sqrt(var))


def _normal_rule(
    law: _ErrorLaw, var_normal: np.ndarray, rounded: bool, method: str, tolerance: float
) -> np.ndarray:
    """Where the normal interval is used: by ``method``, and for ``"auto"`` where the
    lattice ripple (h = 1, t = 0 after rounding) is at most ``tolerance``."""
    s, t = law.s, law.t
    if not rounded:
        ripple = np.where(law.law >= 0, _normal_distance(law.h, s, t), 0.0)
    else:
        ripple = _normal_distance(np.ones_like(s), np.sqrt(var_normal), np.zeros_like(s))
    use_normal = (
        np.ones(s.shape, bool)
        if method == "normal"
        else (ripple <= tolerance)
        if method == "auto"
        else np.zeros(s.shape, bool)
    )
    if not rounded:  # no lattice part: the model's law is N(0, var)
        use_normal |= (law.law < 0) & (method != "lattice")
    return use_normal


def _lattice_rows(
    law: _ErrorLaw,
    todo: np.ndarray,
    use_normal: np.ndarray,
    meth: np.ndarray,
    rounded: bool,
    method: str,
    tolerance: float,
) -> tuple[np.ndarray, _ErrorLaw]:
    """The entries whose interval comes from the error law, and that law (``meth`` set
    where ``"lattice"`` meets a level without integer noise: the normal law is exact)."""
    if not rounded:
        if method == "lattice":
            meth[~use_normal & (law.law < 0)] = "normal"
        return todo & (law.law >= 0), law
    # where the real-valued error is itself close to normal, D's law is that of a
    # rounded N(0, var): the lattice part is folded into R
    smooth = (law.law < 0) | (_normal_distance(law.h, law.s, law.t) <= 0.1 * tolerance)
    folded = replace(
        law,
        law=np.where(smooth, -1, law.law),
        m=np.where(smooth, 0, law.m),
        h=np.where(smooth, 0.0, law.h),
        t=np.where(smooth, law.s, law.t),
    )
    return todo, folded


@dataclass(eq=False)
class _LazyUniforms:
    """The randomized boundary's uniforms, drawn on first use (so that a level that never
    needs them needs no ``rng``); None under the conservative rule."""

    rng: KeyedRNG | None
    boundary: str
    level: str
    what: str
    size: int

    @functools.cached_property
    def uniforms(self) -> np.ndarray | None:
        if self.boundary == "conservative":
            return None
        if self.rng is None:
            raise SpecError(
                "the randomized boundary needs a KeyedRNG (rng=...); or pass "
                "boundary='conservative' for intervals that cover at least the nominal rate"
            )
        return self.rng.generator(f"intervals/{self.level}/{self.what}").random(self.size)

    def take(self, index: np.ndarray) -> np.ndarray | None:
        return None if self.uniforms is None else self.uniforms[index]


def _lattice_errors(
    law: _ErrorLaw,
    idx: np.ndarray,
    rounded: bool,
    alpha: float,
    boundary: str,
    uniforms: _LazyUniforms,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Error quantiles (lower, upper) and the method of the flat entries ``idx``, one
    pmf per group of entries sharing (law, m)."""
    groups = np.stack([law.law.ravel()[idx], law.m.ravel()[idx]], axis=1)
    keys, inv = np.unique(groups, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    lo_err = np.empty(idx.size)
    hi_err = np.empty(idx.size)
    kind = np.empty(idx.size, dtype=object)
    for g, (law_j, m_j) in enumerate(keys):
        rows = np.flatnonzero(inv == g)
        sub = idx[rows]
        hh = law.h.ravel()[sub]
        tt = law.t.ravel()[sub]
        if law_j >= 0:
            off, pmf = _integer_pmf(law.laws[int(law_j)], int(m_j))
        else:
            off, pmf = 0, np.ones(1)
        jj = np.arange(off, off + pmf.size, dtype=float)
        atoms = hh[:, None] * jj[None, :]
        P = np.broadcast_to(pmf, atoms.shape)
        if rounded:
            lo_err[rows], hi_err[rows] = _rounded_region(atoms, P, tt, alpha, uniforms.take(sub))
            kind[rows] = "lattice-" + boundary
        else:
            _real_region(
                atoms, P, hh, tt, alpha, boundary, uniforms, sub, rows, (lo_err, hi_err, kind)
            )
    return lo_err, hi_err, kind


def _real_region(
    atoms: np.ndarray,
    P: np.ndarray,
    hh: np.ndarray,
    tt: np.ndarray,
    alpha: float,
    boundary: str,
    uniforms: _LazyUniforms,
    sub: np.ndarray,
    rows: np.ndarray,
    out: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Error bounds of real-valued estimates into ``out[rows]``: where R stays within half
    a lattice gap (normal tail ≤ ``_GAP_TAIL``) the randomized region of X's atoms, each
    widened by h/2; elsewhere the quantiles of the mixture Σ_j P(S = j) N(h j, t²)."""
    lo_err, hi_err, kind = out
    disc = (tt == 0) | (2.0 * ndtr(-hh / (2.0 * np.maximum(tt, 1e-300))) <= _GAP_TAIL)
    cont = ~disc
    if np.any(cont):
        c = rows[cont]
        a, b = atoms[cont], P[cont]
        lo_err[c] = _mixture_quantiles(a, b, tt[cont], alpha / 2.0)
        hi_err[c] = _mixture_quantiles(a, b, tt[cont], 1.0 - alpha / 2.0)
        kind[c] = "lattice"
    if np.any(disc):
        a_rows = rows[disc]
        kind[a_rows] = "lattice-" + boundary
        u = uniforms.take(sub[disc])
        a_lo, a_hi = _stevens(atoms[disc], P[disc], alpha, u)
        gap = np.where(tt[disc] > 0, hh[disc] / 2.0, 0.0)
        lo_err[a_rows], hi_err[a_rows] = a_lo - gap, a_hi + gap


def _rounded_region(
    atoms: np.ndarray, P: np.ndarray, tt: np.ndarray, alpha: float, u: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Stevens region of the integer error D after rounding: P(D = k) =
    Σ_j p_j E[Λ(h j + R − k)], only k within 1 + 9t of an atom h j contributing."""
    W = int(np.ceil(1.0 + 9.0 * tt.max())) + 1
    base = np.rint(atoms).astype(np.int64)
    L = int(np.abs(base).max()) + W
    kk = np.arange(-L, L + 1, dtype=float)
    qk = np.zeros((atoms.shape[0], kk.size))
    r_idx = np.broadcast_to(np.arange(atoms.shape[0])[:, None], base.shape)
    for d in range(-W, W + 1):
        kd = base + d
        contrib = P * _tent_mean(atoms - kd, tt[:, None])
        np.add.at(qk, (r_idx, kd + L), contrib)
    qk /= qk.sum(axis=1, keepdims=True)
    kat = np.broadcast_to(kk, qk.shape)
    return _stevens(kat, qk, alpha, u)


def _rule(
    alpha: float,
    what: str,
    name: str,
    rounded: bool,
    method: str,
    z: float,
    tolerance: float,
    boundary: str,
) -> str:
    """The rule in words, to be published with the intervals."""
    return (
        f"{100 * (1 - alpha):g}% intervals for {what} at level {name!r}"
        + (" after unbiased integer rounding" if rounded else "")
        + f"; method {method!r}: normal (estimate ± {z:.4f}·se) where the lattice ripple of "
        f"the error law is at most {tolerance:g}, otherwise the error law (the node's own "
        "integer noise exactly, the rest normal with the remaining variance)"
        + (
            "; where that law has atoms the boundary atoms are included at random (Stevens "
            "1950), so coverage is exactly nominal and the interval is not a function of the "
            "estimate alone"
            if boundary == "randomized"
            else "; where that law has atoms every boundary atom is included (coverage at "
            "least nominal)"
        )
    )


def _tent_mean(mu: np.ndarray, t: np.ndarray) -> np.ndarray:
    """E[Λ(mu + R)], Λ(u) = max(0, 1 − |u|), R ~ N(0, t²) (t = 0: Λ(mu))."""

    def g(m: np.ndarray) -> np.ndarray:  # E[(m + R)_+]
        with np.errstate(divide="ignore", invalid="ignore"):
            r = m / t
            val = m * ndtr(r) + t * np.exp(-0.5 * r * r) / math.sqrt(2.0 * math.pi)
        return np.where(t > 0, val, np.maximum(m, 0.0))

    return np.maximum(g(mu + 1.0) - 2.0 * g(mu) + g(mu - 1.0), 0.0)
