"""Levels by name in the flat API (issue 34, build point 2).

A level named (``"state"``) and the same level by index (``1``) must give the same release,
bit for bit, through every public entry: ``measure``, ``invariant``, ``tree_gls``,
``round_release``, ``condition``, ``topdown`` and the ``Release`` accessors. An unknown name is
one SpecError (exit 2 at the CLI) naming the level and the known ones. Each equality has a
control: a *different* level gives a different result, so the comparison can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from censusdp.errors import CensusDPError, SpecError
from censusdp.estimation.conditioning.estimator import ConditioningOptions, condition
from censusdp.estimation.gls.tree import tree_gls
from censusdp.estimation.integer.laminar import round_release
from censusdp.estimation.topdown.flat import topdown
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.discrete import DiscreteGaussian, DiscreteLaplace
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.queries import (
    Invariant,
    Measurement,
    Query,
    at_level_indices,
    exactly_released,
    invariant,
    level_position,
    measure,
)
from censusdp.rng import KeyedRNG

NAMES = ("nation", "state", "county", "tract")


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit: same dtype, shape and bytes."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_release(r1, r2) -> bool:
    ok = all(_same(x, y) for x, y in zip(r1.estimates, r2.estimates, strict=True))
    if (r1.variances is None) != (r2.variances is None):
        return False
    if r1.variances is not None:
        ok = ok and all(_same(x, y) for x, y in zip(r1.variances, r2.variances, strict=True))
    return ok and r1.privacy.text() == r2.privacy.text()


@st.composite
def small_problems(draw):
    """A hierarchy of 2–4 levels (fan-out 1–3), K of 1–3 cells, integer counts."""
    depth = draw(st.integers(2, 4))
    names, codes, parents = [NAMES[0]], [["0"]], [None]
    n_prev = 1
    for k in range(1, depth):
        fan = draw(st.lists(st.integers(1, 3), min_size=n_prev, max_size=n_prev))
        par = np.repeat(np.arange(n_prev), fan)
        names.append(NAMES[k])
        codes.append([f"{k}-{i}" for i in range(par.size)])
        parents.append(par)
        n_prev = par.size
    h = Hierarchy.from_parents(names, codes, parents)
    K = draw(st.integers(1, 3))
    cells = tuple(f"c{j}" for j in range(K))
    seed = draw(st.integers(0, 2**16))
    leaves = np.random.default_rng(seed).integers(0, 40, size=(h.sizes[-1], K))
    measured = draw(st.lists(st.integers(0, depth - 1), min_size=1, max_size=depth, unique=True))
    if depth - 1 not in measured:
        measured.append(depth - 1)  # the leaves identify every cell
    held = draw(st.lists(st.integers(0, depth - 2), max_size=1, unique=True))
    return h, cells, h.aggregate(leaves), sorted(measured), held, seed


def _pipeline(h, cells, counts, levels, held, seed, *, by_name: bool):
    """measure → invariant → tree_gls → round_release with levels named or indexed."""
    lv = (lambda k: h.names[k]) if by_name else (lambda k: k)
    det, tot = Query.detailed(cells), Query.total(cells)
    rng = KeyedRNG.reproducible(seed, warn=False)
    plan = [(lv(k), det, DiscreteGaussian(3)) for k in levels]
    meas = measure(h.names, counts, plan, rng.child("measure"))
    inv = [invariant(counts, lv(k), tot, level_names=h.names) for k in held]
    rel = tree_gls(h, cells, meas, inv, covariance=True)
    integer = round_release(rel, rng.child("round"), method="totals", invariants=inv)
    return meas, inv, rel, integer


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems())
def test_name_and_index_give_identical_releases(problem):
    h, cells, counts, levels, held, seed = problem
    m1, i1, r1, z1 = _pipeline(h, cells, counts, levels, held, seed, by_name=True)
    m2, i2, r2, z2 = _pipeline(h, cells, counts, levels, held, seed, by_name=False)
    for a, b in zip(m1, m2, strict=True):
        assert a.level == b.level and a.level_name == b.level_name == h.names[a.level]
        assert _same(a.values, b.values)
    for a, b in zip(i1, i2, strict=True):
        assert a.label == b.label == f"{h.names[a.level]}: total"
        assert _same(a.values, b.values)
    assert _same_release(r1, r2)
    assert _same_release(z1, z2)
    for k, name in enumerate(h.names):  # the accessors, by name, index and negative index
        assert _same(r1.level(name), r1.level(k))
        assert _same(r1.level(name), r1.level(k - h.depth))
        assert _same(r1.standard_errors(name), r1.standard_errors(k))
        assert _same(z1.sum_variances(name, Query.total(cells)), z1.sum_variances(k, Query.total(cells)))  # fmt: skip


def test_a_different_level_gives_a_different_release():
    """Control: the equality above has power (resolving to the wrong level would show)."""
    h = Hierarchy.from_parents(
        NAMES[:3], [["0"], ["a", "b"], ["a1", "a2", "b1"]], [None, np.zeros(2, int), [0, 0, 1]]
    )
    cells = ("x", "y")
    counts = h.aggregate(np.array([[3, 5], [7, 1], [4, 4]]))
    det = Query.detailed(cells)
    a = measure(
        h.names, counts, [("county", det, Gaussian(1.0))], KeyedRNG.reproducible(1, warn=False)
    )
    b = measure(h.names, counts, [(1, det, Gaussian(1.0))], KeyedRNG.reproducible(1, warn=False))
    assert a[0].values.shape != b[0].values.shape  # state ≠ county: caught
    c = measure(h.names, counts, [(2, det, Gaussian(1.0))], KeyedRNG.reproducible(1, warn=False))
    assert _same(a[0].values, c[0].values)
    # keyed streams: the same index under another level's name draws other noise
    other = ("nation", "state", "borough")
    d = measure(other, counts, [(2, det, Gaussian(1.0))], KeyedRNG.reproducible(1, warn=False))
    assert not _same(a[0].values, d[0].values)


def _fixed():
    h = Hierarchy.from_parents(
        NAMES[:3],
        [["0"], ["a", "b"], ["a1", "a2", "b1", "b2"]],
        [None, np.zeros(2, int), np.array([0, 0, 1, 1])],
    )
    cells = ("x", "y")
    counts = h.aggregate(np.array([[3, 5], [7, 1], [4, 4], [0, 9]]))
    return h, cells, counts


def _estimator_inputs(by_name: bool, law):
    h, cells, counts = _fixed()
    lv = (lambda k: h.names[k]) if by_name else (lambda k: k)
    det, tot = Query.detailed(cells), Query.total(cells)
    plan = [(lv(k), det, law) for k in range(h.depth)]
    meas = measure(h.names, counts, plan, KeyedRNG.reproducible(5, warn=False))
    inv = [invariant(counts, lv(1), tot, level_names=h.names)]
    return h, cells, meas, inv


def test_topdown_by_name_equals_by_index():
    r = [topdown(*_estimator_inputs(b, DiscreteGaussian(2)), None) for b in (True, False)]
    assert _same_release(r[0], r[1])
    assert "state: total" in r[0].privacy.invariants


def test_condition_by_name_equals_by_index():
    r = [
        condition(*_estimator_inputs(b, Gaussian(2.0)), None, KeyedRNG.reproducible(9, warn=False))
        for b in (True, False)
    ]
    assert _same_release(r[0], r[1])


def test_condition_mcmc_by_name_equals_by_index():
    """The sampler path (discrete Laplace: certified Gibbs chains), not only the exact one."""
    opts = ConditioningOptions(n_coupled_pairs=20, n_rhat_chains=4, max_iterations=20_000)
    r = [
        condition(
            *_estimator_inputs(b, DiscreteLaplace(2.0)),
            None,
            KeyedRNG.reproducible(9, warn=False),
            opts,
        )
        for b in (True, False)
    ]
    assert r[0].estimator == "conditioning" and "tv_bound" in r[0].diagnostics
    assert _same_release(r[0], r[1])


def test_measurements_built_by_hand_with_a_name():
    """``Measurement("county", …)`` is resolved by the estimators like an index."""
    h, cells, meas, inv = _estimator_inputs(False, Gaussian(2.0))
    named = [Measurement(h.names[m.level], m.query, m.values, m.law) for m in meas]
    named_inv = [Invariant("state", i.query, i.values) for i in inv]
    assert named_inv[0].level_name == "state" and named_inv[0].label == "state: total"
    assert _same_release(tree_gls(h, cells, named, named_inv), tree_gls(h, cells, meas, inv))
    resolved = at_level_indices(h.names, named)
    assert [m.level for m in resolved] == [0, 1, 2]
    assert [m.level_name for m in resolved] == list(h.names)
    assert exactly_released(h.names, [("state", Query.total(cells))], [("county", Query.total(cells))]) == {"state": ("total",)}  # fmt: skip


def _one_line_naming(info, level: str, names) -> None:
    msg = str(info.value)
    assert isinstance(info.value, CensusDPError)  # the CLI maps these to exit 2
    assert "\n" not in msg and repr(level) in msg and str(list(names)) in msg, msg


def test_unknown_level_is_one_spec_error_everywhere():
    h, cells, meas, inv = _estimator_inputs(True, Gaussian(2.0))
    _, _, counts = _fixed()
    det = Query.detailed(cells)
    bad_m = [*meas, Measurement("tract", det, meas[-1].values, Gaussian(2.0))]
    bad_i = [Invariant("tract", inv[0].query, inv[0].values)]
    rel = tree_gls(h, cells, meas, inv)
    calls = [
        lambda: measure(
            h.names, counts, [("tract", det, Gaussian(1.0))], KeyedRNG.reproducible(1, warn=False)
        ),  # fmt: skip
        lambda: invariant(counts, "tract", det, level_names=h.names),
        lambda: tree_gls(h, cells, bad_m, inv),
        lambda: tree_gls(h, cells, meas, bad_i),
        lambda: round_release(rel, KeyedRNG.reproducible(1, warn=False), invariants=bad_i),
        lambda: condition(h, cells, meas, bad_i, None, KeyedRNG.reproducible(1, warn=False)),
        lambda: topdown(h, cells, bad_m, inv, None),
        lambda: rel.level("tract"),
        lambda: rel.standard_errors("tract"),
        lambda: rel.totals("tract"),
        lambda: rel.conf_int("tract"),
        lambda: topdown(h, cells, meas, bad_i, None),
        lambda: level_position(h.names, "tract"),
    ]
    for call in calls:
        with pytest.raises(SpecError) as info:
            call()
        _one_line_naming(info, "tract", h.names)
    with pytest.raises(SpecError, match="out of range"):
        level_position(h.names, 3)
    with pytest.raises(SpecError, match="level_names=h.names"):
        invariant(counts, "state", det)  # a name needs the names
    with pytest.raises(SpecError, match="give the level once"):
        Invariant("state", det, counts[1], level_name="county")
    with pytest.raises(SpecError, match="give the level once"):
        at_level_indices(h.names, [Invariant(1, det, counts[1], level_name="county")])


def test_invariant_from_a_mapping_of_levels():
    h, cells, counts = _fixed()
    tot = Query.total(cells)
    by_map = invariant(dict(zip(h.names, counts, strict=True)), "state", tot)
    by_names = invariant(counts, "state", tot, level_names=h.names)
    by_index = invariant(counts, 1, tot)
    assert by_map.level == by_names.level == by_index.level == 1
    assert by_map.level_name == by_names.level_name == "state" and by_index.level_name is None
    assert _same(by_map.values, by_index.values) and _same(by_names.values, by_index.values)
