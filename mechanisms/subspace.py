"""Invariant-respecting (induced subspace DP) additive mechanisms for linear queries.

A linear query is given as the matrix A (n × d) whose column a_j is the change one individual
can make to the n answers, so Δ₁ = max_j ‖a_j‖₁ and Δ₂ = max_j ‖a_j‖₂; the answers are A h
for a data vector h ∈ ℝ^d. The invariants are the rows of C (n_c × n, full row rank): C A h
is released exactly. N is the null space of C, Π_N its orthogonal projector and Q_N an
orthonormal basis of it.

* :func:`projected_laplace` / :func:`projected_gaussian`: A h + Π_N e, e iid at the full
  sensitivity of A (Corollaries 17 and 14).
* :func:`extended_laplace` / :func:`extended_gaussian`: A h + Q_N e_N, e_N iid at the
  sensitivity of Q_Nᵀ A (Corollaries 18 and 15, Algorithm 1); never worse than projected.
* :func:`correlated_gaussian`: the subspace version of the Nikolov–Talwar–Zhang correlated
  Gaussian mechanism (Algorithm 3, Theorem 20).
* :func:`distributed_projected`: Algorithm 4; agents that share the secret key each output
  their own coordinates of the projected release.

All are unbiased (Corollary 21); their noise law is public, so the covariance and the mean
squared error reported with each release are exact. The guarantee is *induced subspace DP*
(Definition 6), never plain DP, whenever C has rows.

References
----------
Gao, Gong & Yu, "Subspace Differential Privacy", AAAI 2022: Corollary 11, Theorem 12,
Corollaries 14–18, Algorithm 1, Theorem 20 and Algorithm 3, Corollary 21, Algorithm 4.
Nikolov, Talwar & Zhang, "The Geometry of Differential Privacy: the Sparse and Approximate
Cases", STOC 2013, Algorithm 1 / Theorem 13 (correlated Gaussian noise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from censusdp.budget import Accounting, PrivacyStatement
from censusdp.errors import SolverError, SpecError
from censusdp.mechanisms.calibration import (
    analytic_gaussian_delta,
    gaussian_sigma_for,
    laplace_scale,
)
from censusdp.mechanisms.laws import Gaussian, Laplace, NoiseLaw, floating_point_note
from censusdp.mechanisms.projection import (
    null_space_basis,
    project_dense,
    project_group_totals,
    row_space_basis,
)
from censusdp.mechanisms.queries import LinearQuery, matrix_sensitivity, query_matrix
from censusdp.options import with_keywords
from censusdp.rng import KeyedRNG

__all__ = [
    "DistributedRelease",
    "ProjectionOptions",
    "SubspaceRelease",
    "agent_release",
    "correlated_gaussian",
    "distributed_projected",
    "extended_gaussian",
    "extended_laplace",
    "l1_sensitivity",
    "l2_sensitivity",
    "projected_gaussian",
    "projected_laplace",
]

#: Above this many answers the dense covariance matrix is not formed (variances only).
DENSE_COVARIANCE_LIMIT = 4096


@dataclass(frozen=True, eq=False)
class SubspaceRelease:
    """The output of a subspace mechanism and its exact error description.

    Attributes
    ----------
    release : numpy.ndarray
        The n released answers; C·release = C·A h.
    covariance : numpy.ndarray or None
        Exact covariance of the release (n × n), None when n > DENSE_COVARIANCE_LIMIT.
    variances : numpy.ndarray
        Exact per-answer variances (the diagonal of ``covariance``).
    mse : float
        Exact expected squared error E‖release − A h‖² (the trace of the covariance).
    privacy : PrivacyStatement
        The guarantee, naming the invariants (induced subspace DP).
    mechanism : str
        Mechanism name.
    sensitivity : float
        The sensitivity the noise was calibrated to (ℓ₁ for Laplace, ℓ₂ for Gaussian).
    noise_scale : float
        Scale of the iid noise before mapping (Laplace b or Gaussian σ).
    details : dict
        Mechanism-specific facts (route taken, subspace dimensions, r_i, …).
    """

    release: np.ndarray
    covariance: np.ndarray | None
    variances: np.ndarray
    mse: float
    privacy: PrivacyStatement
    mechanism: str
    sensitivity: float
    noise_scale: float
    details: dict = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class DistributedRelease:
    """Algorithm 4: the agents' outputs and their concatenation in coordinate order."""

    outputs: tuple[np.ndarray, ...]
    partition: tuple[np.ndarray, ...]
    release: np.ndarray


