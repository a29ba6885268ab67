"""Continuous (floating-point) noise is never silent: a run spec must acknowledge it, and every
privacy statement of a release made with it says it is not protected against floating-point
attacks (Mironov 2012); the exact discrete laws carry no such note."""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np
import pytest

from censusdp.budget import PrivacyStatement
from censusdp.errors import SpecError
from censusdp.estimation.gls.tree import tree_gls
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import FLOATING_POINT_NOTE, Gaussian, floating_point_note
from censusdp.mechanisms.queries import Query, measure
from censusdp.mechanisms.registry import law_info
from censusdp.mechanisms.subspace import projected_laplace
from censusdp.pipelines.specs import load_spec, parse_spec
from censusdp.rng import KeyedRNG


def _doc(noise: str, accounting: str, **mechanism) -> dict:
    budget = {"rho": 1.0} if accounting == "zcdp" else {"epsilon": 1.0}
    return {
        "data": {"source": "midwest"},
        "hierarchy": {"levels": ["region", "state", "county"]},
        "privacy": {"accounting": accounting, **budget},
        "queries": {"county": ["total"]},
        "mechanism": {"noise": noise, **mechanism},
    }


@pytest.mark.parametrize(("noise", "accounting"), [("gaussian", "zcdp"), ("laplace", "pure")])
def test_a_continuous_law_needs_the_acknowledgement(noise, accounting):
    with pytest.raises(SpecError) as err:
        parse_spec(_doc(noise, accounting), "s.toml")
    msg = str(err.value)
    for part in ("s.toml: mechanism.noise", "floating-point", "Mironov 2012", f"discrete_{noise}"):
        assert part in msg
    assert "allow_floating_point = true" in msg
    spec = parse_spec(_doc(noise, accounting, allow_floating_point=True), "s.toml")
    assert spec.mechanism.allow_floating_point and not law_info(spec.mechanism.noise).integer
    assert parse_spec(spec.to_dict(), "s.toml").mechanism == spec.mechanism


def test_the_acknowledgement_is_refused_where_it_means_nothing():
    with pytest.raises(SpecError, match="mechanism.allow_floating_point: 'discrete_gaussian'"):
        parse_spec(_doc("discrete_gaussian", "zcdp", allow_floating_point=True), "s.toml")
    with pytest.raises(SpecError, match="mechanism.allow_floating_point: expected true or false"):
        parse_spec(_doc("gaussian", "zcdp", allow_floating_point="yes"), "s.toml")
    spec = parse_spec(_doc("discrete_gaussian", "zcdp"), "s.toml")
    assert "allow_floating_point" not in spec.to_dict()["mechanism"]


def test_the_main_job_uses_an_exact_discrete_law():
    from censusdp.experiments.midwest_demo import SPEC

    spec = load_spec(SPEC)
    assert law_info(spec.mechanism.noise).integer and not spec.mechanism.allow_floating_point


def _release(law, mechanism: str):
    h = Hierarchy.from_parents(
        ["nation", "state"], [["US"], ["a", "b", "c"]], [None, np.zeros(3, int)]
    )
    counts = h.aggregate(np.array([[4], [5], [6]]))
    meas = measure(
        h.names, counts, [(1, Query.total(["x"]), law)], KeyedRNG.reproducible(1, warn=False)
    )
    return tree_gls(h, ["x"], meas, [], PrivacyStatement("zcdp", rho=0.5, mechanism=mechanism))


def test_every_release_made_with_a_continuous_law_says_so():
    from censusdp.mechanisms.discrete import DiscreteGaussian

    rel = _release(Gaussian(2.0), "gaussian")
    assert rel.privacy.notes.count(FLOATING_POINT_NOTE) == 1
    assert "Mironov 2012" in rel.privacy.text() and "Mironov 2012" in rel.privacy.to_dict()["text"]
    again = dataclasses.replace(rel, integer=False)  # a derived release: the note once
    assert again.privacy.notes.count(FLOATING_POINT_NOTE) == 1
    assert PrivacyStatement.from_dict(rel.privacy.to_dict()) == rel.privacy
    exact = _release(DiscreteGaussian(2.0), "discrete_gaussian")
    assert FLOATING_POINT_NOTE not in exact.privacy.notes and "Mironov" not in exact.privacy.text()
    plain = PrivacyStatement("pure", epsilon=1.0, mechanism="laplace")
    assert floating_point_note(plain).notes == (FLOATING_POINT_NOTE,)
    assert floating_point_note(floating_point_note(plain)) == floating_point_note(plain)


def test_the_real_valued_subspace_mechanisms_say_so():
    A = np.ones((1, 3))
    out = projected_laplace(
        None, np.array([1.0, 2.0, 3.0]), A, 1.0, KeyedRNG.reproducible(3, warn=False)
    )
    assert FLOATING_POINT_NOTE in out.privacy.notes


def test_a_run_with_an_acknowledged_continuous_law_carries_the_note(tmp_path):
    from censusdp.pipelines.data import load_data
    from censusdp.pipelines.runner import execute_spec

    data = tmp_path / "d.csv"
    data.write_text("fips,pop\n01001,10\n01003,20\n02001,5\n02002,7\n")
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(
        textwrap.dedent(
            f"""
            [data]
            source = "csv"
            path = "{data}"
            cells = ["pop"]
            [hierarchy]
            levels = ["nation", "state", "county"]
            codes = {{ state = "fips:2", county = "fips" }}
            [privacy]
            accounting = "pure"
            epsilon = 1.0
            level_shares = {{ nation = 0.2, state = 0.3, county = 0.5 }}
            [queries]
            nation = ["detailed"]
            state = ["detailed"]
            county = ["detailed"]
            [mechanism]
            noise = "laplace"
            allow_floating_point = true
            [estimators]
            run = ["gls", "topdown"]
            """
        )
    )
    spec = load_spec(spec_file)
    releases, _, _, manifest = execute_spec(spec, load_data(spec, None), seed=1, progress=False)
    for name in ("gls", "topdown"):
        assert FLOATING_POINT_NOTE in releases[name].privacy.notes
        assert "Mironov 2012" in manifest["privacy"][name]["text"]
