"""The per-axis basis in which every marginal workload's Gram matrix is block-diagonal.

For attribute ``a`` let ``R_a`` (``r_a × d_a``, 0/1) be the common refinement of the recodes
and slices a workload uses on that axis (detailed and "all" add nothing: "all" coarsens
every partition). Every per-axis factor a product query contributes to a Gram matrix —
``I`` (detailed), ``R_eᵀR_e`` (a recode or slice ``e``, a union of refinement groups),
``J = 11ᵀ`` (all) — has the form ``α I + R_aᵀ C R_a`` with a scalar ``α`` and an
``r_a × r_a`` matrix ``C``. In the orthonormal basis ``B_a`` made of the ``r_a`` normalised
group indicators ``1_g/√n_g`` followed by within-group contrasts, such a matrix is
``K = αI + N^{1/2} C N^{1/2}`` on the group coordinates and ``α`` on every contrast
(``R_a`` annihilates within-group contrasts; ``N = diag(n_g)``), exactly, whatever the group
sizes. Across axes the Gram of ``⊗_a R_{q,a}`` is ``⊗_a (K_{q,a} ⊕ α_{q,a} I)``: in the tensor
basis ``⊗_a B_a`` the coordinates split by the set ``S`` of axes whose group part they take,
and on each such set the matrix is one block ``∏_{a∉S} α_a · ⊗_{a∈S} K_a`` of size
``∏_{a∈S} r_a``, repeated ``∏_{a∉S} (d_a − r_a)`` times over the contrast coordinates.
Sums, products and inverses of such matrices act block by block, so a node's information and
covariance matrices are ``2^k`` small blocks (for ``pl94``: sizes 1 and 3), and moving a
node tensor in or out of the basis is one ``d_a × d_a`` product per axis —
``O(cells · Σ_a d_a)``; no cells × cells matrix appears (docs/design.md § The structured algebra).

This module is the algebra the structured GLS stands on; it has no notion of a tree.

References
----------
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (the marginal workload).
McKenna, R. et al. (2018). Optimizing error of high-dimensional statistical queries under
    differential privacy (HDMM) — Kronecker-structured Grams and their per-axis inverses.
Van Loan, C. F. (2000). The ubiquitous Kronecker product. J. Comput. Appl. Math. 123, 85–100.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np
from numba import njit

from censusdp.errors import SpecError
from censusdp.estimation.gls.block_kernels import eigh, matmul, solve
from censusdp.mechanisms.product_query import ProductQuery, QueryRows
from censusdp.schema import Recode, Schema

__all__ = ["AxisBasis", "MarginalBasis", "BlockDiagonal", "node_axis_product", "workload_basis"]


@dataclass(frozen=True, eq=False)
class AxisBasis:
    """One attribute's common refinement and orthonormal basis.

    Attributes
    ----------
    attribute : str
    group_of : numpy.ndarray
        int64 (d,): the refinement group of each detailed value (groups numbered in order of
        their first value).
    sizes : numpy.ndarray
        int64 (r,): group sizes ``n_g``.
    basis : numpy.ndarray
        float64 (d, d), orthonormal columns: ``r`` normalised group indicators, then the
        ``d − r`` within-group contrasts, group by group: columns 2.. of the Householder
        reflection ``H_g = I − 2wwᵀ/wᵀw`` (``w = e_0 − 1/√n_g``) that maps a group's first
        member to its normalised indicator (column 1 of ``H_g``).
    """

    attribute: str
    group_of: np.ndarray
    sizes: np.ndarray
    basis: np.ndarray

    @property
    def d(self) -> int:
        return int(self.group_of.size)

    @property
    def r(self) -> int:
        return int(self.sizes.size)

    @property
    def refinement(self) -> np.ndarray:
        """``R_a`` (r × d, int64): the group indicators."""
        return (np.arange(self.r)[:, None] == self.group_of[None, :]).astype(np.int64)

    @classmethod
    def from_elements(
        cls, attribute: str, d: int, elements: Iterable[Recode], *, split: bool = False
    ) -> AxisBasis:
        """The common refinement of ``elements`` (recodes, slices; detailed/all ignored).

        Two values share a group when every row of every element treats them alike. With
        ``split`` every value is its own group (``r = d``, the basis is the identity): the
        axis has no within-group contrasts, so a per-node mask diagonal in its values (a
        structural zero, docs/design.md § The Noisy Measurement File) is diagonal in the basis too.
        """
        mats = [e.matrix for e in elements if not (e.is_detailed or e.is_all)]
        if split:
            mats = [np.eye(d, dtype=np.int64)]
        sig = np.vstack(mats).T if mats else np.zeros((d, 0), dtype=np.int64)
        _, first, inv = np.unique(sig, axis=0, return_index=True, return_inverse=True)
        rank = np.empty(first.size, dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(first.size)
        group_of = rank[inv.reshape(-1)]
        sizes = np.bincount(group_of)
        eye = np.eye(group_of.size)[None]
        basis = _householder(eye, 1, group_of, sizes, inverse=False)[0].T  # (Bᵀ I)ᵀ
        return cls(attribute, group_of, sizes, basis)

    def coefficients(self, x: np.ndarray, axis: int) -> np.ndarray:
        """``B_aᵀ`` along ``axis`` of a batch ``x`` (nodes first): basis coefficients.

        A long axis of one group (cenrace in ``pl94``) is one Householder reflection:
        ``O(d)`` per fibre (a dot product and an update) instead of a ``d × d`` product;
        other axes are small products. Either way node by node
        (:func:`node_axis_product`): a node's bits do not depend on its batch.
        """
        if self.r == 1 and self.d >= _REFLECT_MIN:
            return _householder(x, axis, self.group_of, self.sizes, inverse=False)
        return node_axis_product(x, axis, np.ascontiguousarray(self.basis.T))

    def values(self, y: np.ndarray, axis: int) -> np.ndarray:
        """``B_a`` along ``axis`` of a batch ``y``: the inverse of :meth:`coefficients`."""
        if self.r == 1 and self.d >= _REFLECT_MIN:
            return _householder(y, axis, self.group_of, self.sizes, inverse=True)
        return node_axis_product(y, axis, self.basis)

    def element(self, e: Recode) -> tuple[float, np.ndarray]:
        """``(α, C)`` with ``R_eᵀ R_e = α I + R_aᵀ C R_a`` (``I`` for detailed: ``α = 1``).

        Raises
        ------
        SpecError
            When a row of ``e`` splits a refinement group (the basis was built without ``e``).
        """
        if e.is_detailed:
            return 1.0, np.zeros((self.r, self.r))
        first = np.argmax(self.refinement, axis=1)  # one value of each group
        p = e.matrix[:, first]
        if not np.array_equal(p[:, self.group_of], e.matrix):
            raise SpecError(
                f"attribute {self.attribute!r}: element {e.name!r} splits a group of the "
                "common refinement; build the basis from every query of the workload"
            )
        return 0.0, (p.T @ p).astype(np.float64)

    def block(self, e: Recode) -> tuple[float, np.ndarray]:
        """``(α, K)``: ``B_aᵀ (R_eᵀR_e) B_a = K ⊕ α I_{d−r}`` with ``K = αI + N^½ C N^½``."""
        alpha, c = self.element(e)
        s = np.sqrt(self.sizes.astype(np.float64))
        return alpha, alpha * np.eye(self.r) + c * np.outer(s, s)


def node_axis_product(x: np.ndarray, axis: int, m: np.ndarray) -> np.ndarray:
    """``x`` (``(n, …)``, nodes first) with axis ``axis`` replaced by ``m @`` it, node by node.

    The mode product of :func:`~censusdp.mechanisms.product_query.axis_product` as a stack of
    products of one fixed shape per node (per leading index on inner axes, per node on the
    last axis), never one 2-D product over the whole batch: BLAS rounds a row of a 2-D
    product differently depending on where it falls in the blocking of the whole matrix,
    while a stack of equal products gives every node the bits it gets alone. That is what
    lets a partition of the nodes reproduce the single-process result exactly. The products
    are :func:`~censusdp.estimation.gls.block_kernels.matmul` (fixed summation order, no BLAS),
    so the bits do not depend on the BLAS build or machine either.
    """
    sh = x.shape
    pre = int(np.prod(sh[:axis], dtype=np.int64))
    post = int(np.prod(sh[axis + 1 :], dtype=np.int64))
    if post == 1:
        y = matmul(x.reshape(sh[0], pre // max(sh[0], 1), sh[axis]), m.T)
    else:
        y = matmul(m, x.reshape(pre, sh[axis], post))
    return y.reshape((*sh[:axis], m.shape[0], *sh[axis + 1 :]))


#: Axes of one group at least this long are moved by their reflection, not a dense product
#: (measured on pl94: 3.0× faster for cenrace's 63 values, 2–4× slower for 2–8 values).
_REFLECT_MIN = 16

#: Adjacent small axes are moved together by one Kronecker product of up to this many values
#: (pl94: hhgq × votingage × hispanic = 32, one 32 × 32 product instead of three).
_FUSE_MAX = 64


@njit(cache=True, nogil=True)
def _reflect_kernel(y, w, c, out):  # pragma: no cover - compiled
    """``out[i] = y[i] − w (cᵀ y[i])`` per leading index, the dot in ascending order from
    0.0, each product and sum rounded (no fused multiply–add): one pass, no temporaries."""
    pre, n, post = y.shape
    if post == 1:  # a fibre along the last axis: the dot in a register
        for i in range(pre):
            acc = 0.0
            for k in range(n):
                acc += y[i, k, 0] * c[k]
            for k in range(n):
                out[i, k, 0] = y[i, k, 0] - w[k] * acc
        return
    dot = np.empty(post)
    for i in range(pre):
        for p in range(post):
            dot[p] = 0.0
        for k in range(n):
            ck = c[k]
            for p in range(post):
                dot[p] += ck * y[i, k, p]
        for k in range(n):
            wk = w[k]
            for p in range(post):
                out[i, k, p] = y[i, k, p] - wk * dot[p]


def _reflect(y: np.ndarray) -> np.ndarray:
    """``H y`` along axis 1 of ``y`` (``(pre, n, post)``) for the reflection ``H = I −
    2wwᵀ/wᵀw``, ``w = e_0 − 1/√n``: ``H e_0 = 1/√n``, ``H = Hᵀ = H⁻¹``.

    One fused compiled pass per fibre (Golub & Van Loan 2013, §5.1.4: ``Hy = y − w (cᵀy)``,
    ``c = 2w/wᵀw``): the dot product summed in ascending order, then the update — the
    operations, and so the bits, of a :func:`~censusdp.estimation.gls.block_kernels.matmul`
    dot followed by the elementwise update, without their two temporaries (issue 36). Each
    fibre alone: a node's bits do not depend on its batch."""
    n = y.shape[1]
    w = -np.full(n, 1.0 / np.sqrt(n))
    w[0] += 1.0
    c = w * (2.0 / float(np.sum(w * w)))
    out = np.empty(y.shape)
    if out.size:
        _reflect_kernel(y, w, c, out)
    return out


