"""The national pass equals the whole nation's structured GLS to 1e-9 on only-child chains.

On seed 11 of the three-state synthetic nation (state 02: two spine counties, each an
only-child chain down to its blocks) the national pass was 2.5e-7 relative off the whole
nation's structured GLS in a county total's variance while the per-block eigensystems were
LAPACK's (absolute accuracy: an eigenvalue of a pseudo-inverse's small end is known only to
ε × the largest), so :mod:`tests.pipelines.test_nmf_release` compared them at 1e-5. With
:func:`~censusdp.estimation.gls.block_kernels.eigh` (cyclic Jacobi with the Demmel–Veselić
test: small eigenvalues to high relative accuracy) both agree to 1e-13 (measured; 2.5e-9
with ``numpy.linalg.eigh`` substituted in the kernel on the same run): here at 1e-9 of
the query's largest figure and variance. Power: the states' own GLS (no US level) is more
than ten times the tolerance off, so the comparison sees what the US level adds.
"""

from __future__ import annotations

import numpy as np
import pytest

from censusdp.estimation.gls.structured import structured_gls
from censusdp.hierarchy.synthetic import pl94_histogram, synthetic_us
from censusdp.pipelines.io.nmf import collect_nmf, read_nmf
from censusdp.pipelines.io.nmf_writer import simulate_nmf, write_nmf
from censusdp.pipelines.products.nmf_release import estimate_state, national_top, state_upward
from censusdp.rng import KeyedRNG

LEVELS = ("nation", "state", "state_part", "county", "tract", "block_group", "block")
QUERIES = ("total", "votingage * hispanic", "hhgq", "detailed")


@pytest.mark.parametrize("seed", [11])
def test_national_pass_equals_the_whole_nation_gls_to_1e9_on_only_child_chains(seed, tmp_path):
    st = synthetic_us(seed, states=3, counties=5, tracts=7, block_groups=9, blocks=24,
                      population=1800)  # fmt: skip
    h = st.hierarchy
    block, cell, count = pl94_histogram(st, seed=seed)
    aian = np.zeros(h["county"].size, bool)
    aian[h["county"].size - 1] = True
    subs = list(simulate_nmf(h, block, cell, count, aian_counties=aian,
                             evaluation_rng=KeyedRNG.reproducible(seed, warn=False)))  # fmt: skip
    root = write_nmf(tmp_path / "nmf", subs)
    state = h.ancestor_index("block", "state")[block]
    totals = {str(s): int(count[state == i].sum()) for i, s in enumerate(h["state"].codes)}
    parts: dict[str, list[str]] = {}
    for s in subs[1:]:
        parts.setdefault(s.subtree[1:], []).append(s.subtree)
    ups = [
        state_upward(collect_nmf(read_nmf(root, subtrees=p), {s: totals[s]}))
        for s, p in parts.items()
    ]
    (us,) = read_nmf(root, subtrees=["US"])
    top = national_top(us.levels[0], ups)
    states = [top.estimate_state(u) for u in ups]
    m = collect_nmf(subs, totals)
    meas = m.measurements()
    ref = structured_gls(m.spine.hierarchy, meas[0].query.schema, meas, m.invariants(),
                         zeros=m.zeros())  # fmt: skip
    est_scale = {q: max(np.abs(ref.query_estimates(lv, q)).max() for lv in LEVELS) for q in QUERIES}
    var_scale = {q: max(ref.query_variances(lv, q).max() for lv in LEVELS) for q in QUERIES}
    for level in LEVELS:
        for q in QUERIES:
            if level in ("nation", "state"):
                est = top.release.query_estimates(level, q)
                var = top.release.query_variances(level, q)
            else:
                est = np.concatenate([r.release.query_estimates(level, q) for r in states])
                var = np.concatenate([r.release.query_variances(level, q) for r in states])
            want, want_var = ref.query_estimates(level, q), ref.query_variances(level, q)
            assert np.abs(est - want).max() <= 1e-9 * est_scale[q], (level, q)
            assert np.abs(var - want_var).max() <= 1e-9 * var_scale[q], (level, q)
    # power: without the US level (each state's own GLS) the county variances move by
    # 2.3e-5 persons² (measured), over 10× the 1e-9 tolerance: the comparison sees the US level
    own = np.concatenate(
        [estimate_state(r.measurements).release.query_variances("county", "total") for r in states]
    )
    var = np.concatenate([r.release.query_variances("county", "total") for r in states])
    assert np.abs(own - var).max() > 1e-8 * var_scale["total"]
