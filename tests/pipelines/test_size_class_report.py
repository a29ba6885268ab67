"""The size-class report (pipelines.size_class_report): the simulated bias and its standard
error recover a known bias (and find none where there is none, with power against a bias of
0.3 persons); exact area totals; the confidential evaluation written only when asked for."""

from __future__ import annotations

import numpy as np
import pytest

from censusdp.errors import DataError
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.pipelines.report import CONFIDENTIAL_LABEL
from censusdp.pipelines.size_class_report import (
    area_totals,
    evaluate_size_classes,
    simulate_size_classes,
    write_size_class_report,
)


def _pseudo(gen):
    sizes = np.concatenate(
        [np.zeros(400), gen.integers(1, 10, 400), gen.integers(10, 100, 400), [150, 2000]]
    )
    return {"block": sizes, "tract": sizes[:50] * 20}


def _replicate(pseudo, bias, gen):
    def run(r: int):
        return {
            "unbiased": {lv: v + gen.normal(0.0, 2.0, v.size) for lv, v in pseudo.items()},
            "nonnegative": {
                lv: v + bias + gen.normal(0.0, 2.0, v.size) for lv, v in pseudo.items()
            },
        }

    return run


@pytest.mark.parametrize("bias", [0.0, 0.3])
def test_simulated_bias_is_found_within_its_standard_error(bias):
    gen = np.random.default_rng(7)
    pseudo = _pseudo(gen)
    df = simulate_size_classes(pseudo, _replicate(pseudo, bias, gen), repetitions=40)
    block = df[(df["level"] == "block") & (df["n"] >= 400)]
    assert len(block) == 6  # 3 classes × 2 products
    for _, row in block.iterrows():
        want = bias if row["product"] == "nonnegative" else 0.0
        assert abs(row["mean_error"] - want) < 4 * row["bias_se"]
        # the SE is that of a mean of 40 × n errors of sd 2
        assert row["bias_se"] == pytest.approx(2.0 / np.sqrt(40 * row["n"]), rel=0.35)
    if bias:  # power: a bias of 0.3 persons is many standard errors away from 0
        nn = block[block["product"] == "nonnegative"]
        assert (nn["mean_error"] / nn["bias_se"] > 10).all()
    with pytest.raises(DataError, match="2 replicates"):
        simulate_size_classes(pseudo, _replicate(pseudo, bias, gen), repetitions=1)


def test_area_totals_are_exact_sums_of_the_leaves():
    gen = np.random.default_rng(3)
    h = random_hierarchy(gen, [(2, 3), (2, 4)])
    block = gen.integers(0, h.leaves.size, 200)
    count = gen.integers(1, 2**40, 200)
    got = area_totals(h, block, count)
    leaf = np.zeros(h.leaves.size, np.int64)
    for b, c in zip(block, count, strict=True):
        leaf[b] += c
    assert np.array_equal(got[h.names[-1]], leaf)
    for k in range(1, h.depth):
        assert np.array_equal(
            got[h.names[k - 1]], h.aggregate_up(k, got[h.names[k]][:, None])[:, 0]
        )


def test_report_files_and_the_confidential_evaluation_only_on_request(tmp_path):
    gen = np.random.default_rng(1)
    pseudo = _pseudo(gen)
    sim = simulate_size_classes(pseudo, _replicate(pseudo, 1.0, gen), repetitions=3)
    public = tmp_path / "public"
    public.mkdir()
    written = write_size_class_report(public, sim, repetitions=3)
    assert sorted(p.name for p in public.iterdir()) == [
        "size_classes.csv",
        "size_classes.md",
        "size_classes.png",
    ]
    assert all(p.stat().st_size > 0 for p in written)
    text = (public / "size_classes.md").read_text()
    assert "bias" in text and "CONFIDENTIAL" not in text
    ev = evaluate_size_classes(pseudo, _replicate(pseudo, 1.0, gen)(0))
    both = tmp_path / "both"
    both.mkdir()
    write_size_class_report(both, sim, repetitions=3, evaluation=ev)
    assert CONFIDENTIAL_LABEL in (both / "evaluation" / "size_classes.md").read_text()
    assert set(ev["product"]) == {"unbiased", "nonnegative"}