# --------------------------------------------------------------------------------------------
# Inputs and sensitivities


def _query(
    A: np.ndarray | LinearQuery | None, h: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray]:
    h = np.asarray(h, dtype=np.float64).reshape(-1)
    if A is None:
        return None, h.copy()
    A = query_matrix(A)
    if A.ndim != 2 or A.shape[1] != h.shape[0]:
        raise SpecError(
            f"the query matrix A must be (n × d) with d = len(h) = {h.shape[0]}; "
            f"got shape {A.shape}"
        )
    return A, A @ h


def l1_sensitivity(A: np.ndarray | LinearQuery | None) -> float:
    """Δ₁ = max_j ‖a_j‖₁ over the columns (:func:`matrix_sensitivity`); 1 for the identity
    (``A`` None)."""
    return 1.0 if A is None else matrix_sensitivity(query_matrix(A), 1)


def l2_sensitivity(A: np.ndarray | LinearQuery | None) -> float:
    """Δ₂ = max_j ‖a_j‖₂ over the columns (:func:`matrix_sensitivity`); 1 for the identity."""
    return 1.0 if A is None else matrix_sensitivity(query_matrix(A), 2)


def _invariants(
    C: np.ndarray | None, groups: np.ndarray | None, n: int
) -> tuple[np.ndarray | None, np.ndarray | None, int]:
    """(C as float array or None, group index or None, n_c) after checks."""
    if C is not None and groups is not None:
        raise SpecError("give the invariants either as a matrix C or as groups, not both")
    if groups is not None:
        g = np.asarray(groups)
        if g.shape != (n,):
            raise SpecError(f"groups must give one group per answer ({n}), got shape {g.shape}")
        return None, g, int(np.unique(g).size)
    if C is None:
        return None, None, 0
    C = np.asarray(C, dtype=np.float64)
    if C.ndim != 2 or C.shape[1] != n:
        raise SpecError(f"the invariant matrix C must be (n_c × {n}); got shape {C.shape}")
    row_space_basis(C)  # checks full row rank
    return C, None, C.shape[0]


def _names(names: Sequence[str] | None, C: np.ndarray | None, groups, n_c: int) -> tuple:
    if names is not None:
        return tuple(names)
    if groups is not None:
        return (f"group totals ({n_c} groups)",)
    if C is not None and n_c:
        return (f"C·A(x): {n_c} linear invariant(s)",)
    return ()


def _project(e: np.ndarray, C: np.ndarray | None, groups: np.ndarray | None) -> np.ndarray:
    if groups is not None:
        if e.ndim == 2:
            return np.stack([project_group_totals(col, groups) for col in e.T], axis=1)
        return project_group_totals(e, groups)
    if C is not None and C.shape[0]:
        return project_dense(e, C)
    return e


def _projector_cov(
    C: np.ndarray | None, groups: np.ndarray | None, n: int, var: float
) -> tuple[np.ndarray | None, np.ndarray]:
    """(var·Π_N or None, diagonal of it)."""
    if groups is not None:
        sizes = np.bincount(groups)
        diag = var * (1.0 - 1.0 / sizes[groups])
        if n > DENSE_COVARIANCE_LIMIT:
            return None, diag
        cov = np.zeros((n, n))
        same = groups[:, None] == groups[None, :]
        cov[same] = -var / np.broadcast_to(sizes[groups][:, None], (n, n))[same]
        cov[np.diag_indices(n)] = diag
        return cov, diag
    if C is not None and C.shape[0]:
        q = row_space_basis(C)
        diag = var * (1.0 - (q * q).sum(axis=1))
        if n > DENSE_COVARIANCE_LIMIT:
            return None, diag
        return var * (np.eye(n) - q @ q.T), diag
    diag = np.full(n, var)
    return (var * np.eye(n) if n <= DENSE_COVARIANCE_LIMIT else None), diag


