"""GLS and unbiased rounding over partitions: upward map → reduce at the root → downward map.

The hierarchy is cut at a level (the units of :func:`~censusdp.pipelines.partition.partition_units`);
every partition is a contiguous run of cut-level nodes with their subtrees.

* :func:`partitioned_gls` maps :func:`~censusdp.estimation.gls.tree.gls_upward` over the
  partitions (each task receives only its partition's measurement and invariant slices and
  the child counts of its levels), reduces the cut-level messages at the top in the calling
  process (:func:`~censusdp.estimation.gls.tree.gls_top`, levels 0 .. cut), then maps
  :func:`~censusdp.estimation.gls.tree.gls_downward` over the partitions, each of which also
  checks consistency and the invariants of its own levels.
* :func:`partitioned_round` rounds each partition's subtrees up to the cut with randomness
  keyed by (level, node), then the levels above the cut from the units' leftovers, and each
  partition settles its leftovers and sums its levels.

Both are steps (``up``/``top``/``down``) of the one partition driver,
:func:`~censusdp.pipelines.partition_driver.drive` — the same that streams the structured GLS
(:mod:`~censusdp.pipelines.structured_stream`) — and equal the single-process results
(:func:`~censusdp.estimation.gls.tree.tree_gls`, :func:`~censusdp.estimation.integer.laminar.round_release`)
bit for bit, for every backend and partition count. The maps chain through the executor's
handles (:meth:`submit <censusdp.pipelines.execute.DaskExecutor.submit>`): on Dask, partition
``i``'s measurements
(from ``measure_partitioned(..., keep=True)``), upward state and release piece
(:class:`~censusdp.pipelines.partitioned_release.PartitionedRelease`, with ``keep=True``)
stay on the worker that computed them; the calling process sees the cut-level messages,
residuals and leftovers, and the finished release when it gathers it.

References
----------
Hay, Rastogi, Miklau & Suciu, PVLDB 3(1), 2010 (two-pass consistency); Rauch, Tung &
Striebel, AIAA J. 3(8), 1965 (the smoother); Gandhi, Khuller, Parthasarathy & Srinivasan,
J. ACM 53(3), 2006 (dependent rounding).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from censusdp.budget import PrivacyStatement, invariant_labels, with_invariants
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.tree import (
    Geometry,
    GLSPlan,
    UpwardState,
    forest_residuals,
    gls_diagnostics,
    gls_downward,
    gls_finish,
    gls_plan,
    gls_top,
    gls_upward,
    merge_residuals,
    restrict,
)
from censusdp.estimation.integer.laminar import (
    TOL,
    RoundingPlan,
    RoundPart,
    bipartite_rows,
    bipartite_variances,
    check_bipartite,
    check_finite,
    require_exact,
    round_bipartite_part,
    round_part,
    round_release,
    round_top,
    rounding_fields,
    settle_part,
    snap_invariants,
    sum_estimator_variances,
    tracked_sums,
)
from censusdp.estimation.integer.nonnegative import (
    BIASED_NOTE,
    LABEL,
    nonnegative_partition,
    nonnegative_top,
    partition_keys,
)
from censusdp.estimation.release import Release
from censusdp.estimation.topdown.flat import flat_products
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.mechanisms.privacy import checked_statement
from censusdp.mechanisms.queries import Invariant, Measurement, Query
from censusdp.pipelines.execute import Executor
from censusdp.pipelines.measure import PartitionedMeasurements
from censusdp.pipelines.partition import Partition
from censusdp.pipelines.partition_driver import (
    DriverOptions,
    PartitionDriver,
    Task,
    drive,
    integerize,
    no_message,
    register_integerizer,
    same,
)
from censusdp.pipelines.partitioned_release import PartitionedRelease, ReleasePiece, piece_head
from censusdp.rng import KeyedRNG, SubKeys, chunk_range
from censusdp.schema import Schema
from censusdp.timing import stage

__all__ = [
    "NonNegativeIntegerizer",
    "RoundIntegerizer",
    "partitioned_gls",
    "partitioned_round",
    "rounding_mode",
]


def rounding_mode(invariants: Sequence[Invariant]) -> str:
    """``"totals"`` when node totals are held invariant, else ``"cells"``.

    Either mode keeps every invariant exact (its rows join the rounding family); the mode
    picks which other sums stay within floor/ceil: node totals, or (node, cell) sums.
    """
    return "totals" if any(iv.query.name == "total" for iv in invariants) else "cells"


# ----------------------------------------------------------------------------- GLS tasks
def _upward_task(item: tuple, plan: GLSPlan) -> UpwardState:
    """Upward pass of one partition, ``item = (forest, measured, entries, invariants)``:
    ``measured`` its measurements (``entries`` None), or its :func:`_measure_task
    <censusdp.pipelines.measure._measure_task>` result with ``entries`` the plan positions,
    levels, queries and laws of the levels at or below the cut."""
    forest, measured, entries, invariants = item
    if entries is None:
        return gls_upward(plan, forest, measured, invariants)
    meas = []
    for i, k, q, law in entries:
        values = measured[i]
        if not np.all(np.isfinite(values)):
            raise DataError(
                f"measurement {q.name!r} at level {plan.names[k]!r} has non-finite values"
            )
        meas.append(Measurement(k, q, values, law))
    return gls_upward(plan, forest, meas, invariants)


def _message_task(state: UpwardState) -> tuple[Any, int]:
    """What a partition's upward state sends to the top: its cut nodes' beliefs (the states
    are all kept: the size given to the driver's cache is 0)."""
    return state.message(), 0


def _downward_task(
    item: tuple[UpwardState, np.ndarray, np.ndarray, tuple[Invariant, ...]],
    plan: GLSPlan,
    covariance: bool,
) -> ReleasePiece:
    """Smoothing of one partition: its :class:`ReleasePiece` (levels below the cut), with
    the residuals of its levels (the cut level included) in the summary."""
    state, z, P, invariants = item
    zhat, Phat = gls_downward(plan, state, z, P)
    est, var, cov = gls_finish(plan, zhat, Phat, covariance)
    residuals = forest_residuals(state.forest, est, invariants)
    return ReleasePiece(
        tuple(est[1:]),
        None if var is None else tuple(var[1:]),
        None if cov is None else tuple(cov[1:]),
        summary=residuals,
    )


@dataclass(eq=False)
class _GLSStep:
    """The flat GLS as a :class:`~censusdp.pipelines.partition_driver.PartitionStep`: each
    partition's upward pass (:func:`_upward_task`), the levels down to the cut solved from
    the cut nodes' messages (:func:`~censusdp.estimation.gls.tree.gls_top`), and each
    partition's smoothing (:func:`_downward_task`) from its upward state: every state is
    kept (the driver's ``cache_bytes=None``, as before the driver), so ``down`` is always
    given one."""

    plan: GLSPlan
    hierarchy: Hierarchy
    partitions: Sequence[Partition]
    tasks: list
    meas: list
    invs: list
    part_invs: list[tuple[Invariant, ...]]
    covariance: bool
    smoothed: tuple = ()
    message_fn = staticmethod(_message_task)

    def up(self, pos: int) -> Task:
        return Task(_upward_task, self.tasks[pos], (self.plan,))

    def top(self, messages: list) -> None:
        cut = self.partitions[0].cut
        self.smoothed = gls_top(self.plan, self.hierarchy, cut, self.meas, self.invs, messages)

    def down(self, pos: int, state: UpwardState | None) -> Task:
        zhat, Phat = self.smoothed
        units = slice(*self.partitions[pos].units)
        item = (state, zhat[-1][units], Phat[-1][units], self.part_invs[pos])
        return Task(_downward_task, item, (self.plan, self.covariance))


def partitioned_gls(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement] | PartitionedMeasurements,
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement,
    partitions: Sequence[Partition],
    executor: Executor,
    *,
    covariance: bool = False,
    geometry: Geometry = "weighted",
    keep: bool = False,
) -> Release | PartitionedRelease:
    """The GLS estimate computed partition by partition; equals :func:`tree_gls` bit for bit.

    Parameters
    ----------
    hierarchy, cells, measurements, invariants, privacy, covariance, geometry
        As for :func:`~censusdp.estimation.gls.tree.tree_gls` (``privacy`` None derives the
        statement; a claim below the spend is a BudgetError); ``measurements`` may also be the
        :class:`~censusdp.pipelines.measure.PartitionedMeasurements` of
        ``measure_partitioned(..., keep=True)`` (used where they are when its executor and
        partitions are these; gathered otherwise).
    partitions : sequence of Partition
        From :func:`~censusdp.pipelines.partition.partition_units` (one cut level, node order).
    executor : Executor
        Backend of the two maps (sync, threads, Dask); the reduce runs in the caller.
    keep : bool
        Return a :class:`~censusdp.pipelines.partitioned_release.PartitionedRelease` whose
        levels below the cut stay with the executor (for :func:`partitioned_round`), instead
        of gathering them. Consistency and the invariants are checked either way.

    Returns
    -------
    Release or PartitionedRelease
        Same estimates, variances and covariances as ``tree_gls`` (``np.array_equal``);
        diagnostics add the partition count and per-stage seconds.

    References
    ----------
    Hay et al. (2010); Rauch, Tung & Striebel (1965).
    """
    ex, cut = executor, partitions[0].cut
    clock: dict[str, float] = {}
    with stage(clock, "setup"):
        privacy = checked_statement(hierarchy.names, measurements, invariants, privacy)
        plan, meas, invs, part_invs, tasks = _gls_tasks(
            hierarchy, cells, measurements, invariants, privacy, partitions, ex, geometry
        )
    step = _GLSStep(plan, hierarchy, partitions, tasks, meas, invs, part_invs, covariance)
    driver = PartitionDriver(len(partitions), ex, DriverOptions(cache_bytes=None))
    pieces = drive(step, driver)
    del tasks
    step.tasks = []  # the upward items (measurement slices) are no longer needed
    with stage(driver.seconds, "downward"):
        summaries = [summary for _, summary in ex.map(piece_head, pieces)]
    clock |= driver.seconds
    zhat, Phat = step.smoothed
    est, var, cov = gls_finish(plan, zhat, Phat, covariance)
    top = forest_residuals(whole_forest(hierarchy, 0, cut), est, invs)
    timings = {
        "partitions": len(partitions),
        "cut": hierarchy.names[cut],
        **{f"seconds_{k}": clock[k] for k in ("setup", "upward", "top", "downward")},
    }
    kept = PartitionedRelease(
        estimator="gls",
        hierarchy=hierarchy,
        cells=plan.cells,
        privacy=dataclasses.replace(
            with_invariants(privacy, invariant_labels(hierarchy.names, invariants)),
            geometry=plan.geometry,
        ),
        integer=False,
        diagnostics=gls_diagnostics(plan, merge_residuals([top, *summaries]), timings),
        partitions=tuple(partitions),
        executor=ex,
        estimates=est,
        variances=var,
        covariances=cov,
        pieces=pieces,
    )
    if keep:
        return kept
    return _gathered(kept, "seconds_gather")


