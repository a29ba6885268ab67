"""A constraint-preserving Metropolis–Hastings engine over noise vectors.

The engine samples a *state* ``s`` — a real or integer vector of length ``d`` — from a target
density known up to a constant, with additive moves ``s* = s + Δ`` that keep every linear
constraint exactly (each move direction lies in the constraint's null space or lattice). Many
chains advance together: a state batch is an array of shape ``(n_chains, d)`` and one
iteration updates all chains with numpy operations. It never sees confidential data: for
conditioning, the state is the noise ``e = y − z`` of the noisy measurements ``y`` around a
consistent table ``z`` (plus the leaf offsets that produced it), and the target is the public
noise law, so the sampling error does not depend on the confidential values.

Plugging in a target
--------------------
Subclass :class:`Target` and implement ``log_density(states) -> (n_chains,)``: the
unnormalised log-density of each whole state vector. That is all that is required — the engine
then evaluates a proposal by materialising ``s + Δ`` and calling it. For speed, also override
``log_density_change(states, idx, delta) -> (n_chains,)``, the change
``log π(s + Δ) − log π(s)`` of a *sparse* move (``Δ`` is ``delta`` scattered at ``idx``,
see :class:`Proposal`), computed from the touched entries only.
The ready-made target, :class:`ProductTarget`, is ``Σ_i log p_{law(i)}(s_i)``, a sum of
per-coordinate :class:`~censusdp.mechanisms.laws.NoiseLaw` log-densities (conditioned
Laplace, Gaussian, discrete Laplace/Gaussian); coordinates with law index ``-1`` are
unconstrained book-keeping coordinates (flat density). Incremental.

Plugging in a move set
----------------------
Subclass :class:`MoveSet`: set ``integer`` (True when every Δ is integral) and implement

* ``propose(states, gen) -> Proposal`` — a sparse additive move per chain whose proposal
  kernel is symmetric (or report ``log_q_ratio = log q(s | s*) − log q(s* | s)``);
* ``propose_coupled(x, y, gen) -> (Proposal, Proposal)`` — the same move for two batches of
  chains, jointly drawn so that the marginal of each is ``propose`` and the two chains can
  meet (used by the L-lag coupling of :mod:`censusdp.estimation.conditioning.diagnostics`); use
  :func:`maximal_coupling` on the coefficient of one move direction.

Ready-made move sets: :class:`TreeMoves` (+δ on one leaf cell, −δ on another inside the same
invariant block: only the two paths up to their lowest common ancestor change) and
:class:`BasisMoves` (moves along the columns of a null-space or integer-lattice basis ``B``:
``s* = s + δ b_k`` or ``s* = s + B u``). The step laws (:class:`GaussianStep`,
:class:`DoubleGeometricStep`) give δ.

Inequality constraints (e.g. non-negativity of the released table) enter as ``lower`` bounds on
state coordinates: a proposal below a bound is rejected (an indicator in the acceptance ratio).
Such a constraint depends on the data, so a release that uses it is flagged data-dependent.

Examples
--------
>>> from censusdp.mechanisms.laws import Laplace
>>> B = scipy.linalg.null_space(np.ones((1, 3)))          # doctest: +SKIP
>>> target = ProductTarget([Laplace(1.0)], np.zeros(3, dtype=np.int64))
>>> eng = MetropolisHastings(target, BasisMoves(B, GaussianStep(1.0)))  # doctest: +SKIP
>>> chains = eng.init(np.zeros((64, 3)))                  # doctest: +SKIP
>>> draws = eng.run(chains, 5000, gen, thin=10)            # doctest: +SKIP

References
----------
Metropolis, Rosenbluth, Rosenbluth, Teller & Teller (1953); Hastings (1970).
Liu, Sun, Zhou & Feng, "Two Views of Constrained Differential Privacy: Belief Revision and Update",
Algorithm 1 (ℳ_MH: hierarchy-consistent proposals, inequality constraints as an indicator in
the acceptance ratio).
Biswas, Jacob & Vanetti (2019), "Estimating convergence of Markov chains with L-lag
couplings", NeurIPS: maximal coupling of proposals with a common acceptance uniform.
Dharangutte, Gao, Gong & Yu (2023), "Integer subspace differential privacy", AAAI: the lattice
proposal e* = e + V u with double-geometric u.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import NoiseLaw

__all__ = [
    "Proposal",
    "Target",
    "ProductTarget",
    "StepLaw",
    "GaussianStep",
    "DoubleGeometricStep",
    "maximal_coupling",
    "uniform_index",
    "MoveSet",
    "BasisMoves",
    "TreeLayout",
    "TreePairs",
    "TreeMoves",
    "ChainState",
    "MetropolisHastings",
]


# ---------------------------------------------------------------------------- proposals
@dataclass(frozen=True)
class Proposal:
    """A sparse additive move for every chain: ``s*[c, idx[c, k]] += delta[c, k]``.

    Attributes
    ----------
    idx : numpy.ndarray
        int64 (n_chains, K) state coordinates touched. Within a row, the indices with a
        non-zero ``delta`` must be distinct; padding entries have ``delta == 0`` (any index).
    delta : numpy.ndarray
        (n_chains, K) changes; int64 for integer move sets, float64 otherwise.
    log_q_ratio : numpy.ndarray or None
        ``log q(s | s*) − log q(s* | s)`` per chain; None for a symmetric proposal.
    always_accept : bool
        A Gibbs (heat-bath) move drawn from the target's exact conditional: its MH ratio is
        1, so the engine accepts it without evaluating the ratio (the log-density is still
        updated).
    """

    idx: np.ndarray
    delta: np.ndarray
    log_q_ratio: np.ndarray | None = None
    always_accept: bool = False

    def apply(self, states: np.ndarray) -> np.ndarray:
        """The proposed states (a new array)."""
        out = states.copy()
        rows = np.broadcast_to(np.arange(states.shape[0])[:, None], self.idx.shape)
        np.add.at(out, (rows, self.idx), self.delta.astype(out.dtype, copy=False))
        return out


# ---------------------------------------------------------------------------- targets
class Target(ABC):
    """An unnormalised log-density over state vectors (see the module docstring)."""

    @abstractmethod
    def log_density(self, states: np.ndarray) -> np.ndarray:
        """``log π(s)`` up to a constant for each row of ``states`` (n_chains, d)."""

    def l1_rates(self) -> np.ndarray | None:
        """Per coordinate β_i ≥ 0 when ``log π(s) = −Σ_i β_i |s_i| + const`` (an ℓ₁ product
        target, which Gibbs moves can sample exactly along lines), else None."""
        return None

    def l2_precisions(self) -> np.ndarray | None:
        """Per coordinate p_i ≥ 0 when ``log π(s) = −½ Σ_i p_i s_i² + const`` (an ℓ₂ product
        target: Gaussian or discrete Gaussian noise, which Gibbs moves can sample exactly
        along lines), else None. Flat coordinates have p_i = 0."""
        return None

    def log_density_change(
        self, states: np.ndarray, idx: np.ndarray, delta: np.ndarray
    ) -> np.ndarray:
        """``log π(s + Δ) − log π(s)`` per chain; override for an incremental formula."""
        new = Proposal(idx, delta).apply(states)
        return self.log_density(new) - self.log_density(states)


class ProductTarget(Target):
    """``log π(s) = Σ_i log p_{law_index[i]}(s_i)``: independent per-coordinate laws.

    Parameters
    ----------
    laws : sequence of NoiseLaw
        The distinct laws.
    law_index : numpy.ndarray
        (d,) int: the law of each coordinate, ``-1`` for a flat (book-keeping) coordinate.
    """

    def __init__(self, laws: Sequence[NoiseLaw], law_index: np.ndarray) -> None:
        self.laws = tuple(laws)
        self.law_index = np.asarray(law_index, dtype=np.int64).reshape(-1)
        if self.law_index.size and self.law_index.max() >= len(self.laws):
            raise ValueError("law_index refers to a law that was not given")

    @property
    def dim(self) -> int:
        return int(self.law_index.size)

    def l1_rates(self) -> np.ndarray | None:
        rates = [law.l1_rate for law in self.laws]
        if any(r is None for r in rates):
            return None
        return np.concatenate([np.asarray(rates, dtype=np.float64), [0.0]])[self.law_index]

    def l2_precisions(self) -> np.ndarray | None:
        precs = [law.l2_precision for law in self.laws]
        if any(p is None for p in precs):
            return None
        return np.concatenate([np.asarray(precs, dtype=np.float64), [0.0]])[self.law_index]

    def _pointwise(self, values: np.ndarray, which: np.ndarray) -> np.ndarray:
        out = np.zeros(values.shape, dtype=np.float64)
        for k, law in enumerate(self.laws):
            m = which == k
            if m.any():
                out[m] = law.log_density(values[m])
        return out

    def log_density(self, states: np.ndarray) -> np.ndarray:
        which = np.broadcast_to(self.law_index, states.shape)
        return self._pointwise(states, which).sum(axis=1)

    def log_density_change(
        self, states: np.ndarray, idx: np.ndarray, delta: np.ndarray
    ) -> np.ndarray:
        live = delta != 0
        rows = np.broadcast_to(np.arange(states.shape[0])[:, None], idx.shape)[live]
        cols = idx[live]
        old = states[rows, cols]
        which = self.law_index[cols]
        diff = self._pointwise(old + delta[live], which) - self._pointwise(old, which)
        return np.bincount(rows, weights=diff, minlength=states.shape[0])


# ---------------------------------------------------------------------------- step laws
class StepLaw(ABC):
    """A symmetric law of the step δ along one move direction."""

    integer: bool = False

    @abstractmethod
    def sample(self, gen: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Draws of δ."""

    @abstractmethod
    def log_pdf(self, x: np.ndarray) -> np.ndarray:
        """Log-density (or log-mass) of δ = x, up to a constant."""


