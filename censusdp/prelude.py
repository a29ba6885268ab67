"""The front door: ``from censusdp.prelude import *`` gives the names a user needs.

Geography (:class:`Hierarchy`, :class:`Table`, the builders), the attribute schemas
(:class:`Schema`, :class:`ProductQuery`), queries and measurement (:class:`Query`,
:func:`measure`, :func:`invariant`), the noise laws, keyed randomness (:class:`KeyedRNG`),
the estimators (:func:`tree_gls`, :func:`structured_gls` for schema histograms,
:func:`condition`, :func:`topdown`), rounding and
intervals, privacy statements derived from the measurements (:func:`derive_statement`), the
release and its store, whole runs from a spec (:func:`load_spec`, :func:`run_spec`), and a
table of areas in pandas released in one call (:func:`privatize`: ``privatize(df, spec) ->
DataFrame``).
Beside them: integer noise on a lattice that keeps invariants exactly (:class:`IntegerLattice`,
:class:`LatticeLaplace`, :func:`certify`, :func:`release_lattice_noise`) with its MCMC
diagnostics (:func:`split_rhat`, :func:`meeting_times`, :func:`tv_upper_bound`), the
per-group bias regressions of the studies (:func:`group_regressions`, :func:`slope_summary`)
and the optional shared data folder (:func:`shared_data_file`); the notebooks import from
here only.

Where this module sits: it re-exports every layer, pipelines included, so it belongs to the
application layer above them (with :mod:`censusdp.app`), although it lives in the
``censusdp`` folder to be importable as ``censusdp.prelude``. No module of the library imports
it (a test checks), so core ← hierarchy ← mechanisms ← estimation ← pipelines ← experiments
holds; it is for users, notebooks and the README. Importing it imports the library but not
Dask (the distributed scheduler loads Dask only when used).

Model: ``opendp.prelude`` (OpenDP) and ``tmlt.analytics`` (Tumult Analytics).
"""

from __future__ import annotations

from censusdp.budget import ZCDP, Budget, PrivacyStatement, PureDP
from censusdp.errors import (
    BudgetError,
    CensusDPError,
    ConvergenceError,
    DataError,
    HierarchyError,
    SpecError,
)
from censusdp.estimation import (
    Release,
    StructuredRelease,
    condition,
    lattice_intervals,
    round_release,
    structured_gls,
    tree_gls,
)
from censusdp.estimation.conditioning.diagnostics import meeting_times, split_rhat, tv_upper_bound
from censusdp.estimation.integer.lattice_release import (
    certify,
    lattice_engine,
    release_lattice_noise,
)
from censusdp.estimation.topdown import topdown
from censusdp.hierarchy import (
    Hierarchy,
    Table,
    add_level,
    describe,
    from_columns,
    from_edges,
    from_gisjoin,
    pl94_histogram,
    synthetic_state,
    synthetic_us,
)
from censusdp.hierarchy.describe import format_description
from censusdp.mechanisms import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    ProductQuery,
    Query,
    derive_statement,
    invariant,
    measure,
    measure_products,
    product_invariant,
)
from censusdp.mechanisms.lattice import (
    GroupSumLattice,
    IntegerLattice,
    LatticeLaplace,
    sample_group_laplace_l1,
    table_margins_incidence,
)
from censusdp.paths import shared_data_file
from censusdp.pipelines.dataframe import privatize
from censusdp.pipelines.io.release_store import read_release, write_release
from censusdp.pipelines.metrics import group_regressions, slope_summary
from censusdp.pipelines.runner import run_spec
from censusdp.pipelines.specs import load_spec
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

__all__ = [
    # geography
    "Hierarchy",
    "Table",
    "from_columns",
    "from_gisjoin",
    "from_edges",
    "add_level",
    "synthetic_us",
    "synthetic_state",
    "pl94_histogram",
    "describe",
    "format_description",
    # attributes and queries
    "Schema",
    "ProductQuery",
    "Query",
    "measure",
    "invariant",
    "measure_products",
    "product_invariant",
    # noise and randomness
    "Laplace",
    "Gaussian",
    "DiscreteLaplace",
    "DiscreteGaussian",
    "KeyedRNG",
    # estimators, rounding, uncertainty
    "tree_gls",
    "condition",
    "topdown",
    "round_release",
    "lattice_intervals",
    "Release",
    "structured_gls",
    "StructuredRelease",
    # integer noise on a lattice, and its MCMC diagnostics
    "IntegerLattice",
    "GroupSumLattice",
    "table_margins_incidence",
    "LatticeLaplace",
    "sample_group_laplace_l1",
    "certify",
    "release_lattice_noise",
    "lattice_engine",
    "split_rhat",
    "meeting_times",
    "tv_upper_bound",
    # privacy
    "Budget",
    "PrivacyStatement",
    "PureDP",
    "ZCDP",
    "derive_statement",
    # releases and runs
    "read_release",
    "write_release",
    "load_spec",
    "run_spec",
    "privatize",
    # studies and data
    "group_regressions",
    "slope_summary",
    "shared_data_file",
    # errors
    "CensusDPError",
    "SpecError",
    "DataError",
    "HierarchyError",
    "BudgetError",
    "ConvergenceError",
]
