"""Run the estimators a spec names on one set of measurements.

Every estimator takes the same inputs (hierarchy, cells, measurements, invariants, privacy
statement) and returns a :class:`~censusdp.estimation.release.Release`. The pipeline adds the
integer step (``[estimators] integer``) and maps the parallel parts over an executor: the
per-parent TopDown-style problems, and the GLS and rounding passes per partition.
"""

from __future__ import annotations

from collections.abc import Sequence

from censusdp.budget import PrivacyStatement
from censusdp.config import EstimatorSpec
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls import tree_gls
from censusdp.estimation.release import Release
from censusdp.estimation.rounding import check_invariants, round_release
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.queries import Invariant, Measurement, Query
from censusdp.pipelines.execute import Executor
from censusdp.pipelines.gls_partitioned import partitioned_gls, partitioned_round
from censusdp.pipelines.partition import Partition
from censusdp.rng import KeyedRNG

__all__ = ["ESTIMATORS", "run_estimator", "rounding_mode"]

ESTIMATORS = ("gls", "conditioning", "topdown")

#: GLS keeps its per-node covariances (n_nodes × cells² per level) up to this many cells, so
#: that the rounded release has standard errors for node totals and marginals
#: (:meth:`~censusdp.estimation.release.Release.sum_variances`); above it they cost too much
#: memory and only the cells' standard errors are reported.
COVARIANCE_CELLS = 64


def rounding_mode(invariants: Sequence[Invariant]) -> str:
    """``"totals"`` when node totals are held invariant, else ``"cells"``.

    Either mode keeps every invariant exact (its rows join the rounding family); the mode
    picks which other sums stay within floor/ceil: node totals, or (node, cell) sums.
    """
    return "totals" if any(iv.query.name == "total" for iv in invariants) else "cells"


def _marginals(measurements) -> list[Query]:
    """The measured marginals (besides cells and totals), whose rounded sums get SEs."""
    plan = getattr(measurements, "plan", None)  # PartitionedMeasurements: (level, query, law)
    queries = [q for _, q, _ in plan] if plan is not None else [m.query for m in measurements]
    out: dict[str, Query] = {}
    for q in queries:
        if q.name not in ("detailed", "total") and not q.is_identity:
            out.setdefault(q.name, q)
    return list(out.values())


def _round(release: Release, invariants, queries, rng: KeyedRNG, executor, partitions) -> Release:
    mode = rounding_mode(invariants)
    if partitions is None or executor is None:
        return round_release(release, rng, method=mode, invariants=invariants, queries=queries)
    return partitioned_round(
        release, rng, partitions, executor, method=mode, invariants=invariants, queries=queries
    )


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
    release.privacy = release.privacy.with_notes(note)
    return release


def _partitioned_gls(
    hierarchy, cells, measurements, invariants, privacy, rng, options, executor, partitions
) -> Release:
    """GLS and its rounding where the partitions are; only the finished release is gathered."""
    kept = partitioned_gls(
        hierarchy,
        cells,
        measurements,
        invariants,
        privacy,
        partitions,
        executor,
        keep=True,
        covariance=len(cells) <= COVARIANCE_CELLS,
    )
    try:
        if options.integer == "none":
            return kept.gather()
        mode = rounding_mode(invariants)
        rounded = partitioned_round(
            kept,
            rng.child("round/gls"),
            partitions,
            executor,
            method=mode,
            invariants=invariants,
            queries=_marginals(measurements),
        )
        if isinstance(rounded, Release):  # cut at the leaves: rounded in this process
            return rounded
        try:
            return rounded.gather()
        finally:
            rounded.drop()
    finally:
        kept.drop()


def run_estimator(
    name: str,
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement],
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement,
    rng: KeyedRNG,
    options: EstimatorSpec,
    *,
    executor: Executor | None = None,
    partitions: Sequence[Partition] | None = None,
) -> Release:
    """One estimator's release, with the spec's integer step applied.

    Parameters
    ----------
    name : {"gls", "conditioning", "topdown"}
    rng : KeyedRNG
        Randomness of the estimator itself (rounding, MCMC); never the measurement noise.
    options : EstimatorSpec
        ``integer`` ("round", "lattice", "none"; see
        :class:`~censusdp.config.EstimatorSpec`) and the MCMC options.
    executor, partitions
        Where the parallel parts run; None runs everything in this process.
    """
    if name == "gls":
        if partitions is not None and executor is not None:
            return _checked(
                _partitioned_gls(
                    hierarchy,
                    cells,
                    measurements,
                    invariants,
                    privacy,
                    rng,
                    options,
                    executor,
                    partitions,
                ),
                invariants,
            )
        release = tree_gls(
            hierarchy,
            cells,
            measurements,
            invariants,
            privacy,
            covariance=len(cells) <= COVARIANCE_CELLS,
        )
    elif name == "topdown":
        from censusdp.estimation.topdown import topdown

        mapper = None if executor is None or executor.name == "sync" else executor.map
        chunks = 1 if mapper is None else 4 * max(1, executor.workers)
        return _checked(
            topdown(
                hierarchy, cells, measurements, invariants, privacy, mapper=mapper, chunks=chunks
            ),
            invariants,
        )
    elif name == "conditioning":
        from censusdp.estimation.conditioning import condition

        mc = options.mcmc
        kwargs = {"tv_bound": mc.tv_bound, "n_rhat_chains": max(4, mc.chains)}
        if mc.max_iterations is not None:
            kwargs["max_iterations"] = mc.max_iterations
        release = condition(
            hierarchy, cells, measurements, invariants, privacy, rng.child("conditioning"), **kwargs
        )
    else:
        raise SpecError(f"unknown estimator {name!r}; choose from {list(ESTIMATORS)}")
    if options.integer != "none" and not release.integer:  # "lattice": GLS is rounded
        release = _round(
            release,
            invariants,
            _marginals(measurements),
            rng.child(f"round/{name}"),
            executor,
            partitions,
        )
    return _checked(release, invariants)
