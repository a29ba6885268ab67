"""Unbiased top-down integer rounding of schema histograms, streaming partition by partition.

The structured GLS (:mod:`censusdp.estimation.gls.structured`) gives real cell tensors
``(n_nodes, *schema.shape)`` at every level, consistent cell by cell (parent = Σ children).
This module rounds them to int64 so that

* every detailed cell of every node is ⌊x⌋ or ⌈x⌉, with E[rounded] = x;
* children sum to their parent cell by cell, so every marginal table of every node is the
  integer sum of its children's and every table identity holds exactly;
* every invariant (at the root and its children) holds ``==``;
* down to the cut level, with total invariants only, every node's total is the floor or
  ceiling of its real total (the top as one network, "The top" below); below the cut, the
  floor or ceiling of its real total plus its share ``Σ_c A_c e_c`` of its cut ancestor's
  cell errors (one network per cut node, below); with marginal invariants, between the
  jointly rounded level and the cut, about its parent's total error shared out plus less than
  one person (controlled rounding one level at a time);

from the root down, so that below a cut level every partition rounds its own subtrees from
its cut nodes' integers and nothing else (O(one partition's tensors)).

**Below the cut: each cut node's subtree as one network.** Over the leaf cells ``(ℓ, c)`` of a
cut node's subtree, the node totals ``{desc(v)} × C`` form one laminar family and the node
cells ``{desc(v)} × {c}`` another; their incidence is a network flow: the cut node's total
vertex, each node's total arc from its parent's total vertex, each leaf's cell arcs from its
total vertex into its parent's cell vertices, each inner node's cell arcs from its own cell
vertices into its parent's, and the cut node's cell vertices as sinks. Given the cut node's
integers ``N`` (its errors ``e_c = N_c − X_c``, mean 0), the conditional values are carried
down affinely, level by level, with the same box and water-filling as one level down (next
paragraph): each child's fraction ``p = f + d·a`` with ``d`` its parent's deviation (``e`` at
the first level, then the parent's ``p − f``, both in ``[−φ, 1 − φ]``, so the box holds), so
every arc's conditional value is unbiased and the values are consistent at every vertex. The
network's fractional parts are then rounded by randomised cycle cancelling
(:func:`~censusdp.estimation.integer.dependent.flow_round`; Gandhi, Khuller, Parthasarathy &
Srinivasan 2006 on the network's undirected graph; each leaf parent's (children × (total,
cells)) arcs, one matrix, are first swept by 4-cycles row pair by row pair as the matrix
kernel does, and the walk closes the cycles left, through the parents: the order of the
cancellations decides which integers given draws give, not the law's guarantees, since every
step is a mean-zero shift of a cycle whichever cycle it is): every arc ends at the floor or
ceiling of its conditional value with that value as its mean, so every cell is unbiased,
children sum to their parent cell by cell, and every node's total is the floor or ceiling of
its real total plus ``Y = Σ_c A_c e_c`` (``A`` the product of the shares ``a`` down the path). The cut node's
errors cannot be shared more evenly by any rounding that sees only ``N``: with two children
and a cell whose fraction lies in one child only, every unbiased conditional law given the
parent's cells routes that cell's error to that child (the box pins ``a``), so the partition
boundary keeps ``Y``; below the cut's children nothing is added level by level (block groups
under two-child tracts moved by 3.06 persons RMS with one level at a time, 0.45 now, on a
4,000-block synthetic state at the production budget). The uniforms are the per-level streams'
items of the subtree's own nodes, each subtree a separate component of the kernel, so the
integers do not depend on the partitioning; they do depend on the cut (where the networks are
rooted).

**One level down: controlled rounding of each parent's (children × cells) matrix.** Fix a
parent and a cell ``c`` with real value ``X_c`` and integer ``N_c ∈ {⌊X_c⌋, ⌈X_c⌉}``,
``P(N_c = ⌈X_c⌉) = frac X_c`` (induction). Its ``n`` children have values ``x_ic = ⌊x_ic⌋ +
f_ic``; put ``S_c = Σ_i f_ic``, ``m_c = ⌊S_c⌋``, ``φ_c = frac S_c = frac X_c`` and ``T_c =
N_c − Σ_i ⌊x_ic⌋ ∈ {m_c, m_c + 1}`` (the number of children to round up), so that ``e_c = T_c
− S_c = N_c − X_c`` is the parent's rounding error in that cell: ``1 − φ_c`` with probability
``φ_c``, else ``−φ_c``, mean 0. The children are rounded with conditional marginals

    p_ic = f_ic + e_c · a_ic,   Σ_i a_ic = 1,   0 ≤ a_ic ≤ u_ic = min(f_ic / φ_c, (1 − f_ic) / (1 − φ_c)),

chosen from the fractions alone (not from ``T``). Then ``Σ_i p_ic = S_c + e_c = T_c`` (an
integer), ``p_ic ∈ [0, 1]`` for both values of ``e_c`` (that is the box), and ``E[p_ic] = f_ic
+ a_ic E[e_c] = f_ic``: unbiased whatever the joint law of the parent's cells. The box is never
empty: with ``u = f/φ − (f − φ)⁺/(φ(1 − φ))``, ``Σ_i u_ic ≥ 1`` iff ``Σ_i (f_ic − φ)⁺ ≤ m(1 − φ)``,
which holds because ``k`` fractions above ``φ`` give at most ``min(k(1 − φ), S − kφ) ≤ m(1 −
φ)``. ``a`` is water-filled towards the weight ``1/n`` shared by all cells of a child:
``a_ic = min(t_c, u_ic)`` with ``Σ_i a_ic = 1`` (the Euclidean projection of ``1/n`` on the
box). The matrix ``p`` (exact integer column sums) is then rounded by
:func:`~censusdp.estimation.integer.dependent.dependent_round` (Cox 1987; Gandhi, Khuller,
Parthasarathy & Srinivasan 2006): every child cell ``⌊x⌋`` or ``⌈x⌉`` with ``P(up) = p``,
children = parent exactly cell by cell, and each child's *total* the floor or ceiling of
``Σ_c p_ic``. A child's total therefore moves by ``Σ_c a_ic e_c`` (≈ the parent's own total
error ``Σ_c e_c`` over ``n`` where the box does not bind) plus less than one, instead of the
sum of its cells' independent errors (standard deviation ``√Σ f(1 − f)``, about 18 persons
for 2,016 cells).

*Where it cannot do better.* With ``n = 2`` children the box pins ``a`` (``Σ_i u_ic = 1``
exactly, e.g. ``a_i = f_i/S`` when ``m = 0``): the conditional marginals given the parent's
cell are forced for *every* unbiased scheme that rounds one level at a time, and a child's
total inherits ``Σ_c (a_ic − 1/2) e_c``, a few persons over 2,016 cells. Below the cut the
levels are therefore rounded jointly (the network above); this scheme is kept between the
joint level and the cut, where the top holds no lower level.

The uniforms (one per entry of a child's bordered row, at most one used per cancelled cycle)
are drawn with :func:`~censusdp.estimation.integer.dependent.keyed_uniforms`, items keyed by
the global child index, so a partition regenerates its own draws and the integers do not
depend on the partitioning. The conditional marginals are a few passes over each parent's
block, compiled with the kernel.

:func:`round_children` keeps the earlier one-level-down scheme, conditioned systematic
sampling per (parent, cell) (Madow 1949; cells unbiased and consistent, totals not
controlled), for the non-negative product (:mod:`censusdp.estimation.integer.nonnegative`).

**The top.** When every invariant is a total (e.g. the nation's and the states') and the cut
is below the root, the levels down to the cut are one network too (:func:`_top_network`): the
root's total arc from a source, its cell arcs into a sink, a return arc from the sink to the
source, every lower node's total and cell arcs as below the cut. Nothing is given from above,
so every cell *and every node total* down to the cut is the floor or ceiling of its real
value, unbiased, with the exact variance ``ψ(1 − ψ)``; invariant totals are integral arcs and
stay. The cut nodes' cell arcs leave their own total vertex, so their errors are pairwise
non-positively correlated (property B3), as the networks below need. (On a 16,000-block
synthetic state with five counties, at the production budget, counties moved by 1.12 persons
RMS when rounded one level at a time from the state, 0.31 in the network.) Otherwise:

Invariants at the root (a laminar family of cell sets, e.g. the nation total)
are kept by pipage rounding of the root's cells on that family
(:func:`~censusdp.estimation.integer.laminar.pipage_round`, Ageev & Sviridenko 2004). Invariants at
the root's children (state totals, or marginals whose rows are laminar) make each state's
invariant rows fixed sums *and* the nation's cells real column sums: the (states × cells)
matrix, one block of columns per atom of the invariant rows, is rounded by controlled
unbiased rounding (Cox 1987; cycle cancelling as in Gandhi, Khuller, Parthasarathy &
Srinivasan 2006, :func:`~censusdp.estimation.integer.laminar.round_bipartite`'s), and the nation is
the column sums: every state row exact, every nation cell within ⌊·⌋/⌈·⌉, every state cell
unbiased. Root invariants must then be unions of the children's atoms (they are exact as
sums of exact rows); invariants deeper than the root's children, or root rows that cut
across the children's atoms, are refused (:class:`~censusdp.errors.SpecError`, naming them):
no conditioned rounding of a (children × cells) matrix with both margins fixed by random
integers keeps every cell unbiased.

**Float resolution.** Near 2⁵³ a value holds no fraction, so sums of fractions can miss an
integer target by one: every group settles exactly at its parent's integer (a child whose
fraction the sampling missed takes the unit; beyond that only within float resolution, on
the child of largest magnitude, see :func:`~censusdp.estimation.integer.laminar.snap_invariants`,
which also settles the invariants at the top); a real inconsistency is a
:class:`~censusdp.errors.DataError` naming level, node and cell.

**Rounding variances.** Each detailed cell's rounding error is ``Z − f`` with ``Z ~
Bernoulli(f)``: variance ``f(1 − f)``, exact. A node's total error is ``Y + η``: ``Y = Σ_c A_c
e_c`` its share of an ancestor's cell errors (its parent's one level at a time; the cut
node's below the cut) and ``η`` the rounding of its conditional total to its floor or ceiling,
mean zero given ``Y``, so ``Var = Var Y + E[r(1 − r)]`` with ``r`` the fractional part of the
conditional total. Every level's cell errors are pairwise non-positively correlated when the
joint level's are (``e_child = a·e_parent + ξ``, ``a ≥ 0``, ``ξ`` the bits of one row or of
one leaf's total vertex given ``p``: Gandhi et al. 2006, property B3), so ``Var Y ≤ Σ A² v``
(``v = φ(1 − φ)``) and, splitting ``A − Ā`` into its positive and negative halves, ``≤ (Ā
sd_parent + √P + √M)²`` (:func:`total_variance_bound`); ``E[r(1 − r)] ≤ ψ(1 − ψ) + …``
(:func:`fresh_variance_bound`, exact ``ψ(1 − ψ)`` when ``Y = 0``). At the joint level the
total's variance is exact (``ψ(1 − ψ)`` per independently rounded atom). :class:`RoundedLevels`
carries these per node and level (``spread``); :func:`rounding_variance_bound` adds the cells'
exact variances and, for other rows, ``Σ_A f(1 − f)`` where the node's cell errors are
pairwise non-positively correlated (one level at a time, and the leaves of the networks) or
Minkowski's ``(Σ_A √(f(1 − f)))²`` (inner nodes of the networks, whose cell arcs share no
vertex). On 200 releases of a PPMF county file at the production budget the totals' bound is
1.3–1.4 times the simulated rounding SD at tracts and block groups, 1.3 at blocks
(tests/pipelines/test_ppmf_rounding_coverage.py): intervals from it over-cover there (block
groups 96.8% at 90%), and the bounds of other rows are Minkowski's at the networks' inner
nodes, many times too large. So releases use the replicates below where no exact value is
known.

**Replicate rounding variances** (:func:`replicate_keys`, :func:`replicate_errors`,
:func:`replicate_variance`, :func:`rounding_replicates`). The rounding is post-processing of
the real estimates ``x`` with its own keyed randomness, independent of the noise. Rounding
the *same* ``x`` again with ``R`` independent keys (the key domain ``REPLICATES``:
``rng.child("rounding-replicates").child(str(r))``, never the release's
``rng.child("rounding")``) gives, for any linear row ``q`` (a P1–P5 column, an area's sum),
errors ``Z_r = q·N_r − q·x`` that are, given ``x``, independent and distributed as the
release's own ``Z = q·N − q·x``, with ``E[Z | x] = 0`` (every cell unbiased). Hence

    V̂ = (1/R) Σ_r Z_r²,   E[V̂ | x] = Var(Z | x),

unbiased (the mean is known, so no degree of freedom is spent on it), and since ``E[Z | x]
= 0`` the GLS error ``q·x − q·truth`` and ``Z`` are uncorrelated: ``Var(q·N − q·truth) =
Var_GLS + E[Var(Z | x)]``, estimated unbiasedly by ``Var_GLS + V̂`` (``Var_GLS`` exact). This
is how the ACS publishes margins of error from replicates (Fay & Train 1995), here with
replicates of the rounding alone, which is known exactly as a law. ``Var(V̂ | x) = (E[Z⁴ |
x] − Var(Z | x)²)/R``: for near-normal ``Z`` the relative SD of ``V̂`` is ``√(2/R)``, and
``± z·se`` intervals cover at least as a Student ``t`` with ``R`` degrees of freedom does
when the rounding dominates (89.0% at nominal 90% for ``R = 32``), the nominal rate when the
GLS error does. A replicate needs the estimates only, so the standard errors stay
post-processing of the measurements: no privacy cost. Each replicate costs one more
rounding (the top and every partition, from the replicate's own cut integers, so the
replicate's law is the release's whole law, cut nodes' errors included).

References
----------
Fay, R. E. & Train, G. F. (1995). Aspects of survey and model-based postcensal estimation
    of income and poverty characteristics for states and counties. Proc. Section on
    Government Statistics, ASA (successive difference replication, the ACS's MOEs).
Madow, W. G. (1949). On the theory of systematic sampling, II. Ann. Math. Stat. 20(3).
Cox, L. H. (1987). A constructive procedure for unbiased controlled rounding. JASA 82(398).
Ageev, A. & Sviridenko, M. (2004). Pipage rounding. J. Comb. Optim. 8.
Gandhi, R., Khuller, S., Parthasarathy, S. & Srinivasan, A. (2006). Dependent rounding and
    its applications to approximation algorithms. J. ACM 53(3).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from censusdp.errors import DataError, SpecError
from censusdp.estimation.integer.dependent import (
    aes_uniform_draws,
    dependent_round,
    flow_round,
    keyed_uniforms,
)
from censusdp.estimation.integer.laminar import (
    INT_LIMIT,
    TOL,
    bordered,
    cancel_cycles,
    check_laminar,
    invariant_chain,
    invariant_rows,
    pipage_round,
    rounding_variance,
    settle_row_sums,
    snap_invariants,
    split_fraction,
)
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.mechanisms.product_measure import ProductInvariant
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import Invariant
from censusdp.options import with_keywords
from censusdp.rng import KeyedRNG, chunk_range
from censusdp.schema import Schema

__all__ = [
    "RoundedLevels",
    "cell_matrix",
    "check_roundable",
    "round_children",
    "TopShape",
    "top_shape",
    "round_structured_top",
    "PartitionOptions",
    "round_structured_partition",
    "round_structured",
    "rounding_variance_bound",
    "rounded_query_variances",
    "REPLICATES",
    "MAX_REPLICATES",
    "replicate_keys",
    "replicate_errors",
    "replicate_variance",
    "rounding_replicates",
]

LABEL = "rounding/structured"

#: The key domain of the replicate roundings (module docstring, "Replicate rounding
#: variances"): replicate ``r`` draws from ``rng.child(REPLICATES).child(str(r))``.
REPLICATES = "rounding-replicates"
#: The most replicates a release may ask for (each is one more rounding of everything).
MAX_REPLICATES = 1000


@dataclass(frozen=True, eq=False)
class RoundedLevels:
    """Integer cell tensors of consecutive levels.

    Attributes
    ----------
    counts : list of numpy.ndarray
        int64 ``(n_nodes, *schema.shape)`` per level.
    spread : list of numpy.ndarray, or None
        Per level ``(n_nodes,)``: a bound on the rounding variance of each node's *total*
        (module docstring, "Rounding variances"; exact at the jointly rounded level). None
        when not asked for.
    negative : bool
        Whether the jointly rounded level's bits are pairwise non-positively correlated
        (controlled rounding of the children, or pipage of the root's cells as one group);
        every level's cell errors below it are then too, which the bounds use.
    joint : int
        The jointly rounded level (0: the root by pipage; 1: its children by controlled
        rounding).
    total_cap : float
        A bound on the rounding variance of a node's total above the joint level (1/4 per
        invariant atom).
    flow : int or None
        The level whose nodes' subtrees were rounded as one network each (None: none).
    top_network : bool
        Whether the levels down to the cut were rounded as one network (the root's cells
        free: every node's total there the floor or ceiling of its real total).
    """

    counts: list[np.ndarray]
    spread: list[np.ndarray] | None
    negative: bool = False
    joint: int = 0
    total_cap: float = np.inf
    flow: int | None = None
    top_network: bool = False

    def total_is_exact(self, level: int) -> bool:
        """Whether :attr:`spread` at ``level`` (of :attr:`counts`) is the *exact* rounding
        variance of each node's total, not a bound: every level of the top network down to
        the cut (each total an arc, its floor or ceiling: ``ψ(1 − ψ)``), else the jointly
        rounded level (module docstring, "Rounding variances")."""
        if self.top_network:
            last = self.flow if self.flow is not None else len(self.counts) - 1
            return 0 <= level <= last
        return level == self.joint


@dataclass(frozen=True, eq=False)
class TopShape:
    """How the invariants are held (from :func:`top_shape`).

    Attributes
    ----------
    root_groups : list of numpy.ndarray
        Pipage groups of the root's cells in ``order`` (finest first), when the root's
        children hold no invariant.
    order : numpy.ndarray
        Cell order making every root group contiguous.
    atoms : numpy.ndarray or None
        Atom label of every cell for the children's controlled rounding (None: the children
        hold no invariant).
    invariants : tuple of Invariant
        The invariants as flat queries (levels 0 and 1), for the float-resolution snap and
        the ``==`` check.
    """

    root_groups: list[np.ndarray]
    order: np.ndarray
    atoms: np.ndarray | None
    invariants: tuple[Invariant, ...]

    @property
    def joint_level(self) -> int:
        """The level whose cells are rounded jointly (0: the root; 1: its children)."""
        return 0 if self.atoms is None else 1


def cell_matrix(schema: Schema, x: np.ndarray, what: str) -> np.ndarray:
    """Cell tensors ``(n, *schema.shape)`` as a matrix ``(n, n_cells)`` (a view, C order).

    Raises
    ------
    SpecError
        Tensors of another shape than the schema's (``what`` names them).
    """
    a = np.asarray(x)
    if a.shape[1:] != tuple(schema.shape):
        raise SpecError(
            f"{what}: cell tensors have shape {a.shape[1:]}, expected the schema "
            f"{schema.name!r} shape {tuple(schema.shape)}"
        )
    return a.reshape(a.shape[0], -1)


def check_roundable(x: np.ndarray, level: str, codes, cells: Sequence[str]) -> None:
    """Refuse estimates that cannot be rounded to int64 counts.

    ``x`` is ``(n_nodes, n_cells)``; ``codes`` the nodes' codes (None: named by position).

    Raises
    ------
    DataError
        A NaN, infinite or ±2^62-exceeding estimate, naming the level, node and cell.
    """
    if x.size == 0:
        return
    top = max(float(x.max()), -float(x.min()))  # NaN propagates
    if np.isfinite(top) and top < INT_LIMIT:
        return
    bad = ~np.isfinite(x)
    big = np.abs(np.where(bad, 0.0, x)) >= INT_LIMIT
    for mask, what in ((bad, "is not finite (NaN or infinite)"), (big, "exceeds ±2^62")):
        if mask.any():
            i, c = np.argwhere(mask)[0]
            node = str(codes[i]) if codes is not None and len(codes) else f"#{i}"
            raise DataError(
                f"cannot round the release: the estimate at level {level!r}, node {node!r}, "
                f"cell {cells[c]!r} {what}; integer counts must fit in int64 — check the "
                "estimator's output"
            )


def top_shape(
    hierarchy: Hierarchy, schema: Schema, invariants: Sequence[ProductInvariant] = ()
) -> TopShape:
    """Check that the invariants fit the structured rounding and plan how to hold them.

    Raises
    ------
    SpecError
        An invariant below the root's children, not a 0/1 query, rows that cross (no laminar
        family), or a root invariant row that cuts across the children's invariant atoms;
        the message names the invariant (level, query) and says what would work.
    """
    names = hierarchy.names
    cells = schema.cells
    flat: list[Invariant] = []
    for iv in invariants:
        k = hierarchy.level_index(iv.level)
        if k >= 2:
            raise SpecError(
                f"the structured rounding holds invariants at the root and its children only "
                f"(levels {names[0]!r}, {names[1]!r}); the invariant at level {names[k]!r}, "
                f"query {iv.query.name!r} is deeper: no top-down unbiased rounding keeps a "
                "(children × cells) matrix with both margins fixed; drop it, or round a flat "
                "release with estimation.rounding.round_release"
            )
        if not isinstance(iv.query, ProductQuery) or iv.query.schema is not schema:
            raise SpecError(
                f"invariant at level {names[k]!r}: query {getattr(iv.query, 'name', iv.query)!r} "
                f"is not a product query over schema {schema.name!r}"
            )
        flat.append(Invariant(k, iv.query.to_query(), np.asarray(iv.values)))
    rows = invariant_rows(names[:2], cells, flat)
    check_laminar(names, rows)
    K = len(cells)
    atoms = None
    groups: list[np.ndarray] = []
    order = np.arange(K)
    kids = [s for lv, s, _ in rows if lv == 1]
    if kids:
        sig = np.vstack(kids)
        atoms = np.unique(sig.T, axis=0, return_inverse=True)[1].reshape(-1)
        n_atoms = int(atoms.max()) + 1
        for lv, r, iv in rows:
            if lv != 0:
                continue
            hits = np.bincount(atoms, weights=r, minlength=n_atoms)
            if np.any((hits > 0) & (hits < np.bincount(atoms, minlength=n_atoms))):
                raise SpecError(
                    f"the root invariant {iv.query.name!r} (level {names[0]!r}) cuts across "
                    f"the sets the invariants at level {names[1]!r} fix: the structured "
                    "rounding keeps root sums of those sets only; hold the root invariant "
                    "at the children's level too, or drop it"
                )
    else:
        chain = invariant_chain(names, np.arange(K), [(s, iv) for _, s, iv in rows])
        chain = [*chain, np.zeros(K, np.int64)]  # the root total within floor/ceil too
        order = np.lexsort(tuple(chain))
        ids = []
        for lvl in range(len(chain)):
            key = np.stack([c[order] for c in chain[lvl:]], axis=1)
            change = np.r_[True, np.any(key[1:] != key[:-1], axis=1)]
            ids.append(np.cumsum(change) - 1)
        groups = [ids[0]]
        for lvl in range(1, len(chain)):
            first = np.flatnonzero(np.r_[True, ids[lvl - 1][1:] != ids[lvl - 1][:-1]])
            groups.append(ids[lvl][first])
    return TopShape(groups, order, atoms, tuple(flat))


def _frac_var(x: np.ndarray, tol: float) -> np.ndarray:
    """``ψ(1 − ψ)`` of each value's fractional part ``ψ`` (0 within ``tol`` of an integer)."""
    return rounding_variance(np.asarray(x, dtype=float), tol)