def _gls_tasks(
    hierarchy: Hierarchy,
    cells: Sequence[str],
    measurements: Sequence[Measurement] | PartitionedMeasurements,
    invariants: Sequence[Invariant],
    privacy: PrivacyStatement,
    partitions: Sequence[Partition],
    ex: Executor,
    geometry: Geometry,
) -> tuple[GLSPlan, list, list, list[tuple[Invariant, ...]], list]:
    """The GLS plan, the resolved measurements and invariants, and per partition its
    invariants and upward task (:func:`_upward_task`): its measurement slices, or, for
    measurements kept with this executor and these partitions, the handle of its measurements
    there (levels at or below the cut validated by shape here, for finiteness in their tasks)."""
    cut = partitions[0].cut
    pm = measurements if isinstance(measurements, PartitionedMeasurements) else None
    if pm is not None and (pm.executor is not ex or pm.partitions != tuple(partitions)):
        measurements, pm = pm.gather(), None
    if pm is None:
        plan, meas, invs = gls_plan(
            hierarchy, cells, measurements, invariants, geometry, privacy=privacy
        )
        items = [(tuple(restrict(meas, cut, p.ranges)), None) for p in partitions]
    else:
        stubs = [
            pm.top[i]
            if i in pm.top
            else Measurement(k, q, np.broadcast_to(np.zeros(()), (pm.sizes[k], q.n_rows)), law)
            for i, (k, q, law) in enumerate(pm.plan)
        ]
        plan, meas, invs = gls_plan(hierarchy, cells, stubs, invariants, geometry, privacy=privacy)
        entries = tuple((i, k, q, law) for i, (k, q, law) in enumerate(pm.plan) if k >= cut)
        items = [(h, entries) for h in pm.handles]
    part_invs = [tuple(restrict(invs, cut, p.ranges)) for p in partitions]
    tasks = [
        (Forest.of(hierarchy, cut, p.ranges), m, e, iv)
        for p, (m, e), iv in zip(partitions, items, part_invs, strict=True)
    ]
    return plan, meas, invs, part_invs, tasks


