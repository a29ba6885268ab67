"""Helpers shared by the rounding tests (tests/estimation/test_rounding_*.py)."""

from __future__ import annotations

import numpy as np

from censusdp.hierarchy import Hierarchy


def copies(h: Hierarchy, C: int) -> Hierarchy:
    """``C`` copies of ``h`` under one extra root."""
    names = ["copies", *h.names]
    codes: list = [["all"]]
    parents: list = [None]
    for k, lv in enumerate(h.levels):
        codes.append([f"{c}/{code}" for c in range(C) for code in lv.codes])
        if k == 0:
            parents.append(np.zeros(C, np.int64))
        else:
            n_up = h.levels[k - 1].size
            parents.append((np.arange(C)[:, None] * n_up + lv.parent[None, :]).reshape(-1))
    return Hierarchy.from_parents(names, codes, parents)