def fresh_variance_bound(psi: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A bound on ``E[r(1 − r)]``, ``r`` the fractional part of ``T + Y``, ``T`` a real with
    fractional part ``ψ`` and ``Y`` a mean-zero shift of variance at most ``v``.

    ``r(1 − r)`` is the variance of rounding ``T + Y`` unbiasedly to its floor or ceiling
    (a node's total given its conditional value). On ``|Y| < m = min(ψ, 1 − ψ)`` it is the
    parabola ``ψ(1 − ψ) + (1 − 2ψ)Y − Y²`` ≤ its tangent, elsewhere at most 1/4; with ``q =
    min(1, v / m²)`` ≥ P(|Y| ≥ m) (Chebyshev) and ``|E[Y; |Y| ≥ m]| ≤ √(v q)``
    (Cauchy–Schwarz):

        E[r(1 − r)] ≤ min(1/4, ψ(1 − ψ) + (1/4 − ψ(1 − ψ)) q + |1 − 2ψ| √(v q)),

    exactly ``ψ(1 − ψ)`` when ``v = 0``.
    """
    psi = np.asarray(psi, dtype=float)
    v = np.maximum(np.asarray(v, dtype=float), 0.0)
    m = np.minimum(psi, 1.0 - psi)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(v > 0.0, np.minimum(1.0, v / (m * m)), 0.0)
    q = np.where(np.isfinite(q), q, 1.0)
    pv = psi * (1.0 - psi)
    return np.minimum(0.25, pv + (0.25 - pv) * q + np.abs(1.0 - 2.0 * psi) * np.sqrt(v * q))


@njit(cache=True, nogil=True, inline="always")
def _block_sum(a, lo, n):
    """numpy's sum of at most 128 contiguous values (:func:`pairwise_sum`'s leaves)."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    end = n - n % 8
    while i < end:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True, nogil=True)
