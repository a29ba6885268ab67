"""A :class:`networkx.DiGraph` view of a hierarchy, built on demand.

The arrays of :class:`~censusdp.hierarchy.core.Hierarchy` are what numeric code uses; the
graph is for inspection, drawing and graph algorithms on small trees (one Python object per
node, so it refuses large trees unless asked).
"""

from __future__ import annotations

import networkx as nx

from censusdp.errors import HierarchyError
from censusdp.hierarchy.core import Hierarchy

__all__ = ["DEFAULT_MAX_NODES", "to_networkx"]

#: Largest tree :func:`to_networkx` builds without ``max_nodes=None``.
DEFAULT_MAX_NODES = 200_000


def to_networkx(h: Hierarchy, max_nodes: int | None = DEFAULT_MAX_NODES) -> nx.DiGraph:
    """Directed tree parent → child; node key ``(level_name, code)``.

    Node attributes: ``level`` (level index, root 0) and ``index`` (canonical index within
    the level). Children are added in canonical order.

    Parameters
    ----------
    max_nodes : int or None
        Refuse trees with more nodes (``None``: no limit).

    Raises
    ------
    HierarchyError
        The tree has more than ``max_nodes`` nodes.
    """
    n = sum(h.sizes)
    if max_nodes is not None and n > max_nodes:
        raise HierarchyError(
            f"the hierarchy has {n} nodes, more than max_nodes={max_nodes}; a graph holds one "
            "Python object per node: pass max_nodes=None to build it anyway, or take a "
            "subtree (Hierarchy.subtree)"
        )
    g = nx.DiGraph()
    keys: list[list[tuple[str, str]]] = []
    for k, lv in enumerate(h.levels):
        level_keys = [(lv.name, c) for c in lv.codes.tolist()]
        g.add_nodes_from((key, {"level": k, "index": i}) for i, key in enumerate(level_keys))
        if k:
            up = keys[-1]
            g.add_edges_from(zip([up[p] for p in lv.parent.tolist()], level_keys, strict=True))
        keys.append(level_keys)
    return g
