"""Structured projections (group and nested totals) against the dense Π_N."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.errors import HierarchyError, SpecError
from censusdp.mechanisms.projection import (
    dense_projector,
    group_indicator_matrix,
    group_projection_variances,
    nested_projection_variances,
    null_space_basis,
    project_dense,
    project_group_totals,
    project_nested,
)


def pinv_projector(C: np.ndarray) -> np.ndarray:
    """Reference Π_N = I − C⁺C, valid for dependent rows too."""
    return np.eye(C.shape[1]) - np.linalg.pinv(C) @ C


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=1, max_size=8), st.integers(0, 10_000))
def test_group_totals_match_dense(sizes, seed):
    groups = np.repeat(np.arange(len(sizes)), sizes)
    gen = np.random.default_rng(seed)
    groups = gen.permutation(groups)  # groups need not be contiguous
    e = gen.normal(size=groups.size) * 10
    C = group_indicator_matrix(groups)
    dense = dense_projector(C) @ e
    fast = project_group_totals(e, groups)
    np.testing.assert_allclose(fast, dense, atol=1e-12 * max(1.0, np.abs(e).max()))
    np.testing.assert_allclose(fast, pinv_projector(C) @ e, atol=1e-11)
    np.testing.assert_allclose(C @ fast, 0.0, atol=1e-11)
    var = group_projection_variances(groups, 2.5)
    np.testing.assert_allclose(var, 2.5 * np.diag(dense_projector(C)), atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=1, max_size=4),
    st.integers(0, 10_000),
)
def test_nested_totals_match_dense(tree, seed):
    # nation → states (one list per state) → counties (sizes) → coordinates
    county_sizes = [s for state in tree for s in state]
    county = np.repeat(np.arange(len(county_sizes)), county_sizes)
    state_of_county = np.repeat(np.arange(len(tree)), [len(s) for s in tree])
    state = state_of_county[county]
    nation = np.zeros_like(county)
    levels = [nation, state, county]
    e = np.random.default_rng(seed).laplace(size=county.size)
    C = np.vstack([group_indicator_matrix(g) for g in levels])  # dependent rows
    ref = pinv_projector(C) @ e
    np.testing.assert_allclose(project_nested(e, levels), ref, atol=1e-12)
    np.testing.assert_allclose(
        nested_projection_variances(levels, 3.0), 3.0 * np.diag(pinv_projector(C)), atol=1e-12
    )


def test_nested_refuses_crossed_levels():
    rows = np.array([0, 0, 1, 1])
    cols = np.array([0, 1, 0, 1])
    with pytest.raises(HierarchyError):
        project_nested(np.ones(4), [rows, cols])


def test_dense_helpers_and_rank_check():
    C = np.array([[1.0, 1, 1, 0], [0, 0, 1, 1]])
    q = null_space_basis(C)
    assert q.shape == (4, 2)
    np.testing.assert_allclose(q.T @ q, np.eye(2), atol=1e-12)
    np.testing.assert_allclose(C @ q, 0.0, atol=1e-12)
    e = np.arange(4.0)
    np.testing.assert_allclose(project_dense(e, C), dense_projector(C) @ e, atol=1e-12)
    np.testing.assert_allclose(dense_projector(C), pinv_projector(C), atol=1e-12)
    with pytest.raises(SpecError, match="rank"):
        dense_projector(np.vstack([C, C.sum(axis=0)]))
    with pytest.raises(HierarchyError):
        project_group_totals(np.ones(3), np.array([0, 1]))


def test_group_projection_is_sliceable_bit_for_bit():
    # projecting a contiguous run of whole groups alone gives the same bits (Algorithm 4)
    gen = np.random.default_rng(5)
    sizes = gen.integers(1, 50, size=40)
    groups = np.repeat(np.arange(40), sizes)
    e = gen.laplace(size=groups.size) * 7.3
    full = project_group_totals(e, groups)
    lo, hi = int(sizes[:11].sum()), int(sizes[:29].sum())
    part = project_group_totals(e[lo:hi], groups[lo:hi] - 11)
    assert np.array_equal(full[lo:hi], part)
