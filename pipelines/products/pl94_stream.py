"""The streamed ``pl94`` release engine: measure → structured GLS → unbiased rounding, per partition.

The 2020 redistricting workload (docs/design.md § Census histograms) on a geography of any size, never holding a level
below the cut whole. The hierarchy is cut at a level (county by default; the partitions of
:func:`~censusdp.pipelines.partition.partition_units`) and the person histogram comes from a
*source* that gives any leaf range's sparse ``(leaf, cell, count)`` triples
(:class:`HistogramSource`: the synthetic generator :class:`SyntheticHistogram`, a file read
whole such as :class:`~censusdp.pipelines.io.ppmf.PPMFHistogram` through :class:`SparseHistogram`).
Four passes:

1. **Truth above the cut.** Each partition's leaves are summed to its cut-level nodes (exact
   int64), then up to the root: the histograms of the levels above the cut, small (3,221
   counties × 2,016 cells nationally). Their queries are answered and measured there, whole
   (:func:`~censusdp.mechanisms.queries.measure_range`), and the invariants
   (e.g. nation and state totals) are computed from them.
2. **Upward, per partition** (:func:`~censusdp.pipelines.structured_stream.structured_stream`):
   :class:`PartitionMeasure` regenerates the partition's histogram from the source, sums it
   to the partition's levels at and below the cut, answers every query
   (:func:`~censusdp.mechanisms.product_query.apply_queries`) and draws its noise from the keyed streams
   ``measure/<level>/<query>`` at the partition's own node range. Noise is a pure function of
   the key and the node, so the draws equal those of a whole-level measurement bit for bit,
   and the same function called again in the downward pass returns the same values. Only the
   partition's own nodes are drawn, not the keyed chunks of 65,536 nodes they fall in (the
   exact discrete Gaussian starts mid-chunk: :meth:`~censusdp.mechanisms.laws.NoiseLaw.
   sample_window`); partitions need not align with chunks, which counties do not.
3. **Top.** The levels down to the cut are solved from their measurements, the invariants and
   the partitions' messages, then rounded top-down (:func:`~censusdp.estimation.
   structured_rounding.round_structured_top`, the invariants ``==``) and handed to ``on_top``.
4. **Downward, per partition.** Each partition is smoothed and rounded from its cut nodes'
   integers (:func:`~censusdp.estimation.integer.controlled.round_structured_partition`: every
   cell ⌊x⌋ or ⌈x⌉, children summing to their parent cell by cell) on the worker that smoothed
   it, then handed to ``on_partition`` as a :class:`PartitionRelease` (the GLS piece with its
   covariance blocks, and the integer cell tensors of its levels) in order, in the calling
   thread, and dropped.

Memory is the working sets of the partitions in flight plus the levels above the cut, the
cached upward states and one small message per cut-level node: it does not grow with the
number of leaves, and ``memory_bytes`` bounds the first two together
(:class:`Pl94StreamOptions`). With ``nonnegative`` the non-negative product
(:mod:`~censusdp.estimation.integer.nonnegative`) is made beside the unbiased one, each
partition where it is rounded, a few of the cut's children's subtrees at a time. The output is the
same bit for bit for any partitioning of the cut level, partition order and number of
workers (keyed noise, keyed rounding, per-node GLS operations that do not depend on the batch;
:mod:`~censusdp.pipelines.structured_stream`), and equals the in-memory
:func:`~censusdp.estimation.gls.structured.structured_gls` and
:func:`~censusdp.estimation.integer.controlled.round_structured` on the same measurements.

Consumers plug in through ``on_top``/``on_partition``: :class:`ReleaseChecks` (the exactness
checks of a run), :class:`StandardErrorSummary` (SEs of chosen tables at every node) and the
release store of :mod:`censusdp.pipelines.io.pl94_store` are three.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 — the workload, its geographic partitioning.
U.S. Census Bureau (2021). DAS_2020_Redistricting_Production_Code (strategy and allocation).
Canonne, C., Kamath, G. & Steinke, T. (2020). The Discrete Gaussian for Differential Privacy.
Gao, Gong & Yu (2022). Subspace Differential Privacy, Algorithm 4 (a shared key, each agent
    regenerating its own noise).
Madow, W. G. (1949). On the theory of systematic sampling II — the unbiased rounding.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import scipy.sparse as sp

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.estimation.gls.structured import StructuredPiece
from censusdp.estimation.integer.controlled import LABEL as ROUNDING_LABEL
from censusdp.estimation.integer.controlled import (
    PartitionOptions,
    RoundedLevels,
    partition_streams,
    replicate_errors,
    replicate_keys,
    replicate_variance,
    round_structured_partition,
    round_structured_top,
)
from censusdp.estimation.integer.nonnegative import (
    nonnegative_partition,
    nonnegative_top,
    partition_keys,
)
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.forest import Forest
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.mechanisms.product_measure import ProductInvariant, ProductMeasurement
from censusdp.mechanisms.product_query import ProductQuery, QueryRows, apply_queries
from censusdp.mechanisms.queries import measure_range, stream_label
from censusdp.options import with_keywords
from censusdp.pipelines.execute import Executor, ordered_ahead
from censusdp.pipelines.partition import Partition, partition_units
from censusdp.pipelines.structured_stream import (
    DEFAULT_CACHE_BYTES,
    StreamOptions,
    StreamResult,
    structured_stream,
)
from censusdp.rng import KeyedRNG, SubKeys, chunk_range
from censusdp.schema import Schema
from censusdp.timing import CPU_PREFIX, stage

__all__ = [
    "HistogramSource",
    "OnePartitionMeasure",
    "PartitionChecks",
    "PartitionMeasure",
    "PartitionRelease",
    "Pl94StreamOptions",
    "Pl94StreamResult",
    "ReleaseChecks",
    "ReleaseSink",
    "RoundingInput",
    "Sinks",
    "SparseHistogram",
    "StandardErrorSummary",
    "SyntheticHistogram",
    "SyntheticRange",
    "TopRelease",
    "county_measurements",
    "exact_histograms",
    "fingerprint",
    "measure_whole",
    "slice_check",
    "stream_pl94",
]

#: Plan entries: (level name, query, noise law), as :func:`~censusdp.estimation.gls.predict.allocation_plan`.
Plan = Sequence[tuple[str, ProductQuery, NoiseLaw]]

#: Blocks whose dense histograms are built at once inside a partition (16 KB each for pl94):
#: bounds a partition's transient memory whatever its size.
DENSE_LEAVES = 4096

#: A ``pl94`` partition's working set per block in the downward pass (GLS piece, rounding,
#: checks, store), the estimate :attr:`Pl94StreamOptions.memory_bytes` budgets with:
#: tracemalloc's peak of one 32,031-block partition was 2.11 GB (66 KB per block, at the
#: GLS output; resident 2.45 GB with the interpreter's 0.45 GB), the non-negative product
#: made in chunks (:data:`NONNEGATIVE_LEAVES`) adding its integers and tables.
BLOCK_BYTES = 100_000

#: Leaves whose non-negative product is made at once inside a partition (runs of the cut's
#: children's subtrees: :meth:`RoundingInput.nonnegative_release`), bounding its
#: transient memory whatever the partition's size.
NONNEGATIVE_LEAVES = 8192

#: The label the rounding's keyed streams descend from (``rng.child(ROUNDING)``).
ROUNDING = "rounding"

#: The label the non-negative product's keyed streams descend from
#: (``rng.child(NONNEGATIVE)``, :attr:`Pl94StreamOptions.nonnegative`).
NONNEGATIVE = "nonnegative"


# ----------------------------------------------------------------------------- sources
@runtime_checkable
class HistogramSource(Protocol):
    """A person histogram over the leaves of a hierarchy, any leaf range at a time.

    ``source(lo, hi)`` returns ``(leaf, cell, count)``: int64 arrays, one entry per non-empty
    (leaf, cell) of leaves ``[lo, hi)``, sorted by leaf (global leaf indices) then cell, cells
    flat in the schema's C order. It must return the same arrays every time it is called
    for the same range (the downward pass regenerates a partition), and be safe to call from
    several threads at once.
    """

    def __call__(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


@dataclass(frozen=True, eq=False)
class SyntheticHistogram:
    """The synthetic ``pl94`` histogram of :func:`~censusdp.hierarchy.synthetic.pl94_histogram`
    as a source: persons per leaf, the seed; any leaf range drawn alone (keyed streams).

    Parameters
    ----------
    populations : numpy.ndarray
        Persons per leaf (int64), e.g. ``synthetic_us(...).leaf_counts[:, 0]``.
    seed : int
        Seed of the synthetic data (not of the noise).
    """

    populations: np.ndarray
    seed: int
    _offsets: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from censusdp.hierarchy.synthetic import block_populations, person_offsets

        pop = block_populations(self.populations)
        object.__setattr__(self, "populations", pop)
        object.__setattr__(self, "_offsets", person_offsets(pop))

    def __call__(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from censusdp.hierarchy.synthetic import histogram_range

        if not 0 <= lo <= hi <= self.populations.size:
            raise ValueError(f"leaf range [{lo}, {hi}) is outside [0, {self.populations.size})")
        return histogram_range(self.populations, self._offsets, self.seed, int(lo), int(hi))

    def restrict(self, lo: int, hi: int) -> SyntheticRange:
        """Leaves ``[lo, hi)`` only (what a partition's task is sent)."""
        if not 0 <= lo <= hi <= self.populations.size:
            raise ValueError(f"leaf range [{lo}, {hi}) is outside [0, {self.populations.size})")
        return SyntheticRange(
            int(lo), self.populations[lo:hi], self._offsets[lo : hi + 1],
            int(self._offsets[-1]), self.seed,
        )  # fmt: skip


@dataclass(frozen=True, eq=False)
class SyntheticRange:
    """Leaves ``[lo, lo + populations.size)`` of a :class:`SyntheticHistogram`, the same
    entries (:meth:`SyntheticHistogram.restrict`).

    Attributes
    ----------
    lo : int
        Global index of the first leaf.
    populations, offsets : numpy.ndarray
        The leaves' persons and the number of the first person of each leaf and past the last.
    persons : int
        Persons of the whole histogram (the length of its keyed stream).
    seed : int
    """

    lo: int
    populations: np.ndarray
    offsets: np.ndarray
    persons: int
    seed: int

    def __call__(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from censusdp.hierarchy.synthetic import histogram_range

        a, b = lo - self.lo, hi - self.lo
        if not 0 <= a <= b <= self.populations.size:
            raise ValueError(
                f"leaf range [{lo}, {hi}) is outside the restricted range "
                f"[{self.lo}, {self.lo + self.populations.size})"
            )
        # histogram_range reads offsets[start], offsets[stop] and the total offsets[-1]
        offsets = np.append(self.offsets, self.persons)
        leaf, cell, count = histogram_range(self.populations, offsets, self.seed, a, b)
        return leaf + self.lo, cell, count


@dataclass(frozen=True, eq=False)
class SparseHistogram:
    """A sparse histogram held whole as a source (e.g. a PPMF file's, :meth:`of`).

    Attributes
    ----------
    leaf, cell, count : numpy.ndarray
        int64, sorted by leaf then cell (as :class:`~censusdp.pipelines.io.ppmf.PPMFHistogram`).
    """

    leaf: np.ndarray
    cell: np.ndarray
    count: np.ndarray

    def __post_init__(self) -> None:
        leaf = np.asarray(self.leaf, np.int64)
        if not (leaf.shape == np.shape(self.cell) == np.shape(self.count)) or leaf.ndim != 1:
            raise DataError("sparse histogram: leaf, cell and count must be 1-D of one length")
        if leaf.size and np.any(np.diff(leaf) < 0):
            raise DataError("sparse histogram: entries must be sorted by leaf")
        object.__setattr__(self, "leaf", leaf)
        object.__setattr__(self, "cell", np.asarray(self.cell, np.int64))
        object.__setattr__(self, "count", np.asarray(self.count, np.int64))

    @classmethod
    def of(cls, histogram) -> SparseHistogram:
        """The source of an object with ``block``, ``cell`` and ``count`` arrays
        (:class:`~censusdp.pipelines.io.ppmf.PPMFHistogram`)."""
        return cls(histogram.block, histogram.cell, histogram.count)

    def __call__(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = np.searchsorted(self.leaf, [lo, hi])
        return self.leaf[a:b], self.cell[a:b], self.count[a:b]

    def restrict(self, lo: int, hi: int) -> SparseHistogram:
        """The entries of leaves ``[lo, hi)`` only (what a partition's task is sent)."""
        return SparseHistogram(*self(lo, hi))


def _checked_entries(
    entries: tuple[np.ndarray, np.ndarray, np.ndarray], lo: int, hi: int, n_cells: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    leaf, cell, count = (np.asarray(a) for a in entries)
    if not (leaf.shape == cell.shape == count.shape) or leaf.ndim != 1:
        raise DataError(
            f"histogram source, leaves [{lo}, {hi}): leaf, cell and count must be 1-D arrays "
            "of one length"
        )
    if leaf.size:
        if (
            leaf.dtype.kind not in "iu"
            or cell.dtype.kind not in "iu"
            or count.dtype.kind not in "iu"
        ):
            raise DataError(
                f"histogram source, leaves [{lo}, {hi}): leaf, cell and count must be integers"
            )
        if int(leaf.min()) < lo or int(leaf.max()) >= hi:
            raise DataError(
                f"histogram source: an entry for leaves [{lo}, {hi}) lies outside that range; "
                "return only the range's leaves, by global index"
            )
        if int(cell.min()) < 0 or int(cell.max()) >= n_cells:
            raise DataError(
                f"histogram source, leaves [{lo}, {hi}): a cell index is outside [0, {n_cells})"
            )
        if int(count.min()) < 0:
            raise DataError(f"histogram source, leaves [{lo}, {hi}): a count is negative")
    return (
        leaf.astype(np.int64, copy=False),
        cell.astype(np.int64, copy=False),
        count.astype(np.int64, copy=False),
    )


# ----------------------------------------------------------------------------- queries
def answers_from_entries(
    queries: Sequence[ProductQuery],
    node: np.ndarray,
    cell: np.ndarray,
    count: np.ndarray,
    n: int,
    n_cells: int,
) -> dict[str, np.ndarray]:
    """Exact answers of every query on the histograms given as entries ``(node, cell,
    count)`` of ``n`` nodes (repeats add), ``{name: (n, n_rows)}`` int64.

    The same integers as :func:`~censusdp.mechanisms.product_query.apply_queries` on the dense histograms, by one sparse
    product of the entries with the queries' stacked 0/1 matrices (:meth:`ProductQuery.
    sparse`): a block holds a few dozen persons' cells of thousands, so this never builds
    the ``(n, n_cells)`` histograms.
    """
    x = sp.csr_matrix(
        (count.astype(np.int64, copy=False), (node, cell)), shape=(n, n_cells), dtype=np.int64
    )
    y = (x @ _stacked_columns(queries)).toarray()
    bounds = np.cumsum([0, *(q.n_rows for q in queries)])
    return {q.name: y[:, a:b] for q, a, b in zip(queries, bounds[:-1], bounds[1:], strict=True)}


_STACKED: dict[tuple, sp.csr_matrix] = {}


def _stacked_columns(queries: Sequence[ProductQuery]) -> sp.csr_matrix:
    """``(n_cells, Σ n_rows)``: the queries' matrices stacked and transposed, built once per
    set of queries in a process (keyed by their names and factor matrices: a task's
    unpickled queries are new objects with the same key)."""
    key = tuple((q.name, *(f.matrix.tobytes() for f in q.factors)) for q in queries)
    m = _STACKED.get(key)
    if m is None:
        m = sp.vstack([q.sparse() for q in queries], format="csr").T.tocsr()
        if len(_STACKED) >= 8:
            _STACKED.clear()
        _STACKED[key] = m
    return m


def _sums(
    node: np.ndarray, cell: np.ndarray, count: np.ndarray, n: int, n_cells: int
) -> np.ndarray:
    """Dense int64 ``(n, n_cells)`` sums of ``count`` by (node, cell), exactly."""
    flat = node * n_cells + cell
    if count.size and int(count.sum()) >= 2**53:
        out = np.zeros(n * n_cells, np.int64)
        np.add.at(out, flat, count)
        return out.reshape(n, n_cells)
    # float64 bincount is exact below 2⁵³ and much faster than np.add.at
    return np.bincount(flat, count, n * n_cells).astype(np.int64).reshape(n, n_cells)


# ----------------------------------------------------------------------------- measure
def _restricted(source: HistogramSource, lo: int, hi: int) -> HistogramSource:
    """``source.restrict(lo, hi)`` when it has it (what a task of leaves ``[lo, hi)`` is
    sent: only those leaves' data), else ``source`` itself."""
    restrict = getattr(source, "restrict", None)
    return source if restrict is None else restrict(lo, hi)


def _measure_partition(
    part: Partition,
    forest: Forest,
    names: Sequence[str],
    sizes: Sequence[int],
    schema: Schema,
    low: Sequence[tuple[int, ProductQuery, NoiseLaw]],
    source: HistogramSource,
    keys,
) -> tuple[list[np.ndarray], dict]:
    """One partition's noisy answers (:class:`PartitionMeasure`) over its ``forest`` (levels
    ``cut .. leaf``, local indices), and its counters."""
    D, n_cells, shape = len(names), schema.n_cells, tuple(schema.shape)
    stats: dict = {"calls": 1, "draws": 0}
    with stage(stats, "generate"):
        lo_leaf, hi_leaf = part.range(D - 1)
        leaf, cell, count = _checked_entries(source(lo_leaf, hi_leaf), lo_leaf, hi_leaf, n_cells)
        # the partition's nodes of every level from the cut down, as local indices of leaves
        node = leaf - lo_leaf
        local = {D - 1: node}
        for k in range(D - 1, part.cut, -1):
            node = forest.parent(k - part.cut)[node]
            local[k - 1] = node
    answers: dict[int, dict[str, np.ndarray]] = {}
    for k in sorted({k for k, _, _ in low}):
        lo_k, hi_k = part.range(k)
        qs = [(q, law) for kk, q, law in low if kk == k]
        step = DENSE_LEAVES if k == D - 1 else max(hi_k - lo_k, 1)
        bounds = [*range(0, hi_k - lo_k, step), hi_k - lo_k]
        vals = {q.name: np.empty((hi_k - lo_k, q.n_rows), np.int64) for q, _ in qs}
        cut_at = np.searchsorted(local[k], bounds)
        for a, b, ea, eb in zip(bounds[:-1], bounds[1:], cut_at[:-1], cut_at[1:], strict=True):
            with stage(stats, "apply"):
                ent = (local[k][ea:eb] - a, cell[ea:eb], count[ea:eb], b - a, n_cells)
                if k == D - 1:  # leaves are sparse: no dense histograms
                    ans = answers_from_entries([q for q, _ in qs], *ent)
                else:
                    ans = apply_queries([q for q, _ in qs], _sums(*ent).reshape(b - a, *shape))
            with stage(stats, "noise"):
                for q, law in qs:
                    truth = ans.pop(q.name)
                    at = lo_k + a
                    vals[q.name][a:b] = measure_range(truth, names[k], sizes[k], at, q, law, keys)
                    stats["draws"] += truth.size
        answers[k] = vals
    out = [answers[k][q.name] for k, q, _ in low]
    return out, stats


class PartitionMeasure:
    """The ``measure`` function of :func:`structured_stream`: a partition's noisy answers.

    Called with a :class:`~censusdp.pipelines.partition.Partition`, it regenerates the
    partition's histogram from the source, sums it to the partition's nodes of every level at
    and below the cut, answers the plan's queries there and adds the keyed noise of those
    nodes (the block level :data:`DENSE_LEAVES` leaves at a time, so no dense histogram of
    the whole partition is built). Returns one int64 ``(n_nodes, n_rows)`` array per plan
    entry at or below the cut, in plan order.

    On an executor each partition's tasks get :meth:`for_partition`: its forest, its leaves'
    source (``source.restrict``) and the sub-keys of its own noise chunks, never the key.

    Counters (``stats``: draws, calls, wall seconds generating, answering and drawing noise,
    their thread CPU seconds under ``cpu_``: :func:`~censusdp.timing.stage`) are summed
    over threads (calls in this process only).
    """

    def __init__(
        self, hierarchy: Hierarchy, schema: Schema, source: HistogramSource, plan: Plan,
        rng: KeyedRNG, cut: int,
    ) -> None:  # fmt: skip
        self.hierarchy, self.schema, self.source, self.rng, self.cut = (
            hierarchy, schema, source, rng, int(cut),
        )  # fmt: skip
        self.low = [
            (hierarchy.level_index(lvl), q, law)
            for lvl, q, law in plan
            if hierarchy.level_index(lvl) >= cut
        ]
        self._lock = threading.Lock()
        stages = ("generate", "apply", "noise")
        self.stats = dict(calls=0, draws=0) | dict.fromkeys(
            (*stages, *(CPU_PREFIX + k for k in stages)), 0.0
        )

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __call__(self, part: Partition) -> list[np.ndarray]:
        h = self.hierarchy
        out, stats = _measure_partition(
            part, Forest.of(h, self.cut, part.ranges), h.names, h.sizes, self.schema, self.low,
            self.source, self.rng,
        )  # fmt: skip
        with self._lock:
            for k, v in stats.items():
                self.stats[k] += v
        return out

    def for_partition(self, part: Partition) -> OnePartitionMeasure:
        """What partition ``part``'s tasks are sent (:class:`OnePartitionMeasure`)."""
        h = self.hierarchy
        keys = self.rng.restrict({
            stream_label(h.names[k], q.name): chunk_range(*part.range(k)) for k, q, _ in self.low
        })  # fmt: skip
        return OnePartitionMeasure(
            part.index, Forest.of(h, self.cut, part.ranges).without_codes(), tuple(h.names),
            tuple(int(s) for s in h.sizes), self.schema, tuple(self.low),
            _restricted(self.source, *part.range(h.depth - 1)), keys,
        )  # fmt: skip


@dataclass(frozen=True, eq=False)
class OnePartitionMeasure:
    """One partition's measure function as its task receives it
    (:meth:`PartitionMeasure.for_partition`): the partition's forest, its leaves' source and
    the sub-keys of its noise chunks (a :class:`~censusdp.rng.SubKeys`)."""

    partition: int
    forest: Forest
    names: tuple[str, ...]
    sizes: tuple[int, ...]
    schema: Schema
    low: tuple[tuple[int, ProductQuery, NoiseLaw], ...]
    source: HistogramSource
    keys: SubKeys

    def __call__(self, part: Partition) -> list[np.ndarray]:
        if part.index != self.partition:
            raise SpecError(
                f"the measure function of partition {self.partition} was called for "
                f"partition {part.index}"
            )
        return _measure_partition(part, self.forest, self.names, self.sizes, self.schema,
                                  self.low, self.source, self.keys)[0]  # fmt: skip


# ----------------------------------------------------------------------------- outputs
@dataclass(frozen=True, eq=False)
class TopRelease:
    """The levels ``0 .. cut``, every node, handed to ``on_top`` once.

    Attributes
    ----------
    piece : StructuredPiece
        GLS estimates and covariance blocks of levels ``0 .. cut``.
    rounded : RoundedLevels
        Their integer cell tensors (``rounded.counts[k]``: int64 ``(n_nodes, *shape)``),
        the invariants ``==``.
    invariants : tuple of ProductInvariant
        The invariants held (public: released exactly).
    replicate_errors : list of numpy.ndarray or None
        With ``rounding_replicates = R`` (:func:`stream_pl94`), per level ``(R, n_nodes, m)``:
        each replicate rounding's error in every row of ``replicate_rows`` (P1–P5 by default;
        :func:`~censusdp.estimation.integer.controlled.replicate_errors`); their
        :func:`~censusdp.estimation.integer.controlled.replicate_variance` is the
        replicate estimate of the rounding's variance. None without replicates.
    nonnegative : TopRelease or None
        With :attr:`Pl94StreamOptions.nonnegative`, the non-negative product of the same
        levels (:func:`~censusdp.estimation.integer.nonnegative.nonnegative_top` of the same
        estimates, the invariants ``==``; no spreads, no replicates), else None.
    """

    piece: StructuredPiece
    rounded: RoundedLevels
    invariants: tuple[ProductInvariant, ...] = ()
    replicate_errors: list[np.ndarray] | None = None
    nonnegative: TopRelease | None = None
    _tables: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def counts(self) -> list[np.ndarray]:
        return self.rounded.counts

    @property
    def tables(self) -> list[np.ndarray]:
        """The P1–P5 tables of each level, int64 ``(n_nodes, 298)`` (computed once)."""
        return _tables_of(self.counts, self._tables)


@dataclass(frozen=True, eq=False)
class PartitionRelease:
    """One partition's levels below the cut, handed to ``on_partition`` and then dropped.

    Attributes
    ----------
    partition : Partition
        Its node ranges (levels ``cut .. leaf``).
    piece : StructuredPiece
        GLS estimates and covariance blocks of levels ``cut + 1 .. leaf``.
    counts : list of numpy.ndarray
        The rounded integer cell tensors of levels ``cut + 1 .. leaf`` (int64
        ``(n_nodes, *shape)``).
    cut_counts : numpy.ndarray
        The rounded integers of the partition's cut-level nodes (the parents of
        ``counts[0]``), from the top.
    forest : Forest
        The partition's levels ``cut .. leaf`` (local indices: its child counts).
    total_var : list of numpy.ndarray or None
        Per level ``cut + 1 .. leaf``, a bound on the rounding variance of each node's total
        (:attr:`~censusdp.estimation.integer.controlled.RoundedLevels.spread`).
    replicate_errors : list of numpy.ndarray or None
        Per level ``cut + 1 .. leaf``, ``(R, n_nodes, m)``: as
        :attr:`TopRelease.replicate_errors`, each replicate rounded from its own replicate
        of the cut nodes' integers (None without replicates).
    nonnegative : PartitionRelease or None
        With :attr:`Pl94StreamOptions.nonnegative`, the partition's non-negative product
        (:func:`~censusdp.estimation.integer.nonnegative.nonnegative_partition` from its cut
        nodes' non-negative integers, ``cut_counts`` those), computed where the partition
        was rounded; else None.
    """

    partition: Partition
    piece: StructuredPiece
    counts: list[np.ndarray]
    cut_counts: np.ndarray
    forest: Forest
    total_var: list[np.ndarray] | None = None
    replicate_errors: list[np.ndarray] | None = None
    nonnegative: PartitionRelease | None = None
    _tables: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        return self.piece.names

    @property
    def tables(self) -> list[np.ndarray]:
        """The P1–P5 tables of each level, int64 ``(n_nodes, 298)`` (computed once, so
        every consumer of the partition shares them)."""
        return _tables_of(self.counts, self._tables)


@dataclass(frozen=True, eq=False)
class RoundingInput:
    """What one partition's rounding needs from the top (:func:`stream_pl94` sends it to
    the partition's task with an executor and a sink).

    Attributes
    ----------
    forest : Forest
        The partition's levels ``cut .. leaf``.
    lo, n_global : tuple of int
        Per forest level, the global index of the partition's first node and the level's
        size (the rounding's draws are keyed by global parent node).
    cut_counts : numpy.ndarray
        The rounded integers of the partition's cut-level nodes.
    negative : bool
        :attr:`~censusdp.estimation.integer.controlled.RoundedLevels.negative` of the top.
    keys : SubKeys or KeyedRNG
        The rounding streams (a task gets only its partition's chunks: :meth:`of`).
    cut_var : numpy.ndarray or None
        The top's rounding-variance bounds of the cut nodes' totals (None: not computed).
    replicates : tuple of (numpy.ndarray, KeyedRNG or SubKeys)
        Per replicate rounding, its cut nodes' integers and its keys (restricted as ``keys``).
    rows : QueryRows or None
        The rows whose replicate errors are kept (with ``replicates``).
    nonnegative : tuple of (numpy.ndarray, KeyedRNG or SubKeys) or None
        The non-negative product's cut nodes' integers and its keys (restricted as ``keys``:
        :func:`~censusdp.estimation.integer.nonnegative.partition_keys`), or None.
    """

    forest: Forest
    lo: tuple[int, ...]
    n_global: tuple[int, ...]
    cut_counts: np.ndarray
    negative: bool
    keys: KeyedRNG | SubKeys
    cut_var: np.ndarray | None = None
    replicates: tuple[tuple[np.ndarray, KeyedRNG | SubKeys], ...] = ()
    rows: object = None
    nonnegative: tuple[np.ndarray, KeyedRNG | SubKeys] | None = None

    @classmethod
    def of(
        cls, h: Hierarchy, schema: Schema, part: Partition, top: RoundedLevels, rng: KeyedRNG,
        *, restrict: bool, replicates: Sequence[tuple[np.ndarray, KeyedRNG]] = (),
        rows: object = None, nonnegative: tuple[RoundedLevels, KeyedRNG] | None = None,
    ) -> RoundingInput:  # fmt: skip
        """Partition ``part``'s input from the rounded top; with ``restrict`` the sub-keys of
        its own chunks of the rounding streams (``rng.child(ROUNDING)``) instead of the key.
        ``replicates``: per replicate rounding its cut level's integers (every cut node) and
        its key (:func:`~censusdp.estimation.integer.controlled.replicate_keys` of the
        stream's key), restricted alike; ``nonnegative``: the non-negative product's top and
        key (``rng.child(NONNEGATIVE)``)."""
        cut, K = part.cut, schema.n_cells
        forest = Forest.of(h, cut, part.ranges)
        lo = tuple(r[0] for r in part.ranges)
        streams = partition_streams(
            h.names[cut + 1 : cut + len(part.ranges)], part.ranges[1:], K, ROUNDING_LABEL
        )

        def held(key: KeyedRNG) -> KeyedRNG | SubKeys:
            return key.restrict(streams) if restrict else key

        nn = None
        if nonnegative is not None:
            nn_top, nn_key = nonnegative
            nn = (nn_top.counts[cut][slice(*part.units)],
                  partition_keys(nn_key, forest, lo, K) if restrict else nn_key)  # fmt: skip
        return cls(
            forest, lo, tuple(int(n) for n in h.sizes[cut:]),
            top.counts[cut][slice(*part.units)], bool(top.negative), held(rng),
            None if top.spread is None else top.spread[cut][slice(*part.units)],
            tuple((c[slice(*part.units)], held(key)) for c, key in replicates), rows, nn,
        )  # fmt: skip

    def release(self, part: Partition, piece: StructuredPiece, schema: Schema) -> PartitionRelease:
        """The partition's piece rounded from its cut nodes' integers (and each replicate
        from its own, its errors in ``rows`` kept per level)."""
        est = list(piece.estimates)
        out = round_structured_partition(
            self.forest, self.lo, self.n_global, schema, self.cut_counts, self.cut_var,
            est, self.keys, PartitionOptions(negative=self.negative),
        )  # fmt: skip
        errs = None
        if self.replicates:
            per: list[list[np.ndarray]] = [[] for _ in est]
            for cut_r, keys_r in self.replicates:  # a loop over replicates, not nodes
                rep = round_structured_partition(
                    self.forest, self.lo, self.n_global, schema, cut_r, None, est, keys_r,
                    PartitionOptions(negative=self.negative),
                )  # fmt: skip
                for j, c in enumerate(rep.counts):  # only the rows are kept, not the cells
                    per[j].append(replicate_errors(self.rows, est[j], [c])[0])
            errs = [np.stack(z) for z in per]
        return PartitionRelease(
            part, piece, out.counts, self.cut_counts, self.forest, out.spread, errs
        )

    def nonnegative_release(self, release: PartitionRelease, schema: Schema) -> PartitionRelease:
        """``release`` with its :attr:`~PartitionRelease.nonnegative` product, from the same
        estimates and the non-negative cut integers (``release`` itself without them)."""
        if self.nonnegative is None:
            return release
        cut_nn, keys = self.nonnegative
        f, lo, n, est = self.forest, self.lo, self.n_global, list(release.piece.estimates)
        if f.depth <= 2 or f.sizes[-1] <= NONNEGATIVE_LEAVES:
            counts = nonnegative_partition(f, lo, n, schema, cut_nn, est, keys).counts
        else:  # the cut's children whole, then their subtrees a few at a time
            head = Forest(f.first, f.names[:2], f.sizes[:2], f.child_count[:1], ())
            top = nonnegative_partition(head, lo[:2], n[:2], schema, cut_nn, est[:1], keys)
            counts = [top.counts[0]]
            rest: list[list[np.ndarray]] = [[] for _ in est[1:]]
            for sub, ranges in _subforests(f, NONNEGATIVE_LEAVES):
                a, b = ranges[0]
                low = nonnegative_partition(
                    sub, [lo[j + 1] + r[0] for j, r in enumerate(ranges)], n[1:], schema,
                    top.counts[0][a:b], [e[r0:r1] for e, (r0, r1) in zip(est[1:], ranges[1:],
                                                                       strict=True)], keys,
                )  # fmt: skip
                for j, c in enumerate(low.counts):
                    rest[j].append(c)
            counts += [np.concatenate(c) for c in rest]
        own = PartitionRelease(release.partition, release.piece, counts, cut_nn, self.forest)
        return dataclasses.replace(release, nonnegative=own)


def _subforests(f: Forest, leaves: int):
    """``(forest, ranges)`` of runs of the subtrees of ``f``'s second level, each with at
    most ``leaves`` leaves where one subtree allows: ``ranges`` the local node ranges of
    levels ``1 ..`` of ``f`` (a chunk of the non-negative product: its integers are keyed
    by global node, so chunks give those of the whole)."""
    ends = [np.arange(f.sizes[1] + 1)]  # per level from 1, each level-1 node's first node
    for j in range(1, f.depth - 1):
        cs = np.concatenate([[0], np.cumsum(f.child_count[j])])
        ends.append(cs[ends[-1]])
    cuts = [0]
    for i in range(1, f.sizes[1] + 1):  # a loop over the cut's children, not blocks
        if ends[-1][i] - ends[-1][cuts[-1]] > leaves and i - 1 > cuts[-1]:
            cuts.append(i - 1)
    cuts.append(f.sizes[1])
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        ranges = [(int(e[a]), int(e[b])) for e in ends]
        sub = Forest(
            f.first + 1, f.names[1:], [hi - lo for lo, hi in ranges],
            [f.child_count[j + 1][r0:r1] for j, (r0, r1) in enumerate(ranges[:-1])], (),
        )  # fmt: skip
        yield sub, ranges


#: ``sink(release, payload)`` on the worker (:func:`stream_pl94` with an executor): a
#: partition's rounded release and what ``sink_payload(partition)`` gave for it.
ReleaseSink = Callable[[PartitionRelease, object], object]


@dataclass(frozen=True, eq=False)
class Sinks:
    """Several :data:`ReleaseSink` run on one partition's release in turn: the payload is a
    tuple of theirs (None: None for each), the result the tuple of their results."""

    sinks: tuple[ReleaseSink, ...]

    def __call__(self, release: PartitionRelease, payload: tuple | None) -> tuple:
        payload = (None,) * len(self.sinks) if payload is None else payload
        return tuple(s(release, p) for s, p in zip(self.sinks, payload, strict=True))


@dataclass(frozen=True, eq=False)
class _RoundingSink:
    """The structured stream's sink of :func:`stream_pl94`: rounds the piece where it is and
    hands the release to the caller's sink; returns the sink's value and the wall and thread
    CPU seconds of the two (:func:`~censusdp.timing.stage`: ``rounding``, ``sink``)."""

    sink: ReleaseSink
    schema: Schema

    def __call__(self, piece: StructuredPiece, part: Partition, payload: tuple) -> tuple:
        rounding, theirs = payload
        seconds: dict[str, float] = {}
        with stage(seconds, "rounding"):
            release = rounding.release(part, piece, self.schema)
        with stage(seconds, "nonnegative"):
            release = rounding.nonnegative_release(release, self.schema)
        with stage(seconds, "sink"):
            value = self.sink(release, theirs)
        return value, seconds


def _the_release(release: PartitionRelease, payload: object) -> PartitionRelease:
    """The sink of :func:`stream_pl94` without a caller's sink: the rounded release itself,
    handed to ``on_partition`` in the calling process."""
    return release


def _tables_of(counts: Sequence[np.ndarray], cache: dict) -> list[np.ndarray]:
    if "tables" not in cache:
        from censusdp.pipelines.products.pl94_tables import tabulate

        cache["tables"] = [tabulate(c) for c in counts]
    return cache["tables"]


@dataclass(frozen=True, eq=False)
class Pl94StreamResult:
    """What a streamed run returns (the partitions went to ``on_partition``).

    Attributes
    ----------
    top : TopRelease
    privacy : PrivacyStatement
        Derived from the measurements (with the invariants and the geometry).
    partitions : list of Partition
    persons : int
        Persons in the histogram (the root's total).
    noisy_counts : int
        Noisy counts the plan measures (Σ over levels of nodes × query rows), each drawn once
        per measurement; ``diagnostics["draws"]`` counts draws made, regenerations included.
    diagnostics : dict
        Wall seconds per stage (``truth``: pass 1; ``measure``: generating, answering and
        noise inside the partitions, and ``gls``, both summed over threads; ``rounding``;
        ``callbacks``; of these ``rounding_top`` and ``callbacks_top``, the levels down to the
        cut, in this process), CPU seconds likewise (``cpu_seconds_*``), the stream's own
        diagnostics, and the draws.
    sunk : tuple
        With a ``sink``: its return value for every partition, in partition order.
    """

    top: TopRelease
    privacy: PrivacyStatement
    partitions: list[Partition]
    persons: int
    noisy_counts: int
    diagnostics: dict
    sunk: tuple = ()


def _cut_sums(item: tuple[Forest, HistogramSource, int, int, int]) -> np.ndarray:
    """A partition's exact histograms of its cut-level nodes, ``(n_cut, n_cells)`` int64,
    from its ``forest`` and source of leaves ``[lo, hi)`` (a task of pass 1)."""
    forest, source, lo, hi, n_cells = item
    leaf, cell, count = _checked_entries(source(lo, hi), lo, hi, n_cells)
    node = leaf - lo
    for j in range(forest.depth - 1, 0, -1):
        node = forest.parent(j)[node]
    return _sums(node, cell, count, forest.sizes[0], n_cells)


def _cut_truth(
    h: Hierarchy,
    schema: Schema,
    source: HistogramSource,
    parts: Sequence[Partition],
    workers: int,
    executor: Executor | None = None,
) -> list[np.ndarray]:
    """Exact int64 histograms ``(n_nodes, n_cells)`` of levels ``0 .. cut`` from the
    partitions' leaves (pass 1), in ``workers`` threads or as tasks of ``executor`` (each
    sent its forest and its leaves' source only)."""
    D, n_cells = h.depth, schema.n_cells
    cut = parts[0].cut

    def item(p: Partition) -> tuple:
        lo, hi = p.range(D - 1)
        if executor is None:
            return Forest.of(h, cut, p.ranges), source, lo, hi, n_cells
        return (
            Forest.of(h, cut, p.ranges).without_codes(),
            _restricted(source, lo, hi),
            lo,
            hi,
            n_cells,
        )

    cut_hist = np.empty((h.sizes[cut], n_cells), np.int64)
    if executor is None:
        sums = ordered_ahead(lambda p: _cut_sums(item(p)), parts, workers)
    else:
        handles = executor.submit(_cut_sums, [item(p) for p in parts],
                                  cost=[p.leaves for p in parts])  # fmt: skip
        sums = executor.gather(handles)
        executor.release(handles)
    for p, x in zip(parts, sums, strict=True):
        cut_hist[p.units[0] : p.units[1]] = x
    levels = [cut_hist]
    for k in range(cut, 0, -1):
        levels.append(h.aggregate_up(k, levels[-1]))
    return levels[::-1]


def exact_histograms(
    hierarchy: Hierarchy,
    schema: Schema,
    source: HistogramSource,
    level: str | int,
    workers: int = 1,
) -> list[np.ndarray]:
    """The exact int64 histograms ``(n_nodes, n_cells)`` of the levels from the root down to
    ``level``, summed from the source one node of ``level`` at a time (pass 1 of
    :func:`stream_pl94`); confidential."""
    k = hierarchy.level_index(level)
    return _cut_truth(hierarchy, schema, source, partition_units(hierarchy, k, hierarchy.sizes[k]),
                      workers)  # fmt: skip


def measure_whole(
    hierarchy: Hierarchy,
    schema: Schema,
    source: HistogramSource,
    plan: Plan,
    rng: KeyedRNG,
    invariants: Sequence[tuple[str, ProductQuery | str]] = (
        ("nation", "total"),
        ("state", "total"),
    ),
) -> tuple[list[ProductMeasurement], list[ProductInvariant]]:
    """Every measurement of ``plan`` over whole levels, and the invariants: the in-memory
    input of :func:`~censusdp.estimation.gls.structured.structured_gls` with the values
    :func:`stream_pl94` draws (one partition holding every node: memory grows with the
    leaves, ~21 KB of noisy answers per pl94 block)."""
    h = hierarchy
    everything = Partition(0, 0, tuple((0, n) for n in h.sizes))
    measure = PartitionMeasure(h, schema, source, plan, rng, 0)
    meas = [
        ProductMeasurement(h.names[k], q, v, law)
        for (k, q, law), v in zip(measure.low, measure(everything), strict=True)
    ]
    truth = exact_histograms(h, schema, source, min(1, h.depth - 1))
    invs = []
    for lvl, q in invariants:
        q = ProductQuery.parse(schema, q) if isinstance(q, str) else q
        k = h.level_index(lvl)
        invs.append(ProductInvariant(lvl, q, q.apply(truth[k].reshape(-1, *schema.shape))))
    return meas, invs


@dataclass(frozen=True, eq=False)
class Pl94StreamOptions:
    """How :func:`stream_pl94` runs, beyond its data and its two callbacks: the invariants,
    the partitioning, where the passes run, the sink and the rounding replicates.

    Attributes
    ----------
    invariants : sequence of (level name, query)
        Held exactly, computed from the histogram: at the root and its children only (the
        top-down rounding holds them there), e.g. nation and state totals.
    cut : str or int
        The level the partitions cut (default county); it and the levels below are
        measured inside the partitions, the levels above from pass 1's sums.
    partitions : int or sequence of Partition
        Number of leaf-balanced partitions of the cut level (0: as many as its nodes, small
        neighbours grouped by :func:`~censusdp.pipelines.partition.partition_units`), or
        :func:`~censusdp.pipelines.partition.partition_units` of ``cut``.
    workers : int
        Threads running partitions at once (pass 1, upward, downward); the output does not
        depend on it.
    cache_bytes : int
        Memory the upward states may be cached in between the passes (default 1 GiB; 0: the
        downward pass regenerates every partition: its histogram and noise again, the same
        values).
    order : sequence of int, optional
        Order of the partitions (the output does not depend on it).
    privacy : PrivacyStatement, optional
        A claimed statement, checked against the one derived from the measurements.
    executor : Executor, optional
        Runs pass 1 and the partitions' passes as tasks (sync, threads, Dask:
        :mod:`censusdp.pipelines.execute`); give it or ``workers``. Each task is sent its
        partition's forest, its leaves' source (``source.restrict(lo, hi)`` when the source
        has it) and the sub-keys of its own noise and rounding chunks, never the key. The
        output is the same bit for bit.
    sink : callable, optional
        ``sink(release, payload)``: with it, each partition is rounded where its piece was
        computed (a worker, on Dask) and its :class:`PartitionRelease` handed to ``sink``
        there (e.g. :meth:`~censusdp.pipelines.io.pl94_store.Pl94StoreWriter.piece_sink`, which
        writes the partition's store files and returns their checksums); its small,
        picklable return values are :attr:`Pl94StreamResult.sunk` in partition order.
        Without it, each partition is rounded where its piece was computed (a worker
        thread, so the rounding runs on every worker) and its release comes back for
        ``on_partition``.
    sink_payload : callable, optional
        ``sink_payload(partition)`` → the ``payload`` of ``sink`` (called here after
        ``on_top``).
    rounding_replicates : int
        ``R`` replicate roundings of the same estimates with independent keys
        (:func:`~censusdp.estimation.integer.controlled.replicate_keys` of ``rng``, a key
        domain of their own): the top and every partition again, each partition from its
        replicate's cut integers, so ``R + 1`` roundings in all. Their errors in
        ``replicate_rows`` are handed on (:attr:`TopRelease.replicate_errors`,
        :attr:`PartitionRelease.replicate_errors`) for the replicate estimate of the
        rounding's variance (:mod:`~censusdp.estimation.integer.controlled`, "Replicate
        rounding variances"). 0 (default): none, the release's standard errors then leave
        the rounding out except where a consumer adds the totals' ``spread``. The
        release's own integers do not depend on it.
    replicate_rows : QueryRows, optional
        The rows whose replicate errors are kept (default: the P1–P5 columns,
        :func:`~censusdp.pipelines.products.pl94_tables.pl94_codebook`'s rows, for the ``pl94``
        schema).
    memory_bytes : int, optional
        A memory budget for the partitions run in this process's threads: a partition
        starts only while the running partitions' working sets (:data:`BLOCK_BYTES` per
        block, or ``leaf_bytes``) and the cached upward states fit in it, the cache held
        within it (:class:`~censusdp.pipelines.partition_driver.DriverOptions`). None: no
        budget. The output does not depend on it.
    leaf_bytes : int
        A partition's working set per leaf (default :data:`BLOCK_BYTES`).
    nonnegative : bool
        Also make the non-negative product (:mod:`~censusdp.estimation.integer.nonnegative`:
        no negative cell, the invariants ``==``, children summing to their parent) from the
        same GLS estimates, post-processing under the same privacy statement: the top in
        ``on_top`` (:attr:`TopRelease.nonnegative`), each partition where it is rounded
        (:attr:`PartitionRelease.nonnegative`, so on the worker with a sink), keyed by
        ``rng.child(NONNEGATIVE)``. The unbiased integers do not depend on it.
    """

    invariants: Sequence[tuple[str, ProductQuery | str]] = (("nation", "total"), ("state", "total"))
    cut: str | int = "county"
    partitions: int | Sequence[Partition] = 0
    workers: int = 1
    cache_bytes: int = DEFAULT_CACHE_BYTES
    order: Sequence[int] | None = None
    privacy: PrivacyStatement | None = None
    executor: Executor | None = None
    sink: ReleaseSink | None = None
    sink_payload: Callable[[Partition], object] | None = None
    rounding_replicates: int = 0
    replicate_rows: object = None
    memory_bytes: int | None = None
    leaf_bytes: int = 0
    nonnegative: bool = False


def stream_pl94(
    hierarchy: Hierarchy,
    schema: Schema,
    source: HistogramSource,
    plan: Plan,
    rng: KeyedRNG,
    *,
    on_top: Callable[[TopRelease], None] | None = None,
    on_partition: Callable[[PartitionRelease], None] | None = None,
    options: Pl94StreamOptions | None = None,
    **legacy: Any,
) -> Pl94StreamResult:
    """Measure, estimate (structured GLS) and round a schema histogram partition by partition.

    The four passes of the module's docstring, as named steps: the checks, pass 1 (the
    truth down to the cut, the measurements above it), the structured stream with the top
    rounded top-down in its ``on_top`` and each partition from its cut nodes' integers in
    its ``on_partition`` (or in the sink, where the piece was computed), the diagnostics.

    Parameters
    ----------
    hierarchy : Hierarchy
        Root first; ``source``'s leaf indices index its last level.
    schema : Schema
        The histogram's schema (``pl94``; any schema whose queries the plan names works).
    source : HistogramSource
        ``source(lo, hi)`` → sparse ``(leaf, cell, count)`` of leaves ``[lo, hi)``
        (:class:`SyntheticHistogram`, :class:`SparseHistogram`). Called once per partition
        in pass 1 and again in the upward and (uncached) downward passes.
    plan : sequence of (level name, ProductQuery, NoiseLaw)
        Every measurement, e.g. :func:`~censusdp.estimation.gls.predict.allocation_plan`
        (the schema's ``[allocation]``).
    rng : KeyedRNG
        The noise is drawn from its streams ``measure/<level>/<query>`` (keyed by node); the
        rounding from ``rng.child("rounding")``.
    on_top : callable, optional
        ``on_top(TopRelease)``: the levels down to the cut, once, before any partition.
    on_partition : callable, optional
        ``on_partition(PartitionRelease)``: each partition's levels below the cut, rounded
        where its piece was computed, handed over in ``order``, one at a time in the calling
        thread.
    options : Pl94StreamOptions, optional
        The invariants, the cut and partitions, the workers or executor, the cache, the
        order, a claimed statement, the sink and the rounding replicates
        (:class:`Pl94StreamOptions`; defaults when omitted).
    **legacy
        The fields of :class:`Pl94StreamOptions` as keyword arguments, as before it existed
        (applied over ``options``; accepted for one release).

    Returns
    -------
    Pl94StreamResult

    Raises
    ------
    SpecError
        A plan level the hierarchy lacks, invariants below the root's children, partitions
        of another cut; as :func:`~censusdp.pipelines.structured_stream.structured_stream`.
    DataError
        A source returning entries outside its range, negative counts, unknown cells.
    TypeError
        A keyword that is no field of :class:`Pl94StreamOptions`.
    """
    opts = with_keywords(Pl94StreamOptions, options, legacy, "stream_pl94")
    clock: dict[str, float] = {}
    with stage(clock, "run"):
        run = _Pl94Run.start(hierarchy, schema, source, plan, rng, opts, on_top, on_partition)
        persons, invs, meas, top_draws = run.measure_top()
        res = run.stream(meas, invs)
        sunk = run.collect_sunk(res.sunk)
    return Pl94StreamResult(
        run.top, res.privacy, run.parts, persons, run.noisy_counts(),
        run.diagnostics(res.diagnostics, top_draws, clock["run"]), tuple(sunk),
    )  # fmt: skip


#: The stages of :attr:`Pl94StreamResult.diagnostics` (``seconds_*``, ``cpu_seconds_*``),
#: in the order they are reported.
_PL94_STAGES = ("truth", "measure_top", "gls", "rounding_top", "rounding", "nonnegative_top",
                "nonnegative", "callbacks_top", "callbacks", "payloads", "measure")  # fmt: skip

#: The structured stream's stages that are the GLS (``seconds_gls``).
_GLS_STAGES = ("setup", "up", "top", "down", "output")


def _checked_partitions(h: Hierarchy, k_cut: int, partitions: int | Sequence[Partition]) -> list:
    """The partitions of level ``k_cut``: ``partitions`` leaf-balanced ones (0: one per
    node, small neighbours grouped), or those given, refused when they cut another level."""
    if isinstance(partitions, int):
        return partition_units(h, k_cut, partitions or h.sizes[k_cut])
    parts = list(partitions)
    if parts and parts[0].cut != k_cut:
        raise SpecError(
            f"the partitions cut level {h.names[parts[0].cut]!r}, not {h.names[k_cut]!r}"
        )
    return parts


def _checked_invariants(
    h: Hierarchy, schema: Schema, invariants: Sequence[tuple[str, ProductQuery | str]], k_cut: int
) -> list[tuple[int, ProductQuery]]:
    """``(level index, query)`` of each invariant, refused below the root's children or
    below the cut (the top-down rounding holds them ``==`` only there)."""
    specs = [(h.level_index(lvl), ProductQuery.parse(schema, q) if isinstance(q, str) else q)
             for lvl, q in invariants]  # fmt: skip
    for k, q in specs:
        if k > min(1, k_cut):
            raise SpecError(
                f"invariant {q.name!r} at level {h.names[k]!r}: invariants are held at the root "
                "and its children only (the top-down rounding keeps them ==); cut at or below "
                "the level of the invariants"
            )
    return specs


def _replicate_rows(schema: Schema, rows: object, replicates: bool) -> object:
    """The rows whose replicate errors are kept: ``rows``, or by default the P1–P5 columns
    (which need the ``pl94`` schema) when there are replicates."""
    if not replicates or rows is not None:
        return rows
    from censusdp.pipelines.products.pl94_tables import pl94_codebook

    rows = pl94_codebook().rows
    if tuple(rows.schema.shape) != tuple(schema.shape):
        raise SpecError(
            f"stream_pl94: rounding replicates keep the P1–P5 columns by default, which "
            f"need the pl94 schema, not {schema.name!r}; give replicate_rows"
        )
    return rows


@dataclass(eq=False)
class _Pl94Run:
    """One :func:`stream_pl94` run between its steps: the checked inputs, the rounded top
    (once solved) and the seconds per stage (:data:`_PL94_STAGES`; CPU under ``cpu_``:
    of the process for pass 1, of the threads or tasks that ran them for the rounding, of
    the calling thread for the callbacks)."""

    h: Hierarchy
    schema: Schema
    source: HistogramSource
    plan: Plan
    rng: KeyedRNG
    opts: Pl94StreamOptions
    on_top: Callable[[TopRelease], None] | None
    on_partition: Callable[[PartitionRelease], None] | None
    k_cut: int
    parts: list[Partition]
    inv_specs: list[tuple[int, ProductQuery]]
    rep_keys: list
    rows: object
    seconds: dict[str, float]
    round_rng: KeyedRNG
    measure: PartitionMeasure | None = None
    invariants: list[ProductInvariant] = field(default_factory=list)
    top: TopRelease | None = None
    replicates: list = field(default_factory=list)

    @classmethod
    def start(
        cls, h: Hierarchy, schema: Schema, source: HistogramSource, plan: Plan, rng: KeyedRNG,
        opts: Pl94StreamOptions, on_top: Callable | None, on_partition: Callable | None,
    ) -> _Pl94Run:  # fmt: skip
        """Check the inputs (before any data is read) and set the run up."""
        k_cut = h.level_index(opts.cut)
        rep_keys = replicate_keys(rng, opts.rounding_replicates)  # SpecError naming a bad count
        rows = _replicate_rows(schema, opts.replicate_rows, bool(rep_keys))
        if opts.sink is not None and on_partition is not None:
            raise SpecError(
                "stream_pl94: give on_partition (releases handed here) or a sink, not both"
            )
        if opts.sink_payload is not None and opts.sink is None:
            raise SpecError("stream_pl94: sink_payload without a sink")
        for lvl, _, _ in plan:
            h.level_index(lvl)  # HierarchyError naming an unknown level
        parts = _checked_partitions(h, k_cut, opts.partitions)
        inv_specs = _checked_invariants(h, schema, opts.invariants, k_cut)
        seconds = dict.fromkeys(_PL94_STAGES, 0.0) | dict.fromkeys(
            (CPU_PREFIX + s for s in _PL94_STAGES), 0.0
        )
        return cls(h, schema, source, plan, rng, opts, on_top, on_partition, k_cut, parts,
                   inv_specs, rep_keys, rows, seconds, rng.child(ROUNDING))  # fmt: skip

    def measure_top(self) -> tuple[int, list[ProductInvariant], list[ProductMeasurement], int]:
        """Pass 1: the exact histograms down to the cut (``persons``, the invariants), then
        the measurements above it (those at and below the cut empty: measured per
        partition). Returns ``(persons, invariants, measurements, draws above the cut)``."""
        h, shape, k_cut = self.h, tuple(self.schema.shape), self.k_cut
        with stage(self.seconds, "truth", cpu=time.process_time):
            top_truth = _cut_truth(
                h, self.schema, self.source, self.parts, self.opts.workers, self.opts.executor
            )
            persons = int(top_truth[0].sum())
            invs = [ProductInvariant(h.names[k], q, q.apply(top_truth[k].reshape(-1, *shape)))
                    for k, q in self.inv_specs]  # fmt: skip
        with stage(self.seconds, "measure_top", cpu=time.process_time):
            answers = {
                k: apply_queries(
                    [q for lvl, q, _ in self.plan if h.level_index(lvl) == k],
                    top_truth[k].reshape(-1, *shape),
                )
                for k in range(k_cut)
            }
            del top_truth
            meas: list[ProductMeasurement] = []
            top_draws = 0
            for lvl, q, law in self.plan:  # a loop over the plan's measurements, not nodes
                k = h.level_index(lvl)
                if k < k_cut:
                    truth = answers[k].pop(q.name)
                    vals = measure_range(truth, lvl, h.sizes[k], 0, q, law, self.rng)
                    top_draws += truth.size
                else:
                    vals = np.empty((0, q.n_rows))
                meas.append(ProductMeasurement(lvl, q, vals, law))
            del answers
        self.measure = PartitionMeasure(h, self.schema, self.source, self.plan, self.rng, k_cut)
        return persons, invs, meas, top_draws

    def stream(self, meas: list[ProductMeasurement], invs: list[ProductInvariant]) -> StreamResult:
        """Passes 2–4: the structured stream, each partition rounded where its piece is
        computed (a worker thread or task), then handed to the caller's sink there or, as
        a release, to ``on_partition`` here, in order."""
        opts, sink = self.opts, self.opts.sink
        self.invariants = invs
        return structured_stream(
            self.h, self.schema, meas, self.measure, self.parts, invs,
            None if sink else self.take_release,
            StreamOptions(
                on_top=self.round_top, privacy=opts.privacy, cache_bytes=opts.cache_bytes,
                order=opts.order, workers=opts.workers, executor=opts.executor,
                sink=_RoundingSink(sink or _the_release, self.schema), sink_payload=self.payload,
                hand_sunk=sink is None, memory_bytes=opts.memory_bytes,
                leaf_bytes=opts.leaf_bytes or BLOCK_BYTES,
            ),
        )  # fmt: skip

    def round_top(self, piece: StructuredPiece) -> None:
        """The levels down to the cut rounded top-down (the invariants ``==``), and each
        replicate's; handed to ``on_top``."""
        h, schema, invs, k_cut = self.h, self.schema, self.invariants, self.k_cut
        with stage(self.seconds, "rounding"), stage(self.seconds, "rounding_top"):
            est = list(piece.estimates)
            rounded = round_structured_top(
                h, schema, est, self.round_rng, invariants=invs, spreads=True
            )
            errs = None
            if self.rep_keys:  # the replicates' tops: their cut integers seed their partitions
                reps = [
                    round_structured_top(h, schema, est, key, invariants=invs, spreads=False).counts
                    for key in self.rep_keys
                ]
                self.replicates = [
                    (c[k_cut], key) for c, key in zip(reps, self.rep_keys, strict=True)
                ]
                errs = [
                    replicate_errors(self.rows, est[k], [c[k] for c in reps])
                    for k in range(len(est))
                ]
                del reps
        nn = None
        if self.opts.nonnegative:
            with stage(self.seconds, "nonnegative"), stage(self.seconds, "nonnegative_top"):
                nn_top = nonnegative_top(h, schema, est, self.rng.child(NONNEGATIVE),
                                         invariants=invs)  # fmt: skip
                nn = TopRelease(piece, nn_top, tuple(invs))
        self.top = TopRelease(piece, rounded, tuple(invs), errs, nn)
        if self.on_top is not None:
            with stage(self.seconds, "callbacks"), stage(self.seconds, "callbacks_top"):
                self.on_top(self.top)

    def rounding_input(self, part: Partition, *, restrict: bool) -> RoundingInput:
        """What partition ``part``'s rounding needs from the rounded top."""
        return RoundingInput.of(
            self.h, self.schema, part, self.top.rounded, self.round_rng,
            restrict=restrict, replicates=self.replicates, rows=self.rows,
            nonnegative=None if self.top.nonnegative is None
            else (self.top.nonnegative.rounded, self.rng.child(NONNEGATIVE)),
        )  # fmt: skip

    def take_release(self, sunk: tuple[PartitionRelease, dict]) -> None:
        """A partition's release, rounded where its piece was computed, handed to
        ``on_partition`` here."""
        release, seconds = sunk
        self.add_task_seconds(seconds)
        if self.on_partition is not None:
            with stage(self.seconds, "callbacks"):
                self.on_partition(release)

    def add_task_seconds(self, seconds: dict[str, float]) -> None:
        """The rounding and sink seconds a partition's task measured, added to ``rounding``
        and ``callbacks``."""
        for theirs, ours in (("rounding", "rounding"), ("nonnegative", "nonnegative"),
                             ("sink", "callbacks")):  # fmt: skip
            self.seconds[ours] += seconds[theirs]
            self.seconds[CPU_PREFIX + ours] += seconds[CPU_PREFIX + theirs]

    def payload(self, part: Partition) -> tuple:
        """The sink's payload of partition ``part``: its rounding input (its own sub-keys
        with an executor) and the caller's payload."""
        with stage(self.seconds, "payloads"):
            sink_payload = self.opts.sink_payload
            return (self.rounding_input(part, restrict=self.opts.executor is not None),
                    None if sink_payload is None else sink_payload(part))  # fmt: skip

    def collect_sunk(self, sunk: tuple) -> list:
        """The sink's values in partition order; the rounding and sink seconds it measured
        in the tasks added to ``rounding`` and ``callbacks``."""
        if self.opts.sink is None:
            return []
        for _, seconds in sunk:
            self.add_task_seconds(seconds)
        return [value for value, _ in sunk]

    def noisy_counts(self) -> int:
        """Noisy counts the plan measures: Σ over its measurements of nodes × query rows."""
        return sum(self.h.sizes[self.h.level_index(lvl)] * q.n_rows for lvl, q, _ in self.plan)

    def diagnostics(self, d: dict, top_draws: int, total: float) -> dict:
        """:attr:`Pl94StreamResult.diagnostics` from the stream's ``d``: the partitions'
        GLS and measure seconds are summed over the threads or tasks that ran them."""
        s, stats = self.seconds, self.measure.stats
        s["gls"] = sum(d[f"seconds_{k}"] for k in _GLS_STAGES)
        s[CPU_PREFIX + "gls"] = sum(d[f"cpu_seconds_{k}"] for k in _GLS_STAGES)
        s["measure"], s[CPU_PREFIX + "measure"] = d["seconds_measure"], d["cpu_seconds_measure"]
        out = {
            "seconds": total,
            **{f"seconds_{k}": s[k] for k in _PL94_STAGES},
            **{f"cpu_seconds_{k}": s[CPU_PREFIX + k] for k in _PL94_STAGES},
            "measure_inside_partitions": {
                "calls": stats["calls"],
                "draws": stats["draws"],
                "seconds_generate": stats["generate"],
                "seconds_apply_queries": stats["apply"],
                "seconds_noise": stats["noise"],
            },
            "draws": top_draws + stats["draws"],
            "stream": d,
        }
        if self.opts.executor is not None:
            out["note"] = (
                "per-stage seconds are summed over the partitions' tasks (CPU: their threads' "
                "time, wherever they ran); measure_inside_partitions counts calls in this process"
            )
        return out


# ----------------------------------------------------------------------------- consumers
class ReleaseChecks:
    """Exactness checks of a streamed release, accumulated piece by piece (``top`` as
    ``on_top``, ``partition`` as ``on_partition``): each level's rounded total, every cell
    ⌊x⌋ or ⌈x⌉ of its estimate, children summing to their parent cell by cell, the invariants
    ``==`` (:attr:`TopRelease.invariants`), and with ``tables`` every linear identity among
    the P1–P5 columns (:meth:`~censusdp.pipelines.io.codebook.Codebook.identities`: P1_001N =
    P2_001N, a total = the sum of its rows, ...) at every node, with P1_001N the node's
    total. Holds only booleans, per-level totals and the integers' :func:`fingerprint`.

    With ``nonnegative`` the checks are of the releases' non-negative product
    (:attr:`TopRelease.nonnegative`, :attr:`PartitionRelease.nonnegative`): every cell ``≥ 0``
    replaces every cell ⌊x⌋ or ⌈x⌉ (that product is not a rounding of the estimates).
    """

    def __init__(
        self, hierarchy: Hierarchy, *, tables: bool = False, nonnegative: bool = False
    ) -> None:
        self.h, self.nonnegative = hierarchy, nonnegative
        self.fingerprint = np.zeros(hierarchy.depth, np.uint64)
        self.totals = np.zeros(hierarchy.depth, np.int64)
        self.floor_ceil = self.consistent = True
        self.invariants_exact: bool | None = None
        self.tables_exact: bool | None = None
        self._identities = self._total_column = None
        if tables:
            from censusdp.pipelines.products.pl94_tables import pl94_codebook

            book = pl94_codebook()
            # sparse: 334 nonzeros of 298 × 39, the check is a sparse product per node
            self._identities = sp.csr_matrix(book.identities().T.astype(np.int64))
            self._total_column = book.columns.index("P1_001N")
            self.tables_exact = True
        self.clock: dict[str, float] = {"checks": 0.0}  # wall seconds, wherever they ran

    def _floor_ceil(self, counts: Sequence[np.ndarray], estimates: Sequence[np.ndarray]) -> None:
        if self.nonnegative:
            self.floor_ceil &= all(int(c.min(initial=0)) >= 0 for c in counts)
            return
        for c, x in zip(counts, estimates, strict=True):
            d = c - np.asarray(x, dtype=float)
            self.floor_ceil &= bool(np.all((d > -1 - 1e-6) & (d < 1 + 1e-6)))

    def _sum_to(self, parent: np.ndarray, child: np.ndarray, child_count: np.ndarray) -> None:
        n_par = parent.shape[0]
        flat = child.reshape(child.shape[0], -1)
        starts = np.concatenate([[0], np.cumsum(child_count)[:-1]]).astype(np.int64)
        has = child_count > 0
        sums = np.zeros((n_par, flat.shape[1]), np.int64)
        if has.any():
            sums[has] = np.add.reduceat(flat, starts[has], axis=0)
        self.consistent &= bool(np.array_equal(sums, parent.reshape(n_par, -1)))

    def _tables(self, counts: Sequence[np.ndarray], tables: Sequence[np.ndarray]) -> None:
        if self._identities is None:
            return
        for c, t in zip(counts, tables, strict=True):
            ok = not np.any(t @ self._identities)
            ok &= np.array_equal(t[:, self._total_column], c.reshape(c.shape[0], -1).sum(axis=1))
            self.tables_exact &= bool(ok)

    def top(self, top: TopRelease) -> None:
        top = top.nonnegative if self.nonnegative else top
        if top is None:
            raise SpecError("non-negative checks of a release without that product")
        with stage(self.clock, "checks"):
            counts = top.rounded.counts
            for k, c in enumerate(counts):
                self.fingerprint[k] += fingerprint(c, 0, k)
            self._floor_ceil(counts, top.piece.estimates)
            for k, c in enumerate(counts):
                self.totals[k] += int(c.sum())
            for k in range(1, len(counts)):
                self._sum_to(counts[k - 1], counts[k], self.h.levels[k - 1].child_count)
            self.invariants_exact = all(
                np.array_equal(inv.query.apply(counts[self.h.level_index(inv.level)]), inv.values)
                for inv in top.invariants
            )
            self._tables(counts, top.tables if self._identities is not None else [])

    def partition(self, out: PartitionRelease) -> None:
        self.add(self.for_partition()(out))

    def for_partition(self) -> PartitionChecks:
        """The checks of one partition, to run where its release is (a sink on a worker);
        :meth:`add` takes what they return."""
        return PartitionChecks(self.h.depth, self._identities, self._total_column, self.nonnegative)

    def add(self, checked: dict) -> None:
        """Accumulate one partition's :class:`PartitionChecks` result."""
        self.totals += np.asarray(checked["totals"], np.int64)
        self.fingerprint += np.asarray(checked["fingerprint"], np.uint64)
        self.floor_ceil &= checked["floor_ceil"]
        self.consistent &= checked["consistent"]
        if self.tables_exact is not None:
            self.tables_exact &= checked["tables_exact"]
        self.clock["checks"] += checked["seconds"]

    def result(self, persons: int) -> dict:
        """The checks as JSON-able values (``persons``: the histogram's total)."""
        cells = "every_cell_non_negative" if self.nonnegative else "every_cell_floor_or_ceil"
        return {
            "integers_fingerprint": "".join(f"{int(f):016x}" for f in self.fingerprint),
            "rounded_total_per_level": dict(zip(self.h.names, self.totals.tolist(), strict=True)),
            "every_level_total_equals_the_persons": bool(np.all(self.totals == persons)),
            "invariants_exact": self.invariants_exact,
            cells: self.floor_ceil,
            "children_sum_to_parent_cell_by_cell": self.consistent,
            "table_identities_exact_at_every_node": self.tables_exact,
        }


class PartitionChecks(ReleaseChecks):
    """:class:`ReleaseChecks` of one partition, picklable and small (no hierarchy: the
    child counts are the release's forest's); calling it returns the partition's result for
    :meth:`ReleaseChecks.add`."""

    def __init__(
        self, depth: int, identities: sp.csr_matrix | None, total_column: int | None,
        nonnegative: bool = False,
    ) -> None:  # fmt: skip
        self.depth, self._identities, self._total_column = depth, identities, total_column
        self.nonnegative = nonnegative

    def __call__(self, out: PartitionRelease, payload: object = None) -> dict:
        """The partition's checks (``payload`` unused: a :data:`ReleaseSink`); safe to call
        from several threads at once (each call checks on its own copy)."""
        out = out.nonnegative if self.nonnegative else out
        if out is None:
            raise SpecError("non-negative checks of a release without that product")
        return copy.copy(self)._check(out)

    def _check(self, out: PartitionRelease) -> dict:
        self.clock = {}
        with stage(self.clock, "checks"):
            self.totals = np.zeros(self.depth, np.int64)
            self.floor_ceil = self.consistent = True
            self.tables_exact = None if self._identities is None else True
            self._floor_ceil(out.counts, out.piece.estimates)
            levels = [out.cut_counts, *out.counts]
            for j in range(1, len(levels)):
                self._sum_to(levels[j - 1], levels[j], out.forest.child_count[j - 1])
            fp = np.zeros(self.depth, np.uint64)
            for j, c in enumerate(out.counts, start=out.partition.cut + 1):
                self.totals[j] += int(c.sum())
                fp[j] = fingerprint(c, out.partition.range(j)[0], j)
            self._tables(out.counts, out.tables if self._identities is not None else [])
        return {
            "fingerprint": fp.tolist(),
            "totals": self.totals.tolist(),
            "floor_ceil": self.floor_ceil,
            "consistent": self.consistent,
            "tables_exact": self.tables_exact,
            "seconds": self.clock["checks"],
        }


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014), elementwise on uint64."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def fingerprint(counts: np.ndarray, first: int, level: int) -> np.uint64:
    """A linear fingerprint of one level's integer cells, nodes ``first ..`` of it:
    ``Σ_n w(level, n) · Σ_c counts[n, c] · v(c)`` mod 2⁶⁴, ``w`` and ``v`` pseudo-random
    (:func:`_mix64`). A sum over nodes, so the fingerprints of a level's pieces add up
    (mod 2⁶⁴) to the whole level's, whatever the partitioning: an identity check of the
    integers, not a cryptographic digest."""
    with np.errstate(over="ignore"):
        c = np.ascontiguousarray(counts, dtype=np.int64)
        flat = c.reshape(c.shape[0], int(np.prod(c.shape[1:]))).view(np.uint64)
        v = _mix64(np.arange(flat.shape[1], dtype=np.uint64) + np.uint64(1 << 40))
        nodes = np.arange(first, first + flat.shape[0], dtype=np.uint64)
        w = _mix64(nodes + np.uint64(level << 48))
        return np.uint64((flat @ v * w).sum(dtype=np.uint64))


class StandardErrorSummary:
    """Per level and table: the mean and largest standard error over its rows and nodes,
    accumulated piece by piece (``add(piece)`` for the top and every partition).

    Without replicate errors these are the GLS standard errors alone and the result says so
    (``"rounding": "not included (GLS only)"``): the released integers' error also holds the
    rounding's. Run :func:`stream_pl94` with ``rounding_replicates = R`` and
    ``replicate_rows = summary.rows`` and pass each release's ``replicate_errors[j]`` to
    :meth:`add`: the standard errors are then ``sqrt(GLS variance + replicate rounding
    variance)`` (:func:`~censusdp.estimation.integer.controlled.replicate_variance`), and the
    result names ``R``. A summary mixes the two only if the caller does; it records both.
    """

    def __init__(self, schema: Schema, tables: Sequence[str]) -> None:
        self.queries = [ProductQuery.parse(schema, t) for t in tables]
        self.acc: dict = {}
        self.replicates: set[int] = set()
        self.clock: dict[str, float] = {}  # wall and thread CPU seconds in add (stage)

    @property
    def rows(self) -> QueryRows:
        """Every row of every table, in order: the ``replicate_rows`` whose replicate errors
        :meth:`add` takes."""
        qi = np.concatenate([np.full(q.n_rows, i, np.int64) for i, q in enumerate(self.queries)])
        ri = np.concatenate([np.arange(q.n_rows, dtype=np.int64) for q in self.queries])
        names = tuple(f"{q.name}[{r}]" for q in self.queries for r in range(q.n_rows))
        return QueryRows(self.queries[0].schema, tuple(self.queries), qi, ri, names)

    def add(
        self, piece: StructuredPiece, replicate_errors: Sequence[np.ndarray] | None = None
    ) -> None:
        """Accumulate ``piece``'s levels; ``replicate_errors`` per level ``(R, n, rows)``
        (of :attr:`rows`) adds the replicate rounding variance."""
        with stage(self.clock, "standard_errors"):
            for j, lvl in enumerate(piece.names):
                var = None
                if replicate_errors is not None:
                    z = replicate_errors[j]
                    var = replicate_variance(z)
                    self.replicates.add(int(z.shape[0]))
                at = 0
                for q in self.queries:
                    se = piece.query_standard_errors(lvl, q)
                    if var is not None:
                        se = np.sqrt(se**2 + var[:, at : at + q.n_rows])
                    at += q.n_rows
                    ok = ~np.isnan(se)
                    a = self.acc.setdefault((lvl, q.name), [0.0, 0, -np.inf])
                    a[0] += float(se[ok].sum())
                    a[1] += int(ok.sum())
                    a[2] = max(a[2], float(se[ok].max(initial=-np.inf)))
            if replicate_errors is None:
                self.replicates.add(0)

    def result(self, names: Sequence[str]) -> dict:
        reps = sorted(self.replicates)
        if reps == [0] or not reps:
            note = "not included (GLS only): the rounding's error is left out"
        elif 0 in reps:
            note = f"included for some pieces only (replicates {reps[1:]}, 0 elsewhere)"
        else:
            shown = reps[0] if len(reps) == 1 else reps
            note = f"included: GLS variance + replicate rounding variance (R = {shown})"
        out: dict = {}
        for lvl in names:
            out[lvl] = {}
            for q in self.queries:
                total, count, top = self.acc.get((lvl, q.name), (0.0, 0, float("nan")))
                out[lvl][q.name] = {
                    "mean": total / count if count else float("nan"),
                    "max": top,
                    "rounding": note,
                }
        return out


# ----------------------------------------------------------------------------- slice check
def county_measurements(
    hierarchy: Hierarchy,
    schema: Schema,
    source: HistogramSource,
    plan: Plan,
    rng: KeyedRNG,
    node: int,
    level: str | int = "county",
) -> tuple[Hierarchy, list[ProductMeasurement]]:
    """One node's subtree and its measurements, the same noisy values a streamed run draws
    there (:class:`PartitionMeasure` on a partition of that node alone)."""
    h = hierarchy
    k = h.level_index(level)
    ranges = [(int(node), int(node) + 1)]
    ranges += [h.descendant_range(k, node, j) for j in range(k + 1, h.depth)]
    part = Partition(0, k, tuple(ranges))
    measure = PartitionMeasure(h, schema, source, plan, rng, k)
    sub = h.subtree(k, node)
    smeas = [
        ProductMeasurement(h.names[kk], q, v, law)
        for (kk, q, law), v in zip(measure.low, measure(part), strict=True)
    ]
    return sub, smeas


def slice_check(
    sub: Hierarchy, schema: Schema, smeas: Sequence[ProductMeasurement], *, dense: bool = True
) -> dict:
    """Exactness on a slice: on one subtree and its measurements, the streamed structured GLS
    (cut below the subtree's root, one partition per node there) equals the in-memory
    :func:`~censusdp.estimation.gls.structured.structured_gls` bit for bit (estimates and
    covariance blocks of every level), and with ``dense`` the dense
    :func:`~censusdp.estimation.tree_gls` (2,016-cell histogram, ``K × K`` per node: keep
    the subtree small) to within the returned relative differences.
    """
    from censusdp.estimation import tree_gls
    from censusdp.estimation.gls.structured import structured_gls
    from censusdp.mechanisms.queries import Measurement, Query
    from censusdp.pipelines.structured_stream import given_values

    clock: dict[str, float] = {}
    with stage(clock, "structured_gls"):
        srel = structured_gls(sub, schema, list(smeas))
    cut = min(1, sub.depth - 1)
    parts = partition_units(sub, cut, sub.sizes[cut])
    heads = [
        m if sub.level_index(m.level) < cut
        else ProductMeasurement(m.level, m.query, np.empty((0, m.query.n_rows)), m.law)
        for m in smeas
    ]  # fmt: skip
    got: dict = {}
    with stage(clock, "structured_stream"):
        structured_stream(
            sub, schema, heads, given_values(list(smeas), sub, cut), parts,
            on_partition=lambda p: got.setdefault(p.partition, p),
            on_top=lambda p: got.setdefault("top", p),
        )  # fmt: skip
    equal = True
    for j in range(sub.depth):
        chunks = (
            [(got["top"], j)] if j <= cut else [(got[i], j - cut - 1) for i in range(len(parts))]
        )
        e = np.concatenate([p.estimates[jj] for p, jj in chunks])
        equal &= bool(np.array_equal(e, srel.estimates[j]))
        for mask, b in srel.covariances[j].blocks.items():
            ours = np.concatenate([_nodes(p.covariances[jj].blocks[mask], p.estimates[jj].shape[0])
                                   for p, jj in chunks])  # fmt: skip
            equal &= bool(np.array_equal(ours, _nodes(b, e.shape[0])))
    out: dict = {
        "nodes_per_level": dict(zip(sub.names, sub.sizes, strict=True)),
        "streamed_equals_in_memory_bit_for_bit": equal,
        "seconds_structured_gls": clock["structured_gls"],
        "seconds_structured_stream": clock["structured_stream"],
    }
    if not dense:
        return out
    dense_q = {m.query.name: Query(m.query.name, m.query.dense(), m.query.labels) for m in smeas}
    meas = [
        Measurement(sub.names.index(m.level), dense_q[m.query.name],
                    np.asarray(m.values, np.int64), m.law)
        for m in smeas
    ]  # fmt: skip
    with stage(clock, "dense_tree_gls"):
        rel = tree_gls(sub, schema.cells, meas, [])  # its statement derived from the measurements
    svar = [srel.query_variances(j, "detailed") for j in range(sub.depth)]
    scale = max(float(np.abs(e).max()) for e in rel.estimates)
    out.update({
        "seconds_dense_tree_gls": clock["dense_tree_gls"],
        "ratio_dense_over_structured": clock["dense_tree_gls"]
        / max(out["seconds_structured_gls"], 1e-12),
        "dense_gls_path": rel.diagnostics.get("path"),
        "max_estimate_difference_relative": max(
            float(np.abs(a - b.reshape(a.shape)).max())
            for a, b in zip(rel.estimates, srel.estimates, strict=True)
        ) / scale,
        "max_variance_difference_relative": max(
            float(np.abs(a - b).max() / np.abs(a).max())
            for a, b in zip(rel.variances, svar, strict=True)
        ),
    })  # fmt: skip
    return out


def _nodes(block: np.ndarray, n: int) -> np.ndarray:
    """Per-node blocks ``(n, n_S, n_S)`` (a block shared by every node repeated)."""
    return np.broadcast_to(block, (n, *block.shape[-2:]))
