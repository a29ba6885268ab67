"""Unbiased integer rounding of a consistent real-valued release that keeps every invariant.

Every rounding here is *dependent randomized rounding*: each leaf cell becomes ⌊x⌋ or ⌈x⌉
with E[rounded] = x exactly, while the sums of a family of sets are kept within ⌊·⌋/⌈·⌉ of
their real sums — and so exactly equal when the real sum is an integer. It is post-processing
of a private output: the privacy statement is unchanged.

**The family.** A set is ``subtree(v) × A``: the cells ``A`` of every leaf under node ``v``.
Each invariant row (level k, a 0/1 query row A) contributes ``subtree(v) × A`` for every node
``v`` of level k, and its real sum is an integer (the invariant's value), so a rounding that
keeps it within floor/ceil keeps it exact. :class:`RoundingPlan` builds, per level, a chain of
partitions of the cells (finest first) whose sets, over all levels, form one *laminar* family
that contains every invariant row:

* ``"cells"``: every (node, cell) sum, except where a deeper invariant groups cells (then the
  group, e.g. a state-total invariant makes the nation's sets "all cells");
* ``"totals"``: every node total and every leaf cell, except where a shallower invariant
  splits a node's cells (a state × sex invariant: county × sex instead of county totals);
* both with the invariant rows themselves.

Two invariants whose sets cross (neither nested nor disjoint, e.g. a state × sex marginal and
county totals) have no laminar family: :class:`RoundingPlan` raises :class:`SpecError` naming
both. ``"bipartite"`` is controlled rounding of the (children × cells) matrix of every parent
of the leaves (Cox 1987): leaf totals, the parent's cells and its total at once; it keeps
invariants that are among those sums (or sums of them) and refuses the others.

**The scheme** (laminar modes). Bottom-up over the family, each set's group receives the
fractional parts its subsets leave (one each at most) and merges them *in order* (by a global
element id): the carrier ``a`` and the next part ``b`` become, with one keyed uniform, one
integral part and one carried part ``frac(a + b)`` (pipage rounding, Ageev & Sviridenko 2004;
Srinivasan 2001); what is left is passed up; at the root each set's leftover is rounded with
its own uniform. Every set of the family then has a rounded sum in {⌊s⌋, ⌈s⌉} with mean s, so
its rounding error is ``Z − f`` with ``Z ~ Bernoulli(f)``, variance ``f(1 − f)`` exactly.

**Variances of every sum** (:func:`rounding_variances` via the same passes). The carried
values are deterministic (only who carries them is random) and every merge's uniform is
independent of everything else, so with ``Z_n`` the final bit of merge ``n``'s carried part:

* given ``Z_n`` the two inputs' bits are one of two outcomes — ``a + b < 1``: (Z_n, 0) with
  probability a/s, (0, Z_n) with b/s; ``a + b > 1``: (1, Z_n) with (1 − b)/(2 − s),
  (Z_n, 1) with (1 − a)/(2 − s); ``a + b = 1``: (1, 0) with a, (0, 1) with b — so the
  conditional mean and variance of any linear functional of a set's rounding, given its
  bit, follow exactly by one recursion up the merges (law of total variance over the two
  outcomes; the functionals: every cell, the total and each tracked marginal row); a set's
  own variance is then (1 − f)·v(0) + f·v(1) + f(1 − f)·(m(1) − m(0))²;
* ``E[Z_input | Z_n]`` is affine with slope a/s, b/s (low) or (1 − a)/(2 − s), (1 − b)/(2 − s)
  (high), and ``Cov(Z_L, Z_R)`` is −ab (low) or −(1 − a)(1 − b) (high), so the covariance of
  two sets' bits is the product of the slopes from each up to where they meet times that
  merge's covariance; a top-down pass gives, for every node, the covariance of the bits of its
  sets, and Var(Σ_b S_b) = Σ_b Var(S_b) + Σ_{b≠b'} d_b d_b' Cov(Z_b, Z_b') with
  ``d_b = E[S_b | Z_b = 1] − E[S_b | Z_b = 0]`` (S_b, Z_b conditionally independent of the
  rest given Z_b).

Nothing here is approximate: the reported variance of every cell, total and tracked marginal
at every node is the variance of the sum of the rounding errors under this scheme (checked by
simulation in the tests). The estimator's error and the rounding error are uncorrelated
(the rounding is mean-zero given the estimate), so the two variances add.

**Partitions.** Every uniform is keyed by (step, element id) and every group merges its
elements in global id order, so the work splits at any level: :func:`round_part` runs the
steps of a sub-forest up to a cut level, :func:`round_top` the levels above from the
leftovers, and :func:`settle_part` the top-down variance pass below the cut; ``round_tree``
is the one-partition case, and every split gives the same integers and variances bit for bit.

References
----------
Ageev & Sviridenko, "Pipage rounding", J. Comb. Optim. 8, 2004.
Srinivasan, "Distributions on level-sets with applications to approximation algorithms",
FOCS 2001 (dependent rounding; laminar families).
Gandhi, Khuller, Parthasarathy & Srinivasan, "Dependent rounding and its applications to
approximation algorithms", J. ACM 53(3), 2006 — bipartite dependent rounding (§2).
Cox, "A constructive procedure for unbiased controlled rounding", JASA 82(398), 1987.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from censusdp.errors import DataError, SpecError
from censusdp.estimation.integer.dependent import dependent_round, keyed_uniforms
from censusdp.estimation.release import Release, SumVariances
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.forest import Forest, whole_forest
from censusdp.mechanisms.queries import Invariant, Query, at_level_indices
from censusdp.rng import KeyedRNG, SubKeys

__all__ = [
    "pipage_round",
    "round_tree",
    "round_bipartite",
    "controlled_round",
    "CR_GRID_BITS",
    "round_release",
    "rounding_variance",
    "rounding_variances",
    "check_invariants",
    "check_finite",
    "RoundingPlan",
    "RoundPart",
    "TopResult",
    "round_part",
    "round_top",
    "settle_part",
    "round_bipartite_part",
    "bipartite_rows",
    "bipartite_variances",
    "rounding_fields",
    "require_exact",
    "tracked_sums",
    "sum_estimator_variances",
    "snap_invariants",
    "invariant_chain",
    "uniform_draws",
    "settle_row_sums",
    "split_fraction",
    "invariant_rows",
    "check_laminar",
    "relabel",
    "cancel_cycles",
    "bordered",
]

TOL = 1e-7
#: Largest magnitude a leaf estimate may have: its rounded value and every sum of rounded
#: values up the tree must fit in int64.
INT_LIMIT = float(2**62)
#: Rounding variances below this are the float residue of sums that are exact (every
#: fraction under ``TOL`` counts as integral, so a sum that can vary has a far larger one).
VAR_FLOOR = 1e-15


def split_fraction(values: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Integer part and fractional part in [0, 1), fractions within ``tol`` of 0/1 snapped."""
    v = np.asarray(values, dtype=float)
    base = np.floor(v)
    frac = v - base
    up = frac > 1.0 - tol
    base = base + up
    frac = np.where(up | (frac < tol), 0.0, frac)
    return base.astype(np.int64), frac


def rounding_variance(values: np.ndarray, tol: float = TOL) -> np.ndarray:
    """Variance p(1 − p) ≤ 1/4 of unbiased rounding of values with fractional part p.

    Exact for a value rounded to its floor or ceiling (every set of the rounding family);
    other sums have the variances of :func:`rounding_variances`.
    """
    v = np.asarray(values, dtype=float)
    p = v - np.floor(v)  # the fractional part of split_fraction, without the integer part
    p[(p < tol) | (p > 1.0 - tol)] = 0.0
    np.multiply(p, 1.0 - p, out=p)
    return p


def check_finite(
    hierarchy: Hierarchy, cells: Sequence[str], leaf_values: np.ndarray, first_leaf: int = 0
) -> None:
    """Refuse leaf estimates that cannot be rounded into int64.

    ``leaf_values`` are every leaf's, or a partition's run of leaves from global leaf
    ``first_leaf`` (then only the leaves are checked: the node sums need every leaf).

    Raises
    ------
    DataError
        Naming the level, node and cell of the first NaN, infinite or too large estimate
        (never the value), or of the first node whose sum would overflow int64.
    """
    x = np.asarray(leaf_values, dtype=float)
    leaf = hierarchy.levels[-1]
    bad = ~np.isfinite(x)
    big = np.abs(np.where(bad, 0.0, x)) >= INT_LIMIT
    for mask, what in ((bad, "is not finite (NaN or infinite)"), (big, "exceeds ±2^62")):
        if mask.any():
            i, c = np.argwhere(mask)[0]
            raise DataError(
                f"cannot round the release: the estimate at level {leaf.name!r}, node "
                f"{leaf.codes[first_leaf + i]!r}, cell {cells[c]!r} {what}; integer counts "
                "must fit in int64 — check the measurements and the estimator's output"
            )
    if x.shape[0] != leaf.size:
        return
    tot = hierarchy.aggregate(np.abs(x).sum(axis=1))
    for k, t in enumerate(tot):
        if t.size and t.max() >= INT_LIMIT:
            i = int(np.argmax(t))
            lv = hierarchy.levels[k]
            raise DataError(
                f"cannot round the release: the sum at level {lv.name!r}, node "
                f"{lv.codes[i]!r} exceeds ±2^62 and would overflow int64"
            )


# ----------------------------------------------------------------------------- plain pipage
Draw = Callable[[np.ndarray], np.ndarray]


