"""Shape classes of a hierarchy: nodes whose subtrees and ancestries look alike, computed once.

Many computations on a hierarchy depend on its *shape* only — how many children each node
has, recursively — and on per-level constants, never on node codes or counts: the error
covariance of the tree GLS is one (:mod:`censusdp.estimation.gls.predict`). Two nodes of a level
then get the same result when

* their subtrees have the same shape (the *upward signature*: every leaf of a level has the
  same one; a parent's is the multiset of its children's signatures), for upward passes, and
* additionally their parents are in the same class (the *downward class*: the pair
  (parent's class, own signature)), for downward passes.

The quotient is again a forest, of downward classes: the children of a class are the
classes of the children of any one of its nodes, each with its *multiplicity* (how many of
that node's children fall in it — the same for every node of the class, since their subtrees
have the same shape). A national hierarchy of 8.2 million blocks collapses to a few hundred
thousand classes, most of them above the blocks.

Everything is computed level by level with sorts (``numpy.unique`` on signature rows), with
no Python loop over nodes.

References
----------
Aho, A. V., Hopcroft, J. E. & Ullman, J. D. (1974). The Design and Analysis of Computer
    Algorithms, §3.2 — tree isomorphism by bottom-up canonical labels of children multisets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from censusdp.hierarchy.core import Hierarchy

__all__ = ["ShapeClasses", "shape_classes"]


@dataclass(frozen=True, eq=False)
class ShapeClasses:
    """The quotient forest of a hierarchy's downward shape classes.

    Classes of a level are sorted by parent class, so the children of a class are a
    contiguous range of the level below (the layout of :class:`~censusdp.hierarchy.forest.Forest`).

    Attributes
    ----------
    names : tuple of str
        The hierarchy's level names.
    sizes : tuple of int
        Number of classes per level.
    child_count : tuple of numpy.ndarray
        For every level but the last, the number of distinct child classes of each class.
    multiplicity : tuple of numpy.ndarray
        Per level, for each class the number of children of its parent's node (any one) that
        are in it; ones at the first level.
    weight : tuple of numpy.ndarray
        Per level, the number of hierarchy nodes in each class (int64).
    node_class : tuple of numpy.ndarray
        Per level, the class of every hierarchy node (int64).
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    child_count: tuple[np.ndarray, ...]
    multiplicity: tuple[np.ndarray, ...]
    weight: tuple[np.ndarray, ...]
    node_class: tuple[np.ndarray, ...]

    @property
    def depth(self) -> int:
        return len(self.sizes)

    def parent(self, j: int) -> np.ndarray:
        """Parent class of every class of level ``j`` ≥ 1."""
        return np.repeat(np.arange(self.sizes[j - 1], dtype=np.int64), self.child_count[j - 1])

    def n_nodes(self) -> tuple[int, ...]:
        """Nodes per level of the hierarchy the classes describe."""
        return tuple(int(w.sum()) for w in self.weight)


def _multiset_ids(parent: np.ndarray, child_sig: np.ndarray, n_parents: int) -> np.ndarray:
    """Canonical id of the multiset of children's signatures of every parent.

    Each parent's distinct (signature, count) pairs, sorted by signature, form one padded row;
    equal rows are equal multisets. Parents without children get the row of the empty set.
    """
    n_sig = int(child_sig.max(initial=-1)) + 1
    key = parent * n_sig + child_sig
    pairs, counts = np.unique(key, return_counts=True)
    p, s = pairs // max(n_sig, 1), pairs % max(n_sig, 1)
    per_parent = np.bincount(p, minlength=n_parents)
    width = int(per_parent.max(initial=0))
    start = np.concatenate([[0], np.cumsum(per_parent)[:-1]])
    pos = np.arange(p.size) - start[p]
    rows = np.full((n_parents, 2 * width + 1), -1, dtype=np.int64)
    rows[:, 0] = per_parent
    rows[p, 1 + 2 * pos] = s
    rows[p, 2 + 2 * pos] = counts
    _, ids = np.unique(rows, axis=0, return_inverse=True)
    return ids.reshape(-1).astype(np.int64)


def _upward_signatures(child_count: Sequence[np.ndarray], sizes: Sequence[int]) -> list[np.ndarray]:
    """Per level, the canonical id of every node's subtree shape (leaves: all 0)."""
    D = len(sizes)
    sig: list[np.ndarray] = [np.empty(0, np.int64)] * D
    sig[D - 1] = np.zeros(sizes[D - 1], np.int64)
    for j in range(D - 2, -1, -1):
        parent = np.repeat(np.arange(sizes[j], dtype=np.int64), child_count[j])
        sig[j] = _multiset_ids(parent, sig[j + 1], sizes[j])
    return sig


def shape_classes(hierarchy: Hierarchy) -> ShapeClasses:
    """The downward shape classes of ``hierarchy`` (see the module docstring).

    Parameters
    ----------
    hierarchy : Hierarchy

    Returns
    -------
    ShapeClasses
        Two nodes of a level are in one class iff their subtrees have the same shape and
        their parents are in one class (the roots: iff their subtrees have the same shape).
    """
    levels = hierarchy.levels
    D = hierarchy.depth
    sizes = [lv.size for lv in levels]
    counts = [np.asarray(levels[j].child_count, np.int64) for j in range(D - 1)]
    up = _upward_signatures(counts, sizes)
    node_class: list[np.ndarray] = []
    parent_class: list[np.ndarray] = []
    _, first = np.unique(up[0], return_inverse=True)
    node_class.append(first.reshape(-1).astype(np.int64))
    parent_class.append(np.empty(0, np.int64))
    for j in range(1, D):
        par = np.repeat(np.arange(sizes[j - 1], dtype=np.int64), counts[j - 1])
        n_up = int(up[j].max(initial=-1)) + 1
        key = node_class[j - 1][par] * n_up + up[j]
        uniq, inv = np.unique(key, return_inverse=True)
        node_class.append(inv.reshape(-1).astype(np.int64))
        parent_class.append(uniq // max(n_up, 1))
    weight = tuple(np.bincount(c, minlength=int(c.max(initial=-1)) + 1) for c in node_class)
    n_classes = [w.size for w in weight]
    child_count = tuple(
        np.bincount(parent_class[j + 1], minlength=n_classes[j]).astype(np.int64)
        for j in range(D - 1)
    )
    mult = [np.ones(n_classes[0], np.int64)]
    for j in range(1, D):
        pw = weight[j - 1][parent_class[j]]
        mult.append(weight[j] // pw)  # exact: every node of the parent class has as many
    return ShapeClasses(
        names=tuple(hierarchy.names),
        sizes=tuple(n_classes),
        child_count=child_count,
        multiplicity=tuple(mult),
        weight=weight,
        node_class=tuple(node_class),
    )
