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


def zeros_problem(seed=0, fan=((2, 3), (2, 4), (1, 3)), p_zero=0.3):
    """:func:`problem` with structural zeros over the first axis (sex) at every level — a
    leaf's at random, a parent's the AND of its children's plus a few of its own (as the
    NMF's hhgq bounds nest) — and per-node variances (factors 1–3, one node unmeasured,
    +inf) for one query at every level but the root: ``(schema, hierarchy, measurements,
    invariants, zeros)``."""
    s, h, meas, invs = problem(fan=fan, seed=seed)
    gen = np.random.default_rng(seed + 1)
    d0 = s.shape[0]
    zs = [None] * h.depth
    zs[-1] = gen.random((h.leaves.size, d0)) < p_zero
    for j in range(h.depth - 2, -1, -1):
        both = np.ones((h.sizes[j], d0), bool)
        np.logical_and.at(both, h.levels[j + 1].parent, zs[j + 1])
        zs[j] = both | (gen.random(both.shape) < 0.1)
    zs[0][:] = False  # the root total is invariant: keep it free
    out = []
    for m in meas:
        k = h.level_index(m.level)
        if k and m.query.name == "sex * ageband":
            v = m.law.variance * gen.uniform(1.0, 3.0, size=h.sizes[k])
            v[gen.integers(h.sizes[k])] = np.inf
            m = ProductMeasurement(m.level, m.query, m.values, m.law, v)
        out.append(m)
    return s, h, out, invs, dict(zip(h.names, zs, strict=True))


def stream(h: Hierarchy, s, meas, invs, cut: int, n_parts: int, measure=None, **kw):
    """The streamed run with placeholders below the cut (their values from ``measure``,
    default :func:`given_values`) and ``kw`` its :class:`StreamOptions`; pieces collected per
    partition."""
    parts = partition_units(h, cut, n_parts)
    heads = [
        m
        if h.level_index(m.level) < cut
        else ProductMeasurement(
            m.level, m.query, np.empty((0, m.query.n_rows)), m.law, m.node_variance
        )
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
