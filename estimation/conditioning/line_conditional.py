"""Exact conditional laws of ℓ₁ (Laplace-type) product targets along a line.

For a target ``log π(s) = −Σ_i β_i |s_i| + const`` (independent Laplace, discrete Laplace or
the ℓ₁ generalized Laplace on a lattice) and a move direction with coefficients ``c`` on the
touched coordinates, the conditional law of the step δ on the line ``s + δ c`` has the
log-density

    f(δ) = −Σ_k β_k |a_k + c_k δ|,      a_k = s_{idx_k},

a concave piecewise-linear function with breakpoints ``−a_k / c_k``; optional bounds
(inequality constraints such as non-negativity of the released table, or a truncation box)
restrict δ to ``[lo, hi]``. On every piece the density is exponential, so the normaliser
is a sum of closed-form integrals (geometric sums for integer δ) and an exact draw is: pick
a piece with probability proportional to its mass, then invert the piece's (truncated)
exponential CDF. This makes the heat-bath ("Gibbs along a pair direction") kernel of
:mod:`censusdp.estimation.conditioning.gibbs_moves` possible, and with the normaliser the conditional
densities of two chains can be maximally coupled, which is what makes coupled chains meet.
:func:`couple_lines` is generic: it couples Gaussian-type lines
(:class:`~censusdp.estimation.conditioning.gaussian_line.GaussianLine`) with the same code.

All functions work on a batch of independent lines: arrays of shape ``(n, K)`` for the
terms and ``(n,)`` for the bounds. Terms with ``c_k = 0`` or ``β_k = 0`` are inactive.
Draws use float64 arithmetic (inverse CDF); for integer lines the draw is an integer
exactly, and its law equals the discrete conditional up to floating-point rounding of the
inverse CDF (relative error ~1e-15 per probability).

References
----------
Devroye (1986), *Non-Uniform Random Variate Generation*, §II.2 (inversion) and §VII.2
(log-concave densities); Thorisson (2000) for the maximal coupling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["Line", "LaplaceLine", "couple_lines", "distance", "invert_rows"]


class Line(Protocol):
    """What :func:`couple_lines` needs of a batch of line conditionals: :class:`LaplaceLine`
    and :class:`~censusdp.estimation.conditioning.gaussian_line.GaussianLine` provide it."""

    proper: np.ndarray
    log_norm: np.ndarray

    def sample(
        self, gen: np.random.Generator | None = None, u: np.ndarray | None = None
    ) -> np.ndarray: ...

    def log_pdf(self, delta: np.ndarray) -> np.ndarray: ...

    def subset(self, rows: np.ndarray) -> Line: ...

    def distance(self, other: Line, shift: np.ndarray) -> np.ndarray: ...


def _logaddexp_reduce(x: np.ndarray) -> np.ndarray:
    """``log Σ_j exp(x[..., j])`` with −inf entries allowed (all −inf gives −inf)."""
    m = np.max(x, axis=-1)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.sum(np.exp(x - safe[..., None]), axis=-1))


def line_inputs(
    a: np.ndarray,
    c: np.ndarray,
    weight: np.ndarray,
    lo: np.ndarray | None,
    hi: np.ndarray | None,
    integer: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A line's inputs as float arrays: ``(a, c, weight, lo, hi)``, weights of terms with
    ``c = 0`` zeroed, missing bounds infinite, integer bounds rounded inward."""
    a = np.asarray(a, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    weight = np.where(c != 0, np.asarray(weight, dtype=np.float64), 0.0)
    n = a.shape[0]
    lo = np.full(n, -np.inf) if lo is None else np.asarray(lo, dtype=np.float64)
    hi = np.full(n, np.inf) if hi is None else np.asarray(hi, dtype=np.float64)
    if integer:
        lo, hi = np.ceil(lo), np.floor(hi)
    return a, c, weight, lo, hi


def take_rows(line: Line, rows: np.ndarray) -> Line:
    """The lines at ``rows`` of a batch (every array field is indexed by line first)."""
    return dataclasses.replace(
        line,  # type: ignore[type-var]
        **{
            f.name: getattr(line, f.name)[rows]
            for f in dataclasses.fields(line)  # type: ignore[arg-type]
            if isinstance(getattr(line, f.name), np.ndarray)
        },
    )


def same_bounds(x: Line, y: Line, shift: np.ndarray) -> np.ndarray:
    """Per line, whether y's bounds shifted by ``shift`` are x's (infinite ends match)."""
    same_lo = np.isclose(x.lo, y.lo - shift, rtol=0.0, atol=1e-9) | (
        np.isinf(x.lo) & np.isinf(y.lo)
    )
    same_hi = np.isclose(x.hi, y.hi - shift, rtol=0.0, atol=1e-9) | (
        np.isinf(x.hi) & np.isinf(y.hi)
    )
    return same_lo & same_hi


def invert_rows(p: np.ndarray, ok: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per row, the first ``j`` with ``cdf[j] > u·cdf[-1]`` for the masses ``p`` (0 off the
    support ``ok``), never off ``ok`` through rounding (Devroye 1986, §III.2, sequential
    search); the pieces of :class:`LaplaceLine` and the windows of ``GaussianLine`` use it.
    Returns ``(j, cdf, u·cdf[:, -1])``."""
    cdf = np.cumsum(p, axis=1)
    target = u * cdf[:, -1]
    j = np.minimum((cdf <= target[:, None]).sum(axis=1), p.shape[1] - 1)
    rows = np.arange(u.size)
    last_ok = np.maximum.accumulate(np.where(ok, np.arange(ok.shape[1]), -1), axis=1)
    return np.where(ok[rows, j], j, np.maximum(last_ok[rows, j], 0)), cdf, target


@dataclass(frozen=True)
class LaplaceLine:
    """The conditional law of δ on a batch of lines (see the module docstring).

    Build with :meth:`build`; draw with :meth:`sample`; evaluate with :meth:`log_pdf`.

    Attributes
    ----------
    a, c, beta : numpy.ndarray
        (n, K) float64 current values, direction coefficients and weights (inactive terms
        have weight 0).
    lo, hi : numpy.ndarray
        (n,) bounds on δ (±inf where none); integer lines have integer bounds.
    integer : bool
        δ ∈ ℤ (a lattice) rather than ℝ.
    left, right : numpy.ndarray
        (n, K + 1) ends of the linear pieces (closed integer ranges for integer lines).
    slope : numpy.ndarray
        (n, K + 1) slope of f on each piece.
    log_mass : numpy.ndarray
        (n, K + 1) log of each piece's mass (−inf for an empty piece).
    log_norm : numpy.ndarray
        (n,) log normaliser ``log ∫ e^f`` (or ``log Σ e^f``).
    proper : numpy.ndarray
        (n,) bool: the line has finite mass (some active term, or finite bounds).
    """

    a: np.ndarray
    c: np.ndarray
    beta: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    integer: bool
    left: np.ndarray
    right: np.ndarray
    slope: np.ndarray
    log_mass: np.ndarray
    log_norm: np.ndarray
    proper: np.ndarray

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls,
        a: np.ndarray,
        c: np.ndarray,
        beta: np.ndarray,
        lo: np.ndarray | None = None,
        hi: np.ndarray | None = None,
        *,
        integer: bool = False,
    ) -> LaplaceLine:
        """The conditional law for current values ``a``, coefficients ``c`` and weights β.

        Parameters
        ----------
        a, c, beta : array_like
            (n, K); ``beta ≥ 0``.
        lo, hi : array_like, optional
            (n,) bounds on δ; None for unbounded. For integer lines they are rounded inward.
        integer : bool
        """
        a, c, beta, lo, hi = line_inputs(a, c, beta, lo, hi, integer)
        n = a.shape[0]
        weight = beta * np.abs(c)
        active = weight > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            brk = np.where(active, -a / np.where(c != 0, c, 1.0), np.nan)
        # inactive breakpoints go to the end with weight 0 (empty pieces)
        fill = np.nanmax(np.where(active, brk, -np.inf), axis=1, initial=-np.inf)
        fill = np.where(np.isfinite(fill), fill, 0.0)
        brk = np.where(active, brk, fill[:, None])
        order = np.argsort(brk, axis=1, kind="stable")
        brk = np.take_along_axis(brk, order, axis=1)
        w_sorted = np.take_along_axis(weight, order, axis=1)
        total = weight.sum(axis=1)
        cum = np.concatenate([np.zeros((n, 1)), np.cumsum(w_sorted, axis=1)], axis=1)
        slope = total[:, None] - 2.0 * cum  # f' on piece m (left of all: +total)
        if integer:
            edges = np.clip(np.ceil(brk), lo[:, None], hi[:, None] + 1.0)
            left = np.concatenate([lo[:, None], edges], axis=1)
            right = np.concatenate([edges - 1.0, hi[:, None]], axis=1)
            right = np.maximum(right, left - 1.0)  # empty pieces: right = left − 1
            count = right - left + 1.0
        else:
            edges = np.clip(brk, lo[:, None], hi[:, None])
            left = np.concatenate([lo[:, None], edges], axis=1)
            right = np.concatenate([edges, hi[:, None]], axis=1)
            count = right - left
        proper = (total > 0) | (np.isfinite(lo) & np.isfinite(hi) & (hi >= lo))
        if integer:
            f_left = _f(a, c, beta, left)
            f_right = _f(a, c, beta, right)
        else:  # pieces share their ends: evaluate f once at lo, the edges and hi
            f_ends = _f(a, c, beta, np.concatenate([left, hi[:, None]], axis=1))
            f_left, f_right = f_ends[:, :-1], f_ends[:, 1:]
        top = np.maximum(f_left, f_right)
        mag = np.abs(slope)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if integer:
                shape = np.where(
                    mag > 0,
                    np.log(-np.expm1(-mag * count)) - np.log(-np.expm1(-mag)),
                    np.log(count),
                )
            else:
                shape = np.where(
                    mag > 0, np.log(-np.expm1(-mag * count)) - np.log(mag), np.log(count)
                )
            empty = ~(count > 0) if not integer else ~(count >= 1)
            log_mass = np.where(empty | ~np.isfinite(top), -np.inf, top + shape)
        log_mass = np.where(proper[:, None], log_mass, -np.inf)
        log_norm = _logaddexp_reduce(log_mass)
        # a continuous line whose feasible set is one point (lo == hi, e.g. a count held at
        # its bound from both sides) has no density: it is improper and keeps δ = 0
        proper &= np.isfinite(log_norm)
        log_mass = np.where(proper[:, None], log_mass, -np.inf)
        return cls(
            a, c, beta, lo, hi, bool(integer), left, right, slope, log_mass, log_norm, proper
        )

    # ------------------------------------------------------------------ evaluation
    def log_pdf(self, delta: np.ndarray) -> np.ndarray:
        """Normalised log-density (log-mass for integer lines) of δ, per line."""
        delta = np.asarray(delta, dtype=np.float64)
        f = _f(self.a, self.c, self.beta, delta[:, None])[:, 0] - self.log_norm
        inside = (delta >= self.lo) & (delta <= self.hi) & self.proper
        if self.integer:
            inside &= delta == np.round(delta)
        return np.where(inside, f, -np.inf)

    def sample(
        self, gen: np.random.Generator | None = None, u: np.ndarray | None = None
    ) -> np.ndarray:
        """One exact draw of δ per line (0 on improper lines), by inversion of the CDF.

        Parameters
        ----------
        gen : numpy.random.Generator, optional
            Source of the uniforms when ``u`` is not given.
        u : numpy.ndarray, optional
            (n,) uniforms on [0, 1); the draw is non-decreasing in ``u`` (the quantile
            function), so a common ``u`` couples two lines synchronously.
        """
        n = self.log_mass.shape[0]
        if u is None:
            u = gen.random(n)
        p = np.exp(self.log_mass - np.where(self.proper, self.log_norm, 0.0)[:, None])
        m, cdf, target = invert_rows(p, np.isfinite(self.log_mass), u)
        rows = np.arange(n)
        below = np.where(m > 0, cdf[rows, np.maximum(m - 1, 0)], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            u_in = np.clip((target - below) / p[rows, m], 0.0, 1.0)
        u_in = np.where(np.isfinite(u_in), u_in, 0.5)
        lo, hi, slope = self.left[rows, m], self.right[rows, m], self.slope[rows, m]
        # offsets are measured from the piece's higher end; flip u there to stay monotone
        v = np.where(slope > 0, 1.0 - u_in, u_in)
        mag = np.abs(slope)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.integer:
                count = hi - lo + 1.0
                w = -np.log1p(v * np.expm1(-mag * count)) / mag
                k = np.where(mag > 0, np.ceil(w) - 1.0, np.floor(v * count))
                k = np.clip(k, 0.0, np.maximum(count - 1.0, 0.0))
            else:
                length = hi - lo
                k = np.where(
                    mag > 0,
                    -np.log1p(v * np.expm1(-mag * length)) / mag,
                    v * length,
                )
                k = np.clip(k, 0.0, length)
            out = np.where(slope > 0, hi - k, lo + k)
        return np.where(self.proper, out, 0.0)

    subset = take_rows  # the lines at ``rows``

    def distance(self, other: LaplaceLine, shift: np.ndarray) -> np.ndarray:
        """A bound on ``sup |log p_x(δ) − log p_y(δ + shift)|`` (unnormalised), per line,
        with this line x and ``other`` y.

        ``Σ_k β_k |a^x_k − a^y_k − c_k shift|``, and +inf where the two lines' bounds differ,
        so 0 means identical conditionals (up to the shift).
        """
        x, y = self, other
        shift = np.asarray(shift, dtype=np.float64)
        d = np.einsum("nk,nk->n", x.beta, np.abs(x.a - y.a - x.c * shift[:, None]))
        return np.where(same_bounds(x, y, shift), d, np.inf)


def _f(a: np.ndarray, c: np.ndarray, beta: np.ndarray, points: np.ndarray) -> np.ndarray:
    """``f`` at ``points`` (n, P): ``−Σ_k β_k |a_k + c_k δ|``, −inf at infinite points."""
    finite = np.isfinite(points)
    x = np.where(finite, points, 0.0)
    val = -np.einsum("nk,npk->np", beta, np.abs(a[:, None, :] + c[:, None, :] * x[..., None]))
    total = beta.sum(axis=1)[:, None]
    return np.where(finite, val, np.where(total > 0, -np.inf, 0.0))


def distance(x: Line, y: Line, shift: np.ndarray) -> np.ndarray:
    """How far line ``y`` (shifted by ``shift``) is from line ``x``, per line; 0 means
    identical conditionals up to the shift, +inf where the bounds differ.

    Dispatches on the line family: :meth:`LaplaceLine.distance` (a bound on the sup of the
    unnormalised log-density difference) or
    :meth:`~censusdp.estimation.conditioning.gaussian_line.GaussianLine.distance` (the centres' difference
    in standard deviations).
    """
    if type(x) is not type(y):
        raise TypeError(f"cannot compare a {type(x).__name__} with a {type(y).__name__}")
    return x.distance(y, shift)


def couple_lines(
    x: Line,
    y: Line,
    shift: np.ndarray,
    gen: np.random.Generator,
    *,
    close: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Couple δx ~ x and δy ~ y: synchronously when the lines differ, maximally when close.

    Lines whose conditionals differ by more than ``close`` (:func:`distance`) get common
    random numbers (the same uniform through both quantile functions), which contracts the
    difference between the two chains; lines closer than that are coupled maximally so that
    ``δy = δx + shift`` — with ``shift`` the difference of an anchor coordinate of
    coefficient +1, their new values coincide — with the largest possible probability. A
    maximal coupling's failures draw independent residuals, far apart, so it is kept for
    nearly identical laws, where it almost never fails; integer lines meet under the
    synchronous coupling alone. δx is always an exact draw of x, and so is δy on every
    synchronously coupled line; identical lines (chains that have met) get identical draws,
    so met chains stay together. On a maximally coupled line δy is exact except when the
    residual's rejection sampler gives up (see :func:`_maximal`): then δy's law is off by at
    most d_TV(x, y)·(1 − d_TV)^1000 ≤ min(d_TV(x, y), 1/(1000·e)) in total variation. For
    Laplace lines, lines are only coupled maximally when the unnormalised log densities
    differ by at most ``close`` everywhere, so that is at most about 2·``close`` per such
    line; for Gaussian lines ``close`` bounds the centres' difference in standard deviations
    (:meth:`~censusdp.estimation.conditioning.gaussian_line.GaussianLine.distance`), so d_TV ≤
    ``close``/√(2π) on lines without bounds.

    The same code couples either family (:class:`LaplaceLine` or
    :class:`~censusdp.estimation.conditioning.gaussian_line.GaussianLine`, both lines of one family): it
    only uses the lines' quantile functions, densities and :func:`distance`.

    Returns
    -------
    dx, dy : numpy.ndarray
        (n,) steps.
    coupled : numpy.ndarray
        bool, True where ``δy = δx + shift``.

    References
    ----------
    Thorisson (2000), *Coupling, Stationarity, and Regeneration*; Jacob, O'Leary & Atchadé
    (2020), JRSS-B, Algorithm 2 and §4 (synchronous couplings to contract, maximal to meet).
    """
    shift = np.asarray(shift, dtype=np.float64)
    u = gen.random(shift.size)
    dx, dy = x.sample(u=u), y.sample(u=u)
    near = np.flatnonzero(distance(x, y, shift) <= close)
    coupled = np.isclose(dy, dx + shift, rtol=0.0, atol=1e-12)
    if near.size:
        mx, my, ok = _maximal(x.subset(near), y.subset(near), shift[near], gen)
        dx[near], dy[near], coupled[near] = mx, my, ok
    return dx, dy, coupled


def _maximal(
    x: Line,
    y: Line,
    shift: np.ndarray,
    gen: np.random.Generator,
    *,
    max_rounds: int = 1000,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Maximally couple δx ~ x and δy ~ y so that ``δy = δx + shift`` when possible
    (rejection algorithm with independent residuals).

    The residual is drawn by rejection from y, accepted with probability about d_TV(x, y)
    per round; after ``max_rounds`` rounds δy is drawn from y itself instead, which puts
    δy's law off by at most d_TV(x, y)·(1 − d_TV)^max_rounds ≤ d_TV(x, y) in total
    variation (δx stays exact).
    """
    dx = x.sample(gen)
    log_w = np.log(gen.random(dx.size)) + x.log_pdf(dx)
    coupled = (log_w <= y.log_pdf(dx + shift)) & x.proper & y.proper
    dy = np.where(coupled, dx + shift, 0.0)
    todo = np.flatnonzero(~coupled)
    for _ in range(max_rounds):
        if todo.size == 0:
            break
        ys = y.subset(todo)
        cand = ys.sample(gen)
        ok = np.log(gen.random(todo.size)) + ys.log_pdf(cand) > x.subset(todo).log_pdf(
            cand - shift[todo]
        )
        ok |= ~ys.proper | ~x.proper[todo]
        dy[todo[ok]] = cand[ok]
        todo = todo[~ok]
    if todo.size:  # δy from y instead of the residual: off by at most d_TV(x, y)
        dy[todo] = y.subset(todo).sample(gen)
    return dx, dy, coupled