def _merge(
    item: np.ndarray,
    val: np.ndarray,
    grp: np.ndarray,
    out: np.ndarray,
    draw: Draw,
    tol: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge fractional parts in pairs inside each group until each group holds at most one.

    ``item`` (positions in ``out``), ``val`` (fractional parts) and ``grp`` (non-decreasing
    group ids) list the live fractional values; ``draw(groups_of_pairs)`` returns one uniform
    per merged pair. Each merge keeps the pair's sum and both means, and makes at least one of
    the two integral (added to ``out``). Returns the values left over, one per group at most.
    """
    while item.size > 1:
        first = np.r_[True, grp[1:] != grp[:-1]]
        start = np.flatnonzero(first)
        rank = np.arange(item.size) - start[np.cumsum(first) - 1]
        i = np.flatnonzero((rank % 2 == 0)[:-1] & (grp[1:] == grp[:-1]))
        if i.size == 0:
            break
        a, b = val[i], val[i + 1]
        s = a + b
        u = draw(grp[i])
        low = s <= 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            pick_a = np.where(low, u * s < a, u * (2.0 - s) < 1.0 - b)
        hi_val = np.where(low, s, 1.0)
        lo_val = np.where(low, 0.0, s - 1.0)
        val[i] = np.where(pick_a, hi_val, lo_val)
        val[i + 1] = np.where(pick_a, lo_val, hi_val)
        done = (val < tol) | (val > 1.0 - tol)
        out[item[done]] += (val[done] > 0.5).astype(np.int64)
        keep = ~done
        item, val, grp = item[keep], val[keep], grp[keep]
    return item, val, grp


def pipage_round(
    values: np.ndarray,
    groups: Sequence[np.ndarray],
    gen: np.random.Generator,
    *,
    tol: float = TOL,
) -> np.ndarray:
    """Dependent rounding on a laminar family of contiguous groups (one generator).

    Parameters
    ----------
    values : (n,) float
        Real values, ordered so that every group is a contiguous range.
    groups : sequence of int arrays
        ``groups[0]`` (n,) the group of every value; ``groups[l]`` maps the groups of step
        ``l − 1`` to enclosing groups. Every map must be non-decreasing.
    gen : numpy.random.Generator
        One stream for every decision, in order (:func:`round_tree` keys its randomness by
        element, which does not depend on how the work is split).
    tol : float
        Fractional parts within ``tol`` of 0 or 1 count as integral.

    Returns
    -------
    numpy.ndarray
        int64 (n,): ⌊x⌋ or ⌈x⌉ with E = x; the sum over every group (at every step) is the
        floor or ceiling of its real sum, and exact when that real sum is an integer.

    References
    ----------
    Ageev & Sviridenko (2004); Srinivasan (2001).
    """
    out, frac = split_fraction(values, tol)
    item = np.flatnonzero(frac > 0)
    val = frac[item]
    grp = np.asarray(groups[0])[item] if len(groups) else np.zeros(item.size, np.int64)
    for step in range(len(groups)):
        if step:
            grp = np.asarray(groups[step])[grp]
        item, val, grp = _merge(item, val, grp, out, lambda g: gen.random(g.size), tol)
    u = gen.random(item.size)
    out[item] += (u < val).astype(np.int64)
    return out


# ----------------------------------------------------------------------------- the family
def relabel(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered 0 .. n − 1 in order of first appearance (of each value, or of each
    row of a 2-D array): the canonical name of a partition of the cells."""
    a = np.asarray(labels)
    axis = 0 if a.ndim > 1 else None
    _, first, inv = np.unique(a, axis=axis, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inv.reshape(-1)]


@dataclass(frozen=True, eq=False)
class _Layout:
    """A partition of the cells into blocks, and each block's distinct tracked sums.

    ``fidx[b, q]`` is the slot of functional ``q`` restricted to block ``b`` (−1 when they
    share no cell); ``rep[b, j]`` a functional whose restriction is slot ``j`` (−1: padding).
    """

    part: np.ndarray
    nb: int
    F: int
    rep: np.ndarray
    fidx: np.ndarray


def _layout(part: np.ndarray, masks: np.ndarray) -> _Layout:
    nb = int(part.max()) + 1
    m = masks.shape[0]
    fidx = np.full((nb, m), -1, np.int64)
    reps: list[np.ndarray] = []
    for b in range(nb):
        inter = masks & (part == b)[None, :]
        nz = inter.any(axis=1)
        if not nz.any():
            reps.append(np.zeros(0, np.int64))
            continue
        q = np.flatnonzero(nz)
        fidx[b, q] = slot = relabel(inter[q])
        reps.append(q[np.unique(slot, return_index=True)[1]])
    F = max(1, max(r.size for r in reps))
    rep = np.full((nb, F), -1, np.int64)
    for b, r in enumerate(reps):
        rep[b, : r.size] = r
    return _Layout(part, nb, F, rep, fidx)


@dataclass(frozen=True, eq=False)
class _Step:
    """One step up the family: elements (nodes of ``prev_level`` × blocks of ``prev``) into
    groups (nodes of ``level`` × blocks of ``new``); ``top_of``: the level whose node sets
    (top blocks) the elements are, when they are."""

    level: int
    prev_level: int
    prev: _Layout
    new: _Layout | None  # None: the final draws at the root
    bmap: np.ndarray  # prev block -> new block
    lift: np.ndarray  # (prev nb, new F): slot of the element's state for each group slot
    top_of: int | None
    label: str


def _describe(names: Sequence[str], iv: Invariant) -> str:
    return f"level {names[iv.level]!r}, query {iv.query.name!r}"


@dataclass(frozen=True, eq=False)
class RoundingPlan:
    """The laminar family of a rounding: per level, a chain of partitions of the cells.

    Build with :meth:`build`. ``masks`` (m × K) are the tracked sums — every cell, the node
    total, then each invariant row and each extra query row — whose exact rounding variances
    :func:`rounding_variances` reports at every node.
    """

    mode: str
    names: tuple[str, ...]
    cells: tuple[str, ...]
    chains: tuple[tuple[np.ndarray, ...], ...]
    masks: np.ndarray
    labels: tuple[str, ...]
    steps: tuple[_Step, ...] = field(repr=False)

    @property
    def K(self) -> int:
        return len(self.cells)

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        cells: Sequence[str],
        mode: str,
        invariants: Sequence[Invariant] = (),
        queries: Sequence[Query] = (),
    ) -> RoundingPlan:
        """The family of ``mode`` (``"cells"`` or ``"totals"``) that holds every invariant row.

        Raises
        ------
        SpecError
            An unknown mode, a malformed invariant, or two invariant rows whose sets cross
            (no laminar family holds both): the message names both invariants (level, query).
        """
        if mode not in ("cells", "totals"):
            raise SpecError(f"laminar rounding mode must be 'cells' or 'totals', got {mode!r}")
        names, cells = tuple(names), tuple(cells)
        K, D = len(cells), len(names)
        rows = invariant_rows(names, cells, invariants)
        check_laminar(names, rows)
        masks, labels = tracked_sums(cells, invariants, queries)
        chains: list[tuple[np.ndarray, ...]] = [()] * D
        top = np.arange(K, dtype=np.int64)  # the leaves' cells
        for k in range(D - 1, -1, -1):
            stages: list[np.ndarray] = [] if k == D - 1 else [top.copy()]
            P = top
            for lab in invariant_chain(names, P, [(s, iv) for lv, s, iv in rows if lv == k]):
                stages.append(lab)
                P = lab
            if mode == "totals":
                above = [s for lv, s, _ in rows if lv < k]
                # the atoms of the invariants above (all cells if none)
                lab = relabel(np.vstack(above).T) if above else np.zeros(K, np.int64)
                if not np.array_equal(lab, P):
                    stages.append(lab)
                    P = lab
            chains[k] = tuple(stages)
            top = P
        return cls(
            mode, names, cells, tuple(chains), masks, labels, _plan_steps(names, K, chains, masks)
        )

    def describe(self) -> list[str]:
        """The sets kept within floor/ceil, per level (for diagnostics); leaf cells always."""
        out = [f"{self.names[-1]}: every cell"]
        for k, stages in enumerate(self.chains):
            for P in stages:
                blocks = [
                    "+".join(self.cells[c] for c in np.flatnonzero(P == b))
                    for b in range(int(P.max()) + 1)
                ]
                out.append(f"{self.names[k]}: " + ", ".join(blocks))
        return out


def invariant_chain(
    names: Sequence[str], P: np.ndarray, mine: Sequence[tuple[np.ndarray, Invariant]]
) -> list[np.ndarray]:
    """The partitions of the cells that one level's invariant rows add to partition ``P``.

    Rows are merged into ``P``'s blocks by increasing size, one coarser partition per size
    that changes anything (finest first); ``mine`` are (row mask, invariant) pairs of one
    level, laminar with each other and with ``P`` (:func:`check_laminar`).
    """
    out = []
    for size in sorted({int(s.sum()) for s, _ in mine}):
        lab = P.copy()
        for s, iv in mine:
            if int(s.sum()) != size:
                continue
            touched = np.unique(P[s])
            if not np.all(s[np.isin(P, touched)]):  # pragma: no cover - check_laminar
                raise SpecError(
                    f"invariant at {_describe(names, iv)} splits a set the rounding "
                    "family keeps below it"
                )
            lab[s] = lab[s].min()
        lab = relabel(lab)
        if not np.array_equal(lab, P):
            out.append(lab)
            P = lab
    return out


def invariant_rows(
    names: Sequence[str], cells: Sequence[str], invariants: Sequence[Invariant]
) -> list[tuple[int, np.ndarray, Invariant]]:
    """Every row of every invariant as ``(level, cell set, invariant)``, the cell set a
    boolean mask over ``cells``: what the laminar rounding keeps exact.

    Raises
    ------
    SpecError
        A level outside the hierarchy, or a query that is not 0/1 over the cells with no
        empty row (naming the invariant).
    """
    rows = []
    K, D = len(cells), len(names)
    for iv in invariants:
        m = np.asarray(iv.query.matrix)
        if not 0 <= int(iv.level) < D:
            raise SpecError(
                f"invariant {iv.query.name!r}: level {iv.level} is not one of 0..{D - 1}"
            )
        if (
            m.ndim != 2
            or m.shape[1] != K
            or not np.isin(m, (0, 1)).all()
            or not m.any(axis=1).all()
        ):
            raise SpecError(
                f"invariant at {_describe(names, iv)}: the rounding needs a 0/1 query over the "
                f"{K} cells with no empty row"
            )
        for r in m.astype(bool):
            rows.append((int(iv.level), r, iv))
    return rows


