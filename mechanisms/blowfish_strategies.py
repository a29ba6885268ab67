"""Strategy matrices for the matrix mechanism, and their noise covariance in closed form.

Strategies over a domain of size N = b^h (pad smaller domains with public zero cells):

* identity I_N (the Laplace mechanism on the histogram), Δ = 1;
* hierarchical b-ary (Hay et al. 2010): one row per node of the complete b-ary tree over the
  domain, leaves (block size 1) to root (block size N), Δ = h + 1;
* Privelet / Haar wavelet (Xiao, Wang & Gehrke 2010), b = 2: the total row and one ±1 Haar
  row per internal node (+1 on the left half, −1 on the right), Δ = h + 1; as a matrix
  mechanism this is Li et al.'s wavelet strategy, equivalent to Privelet.

All three have Gram matrices AᵀA in the commutative algebra spanned by the nested block
averages P_l (P_l replaces each entry by the mean of its aligned block of size b^l): with the
orthogonal idempotents E_l = P_l − P_{l+1} (E_h = P_h), AᵀA = Σ_l μ_l E_l. Hence the matrix
mechanism's estimate x̂ = x + A⁺η, η ~ Lap(Δ/ε)^p, has covariance
2(Δ/ε)² (AᵀA)⁻¹ = 2(Δ/ε)² Σ_l μ_l⁻¹ E_l, and the covariance of any set of linear queries
follows without forming a k × k matrix:

* identity: μ_l = 1;
* hierarchical: μ_l = Σ_{m ≤ l} b^m (a level-m node contributes its block's all-ones matrix,
  b^m P_m = b^m Σ_{l ≥ m} E_l);
* Haar: μ_l = 2^{l+1} for l < h (the Haar rows of support 2^{l+1} span E_l, each of squared
  norm 2^{l+1}), μ_h = N (the total row).

References
----------
Li, Hay, Rastogi, Miklau & McGregor, "Optimizing linear counting queries under differential
privacy", PODS 2010 (the matrix mechanism; hierarchical and wavelet strategies).
Hay, Rastogi, Miklau & Suciu, "Boosting the accuracy of differentially private histograms
through consistency", PVLDB 2010 (hierarchical strategy).
Xiao, Wang & Gehrke, "Differential privacy via wavelet transforms", ICDE 2010 (Privelet).
Haney, Machanavajjhala & Ding, PVLDB 9(4), 2015 (seed ``policy_aware_dp_blowfish``), §5.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from censusdp.errors import SpecError

__all__ = [
    "STRATEGIES",
    "Spectrum",
    "padded_size",
    "identity_strategy",
    "hierarchical_strategy",
    "privelet_strategy",
    "strategy_matrix",
    "spectrum",
    "prefix_moments",
]

STRATEGIES = ("identity", "hierarchical", "privelet")


def padded_size(k: int, b: int = 2) -> tuple[int, int]:
    """(N, h): the smallest N = b^h ≥ k."""
    if int(k) != k or k < 1:
        raise SpecError(f"the domain size must be a positive integer, got {k!r}")
    if int(b) != b or b < 2:
        raise SpecError(f"the branching factor b must be an integer ≥ 2, got {b!r}")
    h = 0
    while b**h < k:
        h += 1
    return b**h, h


def identity_strategy(k: int) -> sparse.csr_matrix:
    """I_k."""
    return sparse.identity(k, format="csr")


def hierarchical_strategy(k: int, b: int = 2) -> sparse.csr_matrix:
    """All nodes of the complete b-ary tree over N = b^h ≥ k cells (leaves first, root last).

    The matrix has N columns: pad x with N − k zero cells (they are estimated like the others,
    which keeps the closed-form :func:`spectrum` exact).
    """
    n, h = padded_size(k, b)
    blocks = []
    for level in range(h + 1):
        size = b**level
        rows = np.repeat(np.arange(n // size), size)
        blocks.append(sparse.csr_matrix((np.ones(n), (rows, np.arange(n))), (n // size, n)))
    return sparse.vstack(blocks, format="csr")


def privelet_strategy(k: int) -> sparse.csr_matrix:
    """The Haar wavelet strategy (Privelet) over N = 2^h ≥ k cells: total row, then ±1
    Haar rows from the finest support (2) to the coarsest (N). N columns (pad x with zeros)."""
    n, h = padded_size(k, 2)
    blocks = [sparse.csr_matrix(np.ones((1, n)))]
    for level in range(1, h + 1):
        size = 2**level
        cols = np.arange(n)
        rows = cols // size
        vals = np.where(cols % size < size // 2, 1.0, -1.0)
        blocks.append(sparse.csr_matrix((vals, (rows, cols)), (n // size, n)))
    return sparse.vstack(blocks, format="csr")


def strategy_matrix(name: str, k: int, b: int = 2) -> sparse.csr_matrix:
    """The strategy ``name`` ∈ :data:`STRATEGIES` as a sparse matrix over the padded domain."""
    if name == "identity":
        return identity_strategy(padded_size(k, b)[0])
    if name == "hierarchical":
        return hierarchical_strategy(k, b)
    if name == "privelet":
        if b != 2:
            raise SpecError("the Privelet (Haar) strategy is binary: use b=2")
        return privelet_strategy(k)
    raise SpecError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")


@dataclass(frozen=True)
class Spectrum:
    """AᵀA = Σ_l mu[l] E_l over the padded domain N = b^h, with the ℓ₁ sensitivity Δ_A."""

    name: str
    b: int
    h: int
    mu: np.ndarray
    sensitivity: float

    @property
    def size(self) -> int:
        return self.b**self.h


def spectrum(name: str, k: int, b: int = 2) -> Spectrum:
    """The closed-form Gram spectrum of strategy ``name`` on a padded domain N = b^h ≥ k."""
    if name == "privelet" and b != 2:
        raise SpecError("the Privelet (Haar) strategy is binary: use b=2")
    n, h = padded_size(k, b)
    levels = np.arange(h + 1)
    if name == "identity":
        return Spectrum(name, b, h, np.ones(h + 1), 1.0)
    if name == "hierarchical":
        return Spectrum(name, b, h, np.cumsum(float(b) ** levels), float(h + 1))
    if name == "privelet":
        mu = 2.0 ** (levels + 1)
        mu[h] = float(n)
        return Spectrum(name, b, h, mu, float(h + 1))
    raise SpecError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")


def prefix_moments(spec: Spectrum, m: int, start: int = 1) -> tuple[float, float]:
    """(Σ_j Var s_j, Var Σ_j s_j) for the prefix sums s_j = Σ_{t<j} x̂_t, j = start … m, in
    units of the per-draw noise variance (multiply by 2(Δ/ε)² for Laplace noise).

    Uses Cov(x̂) ∝ Σ_l a_l P_l with a_l = 1/μ_l − 1/μ_{l−1}, and for a vector v,
    vᵀ P_l v = Σ_blocks (Σ_{t∈block} v_t)² / b^l; for a prefix of length j,
    c_jᵀ P_l c_j = b^l ⌊j/b^l⌋ + (j mod b^l)²/b^l. Cost O(N log N).

    References
    ----------
    Li et al. (2010), the matrix mechanism's error 2(Δ/ε)² ‖W A⁺‖_F².
    """
    n = spec.size
    if not 1 <= start <= m <= n:
        raise SpecError(f"prefix lengths [{start}, {m}] must lie in [1, {n}]")
    inv = 1.0 / spec.mu
    a = inv - np.concatenate([[0.0], inv[:-1]])
    j = np.arange(start, m + 1, dtype=float)
    w = np.zeros(n)
    # Σ_j c_j: cell t lies in the prefixes of length max(t + 1, start) … m.
    w[:m] = m - np.maximum(np.arange(m), start - 1)
    tr = 0.0
    tot = 0.0
    for level in range(spec.h + 1):
        size = spec.b**level
        full = np.floor(j / size)
        rem = j - size * full
        tr += a[level] * float(np.sum(size * full + rem * rem / size))
        sums = w.reshape(n // size, size).sum(axis=1)
        tot += a[level] * float(np.sum(sums * sums) / size)
    return tr, tot
