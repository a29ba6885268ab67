"""ℳ_MH, the conditioned noise mechanism: the curator adds noise drawn from the noise law
conditioned on the constraints.

Belief revision (Liu, Sun, Zhou & Feng 2023, Def. of M* and Algorithm 1 ℳ_MH, without its
inequality constraint): the curator, holding the confidential table x (consistent, meeting
the invariants), releases

    x̃ = x + e,   e ~ Π_{v, q} p_{v,q}(Q_q e_v)  restricted to consistent tables e with
                                                   Q e = 0 at every invariant,

so its error is e alone. :func:`censusdp.estimation.conditioning.estimator.condition` is the other view:
post-processing of released measurements y = x + ε, drawing z from π(z | y); its error
ε − e′ has about twice this variance (exactly twice for Gaussian noise).

Privacy. For neighbouring tables x ~ x' that share the invariants, x − x' is itself a
consistent table with zero invariant answers, so x + S = x' + S for the constraint subspace S
and the normaliser of the conditioned law is the same for both: the density ratio is the
unconditioned mechanism's, Π p(x̃ − x) / Π p(x̃ − x') ≤ e^ε. The exact conditioned law has
the unconditioned mechanism's guarantee over databases sharing the invariants (plain DP when
there are none). With the inequality constraint x̃ ≥ 0 of Algorithm 1 the normaliser would
depend on x (and the bound would double); it is not offered here.

Sampling.

* **Gaussian laws** — exact, no MCMC: the conditioned Gaussian law on S is that of the
  Σ⁻¹-weighted projection of fresh noise, N(0, B(BᵀΣ⁻¹B)⁻¹Bᵀ) (seed 000, Thm. 22
  generalised), and x is its own projection, so x̃ = GLS(x + ε): one measurement of x
  projected by :func:`censusdp.estimation.gls.tree.tree_gls`, with its exact variances.
* **Other laws** — the chains of :class:`~censusdp.estimation.conditioning.estimator.ConditioningProblem`
  with every measurement and invariant set to zero, i.e. over the noise alone: the sampler
  never sees x, so its burn-in and certificate are the same for every table. A chain state z
  has law ∝ Π p(−Q z), so e = −z; the release is x − z at an iteration past the certified
  burn-in (:func:`~censusdp.estimation.conditioning.estimator.certified_draws`). The MCMC output is
  within the certified total-variation distance η of the exact law, which adds
  δ ≤ (1 + e^ε) η to the guarantee (an estimate from coupled chains, not a proof).

References
----------
Liu, Sun, Zhou & Feng, "Two Views of Constrained Differential Privacy: Belief Revision and
Update", AAAI 2023: M* and Algorithm 1 ℳ_MH, Table 2.
Gao, Gong & Yu (seed 000), "Subspace differential privacy", Thm. 22.
Biswas, Jacob & Vanetti (2019), L-lag couplings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from censusdp.budget import PrivacyStatement, invariant_labels, with_invariants
from censusdp.errors import DataError, SpecError
from censusdp.estimation.conditioning.estimator import (
    CertifiedDraws,
    ChainOptions,
    ConditioningProblem,
    certified_draws,
    chain_level_variances,
)
from censusdp.estimation.gls.tree import tree_gls
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.mechanisms.privacy import checked_statement
from censusdp.mechanisms.queries import Invariant, Measurement, Query, measure
from censusdp.mechanisms.registry import gaussian_conditionable
from censusdp.options import with_keywords
from censusdp.rng import KeyedRNG

__all__ = [
    "ChainOptions",
    "conditioned_mechanism",
    "conditioned_noise",
    "conditioned_releases",
]

_CURATOR = (
    "curator-side ℳ_MH: x + e with e drawn from the noise law conditioned on consistency "
    "and on zero answers at the invariants; for the exact conditioned law the guarantee is "
    "the unconditioned mechanism's (neighbours sharing the invariants differ by a vector of "
    "the constraint subspace, so the normaliser does not change)"
)


def _check_table(
    hierarchy: Hierarchy, counts: Sequence[np.ndarray], invariants: Sequence[Invariant]
) -> list[np.ndarray]:
    """The confidential levels as arrays, refused when not consistent or not meeting the
    invariants (the mechanism's guarantee assumes both); messages name levels, not values."""
    if len(counts) != hierarchy.depth:
        raise DataError(
            f"conditioned mechanism: {len(counts)} count arrays for a hierarchy of "
            f"{hierarchy.depth} levels; pass hierarchy.aggregate(leaf_counts)"
        )
    levels = [np.asarray(c) for c in counts]
    whole = hierarchy.aggregate(levels[-1])
    for k, (got, want) in enumerate(zip(levels, whole, strict=True)):
        if got.shape != want.shape or not np.array_equal(got, want):
            raise DataError(
                f"conditioned mechanism: the counts at level {hierarchy.names[k]!r} are not "
                "the sums of the level below; pass hierarchy.aggregate(leaf_counts)"
            )
    for inv in invariants:
        if not np.array_equal(inv.query.apply(levels[inv.level]), inv.values):
            raise DataError(
                f"conditioned mechanism: the invariant {inv.query.name!r} at level "
                f"{hierarchy.names[inv.level]!r} does not hold for these counts"
            )
    return levels


def conditioned_noise(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    plan: Sequence[tuple[int, Query, NoiseLaw]],
    invariants: Sequence[Invariant],
    rng: KeyedRNG,
    *,
    n_tables: int = 1,
    options: ChainOptions | None = None,
    **legacy: Any,
) -> tuple[np.ndarray, CertifiedDraws]:
    """Independent leaf tables of the conditioned noise law, by MCMC over the noise alone.

    The chains of a :class:`~censusdp.estimation.conditioning.estimator.ConditioningProblem` whose
    measurements and invariants are all zero target z ∝ Π p(−Q z), so e = −z has the noise
    law of ``plan`` conditioned on consistency and on zero answers at ``invariants`` (only
    their levels and queries are used). Each table is the state of its own chain at an
    iteration past the certified burn-in.

    ``options`` (:class:`ChainOptions`) sets the certificate and the moves; its fields as
    keyword arguments (``**legacy``, as before it existed) are applied over it for one
    release.

    Returns
    -------
    (numpy.ndarray, CertifiedDraws)
        ``(n_tables, n_leaves, n_cells)`` noise tables, and the chains with their
        certificate (``diagnostics["integer"]``: whether the tables are integers).
    """
    o = with_keywords(ChainOptions, options, legacy, "conditioned_noise")
    zero = [
        Measurement(k, q, np.zeros((hierarchy.levels[k].size, q.n_rows)), law) for k, q, law in plan
    ]
    zero_invariants = [Invariant(i.level, i.query, np.zeros_like(i.values)) for i in invariants]
    prob = ConditioningProblem(hierarchy, len(cells), zero, zero_invariants, kernel=o.kernel)
    draws = certified_draws(prob, rng, o, n_chains=max(int(n_tables), 1))
    draws.diagnostics["integer"] = bool(prob.integer)
    return -draws.finals[: int(n_tables)], draws


def conditioned_mechanism(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    counts: Sequence[np.ndarray],
    plan: Sequence[tuple[int, Query, NoiseLaw]],
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement | None,
    rng: KeyedRNG,
    **options: Any,
) -> Release:
    """Release ``x + e``, ``e`` from the noise law of ``plan`` conditioned on the constraints.

    Parameters
    ----------
    hierarchy, cells
        The geography and the table's cells.
    counts : sequence of numpy.ndarray
        The confidential table x at every level (``hierarchy.aggregate(leaf)``); it must be
        consistent and meet ``invariants``.
    plan : sequence of (level, Query, NoiseLaw)
        The unconditioned mechanism: noise of each law on each query at every node of its
        level (as for :func:`censusdp.mechanisms.queries.measure`).
    invariants : sequence of Invariant
        Answers released exactly (the noise is conditioned to be zero there).
    privacy : PrivacyStatement or None
        The unconditioned mechanism's statement (None: derived from ``plan``; a statement
        claiming less than the plan spends is a BudgetError); notes on the conditioning are
        added.
    rng : KeyedRNG
        All randomness (the Gaussian path measures with it; the chains use
        ``conditioning/mcmc``).
    **options
        ``options=`` a :class:`ChainOptions` (the certificate and the moves, as for
        :func:`~censusdp.estimation.conditioning.estimator.condition`), or its fields as keyword
        arguments (see :func:`conditioned_releases`).

    Returns
    -------
    Release
        ``estimator="conditioned_mechanism"``, consistent and invariant-exact; variances are
        those of the conditioned noise (exact for Gaussian laws, from the chains otherwise);
        integer laws give an integer release. ``diagnostics`` carries the certificate.

    Raises
    ------
    DataError
        ``counts`` not consistent or not meeting the invariants.
    ConvergenceError
        As for :func:`~censusdp.estimation.conditioning.estimator.condition`.
    """
    return conditioned_releases(
        hierarchy, cells, counts, plan, invariants, privacy, rng, n_releases=1, **options
    )[0]


def conditioned_releases(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    counts: Sequence[np.ndarray],
    plan: Sequence[tuple[int, Query, NoiseLaw]],
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement | None,
    rng: KeyedRNG,
    *,
    n_releases: int,
    options: ChainOptions | None = None,
    **legacy: Any,
) -> list[Release]:
    """``n_releases`` independent releases of :func:`conditioned_mechanism` from one
    certificate: the chains never see the data, so one burn-in T serves every chain, and
    release ``i`` is chain ``i``'s state past T (its own noise, independent of the others').
    Repeated runs of a study (or several releases of one table, each charged to the budget)
    cost about one certification. Release ``i`` of Gaussian laws measures with
    ``rng.child(f"release/{i}")``. Parameters as for :func:`conditioned_mechanism`;
    ``options`` (:class:`ChainOptions`) sets the certificate and the moves, and its fields as
    keyword arguments (``**legacy``, as before it existed) are applied over it for one
    release.
    """
    o = with_keywords(ChainOptions, options, legacy, "conditioned_releases")
    if n_releases < 1:
        raise SpecError(f"conditioned mechanism: n_releases must be at least 1, not {n_releases}")
    levels = _check_table(hierarchy, counts, invariants)
    privacy = checked_statement(hierarchy.names, plan, invariants, privacy)
    if all(gaussian_conditionable(law) for _, _, law in plan):
        return _gaussian_releases(
            hierarchy, cells, levels, plan, invariants, privacy, rng, n_releases
        )
    noise, draws = conditioned_noise(
        hierarchy, cells, plan, invariants, rng, n_tables=max(n_releases, o.n_rhat_chains),
        options=o,
    )  # fmt: skip
    integer = draws.diagnostics["integer"]
    dtype = np.int64 if integer else np.float64
    leaf_var = draws.tail.astype(np.float64).var(axis=(0, 1)).reshape(noise.shape[1:])
    variances = chain_level_variances(hierarchy, leaf_var, draws.tail)
    bound = draws.diagnostics["tv_bound"]
    eps = privacy.epsilon
    delta = f"≤ (1 + e^ε) η = {(1 + np.exp(eps)) * bound:.3g}" if eps is not None else "of order η"
    statement = with_invariants(privacy, invariant_labels(hierarchy.names, invariants))
    statement = statement.with_notes(
        _CURATOR,
        draws.certificate_note(),
        "the chains sample the noise alone (every measurement and invariant set to zero): "
        "they never see the data",
        f"the MCMC draw is within TV η = {bound:.3g} of the exact conditioned law: an "
        f"additive δ {delta} (a Monte Carlo estimate, not a proof)",
    )
    return [
        Release(
            estimator="conditioned_mechanism",
            hierarchy=hierarchy,
            cells=tuple(cells),
            estimates=[
                np.asarray(x, dtype=dtype) + np.asarray(e, dtype=dtype)
                for x, e in zip(levels, hierarchy.aggregate(noise[i]), strict=True)
            ],
            variances=[v.copy() for v in variances],
            privacy=statement,
            integer=integer,
            diagnostics=dict(draws.diagnostics),
        )
        for i in range(n_releases)
    ]


def _gaussian_releases(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    levels: list[np.ndarray],
    plan: Sequence[tuple[int, Query, NoiseLaw]],
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement,
    rng: KeyedRNG,
    n_releases: int,
) -> list[Release]:
    """Gaussian laws: the conditioned noise is the projected noise, so release ``i`` is
    exactly the GLS of one measurement of x with ``rng.child(f"release/{i}")``."""
    out = []
    for i in range(n_releases):
        meas = measure(hierarchy.names, levels, plan, rng.child(f"release/{i}"))
        rel = tree_gls(hierarchy, cells, meas, invariants, privacy)
        rel = rel.replace(
            estimator="conditioned_mechanism",
            privacy=rel.privacy.with_notes(
                _CURATOR,
                "Gaussian noise: the conditioned law is that of the projected noise, drawn "
                "exactly as the GLS projection of one measurement of x",
            ),
            diagnostics=dict(rel.diagnostics, conditioned_mechanism="exact: GLS of x + ε"),
        )
        out.append(rel)
    return out
