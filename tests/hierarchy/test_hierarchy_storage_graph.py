"""Save/load round trips (npz, Parquet) and the networkx view."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from censusdp.errors import DataError, HierarchyError
from censusdp.hierarchy import (
    Table,
    load_hierarchy,
    load_table,
    save_hierarchy,
    save_table,
    synthetic_us,
    to_networkx,
)


@pytest.fixture(scope="module")
def table() -> Table:
    return synthetic_us(3, states=4, counties=9, tracts=20, blocks=200, population=5000)


@pytest.mark.parametrize("suffix", [".npz", ".parquet"])
def test_hierarchy_round_trip(tmp_path, table, suffix):
    path = save_hierarchy(table.hierarchy, tmp_path / f"h{suffix}")
    assert path.is_file()
    assert load_hierarchy(path) == table.hierarchy
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


@pytest.mark.parametrize("suffix", [".npz", ".parquet"])
def test_table_round_trip(tmp_path, table, suffix):
    back = load_table(save_table(table, tmp_path / f"t{suffix}"))
    assert back.hierarchy == table.hierarchy
    assert back.cells == table.cells
    assert np.array_equal(back.leaf_counts, table.leaf_counts)


def test_midwest_round_trip_parquet(tmp_path):
    t = Table.from_midwest()
    back = load_table(save_table(t, tmp_path / "m.parquet"))
    assert back.hierarchy == t.hierarchy and back.cells == t.cells
    assert np.array_equal(back.leaf_counts, t.leaf_counts)


def test_storage_errors(tmp_path, table):
    with pytest.raises(DataError, match="'.csv'"):
        save_hierarchy(table.hierarchy, tmp_path / "h.csv")
    save_hierarchy(table.hierarchy, tmp_path / "h.parquet")
    with pytest.raises(DataError, match="table"):
        load_table(tmp_path / "h.parquet")
    save_hierarchy(table.hierarchy, tmp_path / "h.npz")
    with pytest.raises(DataError, match="leaf_counts"):
        load_table(tmp_path / "h.npz")


def test_failed_write_leaves_target_untouched(tmp_path, table, monkeypatch):
    target = save_hierarchy(table.hierarchy, tmp_path / "h.npz")
    before = target.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError):
        save_hierarchy(table.hierarchy, target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["h.npz"]


def test_to_networkx_is_the_tree(table):
    h = table.hierarchy
    g = to_networkx(h)
    assert g.number_of_nodes() == sum(h.sizes)
    assert nx.is_arborescence(g)
    root = ("nation", "US")
    assert g.nodes[root] == {"level": 0, "index": 0}
    county = h["county"]
    for i in range(county.size):
        kids = [c for _, c in g.out_edges(("county", str(county.codes[i])))]
        lo = county.child_start[i]
        want = h["tract"].codes[lo : lo + county.child_count[i]].tolist()
        assert [c for _, c in kids] == want


def test_to_networkx_refuses_large_trees(table):
    with pytest.raises(HierarchyError, match="max_nodes=10"):
        to_networkx(table.hierarchy, max_nodes=10)
    assert to_networkx(table.hierarchy, max_nodes=None).number_of_nodes() == sum(
        table.hierarchy.sizes
    )
