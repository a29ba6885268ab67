"""Release policy of the integer lattice mechanisms: sample, certify convergence, release.

The generalized Laplace and Gaussian laws on the lattice of invariant-preserving integer
noise (:mod:`censusdp.mechanisms.lattice`) are sampled with the shared Metropolis–Hastings
engine (:mod:`censusdp.estimation.conditioning.mcmc`) over the noise vector only, never over the data, so
nothing about the chain depends on confidential values. A lattice mechanism releases only
when, for the requested TV level ``η`` (default 0.01),

1. the L-lag coupling upper bound on ``d_TV(π_T, π)`` from ≥ 200 independent coupled pairs
   (:func:`censusdp.estimation.conditioning.diagnostics.meeting_times`) is below ``η`` at the iteration
   ``T`` used, and
2. the split-R̂ of every cell over ≥ 4 over-dispersed chains is below 1.01;

both numbers go into the result and its privacy statement. Otherwise it raises
:class:`~censusdp.errors.ConvergenceError` naming the bound reached and the fix.

Each released noise vector is the state at iteration ``T`` of its own chain started at
``π₀ = δ₀`` (the zero vector), so released draws are independent and each has marginal law
``π_T`` with ``d_TV(π_T, π) ≤ η`` (as estimated). Then for databases ``x ~ x'`` sharing the
invariants and any event ``S``: ``P(x + Z_T ∈ S) ≤ e^{ε d} P(x' + Z_T ∈ S) + (1 + e^{ε d}) η``
— the paper's remark that MCMC error is an additive δ; it is a Monte Carlo estimate, not a
proof, and the statement says so.

Moves (``mode``): ``"gibbs"``, the default for the separable ℓ₁ generalized Laplace, draws
each step exactly from the target's conditional along the move direction
(:mod:`censusdp.estimation.conditioning.gibbs_moves`): random-scan Gibbs along the Smith-form basis
directions, or, for group-sum lattices (state totals over counties), a sweep over a random
matching of the cells of every group. Coupled chains maximally couple these exact
conditionals and meet within a few hundred sweeps even for Illinois' 102 counties, where the
random-walk moves below never met. ``"single"`` and ``"all"`` are the paper's Metropolis
moves with a double-geometric step (Eq. 11): the engine's :class:`BasisMoves` (``"single"``
a random-scan version of the Gibbs sweep, ``"all"`` the simultaneous update
``e* = e + B u``), or for group-sum lattices :class:`GroupPairMoves`, a plug-in move set
defined here: ``+u`` on one cell and ``−u`` on another of the same group. They serve every
law (the ℓ₂ Laplace and the Gaussian are not separable).

Tuning rule for the proposal parameter ``a`` (:func:`tune_scale`): start at
``a = exp(−ε)`` (generalized Laplace) or ``a = exp(−1/σ)`` (Gaussian) and rescale the step
``s = −1/log a`` from short pilot runs of the noise chain (data-independent) until the
acceptance rate lies in [0.2, 0.5], aiming at 0.35.

References
----------
Dharangutte, Gao, Gong & Yu, "Integer Subspace Differential Privacy", AAAI 2023, §4
(MCMC, L-lag coupling, the TV/δ trade-off), Algorithms 1–3, Appendix D and E.4 (four
over-dispersed chains, R̂).
Biswas, Jacob & Vanetti (2019), "Estimating convergence of Markov chains with L-lag
couplings", NeurIPS, Theorem 2.5.
Gelman & Rubin (1992), the potential scale reduction factor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import ConvergenceError
from censusdp.estimation.conditioning.diagnostics import (
    iterations_for_tv,
    meeting_times,
    split_rhat,
    tv_upper_bound,
)
from censusdp.estimation.conditioning.gibbs_moves import GibbsBasisMoves, GibbsGroupMoves, LineDraws
from censusdp.estimation.conditioning.mcmc import (
    BasisMoves,
    DoubleGeometricStep,
    MetropolisHastings,
    MoveSet,
    Proposal,
    Target,
    maximal_coupling,
)
from censusdp.mechanisms.lattice import (
    GroupSumLattice,
    IntegerLattice,
    LatticeGaussian,
    LatticeLaplace,
    LatticeTarget,
)
from censusdp.options import with_keywords
from censusdp.rng import KeyedRNG

__all__ = [
    "LatticeNoiseTarget",
    "GroupPairMoves",
    "lattice_engine",
    "tune_scale",
    "ConvergenceReport",
    "LatticeRelease",
    "CertifyOptions",
    "certify",
    "release_lattice_noise",
]

Lattice = IntegerLattice | GroupSumLattice


# ----------------------------------------------------------------------------------------
# plug-ins for the shared engine
# ----------------------------------------------------------------------------------------
class LatticeNoiseTarget(Target):
    """A lattice noise law as an engine :class:`~censusdp.estimation.conditioning.mcmc.Target`.

    Parameters
    ----------
    law : LatticeTarget
        :class:`LatticeLaplace` or :class:`LatticeGaussian`.
    box : int, optional
        Truncate to ``|z_c| ≤ box`` for every cell (log-density −inf outside): a finite
        state space for exact-enumeration checks. None (default) for the real mechanism.
    """

    def __init__(self, law: LatticeTarget, *, box: int | None = None) -> None:
        self.law = law
        self.box = None if box is None else int(box)

    def _cells(self, z: np.ndarray) -> np.ndarray:
        out = self.law.cell_log_target(z)
        if self.box is not None:
            out = np.where(np.abs(z) > self.box, -np.inf, out)
        return out

    def log_density(self, states: np.ndarray) -> np.ndarray:
        lp = self.law.log_target(states)
        if self.box is not None:
            lp = np.where(np.any(np.abs(states) > self.box, axis=1), -np.inf, lp)
        return lp

    def log_density_change(
        self, states: np.ndarray, idx: np.ndarray, delta: np.ndarray
    ) -> np.ndarray:
        if not self.law.separable:
            return super().log_density_change(states, idx, delta)
        live = delta != 0
        rows = np.broadcast_to(np.arange(states.shape[0])[:, None], idx.shape)[live]
        cols = idx[live]
        old = states[rows, cols]
        diff = self._cells(old + delta[live]) - self._cells(old)
        out = np.zeros(states.shape[0], dtype=np.float64)
        np.add.at(out, rows, diff)
        return out


class GroupPairMoves(MoveSet):
    """Tree pair moves for group-sum invariants: ``z* = z + u (e_i − e_j)``.

    Cell ``i`` is uniform over all cells that have a partner; ``j ≠ i`` is uniform in
    ``i``'s group (state); ``u`` is double geometric. The pair choice does not depend on
    the state and ``u`` is symmetric, so the proposal is symmetric; every move keeps every
    group total. Coupled: the same pair, ``u`` maximally coupled on cell ``i``
    (:func:`~censusdp.estimation.conditioning.mcmc.maximal_coupling`), so an accepted coupled move
    equalises ``z_i`` of the two chains.

    Parameters
    ----------
    lattice : GroupSumLattice
    step : DoubleGeometricStep
    """

    integer = True

    def __init__(self, lattice: GroupSumLattice, step: DoubleGeometricStep) -> None:
        self.lattice, self.step = lattice, step
        sizes = lattice.sizes
        order = np.argsort(lattice.groups, kind="stable")
        start = np.zeros(lattice.n_groups, dtype=np.int64)
        np.cumsum(sizes[:-1], out=start[1:])
        self._order = order
        self._start = start[lattice.groups]  # per cell: its group's first sorted position
        self._size = sizes[lattice.groups]
        self._pos = np.empty(lattice.dim, dtype=np.int64)
        self._pos[order] = np.arange(lattice.dim) - start[lattice.groups[order]]
        self._movable = np.flatnonzero(self._size >= 2)

    def _pairs(self, gen: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        m = self._movable.size
        i = self._movable[np.minimum((gen.random(n) * m).astype(np.int64), m - 1)]
        size = self._size[i]
        k = np.minimum((gen.random(n) * (size - 1)).astype(np.int64), size - 2)
        local = (self._pos[i] + 1 + k) % size
        return i, self._order[self._start[i] + local]

    @staticmethod
    def _proposal(i: np.ndarray, j: np.ndarray, u: np.ndarray) -> Proposal:
        u = np.asarray(u, dtype=np.int64)
        return Proposal(np.stack([i, j], axis=1), np.stack([u, -u], axis=1))

    def propose(self, states, gen):
        i, j = self._pairs(gen, states.shape[0])
        return self._proposal(i, j, self.step.sample(gen, i.shape[0]))

    def propose_coupled(self, x, y, gen):
        i, j = self._pairs(gen, x.shape[0])
        rows = np.arange(x.shape[0])
        dx, dy, _ = maximal_coupling(self.step, x[rows, i] - y[rows, i], gen)
        return self._proposal(i, j, dx), self._proposal(i, j, dy)


def default_mode(law: LatticeTarget) -> str:
    """``"gibbs"`` for the separable ℓ₁ generalized Laplace, else ``"single"``."""
    return "gibbs" if isinstance(law, LatticeLaplace) and law.separable else "single"


def steps_per_sweep(lattice: Lattice, mode: str) -> int:
    """Engine steps that make one sweep: 1 for a group matching sweep, else the rank."""
    if mode == "gibbs" and isinstance(lattice, GroupSumLattice):
        return 1
    return lattice.n_directions


def lattice_engine(
    lattice: Lattice,
    law: LatticeTarget,
    a: float,
    *,
    mode: str = "single",
    box: int | None = None,
) -> MetropolisHastings:
    """The shared MH engine set up for a lattice noise law.

    Parameters
    ----------
    lattice : IntegerLattice or GroupSumLattice
    law : LatticeTarget
    a : float
        Double-geometric proposal parameter in (0, 1) (ignored by ``mode="gibbs"``).
    mode : {"gibbs", "single", "all"}
        ``"gibbs"``: exact conditional draws (separable ℓ₁ law only): group matching sweeps
        or random-scan basis directions. For SNF lattices with Metropolis moves: one random
        basis direction per step (``"single"``) or all directions at once
        (``"all"``, ``e* = e + B u``); group-sum lattices use :class:`GroupPairMoves` for
        both.
    box : int, optional
        Truncation (exact-enumeration checks only), see :class:`LatticeNoiseTarget`.
    """
    target = LatticeNoiseTarget(law, box=box)
    if mode == "gibbs":
        if default_mode(law) != "gibbs":
            raise ValueError(
                f"mode='gibbs' needs the separable l1 generalized Laplace, not {law!r}; "
                "use mode='single'"
            )
        bound = None if box is None else np.full(lattice.dim, float(box))
        draws = LineDraws(
            np.full(lattice.dim, law.epsilon),
            integer=True,
            lower=None if bound is None else -bound,
            upper=bound,
        )
        if isinstance(lattice, GroupSumLattice):
            moves: MoveSet = GibbsGroupMoves(lattice.groups, draws)
        else:
            moves = GibbsBasisMoves(lattice.basis, draws)
        return MetropolisHastings(target, moves)
    if not 0.0 < a < 1.0:  # NaN included: a "gibbs" certificate records a = NaN
        raise ValueError(
            f"Metropolis moves (mode={mode!r}) need a proposal parameter a in (0, 1), got "
            f"{a}; to rebuild the engine of a certificate pass mode=report.mode"
        )
    step = DoubleGeometricStep(a)
    if isinstance(lattice, GroupSumLattice):
        moves = GroupPairMoves(lattice, step)
    else:
        moves = BasisMoves(lattice.basis, step, mode=mode)
    return MetropolisHastings(target, moves)


def _initial_a(law: LatticeTarget) -> float:
    if isinstance(law, LatticeLaplace):
        return math.exp(-law.epsilon)
    if isinstance(law, LatticeGaussian):
        return math.exp(-1.0 / law.sigma)
    return 0.5


def tune_scale(
    lattice: Lattice,
    law: LatticeTarget,
    gen: np.random.Generator,
    *,
    mode: str = "single",
    band: tuple[float, float] = (0.2, 0.5),
    n_chains: int = 32,
    pilot_sweeps: int = 20,
    max_rounds: int = 12,
) -> tuple[float, float]:
    """Choose the double-geometric parameter ``a`` from pilot runs (the documented rule).

    Start at ``a₀ = exp(−ε)`` (Laplace) or ``exp(−1/σ)`` (Gaussian); with step scale
    ``s = −1/log a``, run ``n_chains`` pilot chains from 0 for ``pilot_sweeps`` sweeps and
    measure the acceptance rate over the second half; multiply ``s`` by
    ``exp(2(rate − 0.35))``-style bisection (doubling/halving, then bisection in ``log s``)
    until the rate is inside ``band``. Only the noise law is involved: tuning reveals nothing
    about the data.

    Returns
    -------
    (float, float)
        ``a`` and the pilot acceptance rate at ``a``.
    """
    k = lattice.n_directions
    steps = max(pilot_sweeps * k, 40)
    lo_s, hi_s = 0.0, math.inf
    s = -1.0 / math.log(_initial_a(law))
    rate = 0.0
    for _ in range(max_rounds):
        a = math.exp(-1.0 / s)
        eng = lattice_engine(lattice, law, a, mode=mode)
        cs = eng.init(np.zeros((n_chains, lattice.dim), dtype=np.int64))
        for _ in range(steps // 2):
            eng.step(cs, gen)
        before = cs.accepted.sum()
        for _ in range(steps - steps // 2):
            eng.step(cs, gen)
        rate = float(cs.accepted.sum() - before) / (n_chains * (steps - steps // 2))
        if band[0] <= rate <= band[1]:
            return a, rate
        if rate > band[1]:  # too timid: larger steps
            lo_s = s
            s = 2.0 * s if math.isinf(hi_s) else math.sqrt(s * hi_s)
        else:
            hi_s = s
            s = s / 2.0 if lo_s == 0.0 else math.sqrt(s * lo_s)
        s = min(max(s, 1e-2), 1e6)
    return math.exp(-1.0 / s), rate


# ----------------------------------------------------------------------------------------
# convergence certificate and release
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvergenceReport:
    """The convergence facts a lattice release records.

    Attributes
    ----------
    iterations : int
        ``T``: engine steps each released chain ran (one step = one move per chain: one
        direction, or one matching sweep of a group-sum lattice in ``"gibbs"`` mode).
    sweeps : float
        ``T / k`` (``k`` = steps per sweep, :func:`steps_per_sweep`): comparable to the
        paper's Gibbs-sweep iterations.
    tv_requested, tv_bound : float
        Requested level and the L-lag coupling bound at ``T``.
    lag : int
    n_coupled : int
        Coupled pairs behind the bound.
    meeting_times : numpy.ndarray
        τ per pair (engine steps).
    rhat_max : float
        Largest split-R̂ over cells, from ``rhat_chains`` over-dispersed chains.
    rhat_chains, rhat_iterations : int
    a : float
        Proposal parameter (NaN in ``"gibbs"`` mode); ``acceptance``: its pilot acceptance
        rate (1 for Gibbs moves).
    mode : str
        The moves (:func:`lattice_engine`).
    """

    iterations: int
    sweeps: float
    tv_requested: float
    tv_bound: float
    lag: int
    n_coupled: int
    meeting_times: np.ndarray
    rhat_max: float
    rhat_chains: int
    rhat_iterations: int
    a: float
    acceptance: float
    mode: str

    def tv_curve(self, t: np.ndarray) -> np.ndarray:
        """The coupling bound at engine steps ``t``."""
        return tv_upper_bound(self.meeting_times, self.lag, t)

    def to_dict(self) -> dict:
        """Every field but the meeting times (``a`` and ``acceptance`` as ``proposal_a`` and
        ``pilot_acceptance``), in field order: the release's diagnostics."""
        names = {"a": "proposal_a", "acceptance": "pilot_acceptance"}
        return {
            names.get(f.name, f.name): getattr(self, f.name)
            for f in fields(self)
            if f.name != "meeting_times"
        }