def _householder(
    x: np.ndarray, axis: int, group_of: np.ndarray, sizes: np.ndarray, inverse: bool
) -> np.ndarray:
    """``Bᵀ x`` (or ``B x`` with ``inverse``) along ``axis`` of a batch, nodes first.

    Members are taken group by group (``order``), each group reflected, and the group
    coordinates (each group's first reflected entry) put first (``layout``); the inverse runs
    the same steps backwards (every ``H_g`` is its own inverse).
    """
    x = np.asarray(x, dtype=np.float64)
    sh = x.shape
    d = sh[axis]
    pre = int(np.prod(sh[:axis], dtype=np.int64))
    post = int(np.prod(sh[axis + 1 :], dtype=np.int64))
    y = x.reshape(pre, d, post)
    if pre == 0 or d == 0:
        return x.copy()
    order = np.argsort(group_of, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    layout = np.concatenate(
        [starts, *[np.arange(s + 1, s + n) for s, n in zip(starts, sizes, strict=True)]]
    ).astype(np.int64)
    if sizes.size == 1:  # one group: no reordering
        out = _reflect(y) if d > 1 else y.copy()
        return out.reshape(sh)
    z = y[:, np.argsort(layout)] if inverse else y[:, order]
    for s, n in zip(starts, sizes, strict=True):
        if n > 1:
            z[:, s : s + n] = _reflect(z[:, s : s + n])
    out = z[:, np.argsort(order)] if inverse else z[:, layout]
    return out.reshape(sh)


@dataclass(frozen=True, eq=False)
class MarginalBasis:
    """The tensor basis ``⊗_a B_a`` of a schema for one workload.

    Attributes
    ----------
    schema : Schema
    axes : tuple of AxisBasis
        One per attribute.
    """

    schema: Schema
    axes: tuple[AxisBasis, ...]

    @classmethod
    def for_queries(
        cls,
        schema: Schema,
        queries: Iterable[ProductQuery | QueryRows],
        split: Iterable[int] = (),
    ) -> MarginalBasis:
        """The basis of the common refinements of every element ``queries`` use.

        Include every measured query and every invariant of the workload: any of their
        Grams is then block-diagonal in this basis. Axes in ``split`` take every value as
        its own group (:meth:`AxisBasis.from_elements`): every block then contains all of
        them (blocks of ``∏ d_a`` over the split axes), and a mask over their values is
        diagonal inside each block (structural zeros, docs/design.md § The Noisy Measurement File).
        """
        split = set(int(a) for a in split)
        if not split <= set(range(len(schema.attributes))):
            raise SpecError(f"split axes {sorted(split)} are not axes of schema {schema.name!r}")
        per_axis: list[list[Recode]] = [[] for _ in schema.attributes]
        for q in queries:
            for pq in q.queries if isinstance(q, QueryRows) else (q,):
                if pq.schema is not schema:
                    raise SpecError(
                        f"query {pq.name!r} is over another schema than {schema.name!r}"
                    )
                for ax, f in enumerate(pq.factors):
                    per_axis[ax].append(f)
        axes = tuple(
            AxisBasis.from_elements(a.name, a.size, per_axis[i], split=i in split)
            for i, a in enumerate(schema.attributes)
        )
        return cls(schema, axes)

    # -- structure ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.schema.shape

    @property
    def ranks(self) -> tuple[int, ...]:
        """``r_a`` per axis."""
        return tuple(a.r for a in self.axes)

    @property
    def subsets(self) -> list[int]:
        """Bit masks ``S`` (bit ``a`` set: axis ``a`` takes its group part) with coordinates."""
        k = len(self.axes)
        return [s for s in range(1 << k) if self.multiplicity(s) > 0]

    def block_size(self, mask: int) -> int:
        """``∏_{a∈S} r_a``."""
        return int(np.prod([a.r for i, a in enumerate(self.axes) if mask >> i & 1], dtype=np.int64))

    def multiplicity(self, mask: int) -> int:
        """How often block ``S`` repeats: ``∏_{a∉S} (d_a − r_a)``."""
        return int(
            np.prod(
                [a.d - a.r for i, a in enumerate(self.axes) if not mask >> i & 1], dtype=np.int64
            )
        )

    def _index(self, mask: int) -> tuple[slice, ...]:
        return tuple(
            slice(0, a.r) if mask >> i & 1 else slice(a.r, a.d) for i, a in enumerate(self.axes)
        )

    def _perm(self, mask: int) -> list[int]:
        k = len(self.axes)
        inside = [i + 1 for i in range(k) if mask >> i & 1]
        outside = [i + 1 for i in range(k) if not mask >> i & 1]
        return [0, *inside, *outside]

    # -- moving tensors in and out --------------------------------------------------------
    def to_basis(self, x: np.ndarray) -> np.ndarray:
        """Coefficients ``(⊗_a B_a)ᵀ vec(x)`` of a batch ``(n, *shape)``, per axis
        (:meth:`AxisBasis.coefficients`)."""
        return self._move(x, inverse=False)

    def _runs(self) -> list[tuple[int, int]]:
        """Axes grouped for the moves: a reflected axis alone, else maximal runs of adjacent
        axes with at most :data:`_FUSE_MAX` values together (one product per run)."""
        runs: list[tuple[int, int]] = []
        for ax, a in enumerate(self.axes):
            alone = a.r == 1 and a.d >= _REFLECT_MIN
            if runs and not alone and runs[-1][2] and runs[-1][3] * a.d <= _FUSE_MAX:
                lo, _, _, size = runs[-1]
                runs[-1] = (lo, ax + 1, True, size * a.d)
            else:
                runs.append((ax, ax + 1, not alone, a.d))
        return [(lo, hi) for lo, hi, _, _ in runs]

    def _move(self, x: np.ndarray, inverse: bool) -> np.ndarray:
        """``(⊗B_a)ᵀ`` (or ``⊗B_a``) per run of :meth:`_runs`, node by node."""
        y = np.asarray(x, dtype=np.float64)
        n = y.shape[0]
        for lo, hi in self._runs():
            if hi == lo + 1:
                a = self.axes[lo]
                y = a.values(y, lo + 1) if inverse else a.coefficients(y, lo + 1)
                continue
            mats = [a.basis if inverse else a.basis.T for a in self.axes[lo:hi]]
            sh = y.shape
            merged = y.reshape(n, *sh[1 : lo + 1], -1, *sh[hi + 1 :])
            m = np.ascontiguousarray(reduce(np.kron, mats))
            y = node_axis_product(merged, lo + 1, m).reshape(sh)
        return y

    def from_basis(self, y: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`to_basis` (the basis is orthonormal)."""
        return self._move(y, inverse=True)

    def dense_basis(self) -> np.ndarray:
        """``⊗_a B_a`` (cells × cells) — for tests only."""
        return reduce(np.kron, [a.basis for a in self.axes], np.ones((1, 1)))

    # -- Grams ----------------------------------------------------------------------------
    def gram(self, query: ProductQuery, weight: float = 1.0) -> BlockDiagonal:
        """The blocks of ``weight · QᵀQ`` for ``Q = ⊗_a R_{q,a}``."""
        if query.schema is not self.schema:
            raise SpecError(
                f"query {query.name!r} is over another schema than {self.schema.name!r}"
            )
        per_axis = [a.block(f) for a, f in zip(self.axes, query.factors, strict=True)]
        blocks = {}
        for mask in self.subsets:
            scale = float(weight)
            mats = []
            for i, (alpha, k) in enumerate(per_axis):
                if mask >> i & 1:
                    mats.append(k)
                else:
                    scale *= alpha
            blocks[mask] = scale * reduce(np.kron, mats, np.ones((1, 1)))
        return BlockDiagonal(self, blocks)

    def identity(self) -> BlockDiagonal:
        return BlockDiagonal(self, {m: np.eye(self.block_size(m)) for m in self.subsets})


def _inv(b: np.ndarray) -> np.ndarray:
    """``b⁻¹`` of a stack ``(..., k, k)`` by :func:`~censusdp.estimation.gls.block_kernels.solve`
    (fixed order, no LAPACK)."""
    k = b.shape[-1]
    X = np.asarray(b, dtype=np.float64).reshape(-1, k, k)
    return solve(X, np.broadcast_to(np.eye(k), X.shape)).reshape(b.shape)


def _pinv_sym(b: np.ndarray, rtol: float) -> np.ndarray:
    """Moore–Penrose inverse of symmetric ``(..., k, k)`` blocks, as ``numpy.linalg.pinv(b,
    rtol, hermitian=True)`` (``|λ| ≤ rtol · max |λ|`` dropped) by
    :func:`~censusdp.estimation.gls.block_kernels.eigh` (fixed order, no LAPACK)."""
    ev, V = eigh(b)
    s = np.abs(ev)
    keep = s > rtol * s.max(axis=-1, keepdims=True, initial=0.0)
    inv = np.where(keep, 1.0 / np.where(keep, ev, 1.0), 0.0)
    return matmul(V * inv[..., None, :], V.swapaxes(-1, -2))


@dataclass(frozen=True, eq=False)
class BlockDiagonal:
    """A symmetric matrix of the marginal algebra, stored as one block per subset ``S``.

    Attributes
    ----------
    basis : MarginalBasis
    blocks : dict of int → numpy.ndarray
        Mask ``S`` → ``(..., n_S, n_S)``; leading dimensions (e.g. nodes) broadcast.
    """

    basis: MarginalBasis
    blocks: dict[int, np.ndarray]

    def _check(self, other: BlockDiagonal) -> None:
        if other.basis is not self.basis:
            raise SpecError("block matrices over different bases cannot be combined")

    def __add__(self, other: BlockDiagonal) -> BlockDiagonal:
        self._check(other)
        return BlockDiagonal(self.basis, {m: b + other.blocks[m] for m, b in self.blocks.items()})

    def __radd__(self, other: object) -> BlockDiagonal:
        if isinstance(other, int) and other == 0:  # sum()
            return self
        return NotImplemented

    def __mul__(self, c: float | np.ndarray) -> BlockDiagonal:
        """Scale by a scalar, or per leading index by an array (e.g. one weight per node)."""
        c = np.asarray(c, dtype=np.float64)[..., None, None]
        return BlockDiagonal(self.basis, {m: c * b for m, b in self.blocks.items()})

    __rmul__ = __mul__

    def __matmul__(self, other: BlockDiagonal) -> BlockDiagonal:
        self._check(other)
        return BlockDiagonal(
            self.basis, {m: matmul(b, other.blocks[m]) for m, b in self.blocks.items()}
        )

    def inv(self) -> BlockDiagonal:
        """The inverse, block by block (``numpy.linalg.LinAlgError`` if a block is singular)."""
        return BlockDiagonal(self.basis, {m: _inv(b) for m, b in self.blocks.items()})

    def pinv(self, rtol: float = 1e-10) -> BlockDiagonal:
        """The Moore–Penrose inverse, block by block (eigenvalues below ``rtol`` × the
        block's largest are zero: directions no measurement identifies)."""
        return BlockDiagonal(
            self.basis,
            {m: _pinv_sym(b, rtol) for m, b in self.blocks.items()},
        )

    def apply(self, y: np.ndarray) -> np.ndarray:
        """The matrix times coefficient tensors ``y`` of shape ``(n, *shape)``.

        Blocks with a leading node dimension must have ``n`` entries.
        """
        y = np.asarray(y, dtype=np.float64)
        out = np.empty(np.broadcast_shapes(y.shape, (1, *self.basis.shape)))
        n = y.shape[0]
        for mask, b in self.blocks.items():
            idx = (slice(None), *self.basis._index(mask))
            perm = self.basis._perm(mask)
            sub = np.transpose(y[idx], perm)
            shp = sub.shape
            flat = sub.reshape(n, self.basis.block_size(mask), -1)
            res = matmul(b, flat).reshape(shp)
            out[idx] = np.transpose(res, np.argsort(perm))
        return out

    def query_variances(self, query: ProductQuery) -> np.ndarray:
        """``diag(Q M Qᵀ)``: with ``M`` a covariance, the variance of every row of ``query``.

        Any product query, measured or not. Its per-axis rows in the basis are
        ``T_a = R_a B_a``: group part ``T_a[:, :r_a]`` and a within-group part of squared
        norm ``w_a`` (zero for rows made of whole groups). Block ``S`` acts on the group parts
        of the axes in ``S`` and repeats identically over every contrast index of the others,
        so it contributes the quadratic form of ``⊗_{a∈S} T_a[i_a, :r_a]`` with the block,
        times ``∏_{a∉S} w_a[i_a]``: every marginal cell's variance at every node from the
        node's blocks, in ``O(rows · Σ_S n_S²)``.

        Returns
        -------
        numpy.ndarray
            ``(..., n_rows)``, leading dimensions those of the blocks (e.g. nodes).
        """
        mb = self.basis
        if query.schema is not mb.schema:
            raise SpecError(f"query {query.name!r} is over another schema than {mb.schema.name!r}")
        t = [matmul(f.matrix, a.basis) for a, f in zip(mb.axes, query.factors, strict=True)]
        group = [ti[:, : a.r] for ti, a in zip(t, mb.axes, strict=True)]
        within = [(ti[:, a.r :] ** 2).sum(axis=1) for ti, a in zip(t, mb.axes, strict=True)]
        k = len(t)
        lead = np.broadcast_shapes(*(b.shape[:-2] for b in self.blocks.values()))
        out = np.zeros((*lead, *query.row_shape))
        for mask, b in self.blocks.items():
            ins = [a for a in range(k) if mask >> a & 1]
            outs = [a for a in range(k) if not mask >> a & 1]
            if any(not within[a].any() for a in outs):
                continue  # rows of whole groups on an axis outside S: no component here
            g = reduce(np.kron, [group[a] for a in ins], np.ones((1, 1)))
            term = np.einsum("ij,...jk,ik->...i", g, np.broadcast_to(b, (*lead, *b.shape[-2:])), g)
            term = term.reshape((*lead, *(query.row_shape[a] for a in ins)))
            for a in outs:
                term = np.multiply.outer(term, within[a])
            order = [len(lead) + (ins + outs).index(a) for a in range(k)]
            out += np.transpose(term, [*range(len(lead)), *order])
        return out.reshape((*lead, query.n_rows))

    def quadratic_form(self, v: np.ndarray) -> np.ndarray:
        """``vᵀ M v`` per coefficient tensor of ``v`` (shape ``(n, *shape)``) → ``(n,)``."""
        v = np.asarray(v, dtype=np.float64)
        return (v * self.apply(v)).reshape(v.shape[0], -1).sum(axis=1)

    def dense(self) -> np.ndarray:
        """The matrix in basis coordinates (cells × cells) — for tests and small schemas."""
        n = self.basis.schema.n_cells
        eye = np.eye(n).reshape((n, *self.basis.shape))
        return self.apply(eye).reshape(n, n).T

    def dense_cells(self) -> np.ndarray:
        """The matrix in cell coordinates, ``B M Bᵀ`` — for tests and small schemas."""
        b = self.basis.dense_basis()
        return matmul(matmul(b, self.dense()), b.T)


def workload_basis(schema: Schema, texts: Sequence[str]) -> MarginalBasis:
    """Shorthand: the basis of the product queries written in ``texts``."""
    return MarginalBasis.for_queries(schema, [ProductQuery.parse(schema, t) for t in texts])