class GaussianStep(StepLaw):
    """δ ~ N(0, scale²)."""

    def __init__(self, scale: float) -> None:
        self.scale = float(scale)

    def sample(self, gen, size):
        return gen.normal(0.0, self.scale, size=size)

    def log_pdf(self, x):
        return -0.5 * (np.asarray(x) / self.scale) ** 2


class DoubleGeometricStep(StepLaw):
    """δ ∈ ℤ with P(k) = ((1 − a)/(1 + a)) a^|k| (two-sided geometric), 0 < a < 1.

    ``DoubleGeometricStep.from_scale(s)`` picks a = exp(−1/s).
    """

    integer = True

    def __init__(self, a: float) -> None:
        if not 0.0 < a < 1.0:
            raise ValueError("the double-geometric parameter a must lie in (0, 1)")
        self.a = float(a)

    @classmethod
    def from_scale(cls, scale: float) -> DoubleGeometricStep:
        return cls(math.exp(-1.0 / max(float(scale), 1e-3)))

    def sample(self, gen, size):
        p = 1.0 - self.a
        g1 = gen.geometric(p, size=size) - 1
        g2 = gen.geometric(p, size=size) - 1
        return (g1 - g2).astype(np.int64)

    def log_pdf(self, x):
        return np.abs(x) * math.log(self.a)