def pairwise_sum(a, lo, n, frames, left):
    """``a[lo : lo + n].sum()`` added as numpy adds a contiguous row: pairwise (Higham 1993),
    blocks of at most 128 in eight running sums, longer runs halved at a multiple of 8
    (numpy's ``pairwise_sum``, ``numpy/_core/src/umath/loops_utils.h.src``), so a compiled
    kernel gives numpy's bits. The halving is walked with an explicit stack (numba's cache
    does not keep recursive functions): ``frames`` (≥ 64, 3) int64 and ``left`` (≥ 64,)
    float64 scratch."""
    if n <= 128:
        return _block_sum(a, lo, n)
    top = 0
    frames[0, 0], frames[0, 1], frames[0, 2] = lo, n, 0
    ret = 0.0
    while top >= 0:
        f_lo, f_n, stage = frames[top, 0], frames[top, 1], frames[top, 2]
        if f_n <= 128:
            ret = _block_sum(a, f_lo, f_n)
            top -= 1
            continue
        n2 = f_n // 2
        n2 -= n2 % 8
        if stage == 0:  # the left half first
            frames[top, 2] = 1
            top += 1
            frames[top, 0], frames[top, 1], frames[top, 2] = f_lo, n2, 0
        elif stage == 1:  # then the right
            left[top] = ret
            frames[top, 2] = 2
            top += 1
            frames[top, 0], frames[top, 1], frames[top, 2] = f_lo + n2, f_n - n2, 0
        else:
            ret = left[top] + ret
            top -= 1
    return ret


@njit(cache=True, nogil=True)
def _scale_rows(a, B, rows):
    """``a[i] *= B[rows[i]]`` in place (no gathered copy of ``B``); returns ``a``."""
    n, K = a.shape
    for i in range(n):
        r = rows[i]
        for c in range(K):
            a[i, c] = a[i, c] * B[r, c]
    return a


@njit(cache=True, nogil=True)
def _share_variance(A, v, v_row, sd_parent, negative, out):
    """``Var Y``'s bound of :func:`total_variance_bound` row by row (node ``i``'s shares
    ``A[i]``, its ancestor's variances ``v[v_row[i]]``), each row's products in one scratch
    row and summed as numpy sums them: the same bits as the array expressions, without
    their (n, K) temporaries."""
    n, K = A.shape
    buf = np.empty(K)
    fr = np.empty((64, 3), np.int64)
    lf = np.empty(64)
    for i in range(n):
        vi = v[v_row[i]]
        S0 = pairwise_sum(vi, 0, K, fr, lf)
        for c in range(K):
            buf[c] = A[i, c] * vi[c]
        S1 = pairwise_sum(buf, 0, K, fr, lf)
        abar = S1 / S0 if S0 > 0.0 else 0.0
        if negative:
            for c in range(K):
                buf[c] = A[i, c] * A[i, c] * vi[c]
            S2 = pairwise_sum(buf, 0, K, fr, lf)
            for c in range(K):
                d = A[i, c] - abar
                d = d if d > 0.0 else 0.0
                buf[c] = d * d * vi[c]
            P = pairwise_sum(buf, 0, K, fr, lf)
            for c in range(K):
                d = A[i, c] - abar
                d = d if d < 0.0 else 0.0
                buf[c] = d * d * vi[c]
            M = pairwise_sum(buf, 0, K, fr, lf)
            w = abar * sd_parent[i] + np.sqrt(P) + np.sqrt(M)
            out[i] = min(S2, w * w)
        else:
            for c in range(K):
                buf[c] = A[i, c] * np.sqrt(vi[c])
            s = pairwise_sum(buf, 0, K, fr, lf)
            for c in range(K):
                buf[c] = abs(A[i, c] - abar) * np.sqrt(vi[c])
            w = abar * sd_parent[i] + pairwise_sum(buf, 0, K, fr, lf)
            out[i] = min(s * s, w * w)


def total_variance_bound(
    shares: np.ndarray,
    v: np.ndarray,
    sd_parent: np.ndarray,
    psi: np.ndarray,
    negative: bool,
    v_rows: np.ndarray | None = None,
) -> np.ndarray:
    """A bound on the rounding variance of each node's total (module docstring).

    A node's total error is ``Y + η``: ``Y = Σ_c A_c e_c`` its share of an ancestor's cell
    errors ``e`` (variances ``v``, pairwise non-positively correlated when ``negative``; their
    sum has standard deviation at most ``sd_parent``) and ``η`` the rounding of the node's
    conditional total to its floor or ceiling (mean zero given ``Y``). With ``Ā = Σ A v / Σ
    v`` and non-negative shares ``A``,

        Var Y ≤ min(Σ A² v,  (Ā sd_parent + √P + √M)²),   P, M = Σ_{A ≷ Ā} (A − Ā)² v

    (the first by the non-positive correlations; the second by Minkowski on ``Y = Ā Σ e +
    Σ (A − Ā)⁺ e − Σ (A − Ā)⁻ e``, each half bounded as the first), else the
    Minkowski bounds ``(Σ A √v)²`` and ``(Ā sd_parent + Σ |A − Ā| √v)²``; plus
    :func:`fresh_variance_bound` of ``ψ`` (the node's real total's fractional part).

    Parameters
    ----------
    shares, v : (n, K) arrays
        ``A`` and the ancestor's per-cell error variances (broadcast to the nodes; with
        ``v_rows``, ``v`` holds one row per ancestor).
    sd_parent : (n,) array
        A bound on the standard deviation of the ancestor's total error.
    psi : (n,) array
        Fractional part of each node's real-valued total.
    negative : bool
        Whether the ancestor's cell errors are pairwise non-positively correlated.
    v_rows : (n,) array of int, optional
        Each node's row of ``v`` (its ancestor), so that ``v`` need not be repeated per
        node.

    Returns
    -------
    (n,) numpy.ndarray
    """
    A = np.asarray(shares, dtype=float)
    v = np.ascontiguousarray(v, dtype=float)
    n = A.shape[0]
    rows = np.arange(n) if v_rows is None else np.ascontiguousarray(v_rows, np.int64)
    sd = np.ascontiguousarray(np.broadcast_to(np.asarray(sd_parent, dtype=float), (n,)))
    vy = np.empty(n)
    _share_variance(A, v, rows, sd, bool(negative), vy)
    return vy + fresh_variance_bound(psi, vy)


#: Children's cells worked on at a time (per chunk of whole parent groups): bounds the
#: temporaries of one level of one partition to a few times this many float64s.
_CHUNK_CELLS = 1 << 18
#: From this many cells per node on, running sums go child row by child row (each row a
#: vector of cells); below it, rank by rank over every parent of a chunk at once.
_ROW_LOOP_CELLS = 64


