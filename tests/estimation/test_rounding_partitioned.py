"""Rounding with invariants over partitions: the same integers, variances and sums' variances
as one process, bit for bit, for every partition count and cut; and through the pipeline's
estimator call (the audit's state × sex invariant run)."""

from __future__ import annotations

import numpy as np
import pytest

from censusdp.budget import PrivacyStatement
from censusdp.estimation.gls.tree import tree_gls
from censusdp.estimation.integer.laminar import round_release
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.discrete import DiscreteGaussian
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.pipelines.estimators import run_estimator
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.gls_partitioned import partitioned_gls, partitioned_round
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.spec import EstimatorSpec
from censusdp.rng import KeyedRNG

CELLS = [f"{s}{a}" for s in ("m", "f") for a in range(3)]
SEX = Query.marginal("sex", CELLS, {"male": "m*", "female": "f*"})


def problem(seed: int = 2):
    gen = np.random.default_rng(seed)
    h = random_hierarchy(gen, [(5, 5), (2, 4), (1, 3)])
    counts = h.aggregate(gen.integers(0, 30, (h.leaves.size, len(CELLS))))
    rng = KeyedRNG.reproducible(seed, warn=False)
    plan = [(k, Query.detailed(CELLS), DiscreteGaussian(2.0)) for k in range(1, h.depth)]
    plan += [(2, SEX, DiscreteGaussian(1.0))]
    meas = measure(h.names, counts, plan, rng.child("measure"))
    return h, counts, meas


def same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "mode,inv", [("cells", (1, SEX)), ("totals", (1, SEX)), ("totals", (2, "total"))]
)
def test_partitioned_rounding_with_invariants_equals_one_process(mode, inv):
    h, counts, meas = problem()
    q = Query.total(CELLS) if inv[1] == "total" else inv[1]
    invs = [invariant(counts, inv[0], q)]
    privacy = PrivacyStatement("zcdp", rho=1.0, invariants=(f"{h.names[inv[0]]}: {q.name}",))
    gls = tree_gls(h, CELLS, meas, invs, privacy, covariance=True)
    rng = KeyedRNG.reproducible(7, warn=False)
    want = round_release(gls, rng, method=mode, invariants=invs, queries=[SEX])
    assert np.array_equal(q.apply(want.estimates[inv[0]]), invs[0].values)
    with open_executor("threads") as ex:
        for cut in range(1, h.depth):
            for n in (1, 3, 11):
                parts = partition_units(h, cut, n)
                got = partitioned_round(
                    gls, rng, parts, ex, method=mode, invariants=invs, queries=[SEX]
                )
                assert same(got.estimates, want.estimates)
                assert same(got.variances, want.variances)
                assert same(got.sums.rounding, want.sums.rounding)
                assert same(got.sums.estimator, want.sums.estimator)
                assert got.diagnostics["invariants_exact"] == want.diagnostics["invariants_exact"]
                kept = partitioned_gls(h, CELLS, meas, invs, privacy, parts, ex, keep=True)
                r = partitioned_round(
                    kept, rng, parts, ex, method=mode, invariants=invs, queries=[SEX]
                )
                r = r.gather() if hasattr(r, "gather") else r  # cut at the leaves: plain
                assert same(r.estimates, want.estimates)
                assert same(r.sums.rounding, want.sums.rounding)
                kept.drop()


def test_pipeline_keeps_state_by_sex_margins_and_reports_their_standard_errors():
    """The audit's run: a state × sex invariant through the estimator call the runner makes,
    distributed over partitions: every margin exact, the statement's note computed."""
    h, counts, meas = problem(3)
    invs = [invariant(counts, 1, SEX)]
    privacy = PrivacyStatement("zcdp", rho=1.0, invariants=("L1: sex",))
    opts = EstimatorSpec()
    with open_executor("sync") as ex:
        rel = run_estimator(
            "gls",
            h,
            CELLS,
            meas,
            invs,
            privacy,
            KeyedRNG.reproducible(1, warn=False),
            opts,
            executor=ex,
            partitions=partition_units(h, 1, 3),
        )
    assert rel.integer
    assert np.array_equal(SEX.apply(rel.estimates[1]), invs[0].values)
    assert rel.diagnostics["invariants_exact"] == {"L1: sex": True}
    assert "every one exact" in rel.privacy.text()
    se = rel.sum_standard_errors(2, SEX)  # county sex margins: measured, tracked
    assert se.shape == (h.levels[2].size, 2) and np.all(np.isfinite(se))
    assert np.all(rel.sum_variances(1, SEX, rounding_only=True) == 0)  # the invariant's