def _gathered(kept: PartitionedRelease, timing: str) -> Release:
    """``kept`` gathered into this process (its pieces freed), with the seconds it took."""
    clock: dict[str, float] = {}
    with stage(clock, "gather"):
        try:
            release = kept.gather()
        finally:
            kept.drop()
    release.diagnostics[timing] = clock["gather"]
    return release


# ----------------------------------------------------------------------------- rounding tasks
def _round_task(
    item: tuple, n_global: tuple[int, ...], plan: RoundingPlan, label: str, tol: float
) -> RoundPart:
    """``item = (forest, lo, piece, keys)`` of one partition: its leaves rounded up to the cut,
    with the sub-keys of its rounding streams (:func:`_round_keys`)."""
    forest, lo, piece, keys = item
    leaves = piece.estimates[-1]
    return round_part(forest, lo, n_global, leaves, keys, plan, label=label, tol=tol)


def _round_keys(
    rng: KeyedRNG, forest: Forest, lo: Sequence[int], plan: RoundingPlan, label: str
) -> SubKeys:
    """The sub-keys :func:`~censusdp.estimation.integer.laminar.round_part` draws from for this
    forest (global first nodes ``lo``): for each step of ``plan`` it runs, stream
    ``label/<step>`` over the chunks of the forest's nodes at the step's merging level (a
    stream missed here fails loudly with :class:`~censusdp.rng.StreamNotHeld`)."""
    streams: dict[str, set[int]] = {}
    for step in plan.steps:  # the steps round_part runs, in its order
        if step.new is None or step.level < forest.first:
            break
        jp = step.prev_level - forest.first
        chunks = chunk_range(lo[jp], lo[jp] + forest.sizes[jp])
        streams.setdefault(f"{label}/{step.label}", set()).update(chunks)
    return rng.restrict({name: sorted(c) for name, c in streams.items()})


