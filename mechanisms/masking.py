"""Matrix masking: Gaussian noise plus a random orthogonal mask for microdata releases.

Microdata X (n × p) is scaled so that |x_ij| ≤ 1 (seed eq. (6)); two data sets are
neighbours when they differ in one row and ‖x₁ − x₁'‖₂ ≤ 1 (seed Definition 2.1). With
E (n × p) iid N(0, σ²) and M Haar-uniform on the orthogonal group O(n), the three releases are

* setting A: Y = X + E (seed eq. (3));
* setting B: Y = M (X + E) (seed eq. (4));
* setting C: Y = M X + E (seed eq. (15)); its density equals setting B's (seed Lemma A.4), so
  the same σ applies.

Noise calibration (z = upper-δ quantile of N(0, 1)):

* A, necessary (11): σ > z/ε;
* A, sufficient (12), ε ≤ 1: σ ≥ (z + 1/(2z))/ε;
* A, exact for one worst-case pair: the privacy loss is
  L = (2⟨e, d⟩ + ‖d‖²)/(2σ²) with ⟨e, d⟩ ~ N(0, σ²‖d‖²); P[L > ε] ≤ δ for every ‖d‖ ≤ 1 iff
  εσ² − zσ − 1/2 ≥ 0, i.e. σ ≥ (z + √(z² + 2ε))/(2ε);
* B (and C), sufficient (13): σ ≥ the largest root of
  g(σ) = εσ² − √p − (2√p + 1) Q_δ(σ) / (2(n − p)), Q_δ(σ) the upper-δ quantile of a
  noncentral χ² with 2(n − p) degrees of freedom and noncentrality p/σ².

Block-diagonal masking (M = diag(M₁, …, M_B), Mᵢ Haar on O(mᵢ)) is private under (13) with n
replaced by the smallest block size (seed §4). For microdata only M Z is ever needed, never
M: for Z = Q_Z R_Z (reduced QR, Q_Z m × p), M Z = (M Q_Z) R_Z and M Q_Z is uniform on the
Stiefel manifold of m × p orthonormal frames, sampled as the sign-corrected QR factor of an
m × p Gaussian matrix. That is an exact draw of M Z for a Haar M, at cost O(m p²) per block
instead of O(m³).

Masked releases keep the sufficient statistics of linear models: (MZ)ᵀ(MZ) = ZᵀZ, so ordinary
least squares on setting B's release equals OLS on X + E (:func:`ols`).

References
----------
Ding, Wu, Miao & Ding, "Reducing Noise Level in Differential Privacy through Matrix Masking"
(seed ``matrix_masking_noise_reduction``): settings (3), (4), (15); Theorem 3.2 with
conditions (11), (12); Theorem 3.4 with condition (13); Table 1; block-diagonal masking in §4.
Mezzadri, "How to generate random matrices from the classical compact groups", Notices of the
AMS 54(5), 2007 (QR of a Ginibre matrix with the sign correction of R's diagonal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy import optimize, stats

from censusdp.errors import DataError, SpecError
from censusdp.rng import KeyedRNG

__all__ = [
    "Scaling",
    "scale_to_unit",
    "normal_upper_quantile",
    "sigma_a_necessary",
    "sigma_a_sufficient",
    "sigma_a_exact",
    "sigma_b_sufficient",
    "g_b",
    "calibrate_sigma",
    "privacy_loss_a",
    "haar_orthogonal",
    "stiefel_frame",
    "apply_haar",
    "block_sizes",
    "MaskedRelease",
    "mask",
    "ols",
]

Setting = Literal["A", "B", "C"]


# ---------------------------------------------------------------------------------------------
# Scaling into the unit box


@dataclass(frozen=True)
class Scaling:
    """The affine map from raw columns to the scaled data the privacy analysis assumes.

    ``scaled = (raw − center) / scale`` column by column; :meth:`inverse` undoes it.

    Attributes
    ----------
    center, scale : numpy.ndarray
        Length-p arrays. ``scale`` includes the row factor of ``neighbours="any-row"``.
    neighbours : {"bounded-difference", "any-row"}
        Which neighbouring relation the release protects (see :func:`scale_to_unit`).
    clipped : int
        How many raw entries lay outside the declared bounds and were clipped to them.
    """

    center: np.ndarray
    scale: np.ndarray
    neighbours: str
    clipped: int

    def inverse(self, scaled: np.ndarray) -> np.ndarray:
        """Raw units from scaled units (meaningful for setting A; B and C are rotated)."""
        return np.asarray(scaled) * self.scale + self.center


def scale_to_unit(
    raw: np.ndarray,
    lower: np.ndarray | float,
    upper: np.ndarray | float,
    *,
    neighbours: Literal["bounded-difference", "any-row"] = "any-row",
) -> tuple[np.ndarray, Scaling]:
    """Scale raw columns into [−1, 1] from public bounds, as the seed's analysis assumes.

    Column j is mapped by x ↦ (x − c_j)/h_j with c_j = (lower_j + upper_j)/2 and
    h_j = (upper_j − lower_j)/2, which gives |x_ij| ≤ 1 (seed eq. (6)). The seed's neighbours
    differ in one row by at most 1 in ℓ₂ (Definition 2.1); in those units a whole-row change
    can move a row by up to 2√p. ``neighbours="any-row"`` (the default) divides further by
    2√p, so that *any* replacement of one row is a neighbour (the box then has ℓ₂ diameter 1)
    and the guarantee is the usual replace-one-record DP. ``"bounded-difference"`` keeps the
    unit box and protects only row changes of scaled ℓ₂ norm ≤ 1, exactly Definition 2.1.

    The bounds must be public (chosen without looking at the data): scaling by the observed
    range or by the largest observed row norm would itself disclose data. Entries outside the
    bounds are clipped, and the count is reported.

    Parameters
    ----------
    raw : array_like, shape (n, p)
    lower, upper : float or array_like of length p
        Public bounds of each column, ``lower < upper``.
    neighbours : {"any-row", "bounded-difference"}

    Returns
    -------
    scaled : numpy.ndarray, shape (n, p)
    scaling : Scaling
        The factors (center and scale per column) and the number of clipped entries.

    References
    ----------
    Seed ``matrix_masking_noise_reduction``, Definition 2.1 and eq. (6).
    """
    x = np.asarray(raw, dtype=float)
    if x.ndim != 2:
        raise DataError(f"raw data must be a 2-D array (n rows × p columns), got shape {x.shape}")
    p = x.shape[1]
    lo = np.broadcast_to(np.asarray(lower, dtype=float), (p,))
    hi = np.broadcast_to(np.asarray(upper, dtype=float), (p,))
    bad = np.flatnonzero(~(hi > lo) | ~np.isfinite(lo) | ~np.isfinite(hi))
    if bad.size:
        raise SpecError(
            f"column bounds must be finite with lower < upper; fix columns {bad.tolist()}"
        )
    if neighbours not in ("any-row", "bounded-difference"):
        raise SpecError("neighbours must be 'any-row' or 'bounded-difference'")
    if not np.all(np.isfinite(x)):
        raise DataError("raw data contains NaN or infinite entries; impute or drop them first")
    clipped = int(np.count_nonzero((x < lo) | (x > hi)))
    center = (lo + hi) / 2.0
    scale = (hi - lo) / 2.0
    if neighbours == "any-row":
        scale = scale * (2.0 * math.sqrt(p))
    scaled = (np.clip(x, lo, hi) - center) / scale
    return scaled, Scaling(center=center, scale=scale, neighbours=neighbours, clipped=clipped)


# ---------------------------------------------------------------------------------------------
# σ calibration


def _check_eps_delta(eps: float, delta: float) -> None:
    if not (eps > 0 and math.isfinite(eps)):
        raise SpecError(f"epsilon must be a positive finite number, got {eps!r}")
    if not 0 < delta < 0.5:
        raise SpecError(f"delta must lie in (0, 1/2) so that z_δ > 0, got {delta!r}")


def normal_upper_quantile(delta: float) -> float:
    """z_δ: the upper-δ quantile of N(0, 1), P[Z > z_δ] = δ."""
    return float(stats.norm.isf(delta))


def sigma_a_necessary(eps: float, delta: float) -> float:
    """Setting A, necessary condition (11): σ must exceed z_δ/ε.

    References
    ----------
    Seed ``matrix_masking_noise_reduction``, Theorem 3.2 / Corollary 3.3, eq. (11).
    """
    _check_eps_delta(eps, delta)
    return normal_upper_quantile(delta) / eps


def sigma_a_sufficient(eps: float, delta: float) -> float:
    """Setting A, sufficient condition (12): σ ≥ (z_δ + 1/(2 z_δ))/ε, valid for ε ≤ 1.

    References
    ----------
    Seed ``matrix_masking_noise_reduction``, Corollary 3.3, eq. (12).
    """
    _check_eps_delta(eps, delta)
    if eps > 1:
        raise SpecError(f"condition (12) holds only for epsilon ≤ 1 (got {eps}); use 'exact'")
    z = normal_upper_quantile(delta)
    return (z + 1.0 / (2.0 * z)) / eps


def sigma_a_exact(eps: float, delta: float) -> float:
    """Setting A: smallest σ with P[L > ε] ≤ δ for every pair, ‖x₁ − x₁'‖₂ ≤ 1.

    The largest root of εσ² − z_δ σ − 1/2, i.e. (z_δ + √(z_δ² + 2ε))/(2ε). The worst pair
    has ‖x₁ − x₁'‖₂ = 1. It lies between (11) and (12).

    References
    ----------
    Seed ``matrix_masking_noise_reduction``, proof of Theorem 3.2, eq. (20) with Lemma 2.4.
    """
    _check_eps_delta(eps, delta)
    z = normal_upper_quantile(delta)
    return (z + math.sqrt(z * z + 2.0 * eps)) / (2.0 * eps)


def g_b(sigma: float | np.ndarray, eps: float, delta: float, p: int, n: int) -> np.ndarray:
    """g(σ) = εσ² − √p − (2√p + 1) Q_δ(σ)/(2(n − p)) of condition (13), elementwise in σ.

    References
    ----------
    Seed ``matrix_masking_noise_reduction``, Theorem 3.4, eq. (13).
    """
    s = np.asarray(sigma, dtype=float)
    dof = 2 * (n - p)
    q = stats.ncx2.isf(delta, dof, p / s**2)
    return eps * s**2 - math.sqrt(p) - (2.0 * math.sqrt(p) + 1.0) * q / dof


def sigma_b_sufficient(eps: float, delta: float, p: int, n: int) -> float:
    """Setting B (and C), sufficient condition (13): the largest root of g.

    g is continuous with g(0⁺) = −∞ and g(∞) = +∞ (seed, after Theorem 3.4); it is in fact
    increasing, since εσ² grows and the noncentrality p/σ² (hence Q_δ) falls with σ, so the
    root is unique. It is bracketed by doubling an upper end from the χ²-mean guess and
    solved with Brent's method to a relative tolerance of 1e-12.

    Parameters
    ----------
    eps, delta : float
        Privacy parameters, δ ∈ (0, 1/2).
    p : int
        Number of columns.
    n : int
        Number of rows, or the smallest block size for block-diagonal masking; n > p.

    References
    ----------
    Seed ``matrix_masking_noise_reduction``, Theorem 3.4, eq. (13); §4 (block sizes).
    """
    _check_eps_delta(eps, delta)
    if int(p) != p or p < 1:
        raise SpecError(f"p must be a positive integer, got {p!r}")
    if int(n) != n or n <= p:
        raise SpecError(f"condition (13) needs n > p (got n={n}, p={p}); use larger blocks")
    p, n = int(p), int(n)

    def g(s: float) -> float:
        return float(g_b(s, eps, delta, p, n))

    hi = math.sqrt((3.0 * math.sqrt(p) + 1.0) / eps)  # the root when Q_δ ≈ 2(n − p)
    while g(hi) <= 0:
        hi *= 2.0
    lo = hi / 2.0
    while g(lo) > 0:
        lo /= 2.0
        if lo < 1e-12:  # pragma: no cover - g(0+) = −∞ makes this unreachable
            raise SpecError("could not bracket the root of (13); check epsilon and delta")
    return float(optimize.brentq(g, lo, hi, xtol=1e-14, rtol=1e-12, maxiter=500))


def calibrate_sigma(
    setting: Setting,
    eps: float,
    delta: float,
    p: int,
    n: int,
    *,
    rule: Literal["sufficient", "exact"] = "sufficient",
) -> float:
    """The noise σ for a setting: A by (12) (``rule="sufficient"``) or its exact one-pair
    root (``rule="exact"``); B and C by (13).

    References
    ----------
    Seed ``matrix_masking_noise_reduction``, eqs. (12), (13); Lemma A.4 (setting C).
    """
    if setting == "A":
        return sigma_a_exact(eps, delta) if rule == "exact" else sigma_a_sufficient(eps, delta)
    if setting in ("B", "C"):
        return sigma_b_sufficient(eps, delta, p, n)
    raise SpecError(f"setting must be 'A', 'B' or 'C', got {setting!r}")


def privacy_loss_a(noise: np.ndarray, diff: np.ndarray, sigma: float) -> np.ndarray:
    """Privacy loss of setting A at Y = X + E for the pair (X, X'), X − X' = d in row 1.

    L = log f_X(Y)/f_X'(Y) = (2⟨e, d⟩ + ‖d‖²)/(2σ²), one value per row of ``noise``.

    Parameters
    ----------
    noise : array_like, shape (m, p)
        Draws of the first row e of E.
    diff : array_like, shape (p,)
        d = x₁ − x₁'.

    References
    ----------
    Seed ``matrix_masking_noise_reduction``, Lemma 3.1 eq. (7) and eq. (19).
    """
    e = np.asarray(noise, dtype=float)
    d = np.asarray(diff, dtype=float)
    return (2.0 * e @ d + d @ d) / (2.0 * sigma**2)


# ---------------------------------------------------------------------------------------------
# Haar sampling


def _sign_fixed_qr(g: np.ndarray) -> np.ndarray:
    """Q of a (batched) reduced QR with R's diagonal made positive (Mezzadri 2007)."""
    q, r = np.linalg.qr(g)
    d = np.sign(np.diagonal(r, axis1=-2, axis2=-1))
    d = np.where(d == 0, 1.0, d)
    return q * d[..., None, :]


def haar_orthogonal(n: int, stream: np.random.Generator) -> np.ndarray:
    """An n × n orthogonal matrix drawn from the Haar measure on O(n).

    QR of an n × n standard Gaussian matrix, with each column of Q multiplied by the sign of
    the matching diagonal entry of R. Without that correction LAPACK's Householder QR fixes
    the signs of R's diagonal and Q is *not* Haar distributed.

    References
    ----------
    Mezzadri (2007), §5, the algorithm after eq. (5.3).
    """
    if int(n) != n or n < 1:
        raise SpecError(f"n must be a positive integer, got {n!r}")
    return _sign_fixed_qr(stream.standard_normal((int(n), int(n))))


def stiefel_frame(gaussian: np.ndarray) -> np.ndarray:
    """Uniform m × p orthonormal frame(s) from m × p standard Gaussian matrices (batched).

    The first p columns of a Haar matrix, i.e. the Q factor of the Gaussian matrix G whose R
    has a positive diagonal (Mezzadri's sign correction). Computed by CholeskyQR2 (two rounds
    of Q ← G chol(GᵀG)⁻ᵀ), which yields exactly that positive-diagonal factor and is
    accurate for the well-conditioned tall Gaussian matrices used here, at a fraction of the
    cost of batched Householder QR.

    References
    ----------
    Mezzadri (2007), §5. Fukaya, Nakatsukasa, Yanagisawa & Yamamoto, "CholeskyQR2", 2014.
    """
    q = np.asarray(gaussian, dtype=float)
    if q.shape[-2] < q.shape[-1]:
        raise SpecError(f"a frame needs at least as many rows as columns, got shape {q.shape}")
    for _ in range(2):
        chol = np.linalg.cholesky(np.swapaxes(q, -1, -2) @ q)
        q = q @ np.swapaxes(np.linalg.inv(chol), -1, -2)
    return q


def apply_haar(z: np.ndarray, gaussian: np.ndarray) -> np.ndarray:
    """M Z for a Haar M, without forming M (batched over leading axes).

    Polar form Z = U H with H = (ZᵀZ)^{1/2} and U an m × p orthonormal frame; then
    M Z = (M U) H, and M U is a uniform orthonormal frame for any fixed U, drawn from
    ``gaussian`` (same shape as Z, m ≥ p) by :func:`stiefel_frame`. This holds for
    rank-deficient Z too.
    """
    z = np.asarray(z, dtype=float)
    w, v = np.linalg.eigh(np.swapaxes(z, -1, -2) @ z)
    root = (v * np.sqrt(np.clip(w, 0.0, None))[..., None, :]) @ np.swapaxes(v, -1, -2)
    return stiefel_frame(gaussian) @ root


def block_sizes(n: int, block: int | None) -> np.ndarray:
    """Sizes of the diagonal blocks: ⌊n/block⌋ blocks as equal as possible (each ≥ block).

    ``block=None`` means one block of size n.
    """
    if block is None or block >= n:
        return np.array([n], dtype=np.int64)
    if int(block) != block or block < 2:
        raise SpecError(f"block size must be an integer ≥ 2, got {block!r}")
    count = n // int(block)
    base, extra = divmod(n, count)
    return np.array([base + 1] * extra + [base] * (count - extra), dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# The release


@dataclass
class MaskedRelease:
    """A masked microdata release and how it was made.

    Attributes
    ----------
    values : numpy.ndarray, shape (n, p)
        The released Y (in scaled units).
    setting : {"A", "B", "C"}
    sigma : float
        Noise standard deviation used.
    eps, delta : float
    block_sizes : numpy.ndarray
        Sizes of the diagonal masking blocks (one block of size n when unblocked; empty for A).
    statement : str
        The privacy statement, naming the neighbouring relation.
    """

    values: np.ndarray
    setting: str
    sigma: float
    eps: float
    delta: float
    block_sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    statement: str = ""


def mask(
    x: np.ndarray,
    eps: float,
    delta: float,
    rng: KeyedRNG,
    *,
    setting: Setting = "B",
    block: int | None = None,
    sigma: float | None = None,
    rule: Literal["sufficient", "exact"] = "sufficient",
    label: str = "masking",
) -> MaskedRelease:
    """Release scaled microdata X under setting A, B or C.

    Parameters
    ----------
    x : array_like, shape (n, p)
        Scaled data, |x_ij| ≤ 1 (see :func:`scale_to_unit`).
    eps, delta : float
        Target (ε, δ).
    rng : KeyedRNG
        Source of all randomness: streams ``{label}/noise`` (E) and ``{label}/frame`` (the
        Gaussian draws that make the mask), both drawn by row so the result does not depend on
        how the work is split.
    setting : {"A", "B", "C"}
    block : int, optional
        Block size m for block-diagonal masking (B and C); σ is calibrated with n replaced by
        the smallest block size. Default: one block (a full Haar M on O(n)).
    sigma : float, optional
        Override the calibrated σ (it must not be smaller than the calibrated value).
    rule : {"sufficient", "exact"}
        Setting A's calibration: (12) or the exact one-pair root.

    Returns
    -------
    MaskedRelease

    References
    ----------
    Seed ``matrix_masking_noise_reduction``: settings (3), (4), (15); Theorems 3.2 and 3.4; §4.
    """
    z = np.asarray(x, dtype=float)
    if z.ndim != 2:
        raise DataError(f"x must be 2-D (n × p), got shape {z.shape}")
    n, p = z.shape
    if not np.all(np.abs(z) <= 1.0):
        raise DataError("x must satisfy |x_ij| ≤ 1 (seed eq. (6)); scale it with scale_to_unit")
    sizes = block_sizes(n, block) if setting in ("B", "C") else np.zeros(0, dtype=np.int64)
    n_cal = int(sizes.min()) if sizes.size else n
    needed = calibrate_sigma(setting, eps, delta, p, n_cal, rule=rule)
    if sigma is None:
        sigma = needed
    elif sigma < needed:
        raise SpecError(f"sigma={sigma} is below the calibrated {needed:.6g} for this setting")

    def normal(g: np.random.Generator, size: int) -> np.ndarray:
        return g.standard_normal(size)

    noise = sigma * rng.draw(f"{label}/noise", n, 0, n, normal, width=p)
    if setting == "A":
        y = z + noise
    else:
        target = z + noise if setting == "B" else z
        frame = rng.draw(f"{label}/frame", n, 0, n, normal, width=p)
        y = np.empty_like(z)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        for m in np.unique(sizes):
            idx = np.flatnonzero(sizes == m)
            rows = (starts[idx][:, None] + np.arange(m)[None, :]).ravel()
            shape = (idx.size, int(m), p)
            y[rows] = apply_haar(target[rows].reshape(shape), frame[rows].reshape(shape)).reshape(
                -1, p
            )
        if setting == "C":
            y += noise
    stmt = (
        f"({eps:g}, {delta:g})-DP for data sets differing in one row by at most 1 in ℓ₂ "
        f"(scaled units), setting {setting}, sigma = {sigma:.6g}"
    )
    return MaskedRelease(y, setting, float(sigma), float(eps), float(delta), sizes, stmt)


def ols(data: np.ndarray, response: int = -1) -> np.ndarray:
    """Least-squares coefficients of column ``response`` on the other columns (no intercept).

    Depends on the data only through ZᵀZ, so it is unchanged by any orthogonal mask: OLS on
    M(X + E) equals OLS on X + E. Include a column of ones in X for an intercept.
    """
    z = np.asarray(data, dtype=float)
    j = response % z.shape[1]
    cols = [c for c in range(z.shape[1]) if c != j]
    gram = z.T @ z
    return np.linalg.solve(gram[np.ix_(cols, cols)], gram[cols, j])
