"""Exact integer noise: the discrete Laplace and discrete Gaussian laws and their samplers.

Every accept/reject decision is made with integer uniforms (``Generator.integers``) and
integer arithmetic: no floating-point exponential, logarithm or square root ever decides a
draw, so the samplers are exact (Canonne, Kamath & Steinke 2020; cf. Mironov 2012 on the
floating-point attacks this avoids). Parameters are rational (:class:`fractions.Fraction`).

The samplers are vectorised over numpy int64 arrays: each rejection loop runs on the still
pending subset, Bernoulli trials are drawn in batches, and geometric variables are produced by
counting runs in one bulk array of Bernoulli(exp(−1)) trials. A short pseudocode spec sits
beside each sampler, in the manner of OpenDP.

Parameters that would overflow int64 fall back to Python integers (still exact, much
slower): a discrete Gaussian whose ``2·p·q·t²`` (σ² = p/q, t = ⌊σ⌋ + 1) reaches 2⁶³, i.e.
σ beyond roughly 4·10⁴, or a discrete Laplace whose scale numerator reaches 2⁶².

References
----------
Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020:
Algorithm 1 (Bernoulli(exp(−γ))), Algorithm 2 (discrete Laplace), Algorithm 3 (discrete
Gaussian), Theorem 4 / Theorem 14 (ρ = Δ²/(2σ²)), Eq. (2)–(3) (variance ≤ σ²).
Inusah & Kozubowski (2006), the discrete Laplace law: variance 2e^{−1/t}/(1 − e^{−1/t})².
Mironov, "On Significance of the Least Significant Bits for Differential Privacy", CCS 2012.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from censusdp.budget import SCALE_RANGE, Accounting, check_epsilon, check_rho, check_scale
from censusdp.errors import BudgetError
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.mechanisms.registry import register_law

__all__ = [
    "MAX_DENOMINATOR",
    "DiscreteGaussian",
    "DiscreteLaplace",
    "bernoulli_exp",
    "bernoulli_exp_reference",
    "discrete_gaussian_reference",
    "discrete_laplace_reference",
    "geometric_exp1",
    "rational_up",
    "sample_discrete_gaussian",
    "sample_discrete_laplace",
]

#: Largest denominator kept when a parameter is made rational. A Fraction (or float) whose
#: denominator is at most this is kept exactly; any other value is rounded *up* to
#: ``⌈value·q⌉/q`` with q the largest power of two ≤ MAX_DENOMINATOR such that
#: ``value·q ≤ 2²⁰`` (q ≥ 1). The relative increase is below 2⁻¹⁰/value for values up to
#: 2¹⁰ and below 2⁻¹⁹ beyond, and integers and dyadic floats like 2.5 stay exact.
MAX_DENOMINATOR = 1 << 10

_INT64_MAX = (1 << 63) - 1
_U8, _U16, _U32 = 1 << 8, 1 << 16, 1 << 32


def rational_up(value: float | int | Fraction, name: str = "parameter") -> Fraction:
    """``value`` as a Fraction with denominator ≤ :data:`MAX_DENOMINATOR`, rounded up.

    Floats are first converted exactly (``Fraction(float)``); a value whose denominator
    exceeds :data:`MAX_DENOMINATOR` is rounded up to ``⌈value·q⌉ / q`` (see
    :data:`MAX_DENOMINATOR` for q). Rounding a noise scale (or σ²) up only adds noise: the
    privacy-safe direction.

    Raises
    ------
    ValueError
        When ``value`` is not a positive finite number.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if isinstance(value, Fraction):
        exact = value
    elif isinstance(value, int | np.integer):
        exact = Fraction(int(value))
    else:
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        exact = Fraction(v)
    if not exact > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if exact.denominator <= MAX_DENOMINATOR:
        return exact
    q = MAX_DENOMINATOR
    while q > 1 and exact * q > (1 << 20):
        q //= 2
    return Fraction(math.ceil(exact * q), q)


