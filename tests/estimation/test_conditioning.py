"""The conditioning estimator: exact invariants, integer releases, certificates, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from censusdp.errors import ConvergenceError
from censusdp.estimation.conditioning.estimator import ConditioningOptions, certificate, condition
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.discrete import DiscreteLaplace
from censusdp.mechanisms.laws import Gaussian, Laplace
from censusdp.mechanisms.queries import Query, invariant, measure
from censusdp.rng import KeyedRNG

CELLS = ["n"]


def _setup(rng, law):
    h = Hierarchy.from_parents(["root", "unit"], [["R"], ["a", "b", "c", "d"]], [None, np.zeros(4)])
    x = np.array([[4], [0], [9], [2]])
    lv = h.aggregate(x)
    ms = measure(h.names, lv, [(1, Query.detailed(CELLS), law)], rng)
    inv = [invariant(lv, 0, Query.total(CELLS))]
    return h, lv, ms, inv, None  # None: the statement is derived from the measurements


@pytest.mark.parametrize("law", [Laplace(1.0), DiscreteLaplace(1)])
def test_release_is_consistent_and_certified(rng, law):
    h, lv, ms, inv, priv = _setup(rng, law)
    rel = condition(h, CELLS, ms, inv, priv, rng, ConditioningOptions(n_coupled_pairs=100))
    assert rel.estimator == "conditioning"
    assert rel.diagnostics["tv_bound"] < 0.01
    assert rel.diagnostics["burn_in"] >= 0 and rel.diagnostics["lag"] >= 1
    assert np.isfinite(rel.diagnostics["rhat_max"])
    assert any("TV bound" in note for note in rel.privacy.notes)
    cert = certificate(rel)
    assert json.loads(json.dumps(cert)) == cert
    assert cert["tv_bound"] == rel.diagnostics["tv_bound"] and cert["kernel"] == "gibbs"
    assert cert["meeting_time_quantiles"][-1] >= cert["meeting_time_quantiles"][0]
    assert not rel.privacy.data_dependent
    np.testing.assert_allclose(rel.estimates[0], h.aggregate(rel.estimates[1])[0])
    if law.is_integer:
        assert rel.integer and rel.estimates[1].dtype == np.int64
        assert np.array_equal(rel.estimates[0], lv[0])
    else:
        assert abs(rel.estimates[0][0, 0] - lv[0][0, 0]) < 1e-9


def test_average_of_draws_and_nonnegativity_flag(rng):
    h, lv, ms, inv, priv = _setup(rng, Laplace(1.0))
    rel = condition(
        h,
        CELLS,
        ms,
        inv,
        priv,
        rng,
        ConditioningOptions(
            n_draws=8,
            nonnegative=True,
            n_coupled_pairs=100,
            start=np.array([[4.0], [1.0], [8.0], [2.0]]),
        ),
    )
    assert np.all(rel.estimates[1] >= 0)
    assert rel.privacy.data_dependent
    assert rel.diagnostics["mcse_leaf"].shape == (4, 1)
    assert abs(rel.estimates[0][0, 0] - lv[0][0, 0]) < 1e-9


def test_unreachable_bound_raises_convergence_error(rng):
    h, lv, ms, inv, priv = _setup(rng, Laplace(1.0))
    opts = ConditioningOptions(lag=1, max_iterations=3, n_coupled_pairs=100)
    with pytest.raises(ConvergenceError, match="max_iterations"):
        condition(h, CELLS, ms, inv, priv, rng, opts)


def test_gaussian_path_reuses_gls(rng):
    gls = pytest.importorskip("censusdp.estimation.gls.tree")
    h, lv, ms, inv, priv = _setup(rng, Gaussian(1.0))
    mean = condition(h, CELLS, ms, inv, priv, rng, ConditioningOptions(n_draws=2))
    ref = gls.tree_gls(h, CELLS, ms, inv, priv)
    np.testing.assert_allclose(mean.estimates[1], ref.estimates[1])
    draw = condition(h, CELLS, ms, inv, priv, rng)
    assert abs(draw.estimates[0][0, 0] - lv[0][0, 0]) < 1e-9
    assert not np.allclose(draw.estimates[1], ref.estimates[1])


@pytest.mark.slow
def test_conditioning_accepts_a_schema_histogram_through_its_product_queries(rng):
    """A schema histogram (sex × age band, 6 cells, an "adult" recode) measured by product
    queries goes through conditioning as flat queries (``ProductQuery.to_query``, small
    schemas): the integer release is consistent, meets the invariant ``==``, and every
    marginal table of it is an integer table whose units sum to the root's."""
    from censusdp.mechanisms.product_query import ProductQuery
    from censusdp.schema import Schema

    s = Schema.from_dict(
        {
            "name": "sex_age3",
            "attributes": [
                {"name": "sex", "labels": ["M", "F"]},
                {
                    "name": "age",
                    "labels": ["0-17", "18-64", "65+"],
                    "recodes": [
                        {"name": "adult", "groups": {"no": ["0-17"], "yes": ["18-64", "65+"]}}
                    ],
                },
            ],
        }
    )
    h = Hierarchy.from_parents(["root", "unit"], [["R"], ["a", "b"]], [None, np.zeros(2)])
    lv = h.aggregate(np.array([[3, 9, 2, 4, 8, 3], [0, 5, 1, 1, 6, 0]]))
    law = DiscreteLaplace(1)
    plan = [
        (1, ProductQuery.parse(s, "detailed").to_query(), law),
        (0, ProductQuery.parse(s, "sex * adult").to_query(), law),
    ]
    ms = measure(h.names, lv, plan, rng)
    inv = [invariant(lv, 0, ProductQuery.parse(s, "total").to_query())]
    rel = condition(h, s.cells, ms, inv, None, rng, ConditioningOptions(n_coupled_pairs=50))
    assert rel.integer and rel.diagnostics["tv_bound"] < 0.01
    assert rel.level(0).sum() == lv[0].sum()
    for text in ("sex * adult", "adult", "sex", "detailed"):
        q = ProductQuery.parse(s, text)
        units = q.apply(rel.level(1).reshape(-1, *s.shape))
        root = q.apply(rel.level(0).reshape(-1, *s.shape))
        assert units.dtype.kind == "i"
        np.testing.assert_array_equal(units.sum(axis=0), root[0])


def test_options_given_one_by_one_as_before_equal_conditioning_options():
    """The pre-ConditioningOptions keyword arguments still run (one release), over
    ``options``, and give the same release from the same key; an unknown one is refused."""
    h, lv, ms, inv, priv = _setup(KeyedRNG.reproducible(5, warn=False), Laplace(1.0))
    opts = ConditioningOptions(n_coupled_pairs=100, n_draws=2)
    a = condition(h, CELLS, ms, inv, priv, KeyedRNG.reproducible(6, warn=False), opts)
    b = condition(h, CELLS, ms, inv, priv, KeyedRNG.reproducible(6, warn=False),
                  ConditioningOptions(n_draws=2), n_coupled_pairs=100)  # fmt: skip
    assert all(np.array_equal(x, y) for x, y in zip(a.estimates, b.estimates, strict=True))
    assert a.diagnostics["n_draws"] == b.diagnostics["n_draws"] == 2
    with pytest.raises(TypeError, match="'n_chains'; its options are the fields of Conditioning"):
        condition(h, CELLS, ms, inv, priv, KeyedRNG.reproducible(6, warn=False), n_chains=4)
