"""The conditioning estimator: a consistent, invariant-respecting table drawn from the noise
law conditioned on the constraints (belief revision), by MCMC with a certified burn-in.

Given the noisy measurements ``y`` and their public noise laws, the target over consistent
tables ``z`` (parent = Σ children, invariants exact) is the flat-prior posterior

    π(z | y) ∝ Π_{v, q} p_{v,q}(y_{v,q} − Q_q z_v),

i.e. the noise ``e = y − Q z`` restricted to the constraint set. The sampler sees only ``y``,
the laws and the invariants, never the confidential table: the release is post-processing of
the measurements. π is translation-equivariant and the laws are symmetric, so a draw (and the
posterior mean) is unbiased for the true table.

* **Gaussian laws** — exact, no MCMC: the posterior is N(ẑ, Cov) with ẑ the Σ⁻¹-weighted GLS
  estimate and Cov its error covariance (seed 000, Thm. 22 generalised). ``n_draws == 1``
  releases the draw ẑ(y + ε′) = ẑ + P ε′ with fresh ε′ ~ N(0, Σ) (P the GLS map), whose error
  variance is twice GLS's; ``n_draws > 1`` releases the posterior mean ẑ itself (the average
  of infinitely many draws), with exact variances. Both reuse
  :func:`censusdp.estimation.gls.tree.tree_gls`.
* **Laplace and integer laws** (and Gaussian laws under non-negativity) —
  :class:`~censusdp.estimation.conditioning.mcmc.MetropolisHastings` with
  :class:`~censusdp.estimation.conditioning.gibbs_moves.GibbsTreeMoves` (exact draws along pair
  directions, level sweeps; coupled chains contract synchronously and meet by maximal
  coupling) when every law is Laplace-type (Laplace, discrete Laplace) or every law is
  Gaussian-type (Gaussian, discrete Gaussian: exact truncated-normal / discrete-Gaussian
  line draws, :mod:`censusdp.estimation.conditioning.gaussian_line`), else
  :class:`~censusdp.estimation.conditioning.mcmc.TreeMoves` (random-walk Metropolis, seed 003 Alg. 1). L-lag coupled pairs started from the same
  initial law as the release chains give meeting times; the burn-in T is the first iteration
  whose TV bound is below ``tv_bound``. ``n_draws == 1`` releases the state of one chain at
  iteration ≥ T; ``n_draws > 1`` releases the average of ``n_draws`` independent chains' states
  (Monte Carlo standard errors in ``diagnostics``). Integer laws give integer releases.

References
----------
Liu, Sun, Zhou & Feng, "Two Views of Constrained Differential Privacy: Belief Revision and Update": conditioning (Def. of M*), Algorithm 1 ℳ_MH, Table 2.
Gao, Gong & Yu (seed 000), "Subspace differential privacy", Thm. 22.
Biswas, Jacob & Vanetti (2019), L-lag couplings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from censusdp.budget import PrivacyStatement, invariant_labels, with_invariants
from censusdp.errors import ConvergenceError, SpecError
from censusdp.estimation.conditioning.diagnostics import (
    batch_means_se,
    iterations_for_tv,
    meeting_times,
    split_rhat,
)
from censusdp.estimation.conditioning.gibbs_moves import GibbsTreeMoves, LineDraws
from censusdp.estimation.conditioning.mcmc import (
    DoubleGeometricStep,
    GaussianStep,
    MetropolisHastings,
    ProductTarget,
    Proposal,
    TreeLayout,
    TreeMoves,
)
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.mechanisms.privacy import checked_statement
from censusdp.mechanisms.queries import Invariant, Measurement, at_level_indices
from censusdp.mechanisms.registry import gaussian_conditionable
from censusdp.options import with_keywords
from censusdp.rng import KeyedRNG

__all__ = [
    "ChainOptions",
    "condition",
    "ConditioningOptions",
    "certificate",
    "certified_draws",
    "chain_level_variances",
    "CertifiedDraws",
    "ConditioningProblem",
]


class ConditioningProblem:
    """The MCMC formulation of conditioning on a hierarchy (state layout, target, moves).

    Parameters
    ----------
    hierarchy : Hierarchy
    n_cells : int
    measurements : sequence of Measurement
    invariants : sequence of Invariant
    nonnegative : bool
        Restrict the released leaf cells to ≥ 0.
    step_scale : float, optional
        Scale of δ; default the standard deviation of the finest level's noise law.
    start : numpy.ndarray, optional
        A consistent leaf table (n_leaves, n_cells) satisfying the invariants, to start from.
    kernel : {"auto", "gibbs", "metropolis"}
        Moves: Gibbs level sweeps (needs Laplace-type laws — Laplace, discrete Laplace — or
        Gaussian-type laws — Gaussian, discrete Gaussian — at every measured level; "auto"
        picks them when possible) or random-walk Metropolis pair moves.
    """

    def __init__(
        self,
        hierarchy: Hierarchy,
        n_cells: int,
        measurements: Sequence[Measurement],
        invariants: Sequence[Invariant],
        *,
        nonnegative: bool = False,
        step_scale: float | None = None,
        start: np.ndarray | None = None,
        kernel: str = "auto",
    ) -> None:
        if kernel not in ("auto", "gibbs", "metropolis"):
            raise SpecError(
                f"conditioning kernel must be auto, gibbs or metropolis, not {kernel!r}"
            )
        if not measurements:
            raise SpecError("conditioning needs at least one noisy measurement")
        measurements = at_level_indices(hierarchy.names, measurements)
        invariants = at_level_indices(hierarchy.names, invariants)
        self.hierarchy, self.n_cells = hierarchy, int(n_cells)
        self.measurements, self.invariants = tuple(measurements), tuple(invariants)
        self.nonnegative = bool(nonnegative)
        integer = {bool(m.law.is_integer) for m in measurements}
        if len(integer) > 1:
            raise SpecError(
                "conditioning: measurements mix integer and continuous noise laws; use one kind"
            )
        self.integer = integer.pop()
        self.layout = TreeLayout.build(
            hierarchy, n_cells, [(m.level, m.query.matrix) for m in measurements]
        )
        laws: list[NoiseLaw] = []
        law_index = np.full(self.layout.dim, -1, dtype=np.int64)
        for m, meas in enumerate(measurements):
            laws.append(meas.law)
            law_index[self.layout.offsets[m] : self.layout.offsets[m + 1]] = m
        self.target = ProductTarget(laws, law_index)
        deepest = max(m.level for m in measurements)
        if step_scale is None:
            step_scale = min(m.law.std for m in measurements if m.level == deepest)
        self.step_scale = float(step_scale)
        step = (
            DoubleGeometricStep.from_scale(self.step_scale)
            if self.integer
            else GaussianStep(self.step_scale)
        )
        self.z0 = self._start() if start is None else self._check_start(np.asarray(start))
        lower = None
        if nonnegative:
            lower = np.full(self.layout.dim, -np.inf)
            lower[self.layout.w_offset :] = -self.z0.reshape(-1)
            if np.any(self.z0 < 0):
                raise SpecError(
                    "non-negative conditioning needs a non-negative start; pass start= a "
                    "non-negative consistent leaf table that satisfies the invariants"
                )
        inv = [(v.level, v.query.matrix) for v in invariants]
        rates = self.target.l1_rates()
        precisions = self.target.l2_precisions() if rates is None else None
        exact_lines = rates is not None or precisions is not None
        if kernel == "gibbs" and not exact_lines:
            raise SpecError(
                "conditioning kernel 'gibbs' needs Laplace-type or Gaussian-type noise laws at "
                "every measured level (one family); use kernel='metropolis'"
            )
        self.kernel = "gibbs" if exact_lines and kernel != "metropolis" else "metropolis"
        self._wide_moves: GibbsTreeMoves | None = None
        if self.kernel == "gibbs":
            draws = LineDraws(rates, precisions=precisions, integer=self.integer, lower=lower)
            self.moves = GibbsTreeMoves(self.layout, inv, draws)
            # exact draws of the same moves under 3× wider laws: the over-dispersed π₀
            # (ℓ₁ rates / 3, or ℓ₂ precisions / 9: σ × 3 either way)
            wide = LineDraws(
                None if rates is None else rates / 3.0,
                precisions=None if precisions is None else precisions / 9.0,
                integer=self.integer,
                lower=lower,
            )
            self._wide_moves = GibbsTreeMoves(self.layout, inv, wide)
        else:
            self.moves = TreeMoves(self.layout, inv, step)
        self.engine = MetropolisHastings(self.target, self.moves, lower=lower)

    # ------------------------------------------------------------------ start
    def _invariant_ok(self, leaf: np.ndarray) -> bool:
        levels = self.hierarchy.aggregate(leaf)
        return all(
            np.array_equal(inv.query.apply(levels[inv.level]), inv.values)
            if self.integer
            else np.allclose(inv.query.apply(levels[inv.level]), inv.values, rtol=1e-12, atol=1e-9)
            for inv in self.invariants
        )

    def _check_start(self, leaf: np.ndarray) -> np.ndarray:
        leaf = leaf.astype(np.int64 if self.integer else np.float64)
        if leaf.shape != (self.hierarchy.leaves.size, self.n_cells) or not self._invariant_ok(leaf):
            raise SpecError(
                "conditioning start: the leaf table must be (n_leaves, n_cells) and satisfy "
                "every invariant exactly"
            )
        return leaf

    def _start(self) -> np.ndarray:
        """A consistent table satisfying the invariants, built from the measurements only.

        Start from the finest detailed measurement (clipped at 0 when non-negative), then
        for each invariant, deepest level first, put each node's deficit on one leaf cell of
        the group that no deeper invariant involves.
        """
        h, C = self.hierarchy, self.n_cells
        last = h.depth - 1
        leaf = np.zeros((h.leaves.size, C))
        for m in self.measurements:
            if m.level == last and m.query.is_identity:
                leaf = np.asarray(m.values, dtype=np.float64).copy()
        leaf = np.maximum(leaf, 0.0) if self.nonnegative else leaf
        if self.integer:
            leaf = np.round(leaf)
        used = np.zeros(C, dtype=bool)
        for inv in sorted(self.invariants, key=lambda v: -v.level):
            q = np.asarray(inv.query.matrix)
            if not np.all((q == 0) | (q == 1)) or np.any(q.sum(axis=0) > 1):
                raise SpecError(
                    f"conditioning: cannot build a start for the invariant query "
                    f"{inv.query.name!r} at level {h.names[inv.level]!r} (not a partition "
                    "marginal); pass start= a consistent leaf table"
                )
            k = inv.level
            anc = h.ancestor_index(last, k)
            first_leaf = np.searchsorted(anc, np.arange(h.levels[k].size))
            for r in range(q.shape[0]):  # query rows, not nodes
                free = np.flatnonzero((q[r] == 1) & ~used)
                current = h.aggregate(leaf)[k] @ q[r]
                deficit = np.asarray(inv.values)[:, r] - current
                if free.size == 0:
                    if np.any(np.abs(deficit) > 1e-9):
                        raise SpecError(
                            f"conditioning: invariants at level {h.names[k]!r} conflict with "
                            "deeper invariants; pass start= a consistent leaf table"
                        )
                    continue
                c = free[0]
                if self.nonnegative:
                    target_leaf = _largest_leaf(leaf[:, c], anc, h.levels[k].size)
                else:
                    target_leaf = first_leaf
                np.add.at(leaf[:, c], target_leaf, deficit)
            used |= (q == 1).any(axis=0)
        if self.integer:
            leaf = np.round(leaf).astype(np.int64)
        if not self._invariant_ok(leaf):
            raise SpecError(
                "conditioning: could not build a start satisfying the invariants; pass start="
            )
        return leaf

    # ------------------------------------------------------------------ states
    @property
    def default_spread(self) -> int:
        """Scrambling moves for the over-dispersed π₀ of :func:`condition`: 10 sweeps per
        (level, cell) for Gibbs moves, two pair moves per leaf cell for Metropolis moves."""
        h = self.hierarchy
        if self.kernel == "gibbs":
            return 10 * h.depth * self.n_cells
        return 2 * h.leaves.size * self.n_cells

    def initial_states(self, n: int, gen: np.random.Generator, *, spread: int = 0) -> np.ndarray:
        """``n`` states at the start table, each scrambled by ``spread`` random moves: an
        over-dispersed initial law π₀.

        Gibbs kernel: ``spread`` exact Gibbs moves of the target with every ℓ₁ rate divided
        by 3, or every ℓ₂ precision divided by 9 (3× wider noise laws; bounds respected).
        Metropolis kernel: ``spread`` pair moves with a 3× step, each kept when it respects
        the bounds. (Scaling an exact
        Gibbs step by 3 instead would overshoot the conditional's centre and double the
        distance to it at every move.)
        """
        lay, z0 = self.layout, self.z0
        levels = self.hierarchy.aggregate(z0)
        noise = [np.asarray(m.values) - m.query.apply(levels[m.level]) for m in self.measurements]
        s0 = lay.pack(noise, np.zeros_like(z0))
        states = np.tile(s0, (n, 1)).astype(np.int64 if self.integer else np.float64)
        if self._wide_moves is not None:
            for _ in range(spread):
                states = self._wide_moves.propose(states, gen).apply(states)
            return states
        lower = self.engine.lower
        for _ in range(spread):
            prop = self.moves.propose(states, gen)
            prop = Proposal(prop.idx, prop.delta * 3)
            new = prop.apply(states)
            ok = np.ones(n, dtype=bool) if lower is None else np.all(new >= lower, axis=1)
            states[ok] = new[ok]
        return states

    def tables(self, states: np.ndarray) -> np.ndarray:
        """Leaf tables z = z₀ + w of a batch of states, (n_chains, n_leaves, n_cells)."""
        return self.z0[None] + self.layout.leaf_offsets(states)


def _largest_leaf(values: np.ndarray, anc: np.ndarray, n_nodes: int) -> np.ndarray:
    """Per node, the index of its leaf with the largest value."""
    order = np.lexsort((values, anc))
    last = np.searchsorted(anc[order], np.arange(n_nodes), side="right") - 1
    return order[last]


def _gaussian_release(hierarchy, cells, measurements, invariants, privacy, rng, n_draws) -> Release:
    from censusdp.estimation.gls.tree import tree_gls  # the GLS engineer's module

    if n_draws > 1:
        rel = tree_gls(hierarchy, cells, measurements, invariants, privacy)
        return rel.replace(
            estimator="conditioning",
            diagnostics=dict(rel.diagnostics, conditioning="exact: posterior mean = GLS"),
        )
    gen = rng.generator("conditioning/gaussian-draw")
    perturbed = [
        Measurement(
            m.level,
            m.query,
            m.values + m.law.sample(gen, m.values.size).reshape(m.values.shape),
            m.law,
            level_name=m.level_name,
        )
        for m in measurements
    ]
    rel = tree_gls(hierarchy, cells, perturbed, invariants, privacy)
    return rel.replace(
        estimator="conditioning",
        variances=None if rel.variances is None else [2.0 * v for v in rel.variances],
        covariances=None if rel.covariances is None else [2.0 * c for c in rel.covariances],
        diagnostics=dict(
            rel.diagnostics, conditioning="exact: one posterior draw = GLS(y + fresh noise)"
        ),
    )


@dataclass(frozen=True, eq=False)
class ChainOptions:
    """The chains' certificate and moves (:func:`certified_draws`).

    Attributes
    ----------
    tv_bound : float
        Required L-lag coupling bound on d_TV(π_T, π) at the burn-in T used.
    lag : int, optional
        L; default: the median meeting time of a 1-lag pilot (so the bound is informative).
    max_iterations : int
        Cap on coupled iterations and on the burn-in.
    n_coupled_pairs : int
        Independent coupled pairs for the meeting times (≥ 100 recommended).
    n_rhat_chains : int
        At least this many over-dispersed chains are run, for split-R̂ (≥ 4);
        :func:`~censusdp.estimation.conditioning.mechanism.conditioned_noise` runs one per
        table.
    kernel : {"auto", "gibbs", "metropolis"}
        MCMC moves (see :class:`ConditioningProblem`).
    """

    tv_bound: float = 0.01
    lag: int | None = None
    max_iterations: int = 200_000
    n_coupled_pairs: int = 200
    n_rhat_chains: int = 4
    kernel: str = "auto"


@dataclass(frozen=True, eq=False)
class ConditioningOptions(ChainOptions):
    """How :func:`condition` samples and certifies its draws: the fields of
    :class:`ChainOptions` and these.

    Attributes
    ----------
    n_draws : int
        1: release one draw; > 1: release the average of that many independent draws.
    nonnegative : bool
        Condition also on released leaf cells ≥ 0 (flagged data-dependent in the statement).
    step_scale : float, optional
        δ scale; default the finest measured level's noise standard deviation.
    start : numpy.ndarray, optional
        Consistent leaf table satisfying the invariants to start the chains from.
    """

    n_draws: int = 1
    nonnegative: bool = False
    step_scale: float | None = None
    start: np.ndarray | None = None


def condition(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement | None,
    rng: KeyedRNG,
    options: ConditioningOptions | None = None,
    **legacy: Any,
) -> Release:
    """Release a table drawn from the noise law conditioned on consistency and invariants.

    Parameters
    ----------
    hierarchy, cells, measurements, invariants, privacy
        As for every estimator (see :mod:`censusdp.estimation`); ``privacy`` None derives
        the statement from the measurements, and a statement that claims less than they
        spend is refused (BudgetError).
    rng : KeyedRNG
        Source of all sampling randomness (streams ``conditioning/...``).
    options : ConditioningOptions, optional
        The certificate's bound, lag and budgets, the number of draws, non-negativity and
        the chains' start, step and kernel (:class:`ConditioningOptions`; defaults when
        omitted).
    **legacy
        The fields of :class:`ConditioningOptions` as keyword arguments, as before it
        existed (applied over ``options``; accepted for one release).

    Returns
    -------
    Release
        ``estimator="conditioning"``; ``diagnostics`` holds ``tv_bound``, ``lag``,
        ``burn_in``, ``iterations``, ``rhat``, ``meeting_times`` quantiles, ``mcse``.

    Raises
    ------
    ConvergenceError
        When coupled pairs do not meet within ``max_iterations`` or the requested bound is
        not reached: the message names the bound reached; raise ``max_iterations``.
    TypeError
        A keyword that is no field of :class:`ConditioningOptions`.
    """
    o = with_keywords(ConditioningOptions, options, legacy, "condition")
    n_draws = o.n_draws
    if n_draws < 1:
        raise SpecError("n_draws must be at least 1")
    measurements = at_level_indices(hierarchy.names, measurements)
    invariants = at_level_indices(hierarchy.names, invariants)
    privacy = checked_statement(hierarchy.names, measurements, invariants, privacy)
    if not o.nonnegative and all(gaussian_conditionable(m.law) for m in measurements):
        return _gaussian_release(hierarchy, cells, measurements, invariants, privacy, rng, n_draws)
    prob = ConditioningProblem(
        hierarchy,
        len(cells),
        measurements,
        invariants,
        nonnegative=o.nonnegative,
        step_scale=o.step_scale,
        start=o.start,
        kernel=o.kernel,
    )
    draws = certified_draws(prob, rng, o, n_chains=max(n_draws, o.n_rhat_chains))
    estimates, variances, integer, mcse = _released_draws(hierarchy, prob, draws, n_draws)
    notes = [
        draws.certificate_note(),
        "the sampler uses only the noisy measurements and public laws (post-processing)",
    ]
    if n_draws > 1:
        notes.append(f"released value: the average of {n_draws} independent draws")
    if o.nonnegative:
        notes.append(
            "non-negativity imposed on the released table; flagged data-dependent because in "
            "the conditioned-mechanism view the indicator 𝕀(x + e ≥ 0) involves the data"
        )
    statement = with_invariants(privacy, invariant_labels(hierarchy.names, invariants))
    statement = statement.with_notes(*notes, data_dependent=True if o.nonnegative else None)
    diagnostics = {**draws.diagnostics, "n_draws": int(n_draws), "mcse_leaf": mcse}
    return Release(
        estimator="conditioning",
        hierarchy=hierarchy,
        cells=tuple(cells),
        estimates=estimates,
        variances=variances,
        privacy=statement,
        integer=integer,
        diagnostics=diagnostics,
    )


def _released_draws(
    hierarchy: Hierarchy, prob: ConditioningProblem, draws: CertifiedDraws, n_draws: int
) -> tuple[list[np.ndarray], list[np.ndarray], bool, np.ndarray | None]:
    """The released table from certified ``draws``: one draw (its variance twice the
    chains' posterior variance, truth to release) or the mean of ``n_draws`` (posterior
    variance × (1 + 1/n), and the Monte Carlo standard error per leaf); per level its
    estimates, variances, whether they are integers, and the leaf MCSE (None for one)."""
    finals, tail = draws.finals, draws.tail
    leaf_post_var = tail.astype(np.float64).var(axis=(0, 1)).reshape(finals.shape[1:])
    if n_draws == 1:
        leaf = finals[0]
        leaf_var = 2.0 * leaf_post_var
        mcse = None
    else:
        leaf = finals[:n_draws].mean(axis=0)
        leaf_var = leaf_post_var * (1.0 + 1.0 / n_draws)
        mcse = finals[:n_draws].astype(np.float64).std(axis=0, ddof=1) / np.sqrt(n_draws)
    estimates = hierarchy.aggregate(leaf)
    integer = prob.integer and n_draws == 1
    if integer:
        estimates = [np.asarray(e, dtype=np.int64) for e in estimates]
    else:
        estimates = [np.asarray(e, dtype=np.float64) for e in estimates]
    return estimates, chain_level_variances(hierarchy, leaf_var, tail), integer, mcse


@dataclass(frozen=True)
class CertifiedDraws:
    """Chains of a :class:`ConditioningProblem` run past a certified burn-in.

    Attributes
    ----------
    finals : numpy.ndarray
        (n_chains, n_leaves, n_cells): each chain's table at an iteration ≥ the burn-in T,
        the chains independent and started from the over-dispersed initial law.
    tail : numpy.ndarray
        Thinned states of the chains after T (draws, chains, free coordinates), for Monte
        Carlo variances.
    diagnostics : dict
        ``tv_bound`` (the L-lag coupling bound at T), ``tv_bound_requested``, ``lag``,
        ``burn_in``, ``iterations``, ``rhat_max``, ``n_chains``, ``n_coupled_pairs``,
        ``meeting_time_quantiles``, ``acceptance_rate``, ``step_scale``, ``kernel``,
        ``mcse_batch_means``.
    """

    finals: np.ndarray
    tail: np.ndarray
    diagnostics: dict

    def certificate_note(self) -> str:
        """The certificate in words, for a privacy statement's notes."""
        d = self.diagnostics
        return (
            f"MCMC ({d['kernel']} moves over the noise): burn-in {d['burn_in']} iterations, "
            f"L-lag coupling TV bound {d['tv_bound']:.3g} (L = {d['lag']}, "
            f"{d['n_coupled_pairs']} pairs), split-R̂ max {d['rhat_max']:.3f} over "
            f"{d['n_chains']} chains"
        )


