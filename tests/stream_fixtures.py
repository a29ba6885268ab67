"""Shared by the streamed structured GLS tests: a small schema problem, a streamed run of it
collecting the pieces, and the bit-for-bit comparison with the in-memory release."""

from __future__ import annotations

import numpy as np

from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.product_measure import (
    ProductMeasurement,
    measure_products,
    product_invariant,
)
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.partition import partition_units
from censusdp.pipelines.structured_stream import StreamOptions, given_values, structured_stream
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

SEX_AGE = ["total", "sex * ageband", "age65", "detailed", "sex"]


def problem(schema_name="sex_age5", fan=((2, 3), (2, 4), (1, 3)), seed=0, texts=SEX_AGE):
    """(schema, hierarchy, measurements, invariants) of a random tree and histogram."""
    return problem_with_counts(schema_name, fan, seed, texts)[:4]


def problem_with_counts(schema_name="sex_age5", fan=((2, 3), (2, 4), (1, 3)), seed=0,
                        texts=SEX_AGE):  # fmt: skip
    """:func:`problem` and the exact counts per level; the noise is drawn with
    ``KeyedRNG.reproducible(seed)``."""
    s = Schema.load(schema_name)
    gen = np.random.default_rng(seed)
    h = random_hierarchy(gen, list(fan))
    counts = h.aggregate(gen.integers(0, 9, size=(h.leaves.size, *s.shape)))
    lc = dict(zip(h.names, counts, strict=True))
    plan = []
    for k, name in enumerate(h.names):
        for i, t in enumerate(texts):
            if k == 0 and t == "total":
                continue  # invariant at the root
            plan.append((name, ProductQuery.parse(s, t), Gaussian(1.0 + 0.5 * ((i + k) % 3))))
    meas = measure_products(lc, plan, KeyedRNG.reproducible(seed, warn=False))
    invs = [product_invariant(lc, "L0", ProductQuery.parse(s, "total"))]
    return s, h, meas, invs, counts


def stream(h: Hierarchy, s, meas, invs, cut: int, n_parts: int, measure=None, **kw):
    """The streamed run with placeholders below the cut (their values from ``measure``,
    default :func:`given_values`) and ``kw`` its :class:`StreamOptions`; pieces collected per
    partition."""
    parts = partition_units(h, cut, n_parts)
    heads = [
        m
        if h.level_index(m.level) < cut
        else ProductMeasurement(m.level, m.query, np.empty((0, m.query.n_rows)), m.law)
        for m in meas
    ]
    pieces = {}
    res = structured_stream(
        h, s, heads, measure or given_values(meas, h, cut), parts, invs,
        lambda p: pieces.__setitem__(p.partition, p), StreamOptions(**kw),
    )  # fmt: skip
    return res, pieces, parts


def assert_same(h, rel, res, pieces, parts, cut):
    """Every level of the streamed run equals the in-memory release bit for bit."""
    for k in range(cut + 1):
        assert np.array_equal(res.top.estimates[k], rel.estimates[k])
        for mask, b in rel.covariances[k].blocks.items():
            assert np.array_equal(np.broadcast_to(res.top.covariances[k].blocks[mask], b.shape), b)
    assert sorted(pieces) == [p.index for p in parts]
    for p in parts:
        piece = pieces[p.index]
        for j, k in enumerate(range(cut + 1, h.depth)):
            lo, hi = p.range(k)
            assert np.array_equal(piece.estimates[j], rel.estimates[k][lo:hi])
            for mask, b in rel.covariances[k].blocks.items():
                assert np.array_equal(piece.covariances[j].blocks[mask], b[lo:hi])
