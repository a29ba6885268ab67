"""The compiled transportation kernel (estimation.integer.transport_kernel).

Bit for bit (``np.array_equal``, and the same sweeps) against the vectorised numpy dual
block-coordinate ascent it replaced (kept here as the reference: every lane sorted, running
sums, all problems of a padded batch swept together and frozen as each converges), on
hypothesis batches (varied shapes, padding, zeros, ties, targets 0, problems that do not
converge) and on every batch the non-negative product meets on a synthetic pl94 state and on
the NMF route's synthetic state (structural zeros held at ``−M``); its threshold against
the definition ``Σ max(v − θ, 0) = total``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import censusdp.estimation.integer.nonnegative as nn
from censusdp.estimation.gls.predict import allocation_plan
from censusdp.estimation.gls.structured import structured_gls
from censusdp.estimation.integer.transport_kernel import (
    simplex_threshold,
    sort_descending,
    transport_batch,
)
from censusdp.hierarchy.synthetic import synthetic_state
from censusdp.pipelines.io.nmf import collect_nmf
from censusdp.pipelines.io.nmf_writer import simulate_nmf
from censusdp.pipelines.products.nmf_integers import nmf_integers
from censusdp.pipelines.products.nmf_release import estimate_state
from censusdp.pipelines.products.pl94_stream import SyntheticHistogram, measure_whole
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema
from tests.pipelines.test_nmf_integers import _state


def _threshold_ref(z: np.ndarray, total: np.ndarray) -> np.ndarray:
    """The numpy simplex threshold of every lane ``z[p, :, c]`` (``-inf`` padding)."""
    m = z.shape[1]
    u = -np.sort(-z, axis=1)
    finite = np.isfinite(u)
    css = np.cumsum(np.where(finite, u, 0.0), axis=1) - total[:, None, :]
    j = np.arange(1, m + 1, dtype=np.float64)[None, :, None]
    k = np.maximum(np.sum(finite & (u - css / j > 0.0), axis=1), 1)
    return np.take_along_axis(css, (k - 1)[:, None, :], axis=1)[:, 0, :] / k


def _transport_chunk_ref(z, r, s, tol, max_sweeps):
    """The numpy sweeps over a padded batch (``-inf`` outside each problem), every problem
    frozen at the first sweep that meets its tolerance; 0 sweeps and ``X = 0`` if none."""
    zt = np.ascontiguousarray(z.transpose(0, 2, 1))
    B, n, k = z.shape
    out = np.zeros((B, k, n))
    sweeps = np.zeros(B, np.int64)
    live = np.arange(B)
    b = np.zeros((B, k))
    for sweep in range(1, max_sweeps + 1):
        a = -_threshold_ref(zt + b[:, :, None], r)
        b = -_threshold_ref(z + a[:, :, None], s)
        xt = np.maximum(zt + b[:, :, None] + a[:, None, :], 0.0)
        res = np.abs(np.cumsum(xt, axis=1)[:, -1, :] - r).max(axis=1, initial=0.0)
        done = res <= tol
        if done.any():
            out[live[done]] = xt[done]
            sweeps[live[done]] = sweep
            keep = ~done
            if not keep.any():
                break
            live, z, zt, r, s, tol, b = (v[keep] for v in (live, z, zt, r, s, tol, b))
    return out.transpose(0, 2, 1), sweeps


def _assert_same(z, r, s, tol, n_rows, n_cols, max_sweeps):
    x, sw = transport_batch(z, r, s, tol, n_rows, n_cols, max_sweeps)
    x_ref, sw_ref = _transport_chunk_ref(z, r, s, tol, max_sweeps)
    assert np.array_equal(sw, sw_ref)
    assert np.array_equal(x, x_ref)
    return sw


@st.composite
def _batches(draw):
    """A padded batch: each problem's shape, values (normal, or a small grid with ties and
    zeros), integer targets with equal sums (some 0), padding beyond the largest problem."""
    B = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    ties = draw(st.booleans())
    gen = np.random.default_rng(seed)
    shapes = [(draw(st.integers(1, 5)), draw(st.integers(1, 6))) for _ in range(B)]
    n = max(a for a, _ in shapes) + draw(st.integers(0, 2))
    k = max(b for _, b in shapes) + draw(st.integers(0, 2))
    z = np.full((B, n, k), -np.inf)
    r, s = np.zeros((B, n)), np.zeros((B, k))
    for p, (np_, kp) in enumerate(shapes):
        if ties:
            v = gen.integers(-2, 3, size=(np_, kp)) * 0.5
        else:
            v = gen.normal(0.3, 2.0, size=(np_, kp)) * (gen.random((np_, kp)) < 0.8)
        z[p, :np_, :kp] = v
        s[p, :kp] = gen.integers(0, 6, size=kp) * (gen.random(kp) < 0.8)
        cut = np.sort(gen.integers(0, int(s[p].sum()) + 1, size=np_ - 1))
        r[p, :np_] = np.diff(np.concatenate([[0], cut, [s[p].sum()]]))
    tol = 1e-13 * np.maximum(1.0, s.sum(axis=1))
    sizes = np.array(shapes, np.int64).reshape(B, 2)
    return z, r, s, tol, sizes[:, 0], sizes[:, 1]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(batch=_batches(), max_sweeps=st.sampled_from([1, 3, 100_000]))
def test_kernel_equals_the_numpy_sweeps_bit_for_bit(batch, max_sweeps):
    sw = _assert_same(*batch, max_sweeps)
    if max_sweeps == 100_000:
        assert np.all(sw > 0)


def test_threshold_is_the_simplex_threshold():
    """``Σ max(v − θ, 0) = total`` (to rounding), ``θ = max v`` at total 0, on ties."""
    gen = np.random.default_rng(5)
    css = np.empty(9)
    for _ in range(50):
        v = gen.integers(-3, 4, size=int(gen.integers(1, 10))) * 0.25
        total = float(gen.integers(0, 5))
        theta = simplex_threshold(-np.sort(-v), total, css)
        if total == 0:
            assert theta == v.max()
        else:
            assert abs(np.maximum(v - theta, 0.0).sum() - total) < 1e-12


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    v=st.lists(st.sampled_from([-1.5, -0.0, 0.0, 0.5, 2.0, 3.25]) | st.floats(-5, 5), max_size=60),
    shuffle=st.integers(0, 60),
)
def test_sort_descending_sorts_and_moves_the_permutation_along(v, shuffle):
    """Nearly sorted lanes (insertion sort) and shuffled ones (past the budget: full sort)."""
    v = np.array(sorted(v, reverse=True), np.float64)
    gen = np.random.default_rng(shuffle)
    for _ in range(shuffle):  # a few swaps, or many
        if v.size > 1:
            i, j = gen.integers(0, v.size, 2)
            v[[i, j]] = v[[j, i]]
    orig = v.copy()
    perm = np.arange(v.size)
    sort_descending(v, perm)
    assert np.array_equal(v, -np.sort(-orig))
    assert np.array_equal(orig[perm], v)
    assert np.array_equal(np.sort(perm), np.arange(v.size))


def _recording(monkeypatch):
    """Route every batch the product solves through the kernel *and* the numpy reference."""
    seen = []

    def both(z, r, s, tol, n_rows, n_cols, max_sweeps):
        seen.append(z.shape)
        x, sw = transport_batch(z, r, s, tol, n_rows, n_cols, max_sweeps)
        x_ref, sw_ref = _transport_chunk_ref(z, r, s, tol, max_sweeps)
        assert np.array_equal(sw, sw_ref) and np.array_equal(x, x_ref)
        return x, sw

    monkeypatch.setattr(nn, "transport_batch", both)
    return seen


def test_kernel_equals_numpy_on_the_pl94_product(monkeypatch):
    """Every batch of the non-negative product of a synthetic pl94 state (2,016 cells)."""
    state = synthetic_state(2, blocks=60)
    h, schema = state.hierarchy, Schema.load("pl94")
    source = SyntheticHistogram(state.leaf_counts[:, 0], 2)
    plan = allocation_plan(schema, levels=h.names)
    meas, invs = measure_whole(h, schema, source, plan, KeyedRNG.reproducible(2, warn=False))
    rel = structured_gls(h, schema, meas, invs)
    seen = _recording(monkeypatch)
    rng = KeyedRNG.reproducible(3, warn=False).child("nonnegative")
    nn.nonnegative_structured(rel, rng, invariants=invs)
    assert len(seen) >= h.depth - 2


def test_kernel_equals_numpy_on_the_nmf_product(monkeypatch):
    """Every batch of the NMF route's integers (structural zeros at ``−M``, state parts)."""
    h, block, cell, count, aian = _state(blocks=12)
    subs = simulate_nmf(h, block, cell, count, aian_counties=aian, with_us=False,
                        evaluation_rng=KeyedRNG.reproducible(7, warn=False))  # fmt: skip
    r = estimate_state(collect_nmf(subs, {"01": int(count.sum())}))
    seen = _recording(monkeypatch)
    nmf_integers(r, KeyedRNG.reproducible(11, warn=False))
    assert seen


@pytest.mark.parametrize("max_sweeps", [1, 2])
def test_unconverged_problems_are_reported_as_the_reference_does(max_sweeps):
    gen = np.random.default_rng(1)
    z = gen.normal(0.0, 3.0, size=(2, 4, 5))
    s = np.array([[3.0, 1, 4, 2, 5], [2.0, 2, 2, 2, 2]])
    r = np.array([[5.0, 5, 3, 2], [4.0, 3, 2, 1]])
    tol = np.full(2, 1e-13 * 15)
    sw = _assert_same(z, r, s, tol, np.array([4, 4]), np.array([5, 5]), max_sweeps)
    assert np.all(sw == 0)