def certified_draws(
    prob: ConditioningProblem, rng: KeyedRNG, options: ChainOptions, *, n_chains: int
) -> CertifiedDraws:
    """Run ``n_chains`` chains of ``prob`` past the first iteration T whose L-lag coupling
    bound on d_TV(π_T, π) is below ``options.tv_bound`` (Biswas, Jacob & Vanetti 2019, Thm. 2.5).

    ``options.lag=None`` takes L from a 1-lag pilot (the median meeting time of 50 pairs). Coupled
    pairs start from the same over-dispersed initial law as the chains; all randomness comes
    from ``rng``'s stream ``conditioning/mcmc``.

    Raises
    ------
    ConvergenceError
        Pairs that do not meet within ``max_iterations``, or a bound still above
        ``tv_bound`` there (the message names the bound reached).
    """
    tv_bound, lag, max_iterations = options.tv_bound, options.lag, options.max_iterations
    n_coupled_pairs = options.n_coupled_pairs
    eng = prob.engine
    gen = rng.generator("conditioning/mcmc")
    spread = prob.default_spread

    def pi0(n: int) -> np.ndarray:
        return prob.initial_states(n, gen, spread=spread)

    if lag is None:
        pilot = meeting_times(eng, pi0(50), pi0(50), 1, gen, max_iterations=max_iterations)
        if not pilot.all_met:
            raise ConvergenceError(
                f"conditioning: 1-lag pilot chains did not meet within max_iterations="
                f"{max_iterations}; raise max_iterations"
            )
        lag = max(1, int(np.median(pilot.meeting_times)))
    coupling = meeting_times(
        eng, pi0(n_coupled_pairs), pi0(n_coupled_pairs), lag, gen, max_iterations=max_iterations
    )
    if not coupling.all_met:
        n_left = int(np.sum(~np.isfinite(coupling.meeting_times)))
        raise ConvergenceError(
            f"conditioning: {n_left} of {n_coupled_pairs} coupled pairs had not met after "
            f"max_iterations={max_iterations} (lag {lag}), so no TV bound holds; raise "
            "max_iterations"
        )
    burn_in = iterations_for_tv(coupling.meeting_times, lag, tv_bound)
    if burn_in is None or burn_in > max_iterations:
        reached = coupling.tv_bound(max_iterations)
        raise ConvergenceError(
            f"conditioning: TV bound {reached:.3g} at max_iterations={max_iterations} "
            f"is above the requested {tv_bound}; raise max_iterations"
        )
    bound = float(coupling.tv_bound(burn_in))

    cs = eng.init(pi0(n_chains))
    sample_every = max(1, burn_in // 50)
    trace = eng.run(cs, burn_in, gen, thin=sample_every, keep=slice(prob.layout.w_offset, None))
    post = max(burn_in, 100)
    tail = eng.run(cs, post, gen, thin=max(1, post // 100), keep=slice(prob.layout.w_offset, None))
    draws_all = np.concatenate([trace, tail]).astype(np.float64)
    rhat = split_rhat(draws_all[:, :, _rhat_columns(draws_all.shape[2])])
    diagnostics = {
        "tv_bound": bound,
        "tv_bound_requested": tv_bound,
        "lag": int(lag),
        "burn_in": int(burn_in),
        "iterations": int(burn_in + post),
        "rhat_max": float(np.nanmax(rhat)),
        "n_chains": int(n_chains),
        "n_coupled_pairs": int(n_coupled_pairs),
        "meeting_time_quantiles": np.quantile(coupling.meeting_times, [0.5, 0.9, 1.0]).tolist(),
        "acceptance_rate": float(cs.acceptance_rate.mean()),
        "step_scale": prob.step_scale,
        "kernel": prob.kernel,
        "mcse_batch_means": float(np.max(batch_means_se(tail.astype(np.float64)))),
    }
    return CertifiedDraws(prob.tables(cs.states), tail, diagnostics)


def certificate(release: Release) -> dict:
    """The convergence record of a :func:`condition` release, as plain JSON values: kernel,
    TV bound at the burn-in, lag L, burn-in T, iterations run, split-R̂ and the meeting-time
    quantiles (50%, 90%, max) of the coupled pairs."""
    d = release.diagnostics
    return {
        "kernel": d["kernel"],
        "tv_bound": float(d["tv_bound"]),
        "lag": int(d["lag"]),
        "burn_in": int(d["burn_in"]),
        "iterations": int(d["iterations"]),
        "rhat_max": float(d["rhat_max"]),
        "meeting_time_quantiles": [float(q) for q in d["meeting_time_quantiles"]],
    }


def _rhat_columns(d: int, cap: int = 200) -> np.ndarray:
    """At most ``cap`` evenly spread state coordinates for R̂."""
    return np.unique(np.linspace(0, d - 1, min(d, cap)).astype(np.int64))


def chain_level_variances(
    hierarchy: Hierarchy, leaf_var: np.ndarray, tail: np.ndarray
) -> list[np.ndarray]:
    """Per level, the variance of every node's estimate, from the chains' aggregated draws
    (scaled like the leaf variances: ×2 for one draw, ×(1 + 1/n) for an average)."""
    post = tail.astype(np.float64).var(axis=(0, 1)).reshape(leaf_var.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        factor = np.nanmean(np.where(post > 0, leaf_var / post, np.nan))
    factor = 1.0 if not np.isfinite(factor) else float(factor)
    flat = tail.reshape(-1, *leaf_var.shape).astype(np.float64)
    levels = hierarchy.aggregate(np.moveaxis(flat, 0, -1))  # (nodes, cells, draws)
    return [factor * lv.var(axis=-1) for lv in levels]