@dataclass(eq=False)
class LatticeRelease:
    """Integer noise (and released table) of a lattice mechanism with its certificate.

    Attributes
    ----------
    noise : numpy.ndarray
        int64 (n_draws, d): independent noise vectors, each on the lattice.
    released : numpy.ndarray or None
        ``data + noise`` when data was given.
    convergence : ConvergenceReport
    privacy : PrivacyStatement
    """

    noise: np.ndarray
    released: np.ndarray | None
    convergence: ConvergenceReport
    privacy: PrivacyStatement
    diagnostics: dict = field(default_factory=dict)


def _overdispersed_starts(
    lattice: Lattice, law: LatticeTarget, a: float, mode: str, n: int, steps: int, gen
) -> np.ndarray:
    """Starts from a 10× wider law (ε/10 or 10σ), run ``steps`` steps from 0 (App. E.4)."""
    wide = (
        LatticeLaplace(law.epsilon / 10.0, law.norm)
        if isinstance(law, LatticeLaplace)
        else LatticeGaussian(10.0 * law.sigma)
        if isinstance(law, LatticeGaussian)
        else law
    )
    a_wide = a if mode == "gibbs" else min(a ** (1.0 / 10.0), 0.999)
    eng = lattice_engine(lattice, wide, a_wide, mode=mode)
    cs = eng.init(np.zeros((n, lattice.dim), dtype=np.int64))
    for _ in range(steps):
        eng.step(cs, gen)
    return cs.states