# --------------------------------------------------------------------------------------------
# Vectorised integer primitives


def _uniform(gen: np.random.Generator, high: int, size: int) -> np.ndarray:
    """``size`` exact uniforms on {0, …, high−1} in the narrowest unsigned dtype."""
    if high <= _U8:
        return gen.integers(0, high, size=size, dtype=np.uint8)
    if high <= _U16:
        return gen.integers(0, high, size=size, dtype=np.uint16)
    if high <= _U32:
        return gen.integers(0, high, size=size, dtype=np.uint32)
    return gen.integers(0, high, size=size, dtype=np.int64)


def _bernoulli_ratio(gen: np.random.Generator, r: np.ndarray, den: int, k: int) -> np.ndarray:
    """Bernoulli(r / (den·k)) elementwise, r < den, exactly."""
    if den * k <= _INT64_MAX:
        return _uniform(gen, den * k, r.size) < r
    # Bernoulli(r/den) ∧ Bernoulli(1/k): same law, no overflow.
    return (_uniform(gen, den, r.size) < r) & (_uniform(gen, k, r.size) == 0)


def _bernoulli_exp_fraction(gen: np.random.Generator, r: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(−r/den)) for 0 ≤ r < den (CKS Algorithm 1, γ ∈ [0, 1]), vectorised."""
    out = np.zeros(r.size, dtype=bool)
    idx = np.arange(r.size)
    k = 1
    while idx.size:
        a = _bernoulli_ratio(gen, r, den, k)
        if k % 2 == 1:
            out[idx[~a]] = True
        idx, r = idx[a], r[a]
        k += 1
    return out


def _bernoulli_exp1(gen: np.random.Generator, size: int) -> np.ndarray:
    """``size`` Bernoulli(exp(−1)) trials: CKS Algorithm 1 with γ = 1, vectorised.

    With γ = 1 the first trial Bernoulli(γ/1) always succeeds, so the loop starts at K = 2.
    """
    a = _uniform(gen, 2, size) == 0  # Bernoulli(1/2): continue past K = 2
    out = np.zeros(size, dtype=bool)  # stopped at K = 2 (even) → 0
    idx = np.flatnonzero(a)
    k = 3
    while idx.size:
        a = _uniform(gen, k, idx.size) == 0
        if k % 2 == 1:
            out[idx[~a]] = True
        idx = idx[a]
        k += 1
    return out


def geometric_exp1(gen: np.random.Generator, size: int) -> np.ndarray:
    """``size`` iid geometric variables G with P(G ≥ v) = exp(−v), exactly.

    Pseudocode (one variable; CKS Algorithm 2, the loop that builds V)::

        V ← 0
        loop: A ← Bernoulli(exp(−1)); if A = 0: break; V ← V + 1
        return V

    Vectorised by drawing one flat array of Bernoulli(exp(−1)) trials and reading the
    variables off as the lengths of the runs of successes between failures; a run cut by
    the end of a batch is continued (never discarded) in the next batch.

    Returns
    -------
    numpy.ndarray
        int64 array of shape ``(size,)``.
    """
    out = np.empty(size, dtype=np.int64)
    filled, carry = 0, 0
    while filled < size:
        need = size - filled
        m = int(need * 1.6) + 64  # E[trials per variable] = 1/(1 − e⁻¹) ≈ 1.582
        trials = _bernoulli_exp1(gen, m)
        zeros = np.flatnonzero(~trials)
        if zeros.size == 0:
            carry += m
            continue
        runs = np.diff(zeros, prepend=-1) - 1
        runs[0] += carry
        take = min(need, runs.size)
        out[filled : filled + take] = runs[:take]
        filled += take
        carry = m - 1 - int(zeros[-1])
    return out


def bernoulli_exp(gen: np.random.Generator, num: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(−num/den)) elementwise, exactly (CKS Algorithm 1).

    Pseudocode (one trial, γ = num/den ≥ 0)::

        if γ ≤ 1:
            K ← 1
            loop: A ← Bernoulli(γ/K); if A = 0: break; K ← K + 1
            return 1 if K is odd else 0
        for k in 1..⌊γ⌋: if Bernoulli(exp(−1)) = 0: return 0
        return Bernoulli(exp(−(γ − ⌊γ⌋)))

    Bernoulli(n/m) is ``integers(0, m) < n``. The ⌊γ⌋ leading Bernoulli(exp(−1)) trials all
    succeed exactly when a geometric G with P(G ≥ v) = e^{−v} satisfies G ≥ ⌊γ⌋, so one
    :func:`geometric_exp1` draw replaces them.

    Parameters
    ----------
    gen : numpy.random.Generator
    num : numpy.ndarray
        Non-negative int64 numerators.
    den : int
        Common positive denominator, below 2⁶³.

    Returns
    -------
    numpy.ndarray
        Boolean array of the shape of ``num``.
    """
    num = np.asarray(num, dtype=np.int64)
    if den == 1:
        g, r = num, np.zeros_like(num)
    else:
        g, r = np.divmod(num, den)
    return _bernoulli_exp_split(gen, g, r, den)


