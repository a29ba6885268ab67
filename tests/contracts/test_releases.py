"""Contract tests over the release family: every member answers the same questions the same way.

Every concrete subclass of :class:`~censusdp.estimation.release.ReleaseBase` (found by walking
``__subclasses__`` once the modules that define them are imported: a release type added later
is picked up, and fails :func:`test_every_release_type_has_a_builder` until it has a builder
here) is built on a small problem and checked, level by level:

- ``level``/``standard_errors``/``to_frame``: the frame's ``value`` and ``se`` are the level's
  estimates and standard errors, ``==``, in (node, cell) order with the node codes and cell
  labels; ``value`` int64 exactly when the release is integer;
- ``conf_int`` (default query) is ``estimate ∓ z_{1−α/2}·se`` exactly (``==``, NaN where
  a row is not identified), for α = 0.1 (the ``_moe`` level) and 0.01;
- ``query_standard_errors`` of the detailed (one-cell-per-row) query ``==`` ``standard_errors``;
- ``summary`` (by cell) matches ``to_frame``: nodes, the smallest value and the share of
  negative cells ``==``, the largest SE ``==``, the total and the mean SE to 1e-12 (float
  sums in another order; ``==`` for an integer release's total).

Power: the same checker rejects a release whose interval uses 1.64 for z, one whose frame
shuffles its SEs, and one whose summary counts one node too many.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

import censusdp.estimation.gls.areas
import censusdp.pipelines.products.codebook_hierarchy
import censusdp.pipelines.products.codebook_tables
import censusdp.pipelines.products.ppmf_units  # noqa: F401  (their release types join the family)
from censusdp.budget import PrivacyStatement
from censusdp.estimation.release import ReleaseBase, ReleaseProtocol

ALPHAS = (0.1, 0.01)


# ------------------------------------------------------------------------------ builders
def _flat():
    from release_fixtures import release_for, two_level

    gen = np.random.default_rng(21)  # test data only, not privacy noise
    h, cells, counts = two_level(gen)
    return release_for(gen, h, cells, counts)


def _flat_release():
    from censusdp.mechanisms.queries import Query

    rel = _flat()
    return rel, Query.detailed(rel.cells)


def _rounded_release():
    from censusdp.estimation.integer.laminar import round_release
    from censusdp.mechanisms.queries import Query
    from censusdp.rng import KeyedRNG

    rel = round_release(_flat(), KeyedRNG.reproducible(4, warn=False), method="totals")
    return rel, Query.detailed(rel.cells)


def _structured():
    from censusdp.estimation.gls.structured import structured_gls
    from censusdp.hierarchy.synthetic import random_hierarchy
    from censusdp.mechanisms.discrete import DiscreteGaussian
    from censusdp.mechanisms.product_measure import measure_products, product_invariant
    from censusdp.mechanisms.product_query import ProductQuery
    from censusdp.rng import KeyedRNG
    from censusdp.schema import Schema

    s = Schema.load("sex_age5")
    gen = np.random.default_rng(5)  # test data only, not privacy noise
    h = random_hierarchy(gen, [(2, 2), (1, 3)])
    counts = h.aggregate(gen.integers(0, 20, size=(h.leaves.size, *s.shape)))
    lc = dict(zip(h.names, counts, strict=True))
    q = {t: ProductQuery.parse(s, t) for t in ("total", "sex * ageband", "detailed")}
    plan = [(lvl, q[t], DiscreteGaussian(2)) for lvl in h.names for t in q]
    meas = measure_products(lc, plan, KeyedRNG.reproducible(3, warn=False))
    rel = structured_gls(h, s, meas, [product_invariant(lc, "L0", q["total"])])
    return rel, ProductQuery.parse(s, " * ".join(s.names))


def _structured_release():
    return _structured()


def _structured_piece():
    from censusdp.estimation.gls.marginal_basis import BlockDiagonal
    from censusdp.estimation.gls.structured import StructuredPiece

    rel, detailed = _structured()
    k = 1
    lo, hi = 1, rel.hierarchy.sizes[k]  # a piece: level L1 from its second node on
    cov = rel.covariances[k]
    blocks = BlockDiagonal(rel.basis, {m: b[lo:hi] for m, b in cov.blocks.items()})
    piece = StructuredPiece(
        (rel.hierarchy.names[k],), k, ((lo, hi),), rel.schema, rel.basis,
        (rel.estimates[k][lo:hi],), (blocks,), rel.identified, partition=0,
    )  # fmt: skip
    return piece, detailed


def _area_estimates():
    from censusdp.estimation.gls.areas import area_release
    from censusdp.hierarchy.equivalency import equivalency_from_arrays

    rel, detailed = _structured()
    codes = np.asarray(rel.hierarchy.leaves.codes, dtype=object)
    names = np.array([f"P{i % 2}" for i in range(codes.size)], dtype=object)
    eq = equivalency_from_arrays(rel.hierarchy, codes, names, name="place")
    return area_release(rel, eq), detailed


def _hierarchy_release():
    from censusdp.pipelines.products.codebook_hierarchy import release_hierarchy
    from censusdp.pipelines.products.codebook_tables import TablePlan
    from censusdp.rng import KeyedRNG
    from tests.pipelines.test_codebook_hierarchy import small_state
    from tests.pipelines.test_privatize_codebook import SMALL_STRATEGY

    cb, h, truth = small_state()
    plan = TablePlan.build(cb, 5.0, SMALL_STRATEGY)
    rel = release_hierarchy(
        plan, h, truth, KeyedRNG.reproducible(3, warn=False), invariants=[("state", "total")]
    )
    return rel, np.eye(len(rel.columns))


def _table_release():
    from censusdp.pipelines.products.codebook_tables import TablePlan, release_tables
    from censusdp.rng import KeyedRNG
    from tests.pipelines.test_privatize_codebook import SMALL_STRATEGY, small_codebook

    cb = small_codebook()
    plan = TablePlan.build(cb, 5.0, SMALL_STRATEGY)
    gen = np.random.default_rng(2)  # test data only, not privacy noise
    truth = cb.rows.apply(gen.poisson(3.0, size=(12, *cb.schema.shape)))
    areas = [f"A{i:02d}" for i in range(truth.shape[0])]
    table = release_tables(plan, truth, KeyedRNG.reproducible(6, warn=False), areas=areas)
    assert np.array_equal(table.release.standard_errors("area"), table.standard_errors)
    return table.release, np.eye(len(cb.columns))


def _h1_release(tmp_path: Path):
    from censusdp.pipelines.io.ppmf import read_ppmf_units
    from censusdp.pipelines.products.ppmf_units import H1_COLUMNS, release_h1
    from censusdp.rng import KeyedRNG
    from tests.pipelines.test_units_h1 import units_frame, write

    path = write(units_frame(np.random.default_rng(16), 300, 5), tmp_path / "units.csv")
    h1 = release_h1(read_ppmf_units(path), KeyedRNG.reproducible(5, warn=False))
    rel = h1.release
    for k in range(h1.hierarchy.depth):  # the view is the route's numbers, bit for bit
        assert np.array_equal(rel.standard_errors(k), h1.standard_errors[k])
        assert np.array_equal(rel.level(k), h1.counts[k])
    return rel, np.eye(len(H1_COLUMNS))


#: One builder per release type, by class name: (release, its detailed query) from a path.
BUILDERS = {
    "Release[gls]": lambda p: _flat_release(),
    "Release[rounded]": lambda p: _rounded_release(),
    "StructuredRelease": lambda p: _structured_release(),
    "StructuredPiece": lambda p: _structured_piece(),
    "AreaEstimates": lambda p: _area_estimates(),
    "HierarchyRelease": lambda p: _hierarchy_release(),
    "LevelRelease[codebook table]": lambda p: _table_release(),
    "LevelRelease[units H1]": _h1_release,
}


def _concrete_types() -> set[str]:
    """Every subclass of ReleaseBase in the library that a release is made of (BlockEstimates
    is a base; the tampered releases below are this file's)."""
    seen, todo = set(), [ReleaseBase]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__name__ != "BlockEstimates" and sub.__module__.startswith("censusdp."):
                seen.add(sub.__name__)
    return seen


def test_every_release_type_has_a_builder():
    covered = {name.split("[")[0] for name in BUILDERS}
    missing = _concrete_types() - covered
    assert not missing, f"release types without a contract builder: {sorted(missing)}"


# ------------------------------------------------------------------------------ the checker
def check_release(rel: ReleaseBase, detailed) -> None:
    """Every promise of the module docstring on one release (AssertionError if one fails)."""
    if type(rel).__name__ != "StructuredPiece":  # a partition's levels carry no statement
        assert isinstance(rel, ReleaseProtocol) and isinstance(rel.privacy, PrivacyStatement)
    frame = rel.to_frame()
    assert list(frame.columns) == ["level", "code", "cell", "estimator", "value", "se"]
    assert frame["value"].dtype == (np.int64 if rel.integer else np.float64)
    labels = np.asarray(rel.cell_labels, dtype=object)
    for name in rel.level_names:
        est = np.asarray(rel.level(name))
        n = est.shape[0]
        flat = est.reshape(n, -1)
        se = rel.standard_errors(name)
        assert se is not None and se.shape == est.shape
        part = frame[frame["level"] == name]
        assert np.array_equal(part["value"].to_numpy(), flat.reshape(-1))
        assert np.array_equal(part["se"].to_numpy(), np.reshape(se, -1), equal_nan=True)
        assert np.array_equal(part["cell"].to_numpy(), np.tile(labels, n))
        codes = np.repeat(np.asarray(rel.level_codes(name), dtype=object), labels.size)
        assert np.array_equal(part["code"].to_numpy(), codes)
        qse = rel.query_standard_errors(name, detailed)
        assert np.array_equal(qse, np.reshape(se, (n, -1)), equal_nan=True)
        q = rel.default_query
        mid = est if q is None else rel.query_estimates(name, q)
        qs = se if q is None else rel.query_standard_errors(name, q)
        for alpha in ALPHAS:
            z = float(norm.ppf(1.0 - alpha / 2.0))
            lo, hi = rel.conf_int(name, alpha)
            assert np.array_equal(lo, mid - z * qs, equal_nan=True)
            assert np.array_equal(hi, mid + z * qs, equal_nan=True)
    summary = rel.summary(detailed)
    assert list(summary.index) == list(rel.level_names)
    by = frame.groupby("level", sort=False)
    for name, row in summary.iterrows():
        part = by.get_group(name)
        values, ses = part["value"].to_numpy(np.float64), part["se"].to_numpy()
        ses = ses[np.isfinite(ses)]
        assert row["nodes"] == part["code"].nunique() == rel.level(name).shape[0]
        assert row["min_cell"] == values.min()
        assert row["negative_share"] == (values < 0).mean()
        assert row["max_se"] == ses.max()
        if rel.integer:
            assert row["total"] == int(part["value"].sum())
        else:
            assert row["total"] == pytest.approx(values.sum(), rel=1e-12, abs=1e-9)
        assert row["mean_se"] == pytest.approx(ses.mean(), rel=1e-12)


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_every_release_answers_consistently(kind: str, tmp_path: Path) -> None:
    rel, detailed = BUILDERS[kind](tmp_path)
    check_release(rel, detailed)


# ------------------------------------------------------------------------------ power
class _WrongZ(ReleaseBase):
    """A release whose intervals use z = 1.64 (a rounded quantile)."""

    def conf_int(self, level, alpha=0.1, *, query=None):
        se = self.standard_errors(level)
        return self.level(level) - 1.64 * se, self.level(level) + 1.64 * se


def _rewrap(rel, mixin):
    cls = type(f"Tampered{type(rel).__name__}", (mixin, type(rel)), {})
    return cls(**{f.name: getattr(rel, f.name) for f in dataclasses.fields(rel)})


class _ShuffledFrame(ReleaseBase):
    def to_frame(self, levels=None) -> pd.DataFrame:
        f = super().to_frame(levels)
        f["se"] = f["se"].to_numpy()[::-1]
        return f


class _ExtraNode(ReleaseBase):
    def summary(self, query=None) -> pd.DataFrame:
        s = super().summary(query)
        s["nodes"] = s["nodes"] + 1
        return s


@pytest.mark.parametrize("mixin", [_WrongZ, _ShuffledFrame, _ExtraNode])
def test_the_checker_rejects_a_wrong_release(mixin) -> None:
    rel, detailed = _flat_release()
    check_release(rel, detailed)  # the untampered one passes
    with pytest.raises(AssertionError):
        check_release(_rewrap(rel, mixin), detailed)