def _bipartite_task(
    item: tuple[ReleasePiece, np.ndarray, int, int, SubKeys], n_rows: int, label: str, tol: float
) -> np.ndarray:
    """``item = (piece, child_count, first_parent, first_leaf, keys)``: the leaves of the
    partition's leaf parents rounded, with the sub-keys of their kernel rows' uniforms."""
    piece, child_count, first_parent, first_leaf, keys = item
    return round_bipartite_part(
        piece.estimates[-1], child_count, first_parent, keys, n_rows, first_leaf,
        label=label, tol=tol,
    )  # fmt: skip


def _leftovers(part: RoundPart) -> tuple[RoundPart, int]:
    """The fractional parts a partition leaves at the cut (without its leaves): its message
    to the levels above (the rounded parts are all kept: size 0 for the driver's cache)."""
    return part.leftovers(), 0


def _settle_task(item: tuple, plan: RoundingPlan | None, tol: float) -> ReleasePiece:
    """A partition's integer piece: its leaves with the increments the levels above the cut
    gave its leftovers, summed up to the cut; the variances plus the exact rounding
    variances of its levels (top-down from its cut nodes' bit covariances); and whether the
    invariants of its levels below the cut hold exactly."""
    part, piece, forest, lo, leaf, cell, add, bits, invariants, masks = item
    summary: dict = {}
    if plan is None:  # bipartite: ``part`` is the rounded leaves, ``bits`` the parents' rows
        leaves = snap_invariants(forest, piece.estimates[-1], part, [i for i, _ in invariants], tol)
        counts = forest.aggregate(leaves)
        f = forest
        par, leaf = bipartite_variances(
            piece.estimates[-1], piece.estimates[-2] if bits is None else bits, masks, tol
        )
        above = Forest(f.first, f.names[:-1], f.sizes[:-1], f.child_count[:-1], ()).aggregate
        summary["head_rounding"], *rounding = [*above(par), leaf]
    else:
        leaves = part.leaves.copy()  # the rounded leaves stay as they are, for a recomputation
        leaves[leaf - lo[-1], cell] += add
        leaves = snap_invariants(
            forest, piece.estimates[-1], leaves, [i for i, _ in invariants], tol
        )
        counts = forest.aggregate(leaves)
        rounding = settle_part(part, forest, lo, plan, bits)
    K = leaves.shape[1]
    variances = (
        None
        if piece.variances is None
        else tuple(v + r[:, :K] for v, r in zip(piece.variances, rounding, strict=True))
    )
    missed = [
        key
        for iv, key in invariants
        if not np.array_equal(iv.query.apply(counts[iv.level - forest.first]), iv.values)
    ]
    largest = float(max((np.nanmax(r[:, :K], initial=0.0) for r in rounding), default=0.0))
    summary.update(rounding_variance_max=largest, invariants_missed=missed)
    levels = range(len(piece.estimates))
    return ReleasePiece(
        tuple(counts[1:]),
        variances,
        head=counts[0],
        summary=summary,
        sums=tuple(zip(sum_estimator_variances(piece, masks, levels), rounding, strict=True)),
    )