def _bernoulli_exp_split(
    gen: np.random.Generator, g: np.ndarray, r: np.ndarray, den: int
) -> np.ndarray:
    """Bernoulli(exp(−(g + r/den))) for int64 g ≥ 0 and 0 ≤ r < den."""
    out = np.ones(g.size, dtype=bool)
    whole = np.flatnonzero(g > 0)
    if whole.size:
        out[whole[geometric_exp1(gen, whole.size) < g[whole]]] = False
    frac = np.flatnonzero(out & (r > 0))
    if frac.size:
        out[frac] = _bernoulli_exp_fraction(gen, r[frac], den)
    return out


# --------------------------------------------------------------------------------------------
# Plain-Python exact reference samplers (also the fallback for huge parameters)


def _py_uniform(gen: np.random.Generator, high: int) -> int:
    """One exact uniform on {0, …, high−1} for any Python int ``high``."""
    if high <= _INT64_MAX:
        return int(gen.integers(0, high))
    bits = (high - 1).bit_length()
    words = (bits + 63) // 64
    while True:
        u = 0
        for w in gen.integers(0, 1 << 64, size=words, dtype=np.uint64):
            u = (u << 64) | int(w)
        u >>= 64 * words - bits
        if u < high:
            return u


def bernoulli_exp_reference(gen: np.random.Generator, gamma: Fraction) -> bool:
    """One Bernoulli(exp(−γ)) trial, γ ≥ 0 rational: CKS Algorithm 1 verbatim."""
    gamma = Fraction(gamma)
    while gamma > 1:
        if not bernoulli_exp_reference(gen, Fraction(1)):
            return False
        gamma -= 1
    k = 1
    while True:
        frac = gamma / k
        if _py_uniform(gen, frac.denominator) >= frac.numerator:
            break
        k += 1
    return k % 2 == 1


def discrete_laplace_reference(gen: np.random.Generator, scale: Fraction) -> int:
    """One discrete Laplace draw of rational scale t = n/d: CKS Algorithm 2 verbatim."""
    n, d = scale.numerator, scale.denominator
    while True:
        u = _py_uniform(gen, n)
        if not bernoulli_exp_reference(gen, Fraction(u, n)):
            continue
        v = 0
        while bernoulli_exp_reference(gen, Fraction(1)):
            v += 1
        y = (u + n * v) // d
        b = _py_uniform(gen, 2)
        if b == 1 and y == 0:
            continue
        return -y if b else y


