"""Blowfish policy graphs and the transformation P_G to standard differential privacy.

A policy graph G has the domain values (and optionally the special vertex ⊥) as vertices; an
edge (u, v) says an adversary must not distinguish an individual with value u from one with
value v; an edge (u, ⊥) protects the presence of an individual with value u. Neighbouring
databases (Definition 3.2) differ by moving one individual along an edge, or by adding or
removing one along an edge to ⊥.

P_G has one row per domain value and one column per edge: +1 at u and −1 at v for (u, v),
a single +1 at u for (u, ⊥). When G has no ⊥ (the database size n is known), one vertex v is
replaced by ⊥ (Case II): its column is dropped from the workload, W' = W D with
D = [e_j − e_v]_{j ≠ v}, and W x = W' x₋ᵥ + n W[:, v]. Then W_G = W' P_G', x_G = P_G'⁻¹ x₋ᵥ
(right inverse P_Gᵀ(P_G P_Gᵀ)⁻¹), and the policy sensitivity Δ_W(G) = Δ_{W_G} is the largest
column ℓ₁ norm of W_G (Lemma 4.5 / D.1): the column of edge (u, v) is W(e_u − e_v).

References
----------
Haney, Machanavajjhala & Ding, "Design of Policy-Aware Differentially Private Algorithms",
PVLDB 9(4), 2015 (seed ``policy_aware_dp_blowfish``): Definitions 3.1–3.3, 4.1; §4.4 (Cases I
and II); Lemmas 4.5–4.8, 4.3 (subgraph approximation), D.6; §5.3.1 (the tree H^θ_k).
He, Machanavajjhala & Ding, "Blowfish Privacy: Tuning Privacy-Utility Trade-offs using
Policies", SIGMOD 2014 (the Blowfish framework).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx
import numpy as np
from scipy import sparse

from censusdp.errors import SpecError

__all__ = [
    "BOTTOM",
    "PolicyGraph",
    "PolicyTransform",
    "line_policy",
    "threshold_policy",
    "threshold_tree",
    "grid_policy",
    "unbounded_dp_policy",
    "bounded_dp_policy",
    "incidence",
    "transform",
    "policy_sensitivity",
    "stretch",
]

#: The special vertex ⊥ (absence of an individual).
BOTTOM = "⊥"


@dataclass(frozen=True, eq=False)
class PolicyGraph:
    """A connected policy graph over an ordered domain.

    Attributes
    ----------
    domain : tuple
        The domain values in the order of the database vector x.
    edges : tuple of (u, v)
        The edges in the order of the columns of P_G; ``BOTTOM`` may appear as v.
    name : str
    """

    domain: tuple[Hashable, ...]
    edges: tuple[tuple[Hashable, Hashable], ...]
    name: str = "policy"

    def __post_init__(self) -> None:
        if len(set(self.domain)) != len(self.domain) or BOTTOM in self.domain:
            raise SpecError(f"policy {self.name!r}: domain values must be distinct and not ⊥")
        known = set(self.domain) | {BOTTOM}
        for u, v in self.edges:
            if u not in known or v not in known or u == v:
                raise SpecError(f"policy {self.name!r}: edge ({u!r}, {v!r}) is not valid")
            if u == BOTTOM:
                raise SpecError(f"policy {self.name!r}: write edges to ⊥ as (u, ⊥), not (⊥, u)")
        if not nx.is_connected(self.graph):
            raise SpecError(
                f"policy {self.name!r} is disconnected; connect its components (through ⊥ "
                "if sizes are public per component, seed Appendix E)"
            )

    @classmethod
    def from_edges(
        cls, domain: Iterable[Hashable], edges: Iterable[tuple[Hashable, Hashable]], name: str
    ) -> PolicyGraph:
        return cls(tuple(domain), tuple((u, v) for u, v in edges), name)

    @property
    def k(self) -> int:
        return len(self.domain)

    @cached_property
    def has_bottom(self) -> bool:
        return any(v == BOTTOM for _, v in self.edges)

    @cached_property
    def index(self) -> dict[Hashable, int]:
        return {v: i for i, v in enumerate(self.domain)}

    @cached_property
    def graph(self) -> nx.Graph:
        """The networkx view (vertices: domain values, plus ⊥ when used)."""
        g = nx.Graph()
        g.add_nodes_from(self.domain)
        g.add_edges_from(self.edges)
        return g

    def is_tree(self) -> bool:
        return nx.is_tree(self.graph)


def line_policy(k: int) -> PolicyGraph:
    """G¹_k: values 0 … k−1, edges (i, i+1); no ⊥ (bounded: n is public)."""
    _check_k(k)
    return PolicyGraph(tuple(range(k)), tuple((i, i + 1) for i in range(k - 1)), f"G1_{k}")


def threshold_policy(k: int, theta: int) -> PolicyGraph:
    """G^θ_k: edges (i, j) with 0 < j − i ≤ θ."""
    _check_k(k)
    if theta < 1:
        raise SpecError(f"theta must be a positive integer, got {theta!r}")
    edges = tuple((i, j) for i in range(k) for j in range(i + 1, min(k, i + theta + 1)))
    return PolicyGraph(tuple(range(k)), edges, f"G{theta}_{k}")


def threshold_tree(k: int, theta: int) -> PolicyGraph:
    """H^θ_k: the spanning tree of G^θ_k used by subgraph approximation (seed §5.3.1).

    In 1-based labels the red vertices are θ, 2θ, … and k; consecutive red vertices form a
    path, every other vertex joins the next red vertex to its right. Here values are 0-based
    (label i ↔ value i − 1); edge e_i, i = 1 … k−1, joins label i to its parent, so edges are
    ordered by their left end point. Every edge of G^θ_k is a path of length ≤ 3 in H^θ_k
    (Lemma 4.3 then costs a factor 3 in ε).
    """
    _check_k(k)
    if theta < 1:
        raise SpecError(f"theta must be a positive integer, got {theta!r}")
    edges = []
    for i in range(1, k):
        parent = min(k, (i // theta + 1) * theta)
        edges.append((i - 1, parent - 1))
    return PolicyGraph(tuple(range(k)), tuple(edges), f"H{theta}_{k}")


def grid_policy(k: int, d: int = 2) -> PolicyGraph:
    """G¹_{k^d}: the d-dimensional grid, edges between cells at ℓ₁ distance 1.

    Values are d-tuples in row-major order (the order of ``x.reshape(k, …, k)``). Edges
    list, for each axis a in turn, the pairs (c, c + e_a) sorted by c_a first and then by the
    other coordinates in order, so the edges crossing one hyperplane c_a = const form a
    contiguous block ordered like a (d−1)-dimensional grid (for d = 2: k − 1 "lines" of k
    edges per axis, the layout of the strategy of seed §5.2.2).
    """
    _check_k(k)
    cells = list(itertools.product(range(k), repeat=d))
    edges = []
    for axis in range(d):
        layer_first = sorted(cells, key=lambda c: (c[axis], *c[:axis], *c[axis + 1 :]))
        for c in layer_first:
            if c[axis] + 1 < k:
                nxt = list(c)
                nxt[axis] += 1
                edges.append((c, tuple(nxt)))
    return PolicyGraph(tuple(cells), tuple(edges), f"G1_{k}^{d}")


def unbounded_dp_policy(k: int) -> PolicyGraph:
    """Every value joined to ⊥: unbounded ε-DP."""
    _check_k(k)
    return PolicyGraph(tuple(range(k)), tuple((i, BOTTOM) for i in range(k)), f"DP_{k}")


def bounded_dp_policy(k: int) -> PolicyGraph:
    """The complete graph on the domain: bounded ε-DP."""
    _check_k(k)
    return PolicyGraph(
        tuple(range(k)), tuple(itertools.combinations(range(k), 2)), f"boundedDP_{k}"
    )


def _check_k(k: int) -> None:
    if int(k) != k or k < 2:
        raise SpecError(f"the domain size k must be an integer ≥ 2, got {k!r}")


def incidence(policy: PolicyGraph) -> sparse.csr_matrix:
    """The k × |E| matrix with columns e_u − e_v (e_u for an edge (u, ⊥)).

    For a graph with ⊥ this is P_G (Case I). For a graph without ⊥ it has rank k − 1, and
    W · incidence equals W' P_G' for any choice of the replaced vertex (see :func:`transform`).
    """
    rows, cols, vals = [], [], []
    for j, (u, v) in enumerate(policy.edges):
        rows.append(policy.index[u])
        cols.append(j)
        vals.append(1.0)
        if v != BOTTOM:
            rows.append(policy.index[v])
            cols.append(j)
            vals.append(-1.0)
    shape = (policy.k, len(policy.edges))
    return sparse.csr_matrix((vals, (rows, cols)), shape=shape)


@dataclass
class PolicyTransform:
    """P_G with its right inverse and the Case II reduction.

    Attributes
    ----------
    policy : PolicyGraph
    p : scipy.sparse.csr_matrix
        P_G (Case I) or P_G' (Case II), shape (k_kept, |E|), full row rank.
    kept : numpy.ndarray
        Indices of the domain values that keep a row (all of them in Case I).
    replaced : int or None
        Index of the vertex replaced by ⊥ (Case II), else None.
    """

    policy: PolicyGraph
    p: sparse.csr_matrix
    kept: np.ndarray
    replaced: int | None
    _pinv: np.ndarray | None = field(default=None, repr=False)

    @property
    def reduction(self) -> np.ndarray:
        """D (k × k_kept): W' = W D; the identity when no vertex was replaced."""
        k = self.policy.k
        d = np.zeros((k, self.kept.size))
        d[self.kept, np.arange(self.kept.size)] = 1.0
        if self.replaced is not None:
            d[self.replaced, :] = -1.0
        return d

    def right_inverse(self) -> np.ndarray:
        """P_G⁻¹ = P_Gᵀ(P_G P_Gᵀ)⁻¹ (dense), the exact inverse when G is a tree."""
        if self._pinv is None:
            pd = self.p.toarray()
            if pd.shape[0] == pd.shape[1]:
                self._pinv = np.linalg.inv(pd)
            else:
                self._pinv = pd.T @ np.linalg.inv(pd @ pd.T)
        return self._pinv

    def reduce_workload(self, w: np.ndarray) -> np.ndarray:
        """W' = W D (Lemma D.6)."""
        return np.asarray(w, dtype=float) @ self.reduction

    def offset(self, w: np.ndarray, n: float) -> np.ndarray:
        """c(W, n) = n W[:, v] with W x = W' x₋ᵥ + c (zero in Case I)."""
        w = np.asarray(w, dtype=float)
        if self.replaced is None:
            return np.zeros(w.shape[0])
        return float(n) * w[:, self.replaced]

    def workload(self, w: np.ndarray) -> np.ndarray:
        """W_G = W' P_G (Theorem 4.1, Lemma 4.8)."""
        return np.asarray(self.p.T @ self.reduce_workload(w).T).T

    def database(self, x: np.ndarray) -> np.ndarray:
        """x_G = P_G⁻¹ x₋ᵥ."""
        return self.right_inverse() @ np.asarray(x, dtype=float)[self.kept]


