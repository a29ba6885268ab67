"""Figures held by an invariant are released with their exact value and ``_se`` exactly 0
(issue 33: the PPMF state total's ``_se`` was written as 2.4e-07, the GLS's float error).

Which entries are held is derived from the invariants, never from a standard error:
:func:`~censusdp.pipelines.release_statement.held_nodes` (the held levels, the levels above
them, only children of held nodes), checked against a node-by-node reference on random
hierarchies; :func:`~censusdp.pipelines.products.ppmf_persons.held_pl94_columns` (columns in the row
space of the invariant's query), checked against the all-ones rows; and one PPMF release
through the CLI whose second state has a single county (held through its state, as DC is).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from ppmf_fixtures import ppmf_persons

from censusdp.app.cli import main
from censusdp.hierarchy import Hierarchy
from censusdp.pipelines.io.ppmf import read_ppmf
from censusdp.pipelines.products.pl94_tables import pl94_codebook, tabulate
from censusdp.pipelines.products.ppmf_persons import (
    column_standard_errors,
    held_pl94_columns,
    invariant_columns,
)
from censusdp.pipelines.release_statement import exact_through_invariants, held_nodes


def _hierarchy(seed: int, depth: int) -> Hierarchy:
    """A random hierarchy of ``depth`` levels, many nodes with a single child."""
    gen = np.random.default_rng(seed)
    names, codes, parents = ["l0"], [np.array(["r"])], [np.zeros(1, np.int64)]
    n = 1
    for k in range(1, depth):
        kids = gen.choice([1, 1, 2, 3], size=n)
        par = np.repeat(np.arange(n), kids)
        names.append(f"l{k}")
        codes.append(np.array([f"{k}-{i}" for i in range(par.size)]))
        parents.append(par)
        n = par.size
    return Hierarchy.from_parents(names, codes, parents)


def _reference(h: Hierarchy, held: set[int]) -> list[np.ndarray]:
    """Node by node: exact when its level is held, when every child is exact (a sum), or
    when it is the only child of an exact node; iterated to a fixed point."""
    exact = [np.full(h.sizes[k], k in held) for k in range(h.depth)]
    changed = True
    while changed:
        changed = False
        for k in range(h.depth):
            for i in range(h.sizes[k]):
                if exact[k][i]:
                    continue
                kids = [] if k + 1 == h.depth else np.flatnonzero(h.levels[k + 1].parent == i)
                par = None if k == 0 else h.levels[k].parent[i]
                if (len(kids) and all(exact[k + 1][c] for c in kids)) or (
                    par is not None and exact[k - 1][par] and h.levels[k - 1].child_count[par] == 1
                ):
                    exact[k][i] = changed = True
    return exact


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    depth=st.integers(2, 5),
    held=st.sets(st.integers(0, 4), max_size=2),
    cut=st.integers(0, 5),
)
def test_held_nodes_equal_a_node_by_node_reference(seed, depth, held, cut) -> None:
    h = _hierarchy(seed, depth)
    held = {k for k in held if k < depth}
    want = _reference(h, held)
    for k in range(depth):
        assert np.array_equal(held_nodes(h, sorted(held), k), want[k])
        lo = min(cut, h.sizes[k])  # a node range, as a partition gives it
        assert np.array_equal(held_nodes(h, sorted(held), k, lo, h.sizes[k]), want[k][lo:])
    # below the held levels, the nodes it marks are the only children the statement names
    if held:
        pairs = [(h.names[k], "total") for k in held]
        deepest = max(held)
        below = {h.names[k] for k in range(deepest + 1, depth)}
        named = {
            s.split(" (")[0] for s in exact_through_invariants(h, pairs) if s.split(" ")[0] in below
        }
        marked = {
            f"{h.names[k]} {c}"
            for k in range(deepest + 1, depth)
            for c in np.asarray(h.levels[k].codes)[want[k]]
        }
        assert marked == named


def test_the_total_holds_exactly_the_whole_population_columns() -> None:
    book = pl94_codebook()
    held = held_pl94_columns("total")
    rows = tabulate(np.eye(book.schema.n_cells, dtype=np.int64).reshape(-1, *book.schema.shape))
    ones = (rows == 1).all(axis=0)  # a column counting every cell: the total
    assert np.array_equal(held, ones)
    assert [c for c, m in zip(book.columns, held, strict=True) if m] == ["P1_001N", "P2_001N"]


def _blocks():
    out = []
    for st_, counties in (("01", ("001", "003")), ("02", ("005",))):  # 02: one county
        for cou in counties:
            for tract in ("000100", "000200"):
                out += [(st_, cou, tract, "1", f"1{b:03d}") for b in range(2)]
    return out


SPEC = """
[data]
source = "ppmf"
[privacy]
accounting = "zcdp"
rho = 2.0
[report]
repetitions = 2
"""


def test_invariant_figures_have_exact_values_and_se_exactly_zero(tmp_path: Path) -> None:
    frame = ppmf_persons(np.random.default_rng(5), 800, _blocks(), household_share=0.9)
    data = tmp_path / "ppmf.csv"
    frame.to_csv(data, index=False)
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    argv = ["privatize", str(data), "--spec", str(spec), "-o", str(out), "--seed", "4",
            "--blocks-from-data"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    hist = read_ppmf(data)
    h = hist.hierarchy
    truth = h.aggregate(hist.dense().reshape(h.leaves.size, -1))
    whole = ["P1_001N", "P2_001N"]
    for k, level in enumerate(h.names):
        t = pd.read_csv(out / "unbiased" / f"pl94_{level}.csv", dtype={"GEOID": str})
        held = held_nodes(h, ["nation", "state"], level)
        if k > h.level_index("state"):  # below the states: only county 02005, alone in 02
            assert np.array_equal(held, (t.GEOID == "02005").to_numpy())
        for c in whole:
            assert (t[c].to_numpy()[held] == truth[k].sum(axis=1)[held]).all()
            assert (t[f"{c}_se"].to_numpy()[held] == 0).all()
            assert (t[f"{c}_moe"].to_numpy()[held] == 0).all()
            assert (t[f"{c}_se"].to_numpy()[~held] > 0).all()
        # no other column is held: the voting-age population has an error at every node
        assert (t["P3_001N_se"] > 0).all()
    county = pd.read_csv(out / "unbiased" / "pl94_county.csv", dtype={"GEOID": str})
    assert county.set_index("GEOID").loc["02005", "P1_001N_se"] == 0  # as DC: alone in its state
    assert held_nodes(h, ["nation", "state"], "tract").sum() == 0  # 02005 has two tracts


class _Piece:
    """A GLS piece of ``n`` nodes whose every standard error is a solver's float error."""

    def __init__(self, n: int) -> None:
        self.n = n

    def query_standard_errors(self, level, q):
        return np.full((self.n, q.n_rows), 2.4e-07)


def test_column_standard_errors_zeroes_held_entries_only() -> None:
    h = _hierarchy(0, 3)  # 3 nodes of l1, 5 of l2, one an only child
    n = h.sizes[2]
    held = invariant_columns(h, "l2", 0, n, invariants=(("l1", "total"),))
    assert 0 < held.any(axis=1).sum() < n  # some only children, not all
    se = column_standard_errors(_Piece(n), "l2", held=held)
    cols = held_pl94_columns("total")
    assert (se[:, cols][held[:, cols]] == 0).all()
    assert (se[~held] == 2.4e-07).all()
    assert np.array_equal(held.any(axis=1), held_nodes(h, ["l1"], "l2"))
