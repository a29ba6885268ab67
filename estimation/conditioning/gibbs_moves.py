"""Heat-bath (Gibbs) move sets for ℓ₁ and ℓ₂ product targets: exact draws along pair directions.

A random-walk Metropolis move on a constrained noise vector is rejected often, and two coupled
chains that accept differently drift apart, so L-lag couplings of such chains meet late or
never once there are more than a few dozen coordinates. For targets of the form
``log π(s) = −Σ_i β_i |s_i| + const`` — independent Laplace or discrete Laplace noise, the ℓ₁
generalized Laplace on a lattice — the conditional of π along a pair direction is known in
closed form (:class:`~censusdp.estimation.conditioning.line_conditional.LaplaceLine`); so it is for
``log π(s) = −½ Σ_i p_i s_i² + const`` — independent Gaussian or discrete Gaussian noise —
(:class:`~censusdp.estimation.conditioning.gaussian_line.GaussianLine`). A move can therefore draw
the step exactly from it (a Gibbs step: always accepted). Coupled chains draw their steps from
a maximal coupling of their two conditionals on the same line, which makes the moved
coordinates coincide with the largest possible probability; once the remaining disagreement
lies on a single line the two chains meet exactly.

Sweeps: a move updates many disjoint lines at once. Pairs are a random perfect matching of the
nodes of one level within each parent (or of the cells within each invariant group); pairs
with disjoint footprints are conditionally independent under a product target, so drawing
all of them together is an exact block-Gibbs step. Every choice (level, cell, matching) is
drawn independently of the state, per chain, so the kernel is a state-independent mixture of
Gibbs kernels and leaves π invariant.

References
----------
Geman & Geman (1984), the Gibbs sampler; Liu, Sun, Zhou & Feng, "Two Views of Constrained
Differential Privacy", Algorithm 1 (moves that keep the hierarchy consistent); Dharangutte,
Gao, Gong & Yu (2023), "Integer Subspace Differential Privacy", §4 (Gibbs sweep over lattice
directions); Biswas, Jacob & Vanetti (2019), L-lag couplings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from censusdp.estimation.conditioning.gaussian_line import GaussianLine
from censusdp.estimation.conditioning.line_conditional import LaplaceLine, couple_lines
from censusdp.estimation.conditioning.mcmc import (
    BasisMoves,
    MoveSet,
    Proposal,
    TreeLayout,
    TreePairs,
    uniform_index,
)

__all__ = ["LineDraws", "GibbsGroupMoves", "GibbsTreeMoves", "GibbsBasisMoves"]


class LineDraws:
    """Exact draws along lines for an ℓ₁ or ℓ₂ product target with optional box bounds.

    Give exactly one of ``rates`` (Laplace-type target: lines are
    :class:`~censusdp.estimation.conditioning.line_conditional.LaplaceLine`) and ``precisions``
    (Gaussian-type target: :class:`~censusdp.estimation.conditioning.gaussian_line.GaussianLine`).

    Parameters
    ----------
    rates : numpy.ndarray, optional
        (d,) β per state coordinate (0 for a flat coordinate); see
        :meth:`censusdp.estimation.conditioning.mcmc.Target.l1_rates`.
    precisions : numpy.ndarray, optional
        (d,) p = 1/σ² per state coordinate (0 for a flat coordinate); see
        :meth:`censusdp.estimation.conditioning.mcmc.Target.l2_precisions`.
    integer : bool
        Integer states and steps.
    lower, upper : numpy.ndarray, optional
        (d,) bounds on state coordinates (±inf where none), e.g. non-negativity of the
        released table or a truncation box.
    """

    def __init__(
        self,
        rates: np.ndarray | None = None,
        *,
        precisions: np.ndarray | None = None,
        integer: bool,
        lower: np.ndarray | None = None,
        upper: np.ndarray | None = None,
    ) -> None:
        if (rates is None) == (precisions is None):
            raise ValueError("give exactly one of ℓ₁ rates and ℓ₂ precisions")
        self.family = "l1" if rates is not None else "l2"
        weights = rates if rates is not None else precisions
        self.weights = np.asarray(weights, dtype=np.float64)
        if np.any(self.weights < 0) or not np.all(np.isfinite(self.weights)):
            name = "ℓ₁ rates" if self.family == "l1" else "ℓ₂ precisions"
            raise ValueError(f"{name} must be finite and non-negative")
        self._line_type = LaplaceLine if self.family == "l1" else GaussianLine
        self.integer = bool(integer)
        self.lower = None if lower is None else np.asarray(lower, dtype=np.float64)
        self.upper = None if upper is None else np.asarray(upper, dtype=np.float64)

    def line(
        self,
        states: np.ndarray,
        idx: np.ndarray,
        coef: np.ndarray,
        chain: np.ndarray | None = None,
    ) -> LaplaceLine | GaussianLine:
        """The conditional of the step on each line ``s + δ·coef`` (rows of idx/coef).

        ``states`` is (n_chains, d); ``chain`` gives each line's row of ``states`` (default:
        line i on row i). Only the lines' coordinates are gathered, never whole states.
        """
        rows = np.arange(idx.shape[0]) if chain is None else chain
        a = states[rows[:, None], idx].astype(np.float64)
        c = coef.astype(np.float64)
        lo = np.full(idx.shape[0], -np.inf)
        hi = np.full(idx.shape[0], np.inf)
        with np.errstate(divide="ignore", invalid="ignore"):
            for bound, is_lower in ((self.lower, True), (self.upper, False)):
                if bound is None:
                    continue
                limit = (bound[idx] - a) / np.where(c != 0, c, 1.0)
                # a + c δ ≥ L: δ ≥ (L − a)/c when c > 0, δ ≤ (L − a)/c when c < 0
                at_least = (c > 0) if is_lower else (c < 0)
                at_most = (c < 0) if is_lower else (c > 0)
                live = np.isfinite(limit)
                lo = np.maximum(lo, np.max(np.where(at_least & live, limit, -np.inf), axis=1))
                hi = np.minimum(hi, np.min(np.where(at_most & live, limit, np.inf), axis=1))
        return self._line_type.build(a, c, self.weights[idx], lo, hi, integer=self.integer)

    def proposal(
        self, idx: np.ndarray, coef: np.ndarray, steps: np.ndarray, n_chains: int
    ) -> Proposal:
        """A Gibbs proposal from per-line steps: lines are ``n_chains × P`` rows of (idx, coef)."""
        dtype = np.int64 if self.integer else np.float64
        steps = np.round(steps) if self.integer else steps
        delta = coef.astype(dtype) * steps.astype(dtype)[:, None]
        return Proposal(idx.reshape(n_chains, -1), delta.reshape(n_chains, -1), always_accept=True)

    def draw(self, states, idx, coef, gen) -> Proposal:
        """Independent exact draws on every line of every chain."""
        n, P = states.shape[0], idx.shape[0] // states.shape[0]
        line = self.line(states, idx, coef, np.repeat(np.arange(n), P))
        return self.proposal(idx, coef, line.sample(gen), n)

    def draw_coupled(self, x, y, idx, coef, shift, gen) -> tuple[Proposal, Proposal]:
        """Maximally coupled draws for two chain batches on the same lines, so that
        ``δy = δx + shift`` (per line) when possible; with ``shift = x_a − y_a`` for a
        coordinate ``a`` of coefficient +1 the coupling equalises its new values."""
        n, P = x.shape[0], idx.shape[0] // x.shape[0]
        chain = np.repeat(np.arange(n), P)
        lx, ly = self.line(x, idx, coef, chain), self.line(y, idx, coef, chain)
        dx, dy, _ = couple_lines(lx, ly, np.asarray(shift, dtype=np.float64), gen)
        return self.proposal(idx, coef, dx, n), self.proposal(idx, coef, dy, n)


def _anchor_shift(x: np.ndarray, y: np.ndarray, anchor: np.ndarray) -> np.ndarray:
    """Per line (chains × P rows), ``x_a − y_a`` at its anchor coordinate ``a``."""
    chain = np.arange(anchor.size) // (anchor.size // x.shape[0])
    return (x[chain, anchor] - y[chain, anchor]).astype(np.float64)


def _pair_slots(sizes: np.ndarray) -> np.ndarray:
    """First slot of every pair of a perfect matching of consecutive slots within groups of
    the given sizes laid out contiguously (the odd one out of a group stays unpaired)."""
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    n_pairs = sizes // 2
    group = np.repeat(np.arange(sizes.size), n_pairs)
    k = np.arange(n_pairs.sum()) - np.repeat(np.cumsum(n_pairs) - n_pairs, n_pairs)
    return start[group] + 2 * k


class GibbsGroupMoves(MoveSet):
    """Gibbs sweeps for group-sum invariants: ``z* = z + δ (e_i − e_j)`` on a random matching.

    Every step draws, per chain, a uniformly random perfect matching of the cells of each
    group (state) and redraws every matched pair's split exactly from the target's
    conditional, keeping every group total. Requires an ℓ₁ or ℓ₂ product target.

    Parameters
    ----------
    groups : numpy.ndarray
        (d,) group label of every cell.
    draws : LineDraws
    """

    def __init__(self, groups: np.ndarray, draws: LineDraws) -> None:
        groups = np.asarray(groups).reshape(-1)
        _, gid = np.unique(groups, return_inverse=True)
        self.order = np.argsort(gid, kind="stable")  # cells laid out group by group
        self._key = gid[self.order].astype(np.float64)
        self.first = _pair_slots(np.bincount(gid))
        if self.first.size == 0:
            raise ValueError("no group has two cells: there is nothing to move")
        self.draws, self.integer = draws, draws.integer

    def _lines(self, n: int, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        perm = np.argsort(self._key + gen.random((n, self._key.size)), axis=1)
        cells = self.order[perm]
        i, j = cells[:, self.first], cells[:, self.first + 1]
        idx = np.stack([i.reshape(-1), j.reshape(-1)], axis=1)
        coef = np.tile(np.array([[1, -1]], dtype=np.int64), (idx.shape[0], 1))
        return idx, coef

    def propose(self, states, gen):
        idx, coef = self._lines(states.shape[0], gen)
        return self.draws.draw(states, idx, coef, gen)

    def propose_coupled(self, x, y, gen):
        idx, coef = self._lines(x.shape[0], gen)
        return self.draws.draw_coupled(x, y, idx, coef, _anchor_shift(x, y, idx[:, 0]), gen)


class GibbsTreeMoves(TreePairs):
    """Gibbs sweeps on a hierarchy: exact draws along leaf-pair directions.

    Per chain, a step is one of (chosen independently of the state):

    * with probability ``p_pair`` (0 when no cell has an exchangeable partner and every cell
      can be moved by sweeps): one pair chosen as in :class:`~censusdp.estimation.conditioning.mcmc.TreePairs`;
    * otherwise a *level sweep* for a uniformly chosen (level k, cell c) among those that keep
      every invariant (k deeper than c's deepest invariant level): a random perfect matching
      of the level-k nodes within each parent; for every matched pair (u, v), a random leaf
      under each, and the line ``+δ`` on ``(leaf_u, c)``, ``−δ`` on ``(leaf_v, c)`` changes
      only the paths up to u and v, so the pairs' footprints are disjoint. For a cell no
      invariant involves, k = 0 is a single move on one random leaf.

    Parameters
    ----------
    layout : TreeLayout
    invariants : sequence of (level, query matrix)
    draws : LineDraws
    p_pair : float, optional
        Default 0.2 when some cell has an exchangeable partner, else 0.
    """

    def __init__(
        self,
        layout: TreeLayout,
        invariants: Sequence[tuple[int, np.ndarray]],
        draws: LineDraws,
        *,
        p_pair: float | None = None,
    ) -> None:
        super().__init__(layout, invariants)
        self.draws, self.integer = draws, draws.integer
        h = layout.hierarchy
        options = []
        for c in range(layout.n_cells):
            first = 0 if self.unconstrained[c] else int(self.block_level[c]) + 1
            options += [(k, c) for k in range(first, h.depth)]
        self._options = np.array(options, dtype=np.int64).reshape(-1, 2)
        if p_pair is None:
            p_pair = 0.2 if (self._n_members > 1).any() else 0.0
        if self._options.size == 0:
            p_pair = 1.0
        self.p_pair = float(p_pair)
        # per level: nodes laid out by parent (canonical order), padded to a common width
        sizes = [lv.size for lv in h.levels]
        width = max(sizes)
        self._key = np.full((h.depth, width), np.inf)
        self._first_leaf = np.zeros((h.depth, width), dtype=np.int64)
        self._n_leaf = np.zeros((h.depth, width), dtype=np.int64)
        slots = [np.zeros(0, dtype=np.int64)]
        n_leaves = h.leaves.size
        for k in range(h.depth):
            parent = (
                np.zeros(sizes[k], dtype=np.int64)
                if k == 0
                else h.ancestor_index(k, k - 1).astype(np.int64)
            )
            self._key[k, : sizes[k]] = parent
            anc = layout.ancestors[k]
            first = np.full(sizes[k], n_leaves, dtype=np.int64)
            np.minimum.at(first, anc, np.arange(n_leaves))
            self._first_leaf[k, : sizes[k]] = first
            self._n_leaf[k, : sizes[k]] = np.bincount(anc, minlength=sizes[k])
            slots.append(_pair_slots(np.bincount(parent)) if k > 0 else np.zeros(1, np.int64))
        n_pairs = max(s.size for s in slots)
        self._slots = np.zeros((h.depth, n_pairs), dtype=np.int64)
        self._slot_ok = np.zeros((h.depth, n_pairs), dtype=bool)
        for k in range(h.depth):
            s = slots[k + 1]
            self._slots[k, : s.size], self._slot_ok[k, : s.size] = s, True

    def _lines(self, n: int, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Footprint indices and coefficients (n·P, K) of every chain's P lines (padding lines
        have all-zero coefficients), and each line's anchor coordinate ``w[i, c]``."""
        lay = self.layout
        pair_move = gen.random(n) < self.p_pair
        opt = (
            self._options[uniform_index(gen.random(n), max(len(self._options), 1))]
            if len(self._options)
            else np.zeros((n, 2), dtype=np.int64)
        )
        k, c = opt[:, 0], opt[:, 1]
        perm = np.argsort(self._key[k] + gen.random(self._key[k].shape), axis=1)
        rows = np.arange(n)[:, None]
        slots = self._slots[k]
        u, v = perm[rows, slots], perm[rows, np.minimum(slots + 1, perm.shape[1] - 1)]
        ok = self._slot_ok[k] & ~pair_move[:, None]
        kk = np.broadcast_to(k[:, None], u.shape)
        nu, nv = self._n_leaf[kk, u], self._n_leaf[kk, v]
        i = self._first_leaf[kk, u] + uniform_index(gen.random(u.shape), np.maximum(nu, 1))
        j = self._first_leaf[kk, v] + uniform_index(gen.random(v.shape), np.maximum(nv, 1))
        single = np.broadcast_to((k == 0)[:, None], u.shape).copy()
        null = ~ok | (nu == 0) | ((nv == 0) & ~single)
        i, j = (
            np.minimum(i, lay.hierarchy.leaves.size - 1),
            np.minimum(j, lay.hierarchy.leaves.size - 1),
        )
        c = np.broadcast_to(c[:, None], u.shape).copy()
        c2 = c.copy()
        # the single-pair branch: slot 0 of those chains
        if pair_move.any():
            m = np.flatnonzero(pair_move)
            pi, pc, pj, pc2, pnull, psingle = self._pairs(gen.random((m.size, 5)))
            i[m, 0], c[m, 0], j[m, 0], c2[m, 0] = pi, pc, pj, pc2
            null[m, 0], single[m, 0] = pnull, psingle
        flat = [a.reshape(-1) for a in (i, c, j, c2, null, single)]
        idx, coef = lay.footprint(*flat[:4], flat[5])
        coef = np.where(flat[4][:, None], 0, coef)
        anchor = lay.w_offset + flat[0] * lay.n_cells + flat[1]
        return idx, coef, anchor

    def propose(self, states, gen):
        idx, coef, _ = self._lines(states.shape[0], gen)
        return self.draws.draw(states, idx, coef, gen)

    def propose_coupled(self, x, y, gen):
        idx, coef, anchor = self._lines(x.shape[0], gen)
        return self.draws.draw_coupled(x, y, idx, coef, _anchor_shift(x, y, anchor), gen)


class GibbsBasisMoves(BasisMoves):
    """Random-scan Gibbs along the columns of a lattice or null-space basis ``B``.

    Each step picks a column ``b_k`` uniformly per chain and draws δ exactly from the
    target's conditional on ``s + δ b_k`` (the Gibbs sweep of integer subspace DP, §4, in
    random-scan order). Coupled chains use the same k and maximally couple δ so that the
    coefficient of ``b_k`` in ``x − y = B c`` becomes zero.

    Parameters
    ----------
    basis : numpy.ndarray
        (d, m) directions (integer for a lattice).
    draws : LineDraws
    """

    def __init__(self, basis: np.ndarray, draws: LineDraws) -> None:
        B = np.asarray(basis)
        if B.ndim != 2 or B.shape[1] == 0:
            raise ValueError("the move basis must be a (d, m) matrix with m ≥ 1 columns")
        self.mode, self.draws = "single", draws
        self._set_basis(B, draws.integer)

    def propose(self, states, gen):
        k = uniform_index(gen.random(states.shape[0]), self.basis.shape[1])
        return self.draws.draw(states, self._nz_idx[k], self._nz_val[k], gen)

    def propose_coupled(self, x, y, gen):
        n = x.shape[0]
        k = uniform_index(gen.random(n), self.basis.shape[1])
        shift = self._coeffs(x - y)[np.arange(n), k]
        return self.draws.draw_coupled(x, y, self._nz_idx[k], self._nz_val[k], shift, gen)