def round_children(
    parent: np.ndarray,
    x: np.ndarray,
    count: np.ndarray,
    v: np.ndarray,
    w_parent: np.ndarray | None,
    where: tuple[str, Forest, int, Sequence[str]],
    tol: float,
) -> tuple[np.ndarray, np.ndarray | None]:
    """One level down by conditioned systematic sampling (module docstring): every child's
    cell is the floor or ceiling of its estimate, the children of a parent sum to the
    parent's integers cell by cell, each cell unbiased given the parent.

    Shared with :mod:`censusdp.estimation.integer.nonnegative`, which rounds its projected children
    with the same sampling. ``where`` is ``(label, forest, level, cells)`` for messages;
    ``tol`` the tolerance of the children's sums to their parent's.

    ``parent`` (n_p, K) int64, ``x`` (n_c, K) children sorted by parent, ``count`` (n_p,)
    children per parent, ``v`` (n_p, K) keyed uniforms, ``w_parent`` (n_p, K) spreads (None:
    not computed). Whole parent groups are worked on a chunk at a time in one reused
    workspace (no allocation per chunk); every running sum is taken child by child within
    its group, so chunks change no bit.
    """
    n_p, K = parent.shape
    out = np.empty(x.shape, np.int64)
    w = None if w_parent is None else np.empty(x.shape)
    start = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    step = max(1, _CHUNK_CELLS // max(1, K))
    cuts = [0]
    while cuts[-1] < n_p:
        p0 = cuts[-1]
        p1 = int(np.searchsorted(start, start[p0] + step, side="right")) - 1
        cuts.append(min(max(p1, p0 + 1), n_p))
    bounds = np.asarray(cuts)
    rows = int(np.diff(start[bounds]).max(initial=0))
    ws = np.empty((2 if w is None else 7, rows, K))
    for p0, p1 in zip(cuts[:-1], cuts[1:], strict=True):
        lo, hi = int(start[p0]), int(start[p1])
        _chunk(
            parent[p0:p1],
            x[lo:hi],
            count[p0:p1],
            v[p0:p1],
            None if w_parent is None else w_parent[p0:p1],
            out[lo:hi],
            None if w is None else w[lo:hi],
            ws[:, : hi - lo],
            p0,
            where,
            tol,
        )
    return out, w


def _chunk(
    parent: np.ndarray,
    x: np.ndarray,
    count: np.ndarray,
    v: np.ndarray,
    w_parent: np.ndarray | None,
    out: np.ndarray,
    w_out: np.ndarray | None,
    ws: np.ndarray,
    first_parent: int,
    where: tuple[str, Forest, int, Sequence[str]],
    tol: float,
) -> None:
    n_p, K = parent.shape
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    nz = np.flatnonzero(count > 0)
    heads = start[nz]
    last = heads + count[nz] - 1
    par = np.repeat(np.arange(n_p), count)
    # P_i = x_1 + … + x_i within each (parent, cell) group, child by child: by child row (a
    # vector of K cells) when K is large, else by rank (vectorised over the parents); both
    # add the same numbers in the same order, so no bit depends on the chunk. The number of
    # points u + k in [P_{i−1}, P_i) is ⌊x_i⌋ + [a point in the fractional part], i.e. the
    # systematic sampling of the fractions, without splitting x.
    P, G = ws[0], ws[1]
    if K >= _ROW_LOOP_CELLS:
        head = np.zeros(x.shape[0], bool)
        head[heads] = True
        for i in range(x.shape[0]):
            if head[i]:
                P[i] = x[i]
            else:
                np.add(P[i - 1], x[i], out=P[i])
    else:
        for r in range(int(count.max(initial=0))):
            rows = start[count > r] + r
            P[rows] = x[rows] if r == 0 else P[rows - 1] + x[rows]
    S = P[last]
    m = np.floor(S)
    phi = S - m
    N = parent[nz]
    vv = v[nz]
    u = np.zeros((n_p, K))
    u[nz] = np.where(N - m >= 1, vv * phi, phi + vv * (1.0 - phi))
    np.take(u, par, axis=0, out=G)
    np.subtract(P, G, out=G)
    np.ceil(G, out=G)  # ⌈P_i − u⌉: the points u + k below P_i
    miss = N - G[last].astype(np.int64)
    # x_i rounded = ⌈P_i − u⌉ − ⌈P_{i−1} − u⌉, with ⌈0 − u⌉ = 0 before a group's first child
    np.subtract(G[1:], G[:-1], out=out[1:], casting="unsafe")
    out[heads] = G[heads]
    if w_out is not None:
        # slope of E[child bit | parent bit]: (L − f φ) / (φ (1 − φ)), L the part of the
        # child's fractional interval [a, a + f) (mod 1) below φ; w = slope · w_parent
        f, a, hi, L, ph = ws[2], ws[3], ws[4], ws[5], ws[6]
        phis = np.zeros((n_p, K))
        phis[nz] = phi
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where((phis > 0.0) & (phis < 1.0), w_parent / (phis * (1.0 - phis)), 0.0)
        np.take(phis, par, axis=0, out=ph)
        np.floor(x, out=f)
        np.subtract(x, f, out=f)
        a[1:] = P[:-1]  # P_{i−1} mod 1
        a[heads] = 0.0
        np.floor(a, out=hi)
        a -= hi
        np.add(a, f, out=hi)
        np.minimum(hi, ph, out=L)
        L -= a
        np.maximum(L, 0.0, out=L)
        ph += 1.0
        np.minimum(hi, ph, out=hi)
        hi -= 1.0
        np.maximum(hi, 0.0, out=hi)
        L += hi
        ph -= 1.0
        np.multiply(f, ph, out=f)
        L -= f
        np.take(q, par, axis=0, out=ph)
        np.multiply(L, ph, out=w_out)
    if miss.any():
        _settle(out, x, heads, count[nz], nz + first_parent, miss, tol, where)


@njit(cache=True, nogil=True, inline="always")
def _cap(f, phi):
    """Largest ``a`` keeping ``f + e·a`` in [0, 1] for both parent outcomes
    ``e ∈ {−φ, 1 − φ}``."""
    if phi <= 0.0:
        return 1.0 - f
    if phi >= 1.0:
        return f
    return min(f / phi, (1.0 - f) / (1.0 - phi))


@njit(cache=True, nogil=True, inline="always")
def _raise_levels(u, n, t, capped, free, act):
    """Water-filling of :func:`conditional_shares`' levels ``t`` (K,) over the caps ``u``
    (first ``n`` rows), given the first pass's ``capped`` sums and ``free`` counts: each
    later pass re-sums only the columns whose level rose in the pass before."""
    K = t.shape[0]
    na = K
    for c in range(K):
        act[c] = c
    for it in range(n + 1):
        if it > 0:
            for k in range(na):
                capped[act[k]] = 0.0
                free[act[k]] = 0
            for i in range(n):
                for k in range(na):
                    c = act[k]
                    uc = u[i, c]
                    if uc <= t[c]:
                        capped[c] += uc
                    else:
                        free[c] += 1
        moved = 0
        for k in range(na):
            c = act[k]
            if free[c] > 0:
                nt = (1.0 - capped[c]) / free[c]
                if nt > t[c]:
                    t[c] = nt
                    act[moved] = c
                    moved += 1
        na = moved
        if na == 0:
            break


@njit(cache=True, nogil=True)
def conditional_shares(x, fl_par, p_par, starts, p, fl, a_out, phi_out, dev, extremes):
    """The children's conditional fractions ``p = f + d·a`` given their parents' values
    (module docstring, "One level down" and "Below the cut"), group by group, in one kernel
    for the one-level-down scheme and the networks.

    ``x`` (n_c, K) children sorted by parent, ``starts`` the groups' row boundaries,
    ``fl_par + p_par`` the parents' values (n_p, K): their integers ``N`` with ``p_par`` of
    no rows (one level down, the networks' first level), else the parents' conditional
    values. With ``f = x − ⌊x⌋``, ``S = Σ_i f``, ``m = ⌊S⌋`` and ``φ = S − m`` per column,
    the parent's target ``T = fl_par + p_par − Σ⌊x⌋`` clipped to ``[m, m + 1]``, its
    deviation ``d = T − S`` (``e`` of the docstring when the parent is an integer, in
    ``[−φ, 1 − φ]`` either way) and ``a_ic = min(t_c, u_ic)``, ``u = min(f/φ, (1 − f)/(1 −
    φ))`` the box (:func:`_cap`), ``t_c`` water-filled from ``1/n`` until ``Σ_i a_ic = 1``
    (the Euclidean projection of ``1/n`` on the box; Cox 1987 for the matrix, the box from
    the unbiasedness ``E[p] = f``). The caps are computed once per entry, and a column's
    level is raised again only if it rose in the last pass (an unmoved column's sums, hence
    its level, would not change): the same numbers in the same order as a full pass.

    Writes ``p``, ``fl = ⌊x⌋``, ``dev`` (n_p, K): how far the parent's value lies outside
    ``[Σ⌊x⌋ + m, Σ⌊x⌋ + m + 1]`` (0 for consistent estimates; float edges near 2⁵³ or
    inconsistent estimates otherwise; 0 for a childless parent), and, when ``phi_out`` has
    rows, the shares ``a`` and the parents' ``φ`` (``phi_out``, n_p × K; 0 for a childless
    parent); ``extremes`` gets ``max |x|`` and ``max
    |dev|`` (for the caller's resolution check without another pass over ``x``).
    """
    n_c, K = x.shape
    want = phi_out.shape[0] > 0
    real_par = p_par.shape[0] > 0
    big = 0
    for g in range(starts.size - 1):
        big = max(big, starts[g + 1] - starts[g])
    u = np.empty((big, K))
    S = np.empty(K)
    F = np.empty(K, np.int64)
    e = np.empty(K)
    phi = np.empty(K)
    t = np.empty(K)
    capped = np.empty(K)
    free = np.empty(K, np.int64)
    act = np.empty(K, np.int64)
    xmax = 0.0
    dmax = 0.0
    for g in range(starts.size - 1):
        lo, hi = starts[g], starts[g + 1]
        n = hi - lo
        if n == 0:  # a childless parent: nothing to share, nothing missed
            dev[g, :] = 0.0
            if want:
                phi_out[g, :] = 0.0
            continue
        S[:] = 0.0
        F[:] = 0
        for i in range(lo, hi):
            for c in range(K):
                xv = x[i, c]
                xmax = max(xmax, abs(xv))
                v = np.floor(xv)
                fl[i, c] = np.int64(v)
                p[i, c] = xv - v  # the fraction, for now
                S[c] += p[i, c]
                F[c] += np.int64(v)
        for c in range(K):
            m = np.floor(S[c])
            phi[c] = S[c] - m
            if want:
                phi_out[g, c] = phi[c]
            wv = np.float64(fl_par[g, c] - F[c])
            if real_par:
                wv += p_par[g, c]
            T = min(max(wv, m), m + 1.0)
            dev[g, c] = wv - T
            dmax = max(dmax, abs(wv - T))
            e[c] = T - S[c]
            t[c] = 1.0 / n
        # water-filling: the first pass over every column as the caps are computed, each
        # later pass over the columns still rising
        capped[:] = 0.0
        free[:] = 0
        for i in range(n):
            for c in range(K):
                uc = _cap(p[lo + i, c], phi[c])
                u[i, c] = uc
                if uc <= t[c]:
                    capped[c] += uc
                else:
                    free[c] += 1
        _raise_levels(u, n, t, capped, free, act)
        for i in range(lo, hi):
            for c in range(K):
                a = min(t[c], u[i - lo, c])
                q = p[i, c] + e[c] * a
                p[i, c] = 0.0 if q < 0.0 else (1.0 if q > 1.0 else q)
                if want:
                    a_out[i, c] = a
    extremes[0] = xmax
    extremes[1] = dmax


def round_children_controlled(
    parent: np.ndarray,
    x: np.ndarray,
    count: np.ndarray,
    uniforms: np.ndarray,
    want_spread: bool,
    where: tuple[str, Forest, int, Sequence[str]],
    tol: float,
) -> tuple[np.ndarray, np.ndarray | None]:
    """One level down by controlled rounding of each parent's (children × cells) matrix.

    Every child's cell is the floor or ceiling of its estimate and unbiased, the children of
    a parent sum to its integers cell by cell, and each child's total moves by about
    ``Σ_c a_ic e_c`` (≈ the parent's own total error over its number of children) plus less
    than 1 (module docstring).

    ``parent`` (n_p, K) int64, ``x`` (n_c, K) children sorted by parent, ``count`` (n_p,)
    children per parent, ``uniforms`` (n_c, K + 1) from
    :func:`~censusdp.estimation.integer.dependent.keyed_uniforms` by global child row;
    ``where`` is ``(label, forest, level, cells)`` for messages.

    Returns
    -------
    counts : (n_c, K) numpy.ndarray of int64
    spread : (n_c, 2, K) numpy.ndarray or None
        Per cell the share ``a`` of the parent's cell error and the parent's fraction ``φ``,
        for :func:`total_variance_bound` (None unless ``want_spread``).

    References
    ----------
    Cox (1987); Gandhi, Khuller, Parthasarathy & Srinivasan (2006).
    """
    n_c, K = x.shape
    starts = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    p = np.empty((n_c, K))
    fl = np.empty((n_c, K), np.int64)
    spread = np.empty((n_c, 2, K)) if want_spread else None
    a_out = spread[:, 0] if want_spread else np.empty((0, K))
    phi = np.empty(parent.shape if want_spread else (0, K))
    dev = np.zeros(parent.shape)  # an empty group misses nothing
    conditional_shares(
        np.ascontiguousarray(x, np.float64), np.ascontiguousarray(parent, np.int64),
        np.empty((0, K)), starts, p, fl, a_out, phi, dev, np.empty(2),
    )  # fmt: skip
    if want_spread:
        spread[:, 1] = np.repeat(phi, count, axis=0)
    # the parent's integer N is an integer target: its deviation is the whole number of
    # children up that the clipped target misses (float edges, or inconsistent estimates)
    miss = dev.astype(np.int64)
    out = fl
    # the kernel keeps each group's column sums (Σ p = T exactly up to float), so the
    # children sum to the parent wherever miss is 0
    out += dependent_round(p, starts, uniforms)
    if miss.any():
        nz = np.flatnonzero(count > 0)
        _settle(out, x, starts[nz], count[nz], nz, miss[nz], tol, where)
    return out, spread


def _settle(
    out: np.ndarray,
    x: np.ndarray,
    start: np.ndarray,
    count: np.ndarray,
    parents: np.ndarray,
    miss: np.ndarray,
    tol: float,
    where: tuple[str, Forest, int, Sequence[str]],
) -> None:
    """Groups whose sampled total missed the parent's integer (float edges only: a fraction
    lost below the resolution of ``C − u``, or values near 2⁵³): a unit goes to a child the
    sampling left down (or took up) with a fraction, else — within float resolution — to
    the child of largest magnitude; anything else is a DataError naming the group."""
    level, forest, j, cells = where
    for g, c in np.argwhere(miss != 0):  # a handful of groups at float edges
        lo, n = int(start[g]), int(count[g])
        d = int(miss[g, c])
        col = x[lo : lo + n, c]
        fl = np.floor(col)
        f = col - fl
        up = out[lo : lo + n, c] - fl.astype(np.int64)
        while d:
            cand = np.flatnonzero((f > 0) & ((up == 0) if d > 0 else (up == 1)))
            if cand.size == 0:
                break
            i = int(cand[np.argmax(f[cand])]) if d > 0 else int(cand[np.argmin(f[cand])])
            step = 1 if d > 0 else -1
            out[lo + i, c] += step
            up[i] += step
            d -= step
        if d:
            mag = np.abs(col)
            res = n * float(np.spacing(mag.max(initial=0.0)))
            if res < tol or abs(d) > 1 + np.floor(res):
                raise DataError(
                    f"cannot round the release: at level {level!r} the children of node "
                    f"{forest.code(j, int(parents[g]))!r}, cell {cells[c]!r}, do not sum to "
                    "their parent's value within the rounding tolerance; the estimates are "
                    "not consistent (parent = sum of children) — check the estimator"
                )
            out[lo + int(np.argmax(mag)), c] += d


def _snapped_var(phi: np.ndarray, tol: float) -> np.ndarray:
    """``φ(1 − φ)``, 0 where ``φ`` is within ``tol`` of 0 or 1 (an integral parent)."""
    return np.where((phi < tol) | (phi > 1.0 - tol), 0.0, phi * (1.0 - phi))


def _psi(x: np.ndarray, tol: float) -> np.ndarray:
    """Fractional part of each row's real total (0 within ``tol`` of an integer)."""
    t = x.sum(axis=1)
    psi = t - np.floor(t)
    psi[(psi < tol) | (psi > 1.0 - tol)] = 0.0
    return psi


def _descend(
    forest: Forest,
    lo: Sequence[int],
    n_global: Sequence[int],
    counts: np.ndarray,
    total_var: np.ndarray | None,
    estimates: Sequence[np.ndarray],
    rng: KeyedRNG,
    schema: Schema,
    label: str,
    tol: float,
    top: RoundedLevels,
) -> RoundedLevels:
    """Levels ``1 ..`` of ``forest`` from the integers of its level 0, one level at a time
    (the top's levels between the joint level and the cut); ``total_var`` the level-0 total
    variance bounds (None: none computed)."""
    cells = schema.cells
    out, sp = [], []
    parent = counts
    vt = total_var
    for j in range(1, forest.depth):
        name = forest.names[j]
        x = _level_matrix(schema, estimates[j - 1], forest, j)
        K = x.shape[1]
        u = keyed_uniforms(
            rng, f"{label}/{name}/controlled", n_global[j], lo[j], lo[j] + forest.sizes[j], K,
            aes_uniform_draws,
        )  # fmt: skip
        cnt = forest.child_count[j - 1]
        parent, w = round_children_controlled(
            parent, x, cnt, u, vt is not None, (name, forest, j - 1, cells), tol
        )
        out.append(parent.reshape(-1, *schema.shape))
        if vt is not None:
            par = np.repeat(np.arange(cnt.size), cnt)
            vt = total_variance_bound(
                w[:, 0], _snapped_var(w[:, 1], tol), np.sqrt(vt)[par], _psi(x, tol), top.negative
            )
            sp.append(vt)
    return RoundedLevels(
        out, sp if total_var is not None else None, top.negative, top.joint, top.total_cap
    )


#: Bytes of scratch each thread keeps between partitions (:func:`_scratch`); a buffer that
#: would take the total past this is allocated for the call and dropped.
_SCRATCH_BYTES = 1 << 30
_SCRATCH = threading.local()


def _scratch(name: str, n: int, dtype) -> np.ndarray:
    """An uninitialised 1-d ``dtype`` array of ``n`` items, reused by this thread's next call
    with ``name``: a partition's network and conditional values are written into memory
    the last partition touched, not fresh pages (first-touch faults and unmapping were
    ~30% of the rounding's CPU). Per thread, since partitions round on several threads;
    the caller must be done with a name's buffer before asking for it again."""
    pool = getattr(_SCRATCH, "pool", None)
    if pool is None:
        pool = _SCRATCH.pool = {}
    dt = np.dtype(dtype)
    buf = pool.get(name)
    if buf is not None and buf.dtype == dt and buf.size >= n:
        return buf[:n]
    kept = sum(b.nbytes for k, b in pool.items() if k != name)
    new = np.empty(n, dt)
    if kept + new.nbytes <= _SCRATCH_BYTES:
        pool[name] = new
    else:
        pool.pop(name, None)
    return new


def _flow(
    forest: Forest,
    lo: Sequence[int],
    n_global: Sequence[int],
    counts: np.ndarray,
    total_var: np.ndarray | None,
    estimates: Sequence[np.ndarray],
    rng: KeyedRNG,
    schema: Schema,
    label: str,
    tol: float,
    top: RoundedLevels,
) -> RoundedLevels:
    """Levels ``1 ..`` of ``forest``, each level-0 node's subtree rounded as one network
    (module docstring, "Below the cut"); ``total_var`` as for :func:`_descend`. Runs of
    whole subtrees of at most :data:`_FLOW_ARCS` arcs (at least one subtree) are rounded at
    a time, which bounds the temporaries; every subtree is its own component with its own
    keyed draws, so the runs change no bit."""
    K = schema.n_cells
    D = forest.depth - 1
    n0 = forest.sizes[0]
    if D == 0:
        return RoundedLevels([], [] if total_var is not None else None, top.negative,
                             top.joint, top.total_cap)  # fmt: skip
    # each root's node range at every level
    bounds = [np.arange(n0 + 1)]
    for j in range(1, D + 1):
        start = np.concatenate([[0], np.cumsum(forest.child_count[j - 1])])
        bounds.append(start[bounds[-1]])
    arcs = sum(np.diff(b) for b in bounds[1:]) * (K + 1) if D else np.zeros(n0)
    runs, r0, size = [], 0, 0
    for r in range(n0):
        if r > r0 and size + arcs[r] > _FLOW_ARCS:
            runs.append((r0, r))
            r0, size = r, 0
        size += arcs[r]
    runs.append((r0, n0))
    outs: list[list[np.ndarray]] = [[] for _ in range(D)]
    sps: list[list[np.ndarray]] = [[] for _ in range(D)]
    for a, b in runs:
        rng_j = [(int(bounds[j][a]), int(bounds[j][b])) for j in range(D + 1)]
        sub = Forest(
            forest.first, forest.names, [hi - lo_ for lo_, hi in rng_j],
            [forest.child_count[j][slice(*rng_j[j])] for j in range(D)], (),
        )  # fmt: skip
        part = _flow_chunk(
            sub, [lo[j] + rng_j[j][0] for j in range(D + 1)], n_global, counts[a:b],
            None if total_var is None else total_var[a:b],
            [estimates[j - 1][slice(*rng_j[j])] for j in range(1, D + 1)],
            rng, schema, label, tol, top, forest, [r[0] for r in rng_j],
        )  # fmt: skip
        for j in range(D):
            outs[j].append(part.counts[j])
            if part.spread is not None:
                sps[j].append(part.spread[j])
    shp = tuple(schema.shape)
    return RoundedLevels(
        [np.concatenate(o) if o else np.empty((0, *shp), np.int64) for o in outs],
        None if total_var is None else [np.concatenate(v) for v in sps],
        top.negative,
        top.joint,
        top.total_cap,
    )


#: Arcs of the networks rounded at a time (whole subtrees; ~80 bytes each while rounded).
_FLOW_ARCS = 1 << 22


@dataclass(frozen=True, eq=False)
class _Network:
    """The vertices and arcs of a run of subtrees' network (:func:`_flow_chunk`).

    Per node below level 0: its total arc (from its parent's total vertex) and its K cell
    arcs (into its parent's cell vertices; from its own total vertex at the leaves, from its
    own cell vertices above them). Arcs in subtree-major order (each subtree a component of
    :func:`~censusdp.estimation.integer.dependent.flow_round`), level by level within a
    subtree from the leaves up, so each leaf parent's (children × (total, cells)) arcs are
    one matrix, swept by 4-cycles before the walk."""

    sizes: list[int]  #: nodes per level
    t_off: np.ndarray  #: each level's first total vertex
    c_off: np.ndarray  #: each level's first cell vertex (levels above the leaves)
    m: int  #: arcs per node: the total, then the K cells
    n_arcs: int
    vdt: type  #: the vertex indices' dtype
    first: list[np.ndarray]  #: per level, each subtree's first node (and the end)
    arc_start: np.ndarray  #: each subtree's first arc (and the end)
    lvl_off: np.ndarray  #: (subtrees, levels below 0): each subtree's first arc of a level

    @classmethod
    def of(cls, forest: Forest, K: int) -> _Network:
        D = forest.depth - 1
        n_lv = [forest.sizes[j] for j in range(D + 1)]
        t_off = np.concatenate([[0], np.cumsum(n_lv)]).astype(np.int64)
        c_off = t_off[-1] + np.concatenate([[0], np.cumsum([s * K for s in n_lv[:D]])])
        m = K + 1
        E = sum(n_lv[1:]) * m
        vdt = np.int32 if c_off[-1] < 2**31 and E < 2**30 else np.int64
        first = [np.arange(n_lv[0] + 1)]
        for j in range(1, D + 1):
            first.append(np.concatenate([[0], np.cumsum(forest.child_count[j - 1])])[first[-1]])
        per = np.stack([np.diff(f) for f in first[1:]], axis=1) * m  # (n0, D) arcs per level
        arc_start = np.concatenate([[0], np.cumsum(per.sum(axis=1))]).astype(np.int64)
        below = np.cumsum(per[:, ::-1], axis=1)[:, ::-1] - per  # arcs of the deeper levels
        return cls(n_lv, t_off, c_off, m, E, vdt, first, arc_start, arc_start[:-1, None] + below)

    def rows(self, dst: np.ndarray, at: np.ndarray, n: int, dt) -> np.ndarray:
        """A level's ``(n, m)`` arcs of ``dst`` (first arcs ``at``): a view with one subtree,
        else scratch that :meth:`put` scatters."""
        if self.sizes[0] == 1:  # one subtree: each level's arcs are one slice
            return dst[at[0] : at[0] + n * self.m].reshape(n, self.m)
        return np.empty((n, self.m), dt)

    def put(self, dst: np.ndarray, at: np.ndarray, val: np.ndarray) -> None:
        """Scatter :meth:`rows`' scratch ``val`` into ``dst`` (nothing to do for a view)."""
        if self.sizes[0] != 1:
            dst[(at[:, None] + np.arange(self.m)).reshape(-1)] = val.reshape(-1)

    def take(self, src: np.ndarray, at: np.ndarray, n: int) -> np.ndarray:
        """A level's ``(n, m)`` arcs of ``src``."""
        if self.sizes[0] == 1:
            return src[at[0] : at[0] + n * self.m].reshape(n, self.m)
        return src[(at[:, None] + np.arange(self.m)).reshape(-1)].reshape(n, self.m)


def _level_matrix(schema: Schema, estimates: np.ndarray, forest: Forest, j: int) -> np.ndarray:
    """Level ``j``'s estimates as a checked float64 ``(n_nodes, cells)`` matrix."""
    name = forest.names[j]
    x = cell_matrix(schema, estimates, f"level {name!r}").astype(np.float64, copy=False)
    if x.shape[0] != forest.sizes[j]:
        raise SpecError(f"level {name!r}: {x.shape[0]} estimate rows for {forest.sizes[j]} nodes")
    check_roundable(x, name, None, schema.cells)
    return x


def _check_shares(
    dev: np.ndarray,
    extremes: np.ndarray,
    cnt: np.ndarray,
    j: int,
    names: tuple[Forest, Sequence[int], Sequence[str]],
) -> None:
    """A DataError naming level ``j``, parent and cell where the children's values miss
    their parent's (``dev``, :func:`conditional_shares`) beyond float resolution (from
    ``extremes``: the children's largest magnitude and the largest ``|dev|``); ``names`` is
    the whole forest, the run's first node per level in it, and the cells."""
    if not dev.size:
        return
    xmax, dmax = max(1.0, float(extremes[0])), float(extremes[1])
    res = 1e-6 + int(cnt.max(initial=1)) * float(np.spacing(xmax))
    if dmax > res:
        whole, offset, cells = names
        g, c = np.argwhere(np.abs(dev) > res)[0]
        raise DataError(
            f"cannot round the release: at level {whole.names[j]!r} the children of node "
            f"{whole.code(j - 1, int(g) + offset[j - 1])!r}, cell {cells[c]!r}, do not sum to "
            "their parent's value within the rounding tolerance; the estimates are "
            "not consistent (parent = sum of children) — check the estimator"
        )


@dataclass(eq=False)
class _Levels:
    """Per level below a run's level 0 (:func:`_conditional_levels`): the estimates, the
    floors, the conditional fractions ``p`` (None once written into the network), each node's
    first arc and parent, and the totals' variance bounds (empty when not asked for)."""

    xs: list[np.ndarray]
    fls: list[np.ndarray | None]
    ps: list[np.ndarray | None]
    pos: list[np.ndarray]
    par: list[np.ndarray]
    spread: list[np.ndarray]


def _conditional_levels(
    forest: Forest,
    estimates: Sequence[np.ndarray],
    N: np.ndarray,
    total_var: np.ndarray | None,
    schema: Schema,
    net: _Network,
    top: RoundedLevels,
    tol: float,
    names: tuple[Forest, Sequence[int], Sequence[str]],
) -> _Levels:
    """Carry the cut nodes' integers ``N`` down affinely, level by level (module docstring,
    "Below the cut": ``p = f + d·a``), with the totals' variance bounds
    (:func:`total_variance_bound`, from the products ``A`` of the shares down the path);
    ``names`` as for :func:`_check_shares`."""
    K = schema.n_cells
    out = _Levels([], [], [], [], [], [])
    fl_par, p_par = N, np.empty((0, K))
    root_prev = np.arange(net.sizes[0])
    A_prev = A = None
    v0 = sd0 = None
    for j in range(1, forest.depth):
        x = np.ascontiguousarray(_level_matrix(schema, estimates[j - 1], forest, j))
        cnt = forest.child_count[j - 1]
        starts = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64)
        n = x.shape[0]
        p = _scratch(f"p{j}", n * K, np.float64).reshape(n, K)
        fl = np.empty((n, K), np.int64)  # becomes the level's counts: the caller keeps it
        a = _scratch(f"a{j}", n * K, np.float64).reshape(n, K)  # A_prev: the level above's
        phi = _scratch("phi", cnt.size * K, np.float64).reshape(cnt.size, K)
        dev = _scratch("dev", cnt.size * K, np.float64).reshape(cnt.size, K)  # all written
        extremes = np.empty(2)
        conditional_shares(
            x, fl_par, p_par, starts, p, fl, a, phi, dev,
            extremes,
        )  # fmt: skip
        _check_shares(dev, extremes, cnt, j, names)
        pj = np.repeat(np.arange(cnt.size), cnt)
        root_prev = root_prev[pj]
        out.pos.append(
            net.lvl_off[root_prev, j - 1] + (np.arange(n) - net.first[j][root_prev]) * net.m
        )
        out.par.append(pj)
        # the totals' variance bounds need the shares only, not the bits: computed now (their
        # temporaries before the network's arrays exist), so no level's shares are kept
        if total_var is not None:
            if j == 1:
                v0, sd0 = _snapped_var(phi, tol), np.sqrt(total_var)
                A = a
            else:
                A = _scale_rows(a, A_prev, pj)  # a · A_prev[pj], in place
            out.spread.append(
                total_variance_bound(
                    A, v0, sd0[root_prev], _psi(x, tol), top.negative, v_rows=root_prev
                )
            )
            A_prev = A
        del a, phi, dev
        out.xs.append(x)
        out.fls.append(fl)
        out.ps.append(p)
        fl_par, p_par = fl, p
    return out


