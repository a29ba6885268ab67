"""The structured GLS streamed partition by partition: the block level is never held whole.

The hierarchy is cut at a level (county for a state; the units of
:func:`~censusdp.pipelines.partition.partition_units`). Three passes:

1. **Upward, per partition.** The partition's measurements (levels at and below the cut) come
   from a caller's function of the partition — generated there (noise is a pure function of
   the key and the node: the keyed ``measure/<level>/<query>`` streams let any partition
   draw its own) or sliced from values held whole (:func:`given_values`). The upward pass of
   every block of the marginal basis runs inside the partition
   (:func:`~censusdp.estimation.structured_gls.structured_upward`) and leaves a small
   message per block at the partition's cut-level nodes: their mean, covariance and flat
   directions.
2. **Top.** The levels above the cut are solved in memory from their own measurements, the
   invariants there and the messages (:func:`~censusdp.estimation.structured_gls.structured_top`).
3. **Downward, per partition,** from the partition's cached upward state when the memory
   budget ``cache_bytes`` allowed keeping it, or from its upward pass run again (the
   measurement function is called again: it must return the same values). The partition's
   levels below the cut — estimates and covariance blocks, a
   :class:`~censusdp.estimation.structured_gls.StructuredPiece` — go to the caller's
   ``on_partition`` (write, summarise, round) and are dropped.

Memory does not grow with the number of partitions beyond the messages (one per cut-level
node and block) and whatever the cache is allowed to hold. The result equals
:func:`~censusdp.estimation.structured_gls.structured_gls` on the whole tree bit for bit
(``np.array_equal``), in any partition order: every per-node operation gives a node the same
bits whatever nodes it is batched with (the moves in and out of the basis are stacks of
per-node products, :func:`~censusdp.estimation.marginal_basis.node_axis_product`, and the
passes are those of :func:`~censusdp.estimation.gls.gls_upward` / ``gls_downward``).

Rounding plugs in at ``on_partition``: the levels down to the cut (``StreamResult.top``) are
rounded first from their estimates, then each partition's levels given its cut-level nodes'
integer cells (the top-down per-partition scheme of ``estimation/structured_rounding.py``).

References
----------
Hay, Rastogi, Miklau & Suciu (2010). Boosting the accuracy of differentially private
    histograms through consistency. PVLDB 3(1) — the two-pass tree algorithm.
Rauch, Tung & Striebel (1965). Maximum likelihood estimates of linear dynamic systems.
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm —
    geographic partitioning of the block-level work.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.estimation.gls import Forest, whole_forest
from censusdp.estimation.marginal_basis import BlockDiagonal
from censusdp.estimation.structured_gls import (
    EUCLIDEAN_NOTE,
    Geometry,
    StructuredPiece,
    StructuredUpward,
    check_residuals,
    check_structured_invariants,
    structured_downward,
    structured_output,
    structured_residuals,
    structured_setup,
    structured_top,
    structured_upward,
)
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import floating_point_note
from censusdp.mechanisms.product_measure import (
    ProductInvariant,
    ProductMeasurement,
    checked_values,
)
from censusdp.pipelines.partition import Partition
from censusdp.schema import Schema

__all__ = ["StreamResult", "given_values", "structured_stream"]

#: ``measure(partition)``: per measurement at or below the cut (in order), its values at the
#: partition's nodes of its level, ``(hi − lo, n_rows)``.
MeasureFn = Callable[[Partition], Sequence[np.ndarray]]


@dataclass(frozen=True, eq=False)
class StreamResult:
    """What stays after a streamed run: the levels down to the cut and the statement.

    Attributes
    ----------
    top : StructuredPiece
        Levels ``0 .. cut``, every node (estimates and covariance blocks).
    privacy : PrivacyStatement
        Derived from the measurements, with the invariants and geometry.
    diagnostics : dict
        Per-stage seconds (``measure`` is the time spent in the caller's function,
        ``callback`` in ``on_top`` and ``on_partition``), residuals, partitions cached and regenerated,
        bytes of the messages and of the largest cached state.
    """

    top: StructuredPiece
    privacy: PrivacyStatement
    diagnostics: dict


def _ahead(fn: Callable, items: Sequence, workers: int) -> Iterator:
    """``fn(item)`` for each item, in order, with at most ``workers`` items computed ahead
    by a thread pool (one thread, none ahead: plain calls in this thread)."""
    if workers <= 1:
        yield from (fn(item) for item in items)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def given_values(measurements: Sequence[ProductMeasurement], hierarchy: Hierarchy, cut: int):
    """The measurement function of values held whole: each measurement at or below ``cut``
    sliced to the partition's range of its level (views, no copy)."""
    low = [m for m in measurements if hierarchy.level_index(m.level) >= cut]

    def measure(part: Partition) -> list[np.ndarray]:
        out = []
        for m in low:
            lo, hi = part.range(hierarchy.level_index(m.level))
            out.append(m.values[lo:hi])
        return out

    return measure


