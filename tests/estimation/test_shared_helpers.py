"""The small shared kernels made public by issue 34: their own contracts.

``uniform_index`` (mcmc), ``solver_unit`` / ``repair_round_off`` (topdown_sparse),
``range_basis`` / ``gather_block`` / ``axes_label`` / ``block_error`` (structured_gls) and
``block_populations`` / ``person_offsets`` / ``histogram_range`` (hierarchy.synthetic).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.errors import DataError, SpecError
from censusdp.estimation.conditioning.mcmc import uniform_index
from censusdp.estimation.gls.marginal_basis import workload_basis
from censusdp.estimation.gls.structured import axes_label, block_error, gather_block, range_basis
from censusdp.estimation.topdown.sparse import repair_round_off, solver_unit
from censusdp.hierarchy.synthetic import (
    block_populations,
    histogram_range,
    person_offsets,
    pl94_histogram,
)
from censusdp.schema import Schema


# ----------------------------------------------------------------------------- uniform_index
def test_uniform_index_stays_in_range_at_the_edges():
    u = np.array([0.0, 0.5, np.nextafter(1.0, 0.0)])
    n = np.array([1, 3, 7])
    assert uniform_index(u, n).tolist() == [0, 1, 6]
    assert uniform_index(np.array([np.nextafter(1.0, 0.0)] * 3), 1).tolist() == [0, 0, 0]


def test_uniform_index_is_uniform_and_rejects_a_skewed_law():
    gen = np.random.default_rng(20240534)
    n, draws = 7, 70_000
    counts = np.bincount(uniform_index(gen.random(draws), n), minlength=n)
    assert scipy.stats.chisquare(counts).pvalue > 1e-6
    # power: the same test rejects floor(u² n), a law that favours small indices
    skewed = np.bincount(uniform_index(gen.random(draws) ** 2, n), minlength=n)
    assert scipy.stats.chisquare(skewed).pvalue < 1e-6


# ----------------------------------------------------------------------------- topdown helpers
def test_solver_unit_is_the_mean_absolute_entry_at_least_one():
    a = [np.array([[3.0, -5.0]]), np.array([4.0])]
    assert solver_unit(None, 2, a) == 4.0
    assert solver_unit(np.array([10, 2]), 2, [np.array([0.0])]) == 2.0  # mean of 0, 10/2, 2/2
    assert solver_unit(None, 1, [np.array([0.1])]) == 1.0
    assert solver_unit(None, 1, []) == 1.0


def test_repair_round_off_restores_the_parent_and_snaps_integers():
    xt = np.array([[1.0 + 1e-9, -1e-9, 0.0], [2.0 - 2e-9, 0.5, 0.0]])
    parent = np.array([3, 1, 4])
    out = repair_round_off(xt.copy(), parent)
    assert (out >= 0).all()
    assert out[:, 0].tolist() == [1.0, 2.0]  # snapped exactly
    assert out[:, 1].tolist() == [0.0, 1.0]  # negative clipped, rescaled to the parent
    assert out[:, 2].tolist() == [2.0, 2.0]  # a zero column of a positive parent: even split
    assert out.sum(axis=0).tolist() == parent.tolist()


# ----------------------------------------------------------------------------- structured helpers
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 6), rank=st.integers(0, 6))
def test_range_basis_is_an_orthonormal_basis_of_the_range(seed, d, rank):
    gen = np.random.default_rng(seed)
    B = gen.normal(size=(d, min(rank, d)))
    m = B @ B.T
    V, ev = range_basis(m)
    assert V.shape == (d, np.linalg.matrix_rank(m)) == (d, ev.size)
    np.testing.assert_allclose(V.T @ V, np.eye(V.shape[1]), atol=1e-10)
    np.testing.assert_allclose(V @ np.diag(ev) @ V.T, m, atol=1e-9 * (1 + np.abs(m).max()))


def test_blocks_partition_the_coefficients_and_are_named_by_their_attributes():
    schema = Schema.load("sex_age5")
    basis = workload_basis(schema, ["sex * ageband", "age65", "total"])
    n = 3
    y = np.arange(n * int(np.prod(basis.shape)), dtype=float).reshape(n, *basis.shape)
    seen = []
    for mask in basis.subsets:
        block = gather_block(basis, y, mask)
        assert block.shape == (n, basis.multiplicity(mask), basis.block_size(mask))
        seen.append(block.reshape(n, -1))
    every = np.sort(np.concatenate(seen, axis=1), axis=1)
    assert np.array_equal(every, y.reshape(n, -1))  # each coefficient in exactly one block
    assert axes_label(schema, 0b11) == "{sex, age5}" and axes_label(schema, 0) == "{}"
    err = block_error(schema, 0b10, SpecError("not identifiable"))
    assert isinstance(err, SpecError) and str(err).endswith("attributes {age5})")


# ----------------------------------------------------------------------------- synthetic
def test_histogram_range_is_the_histogram_of_any_split():
    pop = np.random.default_rng(5).integers(0, 40, size=50)
    off = person_offsets(block_populations(pop))
    assert off[0] == 0 and off[-1] == pop.sum() and np.array_equal(np.diff(off), pop)
    whole = pl94_histogram(pop, seed=11)
    parts = [histogram_range(pop, off, 11, a, b) for a, b in [(0, 17), (17, 18), (18, 50)]]
    for got, want in zip(zip(*parts, strict=True), whole, strict=True):
        assert np.array_equal(np.concatenate(got), want)


@pytest.mark.parametrize(
    "bad", [np.array([3, -1]), np.array([1.5, 2.0]), np.ones((2, 2), dtype=np.int64)]
)
def test_block_populations_refuses_what_is_not_one_count_per_block(bad):
    with pytest.raises(DataError, match="one non-negative integer per block"):
        block_populations(bad)
