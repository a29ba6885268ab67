"""TopDown-style integers of a real-valued release, as an integer step on the partition driver.

The Census Bureau's TopDown algorithm (Abowd et al. 2022, §4) makes a level's histograms
non-negative integers given the parent's: per parent, the multi-pass non-negative least
squares, then the multi-pass controlled rounding
(:func:`~censusdp.estimation.topdown.schema.topdown_forest`). :class:`TopDownIntegerizer`
applies those solves to a release's estimates — at every level one ``detailed`` measurement,
the release's histograms with equal weights — so any real-valued release (the GLS one, say)
gets the TopDown-style post-processing: non-negative integers, consistent, invariants met
with ``==``. As a :class:`~censusdp.pipelines.partition_driver.Integerizer` nothing goes up,
the top solves the levels down to the cut, and each partition its subtrees below it, where
its piece is. Every parent's problem is a pure function of its inputs (no randomness), so
the partitioned integers equal :meth:`TopDownIntegerizer.whole`'s bit for bit on every
executor (``tests/contracts/test_integerizers.py``).

Like the baseline, the product is biased for small areas (counts truncated at zero pushed
up, the fixed parent totals pushing large areas down) and carries no standard errors; it is
post-processing of the release, so its privacy statement is the release's.

References
----------
Abowd, J. M. et al. (2022), "The 2020 Census Disclosure Avoidance System TopDown
Algorithm", Harvard Data Science Review, Special Issue 2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from censusdp.estimation.release import Release
from censusdp.estimation.topdown.flat import flat_products
from censusdp.estimation.topdown.schema import (
    TopDownPasses,
    default_ordering,
    propagate_product_invariants,
    topdown_forest,
)
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import Invariant
from censusdp.pipelines.partition_driver import Task, no_message, register_integerizer, same
from censusdp.pipelines.partitioned_release import PartitionedRelease, ReleasePiece
from censusdp.rng import KeyedRNG

__all__ = ["NOTE", "TopDownIntegerizer"]

#: The statement's note on the product.
NOTE = (
    "TopDown-style product: non-negative integers, consistent, invariants exact, made from "
    "the release's estimates by the per-parent solves of the 2020 TopDown algorithm; it is "
    "biased for small areas and has no standard errors"
)

Fitted = list[dict[str, tuple[ProductQuery, np.ndarray]]]


def _problem(
    hierarchy: Hierarchy, cells: Sequence[str], invariants: Sequence[Invariant]
) -> tuple[ProductQuery, TopDownPasses, Fitted]:
    """The ``detailed`` query, the passes (fit it, round totals then cells) and the
    invariants per level, propagated upwards, on ``Schema.flat(cells)``."""
    schema, _, invs = flat_products(hierarchy, cells, [], invariants)
    ordering = default_ordering(schema, hierarchy.names, [["detailed"]] * hierarchy.depth)
    passes = TopDownPasses.of(schema, ordering)
    return (
        ProductQuery.parse(schema, "detailed"),
        passes,
        propagate_product_invariants(hierarchy, invs),
    )


def _fitted(detailed: ProductQuery, estimates: Sequence[np.ndarray]) -> list[list[tuple]]:
    """Per level, the release's histograms as one ``detailed`` measurement of weight 1."""
    return [[(detailed, np.asarray(e, np.float64), 1.0)] for e in estimates]


def _topdown_task(item: tuple, detailed: ProductQuery, passes: TopDownPasses) -> ReleasePiece:
    """``item = (forest, cut counts, piece, invariants)`` of one partition: its levels below
    the cut solved from its cut nodes' integers."""
    forest, top, piece, invs = item
    meas = [[], *_fitted(detailed, piece.estimates)]
    counts, _ = topdown_forest(forest, top, meas, invs, passes)
    return ReleasePiece(tuple(counts[1:]), None)


def _release(release: Release | PartitionedRelease, counts: Sequence[np.ndarray]) -> Any:
    """``release`` with ``counts`` (levels from the root) as its estimates: integer, no
    variances, its statement noting the product (:data:`NOTE`)."""
    return dataclasses.replace(
        release, integer=True, estimates=list(counts), variances=None, covariances=None,
        sums=None, privacy=release.privacy.with_notes(NOTE),
        diagnostics={**release.diagnostics, "rounding": TopDownIntegerizer.name},
    )  # fmt: skip


@register_integerizer
@dataclass(eq=False)
class TopDownIntegerizer:
    """TopDown-style integers of a release kept per partition (module docstring): the top
    solves the levels ``0 .. cut``, each partition its levels below the cut from its cut
    nodes' integers. ``rng`` is not used: the solves are deterministic."""

    name: ClassVar[str] = "topdown"
    release: PartitionedRelease
    detailed: ProductQuery
    passes: TopDownPasses
    invariants: Fitted
    top_counts: list = dataclasses.field(default_factory=list)
    message_fn = staticmethod(no_message)

    @classmethod
    def of(
        cls, release: PartitionedRelease, rng: KeyedRNG, invariants: Sequence[Invariant] = ()
    ) -> TopDownIntegerizer:
        """The TopDown-style integers of ``release`` where its pieces are."""
        return cls(release, *_problem(release.hierarchy, release.cells, invariants))

    @staticmethod
    def whole(release: Release, rng: KeyedRNG, invariants: Sequence[Invariant] = ()) -> Release:
        """The same product in one process (every level in one :func:`topdown_forest`)."""
        h = release.hierarchy
        detailed, passes, invs = _problem(h, release.cells, invariants)
        counts, _ = topdown_forest(
            whole_forest(h), None, _fitted(detailed, release.estimates), invs, passes
        )
        return _release(release, counts)

    def up(self, pos: int) -> Task:
        return Task(same, None)

    def top(self, messages: list) -> None:
        r = self.release
        self.top_counts, _ = topdown_forest(
            whole_forest(r.hierarchy, 0, r.cut), None, _fitted(self.detailed, r.estimates),
            self.invariants[: r.cut + 1], self.passes,
        )  # fmt: skip

    def partition(self, pos: int, state: Any | None) -> Task:
        r = self.release
        h, cut, p = r.hierarchy, r.cut, r.partitions[pos]
        invs = [
            {n: (q, v[slice(*p.range(k))]) for n, (q, v) in self.invariants[k].items()}
            for k in range(cut, h.depth)
        ]
        item = (
            Forest.of(h, cut, p.ranges),
            self.top_counts[cut][slice(*p.units)],
            r.pieces[pos],
            invs,
        )
        return Task(_topdown_task, item, (self.detailed, self.passes))

    down = partition

    def finish(self, pieces: list) -> PartitionedRelease:
        """The TopDown-style release kept per partition."""
        return dataclasses.replace(_release(self.release, self.top_counts), pieces=pieces)
