"""The estimator registry, and running the estimators a spec names on one set of measurements.

Every estimator follows one protocol, :class:`Estimator`: a name, what it promises
(``unbiased``, ``standard_errors``, ``integer`` output), which noise laws it accepts, and
``run(...)``, which takes the same inputs (hierarchy, cells, measurements, invariants, privacy
statement) and returns a :class:`~censusdp.estimation.release.Release`. Estimators register
here, in :data:`ESTIMATORS`, and nowhere else: specs are checked against this registry
(:func:`censusdp.pipelines.specs.check_spec`) and :func:`run_estimator` dispatches through it.
Adding an estimator is one class with ``@register_estimator`` in this file, plus its tests.

The pipeline adds the integer step (``[estimators] integer``) and maps the parallel parts over
an executor: the per-parent TopDown-style problems, and the GLS and rounding passes per
partition. The privacy statement is derived from the measurements and any statement passed in
is checked against it (:func:`~censusdp.mechanisms.privacy.checked_statement`) before any
estimator runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.tree import tree_gls
from censusdp.estimation.integer.laminar import check_invariants, round_release
from censusdp.estimation.release import Release
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.privacy import checked_statement
from censusdp.mechanisms.queries import Invariant, Measurement, Query
from censusdp.mechanisms.registry import LawInfo
from censusdp.pipelines.execute import Executor
from censusdp.pipelines.gls_partitioned import partitioned_gls, partitioned_round, rounding_mode
from censusdp.pipelines.partition import Partition
from censusdp.pipelines.partitioned_release import PartitionedRelease
from censusdp.pipelines.spec import EstimatorSpec
from censusdp.registry import Registry
from censusdp.rng import KeyedRNG

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "Problem",
    "register_estimator",
    "rounding_mode",
    "run_estimator",
]

#: GLS keeps its per-node covariances (n_nodes × cells² per level) up to this many cells, so
#: that the rounded release has standard errors for node totals and marginals
#: (:meth:`~censusdp.estimation.release.Release.sum_variances`); above it they cost too much
#: memory and only the cells' standard errors are reported.
COVARIANCE_CELLS = 64


def _marginals(measurements) -> list[Query]:
    """The measured marginals (besides cells and totals), whose rounded sums get SEs."""
    plan = getattr(measurements, "plan", None)  # PartitionedMeasurements: (level, query, law)
    queries = [q for _, q, _ in plan] if plan is not None else [m.query for m in measurements]
    out: dict[str, Query] = {}
    for q in queries:
        if q.name not in ("detailed", "total") and not q.is_identity:
            out.setdefault(q.name, q)
    return list(out.values())


def _round(release, invariants, queries, rng: KeyedRNG, executor, partitions) -> Release:
    """The spec's integer step; a release kept per partition (GLS) is rounded where its
    pieces are, then gathered, and its pieces freed."""
    mode = rounding_mode(invariants)
    if partitions is None or executor is None:
        return round_release(release, rng, method=mode, invariants=invariants, queries=queries)
    kept = release if isinstance(release, PartitionedRelease) else None
    try:
        rounded = partitioned_round(
            release, rng, partitions, executor, method=mode, invariants=invariants, queries=queries
        )
        if not isinstance(rounded, PartitionedRelease):
            return rounded
        try:
            return rounded.gather()
        finally:
            rounded.drop()
    finally:
        if kept is not None:
            kept.drop()


def _checked(release: Release, invariants: Sequence[Invariant]) -> Release:
    """The release with its invariants checked ``==`` on its own numbers.

    ``diagnostics["invariants_exact"]`` and a note in the privacy statement are computed
    from the check, never assumed; an integer release that misses one is refused.
    """
    if not invariants:
        return release
    exact = check_invariants(release, invariants)
    release.diagnostics["invariants_exact"] = exact
    missed = [k for k, ok in exact.items() if not ok]
    if release.integer and missed:
        raise DataError(
            f"the {release.estimator} release does not meet invariants {missed} exactly; "
            "refusing to release it with an exactness claim"
        )
    if missed:
        note = (
            "invariants checked on the released values: met up to floating-point rounding "
            f"(not bit-exact) for {', '.join(missed)} in this real-valued release"
        )
    else:
        note = "invariants checked on the released values (==): every one exact"
    return release.replace(privacy=release.privacy.with_notes(note))


class Problem(NamedTuple):
    """The inputs every estimator takes: one set of measurements of one hierarchy, in the
    order of the flat estimators' positional arguments (``tree_gls(*problem)``).

    Attributes
    ----------
    hierarchy : Hierarchy
    cells : sequence of str
    measurements : sequence of Measurement (or partitioned measurements)
    invariants : sequence of Invariant
    privacy : PrivacyStatement
        Already derived from the measurements and checked (see :func:`run_estimator`).
    """

    hierarchy: Hierarchy
    cells: Sequence[str]
    measurements: Any
    invariants: Sequence[Invariant]
    privacy: PrivacyStatement


@runtime_checkable
class Estimator(Protocol):
    """What the pipeline needs of an estimator.

    Attributes
    ----------
    name : str
        The name used in specs (``[estimators] run``), manifests and reports.
    unbiased : bool
        The real-valued release is unbiased for the confidential table.
    standard_errors : bool
        The release reports exact standard errors.
    integer : bool
        It releases integers itself (the spec's integer step does not apply).
    """

    name: ClassVar[str]
    unbiased: ClassVar[bool]
    standard_errors: ClassVar[bool]
    integer: ClassVar[bool]

    def accepts(self, law: LawInfo) -> str | None:
        """None when the estimator works with ``law``, else why not (for the error)."""

    def run(
        self,
        problem: Problem,
        rng: KeyedRNG,
        options: EstimatorSpec,
        executor: Executor | None,
        partitions: Sequence[Partition] | None,
    ) -> Release:
        """The release (before the integer step and the invariant check); one kept per
        partition (:class:`~censusdp.pipelines.partitioned_release.PartitionedRelease`)
        only when the integer step follows."""


#: Every estimator a spec can name, in registration order.
ESTIMATORS: Registry[Estimator] = Registry(
    "estimator",
    entry_points="censusdp.estimators",  # other packages' estimator classes, loaded lazily
    register=lambda name, cls: register_estimator(cls),
)


def register_estimator(cls: type) -> type:
    """Class decorator: register one instance of an :class:`Estimator` class by its name."""
    obj = cls()
    if not isinstance(obj, Estimator):
        raise SpecError(f"{cls.__name__} does not follow the Estimator protocol")
    ESTIMATORS.add(cls.name, obj)
    return cls


class _AnyLaw:
    """Estimators that work with every registered noise law."""

    def accepts(self, law: LawInfo) -> str | None:
        return None


@register_estimator
class GLS(_AnyLaw):
    """Hierarchical GLS (projection): unbiased, exact standard errors
    (:func:`~censusdp.estimation.gls.tree.tree_gls`; Hay et al. 2010; Gao, Gong & Yu 2022)."""

    name = "gls"
    unbiased = True
    standard_errors = True
    integer = False

    def run(self, problem, rng, options, executor, partitions) -> Release | PartitionedRelease:
        """In this process, or where the partitions are (kept there for the integer step)."""
        covariance = len(problem.cells) <= COVARIANCE_CELLS
        if partitions is None or executor is None:
            return tree_gls(*problem, covariance=covariance)
        keep = options.integer != "none"
        return partitioned_gls(*problem, partitions, executor, covariance=covariance, keep=keep)


@register_estimator
class Conditioning(_AnyLaw):
    """The noise law conditioned on consistency and invariants (belief revision), by a
    certified MCMC run (:func:`~censusdp.estimation.conditioning.estimator.condition`)."""

    name = "conditioning"
    unbiased = True
    standard_errors = False
    integer = False

    def run(self, problem, rng, options, executor, partitions) -> Release:
        from censusdp.estimation.conditioning.estimator import ConditioningOptions, condition

        mc = options.mcmc
        opts = ConditioningOptions(tv_bound=mc.tv_bound, n_rhat_chains=max(4, mc.chains))
        if mc.max_iterations is not None:
            opts = dataclasses.replace(opts, max_iterations=mc.max_iterations)
        return condition(*problem, rng.child("conditioning"), opts)


@register_estimator
class TopDown(_AnyLaw):
    """The TopDown-style baseline (U.S. Census Bureau 2020 algorithm; Abowd et al. 2022):
    integer, biased for small areas, no standard errors
    (:func:`~censusdp.estimation.topdown.flat.topdown`)."""

    name = "topdown"
    unbiased = False
    standard_errors = False
    integer = True

    def run(self, problem, rng, options, executor, partitions) -> Release:
        from censusdp.estimation.topdown.flat import TopDownOptions, topdown

        opts = TopDownOptions(executor=executor)  # its parents' problems over the executor
        return topdown(*problem, opts)


def run_estimator(
    name: str,
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement | None,
    rng: KeyedRNG,
    options: EstimatorSpec,
    *,
    executor: Executor | None = None,
    partitions: Sequence[Partition] | None = None,
) -> Release:
    """One estimator's release, with the spec's integer step applied.

    Parameters
    ----------
    name : str
        A registered estimator (:data:`ESTIMATORS`); unknown names are a SpecError.
    privacy : PrivacyStatement or None
        None: derived from the measurements; a statement is checked against the derived one
        (a claim below what the measurements spend is a BudgetError).
    rng : KeyedRNG
        Randomness of the estimator itself (rounding, MCMC); never the measurement noise.
    options : EstimatorSpec
        ``integer`` ("round", "lattice", "none"; see
        :class:`~censusdp.pipelines.spec.EstimatorSpec`) and the MCMC options.
    executor, partitions
        Where the parallel parts run; None runs everything in this process.
    """
    estimator = ESTIMATORS.get(name)
    privacy = checked_statement(hierarchy.names, measurements, invariants, privacy)
    problem = Problem(hierarchy, cells, measurements, invariants, privacy)
    release = estimator.run(problem, rng, options, executor, partitions)
    # the integer step, unless the estimator released integers itself (TopDown-style,
    # lattice conditioning); a GLS release kept per partition is rounded where it is
    if options.integer != "none" and not release.integer:
        release = _round(
            release,
            invariants,
            _marginals(measurements),
            rng.child(f"round/{name}"),
            executor,
            partitions,
        )
    return _checked(release, invariants)