def _finite_task(item: tuple[ReleasePiece, int], hierarchy: Hierarchy, cells: tuple) -> None:
    """Refuse non-finite or out-of-range leaf estimates where the piece is
    (:func:`~censusdp.estimation.integer.laminar.check_finite`; ``item = (piece, first leaf)``)."""
    check_finite(hierarchy, cells, item[0].estimates[-1], item[1])


def partitioned_round(
    release: Release | PartitionedRelease,
    rng: KeyedRNG,
    partitions: Sequence[Partition],
    executor: Executor,
    *,
    method: Literal["cells", "totals", "bipartite"] = "cells",
    invariants: Sequence[Invariant] = (),
    queries: Sequence[Query] = (),
    label: str | None = None,
    tol: float = TOL,
) -> Release | PartitionedRelease:
    """Unbiased integer rounding partition by partition; equals :func:`round_release`.

    ``"cells"``/``"totals"``: each partition runs the steps of the rounding family
    (:class:`~censusdp.estimation.integer.laminar.RoundingPlan`, invariants included) up to its
    cut-level nodes (:func:`~censusdp.estimation.integer.laminar.round_part`), the calling process
    runs the levels above from the sets each cut node leaves
    (:func:`~censusdp.estimation.integer.laminar.round_top`, which also gives the exact rounding
    variances of those levels and the covariance of each cut node's bits), and each
    partition settles its leftovers, sums its levels and runs the top-down variance pass
    where its piece is (:func:`~censusdp.estimation.integer.laminar.settle_part`). Every uniform is
    keyed by (step, element) and every group merges in global element order, so integers
    and variances are the same for every partition count and backend, and equal to
    :func:`~censusdp.estimation.integer.laminar.round_release`. ``"bipartite"``: the leaves of the
    partition's leaf parents in one kernel call, uniforms keyed by global kernel row.

    A :class:`~censusdp.pipelines.partitioned_release.PartitionedRelease` (from
    ``partitioned_gls(..., keep=True)``, same partitions and executor) is rounded where its
    pieces are, and the result is again one; a plain :class:`Release` gives a plain one.

    Guarantees (unchanged by partitioning): every leaf cell is ⌊x⌋ or ⌈x⌉ with
    E[rounded] = x; every invariant is exact (checked ``==``, in
    ``diagnostics["invariants_exact"]``); the sets of the family are within floor/ceil.

    Raises
    ------
    SpecError, DataError
        As :func:`~censusdp.estimation.integer.laminar.round_release`.

    References
    ----------
    Srinivasan (2001); Ageev & Sviridenko (2004); Gandhi et al. (2006).
    """
    if method not in ("cells", "totals", "bipartite"):
        raise SpecError(f"method must be 'cells', 'totals' or 'bipartite', got {method!r}")
    lab = label or f"rounding/{method}"
    ex = executor
    kept = release if isinstance(release, PartitionedRelease) else None
    if kept is not None and (kept.executor is not ex or kept.partitions != tuple(partitions)):
        release, kept = kept.gather(), None  # the caller's release stays as it is
    h = release.hierarchy
    cut, D = partitions[0].cut, h.depth
    if cut == D - 1 or (method == "bipartite" and cut > D - 2):
        # nothing to round below the cut, or the leaves' parents are above it: one task
        plain = release if kept is None else kept.gather()
        return round_release(
            plain, rng, method=method, invariants=invariants, queries=queries, label=lab, tol=tol
        )
    if kept is None:
        check_finite(h, release.cells, release.estimates[-1])
        kept = PartitionedRelease.of(release, partitions, ex)
    else:
        items = [(x, p.range(D - 1)[0]) for x, p in zip(kept.pieces, partitions, strict=True)]
        ex.wait(ex.submit(_finite_task, items, h, kept.cells))
    step = RoundIntegerizer.of(
        kept, rng, invariants, method=method, queries=queries, label=lab, tol=tol
    )
    rounded = integerize(
        step, PartitionDriver(len(partitions), ex, DriverOptions(cache_bytes=None))
    )
    if isinstance(release, PartitionedRelease):
        return rounded
    ex.release(kept.pieces)
    return _gathered(rounded, "seconds_gather")


