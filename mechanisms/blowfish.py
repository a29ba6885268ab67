"""The matrix mechanism under a Blowfish policy, and its transformed (plain ε-DP) twin.

Under policy G with strategy A (rows supporting the workload, W A⁺ A = W), the mechanism

    M_A(W, x) = W x + W A⁺ Lap(Δ_A(G)/ε)^p

is (ε, G)-Blowfish private, and it equals, draw for draw, the standard matrix mechanism on the
transformed instance (W_G, x_G) = (W P_G, P_G⁻¹ x) with strategy A_G = A P_G:

    W_G x_G + W_G A_G⁺ Lap(Δ_{A_G}/ε)^p,

because W_G x_G = W x, W_G A_G⁺ = W P_G P_G⁺ A⁺ = W A⁺ and Δ_{A_G} = Δ_A(G) (Theorem 4.1).
When G has no ⊥ the problem is first reduced (Case II): W' = W D, A' = A D, x' = x₋ᵥ and
W x = W' x' + n W[:, v]; the mechanism then works on (W', x', A').

:func:`edge_strategy_mechanism` answers W with a strategy A_G designed directly on the edges
(the Blowfish strategies of §5, e.g. ranges per line of grid edges): it releases
W x + W_G A_G⁺ Lap(Δ_{A_G}/ε)^p. It is (ε, G)-Blowfish private whenever W_G A_G⁺ A_G = W_G:
neighbours differ by a column P_G e of P_G, so the outputs differ by W P_G e = W_G A_G⁺(A_G e),
a shift of the Laplace vector by A_G e, whose ℓ₁ norm is at most Δ_{A_G}.

Noise is passed in as standard Laplace draws ``eta`` (scale 1, length p) so that both forms can
be run on the same draws; :func:`laplace_draws` makes them from a :class:`KeyedRNG`.

References
----------
Haney, Machanavajjhala & Ding, "Design of Policy-Aware Differentially Private Algorithms",
PVLDB 9(4), 2015 (seed ``policy_aware_dp_blowfish``): eq. (2), Definition 4.1, Theorem 4.1,
Lemma 4.8, Corollary 4.4, §5.
Li, Hay, Rastogi, Miklau & McGregor, PODS 2010 (the matrix mechanism).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from censusdp.errors import SpecError
from censusdp.mechanisms.blowfish_error import (
    dp_range_mse,
    dp_range_mse_2d,
    grid_range_mse,
    line_range_mse,
    threshold_range_mse,
)
from censusdp.mechanisms.blowfish_policies import (
    BOTTOM,
    PolicyGraph,
    PolicyTransform,
    bounded_dp_policy,
    grid_policy,
    line_policy,
    policy_sensitivity,
    stretch,
    threshold_policy,
    threshold_tree,
    transform,
    unbounded_dp_policy,
)
from censusdp.mechanisms.blowfish_strategies import spectrum, strategy_matrix
from censusdp.mechanisms.queries import LinearQuery, matrix_sensitivity, query_matrix
from censusdp.rng import KeyedRNG

__all__ = [
    "BOTTOM",
    "PolicyGraph",
    "PolicyTransform",
    "TransformedInstance",
    "line_policy",
    "threshold_policy",
    "threshold_tree",
    "grid_policy",
    "unbounded_dp_policy",
    "bounded_dp_policy",
    "transform",
    "policy_sensitivity",
    "stretch",
    "strategy_matrix",
    "spectrum",
    "l1_sensitivity",
    "laplace_draws",
    "matrix_mechanism",
    "blowfish_matrix_mechanism",
    "transformed_instance",
    "transformed_matrix_mechanism",
    "edge_strategy_mechanism",
    "dp_range_mse",
    "dp_range_mse_2d",
    "line_range_mse",
    "threshold_range_mse",
    "grid_range_mse",
]


def l1_sensitivity(a: np.ndarray | sparse.spmatrix | LinearQuery) -> float:
    """Δ_A: the largest column ℓ₁ norm (unbounded ε-DP, one count changes by 1;
    :func:`~censusdp.mechanisms.queries.matrix_sensitivity`)."""
    return matrix_sensitivity(a if sparse.issparse(a) else query_matrix(a), 1)


def laplace_draws(rng: KeyedRNG, label: str, size: int) -> np.ndarray:
    """``size`` standard Laplace draws (scale 1) from stream ``label``."""
    return rng.draw(label, size, 0, size, lambda g, n: g.laplace(0.0, 1.0, n)).ravel()


def _supports(w: np.ndarray, a: np.ndarray, a_pinv: np.ndarray, what: str) -> None:
    resid = np.max(np.abs(w @ a_pinv @ a - w)) if w.size else 0.0
    if resid > 1e-8 * max(1.0, float(np.max(np.abs(w)))):
        raise SpecError(
            f"the strategy does not support the workload ({what}: W A⁺ A ≠ W); add rows to "
            "the strategy so that every query is a linear combination of them"
        )


def matrix_mechanism(
    w: np.ndarray, x: np.ndarray, a: np.ndarray | LinearQuery, eps: float, eta: np.ndarray
) -> np.ndarray:
    """W x + W A⁺ (Δ_A/ε) η under unbounded ε-DP (seed eq. (2))."""
    w, a = query_matrix(w), query_matrix(a)
    a_pinv = np.linalg.pinv(a)
    _supports(w, a, a_pinv, "matrix mechanism")
    scale = l1_sensitivity(a) / eps
    return w @ np.asarray(x, float) + scale * (w @ (a_pinv @ np.asarray(eta, float)))


def blowfish_matrix_mechanism(
    w: np.ndarray,
    x: np.ndarray,
    a: np.ndarray | LinearQuery,
    policy: PolicyGraph,
    eps: float,
    eta: np.ndarray,
) -> np.ndarray:
    """W x + W A⁺ Lap(Δ_A(G)/ε), on the reduced problem (W', x₋ᵥ, A') when G has no ⊥.

    Parameters
    ----------
    w : (q, k) workload; x : (k,) database; a : (p, k) strategy.
    eta : (p,) standard Laplace draws.

    References
    ----------
    Seed ``policy_aware_dp_blowfish``, eq. (2), Definition 4.1, Theorem 4.1, Lemma 4.8.
    """
    w, a, x = query_matrix(w), query_matrix(a), np.asarray(x, float)
    scale = policy_sensitivity(a, policy) / eps
    if policy.has_bottom:
        a_pinv = np.linalg.pinv(a)
        _supports(w, a, a_pinv, "policy mechanism")
        return w @ x + scale * (w @ (a_pinv @ eta))
    t = transform(policy)
    w_r, a_r = t.reduce_workload(w), t.reduce_workload(a)
    a_pinv = np.linalg.pinv(a_r)
    _supports(w_r, a_r, a_pinv, "policy mechanism, reduced")
    return w_r @ x[t.kept] + t.offset(w, x.sum()) + scale * (w_r @ (a_pinv @ eta))


@dataclass(frozen=True)
class TransformedInstance:
    """(W_G, x_G, A_G) and the offset c with W x = W_G x_G + c."""

    workload: np.ndarray
    database: np.ndarray
    strategy: np.ndarray
    offset: np.ndarray


def transformed_instance(
    w: np.ndarray, x: np.ndarray, a: np.ndarray | LinearQuery, policy: PolicyGraph
) -> TransformedInstance:
    """The transformed instance of Theorem 4.1 (after the Case II reduction when needed)."""
    t = transform(policy)
    x = np.asarray(x, float)
    return TransformedInstance(
        workload=t.workload(query_matrix(w)),
        database=t.database(x),
        strategy=t.workload(query_matrix(a)),
        offset=t.offset(query_matrix(w), x.sum()),
    )


def transformed_matrix_mechanism(
    w: np.ndarray,
    x: np.ndarray,
    a: np.ndarray,
    policy: PolicyGraph,
    eps: float,
    eta: np.ndarray,
) -> np.ndarray:
    """The plain ε-DP matrix mechanism on (W_G, x_G, A_G), plus the Case II offset."""
    inst = transformed_instance(w, x, a, policy)
    return matrix_mechanism(inst.workload, inst.database, inst.strategy, eps, eta) + inst.offset


def edge_strategy_mechanism(
    w: np.ndarray,
    x: np.ndarray,
    a_g: np.ndarray,
    policy: PolicyGraph,
    eps: float,
    eta: np.ndarray,
) -> np.ndarray:
    """W x + W_G A_G⁺ Lap(Δ_{A_G}/ε) for a strategy A_G over the edges of G.

    Raises
    ------
    SpecError
        When A_G does not support W_G (then the shift argument fails).
    """
    w, a_g, x = query_matrix(w), query_matrix(a_g), np.asarray(x, float)
    t = transform(policy)
    w_g = t.workload(w)
    if a_g.shape[1] != w_g.shape[1]:
        raise SpecError(f"the edge strategy needs {w_g.shape[1]} columns (one per edge)")
    a_pinv = np.linalg.pinv(a_g)
    _supports(w_g, a_g, a_pinv, "edge strategy")
    return w @ x + (l1_sensitivity(a_g) / eps) * (w_g @ (a_pinv @ eta))
