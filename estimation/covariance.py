"""The error covariance of a release, level by level: what every standard error, interval
and summary of a :class:`~censusdp.estimation.release.ReleaseBase` is computed from.

A release's estimate at node ``v`` is ``ẑ_v = z_v + e_v``; its :class:`Covariance` answers,
per level, ``Var(e_v)`` of every cell and ``Var(q ᵀ e_v)`` of every row ``q`` of a query —
the two numbers a release publishes beside an estimate (a cell's standard error, a table
row's standard error). Two implementations, one per shape of the covariance:

* :class:`NodeCovariance` — per node, **diagonal** (the cell variances alone; a query row
  of one cell is read off, a row of several cells is not determined: NaN) or **full** (an
  ``n_cells × n_cells`` matrix per node, ``Var(Qe) = Q Σ_v Qᵀ``). The GLS of
  :func:`~censusdp.estimation.gls.tree.tree_gls`, the integer codebook and units routes (their
  variances include the rounding's: a standard error covers everything between the truth
  and the released number).
* :class:`BlockCovariance` — per node, **block-diagonal** in the per-axis marginal basis of
  :class:`~censusdp.estimation.gls.marginal_basis.MarginalBasis` (one ``n_S × n_S`` block per
  axis subset, :class:`~censusdp.estimation.gls.marginal_basis.BlockDiagonal`): the structured
  GLS (docs/design.md § The structured algebra). A query row's variance is the quadratic form
  of :meth:`BlockDiagonal.query_variances`, ``O(rows · Σ_S n_S²)`` per node, never a cells ×
  cells matrix; rows with a component outside the identified subspace ``W`` are NaN.

NaN is the one convention for "not available": a variance the covariance does not determine
(a diagonal asked for a sum) or a row that is not identified. The release turns a missing
covariance into a :class:`~censusdp.errors.SpecError`.

References
----------
Gao, Gong & Yu (2022). Subspace Differential Privacy, AAAI — the projected noise law is
    public, so the covariance of every released number is exact (§4).
McKenna, R. et al. (2018). Optimizing error of high-dimensional statistical queries under
    differential privacy (HDMM) — Kronecker-structured covariances, per axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from censusdp.estimation.gls.marginal_basis import BlockDiagonal, MarginalBasis
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import query_matrix

__all__ = ["BlockCovariance", "Covariance", "NodeCovariance", "identified_rows"]


@runtime_checkable
class Covariance(Protocol):
    """Per level ``k`` (an index into the release's levels), the error (co)variances of every
    node's estimate."""

    def cell_variances(self, k: int) -> np.ndarray:
        """``Var(e_v)`` of every cell, ``(n_nodes, n_cells)`` (or the release's cell shape)."""
        ...

    def cell_standard_errors(self, k: int) -> np.ndarray:
        """The square roots of :meth:`cell_variances` (as the route computed them)."""
        ...

    def query_variances(self, k: int, query) -> np.ndarray:
        """``Var(qᵀ e_v)`` of every row ``q`` of ``query``, ``(n_nodes, n_rows)``; NaN where
        the covariance does not determine it."""
        ...


def identified_rows(
    basis: MarginalBasis, identified: BlockDiagonal, query: ProductQuery, cache: dict
) -> np.ndarray:
    """Per row of ``query``, True when it lies in the identified subspace ``W`` (projector
    ``identified``): ``‖(I − Π_W) q‖² ≤ 1e-9 ‖q‖²``, computed per block like a variance
    (:meth:`BlockDiagonal.query_variances`); memoised in ``cache`` by the query's elements
    (shared objects of the schema)."""
    key = tuple(id(f) for f in query.factors)
    if key not in cache:
        norm2 = basis.identity().query_variances(query)
        outside = (basis.identity() + identified * -1.0).query_variances(query)
        cache[key] = outside <= 1e-9 * np.maximum(norm2, 1.0)
    return cache[key]


@dataclass(frozen=True, eq=False)
class NodeCovariance:
    """Per node, a diagonal (cell variances) or full (cells × cells) error covariance.

    Attributes
    ----------
    variances : tuple of numpy.ndarray
        Per level, ``(n_nodes, n_cells)``: every cell's error variance.
    covariances : tuple of numpy.ndarray, or None
        Per level, ``(n_nodes, n_cells, n_cells)``; None for a diagonal covariance (then a
        query row of several cells has no variance here: NaN).
    standard_errors : tuple of numpy.ndarray, or None
        Per level, the cell standard errors as the route computed them (kept so that the
        written ``_se`` columns stay bit for bit); None: ``√variances``.
    """

    variances: tuple[np.ndarray, ...]
    covariances: tuple[np.ndarray, ...] | None = None
    standard_errors: tuple[np.ndarray, ...] | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def from_standard_errors(cls, ses: Sequence[np.ndarray]) -> NodeCovariance:
        """A diagonal covariance from per-level cell standard errors (kept as given)."""
        ses = tuple(np.asarray(s, dtype=np.float64) for s in ses)
        return cls(tuple(s**2 for s in ses), None, ses)

    def cell_variances(self, k: int) -> np.ndarray:
        return self.variances[k]

    def cell_standard_errors(self, k: int) -> np.ndarray:
        if self.standard_errors is not None:
            return self.standard_errors[k]
        return np.sqrt(self.variances[k])

    def query_variances(self, k: int, query) -> np.ndarray:
        """``diag(Q Σ_v Qᵀ)`` per node; with a diagonal covariance only the rows of a single
        cell (coefficient ±1) are determined, the others NaN."""
        M = query_matrix(query)
        if self.covariances is not None:
            return np.einsum("qa,nab,qb->nq", M, self.covariances[k], M)
        var = self.variances[k].reshape(self.variances[k].shape[0], -1)
        cell = np.argmax(M != 0, axis=1)
        coef = M[np.arange(M.shape[0]), cell]
        single = (M != 0).sum(axis=1) == 1
        return np.where(single[None, :], var[:, cell] * coef**2, np.nan)


@dataclass(frozen=True, eq=False)
class BlockCovariance:
    """Per node, a block-diagonal covariance in a marginal basis, with the identified
    subspace ``W`` (the structured GLS; module docstring).

    Attributes
    ----------
    blocks : tuple of BlockDiagonal
        Per level, blocks ``(n_nodes, n_S, n_S)`` (zero on unidentified directions).
    identified : BlockDiagonal
        The orthogonal projector onto ``W`` (blocks ``(n_S, n_S)``).
    n_nodes : tuple of int
        Per level, the number of nodes (blocks without a node axis broadcast to it).
    rows : dict
        The memo of :func:`identified_rows` (shared with the release that made this).
    """

    blocks: tuple[BlockDiagonal, ...]
    identified: BlockDiagonal
    n_nodes: tuple[int, ...]
    rows: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def identified_rows(self, query: ProductQuery) -> np.ndarray:
        """Per row of ``query``, True when it lies in ``W`` (:func:`identified_rows`)."""
        return identified_rows(self.identified.basis, self.identified, query, self.rows)

    def query_variances(self, k: int, query: ProductQuery) -> np.ndarray:
        """Every row's variance at every node of level ``k`` from the node's blocks
        (:meth:`BlockDiagonal.query_variances`), NaN for unidentified rows.

        A row the invariants hold has variance 0 in exact arithmetic; in floats the
        two-pass smoother leaves a residue of order ε times the level's scale, of either
        sign. Variances at or below ``1e-12 · ‖q‖² · s_k`` (``s_k`` the largest diagonal entry
        of level ``k``'s blocks: the variance of its noisiest unit direction) are that residue
        and are reported as 0, as :class:`~censusdp.estimation.gls.predict.Prediction` does
        with the noise scale; no measured direction comes within nine orders of it."""
        var = self.blocks[k].query_variances(query)
        norm2 = self.identified.basis.identity().query_variances(query)
        var = np.where(var > 1e-12 * self._scale(k) * norm2, var, 0.0)
        var = np.broadcast_to(var, (self.n_nodes[k], query.n_rows))
        return np.where(self.identified_rows(query)[None, :], var, np.nan)

    def _scale(self, k: int) -> float:
        """The largest diagonal entry of level ``k``'s blocks (0 for a level without any)."""
        diag = [np.diagonal(b, axis1=-2, axis2=-1) for b in self.blocks[k].blocks.values()]
        return max((float(d.max()) for d in diag if d.size), default=0.0)

    def cell_variances(self, k: int) -> np.ndarray:
        """Every cell's variance, ``(n_nodes, *schema.shape)``: the rows of the detailed query."""
        schema = self.identified.basis.schema
        detailed = ProductQuery.parse(schema, " * ".join(schema.names))
        return self.query_variances(k, detailed).reshape(self.n_nodes[k], *schema.shape)

    def cell_standard_errors(self, k: int) -> np.ndarray:
        return np.sqrt(self.cell_variances(k))
