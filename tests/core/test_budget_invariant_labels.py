"""A release is never labelled plain "differential privacy" when its estimator held invariants.

The audit: a caller's statement that omitted the invariants gave a plain-DP label. The
estimators now name the invariants they hold in the statement they return.
"""

from __future__ import annotations

import numpy as np

from censusdp.budget import PrivacyStatement, invariant_labels, statement_for, with_invariants
from censusdp.estimation import tree_gls
from censusdp.estimation.conditioning.estimator import condition
from censusdp.hierarchy import Hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.queries import Invariant, Measurement, Query
from censusdp.rng import KeyedRNG


def small():
    par = np.repeat(np.arange(3), 4)
    h = Hierarchy.from_parents(
        ["nation", "state", "county"],
        [["US"], ["01", "02", "03"], [f"{p:02d}{i:03d}" for i, p in enumerate(par)]],
        [None, np.zeros(3, int), par],
    )
    cells = ["a", "b"]
    counts = h.aggregate(np.arange(24, dtype=np.int64).reshape(12, 2) * 7 % 50)
    q, t = Query.detailed(cells), Query.total(cells)
    gen = np.random.default_rng(0)  # test noise only
    meas = [Measurement(2, q, counts[2] + gen.normal(0, 1, counts[2].shape), Gaussian(1.0))]
    inv = [Invariant(1, t, t.apply(counts[1]).astype(float))]
    return h, cells, meas, inv


def test_statement_without_invariants_is_corrected_by_the_estimator():
    h, cells, meas, inv = small()
    bare = statement_for("zcdp", 0.5)  # the caller forgot the invariants
    assert bare.guarantee == "differential privacy"
    rel = tree_gls(h, cells, meas, inv, bare)
    assert rel.privacy.invariants == ("state: total",)
    assert rel.privacy.guarantee == "induced subspace differential privacy"
    assert "plain DP" in rel.privacy.text() and "omitted" in rel.privacy.text()
    assert not rel.privacy.text().startswith("differential privacy")


def test_statement_with_invariants_is_kept_and_no_invariants_stays_plain_dp():
    h, cells, meas, inv = small()
    stated = statement_for("zcdp", 0.5, invariants={"state": "total"})
    rel = tree_gls(h, cells, meas, inv, stated)
    assert rel.privacy.invariants == ("state: total",)
    assert rel.privacy.notes == ()
    plain = tree_gls(h, cells, meas, [], statement_for("zcdp", 0.5))
    assert plain.privacy.guarantee == "differential privacy"


def test_partial_statement_gets_the_missing_invariant():
    h, cells, meas, inv = small()
    t = Query.total(cells)
    both = [*inv, Invariant(0, t, np.array([[float(inv[0].values.sum())]]))]
    labels = invariant_labels(h.names, both)
    assert labels == ("state: total", "nation: total")
    st = with_invariants(PrivacyStatement("zcdp", rho=0.5, invariants=("state: total",)), labels)
    assert st.invariants == ("state: total", "nation: total")
    assert "nation: total" in st.notes[-1]


def test_conditioning_names_the_invariants():
    h, cells, meas, inv = small()
    rel = condition(
        h, cells, meas, inv, statement_for("zcdp", 0.5), KeyedRNG.reproducible(1, warn=False)
    )
    assert rel.privacy.invariants == ("state: total",)
    assert rel.privacy.guarantee == "induced subspace differential privacy"