def transform(policy: PolicyGraph, replaced: Hashable | None = None) -> PolicyTransform:
    """Build P_G (Case I) or, without ⊥, P_G' with vertex ``replaced`` → ⊥ (Case II).

    Parameters
    ----------
    replaced : domain value, optional
        Case II only; default the last domain value (as in the seed's Example 4.9).

    References
    ----------
    Seed ``policy_aware_dp_blowfish``, §4.4, Lemmas 4.6 and 4.8.
    """
    full = incidence(policy)
    if policy.has_bottom:
        if replaced is not None:
            raise SpecError("replaced= applies only to policies without ⊥ (Case II)")
        return PolicyTransform(policy, full, np.arange(policy.k), None)
    v = policy.domain[-1] if replaced is None else replaced
    if v not in policy.index:
        raise SpecError(f"replaced={v!r} is not a domain value of policy {policy.name!r}")
    iv = policy.index[v]
    kept = np.array([i for i in range(policy.k) if i != iv])
    return PolicyTransform(policy, sparse.csr_matrix(full[kept]), kept, iv)


def policy_sensitivity(w: np.ndarray | sparse.spmatrix, policy: PolicyGraph) -> float:
    """Δ_W(G): the largest ‖W x − W x'‖₁ over neighbours under G = max column ℓ₁ of W_G.

    References
    ----------
    Seed ``policy_aware_dp_blowfish``, Definition 4.1, Lemma 4.5 (proof in Lemma D.1).
    """
    wg = w @ incidence(policy)
    wg = wg.toarray() if sparse.issparse(wg) else np.asarray(wg)
    return float(np.max(np.sum(np.abs(wg), axis=0)))


def stretch(policy: PolicyGraph, tree: PolicyGraph) -> int:
    """ℓ: the longest path in ``tree`` between the end points of an edge of ``policy``.

    A mechanism that is (ε, tree)-Blowfish private is (ℓ ε, policy)-Blowfish private
    (Lemma 4.3, subgraph approximation).
    """
    if set(policy.domain) != set(tree.domain):
        raise SpecError("stretch needs two policies over the same domain")
    g = tree.graph
    best = 0
    for u, v in policy.edges:
        best = max(best, nx.shortest_path_length(g, u, v))
    return int(best)