def _network_arrays(
    forest: Forest,
    net: _Network,
    lv: _Levels,
    streams: tuple[KeyedRNG, str, Sequence[int], Sequence[int]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The network's tails, heads, fractional parts and uniforms, each level written where
    its arcs go (no level-sized copies kept; each level's ``p`` freed once written).
    ``streams``: the key, the label and, per level, the run's first global node and the
    level's global size (the draws are keyed by global node)."""
    rng, label, lo, n_global = streams
    K = net.m - 1
    cc = np.arange(K)
    D = forest.depth - 1
    tail_all = _scratch("tail", net.n_arcs, net.vdt)
    head_all = _scratch("head", net.n_arcs, net.vdt)
    frac_all = _scratch("frac", net.n_arcs, np.float64)
    u_all = _scratch("u", net.n_arcs, np.float64)
    for j in range(1, D + 1):
        n, at, pj = net.sizes[j], lv.pos[j - 1], lv.par[j - 1]
        p = lv.ps[j - 1]
        lv.ps[j - 1] = None
        me = np.arange(n)
        tail = net.rows(tail_all, at, n, net.vdt)
        tail[:, 0] = net.t_off[j - 1] + pj
        tail[:, 1:] = (
            (net.t_off[j] + me)[:, None] if j == D else net.c_off[j] + me[:, None] * K + cc
        )
        net.put(tail_all, at, tail)
        head = net.rows(head_all, at, n, net.vdt)
        head[:, 0] = net.t_off[j] + me
        head[:, 1:] = net.c_off[j - 1] + pj[:, None] * K + cc
        net.put(head_all, at, head)
        del tail, head
        frac = net.rows(frac_all, at, n, np.float64)
        Q = p.sum(axis=1)
        frac[:, 0] = Q - np.floor(Q)
        frac[:, 1:] = p
        net.put(frac_all, at, frac)
        del frac, Q
        # one subtree: drawn straight into its arcs' slice, no level-sized copy
        into = net.rows(u_all, at, n, np.float64) if net.sizes[0] == 1 else None
        u = keyed_uniforms(
            rng, f"{label}/{forest.names[j]}/controlled", n_global[j], lo[j], lo[j] + n, K,
            aes_uniform_draws, out=into,
        )  # fmt: skip
        net.put(u_all, at, u)
        del u, p
    return tail_all, head_all, frac_all, u_all


def _counts_from_bits(
    forest: Forest,
    net: _Network,
    lv: _Levels,
    bits: np.ndarray,
    N: np.ndarray,
    tol: float,
    names: tuple[Forest, Sequence[int], Sequence[str]],
) -> list[np.ndarray]:
    """Each level's counts: its floors plus its cell arcs' bits (in place, each level's
    floors freed), the children settled onto their parent where float resolution left a
    unit (values near 2⁵³; else a DataError naming them)."""
    whole, offset, cells = names
    out = []
    parent = N
    for j in range(1, forest.depth):
        n = net.sizes[j]
        b = net.take(bits, lv.pos[j - 1], n)
        c = lv.fls[j - 1]
        c += b[:, 1:]
        lv.fls[j - 1] = None
        cnt = forest.child_count[j - 1]
        starts = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64)
        nz = np.flatnonzero(cnt > 0)
        miss = parent - forest.sum_children(j - 1, c)
        if miss.any():
            _settle(c, lv.xs[j - 1], starts[nz], cnt[nz], nz + offset[j - 1], miss[nz], tol,
                    (forest.names[j], whole, j - 1, cells))  # fmt: skip
        out.append(c)
        parent = c
    return out


def _flow_chunk(
    forest: Forest,
    lo: Sequence[int],
    n_global: Sequence[int],
    counts: np.ndarray,
    total_var: np.ndarray | None,
    estimates: Sequence[np.ndarray],
    rng: KeyedRNG,
    schema: Schema,
    label: str,
    tol: float,
    top: RoundedLevels,
    whole: Forest,
    offset: Sequence[int],
) -> RoundedLevels:
    """:func:`_flow` on a run of whole subtrees (``forest``, local indices); ``whole`` and
    ``offset`` (per level, the run's first node in it) name nodes in messages. The network
    (:class:`_Network`) is laid out, the conditional values carried down
    (:func:`_conditional_levels`), written into its arcs (:func:`_network_arrays`), rounded
    by :func:`~censusdp.estimation.integer.dependent.flow_round` and read back
    (:func:`_counts_from_bits`)."""
    N = np.ascontiguousarray(counts, np.int64)
    names = (whole, offset, schema.cells)
    net = _Network.of(forest, schema.n_cells)
    lv = _conditional_levels(forest, estimates, N, total_var, schema, net, top, tol, names)
    tail, head, frac, u = _network_arrays(forest, net, lv, (rng, label, lo, n_global))
    D = forest.depth - 1
    cnt = forest.child_count[D - 1]
    kids = np.concatenate([[0], np.cumsum(cnt)[:-1]]).astype(np.int64)
    two = np.flatnonzero(cnt >= 2)
    bits = flow_round(
        tail, head, frac, net.arc_start, net.arc_start[:-1], u,
        matrices=(lv.pos[D - 1][kids[two]], cnt[two], net.m), overwrite=True,
    )  # fmt: skip
    del tail, head, frac, u
    out = _counts_from_bits(forest, net, lv, bits, N, tol, names)
    return RoundedLevels(
        [c.reshape(-1, *schema.shape) for c in out],
        lv.spread if total_var is not None else None,
        top.negative,
        top.joint,
        top.total_cap,
    )


def partition_streams(
    names: Sequence[str], ranges: Sequence[tuple[int, int]], n_cols: int, label: str = LABEL
) -> dict[str, range]:
    """The stream chunks :func:`round_structured_partition` draws for a partition.

    Parameters
    ----------
    names : sequence of str
        Level names of the partition's forest below its cut (level 1 onward).
    ranges : sequence of (int, int)
        Each such level's global node range ``[lo, hi)``.
    n_cols : int
        Cells per node.
    label : str
        The rounding label (``label/<level name>/controlled`` is each level's stream).

    Returns
    -------
    dict
        Stream label → chunk range, for :meth:`~censusdp.rng.KeyedRNG.restrict`.
    """
    m = n_cols + 1
    return {
        f"{label}/{name}/controlled": chunk_range(lo * m, hi * m)
        for name, (lo, hi) in zip(names, ranges, strict=True)
    }


def round_structured_top(
    hierarchy: Hierarchy,
    schema: Schema,
    estimates: Sequence[np.ndarray],
    rng: KeyedRNG,
    *,
    invariants: Sequence[ProductInvariant] = (),
    spreads: bool = True,
    label: str = LABEL,
    tol: float = TOL,
) -> RoundedLevels:
    """Round the levels from the root down to a cut level (``len(estimates) − 1``).

    Parameters
    ----------
    hierarchy : Hierarchy
    schema : Schema
    estimates : sequence of arrays
        Real consistent cell tensors ``(n_nodes, *schema.shape)`` of levels ``0 .. cut``.
    rng : KeyedRNG
        Draws from the streams ``label/...`` (``label/root``, ``label/top/<atom>``,
        ``label/<level name>/controlled`` keyed by child node).
    invariants : sequence of ProductInvariant
        At the root and its children only (:func:`top_shape`); held ``==``.
    spreads : bool
        Also compute the spreads ``w`` for :func:`rounding_variance_bound` (one more
        float tensor per level and a few passes over it).

    Returns
    -------
    RoundedLevels
        Levels ``0 .. cut``; pass the cut level's counts and spreads (rows of a partition's
        cut nodes) to :func:`round_structured_partition`.

    Raises
    ------
    SpecError
        Invariants the rounding cannot hold (named), shapes that do not match, or a cut above
        the children's level when they hold invariants.
    DataError
        Non-finite estimates, inconsistent estimates, or an invariant missed beyond float
        resolution (naming level, node and cell or query).

    References
    ----------
    Madow (1949); Ageev & Sviridenko (2004); Cox (1987); Gandhi et al. (2006).
    """
    shape = top_shape(hierarchy, schema, invariants)
    xs = _top_matrices(hierarchy, schema, estimates, shape)
    cut = len(xs) - 1
    totals_only = all(
        iv.query.n_rows == 1 and bool(np.all(np.asarray(iv.query.matrix) == 1))
        for iv in shape.invariants
    )
    if cut >= 1 and totals_only:
        network = _round_top_network(hierarchy, schema, xs, shape, rng, label, tol, spreads)
        if network is not None:
            return network
    if shape.atoms is None:
        counts, spread, total_cap = _round_root(hierarchy, xs[0], shape, rng, label, tol)
    else:
        counts, spread, total_cap = _round_children_jointly(hierarchy, xs, shape, rng, label, tol)
    _check_invariants(hierarchy, shape, counts)
    shp = tuple(schema.shape)
    # the joint level's bits are negatively correlated for controlled rounding (Gandhi et
    # al. 2006, property B3) and for pipage of one group (Srinivasan 2001)
    negative = shape.atoms is not None or int(shape.root_groups[0].max(initial=0)) == 0
    if not negative:
        spread[0] = np.minimum(np.sqrt(_frac_var(xs[0], tol)).sum(axis=1) ** 2, total_cap)
    head = RoundedLevels([], None, negative, shape.joint_level, total_cap)
    start = len(counts) - 1
    if cut > start:
        f = whole_forest(hierarchy, start, cut)
        below = _descend(
            f,
            [0] * f.depth,
            f.sizes,
            counts[-1],
            spread[-1] if spreads else None,
            estimates[start + 1 :],
            rng,
            schema,
            label,
            tol,
            head,
        )
        counts += below.counts
        spread += below.spread or []
    return RoundedLevels(
        [c.reshape(-1, *shp) for c in counts[: cut + 1]],
        spread[: cut + 1] if spreads else None,
        negative,
        shape.joint_level,
        total_cap,
    )


def _top_matrices(
    hierarchy: Hierarchy, schema: Schema, estimates: Sequence[np.ndarray], shape: TopShape
) -> list[np.ndarray]:
    """The top's estimates as checked ``(n_nodes, cells)`` matrices, levels ``0 .. cut``."""
    cut = len(estimates) - 1
    if cut < 0 or cut >= hierarchy.depth:
        raise SpecError(f"give the estimates of levels 0 .. cut (1 to {hierarchy.depth} levels)")
    if shape.atoms is not None and cut < 1:
        raise SpecError(
            f"the invariants at level {hierarchy.names[1]!r} are rounded with the root: the "
            "cut must be that level or deeper"
        )
    xs = [cell_matrix(schema, e, f"level {hierarchy.names[k]!r}") for k, e in enumerate(estimates)]
    for k, x in enumerate(xs):
        if x.shape[0] != hierarchy.levels[k].size:
            raise SpecError(
                f"level {hierarchy.names[k]!r}: {x.shape[0]} estimate rows for "
                f"{hierarchy.levels[k].size} nodes"
            )
        check_roundable(x, hierarchy.names[k], hierarchy.levels[k].codes, schema.cells)
    return xs


def _round_top_network(
    hierarchy: Hierarchy,
    schema: Schema,
    xs: Sequence[np.ndarray],
    shape: TopShape,
    rng: KeyedRNG,
    label: str,
    tol: float,
    spreads: bool,
) -> RoundedLevels | None:
    """Levels ``0 .. cut`` as one network (:func:`_top_network`), every total's variance
    the exact ``ψ(1 − ψ)``; None where float resolution (values near 2⁵³) leaves a vertex's
    balance fractional, for the level-by-level path."""
    try:
        counts = _top_network(hierarchy, xs, rng, label, tol)
    except DataError:
        return None
    _check_invariants(hierarchy, shape, counts)
    shp = tuple(schema.shape)
    return RoundedLevels(
        [c.reshape(-1, *shp) for c in counts],
        [_psi(x, tol) * (1.0 - _psi(x, tol)) for x in xs] if spreads else None,
        True,
        0,
        0.25,
        None,
        True,
    )


def _round_root(
    hierarchy: Hierarchy, x0: np.ndarray, shape: TopShape, rng: KeyedRNG, label: str, tol: float
) -> tuple[list[np.ndarray], list[np.ndarray], float]:
    """The root's cells by pipage rounding on the laminar family of its invariants (module
    docstring, "The top"). Returns the counts, the total's variance (its floor or ceiling:
    pipage's last group is every cell) and its cap."""
    K = x0.shape[1]
    r = np.empty(K, np.int64)
    r[shape.order] = pipage_round(
        x0[0][shape.order], shape.root_groups, rng.generator(f"{label}/root"), tol=tol
    )
    lone = Forest(0, hierarchy.names[:1], [1], [], ())
    snap_at = [iv for iv in shape.invariants if iv.level == shape.joint_level]
    r = snap_invariants(lone, x0, r[None, :], snap_at, tol)
    return [r], [_psi(x0, tol) * (1.0 - _psi(x0, tol))], 0.25


def _round_children_jointly(
    hierarchy: Hierarchy,
    xs: Sequence[np.ndarray],
    shape: TopShape,
    rng: KeyedRNG,
    label: str,
    tol: float,
) -> tuple[list[np.ndarray], list[np.ndarray], float]:
    """The root's children's (children × cells) matrix by controlled rounding, one block of
    columns per atom of their invariant rows, the root their column sums (module docstring,
    "The top"). Returns the counts of the root and its children, the totals' variances
    (exact at the children: atoms rounded independently, each atom's sum to its floor or
    ceiling) and the cap of a total's variance above them."""
    x1 = xs[1]
    # the fractional parts alone are rounded: their line sums stay small numbers that
    # float64 holds well even where the values themselves are near 2^53
    c1, f1 = split_fraction(x1, tol)
    for a in np.unique(shape.atoms):
        cols = np.flatnonzero(shape.atoms == a)
        gen = rng.generator(f"{label}/top", int(a))
        fa = settle_row_sums(f1[:, cols], x1[:, cols])
        c1[:, cols] += cancel_cycles(bordered(fa, tol), gen, tol)[:-1, :-1]
    lone = Forest(1, hierarchy.names[1:2], [x1.shape[0]], [], ())
    snap_at = [iv for iv in shape.invariants if iv.level == shape.joint_level]
    c1 = snap_invariants(lone, x1, c1, snap_at, tol)
    n_atoms = int(shape.atoms.max()) + 1
    total_cap = 0.25 * n_atoms
    atom_sums = np.stack([x1[:, shape.atoms == a].sum(axis=1) for a in range(n_atoms)], axis=1)
    own0 = _frac_var(xs[0], tol).sum(axis=1)
    vt1 = _frac_var(atom_sums, tol).sum(axis=1)
    # the root's total is the sum of the children's: Minkowski over them
    spread = [np.minimum(np.minimum(own0, total_cap), np.sqrt(vt1).sum() ** 2), vt1]
    return [c1.sum(axis=0, keepdims=True), c1], spread, total_cap


def _check_invariants(hierarchy: Hierarchy, shape: TopShape, counts) -> None:
    for iv in shape.invariants:
        if not np.array_equal(iv.query.apply(counts[iv.level]), iv.values):
            raise DataError(
                f"invariant at level {hierarchy.names[iv.level]!r}, query {iv.query.name!r} "
                "is not exact after rounding: the real-valued estimates do not meet it within "
                "the rounding tolerance; check the estimator's invariant constraints"
            )


def _top_network(
    hierarchy: Hierarchy, xs: Sequence[np.ndarray], rng: KeyedRNG, label: str, tol: float
) -> list[np.ndarray]:
    """Levels ``0 .. cut`` rounded as one network (module docstring, "The top"): the root's
    total arc from a source, the root's cell arcs into a sink, a return arc from the sink to
    the source, and every lower node's total and cell arcs as below the cut; every arc the
    floor or ceiling of its real value, unbiased. Invariant totals are integral arcs, kept.

    Raises
    ------
    DataError
        Estimates that are not consistent (parent = Σ children, named), or a vertex whose
        balance float resolution left fractional (the caller falls back).
    """
    D = len(xs) - 1
    K = xs[0].shape[1]
    m = K + 1
    for j in range(1, D + 1):
        par = hierarchy.ancestor_index(j, j - 1)
        sums = np.zeros_like(xs[j - 1])
        np.add.at(sums, par, xs[j])
        bad = np.abs(sums - xs[j - 1]) > 1e-6 * np.maximum(1.0, np.abs(xs[j - 1]))
        if bad.any():
            g, c = np.argwhere(bad)[0]
            raise DataError(
                f"cannot round the release: at level {hierarchy.names[j]!r} the children of "
                f"node {hierarchy.levels[j - 1].codes[g]!r}, cell {c}, do not sum to their "
                "parent's value within the rounding tolerance; the estimates are not "
                "consistent (parent = sum of children) — check the estimator"
            )
    n_lv = [x.shape[0] for x in xs]
    t_off = 2 + np.concatenate([[0], np.cumsum(n_lv)]).astype(np.int64)
    c_off = t_off[-1] + np.concatenate([[0], np.cumsum([n * K for n in n_lv[:D]])])
    fl = [np.floor(x) for x in xs]
    fr = [x - f for x, f in zip(xs, fl, strict=True)]
    X0 = xs[0].sum()
    psi0 = X0 - np.floor(X0)
    cc = np.arange(K)
    tails = [np.array([1, 0]), c_off[0] + cc]
    heads = [np.array([0, t_off[0]]), np.full(K, 1)]
    fracs = [np.array([psi0, psi0]), fr[0][0]]
    us = [aes_uniform_draws(rng.generator(f"{label}/top-network"), K + 2)]
    for j in range(1, D + 1):
        n = n_lv[j]
        me = np.arange(n)
        par = hierarchy.ancestor_index(j, j - 1)
        Q = xs[j].sum(axis=1)
        tail = np.empty((n, m), np.int64)
        head = np.empty((n, m), np.int64)
        frac = np.empty((n, m))
        tail[:, 0] = t_off[j - 1] + par
        head[:, 0] = t_off[j] + me
        frac[:, 0] = Q - np.floor(Q)
        tail[:, 1:] = (t_off[j] + me)[:, None] if j == D else c_off[j] + me[:, None] * K + cc
        head[:, 1:] = c_off[j - 1] + par[:, None] * K + cc
        frac[:, 1:] = fr[j]
        tails.append(tail.reshape(-1))
        heads.append(head.reshape(-1))
        fracs.append(frac.reshape(-1))
        name = hierarchy.names[j]
        us.append(
            keyed_uniforms(rng, f"{label}/{name}/controlled", n, 0, n, K, aes_uniform_draws)
            .reshape(-1)
        )  # fmt: skip
    tail_all = np.concatenate(tails)
    bits = flow_round(
        tail_all, np.concatenate(heads), np.concatenate(fracs),
        np.array([0, tail_all.size]), np.array([0]), np.concatenate(us),
    )  # fmt: skip
    out = [fl[0].astype(np.int64) + bits[2 : 2 + K][None, :]]
    at = 2 + K
    for j in range(1, D + 1):
        b = bits[at : at + n_lv[j] * m].reshape(n_lv[j], m)
        at += n_lv[j] * m
        out.append(fl[j].astype(np.int64) + b[:, 1:])
    return out


@dataclass(frozen=True)
class PartitionOptions:
    """Settings of :func:`round_structured_partition`: what the top carries down, and the
    streams' label and the tolerance.

    Attributes
    ----------
    negative : bool
        :attr:`RoundedLevels.negative` of the top.
    joint : int
        :attr:`RoundedLevels.joint` of the top.
    total_cap : float
        :attr:`RoundedLevels.total_cap` of the top.
    label : str
        The streams' label, as for :func:`round_structured_top` (the same).
    tol : float
        Values within this of an integer count as integral.
    """

    negative: bool = False
    joint: int = 0
    total_cap: float = np.inf
    label: str = LABEL
    tol: float = TOL

    @classmethod
    def below(cls, top: RoundedLevels, label: str = LABEL, tol: float = TOL) -> PartitionOptions:
        """The options that carry ``top``'s ``negative``, ``joint`` and ``total_cap`` down."""
        return cls(top.negative, top.joint, top.total_cap, label, tol)


def round_structured_partition(
    forest: Forest,
    lo: Sequence[int],
    n_global: Sequence[int],
    schema: Schema,
    cut_counts: np.ndarray,
    cut_spread: np.ndarray | None,
    estimates: Sequence[np.ndarray],
    rng: KeyedRNG,
    options: PartitionOptions | None = None,
    **legacy: Any,
) -> RoundedLevels:
    """Round one partition's levels below the cut from its cut nodes' integers.

    Parameters
    ----------
    forest : Forest
        The partition's levels ``cut .. leaf`` (local indices; :meth:`Forest.of`).
    lo, n_global : sequences of int
        Per forest level, the global index of the partition's first node and the level's
        global size (the keyed draws are indexed by global parent node).
    schema : Schema
    cut_counts : array ``(n_cut, *schema.shape)``
        The partition's cut-level rows of :func:`round_structured_top`'s last level.
    cut_spread : array ``(n_cut,)`` or None
        The top's total-variance bounds of the cut nodes (:attr:`RoundedLevels.spread`
        rows; None: no bounds computed).
    estimates : sequence of arrays
        The partition's real cell tensors of levels ``cut + 1 .. leaf``.
    rng : KeyedRNG
        As for :func:`round_structured_top` (the same).
    options : PartitionOptions, optional
        The top's ``negative``, ``joint`` and ``total_cap`` (carried for the variance
        bound; :meth:`PartitionOptions.below`), the label and the tolerance (defaults when
        omitted).
    **legacy
        The fields of :class:`PartitionOptions` as keyword arguments, as before it existed
        (applied over ``options``; accepted for one release).

    Returns
    -------
    RoundedLevels
        Levels ``cut + 1 .. leaf`` of the partition; the same integers, bit for bit, as any
        other partitioning (or none) gives for these nodes.

    Raises
    ------
    SpecError
        Estimates or cut counts whose levels or rows do not match ``forest``.
    DataError
        Non-finite or inconsistent estimates (naming level, node and cell).
    TypeError
        A keyword that is no field of :class:`PartitionOptions`.

    References
    ----------
    Gandhi et al. (2006) (module docstring, "Below the cut").
    """
    o = with_keywords(PartitionOptions, options, legacy, "round_structured_partition")
    if len(estimates) != forest.depth - 1:
        raise SpecError(
            f"give the partition's estimates of the {forest.depth - 1} levels below the cut"
        )
    c = cell_matrix(schema, cut_counts, "cut counts")
    if c.shape[0] != forest.sizes[0]:
        raise SpecError(f"cut counts have {c.shape[0]} rows for {forest.sizes[0]} cut nodes")
    return _flow(
        forest,
        lo,
        n_global,
        np.asarray(c, np.int64),
        None if cut_spread is None else np.asarray(cut_spread, dtype=float).reshape(-1),
        estimates,
        rng,
        schema,
        o.label,
        o.tol,
        RoundedLevels([], None, o.negative, o.joint, o.total_cap),
    )


def round_structured(
    release,
    rng: KeyedRNG,
    *,
    invariants: Sequence[ProductInvariant] = (),
    cut: int | None = None,
    nodes_per_partition: int = 1,
    spreads: bool = True,
    label: str = LABEL,
    tol: float = TOL,
) -> RoundedLevels:
    """Round a :class:`~censusdp.estimation.gls.structured.StructuredRelease` in memory.

    Runs :func:`round_structured_top` to ``cut`` (default: the deepest invariant level, at
    least the root) and :func:`round_structured_partition` on runs of
    ``nodes_per_partition`` cut-level nodes, as a streaming run would; the integers do not
    depend on ``cut`` or ``nodes_per_partition``.

    Parameters
    ----------
    release : StructuredRelease
        Its ``estimates`` (per level ``(n, *schema.shape)``), ``hierarchy`` and ``schema``.
    rng : KeyedRNG
    invariants : sequence of ProductInvariant
        The invariants the estimate meets (at the root and its children).
    cut, nodes_per_partition, spreads, label, tol
        See above and :func:`round_structured_top`.
    """
    h, schema = release.hierarchy, release.schema
    est = release.estimates
    deepest = max((h.level_index(iv.level) for iv in invariants), default=0)
    cut = min(deepest, h.depth - 1) if cut is None else int(cut)
    top = round_structured_top(
        h,
        schema,
        est[: cut + 1],
        rng,
        invariants=invariants,
        spreads=spreads,
        label=label,
        tol=tol,
    )
    below = h.depth - cut - 1
    counts: list[list[np.ndarray]] = [[] for _ in range(below)]
    spread: list[list[np.ndarray]] = [[] for _ in range(below)]
    n_cut, step = h.levels[cut].size, max(1, int(nodes_per_partition))
    for a in range(0, n_cut if below else 0, step):
        ranges = [(a, min(a + step, n_cut))]
        for k in range(cut, h.depth - 1):
            r0, r1 = h.descendant_range(k, ranges[-1][0], k + 1)[0], None
            r1 = h.descendant_range(k, ranges[-1][1] - 1, k + 1)[1]
            ranges.append((r0, r1))
        part = round_structured_partition(
            Forest.of(h, cut, ranges),
            [r[0] for r in ranges],
            h.sizes[cut:],
            schema,
            top.counts[cut][slice(*ranges[0])],
            None if top.spread is None else top.spread[cut][slice(*ranges[0])],
            [est[cut + 1 + j][slice(*ranges[j + 1])] for j in range(below)],
            rng,
            PartitionOptions.below(top, label, tol),
        )
        for j in range(below):
            counts[j].append(part.counts[j])
            if part.spread is not None:
                spread[j].append(part.spread[j])
    return RoundedLevels(
        top.counts + [np.concatenate(c) for c in counts],
        None if top.spread is None else top.spread + [np.concatenate(s) for s in spread],
        top.negative,
        top.joint,
        top.total_cap,
        cut if below else None,
        top.top_network,
    )


def rounding_variance_bound(
    hierarchy: Hierarchy,
    estimates: Sequence[np.ndarray],
    rounded: RoundedLevels,
    level: str | int,
    query: ProductQuery,
    tol: float = TOL,
) -> tuple[np.ndarray, np.ndarray]:
    """Rounding variance of every row of ``query`` at every node of one level: a bound.

    * a row of one cell: ``f(1 − f)``, exact (every cell is its floor or ceiling, unbiased);
    * a row of every cell (the node's total): :attr:`RoundedLevels.spread`
      (:func:`total_variance_bound`; exact at the joint level);
    * any other row ``A``: ``Σ_A f(1 − f)`` where the node's cell errors are pairwise
      non-positively correlated (``rounded.negative``, at the levels rounded one level at a
      time and at the leaves of the networks: module docstring), else ``(Σ_A √(f(1 − f)))²``
      (Minkowski, whatever their correlations).

    Parameters
    ----------
    hierarchy : Hierarchy
    estimates : sequence of arrays
        The real cell tensors of levels ``0 .. level`` (at least).
    rounded : RoundedLevels
        With spreads (total-variance bounds), for the same levels.
    level : str or int
    query : ProductQuery

    Returns
    -------
    bound : (n_nodes, n_rows) numpy.ndarray
        An upper bound on the rounding variance (≥ the exact value).
    exact : (n_rows,) numpy.ndarray of bool
        Rows of one cell, whose value is the exact variance ``f(1 − f)``. A release must
        call the others' standard errors bounds, not exact.

    Raises
    ------
    SpecError
        When ``rounded`` has no spreads (rounded with ``spreads=False``).
    """
    if rounded.spread is None:
        raise SpecError(
            "this rounding has no spreads: round with spreads=True to get rounding variances"
        )
    k = hierarchy.level_index(level)
    dense = query.dense()
    width = dense.sum(axis=1)
    whole = width == dense.shape[1]
    own = rounding_variance(np.asarray(estimates[k], float), tol)
    # inner nodes of a network: their cell arcs share no vertex (no property B3)
    top_leaf = rounded.flow if rounded.flow is not None else len(rounded.counts) - 1
    inner_flow = (rounded.flow is not None and rounded.flow < k < hierarchy.depth - 1) or (
        rounded.top_network and 0 < k < top_leaf
    )
    if rounded.negative and not inner_flow:
        V = query.apply(own)
    else:
        V = query.apply(np.sqrt(own)) ** 2
    V[:, whole] = np.asarray(rounded.spread[k], dtype=float).reshape(-1, 1)
    exact = width == 1
    V[:, exact] = query.apply(own)[:, exact]
    return V, exact


def rounded_query_variances(
    release, rounded: RoundedLevels, level: str | int, query: ProductQuery | str
) -> tuple[np.ndarray, np.ndarray]:
    """Error variances of every row of ``query`` at every node of the *rounded* release.

    The estimator's variance (:meth:`StructuredRelease.query_variances`, exact) plus the
    rounding's (:func:`rounding_variance_bound`): the rounding error has mean zero given the
    estimate, so the two add. NaN for rows the release does not identify.

    Returns
    -------
    variance : (n_nodes, n_rows) numpy.ndarray
    exact : (n_rows,) numpy.ndarray of bool
        True where the value is the exact variance (single-cell rows); elsewhere it is an
        upper bound, and a standard error from it must be labelled a bound.

    Raises
    ------
    SpecError
        When ``rounded`` has no spreads (rounded with ``spreads=False``).
    """
    q = release._query(query)
    k = release.hierarchy.level_index(level)
    bound, exact = rounding_variance_bound(release.hierarchy, release.estimates, rounded, k, q)
    return release.query_variances(k, q) + bound, exact


def replicate_keys(rng: KeyedRNG, replicates: int) -> list[KeyedRNG]:
    """The keys of ``replicates`` replicate roundings: ``rng.child(REPLICATES).child(str(r))``.

    A key domain of its own (module docstring, "Replicate rounding variances"): HMAC-derived
    from ``rng`` under a label no release stream uses, so the replicates are independent of
    the release's rounding (``rng.child("rounding")``), its noise and each other.

    Raises
    ------
    SpecError
        A number of replicates that is not an integer in ``0 .. MAX_REPLICATES``.
    """
    if isinstance(replicates, bool) or not isinstance(replicates, int | np.integer):
        raise SpecError(f"rounding replicates: {replicates!r} is not an integer; give 0 .. "
                        f"{MAX_REPLICATES}")  # fmt: skip
    if not 0 <= int(replicates) <= MAX_REPLICATES:
        raise SpecError(
            f"rounding replicates: {int(replicates)} is outside 0 .. {MAX_REPLICATES} (each "
            "replicate is one more rounding of the whole release); give fewer"
        )
    base = rng.child(REPLICATES)
    return [base.child(str(r)) for r in range(int(replicates))]


def replicate_errors(rows, estimates: np.ndarray, counts: Sequence[np.ndarray]) -> np.ndarray:
    """Errors ``Z_r = q·N_r − q·x`` of every row of ``rows`` at every node, per replicate.

    Parameters
    ----------
    rows : QueryRows or ProductQuery
        Anything with ``apply`` of cell tensors ``(n, *shape)`` to ``(n, m)`` rows (linear).
    estimates : array ``(n, *shape)``
        The real estimates ``x`` the replicates rounded.
    counts : sequence of int arrays ``(n, *shape)``
        Each replicate's integers ``N_r``.

    Returns
    -------
    (R, n, m) numpy.ndarray
        float64; one replicate at a time (no ``R``-fold cell tensor is formed).
    """
    x = np.asarray(estimates, dtype=np.float64)
    out = None
    for r, c in enumerate(counts):
        z = np.asarray(rows.apply(np.asarray(c) - x), dtype=np.float64)
        if out is None:
            out = np.empty((len(counts), *z.shape))
        out[r] = z
    if out is None:
        return np.zeros((0, *np.asarray(rows.apply(x)).shape))
    return out


def replicate_variance(errors: np.ndarray) -> np.ndarray:
    """``V̂ = (1/R) Σ_r Z_r²`` over the first axis: the unbiased replicate estimate of the
    rounding variance ``Var(Z | x)`` (module docstring, "Replicate rounding variances"; the
    mean ``E[Z | x] = 0`` is known, so the divisor is ``R``).

    Raises
    ------
    SpecError
        No replicates (``R = 0``): nothing to estimate from.
    """
    z = np.asarray(errors, dtype=np.float64)
    if z.shape[0] == 0:
        raise SpecError("replicate rounding variance: no replicates (R = 0); round with R ≥ 1")
    return np.einsum("r...,r...->...", z, z) / z.shape[0]


def rounding_replicates(
    release,
    rng: KeyedRNG,
    replicates: int,
    rows,
    *,
    invariants: Sequence[ProductInvariant] = (),
    cut: int | None = None,
    label: str = LABEL,
    tol: float = TOL,
) -> list[np.ndarray]:
    """Every level's replicate errors of ``rows``, in memory (:func:`round_structured` with
    each of :func:`replicate_keys` ``(rng, replicates)``); the streamed engine computes the
    same, partition by partition.

    Returns
    -------
    list of (R, n_nodes, m) numpy.ndarray
        Per level, :func:`replicate_errors`; :func:`replicate_variance` of each is the
        replicate rounding variance.
    """
    est = release.estimates
    reps = [
        round_structured(
            release, key, invariants=invariants, cut=cut, spreads=False, label=label, tol=tol
        ).counts
        for key in replicate_keys(rng, replicates)
    ]
    return [replicate_errors(rows, est[k], [c[k] for c in reps]) for k in range(len(est))]