@register_integerizer
@dataclass(eq=False)
class RoundIntegerizer:
    """The unbiased rounding of a release kept per partition as an
    :class:`~censusdp.pipelines.partition_driver.Integerizer`: each partition rounds its part
    (``up_tasks``: the family's steps up to its cut nodes, :func:`_round_task`; bipartite:
    its leaf parents at once, :func:`_bipartite_task`), the levels above the cut are
    rounded here from the leftovers the cut nodes send (:func:`round_top`; nothing for
    bipartite), and each partition settles where its piece is (:func:`_settle_task`).
    ``settle`` is per partition ``(leaf, cell, add, bits)``: the increments the levels above
    the cut give its leftovers and its cut nodes' bit covariances or, for bipartite, the
    parents' rows; ``plan`` None for bipartite; tracked sums' masks and labels, the family's
    description and the rounding variances of the levels down to the cut (None for
    bipartite: summed from the pieces). Every rounded part is kept (``cache_bytes=None``)."""

    name: ClassVar[str] = "round"
    release: PartitionedRelease
    rng: KeyedRNG
    label: str
    tol: float
    invariants: tuple[Invariant, ...]
    method: str
    up_tasks: list[Task]
    message_fn: Any
    plan: RoundingPlan | None
    masks: np.ndarray
    labels: Sequence[str]
    family: tuple = ()
    settle: list[tuple] = dataclasses.field(default_factory=list)
    top_rounding: list[np.ndarray] | None = None

    @classmethod
    def of(
        cls,
        release: PartitionedRelease,
        rng: KeyedRNG,
        invariants: Sequence[Invariant] = (),
        *,
        method: str | None = None,
        queries: Sequence[Query] = (),
        label: str | None = None,
        tol: float = TOL,
    ) -> RoundIntegerizer:
        """The rounding of ``release`` where its pieces are (``method`` None:
        :func:`rounding_mode`; ``label`` None: ``rounding/<method>``)."""
        method = method or rounding_mode(invariants)
        h, cells, cut, parts = release.hierarchy, release.cells, release.cut, release.partitions
        lab, invs, D = label or f"rounding/{method}", tuple(invariants), h.depth
        common = (release, rng, lab, tol, invs, method)
        if method == "bipartite":
            check_bipartite(h.names, cells, invs)
            masks, labels = tracked_sums(cells, invs, queries)
            cc, n_rows = h.levels[D - 2].child_count, h.sizes[-1] + h.sizes[D - 2]
            tasks = []
            for p, piece in zip(parts, release.pieces, strict=True):
                (p0, p1), l0 = p.range(D - 2), p.range(D - 1)[0]
                _, lo, hi = bipartite_rows(cc[p0:p1], l0, p0)
                keys = rng.restrict(
                    {lab: chunk_range(lo * (len(cells) + 2), hi * (len(cells) + 2))}
                )
                item = (piece, cc[p0:p1], p0, l0, keys)
                tasks.append(Task(_bipartite_task, item, (n_rows, lab, tol)))
            none = np.zeros(0, np.int64)  # the pieces hold the parents' level unless it is cut
            rows = [release.estimates[cut][slice(*p.range(cut))] if D - 2 == cut else None
                    for p in parts]  # fmt: skip
            settle = [(none, none, none, r) for r in rows]
            return cls(*common, tasks, no_message, None, masks, labels, settle=settle)
        plan = RoundingPlan.build(h.names, cells, method, invs, queries)
        n_global = tuple(h.sizes[cut:])
        tasks = []
        for p, piece in zip(parts, release.pieces, strict=True):
            f, lo = Forest.of(h, cut, p.ranges).without_codes(), tuple(r[0] for r in p.ranges)
            keys = _round_keys(rng, f, lo, plan, lab)
            tasks.append(Task(_round_task, (f, lo, piece, keys), (n_global, plan, lab, tol)))
        return cls(*common, tasks, _leftovers, plan, plan.masks, plan.labels, plan.describe())

    @staticmethod
    def whole(release: Release, rng: KeyedRNG, invariants: Sequence[Invariant] = ()) -> Release:
        """The same rounding in one process (:func:`round_release`)."""
        return round_release(release, rng, method=rounding_mode(invariants), invariants=invariants)

    def up(self, pos: int) -> Task:
        return self.up_tasks[pos]

    def top(self, messages: list) -> None:
        """``"cells"``/``"totals"``: the levels above the cut rounded from the cut nodes'
        leftovers, and each partition told the increments its leftovers get."""
        if self.plan is None:
            return
        h, cut = self.release.hierarchy, self.release.cut
        top = round_top(h, cut, messages, self.rng, self.plan, label=self.label, tol=self.tol)
        for p in self.release.partitions:
            lo, hi = p.range(h.depth - 1)
            mine = (top.leaf >= lo) & (top.leaf < hi)
            self.settle.append(
                (top.leaf[mine], top.cell[mine], top.add[mine], top.bits[slice(*p.range(cut))])
            )
        self.top_rounding = top.variances

    def partition(self, pos: int, state: Any | None) -> Task:
        """Partition ``pos``'s integer piece (:func:`_settle_task`, where its piece is)."""
        r = self.release
        h, p = r.hierarchy, r.partitions[pos]
        invs = tuple(
            (iv, f"{h.names[iv.level]}: {iv.query.name}")
            for iv in restrict(self.invariants, r.cut, p.ranges)
        )
        forest, lo = Forest.of(h, r.cut, p.ranges).without_codes(), tuple(a for a, _ in p.ranges)
        item = (state, r.pieces[pos], forest, lo, *self.settle[pos], invs, self.masks)
        return Task(_settle_task, item, (self.plan, self.tol))

    down = partition

    def finish(self, pieces: list) -> PartitionedRelease:
        """The rounded release kept per partition: the levels down to the cut summed from the
        pieces' heads, variances with the rounding's added, the tracked sums, and every
        invariant checked exact (DataError naming those that are not; the pieces released)."""
        kept, ex = self.release, self.release.executor
        h, cut = kept.hierarchy, kept.cut
        got = ex.map(piece_head, pieces)
        top = whole_forest(h, 0, cut)
        estimates = top.aggregate(np.concatenate([c for c, _ in got]))
        top_rounding = self.top_rounding
        if top_rounding is None:  # bipartite: the parents are independent, variances add
            top_rounding = top.aggregate(np.concatenate([s["head_rounding"] for _, s in got]))
        largest = max(s["rounding_variance_max"] for _, s in got)
        variances, sums, diag = rounding_fields(
            kept, top_rounding, self.masks, self.labels, self.method, self.family, largest
        )
        try:
            diag["invariants_exact"] = require_exact(self._exact(estimates, [s for _, s in got]))
        except DataError:
            ex.release(pieces)
            raise
        return dataclasses.replace(
            kept, integer=True, diagnostics=diag, estimates=estimates, variances=variances,
            covariances=None, pieces=pieces, sums=sums,
        )  # fmt: skip

    def _exact(self, estimates: Sequence[np.ndarray], summaries: Sequence[dict]) -> dict:
        """Per invariant label, whether it holds exactly (``==``): checked here on the levels
        down to the cut, by the pieces (their ``invariants_missed``) below it."""
        names, cut = self.release.hierarchy.names, self.release.cut
        exact: dict[str, bool] = {}
        for iv in sorted(self.invariants, key=lambda iv: iv.level > cut):
            key = f"{names[iv.level]}: {iv.query.name}"
            if iv.level <= cut:
                ok = bool(np.array_equal(iv.query.apply(estimates[iv.level]), iv.values))
            else:
                ok = not any(key in s["invariants_missed"] for s in summaries)
            exact[key] = exact.get(key, True) and ok
        return exact