@dataclass(frozen=True, eq=False)
class CertifyOptions:
    """The release policy's diagnostics (:func:`certify`): the coupling bound, R̂ and the
    moves.

    Attributes
    ----------
    tv : float
        Requested TV level η (default 0.01).
    lag : int, optional
        L; default 25 sweeps (``25 k`` engine steps).
    n_coupled : int
        Coupled pairs (≥ 200).
    rhat_chains, rhat_max, rhat_sweeps
        Over-dispersed chains (≥ 4), the R̂ threshold and the longest run (in sweeps, after
        a burn-in of ``T`` steps) for R̂; R̂ over all draws so far is checked after every
        eighth of that run and the run stops as soon as it is below the threshold.
    a : float, optional
        Proposal parameter; tuned by :func:`tune_scale` when None (Metropolis modes only).
    mode : {"gibbs", "single", "all"}, optional
        Moves (see :func:`lattice_engine`); default :func:`default_mode` of the law.
    max_iterations : int
        Cap on coupling iterations (engine steps).
    """

    tv: float = 0.01
    lag: int | None = None
    n_coupled: int = 200
    rhat_chains: int = 16
    rhat_max: float = 1.01
    rhat_sweeps: int = 8000
    a: float | None = None
    mode: str | None = None
    max_iterations: int = 200_000