def check_laminar(names: Sequence[str], rows: list[tuple[int, np.ndarray, Invariant]]) -> None:
    """Every pair of invariant sets nested or disjoint (a deeper set inside a shallower one)."""
    for i, (li, si, ivi) in enumerate(rows):
        for lj, sj, ivj in rows[i + 1 :]:
            inter = bool((si & sj).any())
            if not inter:
                continue
            a, b = (si, sj) if li <= lj else (sj, si)  # a: the shallower (or same level)
            ok = bool(np.all(a[b])) or (li == lj and bool(np.all(b[a])))
            if not ok:
                raise SpecError(
                    f"no rounding can keep both invariants ({_describe(names, ivi)}) and "
                    f"({_describe(names, ivj)}) exact by dependent rounding on a laminar "
                    "family: their sets cross (they share cells at a node but neither holds "
                    "the other's); drop one of them or round with method='none'"
                )


def tracked_sums(
    cells: Sequence[str], invariants: Sequence[Invariant] = (), queries: Sequence[Query] = ()
) -> tuple[np.ndarray, tuple[str, ...]]:
    """The sums whose variances a rounding reports: every cell, the total, then each
    invariant row and query row not already among them (masks (m, K) and labels)."""
    K = len(cells)
    masks = [np.eye(K, dtype=bool), np.ones((1, K), bool)]
    labels = list(cells) + ["total"]
    seen = {m.tobytes() for m in np.vstack(masks)}
    for q in [iv.query for iv in invariants] + list(queries):
        m = np.asarray(q.matrix)
        if m.ndim != 2 or m.shape[1] != K or not np.isin(m, (0, 1)).all():
            raise SpecError(f"query {q.name!r}: rounding variances need a 0/1 query over {K} cells")
        for lab, r in zip(q.labels, m.astype(bool), strict=True):
            if r.tobytes() not in seen:
                seen.add(r.tobytes())
                masks.append(r[None, :])
                labels.append(f"{q.name}:{lab}")
    return np.vstack(masks), tuple(labels)


def _plan_steps(
    names: Sequence[str], K: int, chains: Sequence[Sequence[np.ndarray]], masks: np.ndarray
) -> tuple[_Step, ...]:
    D = len(names)
    item = _Layout(
        np.arange(K, dtype=np.int64),
        K,
        1,
        np.argmax(masks, axis=0)[:, None],  # every cell is its own cell functional
        np.where(masks.T, 0, -1).astype(np.int64),
    )
    steps = []
    prev, prev_level = item, D - 1
    for k in range(D - 1, -1, -1):
        for s, P in enumerate(chains[k]):
            new = _layout(P, masks)
            bmap = P[np.array([np.flatnonzero(prev.part == b)[0] for b in range(prev.nb)])]
            rep = new.rep[bmap]  # (prev nb, new F)
            lift = np.where(rep >= 0, np.take_along_axis(prev.fidx, np.maximum(rep, 0), 1), -1)
            parent = prev_level != k
            steps.append(
                _Step(
                    k,
                    prev_level,
                    prev,
                    new,
                    bmap,
                    lift,
                    prev_level if parent else None,
                    f"{names[k]}/{s}",
                )
            )
            prev, prev_level = new, k
    steps.append(
        _Step(
            -1,
            0,
            prev,
            None,
            np.zeros(prev.nb, np.int64),
            np.zeros((prev.nb, 0), np.int64),
            0,
            "final",
        )
    )
    return tuple(steps)


# ----------------------------------------------------------------------------- the engine
@dataclass(eq=False)
class _Elems:
    """Live or finished sets entering a step: global id, carrier, carried value, and the
    conditional mean (``mu``) and variance (``m2``) of each tracked sum given the set's bit
    (n, 2, F); variances, not second moments, so that sums of thousands of bits lose no
    precision to cancellation."""

    eid: np.ndarray
    item: np.ndarray
    val: np.ndarray
    mu: np.ndarray
    m2: np.ndarray

    def take(self, idx: np.ndarray) -> _Elems:
        return _Elems(self.eid[idx], self.item[idx], self.val[idx], self.mu[idx], self.m2[idx])

    @classmethod
    def concat(cls, parts: Sequence[_Elems]) -> _Elems:
        return cls(
            *(
                np.concatenate([getattr(p, a) for p in parts])
                for a in ("eid", "item", "val", "mu", "m2")
            )
        )


@dataclass(eq=False)
class _Record:
    """What the top-down pass needs of one step, per element (in step order)."""

    eid: np.ndarray
    gnode: np.ndarray  # global node of the element's group
    rank: np.ndarray
    seg: np.ndarray
    slope: np.ndarray  # to the carrier after the element's merge
    lam: np.ndarray  # Σ log slope of the carrier up to and with the element's merge
    lamprev: np.ndarray  # the same before it
    cov: np.ndarray  # Cov of the two bits the element's merge split
    r: np.ndarray  # the element's carried value (0: finished)
    B: np.ndarray  # slope to the group's final carrier
    mu: np.ndarray | None  # states, kept for steps whose elements are a level's node sets
    m2: np.ndarray | None


_Z = np.array([0, 1])
#: ``_OUT[kind, outcome, side]``: the bit (zL, zR) of each input given z = 0, 1, for the
#: merges a + b < 1 (kind 0), = 1 (1, the carried part finishes) and > 1 (2); outcome 0 has
#: probability p1 (a / s, a, (1 − b) / (2 − s)), outcome 1 the rest.
_OUT = np.array(
    [
        [[_Z, 0 * _Z], [0 * _Z, _Z]],
        [[1 + 0 * _Z, 0 * _Z], [0 * _Z, 1 + 0 * _Z]],
        [[1 + 0 * _Z, _Z], [_Z, 1 + 0 * _Z]],
    ]
)