def maximal_coupling(
    law: StepLaw, shift: np.ndarray, gen: np.random.Generator, *, max_rounds: int = 1000
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Maximally couple δx ~ law and δy ~ law so that ``δy = δx + shift`` when possible.

    With ``shift = x − y`` this couples the proposals ``x + δx`` and ``y + δy`` maximally:
    they coincide with probability ``1 − d_TV(law, law + shift)``.

    Returns
    -------
    dx, dy : numpy.ndarray
        The coupled steps, shape of ``shift``.
    coupled : numpy.ndarray
        bool, True where ``dy = dx + shift`` (the proposals coincide).

    References
    ----------
    Thorisson (2000), *Coupling, Stationarity, and Regeneration*, the maximal coupling
    algorithm; Jacob, O'Leary & Atchadé (2020), JRSS-B, Algorithm 2.
    """
    shift = np.asarray(shift)
    n = shift.shape
    dx = law.sample(gen, n)
    log_w = np.log(gen.random(n)) + law.log_pdf(dx)
    coupled = log_w <= law.log_pdf(dx + shift)
    dy = np.where(coupled, dx + shift, 0).astype(dx.dtype)
    todo = np.flatnonzero(~coupled.reshape(-1))
    flat_dy, flat_shift = dy.reshape(-1), shift.reshape(-1)
    for _ in range(max_rounds):
        if todo.size == 0:
            break
        cand = law.sample(gen, todo.size)
        ok = np.log(gen.random(todo.size)) + law.log_pdf(cand) > law.log_pdf(
            cand - flat_shift[todo]
        )
        flat_dy[todo[ok]] = cand[ok]
        todo = todo[~ok]
    if todo.size:  # vanishingly rare: fall back to an independent (valid marginal) draw
        flat_dy[todo] = law.sample(gen, todo.size)
    return dx, flat_dy.reshape(n), coupled


# ---------------------------------------------------------------------------- move sets
class MoveSet(ABC):
    """A family of constraint-preserving additive moves (see the module docstring)."""

    integer: bool = False

    @abstractmethod
    def propose(self, states: np.ndarray, gen: np.random.Generator) -> Proposal:
        """One move per chain."""

    @abstractmethod
    def propose_coupled(
        self, x: np.ndarray, y: np.ndarray, gen: np.random.Generator
    ) -> tuple[Proposal, Proposal]:
        """Jointly drawn moves for two batches of chains (each marginally ``propose``)."""


def uniform_index(u: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """``floor(u * n)`` clipped into ``[0, n)`` (n ≥ 1)."""
    n = np.asarray(n)
    return np.minimum((u * n).astype(np.int64), np.maximum(n - 1, 0))


class BasisMoves(MoveSet):
    """Moves along the columns of a basis ``B`` (d × m) of the allowed directions.

    ``mode="single"``: ``s* = s + δ b_k`` with k uniform and δ from ``step``;
    ``mode="all"``: ``s* = s + B u`` with ``u_k`` iid from ``step`` (the lattice proposal
    e* = e + V u of integer subspace DP). Every move keeps ``C s`` fixed when ``C B = 0``: use
    ``scipy.linalg.null_space(C)`` for real states or an integer lattice basis (Smith normal
    form) with an integer step for integer states.

    Coupling: the difference of two chains is ``x − y = B c``; a coupled move along ``b_k``
    draws δy = δx + c_k by :func:`maximal_coupling`, which zeroes that coefficient.

    Parameters
    ----------
    basis : numpy.ndarray
        (d, m) directions; integer dtype (with an integer ``step``) for lattice moves.
    step : StepLaw
    mode : {"single", "all"}
    """

    def __init__(self, basis: np.ndarray, step: StepLaw, *, mode: str = "single") -> None:
        B = np.asarray(basis)
        if B.ndim != 2 or B.shape[1] == 0:
            raise ValueError("the move basis must be a (d, m) matrix with m ≥ 1 columns")
        if mode not in ("single", "all"):
            raise ValueError("mode must be 'single' or 'all'")
        self.step, self.mode = step, mode
        self._set_basis(B, bool(step.integer))

    def _set_basis(self, B: np.ndarray, integer: bool) -> None:
        """Store ``B``, its pseudo-inverse and each column's non-zero entries."""
        self.integer = integer
        if self.integer and not np.issubdtype(B.dtype, np.integer):
            if not np.array_equal(B, np.round(B)):
                raise ValueError("an integer step needs an integer lattice basis")
            B = np.round(B).astype(np.int64)
        self.basis = B
        self._pinv = np.linalg.pinv(B.astype(np.float64))
        nnz = B != 0
        width = max(int(nnz.sum(axis=0).max()), 1)
        self._nz_idx = np.zeros((B.shape[1], width), dtype=np.int64)
        self._nz_val = np.zeros((B.shape[1], width), dtype=B.dtype)
        for k in range(B.shape[1]):  # once, at construction
            rows = np.flatnonzero(nnz[:, k])
            self._nz_idx[k, : rows.size] = rows
            self._nz_val[k, : rows.size] = B[rows, k]

    def _single(self, k: np.ndarray, step: np.ndarray) -> Proposal:
        return Proposal(self._nz_idx[k], self._nz_val[k] * step[:, None])

    def _all(self, u: np.ndarray) -> Proposal:
        delta = u @ self.basis.T
        idx = np.broadcast_to(np.arange(self.basis.shape[0]), delta.shape)
        return Proposal(idx, delta)

    def _coeffs(self, diff: np.ndarray) -> np.ndarray:
        c = diff.astype(np.float64) @ self._pinv.T
        return np.round(c).astype(np.int64) if self.integer else c

    def propose(self, states, gen):
        n, m = states.shape[0], self.basis.shape[1]
        if self.mode == "single":
            k = uniform_index(gen.random(n), m)
            return self._single(k, self.step.sample(gen, n))
        return self._all(self.step.sample(gen, (n, m)))

    def propose_coupled(self, x, y, gen):
        n, m = x.shape[0], self.basis.shape[1]
        c = self._coeffs(x - y)
        if self.mode == "single":
            k = uniform_index(gen.random(n), m)
            dx, dy, _ = maximal_coupling(self.step, c[np.arange(n), k], gen)
            return self._single(k, dx), self._single(k, dy)
        dx, dy, _ = maximal_coupling(self.step, c, gen)
        return self._all(dx), self._all(dy)


@dataclass(frozen=True, eq=False)
class TreeLayout:
    """The state layout of a hierarchical conditioning problem.

    The state is ``[e_0 | e_1 | … | w]``: the noise ``e_m = y_m − Q_m z`` of each measurement
    (nodes × query rows, row-major), then the leaf offsets ``w`` (leaves × cells) of the
    consistent table ``z = z₀ + aggregate(w)`` from a fixed consistent, invariant-respecting
    start ``z₀``. The noise coordinates carry the measurement laws; ``w`` is book-keeping
    (law index −1) from which the released table is read.

    Attributes
    ----------
    hierarchy : Hierarchy
    n_cells : int
    levels, queries : tuple
        Level index and query matrix (k_m × n_cells) of each measurement.
    offsets : numpy.ndarray
        Start of each measurement block, then of ``w``; ``offsets[-1]`` is the dimension.
    ancestors : numpy.ndarray
        (depth, n_leaves) ancestor of every leaf at every level.
    """

    hierarchy: Hierarchy
    n_cells: int
    levels: tuple[int, ...]
    queries: tuple[np.ndarray, ...]
    offsets: np.ndarray
    ancestors: np.ndarray

    @classmethod
    def build(
        cls, hierarchy: Hierarchy, n_cells: int, measured: Sequence[tuple[int, np.ndarray]]
    ) -> TreeLayout:
        """From ``(level, query matrix)`` of each measurement."""
        sizes = [hierarchy.levels[k].size * np.asarray(q).shape[0] for k, q in measured]
        n_leaves = hierarchy.leaves.size
        offsets = np.cumsum([0, *sizes, n_leaves * n_cells]).astype(np.int64)
        last = hierarchy.depth - 1
        anc = np.stack([hierarchy.ancestor_index(last, k) for k in range(hierarchy.depth)])
        return cls(
            hierarchy,
            int(n_cells),
            tuple(int(k) for k, _ in measured),
            tuple(np.asarray(q, dtype=np.int64) for _, q in measured),
            offsets,
            anc,
        )

    @property
    def dim(self) -> int:
        return int(self.offsets[-1])

    @property
    def w_offset(self) -> int:
        return int(self.offsets[-2])

    def noise_blocks(self, states: np.ndarray) -> list[np.ndarray]:
        """Per measurement, the noise (n_chains, n_nodes, k_m)."""
        out = []
        for m, q in enumerate(self.queries):
            a, b = self.offsets[m], self.offsets[m + 1]
            out.append(states[:, a:b].reshape(states.shape[0], -1, q.shape[0]))
        return out

    def leaf_offsets(self, states: np.ndarray) -> np.ndarray:
        """The leaf offsets ``w`` (n_chains, n_leaves, n_cells)."""
        return states[:, self.w_offset :].reshape(states.shape[0], -1, self.n_cells)

    def pack(self, noise: Sequence[np.ndarray], w: np.ndarray) -> np.ndarray:
        """One state vector from per-measurement noise (n_nodes, k_m) and offsets w."""
        return np.concatenate([np.asarray(e).reshape(-1) for e in noise] + [w.reshape(-1)])

    def footprint(
        self,
        i: np.ndarray,
        c: np.ndarray,
        j: np.ndarray,
        c2: np.ndarray,
        single: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Indices and unit coefficients of the move ``w[i, c] += 1, w[j, c2] −= 1``
        (only ``w[i, c] += 1`` where ``single``: a cell no invariant involves).

        At level k the node ``anc_k(i)`` gains ``Q[:, c]`` and ``anc_k(j)`` loses ``Q[:, c2]``,
        so its noise changes by the opposite; where the two ancestors coincide (at and above
        the lowest common ancestor) the two changes are merged into one entry. Cost
        O(depth · query rows) per chain.
        """
        keep = 1 if single is None else (~single).astype(np.int64)[:, None]
        idx, coef = [], []
        for m, (k, q) in enumerate(zip(self.levels, self.queries, strict=True)):
            rows = np.arange(q.shape[0])
            ai, aj = self.ancestors[k][i], self.ancestors[k][j]
            same = (ai == aj)[:, None]
            qa, qb = q[:, c].T, q[:, c2].T * keep
            base = self.offsets[m]
            idx.append(base + ai[:, None] * q.shape[0] + rows)
            coef.append(np.where(same, qb - qa, -qa))
            idx.append(base + aj[:, None] * q.shape[0] + rows)
            coef.append(np.where(same, 0, qb))
        w0 = self.w_offset
        idx += [(w0 + i * self.n_cells + c)[:, None], (w0 + j * self.n_cells + c2)[:, None]]
        ones = np.ones((i.size, 1), dtype=np.int64)
        coef += [ones, -ones * keep]
        return np.concatenate(idx, axis=1), np.concatenate(coef, axis=1)


class TreePairs(MoveSet):
    """The state-independent choice of a pair of leaf cells on a hierarchy (seed 003, Alg. 1).

    A move picks a leaf cell (i, c) uniformly. With probability ``p_cell`` (when c has an
    exchangeable cell) the partner is (i, c′) with c′ uniform among the cells whose column
    equals c's in every invariant query; otherwise the partner is (j, c) with j uniform among
    i's siblings (probability ``p_sibling``) or among the leaves under i's *block*: its
    ancestor at the deepest invariant level whose query involves c. So no invariant total ever
    changes, and only the paths from i and j up to their lowest common ancestor change. A
    cell that no invariant involves also gets single moves (+δ on one leaf cell alone, with
    probability ``p_sibling / 2``), which change its totals up to the root. The choice of
    pair does not depend on the state. A leaf cell without a valid partner gives a null move.
    Subclasses choose the step along the pair direction: :class:`TreeMoves` (a symmetric
    random-walk step) and :class:`~censusdp.estimation.conditioning.gibbs_moves.GibbsTreeMoves` (an exact
    draw from the target's conditional).

    Parameters
    ----------
    layout : TreeLayout
    invariants : sequence of (level, query matrix)
    p_sibling, p_cell : float
    """

    def __init__(
        self,
        layout: TreeLayout,
        invariants: Sequence[tuple[int, np.ndarray]],
        *,
        p_sibling: float = 0.5,
        p_cell: float = 0.5,
    ) -> None:
        self.layout = layout
        self.p_sibling, self.p_cell = float(p_sibling), float(p_cell)
        h, C = layout.hierarchy, layout.n_cells
        depth, n_leaves = h.depth, h.leaves.size
        # block level of each cell: the deepest invariant level whose query involves it
        block = np.zeros(C, dtype=np.int64)
        involved = np.zeros(C, dtype=bool)
        signature = np.zeros((0, C), dtype=np.int64)
        for k, q in sorted(invariants, key=lambda kq: kq[0]):
            q = np.asarray(q, dtype=np.int64)
            block[(q != 0).any(axis=0)] = k
            involved |= (q != 0).any(axis=0)
            signature = np.vstack([signature, q])
        self.block_level = block
        self.unconstrained = ~involved
        self.frozen = block == depth - 1
        # exchangeable cells: identical columns in every invariant query
        _, cls_id = np.unique(signature.T, axis=0, return_inverse=True)
        cls_id = cls_id.reshape(-1)
        width = int(np.bincount(cls_id).max())
        self._members = np.zeros((C, width), dtype=np.int64)
        self._n_members = np.zeros(C, dtype=np.int64)
        self._pos = np.zeros(C, dtype=np.int64)
        for c in range(C):  # once, over cells
            mem = np.flatnonzero(cls_id == cls_id[c])
            self._members[c, : mem.size] = mem
            self._n_members[c] = mem.size
            self._pos[c] = int(np.searchsorted(mem, c))
        # leaf ranges under every ancestor, per level
        lo = np.zeros((depth, n_leaves), dtype=np.int64)
        hi = np.zeros((depth, n_leaves), dtype=np.int64)
        leaf = np.arange(n_leaves)
        for k in range(depth):
            anc = layout.ancestors[k]
            first = np.full(h.levels[k].size, n_leaves, dtype=np.int64)
            np.minimum.at(first, anc, leaf)
            count = np.bincount(anc, minlength=h.levels[k].size)
            lo[k], hi[k] = first[anc], first[anc] + count[anc]
        self._lo, self._hi = lo, hi

    def _pairs(self, u: np.ndarray) -> tuple[np.ndarray, ...]:
        """Pair choice from uniforms u (n, 5): (i, c, j, c2, null)."""
        lay = self.layout
        n_leaves, C, depth = lay.hierarchy.leaves.size, lay.n_cells, lay.hierarchy.depth
        i = uniform_index(u[:, 0], n_leaves)
        c = uniform_index(u[:, 1], C)
        nm = self._n_members[c]
        swap = (u[:, 2] < self.p_cell) & (nm > 1)
        c2 = self._members[
            c, (self._pos[c] + 1 + uniform_index(u[:, 4], np.maximum(nm - 1, 1))) % nm
        ]
        parent_level = max(depth - 2, 0)
        level = np.where(u[:, 3] < self.p_sibling, parent_level, self.block_level[c])
        level = np.maximum(level, self.block_level[c])
        lo, hi = self._lo[level, i], self._hi[level, i]
        size = hi - lo
        j = lo + (i - lo + 1 + uniform_index(u[:, 4], np.maximum(size - 1, 1))) % size
        null_pair = ~swap & ((size <= 1) | self.frozen[c])
        j = np.where(swap, i, np.where(null_pair, i, j))
        c2 = np.where(swap, c2, c)
        null = null_pair & ~swap
        single = self.unconstrained[c] & ~swap & (u[:, 3] < 0.5 * self.p_sibling)
        null &= ~single
        return i, c, j, c2, null, single


class TreeMoves(TreePairs):
    """Pair moves on a hierarchy: +δ on one leaf cell, −δ on another (seed 003, Alg. 1).

    The pair is chosen as in :class:`TreePairs`; δ is drawn from the symmetric ``step`` law,
    so the proposal is symmetric. Coupling: the same pair for both chains, δ maximally
    coupled on the anchor coordinate ``w[i, c]`` (:func:`maximal_coupling`), so a coupled
    accepted move equalises it.

    Parameters
    ----------
    layout : TreeLayout
    invariants : sequence of (level, query matrix)
    step : StepLaw
    p_sibling, p_cell : float
    """

    def __init__(
        self,
        layout: TreeLayout,
        invariants: Sequence[tuple[int, np.ndarray]],
        step: StepLaw,
        *,
        p_sibling: float = 0.5,
        p_cell: float = 0.5,
    ) -> None:
        super().__init__(layout, invariants, p_sibling=p_sibling, p_cell=p_cell)
        self.step = step
        self.integer = bool(step.integer)

    def _proposal(self, pair: tuple[np.ndarray, ...], step: np.ndarray) -> Proposal:
        i, c, j, c2, null, single = pair
        idx, coef = self.layout.footprint(i, c, j, c2, single)
        step = np.where(null, 0, step)
        return Proposal(idx, coef * step[:, None])

    def propose(self, states, gen):
        n = states.shape[0]
        pair = self._pairs(gen.random((n, 5)))
        return self._proposal(pair, self.step.sample(gen, n))

    def propose_coupled(self, x, y, gen):
        n = x.shape[0]
        pair = self._pairs(gen.random((n, 5)))
        i, c = pair[0], pair[1]
        anchor = self.layout.w_offset + i * self.layout.n_cells + c
        rows = np.arange(n)
        diff = x[rows, anchor] - y[rows, anchor]
        dx, dy, _ = maximal_coupling(self.step, diff, gen)
        return self._proposal(pair, dx), self._proposal(pair, dy)


# ---------------------------------------------------------------------------- the engine
@dataclass
class ChainState:
    """A batch of chains: states (n_chains, d), their log-densities and acceptance counts."""

    states: np.ndarray
    log_density: np.ndarray
    accepted: np.ndarray
    iterations: int = 0

    @property
    def acceptance_rate(self) -> np.ndarray:
        return self.accepted / max(self.iterations, 1)


class MetropolisHastings:
    """Metropolis–Hastings with a pluggable :class:`Target` and :class:`MoveSet`.

    Parameters
    ----------
    target : Target
    moves : MoveSet
    lower : numpy.ndarray, optional
        (d,) lower bounds on state coordinates (−inf where none): proposals below a bound
        are rejected (the indicator 𝕀(A x̃ ≥ a) of seed 003, Alg. 1 step (e)).

    References
    ----------
    Liu, Sun, Zhou & Feng, Algorithm 1 ℳ_MH; Biswas, Jacob & Vanetti (2019) for
    :meth:`coupled_step` (common uniform for acceptance).
    """

    def __init__(self, target: Target, moves: MoveSet, *, lower: np.ndarray | None = None):
        self.target, self.moves = target, moves
        self.lower = None if lower is None else np.asarray(lower, dtype=np.float64)

    def init(self, states: np.ndarray) -> ChainState:
        """Chains started at ``states`` (n_chains, d); they must satisfy the constraints."""
        s = np.array(states, dtype=np.int64 if self.moves.integer else np.float64, copy=True)
        if s.ndim != 2:
            raise ValueError("states must be a (n_chains, d) array")
        if self.lower is not None and np.any(s < self.lower):
            raise ValueError("a starting state violates the lower bounds")
        lp = self.target.log_density(s)
        if not np.all(np.isfinite(lp)):
            raise ValueError("a starting state has zero target density")
        return ChainState(s, lp, np.zeros(s.shape[0], dtype=np.int64))

    def _log_alpha(self, cs: ChainState, prop: Proposal) -> tuple[np.ndarray, np.ndarray]:
        """``(log α, log π(s*) − log π(s))`` per chain."""
        change = self.target.log_density_change(cs.states, prop.idx, prop.delta)
        if prop.always_accept:
            return np.zeros_like(change), change
        d = change if prop.log_q_ratio is None else change + prop.log_q_ratio
        if self.lower is not None:
            rows = np.arange(cs.states.shape[0])[:, None]
            new = cs.states[rows, prop.idx] + prop.delta
            bad = ((new < self.lower[prop.idx]) & (prop.delta != 0)).any(axis=1)
            d = np.where(bad, -np.inf, d)
        return d, change

    def _accept(
        self,
        cs: ChainState,
        prop: Proposal,
        log_alpha: tuple[np.ndarray, np.ndarray],
        log_u: np.ndarray,
    ) -> np.ndarray:
        alpha, change = log_alpha
        ok = log_u < alpha
        if ok.any():
            moved = Proposal(prop.idx[ok], prop.delta[ok])
            cs.states[ok] = moved.apply(cs.states[ok])
            cs.log_density[ok] += change[ok]
        cs.accepted += ok
        cs.iterations += 1
        return ok

    def step(self, cs: ChainState, gen: np.random.Generator) -> np.ndarray:
        """One MH iteration of every chain, in place; returns the accepted mask."""
        prop = self.moves.propose(cs.states, gen)
        log_alpha = self._log_alpha(cs, prop)
        return self._accept(cs, prop, log_alpha, np.log(gen.random(cs.states.shape[0])))

    def coupled_step(self, cx: ChainState, cy: ChainState, gen: np.random.Generator) -> None:
        """One coupled iteration of two chain batches (maximally coupled proposals, one
        common acceptance uniform), in place."""
        px, py = self.moves.propose_coupled(cx.states, cy.states, gen)
        log_u = np.log(gen.random(cx.states.shape[0]))
        ax, ay = self._log_alpha(cx, px), self._log_alpha(cy, py)
        self._accept(cx, px, ax, log_u)
        self._accept(cy, py, ay, log_u)

    def run(
        self,
        cs: ChainState,
        n_iterations: int,
        gen: np.random.Generator,
        *,
        thin: int = 1,
        keep: np.ndarray | slice | None = None,
    ) -> np.ndarray:
        """Advance ``n_iterations``; return every ``thin``-th state.

        Parameters
        ----------
        keep : index, optional
            Which state coordinates to record (all by default).

        Returns
        -------
        numpy.ndarray
            (n_kept, n_chains, d_kept) draws.
        """
        sel = slice(None) if keep is None else keep
        out = []
        for t in range(1, n_iterations + 1):
            self.step(cs, gen)
            if t % thin == 0:
                out.append(cs.states[:, sel].copy())
        if not out:
            return np.empty((0,) + cs.states[:, sel].shape, dtype=cs.states.dtype)
        return np.stack(out)