def certify(
    lattice: Lattice,
    law: LatticeTarget,
    rng: KeyedRNG,
    options: CertifyOptions | None = None,
    **legacy: Any,
) -> ConvergenceReport:
    """Run the diagnostics of the release policy; raise unless both criteria hold.

    Parameters
    ----------
    lattice, law
        The lattice and the noise law (target).
    rng : KeyedRNG
        Streams ``lattice/pilot``, ``lattice/coupling``, ``lattice/rhat``.
    options : CertifyOptions, optional
        The TV level, lag, coupled pairs, R̂ policy, proposal, moves and iteration cap
        (:class:`CertifyOptions`; defaults when omitted).
    **legacy
        The fields of :class:`CertifyOptions` as keyword arguments, as before it existed
        (applied over ``options``; accepted for one release).

    Raises
    ------
    ConvergenceError
        When some coupled pair has not met by ``max_iterations``, when the bound does not
        fall below ``tv``, or when R̂ ≥ ``rhat_max``; the message names the bound reached and
        the fix.
    """
    o = with_keywords(CertifyOptions, options, legacy, "certify")
    if o.n_coupled < 200:
        raise ValueError("the release policy needs at least 200 coupled chains")
    if o.rhat_chains < 4:
        raise ValueError("the release policy needs at least 4 over-dispersed chains for R-hat")
    if not 0.0 < o.tv < 1.0:
        raise ValueError("the requested TV level must lie in (0, 1)")
    mode = default_mode(law) if o.mode is None else o.mode
    k = steps_per_sweep(lattice, mode)
    if mode == "gibbs":  # exact conditional draws: nothing to tune, every move accepted
        a, acc = float("nan"), 1.0
    elif o.a is None:
        a, acc = tune_scale(lattice, law, rng.generator("lattice/pilot"), mode=mode)
    else:
        a, acc = o.a, float("nan")
    lag = 25 * k if o.lag is None else int(o.lag)
    eng = lattice_engine(lattice, law, a, mode=mode)
    meeting, t_star, bound = _coupled_burn_in(eng, lattice.dim, lag, rng, o)
    g = rng.generator("lattice/rhat")
    starts = _overdispersed_starts(lattice, law, a, mode, o.rhat_chains, t_star, g)
    rh_max, n_steps = _rhat_after_burn_in(eng, starts, t_star, k, g, o)
    return ConvergenceReport(
        iterations=t_star,
        sweeps=t_star / k,
        tv_requested=float(o.tv),
        tv_bound=bound,
        lag=lag,
        n_coupled=o.n_coupled,
        meeting_times=meeting,
        rhat_max=rh_max,
        rhat_chains=o.rhat_chains,
        rhat_iterations=n_steps,
        a=float(a),
        acceptance=acc,
        mode=mode,
    )


