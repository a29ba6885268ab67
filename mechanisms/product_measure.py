"""Noisy measurements of product queries on schema histograms, and their privacy.

A level's counts are a batch of cell tensors ``(n_nodes, d_1, …, d_k)`` of a
:class:`~censusdp.schema.Schema`; a *product measurement* is the answer of one
:class:`~censusdp.mechanisms.product_query.ProductQuery` at every node of a level plus
independent noise from a :class:`~censusdp.mechanisms.laws.NoiseLaw`
(:func:`measure_products`); a *product invariant* is the exact answer of a product query at
every node of a level. These are the inputs of
:func:`censusdp.estimation.gls.structured.structured_gls`.

The privacy statement is *derived* from the measurements, never asserted
(:func:`product_privacy`): a person is in exactly one node of each level and one detailed
cell, so a level's measurements compose over its queries with each query's computed
sensitivity (ℓ₂ for zCDP laws, ℓ₁ for pure laws; :attr:`ProductQuery.l2_sensitivity`), the
nodes of a level compose in parallel, and the levels compose sequentially:
``ρ = Σ_levels Σ_q Δ₂(q)² / (2σ_q²)`` for Gaussian laws.

Noise streams are keyed exactly as :func:`~censusdp.mechanisms.queries.measure_range` keys
them (``measure/<level>/<query>``), so a partitioned run draws the same noise.

References
----------
Bun, M. & Steinke, T. (2016). Concentrated Differential Privacy: Simplifications,
    Extensions, and Lower Bounds (zCDP composition; pure ε-DP implies ε²/2-zCDP).
Abowd, J. M. et al. (2022). The 2020 Census Disclosure Avoidance System TopDown Algorithm.
    Harvard Data Science Review, Special Issue 2 (per-level, per-query allocation).
Gao, Gong & Yu (2022). Subspace Differential Privacy (invariants: induced subspace DP).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from censusdp.budget import Accounting, PrivacyStatement
from censusdp.errors import BudgetError, DataError, SpecError
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.mechanisms.privacy import derive_statement
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import measure_range
from censusdp.rng import KeyedRNG

__all__ = [
    "ProductMeasurement",
    "ProductInvariant",
    "measure_products",
    "product_invariant",
    "product_privacy",
    "checked_values",
]

#: Relative slack when a caller's statement is compared with the derived one.


@dataclass(frozen=True, eq=False)
class ProductMeasurement:
    """Noisy answers of a product query at every node of one level.

    Attributes
    ----------
    level : str or int
        Level name (or index) in the hierarchy.
    query : ProductQuery
    values : numpy.ndarray
        (n_nodes, query.n_rows) noisy answers.
    law : NoiseLaw
        The noise law of every answer. With ``node_variance`` it is the law of the least
        noisy node (it bounds every node's privacy loss).
    node_variance : numpy.ndarray or None
        (n_nodes,) noise variance of each node's answers, when it differs by node; each
        must be at least ``law.variance``.
    """

    level: str | int
    query: ProductQuery
    values: np.ndarray
    law: NoiseLaw
    node_variance: np.ndarray | None = None

    @property
    def variance(self) -> float | np.ndarray:
        """The noise variance: a float, or (n_nodes,) with ``node_variance``."""
        if self.node_variance is None:
            return float(self.law.variance)
        return np.asarray(self.node_variance, dtype=np.float64).reshape(-1)

    @property
    def sensitivity(self) -> float:
        """The query's sensitivity in the law's norm (ℓ₂ for zCDP, ℓ₁ for pure laws)."""
        q = self.query
        return q.sensitivity(2 if self.law.accounting == Accounting.ZCDP else 1)


@dataclass(frozen=True, eq=False)
class ProductInvariant:
    """Exact answers of a product query at every node of one level.

    Attributes
    ----------
    level : str or int
    query : ProductQuery
    values : numpy.ndarray
        (n_nodes, query.n_rows) exact answers (integers for counts).
    """

    level: str | int
    query: ProductQuery
    values: np.ndarray


def _levels(
    level_counts: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    level_names: Sequence[str] | None,
) -> tuple[list[str], list[np.ndarray]]:
    if isinstance(level_counts, Mapping):
        return [str(k) for k in level_counts], list(level_counts.values())
    counts = list(level_counts)
    if level_names is None or len(level_names) != len(counts):
        raise SpecError(
            "measure_products: give level_counts as a mapping level name → counts, or pass "
            "level_names (one name per level, root first; they label the noise streams)"
        )
    return [str(n) for n in level_names], counts


def _level_index(names: Sequence[str], level: str | int, what: str) -> int:
    if isinstance(level, str):
        if level not in names:
            raise SpecError(f"{what}: unknown level {level!r}; levels are {list(names)}")
        return names.index(level)
    k = int(level)
    if not 0 <= k < len(names):
        raise SpecError(f"{what}: level index {k} is outside 0..{len(names) - 1}")
    return k


def measure_products(
    level_counts: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    plan: Sequence[tuple[str | int, ProductQuery, NoiseLaw]],
    rng: KeyedRNG,
    *,
    level_names: Sequence[str] | None = None,
) -> list[ProductMeasurement]:
    """Measure every (level, product query, law) of ``plan`` at every node of its level.

    Parameters
    ----------
    level_counts : mapping of level name → array, or sequence of arrays
        Exact counts per level as cell tensors ``(n_nodes, *schema.shape)``, root first
        (e.g. ``Hierarchy.aggregate(leaf_tensors)``); integers for integer laws.
    plan : sequence of (level name or index, ProductQuery, NoiseLaw)
    rng : KeyedRNG
        Noise of (level, query) comes from stream ``measure/<level>/<query name>``, chunked
        by node as in :func:`~censusdp.mechanisms.queries.measure_range`.
    level_names : sequence of str, optional
        Needed when ``level_counts`` is a sequence.

    Returns
    -------
    list of ProductMeasurement
        In plan order, ``level`` set to the level's name.

    Raises
    ------
    SpecError
        Unknown level, a query over another schema than the counts' shape, or a (level,
        query) measured twice (the two would share a noise stream).
    DataError
        Non-integer counts under an integer law.
    """
    names, counts = _levels(level_counts, level_names)
    out = []
    seen: set[tuple[int, str]] = set()
    for level, query, law in plan:
        k = _level_index(names, level, f"measurement of {query.name!r}")
        if (k, query.name) in seen:
            raise SpecError(
                f"level {names[k]!r}: query {query.name!r} is measured twice; measure each "
                "(level, query) once (split its budget by giving it a smaller noise scale)"
            )
        seen.add((k, query.name))
        x = np.asarray(counts[k])
        if x.shape[1:] != query.schema.shape:
            raise SpecError(
                f"level {names[k]!r}: counts have shape {x.shape}, but query {query.name!r} is "
                f"over schema {query.schema.name!r} of shape {query.schema.shape}"
            )
        truth = query.apply(x)
        vals = measure_range(truth, names[k], x.shape[0], 0, query, law, rng)
        out.append(ProductMeasurement(names[k], query, vals, law))
    return out


def product_invariant(
    level_counts: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    level: str | int,
    query: ProductQuery,
    *,
    level_names: Sequence[str] | None = None,
) -> ProductInvariant:
    """The exact answers of ``query`` at every node of ``level`` (an invariant)."""
    names, counts = _levels(level_counts, level_names)
    k = _level_index(names, level, f"invariant {query.name!r}")
    return ProductInvariant(names[k], query, query.apply(np.asarray(counts[k])))


def product_privacy(
    measurements: Sequence[ProductMeasurement],
    *,
    level_names: Sequence[str] | None = None,
    delta: float | None = None,
) -> PrivacyStatement:
    """The privacy statement the measurements imply, derived from their sensitivities.

    Each (level, query) costs ``law.privacy(Δ)`` with ``Δ`` the query's computed
    sensitivity; the composition is :func:`~censusdp.mechanisms.privacy.derive_statement`'s
    (one implementation for flat and product queries). What product measurements add is
    node variances: every node's noise must be at least the stated law's, since the stated
    law is what the statement is computed from. Invariants are added by the estimator
    (:func:`censusdp.budget.with_invariants`).

    Parameters
    ----------
    measurements : sequence of ProductMeasurement
    level_names : sequence of str, optional
        The hierarchy's level names when levels are given as indices.
    delta : float, optional
        δ at which a zCDP total is also reported as (ε, δ).

    Raises
    ------
    BudgetError
        Node variances below the stated law's variance (the law must be that of the least
        noisy node).
    SpecError
        No measurement, or an unregistered law.
    """
    names = (
        list(level_names)
        if level_names is not None
        else list(dict.fromkeys(str(m.level) for m in measurements))
    )
    plan = []
    for m in measurements:
        k = m.level if not isinstance(m.level, str) else names.index(m.level)
        if m.node_variance is not None:
            nv = np.asarray(m.node_variance, dtype=np.float64).reshape(-1)
            if nv.size and float(nv.min()) < float(m.law.variance) * (1.0 - 1e-12):
                raise BudgetError(
                    f"level {names[int(k)]!r}, query {m.query.name!r}: some node's noise "
                    "variance is below the variance of the stated law; give as law the noise "
                    "law of the least noisy node (it bounds every node's privacy loss)"
                )
        plan.append((int(k), m.query, m.law))
    return derive_statement(names, plan, delta=delta)


def checked_values(
    values: np.ndarray, n_nodes: int, query: ProductQuery, what: str, level: str
) -> np.ndarray:
    """The values of a measurement or invariant, checked for shape and finiteness."""
    v = np.asarray(values)
    if v.shape != (n_nodes, query.n_rows):
        raise SpecError(
            f"{what} {query.name!r} at level {level!r}: values have shape {v.shape}, expected "
            f"({n_nodes}, {query.n_rows})"
        )
    if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
        raise DataError(f"{what} {query.name!r} at level {level!r} has non-finite values")
    return v