def _check_partitions(hierarchy: Hierarchy, partitions: Sequence[Partition]) -> int:
    """The cut level of ``partitions``; they must tile it in order, each with every level."""
    if not partitions:
        raise SpecError("structured_stream needs at least one partition")
    cut = partitions[0].cut
    depth = hierarchy.depth
    expect = 0
    for p in partitions:
        if p.cut != cut or len(p.ranges) != depth - cut:
            raise SpecError(
                f"partition {p.index}: every partition must cut level {hierarchy.names[cut]!r} "
                "and hold its ranges down to the leaves (use partition_units)"
            )
        if p.units[0] != expect:
            raise SpecError(
                f"partition {p.index} starts at {hierarchy.names[cut]} node {p.units[0]}, not "
                f"{expect}: partitions must tile the cut level in node order (partition_units)"
            )
        expect = p.units[1]
    if expect != hierarchy.sizes[cut]:
        raise SpecError(
            f"the partitions cover {expect} of the {hierarchy.sizes[cut]} nodes of level "
            f"{hierarchy.names[cut]!r}"
        )
    return cut


def structured_stream(
    hierarchy: Hierarchy,
    schema: Schema,
    measurements: Sequence[ProductMeasurement],
    measure: MeasureFn,
    partitions: Sequence[Partition],
    invariants: Sequence[ProductInvariant] = (),
    on_partition: Callable[[StructuredPiece], None] | None = None,
    *,
    on_top: Callable[[StructuredPiece], None] | None = None,
    geometry: Geometry = "weighted",
    privacy: PrivacyStatement | None = None,
    delta: float | None = None,
    acknowledge_exact_release: bool = False,
    cache_bytes: int = 0,
    order: Sequence[int] | None = None,
    workers: int = 1,
) -> StreamResult:
    """The structured GLS of :func:`~censusdp.estimation.structured_gls.structured_gls`,
    partition by partition.

    Parameters
    ----------
    hierarchy, schema, invariants, geometry, privacy, delta, acknowledge_exact_release
        As for ``structured_gls`` (invariants are given whole: they are small).
    measurements : sequence of ProductMeasurement
        Every measurement, in the order ``structured_gls`` would get them (the order of the
        sums). Those above the cut carry their values; the values of those at or below the
        cut are not read (they may be empty) — ``measure`` gives them per partition.
    measure : callable
        ``measure(partition)`` → per measurement at or below the cut, in order, its values
        at the partition's nodes of its level (:func:`given_values` for values held whole).
        Called once per partition, and again in the downward pass for partitions whose
        upward state was not cached: it must return the same values.
    partitions : sequence of Partition
        :func:`~censusdp.pipelines.partition.partition_units` of one cut level, in node order.
    on_partition : callable, optional
        Receives each partition's levels below the cut as a
        :class:`~censusdp.estimation.structured_gls.StructuredPiece`; dropped afterwards.
    on_top : callable, optional
        Receives the levels ``0 .. cut`` (every node) once, after they are solved and before
        the first partition's downward pass (e.g. to round them top-down, so each partition
        can then be rounded from its cut nodes' integers in ``on_partition``).
    cache_bytes : int
        Memory the cached upward states may take; partitions beyond it are recomputed in the
        downward pass instead of held (0: recompute all).
    order : sequence of int, optional
        Order in which partitions are processed (positions in ``partitions``); the result
        does not depend on it.
    workers : int
        Threads running partitions' passes at once (numpy releases the GIL in the large
        products); at most ``workers`` partitions are computed ahead of the one being
        consumed, results are taken in ``order`` and callbacks run one at a time in this
        thread, so the output is the same bit for bit for any number of workers. Per-stage
        seconds are then summed over threads.

    Returns
    -------
    StreamResult

    Raises
    ------
    SpecError, DataError, BudgetError
        As ``structured_gls``; also partitions that do not tile the cut level, and values
        from ``measure`` of the wrong shape or non-finite (naming the partition).
    """
    t_start = time.perf_counter()
    cut = _check_partitions(hierarchy, partitions)
    names = hierarchy.names
    levels = [hierarchy.level_index(m.level) for m in measurements]
    for m, k in zip(measurements, levels, strict=True):
        if k < cut:
            checked_values(m.values, hierarchy.sizes[k], m.query, "measurement", names[k])
        elif m.node_variance is not None:
            raise SpecError(
                f"measurement {m.query.name!r} at level {names[k]!r}: per-node variances "
                "below the cut are not streamed; use structured_gls"
            )
    setup = structured_setup(
        hierarchy, schema, measurements, invariants, geometry=geometry, privacy=privacy,
        delta=delta, acknowledge_exact_release=acknowledge_exact_release, check_values=False,
    )  # fmt: skip
    invs = check_structured_invariants(hierarchy, schema, invariants)
    low = [i for i, k in enumerate(levels) if k >= cut]
    order = list(range(len(partitions))) if order is None else [int(i) for i in order]
    if sorted(order) != list(range(len(partitions))):
        raise SpecError("order must list every partition position once")
    t = dict(setup=time.perf_counter() - t_start, measure=0.0, up=0.0, top=0.0, down=0.0,
             output=0.0, callback=0.0)  # fmt: skip

    def upward(p: Partition) -> StructuredUpward:
        t0 = time.perf_counter()
        vals = list(measure(p))
        t["measure"] += time.perf_counter() - t0
        if len(vals) != len(low):
            raise SpecError(
                f"partition {p.index}: measure returned {len(vals)} arrays for the "
                f"{len(low)} measurements at or below level {names[cut]!r}"
            )
        t0 = time.perf_counter()
        full: list = [None] * len(measurements)
        for i, v in zip(low, vals, strict=True):
            k, q = levels[i], measurements[i].query
            lo, hi = p.range(k)
            full[i] = checked_values(v, hi - lo, q, f"partition {p.index}: measurement", names[k])
        meas_values = [
            [full[i] if levels[i] == cut + j else None for i in range(len(measurements))]
            for j in range(hierarchy.depth - cut)
        ]
        inv_values = [
            [inv.values[slice(*p.range(inv.level))] if inv.level == cut + j else None
             for inv in invs]
            for j in range(hierarchy.depth - cut)
        ]  # fmt: skip
        up = structured_upward(
            setup, Forest.of(hierarchy, cut, p.ranges), p.ranges, meas_values, inv_values
        )
        t["up"] += time.perf_counter() - t0
        return up

    # one projector and one cache of identified rows shared by every piece
    identified = BlockDiagonal(setup.basis, setup.ident)
    rows_cache: dict = {}
    messages: dict[int, dict] = {}
    cached: dict[int, StructuredUpward] = {}
    used = largest = 0
    for pos, up in zip(order, _ahead(lambda q: upward(partitions[q]), order, workers), strict=True):
        messages[pos] = up.messages()
        size = up.nbytes()
        if used + size <= cache_bytes:
            cached[pos] = up
            used += size
            largest = max(largest, size)
        del up

    t0 = time.perf_counter()
    top_rows = [(0, n) for n in hierarchy.sizes[: cut + 1]]
    top_meas = [
        [m.values if levels[i] == j and j < cut else None for i, m in enumerate(measurements)]
        for j in range(cut + 1)
    ]
    top_invs = [[inv.values if inv.level == j else None for inv in invs] for j in range(cut + 1)]
    top_forest = whole_forest(hierarchy, 0, cut)
    top_up = structured_upward(
        setup, top_forest, top_rows, top_meas, top_invs,
        bottom=[messages[pos] for pos in range(len(partitions))],
    )  # fmt: skip
    message_bytes = sum(
        a.nbytes
        for msg in messages.values()
        for u in msg.values()
        if u is not None
        for a in (u.m, u.P, u.N)
        if a is not None
    )
    del messages
    smoothed_top = structured_top(setup, top_up)
    del top_up
    t["top"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    top_est, top_cov = structured_output(
        setup, smoothed_top, range(cut + 1), hierarchy.sizes[: cut + 1]
    )
    cons, inv_res, inv_val, worst = structured_residuals(setup, top_forest, top_rows, top_est, invs)
    t["output"] += time.perf_counter() - t0

    top = StructuredPiece(
        names=tuple(names[: cut + 1]),
        first=0,
        ranges=tuple(top_rows),
        schema=schema,
        basis=setup.basis,
        estimates=tuple(top_est),
        covariances=None if top_cov is None else tuple(top_cov),
        identified=identified,
        _rows=rows_cache,
    )
    if on_top is not None:
        t0 = time.perf_counter()
        on_top(top)
        t["callback"] += time.perf_counter() - t0

    def downward(pos: int) -> tuple:
        p = partitions[pos]
        up = cached.pop(pos, None)
        fresh = up is None
        if fresh:
            up = upward(p)
        t0 = time.perf_counter()
        lo, hi = p.units
        cut_blocks = {
            mask: None if s is None else (s[0][cut][lo:hi], _rows_of(s[1][cut], lo, hi))
            for mask, s in smoothed_top.items()
        }
        smoothed = structured_downward(setup, up, cut_blocks)
        forest = up.forest
        del up
        t["down"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        est, cov = structured_output(setup, smoothed, range(1, forest.depth), forest.sizes[1:])
        del smoothed
        residuals = structured_residuals(setup, forest, p.ranges, [top_est[cut][lo:hi], *est], invs)
        piece = StructuredPiece(
            names=tuple(names[cut + 1 :]),
            first=cut + 1,
            ranges=tuple(p.ranges[1:]),
            schema=schema,
            basis=setup.basis,
            estimates=tuple(est),
            covariances=None if cov is None else tuple(cov),
            identified=identified,
            _rows=rows_cache,
            partition=p.index,
        )
        t["output"] += time.perf_counter() - t0
        return piece, residuals, fresh

    regenerated = 0
    for piece, (c, r, v, w), fresh in _ahead(downward, order, workers):
        regenerated += fresh
        cons = max(cons, c)
        inv_val = max(inv_val, v)
        if r >= inv_res:
            inv_res, worst = r, w
        if on_partition is not None:
            t0 = time.perf_counter()
            on_partition(piece)
            t["callback"] += time.perf_counter() - t0
        del piece
    check_residuals(inv_res, inv_val, worst)

    diagnostics = {
        "estimator": "structured_gls (streamed)",
        "geometry": geometry,
        "cut_level": names[cut],
        "partitions": len(partitions),
        "partitions_cached": len(partitions) - regenerated,
        "partitions_regenerated": regenerated,
        "cache_bytes_used": used,
        "largest_cached_state_bytes": largest,
        "message_bytes": message_bytes,
        "unidentified": setup.dropped,
        "max_consistency_residual": cons,
        "max_invariant_residual": inv_res,
        "max_invariant_value": inv_val,
        **{f"seconds_{k}": v for k, v in t.items()},
        "seconds": time.perf_counter() - t_start,
    }
    if setup.vscale is None:
        diagnostics["note"] = EUCLIDEAN_NOTE
    return StreamResult(top, floating_point_note(setup.statement), diagnostics)


def _rows_of(P: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` of per-node matrices (one shared matrix stays as it is)."""
    return P if P.shape[0] == 1 else P[lo:hi]