def _coupled_burn_in(
    eng: Any, dim: int, lag: int, rng: KeyedRNG, o: CertifyOptions
) -> tuple[np.ndarray, int, float]:
    """The L-lag coupling criterion (Biswas, Jacob & Vanetti 2019): ``n_coupled`` pairs
    from 0 (stream ``lattice/coupling``), their meeting times, the first iteration T whose
    TV upper bound is below ``tv`` and that bound; a pair that has not met by
    ``max_iterations`` is a ConvergenceError naming how many and the bound's floor."""
    zeros = np.zeros((o.n_coupled, dim), dtype=np.int64)
    res = meeting_times(
        eng, zeros, zeros, lag, rng.generator("lattice/coupling"), max_iterations=o.max_iterations
    )
    if not res.all_met:
        finite = res.meeting_times[np.isfinite(res.meeting_times)]
        raise ConvergenceError(
            f"lattice MCMC: {res.meeting_times.size - finite.size} of {o.n_coupled} coupled "
            f"pairs had not met after {o.max_iterations} iterations, so the TV upper bound is "
            f"not below {o.tv} (it is at least "
            f"{(res.meeting_times.size - finite.size) / o.n_coupled:.3g}); "
            "fix: raise max_iterations (or tune the proposal scale)"
        )
    t_star = iterations_for_tv(res.meeting_times, lag, o.tv)
    if t_star is None:  # pragma: no cover - all met implies the bound reaches 0
        raise ConvergenceError(
            f"lattice MCMC: the TV upper bound never fell below {o.tv}; fix: more iterations"
        )
    t_star = max(int(t_star), 1)
    return res.meeting_times, t_star, float(tv_upper_bound(res.meeting_times, lag, t_star))