def discrete_gaussian_reference(gen: np.random.Generator, sigma2: Fraction) -> int:
    """One discrete Gaussian draw with rational σ²: CKS Algorithm 3 verbatim."""
    t = math.isqrt(sigma2.numerator // sigma2.denominator) + 1
    while True:
        y = discrete_laplace_reference(gen, Fraction(t))
        gamma = (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        if bernoulli_exp_reference(gen, gamma):
            return y


# --------------------------------------------------------------------------------------------
# Vectorised samplers


def _fill(size: int, acceptance: float, batch) -> np.ndarray:
    """Concatenate accepted draws from ``batch(m)`` until ``size`` are collected."""
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        need = size - filled
        y = batch(int(need / acceptance * 1.03) + 32)
        take = min(need, y.size)
        out[filled : filled + take] = y[:take]
        filled += take
    return out


def _discrete_laplace_batch(gen: np.random.Generator, m: int, n: int, d: int) -> np.ndarray:
    """Accepted draws among ``m`` proposals of CKS Algorithm 2 (scale n/d, n < 2⁶²)."""
    u = _uniform(gen, n, m).astype(np.int64)
    u = u[_bernoulli_exp_fraction(gen, u, n)] if n > 1 else u
    v = geometric_exp1(gen, u.size)
    if v.size and n * (int(v.max()) + 1) > _INT64_MAX:
        x = u.astype(object) + n * v.astype(object)
        y = np.array(x // d, dtype=np.int64)  # OverflowError if a draw exceeds int64
    else:
        x = u + n * v
        y = x // d if d > 1 else x
    b = _uniform(gen, 2, y.size).astype(bool)
    keep = ~(b & (y == 0))
    y, b = y[keep], b[keep]
    return np.where(b, -y, y)


def sample_discrete_laplace(
    gen: np.random.Generator, size: int, scale: Fraction | int
) -> np.ndarray:
    """``size`` exact draws of the discrete Laplace law P(k) ∝ exp(−|k|/t), t = n/d rational.

    Pseudocode (CKS Algorithm 2, one draw)::

        loop:
            U ← Uniform{0, …, n−1}
            D ← Bernoulli(exp(−U/n));  if D = 0: continue
            V ← 0; loop: A ← Bernoulli(exp(−1)); if A = 0: break; V ← V + 1
            X ← U + n·V                 # P(X = x) ∝ exp(−x/n)
            Y ← ⌊X/d⌋                   # P(Y = y) ∝ exp(−y·d/n)
            B ← Bernoulli(1/2);  if B = 1 and Y = 0: continue
            return (1 − 2B)·Y

    Vectorised: a batch of proposals runs every step at once on the surviving subset.

    Returns
    -------
    numpy.ndarray
        int64 array of shape ``(size,)``.

    References
    ----------
    Canonne, Kamath & Steinke (2020), Algorithm 2.
    """
    scale = Fraction(scale)
    n, d = scale.numerator, scale.denominator
    if n >= 1 << 62:
        return np.array([discrete_laplace_reference(gen, scale) for _ in range(size)], np.int64)
    q = math.exp(-1.0 / n)
    accept = (1 - math.exp(-1.0)) / (n * (1 - q)) * (1 - 0.5 * (1 - math.exp(-d / n)))
    return _fill(size, accept, lambda m: _discrete_laplace_batch(gen, m, n, d))


def _dg_acceptance_bits(
    gen: np.random.Generator, y: np.ndarray, p: int, q: int, t: int
) -> np.ndarray:
    """Bernoulli(exp(−(|y| − σ²/t)² / (2σ²))) for σ² = p/q, exactly.

    γ = (|y|·t·q − p)² / (2·p·q·t²): int64 when the square fits, else Python integers.
    """
    den = 2 * p * q * t * t
    if den > _INT64_MAX:
        return np.array(
            [
                bernoulli_exp_reference(gen, Fraction((abs(int(v)) * t * q - p) ** 2, den))
                for v in y
            ],
            dtype=bool,
        )
    a = np.abs(y) * (t * q) - p if y.size else y
    if y.size and int(np.abs(y).max()) * t * q + p < 3_037_000_499:  # ⌊√(2⁶³−1)⌋
        g, r = np.divmod(a * a, den)
    else:
        sq = a.astype(object) ** 2
        g = np.array([min(int(v) // den, 1 << 62) for v in sq], dtype=np.int64)
        r = np.array([int(v) % den for v in sq], dtype=np.int64)
    return _bernoulli_exp_split(gen, g, r, den)


def sample_discrete_gaussian(
    gen: np.random.Generator, size: int, sigma2: Fraction | int
) -> np.ndarray:
    """``size`` exact draws of the discrete Gaussian P(k) ∝ exp(−k²/(2σ²)), σ² rational.

    Pseudocode (CKS Algorithm 3, one draw; σ² = p/q)::

        t ← ⌊σ⌋ + 1
        loop:
            Y ← DiscreteLaplace(t)                               # Algorithm 2
            C ← Bernoulli(exp(−(|Y| − σ²/t)² / (2σ²)))           # Algorithm 1
            if C = 1: return Y

    The acceptance exponent is the rational (|Y|·t·q − p)² / (2·p·q·t²), kept in int64
    (checked; Python integers beyond). Acceptance probability ≈ 0.75 at σ = 10.

    Returns
    -------
    numpy.ndarray
        int64 array of shape ``(size,)``.

    References
    ----------
    Canonne, Kamath & Steinke (2020), Algorithm 3 and Proposition 5.
    """
    sigma2 = Fraction(sigma2)
    p, q = sigma2.numerator, sigma2.denominator
    t = math.isqrt(p // q) + 1

    def batch(m: int) -> np.ndarray:
        y = _discrete_laplace_batch(gen, m, t, 1)
        return y[_dg_acceptance_bits(gen, y, p, q, t)]

    s2 = p / q
    ratio = math.exp(-1.0 / t)
    z = math.sqrt(2 * math.pi * s2) if s2 > 1 else 1.0 + 2 * math.exp(-0.5 / s2)
    accept = (1 - ratio) / (1 + ratio) * math.exp(-s2 / (2 * t * t)) * z
    accept *= (1 - math.exp(-1.0)) / (t * (1 - ratio)) * (1 - 0.5 * (1 - ratio))
    return _fill(size, max(accept, 0.05), batch)


# --------------------------------------------------------------------------------------------
# Laws


@register_law
class DiscreteLaplace(NoiseLaw):
    """Discrete Laplace (two-sided geometric): P(k) ∝ exp(−|k|/t), k ∈ ℤ; ε = Δ₁/t.

    Parameters
    ----------
    scale : float, int or Fraction
        t > 0. Stored as a Fraction; a float is rounded *up* (see :func:`rational_up`).

    References
    ----------
    Canonne, Kamath & Steinke (2020), Algorithm 2; Ghosh, Roughgarden & Sundararajan (2009),
    the geometric mechanism (ε-DP for integer queries of ℓ₁ sensitivity Δ₁ at t = Δ₁/ε).
    """

    name = "discrete_laplace"
    is_integer = True
    accounting = Accounting.PURE

    def __init__(self, scale: float | int | Fraction) -> None:
        if isinstance(scale, float | np.floating) and math.isfinite(scale) and scale > 0:
            check_scale(float(scale), "discrete Laplace scale")
        t = rational_up(scale, "discrete Laplace scale")
        lo, hi = SCALE_RANGE
        if not lo <= t <= hi:
            raise BudgetError(
                f"discrete Laplace scale = {float(t):g} is outside the supported range "
                f"[{lo:g}, {hi:g}] (int64 noise and the rational grid of the exact sampler); "
                "check the budget and sensitivity that produced it"
            )
        self.scale_fraction = t

    @property
    def scale(self) -> float:
        return float(self.scale_fraction)

    @classmethod
    def from_epsilon(cls, epsilon: float, sensitivity: float | int = 1) -> DiscreteLaplace:
        """t = Δ₁/ε, rounded up."""
        if not epsilon > 0 or not sensitivity > 0:
            raise ValueError("epsilon and sensitivity must be positive")
        check_epsilon(epsilon)
        return cls(rational_up(_exact(sensitivity) / _exact(epsilon), "discrete Laplace scale"))

    def sample(self, stream: np.random.Generator, size: int) -> np.ndarray:
        return sample_discrete_laplace(stream, int(size), self.scale_fraction)

    def log_density(self, x: np.ndarray) -> np.ndarray:
        a = 1.0 / self.scale
        log_norm = math.log(-math.expm1(-a)) - math.log1p(math.exp(-a))
        return log_norm - a * np.abs(np.asarray(x, dtype=np.float64))

    @property
    def l1_rate(self) -> float:
        return 1.0 / self.scale

    @property
    def variance(self) -> float:
        a = 1.0 / self.scale
        return 2.0 * math.exp(-a) / math.expm1(-a) ** 2

    def privacy(self, sensitivity: float) -> float:
        """ε = Δ₁/t."""
        return float(sensitivity) / self.scale

    def __repr__(self) -> str:
        return f"DiscreteLaplace(scale={self.scale_fraction})"


@register_law
class DiscreteGaussian(NoiseLaw):
    """Discrete Gaussian: P(k) ∝ exp(−k²/(2σ²)), k ∈ ℤ; ρ = Δ₂²/(2σ²) (zCDP).

    Parameters
    ----------
    sigma : float, int or Fraction
        σ > 0. The law is stored through σ² as a Fraction: an int or Fraction σ gives σ²
        exactly, a float σ is rounded *up* onto the rational grid of :func:`rational_up`.
        Use :meth:`from_sigma2` to give σ² itself.

    Notes
    -----
    σ here is the scale parameter; the variance is slightly below σ² (CKS Cor. 9) and is
    computed by summation.

    References
    ----------
    Canonne, Kamath & Steinke (2020), Algorithm 3; Theorem 4 and Theorem 14 (ρ = Δ²/(2σ²)).
    """

    name = "discrete_gaussian"
    is_integer = True
    accounting = Accounting.ZCDP

    def __init__(self, sigma: float | int | Fraction) -> None:
        exact = _exact(sigma)
        check_scale(float(exact), "discrete Gaussian sigma")
        self._set(rational_up(exact**2, "discrete Gaussian sigma²"))

    def _set(self, sigma2: Fraction) -> None:
        if not sigma2 > 0:
            raise ValueError("discrete Gaussian sigma² must be positive")
        lo, hi = SCALE_RANGE
        if not lo * lo <= sigma2 <= hi * hi:
            raise BudgetError(
                f"discrete Gaussian sigma = {math.sqrt(float(sigma2)):g} is outside the "
                f"supported range [{lo:g}, {hi:g}] (int64 noise and the rational grid of the "
                "exact sampler); check the budget and sensitivity that produced it"
            )
        self.sigma2 = sigma2
        s2 = float(sigma2)
        half = math.ceil(math.sqrt(s2) * 12.0) + 2  # e^{−72} ≪ machine ε relative to k = 0
        if half <= 4_000_000:
            k = np.arange(1, half + 1, dtype=np.float64)
            w = np.exp(-(k * k) / (2.0 * s2))
            z = 1.0 + 2.0 * w.sum()
            second = 2.0 * (k * k * w).sum()
            self._log_norm = math.log(z)
            self._variance = second / z
        else:  # Poisson summation: the k ≠ 0 terms are below e^{−2π²σ²} ≈ 0
            self._log_norm = 0.5 * math.log(2.0 * math.pi * s2)
            self._variance = s2

    @classmethod
    def from_sigma2(cls, sigma2: float | int | Fraction) -> DiscreteGaussian:
        """The law with the given σ² (a float is rounded up)."""
        obj = cls.__new__(cls)
        s2 = float(_exact(sigma2))
        lo, hi = SCALE_RANGE
        if not lo * lo <= s2 <= hi * hi:
            raise BudgetError(
                f"discrete Gaussian sigma² = {s2:g} is outside the supported range "
                f"[{lo * lo:g}, {hi * hi:g}]; check the budget and sensitivity that produced it"
            )
        obj._set(rational_up(sigma2, "discrete Gaussian sigma²"))
        return obj

    @classmethod
    def from_rho(cls, rho: float, sensitivity: float | int = 1) -> DiscreteGaussian:
        """σ² = Δ₂²/(2ρ), rounded up."""
        if not rho > 0 or not sensitivity > 0:
            raise ValueError("rho and sensitivity must be positive")
        check_rho(rho)
        return cls.from_sigma2(_exact(sensitivity) ** 2 / (2 * _exact(rho)))

    @classmethod
    def from_epsilon_delta(
        cls, epsilon: float, delta: float, sensitivity: float | int = 1, *, tight: bool = True
    ) -> DiscreteGaussian:
        """The smallest σ whose ρ converts to at most (ε, δ)-DP.

        ρ = :func:`censusdp.budget.dp_to_zcdp` (the CKS conversion when ``tight``).
        """
        from censusdp.budget import dp_to_zcdp

        return cls.from_rho(dp_to_zcdp(epsilon, delta, tight=tight), sensitivity)

    @property
    def sigma(self) -> float:
        return math.sqrt(float(self.sigma2))

    def sample(self, stream: np.random.Generator, size: int) -> np.ndarray:
        """Exact draws by fixed-point CDF inversion (:mod:`censusdp.mechanisms.dg_table`)."""
        from censusdp.mechanisms.dg_table import sample_discrete_gaussian_fast

        return sample_discrete_gaussian_fast(stream, int(size), self.sigma2)

    def sample_window(
        self, stream: np.random.Generator, size: int, start: int, stop: int
    ) -> np.ndarray:
        """Draws ``[start, stop)`` of :meth:`sample`, equal bit for bit, drawing only those
        (:func:`~censusdp.mechanisms.dg_table.sample_discrete_gaussian_window`)."""
        from censusdp.mechanisms.dg_table import sample_discrete_gaussian_window

        return sample_discrete_gaussian_window(stream, size, start, stop, self.sigma2)

    def add_window(
        self, stream: np.random.Generator, size: int, start: int, stop: int, values: np.ndarray
    ) -> np.ndarray:
        """``values`` plus draws ``[start, stop)`` of :meth:`sample`, bit for bit, in one
        pass (:func:`~censusdp.mechanisms.dg_table.add_discrete_gaussian_window`)."""
        from censusdp.mechanisms.dg_table import add_discrete_gaussian_window

        return add_discrete_gaussian_window(stream, size, start, stop, self.sigma2, values)

    def log_density(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return -(x * x) / (2.0 * float(self.sigma2)) - self._log_norm

    @property
    def l2_precision(self) -> float:
        """1/σ² (σ² the scale parameter, not the variance): P(k) ∝ exp(−½ k²/σ²)."""
        return 1.0 / float(self.sigma2)

    @property
    def variance(self) -> float:
        return self._variance

    def privacy(self, sensitivity: float) -> float:
        """ρ = Δ₂²/(2σ²)."""
        return float(sensitivity) ** 2 / (2.0 * float(self.sigma2))

    def __repr__(self) -> str:
        return f"DiscreteGaussian(sigma2={self.sigma2})"


def _exact(value: float | int | Fraction) -> Fraction:
    """The exact rational value of a positive finite int, float or Fraction."""
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction | np.number):
        raise ValueError(f"expected a positive finite number, got {value!r}")
    if isinstance(value, np.integer):
        value = int(value)
    elif isinstance(value, np.floating):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a positive finite number, got {value!r}")
    frac = Fraction(value)
    if not frac > 0:
        raise ValueError(f"expected a positive number, got {value!r}")
    return frac