def _combine(
    Lmu: np.ndarray,
    Lm2: np.ndarray,
    Rmu: np.ndarray,
    Rm2: np.ndarray,
    p1: np.ndarray,
    kind: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """State of a merge from its inputs' states: mixture over the two outcomes given z."""
    rows = np.arange(p1.size)[:, None]
    out = _OUT[kind]  # (n, outcome, side, z)
    means, variances = [], []
    for o in (0, 1):
        zl, zr = out[:, o, 0], out[:, o, 1]
        means.append(Lmu[rows, zl] + Rmu[rows, zr])  # the inputs are independent given
        variances.append(Lm2[rows, zl] + Rm2[rows, zr])  # their bits
    w0, w1 = p1[:, None, None], 1.0 - p1[:, None, None]
    mu = w0 * means[0] + w1 * means[1]
    d0, d1 = means[0] - mu, means[1] - mu
    return mu, w0 * (variances[0] + d0 * d0) + w1 * (variances[1] + d1 * d1)


def _indep(
    mu: np.ndarray, m2: np.ndarray, fmu: np.ndarray, fm2: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """State of a sum of a set and an independent part whose law does not depend on the
    bit (mean ``fmu``, variance ``fm2`` per slot)."""
    return mu + fmu[:, None, :], m2 + fm2[:, None, :]


def _run_step(
    el: _Elems,
    step: _Step,
    node_map: Callable[[np.ndarray], np.ndarray],
    U: Callable[[np.ndarray], np.ndarray],
    add: np.ndarray,
    tol: float,
) -> tuple[_Elems, _Record]:
    """Merge the elements of every group of one step, in element-id order (see module)."""
    new = step.new
    assert new is not None
    nbg, Fg = new.nb, new.F
    el, gid, gnode_all, ginv, starts, rank, blk = _grouped(el, step, node_map, nbg)
    n, G = el.eid.size, starts.size
    li = step.lift[blk]
    take = np.broadcast_to(np.maximum(li, 0)[:, None, :], (n, 2, Fg))
    on = (li >= 0)[:, None, :]
    mu = np.where(on, np.take_along_axis(el.mu, take, 2), 0.0)
    m2 = np.where(on, np.take_along_axis(el.m2, take, 2), 0.0)
    u_all = U(el.eid)
    val = el.val
    c = _Carry.zeros(G, n, Fg)
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[by_rank], np.arange(int(rank.max(initial=-1)) + 2))
    for k in range(bounds.size - 1):
        sel = by_rank[bounds[k] : bounds[k + 1]]
        g = ginv[sel]
        c.segx[sel] = c.seg[g]
        c.lamx[sel] = c.lam[g]
        c.lamp[sel] = c.lam[g]
        dead = val[sel] == 0.0
        if dead.any():  # finished below: independent of everything from here on
            e, gg = sel[dead], g[dead]
            c.f_m2[gg] += m2[e, 0]
            c.f_mu[gg] += mu[e, 0]
        start = ~dead & ~c.live[g]
        if start.any():
            e, gg = sel[start], g[start]
            c.live[gg] = True
            c.val[gg], c.item[gg] = val[e], el.item[e]
            c.mu[gg], c.m2[gg] = mu[e], m2[e]
            c.slope[e] = 1.0
        mg = ~dead & ~start
        if mg.any():
            _merge_into(c, sel[mg], g[mg], val, el.item, mu, m2, u_all, add, tol)
    out_mu, out_m2 = _indep(c.mu, c.m2, c.f_mu, c.f_m2)
    out_val = np.where(c.live, c.val, 0.0)
    g_last = c.live[ginv] & (c.segx == c.seg[ginv]) & (val > 0)
    B = np.where(g_last, c.slope * np.exp(np.minimum(c.lam[ginv] - c.lamx, 0.0)), 0.0)
    kept = step.top_of is not None
    rec = _Record(
        el.eid,
        gnode_all,
        rank,
        c.segx,
        c.slope,
        c.lamx,
        c.lamp,
        c.cov,
        val,
        B,
        el.mu if kept else None,
        el.m2 if kept else None,
    )
    return _Elems(gid[starts], c.item, out_val, out_mu, out_m2), rec


def _grouped(
    el: _Elems, step: _Step, node_map: Callable[[np.ndarray], np.ndarray], nbg: int
) -> tuple[_Elems, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The step's elements sorted by (group, element id), ``nbg`` blocks per node of the
    step's groups: the elements, their group ids, global nodes, group index, the groups'
    first positions, the rank in the group and the previous step's block."""
    nbp = step.prev.nb
    node = el.eid // nbp
    blk = el.eid % nbp
    gnode_all = node_map(node)
    gid = gnode_all * nbg + step.bmap[blk]
    order = np.lexsort((el.eid, gid))
    el = el.take(order)
    gid, blk, gnode_all = gid[order], blk[order], gnode_all[order]
    n = el.eid.size
    first = np.r_[True, gid[1:] != gid[:-1]] if n else np.zeros(0, bool)
    starts = np.flatnonzero(first)
    ginv = np.cumsum(first) - 1
    rank = np.arange(n) - starts[ginv] if n else np.zeros(0, np.int64)
    return el, gid, gnode_all, ginv, starts, rank, blk


@dataclass(eq=False)
class _Carry:
    """The merge state of one step: per group its carried set (live, value, item, state),
    the finished part's state (``f_mu``, ``f_m2``), Σ log slope ``lam`` and segment
    ``seg``; per element what :class:`_Record` keeps."""

    live: np.ndarray
    val: np.ndarray
    item: np.ndarray
    mu: np.ndarray
    m2: np.ndarray
    f_mu: np.ndarray
    f_m2: np.ndarray
    lam: np.ndarray
    seg: np.ndarray
    slope: np.ndarray
    lamx: np.ndarray
    lamp: np.ndarray
    cov: np.ndarray
    segx: np.ndarray

    @classmethod
    def zeros(cls, G: int, n: int, Fg: int) -> _Carry:
        return cls(
            live=np.zeros(G, bool),
            val=np.zeros(G),
            item=np.full(G, -1, np.int64),
            mu=np.zeros((G, 2, Fg)),
            m2=np.zeros((G, 2, Fg)),
            f_mu=np.zeros((G, Fg)),
            f_m2=np.zeros((G, Fg)),
            lam=np.zeros(G),
            seg=np.zeros(G, np.int64),
            slope=np.zeros(n),
            lamx=np.zeros(n),
            lamp=np.zeros(n),
            cov=np.zeros(n),
            segx=np.zeros(n, np.int64),
        )


def _merge_into(
    c: _Carry,
    e: np.ndarray,
    gg: np.ndarray,
    val: np.ndarray,
    item: np.ndarray,
    mu: np.ndarray,
    m2: np.ndarray,
    u_all: np.ndarray,
    add: np.ndarray,
    tol: float,
) -> None:
    """Merge elements ``e`` into their groups' (``gg``) carried sets: the pipage step
    of the two values, its integer part added to ``add``, the carry updated."""
    a, b = c.val[gg], val[e]
    s = a + b
    reset = np.abs(s - 1.0) <= tol
    high = (s > 1.0) & ~reset
    kind = np.where(reset, 1, np.where(high, 2, 0))
    with np.errstate(divide="ignore", invalid="ignore"):
        p1 = np.where(kind == 0, a / s, np.where(reset, a, (1.0 - b) / (2.0 - s)))
        beta_l = np.where(kind == 0, a / s, np.where(reset, 0.0, (1.0 - a) / (2.0 - s)))
        beta_r = np.where(kind == 0, b / s, np.where(reset, 0.0, (1.0 - b) / (2.0 - s)))
    c.cov[e] = np.where(high, -(1.0 - a) * (1.0 - b), -a * b)
    c.slope[e] = beta_r
    pick = u_all[e] < p1
    Li, Ri = c.item[gg], item[e]
    # outcome 1: low -> R's part 0, L carries; reset -> L gets 1; high -> L gets 1, R carries
    one = np.where(pick, np.where(kind == 0, -1, Li), np.where(kind == 0, -1, Ri))
    hit = one >= 0
    add[one[hit]] += 1
    carrier = np.where(pick, np.where(kind == 2, Ri, Li), np.where(kind == 2, Li, Ri))
    nmu, nm2 = _combine(c.mu[gg], c.m2[gg], mu[e], m2[e], p1, kind)
    live = ~reset
    c.item[gg] = np.where(live, carrier, -1)
    c.val[gg] = np.where(live, np.where(high, s - 1.0, s), 0.0)
    with np.errstate(divide="ignore"):
        c.lam[gg] = np.where(live, c.lam[gg] + np.log(np.where(live, beta_l, 1.0)), c.lam[gg])
    c.lamx[e] = c.lam[gg]
    if reset.any():
        rg = gg[reset]
        c.f_m2[rg] += nm2[reset, 0]
        c.f_mu[rg] += nmu[reset, 0]
        c.seg[rg] += 1
        c.live[rg] = False
        nmu[reset] = 0.0
        nm2[reset] = 0.0
    c.mu[gg], c.m2[gg] = nmu, nm2


def _final_step(el: _Elems, step: _Step, rng: KeyedRNG, label: str, add: np.ndarray) -> _Record:
    """The root's sets: each leftover rounded up with probability its value."""
    nb = step.prev.nb
    u = rng.draw(f"{label}/final", 1, 0, 1, uniform_draws, nb).reshape(-1)
    live = el.val > 0
    up = live & (u[el.eid % nb] < el.val)
    add[el.item[up]] += 1
    z = np.zeros(el.eid.size)
    zi = np.zeros(el.eid.size, np.int64)
    return _Record(el.eid, el.eid // nb, zi, zi, z, z, z, z, el.val, z, el.mu, el.m2)


def uniform_draws(g: np.random.Generator, n: int) -> np.ndarray:
    """``n`` uniforms on [0, 1) from ``g``: the draw function handed to
    :meth:`censusdp.rng.KeyedRNG.draw` by the systematic-sampling roundings (one name, so a
    test can replace it to check that the unbiasedness tests have power)."""
    return g.random(n)


def _bits_cov(
    rec: _Record, step: _Step, Cg: np.ndarray | None, lo_e: int, n_e: int, lo_g: int
) -> np.ndarray:
    """Covariance of the bits of each node's sets entering ``step`` (n_e, nb, nb).

    ``Cg`` is the same for the groups' nodes (rows from global node ``lo_g``); None at the
    final step (the root's sets are rounded independently).
    """
    nbp = step.prev.nb
    w = rec.eid // nbp - lo_e
    b = rec.eid % nbp
    C = np.zeros((n_e, nbp, nbp))
    C[w, b, b] = rec.r * (1.0 - rec.r)
    if nbp == 1 or Cg is None:
        return C

    def dense(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
        d = np.full((n_e, nbp), fill, dtype=np.result_type(x, np.float64))
        d[w, b] = x
        return d

    Bd = dense(rec.B)
    gnode = np.zeros(n_e, np.int64)
    gnode[w] = rec.gnode - lo_g
    bm = step.bmap
    same = bm[:, None] == bm[None, :]
    Cw = Cg[gnode][:, bm][:, :, bm]
    C += np.where(same[None], 0.0, Bd[:, :, None] * Bd[:, None, :] * Cw)
    present = dense(np.ones(rec.eid.size), 0.0) > 0
    rk = dense(rec.rank.astype(float), -1.0)
    sg = dense(rec.seg.astype(float), -1.0)
    sl, lx, lp, cv, rr = (
        dense(rec.slope),
        dense(rec.lam),
        dense(rec.lamprev),
        dense(rec.cov),
        dense(rec.r),
    )
    pair = (
        same[None]
        & present[:, :, None]
        & present[:, None, :]
        & (rk[:, :, None] < rk[:, None, :])
        & (sg[:, :, None] == sg[:, None, :])
        & (rr[:, :, None] > 0)
        & (rr[:, None, :] > 0)
    )
    P = np.where(
        pair,
        sl[:, :, None] * np.exp(np.minimum(lp[:, None, :] - lx[:, :, None], 0.0)) * cv[:, None, :],
        0.0,
    )
    return C + P + P.transpose(0, 2, 1)


def _node_variances(rec: _Record, step: _Step, C: np.ndarray, lo_e: int, n_e: int) -> np.ndarray:
    """Var of every tracked sum at every node whose sets are the step's elements (n_e, m)."""
    lay = step.prev
    nbp = lay.nb
    m = lay.fidx.shape[1]
    w = rec.eid // nbp - lo_e
    b = rec.eid % nbp
    assert rec.mu is not None and rec.m2 is not None
    r = rec.r[:, None]
    d = rec.mu[:, 1] - rec.mu[:, 0]
    var = (1.0 - r) * rec.m2[:, 0] + r * rec.m2[:, 1] + r * (1.0 - r) * d * d
    slot = lay.fidx[b]  # (n, m)
    on = slot >= 0
    Vd = np.zeros((n_e, nbp, m))
    Dd = np.zeros((n_e, nbp, m))
    Vd[w, b] = np.where(on, np.take_along_axis(var, np.maximum(slot, 0), 1), 0.0)
    Dd[w, b] = np.where(on, np.take_along_axis(d, np.maximum(slot, 0), 1), 0.0)
    out = Vd.sum(axis=1)
    if nbp > 1:
        off = C * (1.0 - np.eye(nbp))[None]
        T = np.zeros_like(Dd)
        for c in range(nbp):
            T += off[:, :, c, None] * Dd[:, c, None, :]
        out = out + (Dd * T).sum(axis=1)
    # an exact sum's variance comes out as float residue (±1e-30): report it as 0
    return np.where(out < VAR_FLOOR, 0.0, out)


# ----------------------------------------------------------------------------- forests
@dataclass(frozen=True, eq=False)
class RoundPart:
    """One partition's rounding up to its cut level.

    Attributes
    ----------
    leaves : (n_leaves, K) int64
        Rounded leaves of the partition, before the leftovers are settled.
    left : _Elems
        The sets of the cut-level nodes (global ids, carried values, states); ``item`` is the
        carrier's global ``leaf * K + cell`` (−1 when the set is finished).
    records : tuple
        The partition's steps, for its top-down variance pass (:func:`settle_part`); they
        stay with the partition.
    """

    leaves: np.ndarray
    left: _Elems
    records: tuple = ()

    def leftovers(self) -> RoundPart:
        """The part the levels above the cut need (no leaves, no records)."""
        return RoundPart(self.leaves[:0], self.left, ())


@dataclass(frozen=True, eq=False)
class TopResult:
    """What :func:`round_top` settles: the leftovers' 0/1 increments by global (leaf, cell),
    the rounding variances of levels 0 .. cut (n, m each) and the covariance of the bits of
    every cut-level node's sets (n_cut, nb, nb), for :func:`settle_part`."""

    leaf: np.ndarray
    cell: np.ndarray
    add: np.ndarray
    variances: list[np.ndarray]
    bits: np.ndarray


def _node_map(step: _Step, f: Forest, lo: Sequence[int]) -> Callable[[np.ndarray], np.ndarray]:
    jp = step.prev_level - f.first
    if step.prev_level == step.level:
        return lambda node: node
    par, lp, lg = f.parent(jp), lo[jp], lo[jp - 1]
    return lambda node: par[node - lp] + lg


def _draws(step: _Step, f: Forest, lo, n_global, rng: KeyedRNG, label: str):
    jp = step.prev_level - f.first
    nb = step.prev.nb
    u = rng.draw(
        f"{label}/{step.label}", n_global[jp], lo[jp], lo[jp] + f.sizes[jp], uniform_draws, nb
    ).reshape(-1)
    off = lo[jp] * nb
    return lambda eid: u[eid - off]


def round_part(
    forest: Forest,
    lo: Sequence[int],
    n_global: Sequence[int],
    leaf_values: np.ndarray,
    rng: KeyedRNG,
    plan: RoundingPlan,
    *,
    label: str = "rounding/tree",
    tol: float = TOL,
) -> RoundPart:
    """Dependent rounding of one sub-forest's leaves up to its top (cut) level.

    Parameters
    ----------
    forest : Forest
        The partition's levels cut .. leaf.
    lo, n_global : sequences of int
        Global index of the forest's first node, and the level's global size, per level.
    leaf_values : (n_leaves, K) float
        The partition's leaf estimates.
    rng, plan, label, tol
        As for :func:`round_tree`.

    References
    ----------
    Srinivasan (2001); Ageev & Sviridenko (2004).
    """
    x = np.asarray(leaf_values, dtype=float)
    n, K = x.shape
    base, frac = split_fraction(x.reshape(-1), tol)
    items = np.flatnonzero(frac > 0)
    one = np.broadcast_to(_Z[None, :, None].astype(float), (items.size, 2, 1)).copy()
    el = _Elems((lo[-1] + items // K) * K + items % K, items, frac[items], one, 0.0 * one)
    add = np.zeros(n * K, np.int64)
    records = []
    for step in plan.steps:
        if step.new is None or step.level < forest.first:
            break
        el, rec = _run_step(
            el,
            step,
            _node_map(step, forest, lo),
            _draws(step, forest, lo, n_global, rng, label),
            add,
            tol,
        )
        records.append(rec)
    item = np.where(el.item >= 0, (lo[-1] + el.item // K) * K + el.item % K, -1)
    left = _Elems(el.eid, item, el.val, el.mu, el.m2)
    return RoundPart((base + add).reshape(n, K), left, tuple(records))


def round_top(
    hierarchy: Hierarchy,
    cut: int,
    parts: Sequence[RoundPart],
    rng: KeyedRNG,
    plan: RoundingPlan,
    *,
    label: str = "rounding/tree",
    tol: float = TOL,
) -> TopResult:
    """Round the levels 0 .. cut from the partitions' leftovers; their variances."""
    left = _Elems.concat([p.left for p in parts])
    K = plan.K
    gitem = left.item
    el = _Elems(left.eid, np.arange(left.eid.size), left.val, left.mu, left.m2)
    add = np.zeros(el.eid.size, np.int64)
    f = whole_forest(hierarchy, 0, cut)
    lo = [0] * f.depth
    steps = [st for st in plan.steps if st.new is not None and st.level < cut]
    records = []
    for step in steps:
        el, rec = _run_step(
            el, step, _node_map(step, f, lo), _draws(step, f, lo, f.sizes, rng, label), add, tol
        )
        records.append(rec)
    records.append(_final_step(el, plan.steps[-1], rng, label, add))
    steps.append(plan.steps[-1])
    variances: list[np.ndarray] = [np.zeros(0)] * (cut + 1)
    C = None
    for rec, step in zip(records[::-1], steps[::-1], strict=True):
        n_e = f.sizes[step.prev_level]
        C = _bits_cov(rec, step, C, 0, n_e, 0)
        if step.top_of is not None:
            variances[step.top_of] = _node_variances(rec, step, C, 0, n_e)
    hit = gitem >= 0
    return TopResult(gitem[hit] // K, gitem[hit] % K, add[hit], variances, C)


def settle_part(
    part: RoundPart, forest: Forest, lo: Sequence[int], plan: RoundingPlan, bits: np.ndarray
) -> list[np.ndarray]:
    """Rounding variances (n, m) of a partition's levels below the cut (top-down pass).

    ``bits`` are the rows of :attr:`TopResult.bits` for the partition's cut-level nodes.
    """
    steps = [st for st in plan.steps if st.new is not None and st.level >= forest.first]
    out: dict[int, np.ndarray] = {}
    C = bits
    for rec, step in zip(part.records[::-1], steps[::-1], strict=True):
        jp, jg = step.prev_level - forest.first, step.level - forest.first
        C = _bits_cov(rec, step, C, lo[jp], forest.sizes[jp], lo[jg])
        if step.top_of is not None:
            out[step.top_of] = _node_variances(rec, step, C, lo[jp], forest.sizes[jp])
    return [out[k] for k in range(forest.first + 1, forest.first + forest.depth)]


def round_tree(
    hierarchy: Hierarchy,
    leaf_values: np.ndarray,
    rng: KeyedRNG,
    *,
    mode: Literal["cells", "totals"] = "cells",
    invariants: Sequence[Invariant] = (),
    plan: RoundingPlan | None = None,
    label: str = "rounding/tree",
    tol: float = TOL,
    with_variances: bool = False,
) -> list[np.ndarray] | tuple[list[np.ndarray], list[np.ndarray]]:
    """Unbiased integer rounding of leaf cells on the laminar family of :class:`RoundingPlan`.

    Parameters
    ----------
    hierarchy : Hierarchy
    leaf_values : (n_leaves, K) float
        Real-valued leaf estimates (e.g. GLS), meeting the invariants.
    rng : KeyedRNG
        Randomness from the streams ``label/...``.
    mode : {"cells", "totals"}
        The family (see the module docstring); ignored when ``plan`` is given.
    invariants : sequence of Invariant
        Rows held exactly (their sets join the family).
    with_variances : bool
        Also return the rounding variances (per level, (n, m) over ``plan.masks``).

    Returns
    -------
    list of numpy.ndarray
        int64 counts per level (root first), the sums of the rounded leaves; every leaf cell
        is ⌊x⌋ or ⌈x⌉ with E[rounded] = x, every set of the family within floor/ceil.

    References
    ----------
    Srinivasan (2001); Ageev & Sviridenko (2004).
    """
    x = np.asarray(leaf_values, dtype=float)
    if x.ndim != 2 or x.shape[0] != hierarchy.leaves.size:
        raise SpecError(f"leaf_values must be (n_leaves={hierarchy.leaves.size}, n_cells)")
    if plan is None:
        cells = tuple(f"c{j}" for j in range(x.shape[1]))
        plan = RoundingPlan.build(hierarchy.names, cells, mode, invariants)
    f = whole_forest(hierarchy)
    lo = [0] * f.depth
    part = round_part(f, lo, f.sizes, x, rng, plan, label=label, tol=tol)
    top = round_top(hierarchy, 0, [part.leftovers()], rng, plan, label=label, tol=tol)
    leaves = part.leaves
    leaves[top.leaf, top.cell] += top.add
    counts = hierarchy.aggregate(leaves)
    if not with_variances:
        return counts
    return counts, top.variances + settle_part(part, f, lo, plan, top.bits)


def rounding_variances(
    hierarchy: Hierarchy,
    leaf_values: np.ndarray,
    plan: RoundingPlan,
    tol: float = TOL,
) -> list[np.ndarray]:
    """Exact rounding variance of every tracked sum at every node (per level, (n, m)).

    The variances do not depend on the random draws (only on the fractional parts), so this
    runs the rounding with a fixed key and keeps its variances; see the module docstring
    for the derivation.
    """
    rng = KeyedRNG.reproducible(0, warn=False)
    return round_tree(hierarchy, leaf_values, rng, plan=plan, tol=tol, with_variances=True)[1]


# ----------------------------------------------------------------------------- bipartite
#: Finest grid of the fractional parts in :func:`controlled_round`, in bits: every value a
#: multiple of 2⁻⁴⁰ (about 9.1e-13), held as an int64 count of grid units.
CR_GRID_BITS = 40


def _grid_bits(K: int) -> int:
    """Grid bits for rows of ``K`` entries plus a slack: a row sum of the kernel (below
    ``K + 1``) on the grid must fit in float64's 53 bits, so every sum it forms is exact."""
    return min(CR_GRID_BITS, 52 - int(K + 1).bit_length())


def _line_resolution(abs_sums: np.ndarray, counts: np.ndarray | int, unit: float) -> np.ndarray:
    """How far a line's grid sum can be from the real sum of its values: the float
    resolution of the values (``n · ulp(Σ|x|)``, :func:`settle_row_sums`) plus half a grid
    unit per entry."""
    n = np.asarray(counts, dtype=float)
    return n * np.spacing(np.asarray(abs_sums, dtype=float)) + n * (unit / 2.0)


def _group_reduce(ufunc: np.ufunc, a: np.ndarray, starts: np.ndarray, empty) -> np.ndarray:
    """``ufunc`` over each group's rows of ``a`` (rows ``starts[g]:starts[g+1]``), in row
    order; ``empty`` for a group without rows."""
    full = np.diff(starts) > 0
    out = np.full((starts.size - 1, *a.shape[1:]), empty, dtype=a.dtype)
    if full.any():
        out[full] = ufunc.reduceat(a, starts[:-1][full], axis=0)
    return out


def _group_argmax(room: np.ndarray, starts: np.ndarray, grp: np.ndarray) -> tuple:
    """Per group and column, the largest ``room`` over the group's rows and its first row
    (``np.argmax``'s tie rule); ``(−1, n)`` for an empty group."""
    best = _group_reduce(np.maximum, room, starts, -1)
    rows = np.where(room == best[grp], np.arange(room.shape[0])[:, None], room.shape[0])
    return best, _group_reduce(np.minimum, rows, starts, room.shape[0])


def _settle_rows(Q, d, free, margin, grp, U) -> None:
    """Add each held row's residual ``d`` (grid units) to one entry, in place.

    The entry is the row's one with the most room ``min(q, U − q)`` in a free column of its
    group (one not held); a column takes the fixes only while their sum stays below its
    ``margin`` (grid units from its nearest integer), so it stays strictly between the same
    integers as its real sum. Rows without such an entry are left as they are.
    """
    lines = np.flatnonzero(d != 0)
    if lines.size == 0:
        return
    g, rows = grp[lines], Q[lines]
    room = np.where(free[g], np.minimum(rows, U - rows), -1)
    at = np.argmax(room, axis=1)
    ok = room[np.arange(lines.size), at] >= np.abs(d[lines])
    acc = np.zeros(margin.shape, dtype=np.int64)
    np.add.at(acc, (g[ok], at[ok]), d[lines[ok]])
    ok &= np.abs(acc[g, at]) < margin[g, at]
    Q[lines[ok], at[ok]] += d[lines[ok]]


def _settle_columns(Q, d, free, margin, starts, grp, U) -> None:
    """:func:`_settle_rows` for the held columns of every group (``d`` per group × column):
    the entry is the column's one of most room in a free row of the group."""
    if not d.any():
        return
    room = np.where(free[:, None], np.minimum(Q, U - Q), -1)
    best, row = _group_argmax(room, starts, grp)
    g, j = np.nonzero(d)
    at, dd = row[g, j], d[g, j]
    ok = best[g, j] >= np.abs(dd)
    acc = np.zeros(Q.shape[0], dtype=np.int64)
    np.add.at(acc, at[ok], dd[ok])
    ok &= np.abs(acc[at]) < margin[at]
    Q[at[ok], j[ok]] += dd[ok]


def _settle_totals(Q, starts, grp, held, res, U, tol, abs_total, counts) -> None:
    """Each group whose total is within its resolution of an integer made that integer, in
    place: the residual on the entry of most room in a free row and column whose sums stay
    strictly between the same integers (rows first in ``np.argmax`` order)."""
    hr, hc, res_r, res_c = held[0], held[1], res[0], res[1]
    s = _group_reduce(np.add, Q.sum(axis=1), starts, 0)
    d = np.rint(s / U).astype(np.int64) * U - s
    res_s = _line_resolution(abs_total, counts, 1.0 / U)
    d = np.where(np.abs(d) <= np.maximum(tol, res_s) * U, d, 0)
    if not d.any():
        return
    r, c = Q.sum(axis=1), _group_reduce(np.add, Q, starts, 0)
    mr = np.abs(r - np.rint(r / U) * U) - res_r * U
    mc = np.abs(c - np.rint(c / U) * U) - res_c * U
    dg = np.abs(d)[grp][:, None]
    ok = (~hr[:, None]) & (~hc[grp]) & (mr[:, None] > dg) & (mc[grp] > dg)
    room = np.where(ok, np.minimum(Q, U - Q), -1)
    col = np.argmax(room, axis=1)
    best, row = _group_argmax(room.max(axis=1, initial=-1)[:, None], starts, grp)
    g = np.flatnonzero((d != 0) & (best[:, 0] >= np.abs(d)))
    Q[row[g, 0], col[row[g, 0]]] += d[g]


def controlled_round(
    values: np.ndarray,
    uniforms: np.random.Generator | np.ndarray,
    tol: float = TOL,
    starts: np.ndarray | None = None,
) -> np.ndarray:
    """Unbiased controlled rounding of matrices: each one's row sums, column sums and total kept.

    Every entry becomes ⌊x⌋ or ⌈x⌉ with ``E = x``; in every group of rows (a matrix: the
    children of one parent) every row sum, column sum and the total is the floor or ceiling
    of its real sum, and exactly it when that sum is an integer (Cox 1987; Gandhi, Khuller,
    Parthasarathy & Srinivasan 2006, §2). Every group at once, vectorised, in one call of the
    compiled kernel :func:`~censusdp.estimation.integer.dependent.dependent_round`.

    **Integer-exact bookkeeping.** Only the fractional parts are rounded (the integer parts
    are kept exactly), each as an int64 count of grid units ``2⁻ᴳ`` (nearest;
    ``G`` = :data:`CR_GRID_BITS` = 40 unless a row of ``K + 1`` grid values would not fit
    in 53 bits). The line sums, the slack row and column that make every line sum of a group
    an integer (``⌈r⌉ − r``, and a corner making both slack lines integral) are integer
    arithmetic, and the kernel (run with tolerance ``2⁻ᴳ⁻²``) only adds, subtracts and
    compares grid values whose sums fit in float64: its column sums are exact integers however
    large the values. Bordering the values themselves (:func:`bordered`) leaves line sums off
    by ``n · ulp(Σ|x|)`` (1e-7 for a county of 10 million persons), above the kernel's 1e-9
    tolerance: the 3,221-county × 36-cell table raised :class:`DataError`.

    **Held lines.** A row, column or group total whose grid sum is within ``max(tol, ρ)`` of
    an integer, ``ρ`` its resolution (``n · ulp(Σ|x|)`` of the values plus ``n/2`` grid
    units: the real sum cannot be told from that integer, e.g. an invariant met to float
    precision), is made exactly that integer before bordering: its residual is added to its
    entry of most room whose crossing line is not held (rows first, then columns, then the
    total at an entry of a free row and a free column), so no held line moves another, and
    only while each crossing line stays strictly between the integers around its real sum.
    A held line with no such entry is rounded within floor/ceil of its grid sum (for an
    invariant, :func:`snap_invariants` settles it afterwards).

    **Law.** The kernel is unbiased for the grid probabilities it is given, so
    ``E[rounded] − x`` is only what the preparation moved: at most ``tol`` for an entry
    snapped to an integer (:func:`split_fraction`), half a grid unit (4.5e-13), and a held
    line's residual (at most ``max(tol, ρ)``) on one entry of that line.

    Parameters
    ----------
    values : (n, K) array of float
        Finite values, ``|x| <`` :data:`INT_LIMIT`.
    uniforms : numpy.random.Generator or (n + n_groups, K + 2) array of float
        The kernel's U[0, 1) draws: one row per row of a group and one for its slack row
        (after the group's rows), e.g. from
        :func:`~censusdp.estimation.integer.dependent.keyed_uniforms`; or a generator that
        draws them.
    tol : float
        Entries within ``tol`` of an integer count as that integer; lines within ``tol``
        (or their resolution) of an integer are held at it.
    starts : (n_groups + 1,) array of int, optional
        Group boundaries from 0 to ``n`` (non-decreasing); None: one group.

    Returns
    -------
    (n, K) numpy.ndarray of int64

    Raises
    ------
    DataError
        A group too large for the grid (``K`` above 2⁴⁵ or sums beyond int64).
    """
    x = np.asarray(values, dtype=float)
    base, F = split_fraction(x, tol)
    n, K = F.shape
    st = np.array([0, n] if starts is None else starts, dtype=np.int64)
    sizes = np.diff(st)
    G = sizes.size
    grp = np.repeat(np.arange(G), sizes)
    bits = _grid_bits(K)
    if bits < 8 or (int(sizes.max(initial=0)) + 1) * (K + 1) >= 2 ** (62 - bits):
        raise DataError(
            f"controlled rounding: a {int(sizes.max(initial=0))} × {K} matrix is too large "
            "for exact grid bookkeeping; round it in smaller groups"
        )
    U = 1 << bits
    unit = 1.0 / U
    Q = np.rint(np.ldexp(F, bits)).astype(np.int64)
    ax = np.abs(x)
    r, c = Q.sum(axis=1), _group_reduce(np.add, Q, st, 0)
    ax_c = _group_reduce(np.add, ax, st, 0.0)
    res_r = _line_resolution(ax.sum(axis=1), K, unit)
    res_c = _line_resolution(ax_c, sizes[:, None], unit)
    near_r = np.rint(r / U).astype(np.int64) * U
    near_c = np.rint(c / U).astype(np.int64) * U
    hr = np.abs(r - near_r) <= np.maximum(tol, res_r) * U
    hc = np.abs(c - near_c) <= np.maximum(tol, res_c) * U
    margin_r = np.abs(r - near_r) - res_r * U
    margin_c = np.abs(c - near_c) - res_c * U
    _settle_rows(Q, np.where(hr, near_r - r, 0), ~hc, margin_c, grp, U)
    _settle_columns(Q, np.where(hc, near_c - c, 0), ~hr, margin_r, st, grp, U)
    _settle_totals(Q, st, grp, (hr, hc), (res_r, res_c), U, tol, ax_c.sum(axis=1), sizes * K)
    # bordered groups: a group's rows then its slack row, each row with a slack entry
    at = np.arange(n) + grp  # a row's place among the n + G bordered rows
    slack = st[1:] + np.arange(G)
    B = np.zeros((n + G, K + 1), dtype=np.int64)
    B[at, :K] = Q
    B[at, K] = -Q.sum(axis=1) % U
    B[slack, :K] = -_group_reduce(np.add, Q, st, 0) % U
    B[slack, K] = -_group_reduce(np.add, B[at, K], st, 0) % U
    if isinstance(uniforms, np.random.Generator):
        uniforms = uniforms.random((n + G, K + 2))
    P = np.ldexp(B.astype(float), -bits)
    out = dependent_round(P, st + np.arange(G + 1), uniforms, tol=np.ldexp(1.0, -bits - 2))
    return base + out[at, :K]


def cancel_cycles(X: np.ndarray, gen: np.random.Generator, tol: float) -> np.ndarray:
    """Round a matrix whose row and column sums are all integers, keeping them exactly.

    For fractional parts whose line sums are integers to float resolution (small values);
    a matrix of raw values goes through :func:`controlled_round`, whose bookkeeping is exact.

    Dependent rounding of the fractional parts (Gandhi et al. 2006, §2; Cox 1987): cycles of
    fractional entries shifted by +α/−α alternately with the probabilities that keep every
    entry's mean, by the compiled kernel
    :func:`~censusdp.estimation.integer.dependent.dependent_round` (one group, uniforms from
    ``gen``).
    """
    base, F = split_fraction(X, tol)
    n, m = F.shape
    bits = dependent_round(F, np.array([0, n]), gen.random((n, m + 1)))
    return base + bits


def bipartite_rows(child_count: np.ndarray, first_leaf: int, first_parent: int) -> tuple:
    """The kernel rows of a run of leaf parents (``first_parent`` onwards, their leaves from
    ``first_leaf``): the group starts over its leaves and the global range of its bordered
    rows (a parent's leaves then its slack row, leaf ``l`` of parent ``p`` at row ``l + p``)."""
    starts = np.concatenate([[0], np.cumsum(child_count)]).astype(np.int64)
    lo = first_leaf + first_parent
    return starts, lo, lo + int(starts[-1]) + child_count.size


def round_bipartite_part(
    leaf_values: np.ndarray,
    child_count: np.ndarray,
    first_parent: int,
    rng: KeyedRNG | SubKeys,
    n_rows: int,
    first_leaf: int,
    *,
    label: str = "rounding/bipartite",
    tol: float = TOL,
) -> np.ndarray:
    """Controlled rounding of the leaves of a run of parents (``first_parent`` onwards, their
    leaves from ``first_leaf``), all in one :func:`controlled_round`.

    The uniforms of parent ``p``'s bordered rows are items of the keyed stream ``label`` of
    ``n_rows`` (all leaves and all parents) rows
    (:func:`~censusdp.estimation.integer.dependent.keyed_uniforms`, by global row), so any
    split of the parents gives the same integers.
    """
    x = np.asarray(leaf_values, dtype=float)
    starts, lo, hi = bipartite_rows(np.asarray(child_count), first_leaf, first_parent)
    u = keyed_uniforms(rng, label, n_rows, lo, hi, x.shape[1] + 1)
    return controlled_round(x, u, tol, starts)


def check_bipartite(
    names: Sequence[str], cells: Sequence[str], invariants: Sequence[Invariant]
) -> None:
    """Refuse invariants that controlled rounding of each leaf parent's matrix cannot keep.

    It keeps, exactly when integer: leaf cells and totals, the cells and total of each parent
    of the leaves, and sums of those above (a total above the parents' level is exact when the
    parents' totals are invariant, a cell when the parents' cells are).

    Raises
    ------
    SpecError
        Naming the invariant (level, query) that is not among them.
    """
    D = len(names)
    rows = invariant_rows(names, cells, invariants)
    up = max(D - 2, 0)
    kept_up = [s for lv, s, _ in rows if lv == up]
    for lv, s, iv in rows:
        single, whole = int(s.sum()) == 1, bool(s.all())
        if lv >= up:
            ok = single or whole
        else:
            ok = any(np.array_equal(s, t) for t in kept_up) and (single or whole)
        if not ok:
            raise SpecError(
                f"rounding mode 'bipartite' cannot keep the invariant at {_describe(names, iv)} "
                f"exact: it controls only leaf cells and totals and the cells and totals of "
                f"the leaves' parents (level {names[up]!r}) independently per parent; use "
                "method='cells' or 'totals', which keep every laminar family of invariants"
            )


def bipartite_variances(
    leaf_values: np.ndarray, parent_values: np.ndarray, masks: np.ndarray, tol: float = TOL
) -> list[np.ndarray]:
    """Rounding variances under :func:`round_bipartite`: ``[parents (n, m), leaves (n, m)]``.

    Leaf cells and totals, parent cells and totals are each within floor/ceil (variance
    f(1 − f)); the parents are rounded independently, so above them the variances of cells
    and totals add (aggregate the parents'). Other sums (marginals of several cells) are NaN:
    the cycle-cancelling scheme has no closed-form joint law; use a laminar mode for them.
    """
    single = masks.sum(axis=1) == 1
    whole = masks.all(axis=1)
    col = np.where(single, np.argmax(masks, axis=1), 0)

    def at(values: np.ndarray) -> np.ndarray:
        v = np.asarray(values, float)
        out = np.where(single[None], rounding_variance(v, tol)[:, col], np.nan)
        return np.where(whole[None], rounding_variance(v.sum(axis=1), tol)[:, None], out)

    return [at(parent_values), at(leaf_values)]


def round_bipartite(
    hierarchy: Hierarchy,
    leaf_values: np.ndarray,
    rng: KeyedRNG,
    *,
    label: str = "rounding/bipartite",
    tol: float = TOL,
) -> list[np.ndarray]:
    """Controlled unbiased rounding of the leaves under each parent (two crossing families).

    For every parent of the leaf level, the (children × cells) matrix is rounded so that each
    leaf's total, each of the parent's cell sums and the parent's total are the floor or
    ceiling of their real values (exact when integer), and E[rounded] = value for every leaf
    cell. The matrix's fractional parts, on an exact integer grid, are bordered by a slack
    column (ceil(row sum) − row sum) and a slack row (ceil(column sum) − column sum), which
    makes every line sum an integer, and then rounded by cycle cancelling
    (:func:`controlled_round`: exact however large the values; line sums within float
    resolution of an integer are held at it), every parent in one call of the compiled
    kernel, with uniforms keyed by global row (:func:`round_bipartite_part`; this function
    is its one-partition case). A one-level hierarchy is one matrix.

    Notes
    -----
    Sums two or more levels above the leaves are sums of the independently rounded parents:
    exact when the parents' values are (invariants), else not within floor/ceil
    (:func:`check_bipartite` refuses invariants it cannot keep).

    References
    ----------
    Gandhi, Khuller, Parthasarathy & Srinivasan (2006), §2; Cox (1987).
    """
    x = np.asarray(leaf_values, dtype=float)
    h = hierarchy
    if x.ndim != 2 or x.shape[0] != h.leaves.size:
        raise SpecError(f"leaf_values must be (n_leaves={h.leaves.size}, n_cells)")
    cc = h.levels[-2].child_count if h.depth >= 2 else np.array([x.shape[0]])
    out = round_bipartite_part(x, cc, 0, rng, x.shape[0] + cc.size, 0, label=label, tol=tol)
    return h.aggregate(out)


def settle_row_sums(frac: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Fractional parts whose row sums are integers to float resolution, made integers.

    ``frac`` are the fractional parts of ``values`` (rows whose real sums are integers, e.g.
    held by an invariant). In float64 a row of ``n`` values sums to its integer only within
    about ``n · ulp(Σ |x|)`` (a state of 39 million persons over 2,016 cells: up to 1.5e-5, far
    above the rounding tolerance), and controlled rounding needs every line sum integral. A row
    within that resolution of an integer gets the difference added to its entry with the
    most room (largest ``min(f, 1 − f)``; the difference is far smaller than that room), so
    every probability moves by at most the float resolution of the values themselves. Rows
    farther from an integer are left as they are (the bordering gives them a slack entry).
    """
    f = np.array(frac, dtype=float)
    if f.size == 0:
        return f
    r = f.sum(axis=1)
    d = np.rint(r) - r
    res = f.shape[1] * np.spacing(np.abs(np.asarray(values, dtype=float)).sum(axis=1))
    rows = np.flatnonzero((d != 0) & (np.abs(d) <= np.maximum(res, 0.0)))
    if rows.size:
        room = np.minimum(f[rows], 1.0 - f[rows])
        cols = np.argmax(room, axis=1)
        ok = room[np.arange(rows.size), cols] > np.abs(d[rows])
        f[rows[ok], cols[ok]] += d[rows[ok]]
    return f


def bordered(X: np.ndarray, tol: float) -> np.ndarray:
    """X with a slack column and row making every row and column sum an integer."""
    r = X.sum(axis=1)
    c = X.sum(axis=0)
    rs = np.ceil(r - tol) - r
    cs = np.ceil(c - tol) - c
    corner = np.ceil(rs.sum() - tol) - rs.sum()
    B = np.zeros((X.shape[0] + 1, X.shape[1] + 1))
    B[:-1, :-1] = X
    B[:-1, -1] = np.maximum(rs, 0.0)
    B[-1, :-1] = np.maximum(cs, 0.0)
    B[-1, -1] = max(corner, 0.0)
    return B


# ----------------------------------------------------------------------------- releases
def check_invariants(release: Release, invariants: Sequence[Invariant]) -> dict[str, bool]:
    """Whether each invariant holds *exactly* (``==``) on the release, by "level: query".

    The only source of the "invariants released exactly" claim: it is computed from the
    released numbers, never assumed.
    """
    out: dict[str, bool] = {}
    for iv in at_level_indices(release.hierarchy.names, invariants):
        key = iv.label
        got = iv.query.apply(release.estimates[iv.level])
        ok = got.shape == np.shape(iv.values) and bool(np.all(got == iv.values))
        out[key] = out.get(key, True) and ok
    return out


def snap_invariants(
    forest: Forest,
    leaf_values: np.ndarray,
    leaves: np.ndarray,
    invariants: Sequence[Invariant],
    tol: float = TOL,
) -> np.ndarray:
    """Put back onto the invariants what float64 resolution made the rounding miss.

    A set of the rounding family whose real sum is an invariant ``t`` sums, in float64, to
    within ``n · ulp(max |x|)`` of ``t`` only (``n`` its leaf cells): near 2⁵³ a county
    estimate holds no fraction at all, its children's fractional parts do not sum to an
    integer, and the leftover the rounding carries out of the invariant's set misses ``t``
    by one for some draws. Where an invariant node's rounded sum misses ``t`` by at most
    ``1 + ⌊n · ulp(max |x|)⌋`` *and* that resolution is at least ``tol`` (so the miss is a
    float artefact, not an estimate that missed the invariant), the difference is added, as
    an integer, to the set's leaf cell of largest magnitude that no deeper (or nested)
    invariant holds: its float value cannot tell ⌊x⌋ from x ± 1 either, so every other
    guarantee holds to float resolution. Rows are settled deepest (and smallest) first, so a
    fix never breaks an invariant already settled (the family is laminar: an earlier row
    meeting this one lies inside it). Misses beyond the float resolution are left for the
    ``==`` check to refuse (:func:`finish_rounding`).

    Parameters
    ----------
    forest : Forest
        The levels the leaves sum to (a partition's, or :func:`whole_forest`).
    leaf_values : (n_leaves, K) float
        The real leaf estimates that were rounded.
    leaves : (n_leaves, K) int64
        Their rounding; returned as is when nothing is missed, else a corrected copy.
    invariants : sequence of Invariant
        Hierarchy levels; those outside the forest are skipped, values cut to its nodes.
    tol : float
        The rounding tolerance (fractions within it count as integral).
    """
    x = np.abs(np.asarray(leaf_values, dtype=float))
    rows = sorted(
        (
            (iv.level - forest.first, r, np.asarray(iv.values)[:, q])
            for iv in invariants
            if 0 <= iv.level - forest.first < forest.depth
            for q, r in enumerate(np.asarray(iv.query.matrix) != 0)
        ),
        key=lambda r: (-r[0], int(r[1].sum())),
    )
    out = leaves
    done: list[np.ndarray] = []
    for j, s, target in rows:
        locked = np.zeros_like(s)
        for d in done:
            if (d & s).any():
                locked |= d
        done.append(s)
        free = np.flatnonzero(s & ~locked)
        miss = np.asarray(target, np.int64) - forest.aggregate(out[:, s].sum(axis=1))[j]
        if not miss.any() or free.size == 0:
            continue
        anc = np.arange(forest.sizes[-1])
        for i in range(forest.depth - 1, j, -1):
            anc = forest.parent(i)[anc]
        n = np.bincount(anc, minlength=forest.sizes[j]) * int(s.sum())
        big = np.zeros(forest.sizes[j])
        np.maximum.at(big, anc, x[:, s].max(axis=1, initial=0.0))
        res = n * np.spacing(big)
        fix = np.flatnonzero((miss != 0) & (res >= tol) & (np.abs(miss) <= 1 + np.floor(res)))
        if out is leaves and fix.size:
            out = leaves.copy()
        for v in fix:  # only nodes at the edge of float resolution: a handful
            here = np.flatnonzero(anc == v)
            block = x[here][:, free]
            i, c = np.unravel_index(int(np.argmax(block)), block.shape)
            out[here[i], free[c]] += miss[v]
    return out


def sum_estimator_variances(
    release: Release | object, masks: np.ndarray, levels: Sequence[int]
) -> list[np.ndarray]:
    """The estimator's variance of every tracked sum, per level (n, m); NaN where unknown.

    From the per-node covariances when the release has them (``1_Aᵀ Σ 1_A``), else only for
    single cells (from the variances).
    """
    out = []
    single = masks.sum(axis=1) == 1
    col = np.argmax(masks, axis=1)
    M = masks.astype(float)
    for k in levels:
        cov = None if release.covariances is None else release.covariances[k]
        var = None if release.variances is None else release.variances[k]
        if cov is not None:
            out.append(np.einsum("qa,nab,qb->nq", M, cov, M))
        elif var is not None:
            out.append(np.where(single[None], var[:, col], np.nan))
        else:
            out.append(np.full((release.estimates[k].shape[0], masks.shape[0]), np.nan))
    return out


def rounding_fields(
    release: Release | object,
    rounding: Sequence[np.ndarray],
    masks: np.ndarray,
    labels: Sequence[str],
    method: str,
    family: Sequence[str] = (),
    largest: float = 0.0,
) -> tuple[list[np.ndarray] | None, SumVariances, dict]:
    """The variances, tracked sums and diagnostics of ``release`` rounded (its first
    ``len(rounding)`` levels).

    ``rounding`` are the rounding variances of the tracked sums (per level (n, m), the first
    K being the cells): the variances become the estimator's plus these, and
    :meth:`Release.sum_variances` gives those of totals and marginals; ``largest`` a cell
    rounding variance seen elsewhere (levels held apart).
    """
    K = masks.shape[1]
    cell_var = [r[:, :K] for r in rounding]
    variances = (
        None
        if release.variances is None
        else [v + r for v, r in zip(release.variances, cell_var, strict=True)]
    )
    largest = max([largest, *(float(np.nanmax(r, initial=0.0)) for r in cell_var)])
    est = sum_estimator_variances(release, masks, range(len(rounding)))
    sums = SumVariances(masks, tuple(labels), est, list(rounding))
    diag = {**release.diagnostics, "rounding": method, "rounding_variance_max": largest}
    if family:
        diag["rounding_family"] = list(family)
    return variances, sums, diag


def require_exact(exact: dict[str, bool]) -> dict[str, bool]:
    """``exact`` (per invariant label, whether it holds ``==`` after rounding), or
    :class:`DataError` naming those that do not."""
    missed = [k for k, ok in exact.items() if not ok]
    if missed:
        raise DataError(
            f"invariants {missed} are not exact after rounding: the real-valued release does "
            "not meet them within the rounding tolerance; check the estimator's invariant "
            "constraints"
        )
    return exact


def round_release(
    release: Release,
    rng: KeyedRNG,
    *,
    method: Literal["cells", "totals", "bipartite"] = "cells",
    invariants: Sequence[Invariant] = (),
    queries: Sequence[Query] = (),
    label: str | None = None,
    tol: float = TOL,
) -> Release:
    """An integer :class:`Release` from a real-valued one that keeps every invariant exact.

    Parameters
    ----------
    release : Release
        Real-valued, consistent, meeting ``invariants``.
    rng : KeyedRNG
    method : {"cells", "totals", "bipartite"}
        The family kept within floor/ceil besides the invariants (module docstring).
    invariants : sequence of Invariant
        Held exactly: their sets join the family, and they are checked ``==`` afterwards
        (``diagnostics["invariants_exact"]``). Levels by name or index (the same release bit
        for bit).
    queries : sequence of Query
        Marginals whose sums get exact rounding variances besides cells and totals
        (:meth:`Release.sum_variances`; invariant rows are tracked too).

    Returns
    -------
    Release
        Integer estimates; variances = the estimator's + the exact rounding variance of each
        value at every level; ``sums`` the variances of totals and tracked marginals.

    Raises
    ------
    DataError
        A NaN, infinite or out-of-range leaf estimate (naming level, node and cell), or an
        invariant not exact after rounding.
    SpecError
        An unknown method, an unknown level, or invariants the method cannot keep (named).
    """
    h = release.hierarchy
    invariants = at_level_indices(h.names, invariants)
    leaves = release.estimates[-1]
    lab = label or f"rounding/{method}"
    if method not in ("cells", "totals", "bipartite"):
        raise SpecError(f"method must be 'cells', 'totals' or 'bipartite', got {method!r}")
    check_finite(h, release.cells, leaves)
    if method == "bipartite":
        check_bipartite(h.names, release.cells, invariants)
        masks, labels = tracked_sums(release.cells, invariants, queries)
        counts = round_bipartite(h, leaves, rng, label=lab, tol=tol)
        par, leaf = bipartite_variances(leaves, release.estimates[h.depth - 2], masks, tol)
        rv = [*whole_forest(h, 0, h.depth - 2).aggregate(par), leaf] if h.depth > 1 else [leaf]
        family: list[str] = []
    else:
        plan = RoundingPlan.build(h.names, release.cells, method, invariants, queries)
        counts, rv = round_tree(h, leaves, rng, plan=plan, label=lab, tol=tol, with_variances=True)
        masks, labels, family = plan.masks, plan.labels, plan.describe()
    snapped = snap_invariants(whole_forest(h), leaves, counts[-1], invariants, tol)
    if snapped is not counts[-1]:
        counts = h.aggregate(snapped)
    variances, sums, diag = rounding_fields(release, rv, masks, labels, method, family)
    changes = {"estimates": counts, "variances": variances, "diagnostics": diag, "sums": sums}
    out = release.replace(integer=True, covariances=None, **changes)
    out.diagnostics["invariants_exact"] = require_exact(check_invariants(out, invariants))
    return out
