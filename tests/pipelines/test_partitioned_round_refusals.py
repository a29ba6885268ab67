"""A leaf estimate that cannot be rounded into int64 is refused, whole or partitioned, by one
check (``check_finite``) naming level, node and cell, never the value."""

from __future__ import annotations

import numpy as np
import pytest

from censusdp.errors import DataError
from censusdp.estimation.gls.tree import tree_gls
from censusdp.estimation.integer.laminar import round_release
from censusdp.pipelines.execute import open_executor
from censusdp.pipelines.gls_partitioned import partitioned_round
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.partitioned_release import PartitionedRelease
from censusdp.rng import KeyedRNG
from tests.pipelines.test_gls_partitioned import _problem


@pytest.mark.parametrize(("bad", "what"), [(np.nan, "not finite"), (5e18, "exceeds")])
@pytest.mark.parametrize("method", ["cells", "bipartite"])
def test_bad_leaf_refused_whole_and_in_its_partition(bad, what, method):
    h, cells, meas, invs = _problem("diagonal")
    rel = tree_gls(h, cells, meas, invs, None)
    leaf = h.leaves.size - 3  # in the last partition, not the first
    rel.estimates[-1][leaf, 1] = bad
    rng = KeyedRNG.reproducible(1, warn=False)
    named = f"level 'block', node {h.leaves.codes[leaf]!r}, cell 'b'"
    with pytest.raises(DataError, match=what) as whole:
        round_release(rel, rng, method=method)
    msg = str(whole.value)
    assert named in msg and "5e+18" not in msg and "5000000000000000000" not in msg
    units = partition_units(h, 2, 3)
    with open_executor("sync") as ex:
        kept = PartitionedRelease.of(rel, units, ex)
        with pytest.raises(DataError, match=what) as part:
            partitioned_round(kept, rng, units, ex, method=method)
    assert str(part.value) == str(whole.value)
