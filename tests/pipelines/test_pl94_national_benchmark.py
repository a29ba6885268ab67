"""``benchmarks/pl94_national.py`` on a tiny synthetic U.S.: both products made and checked,
their integers the same for two partitionings under a memory budget, ``--products``
parsed with a clear refusal."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import pl94_national as bench  # noqa: E402

from censusdp.pipelines.execute import open_executor  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    """Three states (a county each), 164 blocks."""
    table = bench.geography(2e-5, 0, states=3)
    return table.hierarchy, table.leaf_counts[:, 0]


def _args(tmp: Path, **kw) -> argparse.Namespace:
    base = dict(seed=0, partitions=0, cache_mb=1024.0, histograms=False, address="",
                products=bench.PRODUCTS, memory_gb=4.0)  # fmt: skip
    return argparse.Namespace(**(base | kw))


def test_both_products_are_checked_and_do_not_depend_on_the_partitioning(tiny, tmp_path) -> None:
    h, pop = tiny
    runs = []
    for i, kw in enumerate(({"partitions": 1}, {"partitions": 3, "memory_gb": 0.6})):
        with open_executor("threads", workers=2) as ex:
            runs.append(bench.run(_args(tmp_path, **kw), h, pop, ex, tmp_path / str(i)))
    assert [r["partitions"] for r in runs] == [1, 3]
    for r in runs:
        u, nn = r["checks"], r["checks_nonnegative"]
        assert u["every_cell_floor_or_ceil"] and nn["every_cell_non_negative"]
        for c in (u, nn):
            assert c["invariants_exact"] and c["children_sum_to_parent_cell_by_cell"]
            assert c["every_level_total_equals_the_persons"]
            assert c["table_identities_exact_at_every_node"]
        assert r["store_verified"]
    assert runs[0]["digest"] == runs[1]["digest"]
    fp = [(r["checks"]["integers_fingerprint"], r["checks_nonnegative"]["integers_fingerprint"])
          for r in runs]  # fmt: skip
    assert fp[0] == fp[1] and fp[0][0] != fp[0][1]
    one = _args(tmp_path, products=("unbiased",))
    with open_executor("threads", workers=2) as ex:
        alone = bench.run(one, h, pop, ex, tmp_path / "u")
    assert alone["digest"] == runs[0]["digest"] and alone["checks_nonnegative"] is None


def test_products_flag_names_what_it_accepts() -> None:
    assert bench._products("unbiased,nonnegative") == ("unbiased", "nonnegative")
    assert bench._products("unbiased") == ("unbiased",)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown: microdata"):
        bench._products("unbiased,microdata")
    with pytest.raises(argparse.ArgumentTypeError, match="give unbiased"):
        bench._products("nonnegative")


def test_partitions_are_sized_by_the_budget_and_interleaved(tiny) -> None:
    h, _ = tiny
    big, order = bench.partitioning(h, 4 << 30, 2)
    small, _ = bench.partitioning(h, bench.BASE_BYTES + 2 * 40 * bench.BLOCK_BYTES, 2)
    assert len(small) > len(big)  # at most 40 blocks each, whole counties allowing
    sizes = [big[i].leaves for i in order]
    assert sorted(order) == list(range(len(big)))
    assert sizes[0] == max(sizes) and (len(sizes) < 2 or sizes[1] == min(sizes))