# ----------------------------------------------------------------------------- non-negative
def _nonnegative_task(
    item: tuple, n_global: tuple[int, ...], schema: Schema, label: str, tol: float
) -> ReleasePiece:
    """``item = (forest, lo, piece, cut_counts, keys)`` of one partition: its levels below the
    cut made non-negative integers from its cut nodes' (:func:`nonnegative_partition`, with
    the sub-keys of its streams, :func:`partition_keys`)."""
    forest, lo, piece, cut_counts, keys = item
    got = nonnegative_partition(
        forest, lo, n_global, schema, cut_counts, list(piece.estimates), keys, label=label, tol=tol
    )
    return ReleasePiece(tuple(c.reshape(c.shape[0], -1) for c in got.counts), None)


def _nonnegative_release(release: Release | PartitionedRelease, counts: Sequence[np.ndarray]):
    """``release`` with ``counts`` (levels from the root) as its non-negative estimates: no
    variances (the product is biased), its statement noting so (:data:`BIASED_NOTE`)."""
    return dataclasses.replace(
        release,
        integer=True,
        estimates=[c.reshape(c.shape[0], -1) for c in counts],
        variances=None,
        covariances=None,
        sums=None,
        privacy=release.privacy.with_notes(BIASED_NOTE),
        diagnostics={**release.diagnostics, "rounding": NonNegativeIntegerizer.name},
    )


