"""Mean squared error per range query, in closed form, without materialising R_k.

A one-dimensional range [l, r] is s_{r+1} − s_l with prefix sums s_0 = 0, …, s_k. If S is
the covariance of the estimated (s_0, …, s_k), summing Var(s_b − s_a) over all
K(K − 1)/2 pairs a < b (K = k + 1) gives

    Σ_{a<b} (S_aa + S_bb − 2 S_ab) = K tr S − 1ᵀ S 1,

so the mean error per query needs only tr S and 1ᵀ S 1 — for the strategies here both come
from :func:`~censusdp.mechanisms.blowfish_strategies.prefix_moments` in O(k log k).

Mechanisms covered (Laplace noise, per-query MSE, ε the stated budget):

* ε-DP (unbounded neighbours) with a strategy on the histogram (identity, hierarchical,
  Privelet): S = C Cov(x̂) Cᵀ.
* (ε, G¹_k)-Blowfish, Algorithm 1 / Theorem 5.2: Laplace(1/ε) on x_G = the prefix sums
  s_1 … s_{k−1} (s_k = n is public). Θ(1/ε²) per query, independent of k.
* (ε, G^θ_k)-Blowfish through the tree H^θ_k at ε/3 (Lemma 4.3, stretch 3; Theorem 5.5):
  x_{H} holds, for each red vertex, a prefix sum and, for each other vertex, its count; the
  prefix s_r is a prefix *within the group* of θ edges whose left end points lie in
  [(x−1)θ, xθ − 1], so a strategy per group (Privelet by default; groups are disjoint, so
  parallel composition) determines S block by block; a group shorter than θ (the first has
  no red edge) is padded with unused cells at its end. O(log³ θ / ε²) per query.
* (ε, G¹_{k²})-Blowfish for two-dimensional ranges (Theorem 5.4, d = 2): a transformed
  query is the sum of up to four one-dimensional ranges, one on each of four distinct lines
  of k boundary edges, each line answered with Privelet at ε (lines are disjoint). Summing
  over all (k(k+1)/2)² queries, per-query MSE = 4 (k−1)/(k+1) × (1-D Privelet MSE on k).
* ε-DP two-dimensional baseline: the tensor strategy A ⊗ A (Δ = Δ_A²), whose covariance is
  the tensor square, so per-query MSE = 2(Δ_A²/ε)² (T/Q)² with T the unit-noise 1-D total.

References
----------
Haney, Machanavajjhala & Ding, PVLDB 9(4), 2015 (seed ``policy_aware_dp_blowfish``):
Algorithm 1, Theorems 5.2, 5.4, 5.5, Lemma 4.3, Figure 3.
Xiao, Wang & Gehrke, ICDE 2010 (Privelet, O(log³ k/ε²) per range).
"""

from __future__ import annotations

from censusdp.errors import SpecError
from censusdp.mechanisms.blowfish_strategies import padded_size, prefix_moments, spectrum

__all__ = [
    "mse_from_prefix_moments",
    "dp_range_mse",
    "line_range_mse",
    "threshold_range_mse",
    "grid_range_mse",
    "dp_range_mse_2d",
]


def _check(k: int, eps: float) -> None:
    if int(k) != k or k < 2:
        raise SpecError(f"the domain size k must be an integer ≥ 2, got {k!r}")
    if not eps > 0:
        raise SpecError(f"epsilon must be positive, got {eps!r}")


def mse_from_prefix_moments(trace: float, total: float, k: int) -> float:
    """Mean of Var(s_{r+1} − s_l) over all k(k+1)/2 ranges: (K tr S − 1ᵀS1)/(K(K−1)/2)."""
    big_k = k + 1
    return (big_k * trace - total) / (big_k * (big_k - 1) / 2)


def _unit_moments(strategy: str, k: int, b: int) -> tuple[float, float, float]:
    spec = spectrum(strategy, k, b)
    tr, tot = prefix_moments(spec, k)
    return tr, tot, spec.sensitivity


def dp_range_mse(k: int, eps: float, strategy: str = "privelet", b: int = 2) -> float:
    """Per-range MSE of the matrix mechanism with ``strategy`` under (unbounded) ε-DP."""
    _check(k, eps)
    tr, tot, delta = _unit_moments(strategy, k, b)
    var = 2.0 * (delta / eps) ** 2
    return mse_from_prefix_moments(var * tr, var * tot, k)


def line_range_mse(k: int, eps: float) -> float:
    """Per-range MSE under (ε, G¹_k)-Blowfish with Laplace on the prefix sums (Thm 5.2)."""
    _check(k, eps)
    var = 2.0 / eps**2
    return mse_from_prefix_moments((k - 1) * var, (k - 1) * var, k)


def threshold_range_mse(k: int, theta: int, eps: float, strategy: str = "privelet") -> float:
    """Per-range MSE under (ε, G^θ_k)-Blowfish via H^θ_k at ε/3 (Theorem 5.5).

    Each group of θ edges is answered with ``strategy`` (padded to a power of two); the
    budget is ε/3 (ε when θ = 1, where H¹_k is the line itself).
    """
    _check(k, eps)
    if int(theta) != theta or not 1 <= theta < k:
        raise SpecError(f"theta must be an integer in [1, k), got {theta!r}")
    if theta == 1:
        return line_range_mse(k, eps)
    spec = spectrum(strategy, theta, 2)
    var = 2.0 * (spec.sensitivity / (eps / 3.0)) ** 2
    tr = tot = 0.0
    # Group x covers s_r, r ∈ [(x−1)θ, xθ − 1] ∩ [1, k − 1]; s_r is the sum of the group's
    # edges with left end point ≤ r, a prefix of the group. Short groups (the first, which
    # has no red edge, and possibly the last) are padded at the end with unused cells.
    for first in range(0, k, theta):
        lo, hi = max(first, 1), min(first + theta - 1, k - 1)
        if lo > hi:
            continue
        t, s = prefix_moments(spec, hi - lo + 1)
        tr += t
        tot += s
    return mse_from_prefix_moments(var * tr, var * tot, k)


def grid_range_mse(k: int, eps: float) -> float:
    """Per-range MSE for all 2-D ranges under (ε, G¹_{k²})-Blowfish (Thm 5.4, Privelet on
    the 2(k − 1) lines of k edges)."""
    _check(k, eps)
    padded_size(k, 2)
    return 4.0 * (k - 1) / (k + 1) * dp_range_mse(k, eps, "privelet")


def dp_range_mse_2d(k: int, eps: float, strategy: str = "privelet", b: int = 2) -> float:
    """Per-range MSE for all 2-D ranges under ε-DP with the tensor strategy A ⊗ A."""
    _check(k, eps)
    tr, tot, delta = _unit_moments(strategy, k, b)
    per_query_unit = mse_from_prefix_moments(tr, tot, k)
    return 2.0 * (delta * delta / eps) ** 2 * per_query_unit**2