def _rhat_after_burn_in(
    eng: Any, starts: np.ndarray, t_star: int, k: int, g: np.random.Generator, o: CertifyOptions
) -> tuple[float, int]:
    """Split-R̂ (Vehtari et al. 2021) over the over-dispersed chains ``starts`` after a
    burn-in of ``t_star`` steps, checked after every eighth of ``rhat_sweeps`` sweeps
    (thinned to one draw per sweep) until below ``rhat_max``; the value reached and the
    steps run, or a ConvergenceError."""
    cs = eng.init(starts)
    for _ in range(t_star):
        eng.step(cs, g)
    thin = max(1, k)
    block = max(o.rhat_sweeps // 8, 25) * k
    cap = max(o.rhat_sweeps * k, block)
    draws, n_steps, rh_max = [], 0, math.inf
    while n_steps < cap:
        draws.append(eng.run(cs, block, g, thin=thin))
        n_steps += block
        rh_max = float(np.max(split_rhat(np.concatenate(draws))))
        if rh_max < o.rhat_max:
            break
    if not rh_max < o.rhat_max:
        raise ConvergenceError(
            f"lattice MCMC: split R-hat reached {rh_max:.4f} over {o.rhat_chains} "
            f"over-dispersed chains after {n_steps} iterations, not below {o.rhat_max}; fix: "
            "more iterations (raise rhat_sweeps)"
        )
    return rh_max, n_steps


def release_lattice_noise(
    lattice: Lattice,
    law: LatticeTarget,
    rng: KeyedRNG,
    *,
    data: np.ndarray | None = None,
    n_draws: int = 1,
    invariants: Sequence[str] = (),
    report: ConvergenceReport | None = None,
    **certify_kwargs,
) -> LatticeRelease:
    """Certify convergence (unless a ``report`` for the same lattice and law is given),
    then release ``n_draws`` independent noise vectors, each the state at iteration ``T``
    of its own chain from 0.

    Parameters
    ----------
    lattice, law, rng
        As in :func:`certify`; the release chains use stream ``lattice/release``.
    data : numpy.ndarray, optional
        (d,) integer counts; when given, ``released = data + noise``.
    n_draws : int
        Independent draws (1 for a real release; many for studying the mechanism).
    invariants : sequence of str
        Names of the invariants for the privacy statement.
    report : ConvergenceReport, optional
        A certificate already computed for this lattice and law.

    Returns
    -------
    LatticeRelease

    Raises
    ------
    ConvergenceError
        See :func:`certify`.
    """
    if report is None:
        report = certify(lattice, law, rng, **certify_kwargs)
    eng = lattice_engine(lattice, law, report.a, mode=report.mode)
    cs = eng.init(np.zeros((int(n_draws), lattice.dim), dtype=np.int64))
    g = rng.generator("lattice/release")
    for _ in range(report.iterations):
        eng.step(cs, g)
    noise = cs.states
    if not np.all(lattice.contains(noise)):  # pragma: no cover - moves stay on the lattice
        raise ArithmeticError("a lattice chain left the lattice: this is a bug")
    released = None
    if data is not None:
        x = np.asarray(data)
        if x.shape != (lattice.dim,) or not np.issubdtype(x.dtype, np.integer):
            raise ValueError(f"data must be a ({lattice.dim},) integer vector")
        released = x.astype(np.int64) + noise
    privacy = law.privacy_statement(invariants).with_notes(
        f"sampled by MCMC: each released noise vector is the state after {report.iterations} "
        f"iterations, whose law is within an estimated total variation {report.tv_bound:.3g} "
        f"(≤ requested {report.tv_requested:g}; L-lag coupling, L = {report.lag}, "
        f"{report.n_coupled} coupled chains; split R-hat {report.rhat_max:.4f} over "
        f"{report.rhat_chains} over-dispersed chains) of the target; if that estimate holds, "
        "the guarantee above holds with an additive δ = (1 + e^(loss))·TV, where loss is the "
        "privacy loss bound between the two databases — the TV figure is a Monte Carlo "
        "estimate, not a proof"
    )
    return LatticeRelease(
        noise=noise,
        released=released,
        convergence=report,
        privacy=privacy,
        diagnostics=report.to_dict(),
    )