def _draw(rng: KeyedRNG, label: str, n: int, law: NoiseLaw, repeats: int | None = None):
    """e of shape (n,), or (n, repeats) with independent columns, from the keyed stream."""
    width = 1 if repeats is None else int(repeats)
    if width < 1:
        raise SpecError(f"repeats must be a positive integer, got {repeats!r}")
    e = rng.draw(label, n, 0, n, law.sample, width=width).astype(np.float64)
    return e[:, 0] if repeats is None else e


def _out(answers: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """answers + noise, with repeated draws as rows (repeats, n)."""
    return answers + (noise if noise.ndim == 1 else noise.T)


def _statement(accounting: str, names: tuple, mechanism: str, **budget) -> PrivacyStatement:
    """Every mechanism here adds real-valued noise sampled in floating point (Mironov 2012)."""
    return floating_point_note(
        PrivacyStatement(
            accounting=accounting,
            invariants=names,
            mechanism=mechanism,
            geometry="euclidean",
            **budget,
        ),
        continuous=True,
    )


def _gaussian_budget(sigma: float, sensitivity: float, epsilon, delta, method: str) -> dict:
    """ρ of the noise and an honest (ε, δ) note: the exact δ at ε (Balle & Wang, Thm. 8)."""
    rho = sensitivity**2 / (2.0 * sigma**2) if sensitivity > 0 else 0.0
    exact = analytic_gaussian_delta(epsilon, sigma, sensitivity) if sensitivity > 0 else 0.0
    return {
        "rho": rho,
        "delta": float(delta),
        "notes": (
            f"σ = {sigma:.6g} from the {method} Gaussian calibration for (ε = {epsilon:g}, "
            f"δ = {delta:g}); by the exact Gaussian privacy profile it is (ε = {epsilon:g}, "
            f"δ = {exact:.3g})-DP",
        ),
    }


# --------------------------------------------------------------------------------------------
# Projected and extended mechanisms


def _gaussian_result(
    mechanism: str,
    release: np.ndarray,
    cov: np.ndarray | None,
    diag: np.ndarray,
    mse: float,
    names: tuple,
    law: Gaussian,
    sens: float,
    budget: tuple[float, float, str],
) -> SubspaceRelease:
    """The result of a Gaussian subspace mechanism with its zCDP and (ε, δ) statement."""
    epsilon, delta, calibration = budget
    return SubspaceRelease(
        release=release,
        covariance=cov,
        variances=diag,
        mse=mse,
        privacy=_statement(
            Accounting.ZCDP,
            names,
            mechanism,
            **_gaussian_budget(law.sigma, sens, epsilon, delta, calibration),
        ),
        mechanism=mechanism,
        sensitivity=sens,
        noise_scale=law.sigma,
    )


def _projected(
    A,
    h,
    C,
    groups,
    law: NoiseLaw,
    rng: KeyedRNG,
    label: str,
    repeats: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, int]:
    _, answers = _query(A, h)
    n = answers.shape[0]
    C, groups, n_c = _invariants(C, groups, n)
    noise = _project(_draw(rng, label, n, law, repeats), C, groups)
    cov, diag = _projector_cov(C, groups, n, law.variance)
    return _out(answers, noise), answers, cov, diag, n_c


def projected_laplace(
    A: np.ndarray | LinearQuery | None,
    h: np.ndarray,
    C: np.ndarray | None,
    epsilon: float,
    rng: KeyedRNG,
    *,
    groups: np.ndarray | None = None,
    label: str = "subspace/projected_laplace",
    invariant_names: Sequence[str] | None = None,
    repeats: int | None = None,
) -> SubspaceRelease:
    """Projected Laplace mechanism: A h + Π_N e, e ~ Lap(Δ₁(A)/ε)ⁿ.

    (ε, 0)-induced subspace DP for A and C. Covariance 2b²Π_N, MSE 2b²(n − n_c).

    Parameters
    ----------
    A : numpy.ndarray or None
        Query matrix (n × d), columns = one individual's changes; None for the identity.
    h : numpy.ndarray
        Data vector (d,).
    C : numpy.ndarray or None
        Invariants (n_c × n, full row rank), or None.
    epsilon : float
    rng : KeyedRNG
        The noise is ``rng.draw(label, n, 0, n, Laplace(b).sample)``.
    groups : numpy.ndarray, optional
        Instead of C: one group number per answer, invariants = group totals (O(n)).
    label : str
        Stream label of the noise.
    invariant_names : sequence of str, optional
        Names of the invariants for the privacy statement.
    repeats : int, optional
        Draw this many independent releases at once (``release`` of shape (repeats, n)) for
        Monte Carlo error studies; the privacy statement covers one release only.

    References
    ----------
    Gao, Gong & Yu (2022), Corollary 17.
    """
    sens = l1_sensitivity(A)
    law = Laplace(laplace_scale(epsilon, sens))
    release, _, cov, diag, n_c = _projected(A, h, C, groups, law, rng, label, repeats)
    names = _names(invariant_names, C, groups, n_c)
    return SubspaceRelease(
        release=release,
        covariance=cov,
        variances=diag,
        mse=law.variance * (release.shape[-1] - n_c),
        privacy=_statement(Accounting.PURE, names, "projected_laplace", epsilon=float(epsilon)),
        mechanism="projected_laplace",
        sensitivity=sens,
        noise_scale=law.scale,
    )


@dataclass(frozen=True, eq=False)
class ProjectionOptions:
    """What a projected mechanism draws and names, beyond its query, data and budget.

    Attributes
    ----------
    groups : numpy.ndarray, optional
        Group index of each answer: the invariants are the groups' sums (instead of ``C``).
    label : str, optional
        The keyed noise stream; None: the mechanism's own (``subspace/<mechanism>``).
    invariant_names : sequence of str, optional
        The invariants' names in the statement (default: numbered).
    repeats : int, optional
        Independent releases drawn at once (a leading axis), for tests and simulations.
    """

    groups: np.ndarray | None = None
    label: str | None = None
    invariant_names: Sequence[str] | None = None
    repeats: int | None = None


def projected_gaussian(
    A: np.ndarray | LinearQuery | None,
    h: np.ndarray,
    C: np.ndarray | None,
    epsilon: float,
    delta: float,
    rng: KeyedRNG,
    *,
    calibration: str = "analytic",
    options: ProjectionOptions | None = None,
    **legacy: Any,
) -> SubspaceRelease:
    """Projected Gaussian mechanism: A h + Π_N e, e ~ N(0, σ²)ⁿ, σ = c(ε, δ)·Δ₂(A).

    (ε, δ)-induced subspace DP. Covariance σ²Π_N, MSE (n − n_c)σ². ``calibration`` picks σ
    (see :func:`~censusdp.mechanisms.calibration.gaussian_sigma_for`; default the analytic
    Gaussian, the seeds' ``"classical"`` c(ε, δ) for reproducing them). The statement also reports ρ = Δ₂²/(2σ²).
    ``options`` (:class:`ProjectionOptions`) gives the groups, the noise stream's label, the
    invariants' names and repeats; the same names as keyword arguments (``**legacy``, as
    before the options existed) are applied over it for one release.

    References
    ----------
    Gao, Gong & Yu (2022), Lemma 13 and Corollary 14.
    """
    o = with_keywords(ProjectionOptions, options, legacy, "projected_gaussian")
    label = "subspace/projected_gaussian" if o.label is None else o.label
    sens = l2_sensitivity(A)
    law = Gaussian(gaussian_sigma_for(epsilon, delta, sens, calibration))
    release, _, cov, diag, n_c = _projected(A, h, C, o.groups, law, rng, label, o.repeats)
    names = _names(o.invariant_names, C, o.groups, n_c)
    mse = law.variance * (release.shape[-1] - n_c)
    budget = (epsilon, delta, calibration)
    return _gaussian_result("projected_gaussian", release, cov, diag, mse, names, law, sens, budget)


def _extension_setup(A, h, C, invariant_names):
    """``(A, answers, C, n, n_c, Q_N, Q_Nᵀ A, names)`` of an extension mechanism."""
    A_, answers = _query(A, h)
    n = answers.shape[0]
    C_, _, n_c = _invariants(C, None, n)
    q = np.eye(n) if C_ is None else null_space_basis(C_)
    a_n = q.T if A_ is None else q.T @ A_
    return A_, answers, C_, n, n_c, q, a_n, _names(invariant_names, C_, None, n_c)


def extended_laplace(
    A: np.ndarray | LinearQuery | None,
    h: np.ndarray,
    C: np.ndarray | None,
    epsilon: float,
    rng: KeyedRNG,
    *,
    label: str = "subspace/extended_laplace",
    invariant_names: Sequence[str] | None = None,
    repeats: int | None = None,
) -> SubspaceRelease:
    """Extended Laplace mechanism: A h + Q_N w, w ~ Lap(Δ₁(Q_NᵀA)/ε)^(n − n_c).

    Δ₁(Q_NᵀA) = max_j ‖Q_Nᵀ a_j‖₁ depends on the basis Q_N and, unlike the ℓ₂ case, can
    exceed Δ₁(A). When it does, the mechanism uses the projected noise Π_N Lap(Δ₁(A)/ε)ⁿ
    instead — itself an extension mechanism (Theorem 12 with M̂ = Π_N(A h + e)) — so its MSE
    never exceeds :func:`projected_laplace`'s; ``details["route"]`` says which was used.

    References
    ----------
    Gao, Gong & Yu (2022), Theorem 12 and Corollary 18.
    """
    A_, answers, C_, n, n_c, q, a_n, names = _extension_setup(A, h, C, invariant_names)
    full = l1_sensitivity(A_)
    sens = l1_sensitivity(a_n) if a_n.size else 0.0
    if sens <= full and sens > 0:
        law = Laplace(laplace_scale(epsilon, sens))
        noise = q @ _draw(rng, label, n - n_c, law, repeats)
        route = "extended"
    else:
        sens = full
        law = Laplace(laplace_scale(epsilon, sens))
        noise = _project(_draw(rng, label, n, law, repeats), C_, None)
        route = "projected"
    cov, diag = _projector_cov(C_, None, n, law.variance)
    return SubspaceRelease(
        release=_out(answers, noise),
        covariance=cov,
        variances=diag,
        mse=law.variance * (n - n_c),
        privacy=_statement(Accounting.PURE, names, "extended_laplace", epsilon=float(epsilon)),
        mechanism="extended_laplace",
        sensitivity=sens,
        noise_scale=law.scale,
        details={"route": route, "l1_sensitivity_full": full},
    )


def extended_gaussian(
    A: np.ndarray | LinearQuery | None,
    h: np.ndarray,
    C: np.ndarray | None,
    epsilon: float,
    delta: float,
    rng: KeyedRNG,
    *,
    calibration: str = "analytic",
    label: str = "subspace/extended_gaussian",
    invariant_names: Sequence[str] | None = None,
    repeats: int | None = None,
) -> SubspaceRelease:
    """Extended Gaussian mechanism (Algorithm 1): A h + Q_N e_N, e_N ~ N(0, σ_N²)^(n − n_c).

    σ_N = c(ε, δ)·Δ₂(Q_NᵀA) ≤ c(ε, δ)·Δ₂(A) since Q_N has orthonormal columns, so the MSE
    (n − n_c)σ_N² never exceeds the projected Gaussian's. Covariance σ_N²Π_N.

    References
    ----------
    Gao, Gong & Yu (2022), Algorithm 1 and Corollary 15.
    """
    A_, answers, C_, n, n_c, q, a_n, names = _extension_setup(A, h, C, invariant_names)
    sens = l2_sensitivity(a_n) if a_n.size else 0.0
    sens = min(sens, l2_sensitivity(A_))  # equal up to rounding; never report more
    law = Gaussian(gaussian_sigma_for(epsilon, delta, sens, calibration))
    noise = q @ _draw(rng, label, n - n_c, law, repeats)
    cov, diag = _projector_cov(C_, None, n, law.variance)
    mse = law.variance * (n - n_c)
    budget = (epsilon, delta, calibration)
    return _gaussian_result(
        "extended_gaussian", _out(answers, noise), cov, diag, mse, names, law, sens, budget
    )


# --------------------------------------------------------------------------------------------
# Correlated Gaussian (Algorithm 3)


def _mvee(points: np.ndarray) -> np.ndarray:
    """X with {x : xᵀXx ≤ 1} the minimum-volume centred ellipsoid containing ±points[:, j].

    max log det X  s.t.  p_jᵀ X p_j ≤ 1 for every column p_j (points has full row rank).
    """
    import cvxpy as cp  # heavy; only the correlated mechanism needs it

    m = points.shape[0]
    scale = float(np.sqrt((points**2).sum(axis=0)).max())
    p = (points / scale).T  # d × m
    X = cp.Variable((m, m), PSD=True)
    problem = cp.Problem(cp.Maximize(cp.log_det(X)), [cp.sum(cp.multiply(p @ X, p), axis=1) <= 1.0])
    for solver in ("CLARABEL", "SCS"):
        try:
            problem.solve(solver=solver)
        except cp.error.SolverError:
            continue
        if problem.status in ("optimal", "optimal_inaccurate") and X.value is not None:
            value = 0.5 * (X.value + X.value.T)
            return value / scale**2
    raise SolverError(
        f"correlated_gaussian: the minimum-volume ellipsoid problem ({m} dimensions) failed "
        f"with status {problem.status!r} under CLARABEL and SCS"
    )


def _decompose(points: np.ndarray) -> list[np.ndarray]:
    """Orthonormal bases U_1, …, U_k splitting ℝ^m (Algorithm 3, steps 3–11)."""
    m = points.shape[0]
    if m == 1:
        return [np.ones((1, 1))]
    X = _mvee(points)
    # the axes of the ellipsoid F B₂ = {x : xᵀXx ≤ 1}: left singular vectors of F = X^{-1/2},
    # i.e. eigenvectors of X with singular values 1/√λ (largest axis = smallest λ)
    lam, vecs = np.linalg.eigh(X)
    u = vecs[:, np.argsort(-1.0 / lam)]
    half = m // 2
    v, u1 = u[:, :half], u[:, half:]
    return [u1] + [v @ w for w in _decompose(v.T @ points)]


def correlated_gaussian(
    A: np.ndarray | LinearQuery,
    h: np.ndarray,
    C: np.ndarray | None,
    epsilon: float,
    delta: float,
    rng: KeyedRNG,
    *,
    calibration: str = "analytic",
    label: str = "subspace/correlated_gaussian",
    invariant_names: Sequence[str] | None = None,
    repeats: int | None = None,
) -> SubspaceRelease:
    """Subspace correlated Gaussian mechanism (Algorithm 3).

    With A_N = Q_NᵀA (reduced to its range if rank deficient): compute the minimum-volume
    enclosing ellipsoid of A_N B₁ = conv{±a_j^N} (cvxpy, log-det), split its axes — the left
    singular vectors u_1, …, u_m by decreasing singular value — into U_1 = (u_i)_{i > m/2} and
    V = (u_i)_{i ≤ m/2}, recurse on Vᵀ A_N, giving k ≤ ⌈1 + log₂ m⌉ subspaces U_i of
    dimension n_i. With r_i = max_j ‖U_iᵀ a_j^N‖₂ and c the unit-sensitivity Gaussian
    multiplier of ``calibration`` (the analytic Gaussian by default; ``"classical"`` is the
    seeds' c(ε, δ); any valid one works, since the stacked pieces scaled by 1/(√k r_i) are
    one Gaussian mechanism of ℓ₂ sensitivity ≤ 1 and noise c),

        release = A h + Q_N √k Σ_i r_i c U_i w_i,   w_i ~ N(0, 1)^{n_i}.

    Covariance k c² Q_N (Σ r_i² U_iU_iᵀ) Q_Nᵀ; MSE k c² Σ r_i² n_i. Privacy: each piece is
    a Gaussian of ℓ₂ sensitivity r_i and scale √k r_i c, i.e. ρ_i = 1/(2kc²); the k pieces
    compose to ρ = 1/(2c²), the same ρ as the projected Gaussian at σ = c·Δ₂, and the
    (ε, δ) claim is that of Theorem 20 (Nikolov et al. Thm. 13). The ellipsoid only shapes
    the noise: the r_i are computed exactly from the final subspaces, so an inexact solver
    solution costs accuracy, never privacy.

    References
    ----------
    Gao, Gong & Yu (2022), Algorithm 3 and Theorem 20; Nikolov, Talwar & Zhang (2013),
    Algorithm 1 and Theorem 13.
    """
    A_, answers, C_, n, n_c, q, a_n, names = _extension_setup(A, h, C, invariant_names)
    # restrict to the range of A_N: outside it the answers carry no information
    uu, s, _ = np.linalg.svd(a_n, full_matrices=False)
    rank = int((s > max(a_n.shape) * np.finfo(np.float64).eps * (s[0] if s.size else 0)).sum())
    w_basis = uu[:, :rank]
    points = w_basis.T @ a_n
    pieces = _decompose(points) if rank else []
    k = len(pieces)
    c = gaussian_sigma_for(epsilon, delta, 1.0, calibration)
    radii = [float(np.sqrt(((u.T @ points) ** 2).sum(axis=0)).max()) for u in pieces]
    gen_noise = np.zeros(rank if repeats is None else (rank, int(repeats)))
    cov_n = np.zeros((rank, rank))
    for i, (u, r) in enumerate(zip(pieces, radii, strict=True)):
        std = math.sqrt(k) * r * c
        w = _draw(rng, f"{label}/piece{i}", u.shape[1], Gaussian(1.0), repeats)
        gen_noise += std * (u @ w)
        cov_n += std**2 * (u @ u.T)
    basis = q @ w_basis
    noise = basis @ gen_noise
    cov_full = basis @ cov_n @ basis.T
    mse = float(sum(k * c * c * r * r * u.shape[1] for u, r in zip(pieces, radii, strict=True)))
    proj_mse = (n - n_c) * (c * l2_sensitivity(A_)) ** 2
    return SubspaceRelease(
        release=_out(answers, noise),
        covariance=cov_full if n <= DENSE_COVARIANCE_LIMIT else None,
        variances=np.diag(cov_full).copy(),
        mse=mse,
        privacy=_statement(
            Accounting.ZCDP,
            names,
            "correlated_gaussian",
            rho=1.0 / (2.0 * c * c),
            delta=float(delta),
            notes=(
                f"correlated Gaussian noise over {k} subspaces, c = {c:.6g} from the "
                f"{calibration} calibration for (ε = {epsilon:g}, δ = {delta:g}), as in "
                "Algorithm 3 of Gao, Gong & Yu (2022)",
            ),
        ),
        mechanism="correlated_gaussian",
        sensitivity=l2_sensitivity(A_),
        noise_scale=c,
        details={
            "k": k,
            "dimensions": [int(u.shape[1]) for u in pieces],
            "radii": radii,
            "projected_gaussian_mse": proj_mse,
        },
    )


# --------------------------------------------------------------------------------------------
# Distributed privatization (Algorithm 4)


def agent_release(
    x_local: np.ndarray,
    coords: np.ndarray,
    n: int,
    law: NoiseLaw,
    rng: KeyedRNG,
    *,
    C: np.ndarray | None = None,
    groups: np.ndarray | None = None,
    label: str,
) -> np.ndarray:
    """What one agent of Algorithm 4 computes: y_ℓ = x_ℓ + Γ_ℓ Π_N e.

    The agent holds the common secret key (``rng``) and its own answers ``x_local`` at
    coordinates ``coords``. With a general C it regenerates the whole of e (from the keyed
    stream ``label``) and keeps its coordinates of Π_N e. With group-total invariants
    (``groups``, one group per coordinate, groups contiguous in coordinate order) it draws
    only the noise of the coordinate range spanned by the groups it touches and projects
    there; the keyed streams make both routes equal bit for bit to the single-process noise.
    """
    coords = np.asarray(coords, dtype=np.int64)
    x_local = np.asarray(x_local, dtype=np.float64)
    if groups is None:
        e = _draw(rng, label, n, law)
        return x_local + _project(e, C, None)[coords]
    groups = np.asarray(groups)
    if np.any(np.diff(groups) < 0):
        raise SpecError("agent_release with groups needs coordinates sorted by group")
    touched = np.unique(groups[coords])
    lo = int(np.searchsorted(groups, touched[0], side="left"))
    hi = int(np.searchsorted(groups, touched[-1], side="right"))
    e = rng.draw(label, n, lo, hi, law.sample)[:, 0].astype(np.float64)
    local = project_group_totals(e, groups[lo:hi] - groups[lo])
    return x_local + local[coords - lo]


def distributed_projected(
    A: np.ndarray | LinearQuery | None,
    h: np.ndarray,
    law: NoiseLaw,
    rng: KeyedRNG,
    partition: Sequence[np.ndarray],
    *,
    C: np.ndarray | None = None,
    groups: np.ndarray | None = None,
    label: str,
) -> DistributedRelease:
    """Algorithm 4: distributed privatization with a common secret key.

    Every agent ℓ observes only x_ℓ = (A h)[K_ℓ], regenerates the common noise e from the
    shared key and outputs y_ℓ = x_ℓ + Γ_ℓ Π_N e (:func:`agent_release`). The concatenation
    equals the single-process projected release (same ``law``, ``rng`` and ``label``) bit for
    bit; e.g. ``projected_laplace(A, h, C, ε, rng, label=L)`` with
    ``law = Laplace(Δ₁(A)/ε)``.

    Parameters
    ----------
    partition : sequence of int arrays
        The coordinates K_ℓ of each agent; together a partition of {0, …, n−1}.

    References
    ----------
    Gao, Gong & Yu (2022), Algorithm 4 (Appendix E).
    """
    _, answers = _query(A, h)
    n = answers.shape[0]
    C_, groups_, _ = _invariants(C, groups, n)
    parts = tuple(np.asarray(k, dtype=np.int64) for k in partition)
    allc = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if allc.size != n or not np.array_equal(np.sort(allc), np.arange(n)):
        raise SpecError(f"the agents' coordinates must partition 0..{n - 1} exactly")
    outputs = tuple(
        agent_release(answers[k], k, n, law, rng, C=C_, groups=groups_, label=label) for k in parts
    )
    release = np.empty(n)
    for k, y in zip(parts, outputs, strict=True):
        release[k] = y
    return DistributedRelease(outputs=outputs, partition=parts, release=release)