@register_integerizer
@dataclass(eq=False)
class NonNegativeIntegerizer:
    """The non-negative product (:mod:`~censusdp.estimation.integer.nonnegative`) of a flat
    release, on ``Schema.flat(cells)``, as an
    :class:`~censusdp.pipelines.partition_driver.Integerizer`: nothing goes up, the top is
    :func:`nonnegative_top` to the cut (invariants ``==``), each partition
    :func:`nonnegative_partition` from its cut nodes' integers where its piece is. Uniforms
    are keyed by level and global node: the integers equal :meth:`whole`'s bit for
    bit. Biased, without standard errors (:data:`BIASED_NOTE`)."""

    name: ClassVar[str] = "nonnegative"
    release: PartitionedRelease
    schema: Schema
    rng: KeyedRNG
    invariants: tuple
    label: str = LABEL
    tol: float = TOL
    top_counts: list = dataclasses.field(default_factory=list)
    message_fn = staticmethod(no_message)

    @classmethod
    def of(
        cls,
        release: PartitionedRelease,
        rng: KeyedRNG,
        invariants: Sequence[Invariant] = (),
        *,
        label: str = LABEL,
        tol: float = TOL,
    ) -> NonNegativeIntegerizer:
        """The non-negative product of ``release`` where its pieces are; ``invariants`` at
        the root and its children (SpecError elsewhere, from the top)."""
        schema, _, invs = flat_products(release.hierarchy, release.cells, [], invariants)
        return cls(release, schema, rng, tuple(invs), label, tol)

    @staticmethod
    def whole(release: Release, rng: KeyedRNG, invariants: Sequence[Invariant] = ()) -> Release:
        """The same product in one process (every level in one :func:`nonnegative_top`)."""
        schema, _, invs = flat_products(release.hierarchy, release.cells, [], invariants)
        got = nonnegative_top(release.hierarchy, schema, release.estimates, rng, invariants=invs)
        return _nonnegative_release(release, got.counts)

    def up(self, pos: int) -> Task:
        return Task(same, None)

    def top(self, messages: list) -> None:
        r = self.release
        self.top_counts = nonnegative_top(
            r.hierarchy, self.schema, r.estimates, self.rng,
            invariants=self.invariants, label=self.label, tol=self.tol,
        ).counts  # fmt: skip

    def partition(self, pos: int, state: Any | None) -> Task:
        r = self.release
        h, cut, p = r.hierarchy, r.cut, r.partitions[pos]
        forest, lo = Forest.of(h, cut, p.ranges).without_codes(), tuple(a for a, _ in p.ranges)
        keys = partition_keys(self.rng, forest, lo, self.schema.n_cells, label=self.label)
        item = (forest, lo, r.pieces[pos], self.top_counts[cut][slice(*p.units)], keys)
        extra = (tuple(h.sizes[cut:]), self.schema, self.label, self.tol)
        return Task(_nonnegative_task, item, extra)

    down = partition

    def finish(self, pieces: list) -> PartitionedRelease:
        """The non-negative release kept per partition."""
        return dataclasses.replace(
            _nonnegative_release(self.release, self.top_counts), pieces=pieces
        )
