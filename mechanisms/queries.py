"""Linear queries on a node's cell vector, and hierarchical measurements and invariants.

A :class:`Query` is a (k × cells) matrix: ``detailed`` (identity), ``total`` (1ᵀ) or a
marginal (0/1 rows from cell-name patterns). A :class:`Measurement` is one query answered with
noise at every node of one level; an :class:`Invariant` is one query released exactly at every
node of one level. :func:`measure` draws the noise from the keyed streams of
:mod:`censusdp.rng`, so any node range can be measured on its own (Dask partitions) and the
union equals the single-process result bit for bit.

Levels are named: ``measure(h.names, counts, [("county", q, law)], rng)``,
``invariant(counts, "state", q, level_names=h.names)``. Every public function resolves a
level once, at the edge (:func:`level_position`, :func:`at_level_indices`); an integer index
is still accepted, for one release, and gives the same result bit for bit.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from scipy import sparse

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.hierarchy.core import exact_int64
from censusdp.mechanisms.laws import NoiseLaw
from censusdp.rng import KeyedRNG

__all__ = [
    "LinearQuery",
    "Query",
    "matrix_sensitivity",
    "query_matrix",
    "Measurement",
    "Invariant",
    "level_position",
    "at_level_indices",
    "measure",
    "measure_range",
    "invariant",
    "stream_label",
    "FLOAT_EXACT",
    "check_float_exact",
    "exact_matrix",
    "exact_rank",
    "exactly_released",
    "exact_release_note",
    "guard_exact_release",
]

#: Integers above 2⁵³ are not all representable in float64, the arithmetic of every estimator.
FLOAT_EXACT = 2**53


def matrix_sensitivity(matrix: np.ndarray | sparse.spmatrix, norm: int) -> float:
    """The sensitivity of a linear query under add/remove-one: the largest column ℓ₁
    (``norm=1``) or ℓ₂ (``norm=2``) norm of its matrix, a column being the change one person
    makes (Dwork & Roth 2014, Def. 3.1; Li et al. 2015, the matrix mechanism's Δ_A).

    Raises
    ------
    SpecError
        ``norm`` other than 1 or 2.
    """
    if norm not in (1, 2):
        raise SpecError(f"sensitivity norm must be 1 or 2, got {norm!r}")
    if sparse.issparse(matrix):
        a = abs(sparse.csc_matrix(matrix, dtype=np.float64))
        cols = np.asarray((a if norm == 1 else a.multiply(a)).sum(axis=0)).ravel()
    else:
        a = np.abs(np.asarray(matrix, dtype=np.float64))
        cols = (a if norm == 1 else a * a).sum(axis=0)
    top = float(cols.max(initial=0.0))
    return top if norm == 1 else float(np.sqrt(top))


@runtime_checkable
class LinearQuery(Protocol):
    """What every query offers, whatever holds it (a matrix, a schema's per-axis recodes, rows
    of several product queries): its name and size, its answers on node counts (one node's
    or a batch, exact for integers), its
    sensitivity (:func:`matrix_sensitivity`'s definition) and its Gram matrix ``A Aᵀ`` —
    the operator view of Ektelo (Zhang et al. 2018). Measurements, the privacy statement and
    the estimators ask these, never a query's type."""

    name: str

    @property
    def n_rows(self) -> int: ...

    def apply(self, counts: np.ndarray) -> np.ndarray: ...

    def sensitivity(self, norm: int) -> float: ...

    def gram(self) -> np.ndarray: ...

    def dense(self) -> np.ndarray: ...


def query_matrix(query: LinearQuery | np.ndarray | sparse.spmatrix) -> np.ndarray:
    """The dense float64 matrix of a query given as any :class:`LinearQuery` or as a matrix
    (dense or sparse): how the subspace and Blowfish mechanisms take a query."""
    if isinstance(query, LinearQuery):
        return np.asarray(query.dense(), dtype=np.float64)
    if sparse.issparse(query):
        return query.toarray().astype(np.float64, copy=False)
    return np.asarray(query, dtype=np.float64)


@dataclass(frozen=True, eq=False)
class Query:
    """A linear query: ``matrix @ cells`` for every node.

    Attributes
    ----------
    name : str
        ``"detailed"``, ``"total"`` or a marginal's name.
    matrix : numpy.ndarray
        int64 array of shape (k, n_cells).
    labels : tuple of str
        One label per row of ``matrix``.
    """

    name: str
    matrix: np.ndarray
    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        m = np.asarray(self.matrix)
        if m.ndim != 2 or m.shape[0] != len(self.labels):
            raise ValueError(f"query {self.name!r}: matrix must be (len(labels), n_cells)")

    @property
    def n_rows(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def n_cells(self) -> int:
        return int(self.matrix.shape[1])

    def sensitivity(self, norm: int) -> float:
        """Largest column ℓ₁ or ℓ₂ norm of the matrix (:func:`matrix_sensitivity`)."""
        return matrix_sensitivity(self.matrix, norm)

    def gram(self) -> np.ndarray:
        """``A Aᵀ`` (k × k)."""
        m = np.asarray(self.matrix)
        return m @ m.T

    def dense(self) -> np.ndarray:
        """The matrix itself (the :class:`LinearQuery` protocol)."""
        return np.asarray(self.matrix)

    @property
    def is_identity(self) -> bool:
        m = self.matrix
        return m.shape[0] == m.shape[1] and bool(
            np.array_equal(m, np.eye(m.shape[0], dtype=m.dtype))
        )

    @classmethod
    def detailed(cls, cells: Sequence[str]) -> Query:
        """The identity: every cell."""
        return cls("detailed", np.eye(len(cells), dtype=np.int64), tuple(cells))

    @classmethod
    def total(cls, cells: Sequence[str]) -> Query:
        """The node total 1ᵀ x."""
        return cls("total", np.ones((1, len(cells)), dtype=np.int64), ("total",))

    @classmethod
    def marginal(
        cls, name: str, cells: Sequence[str], groups: Mapping[str, str | Sequence[str]]
    ) -> Query:
        """A 0/1 marginal: one row per group; a group is a glob pattern or a list of cells.

        Raises
        ------
        SpecError
            When a group matches no cell.
        """
        cells = list(cells)
        rows = []
        for label, pat in groups.items():
            if isinstance(pat, str):
                hit = [fnmatch.fnmatchcase(c, pat) for c in cells]
            else:
                wanted = set(pat)
                unknown = wanted.difference(cells)
                if unknown:
                    raise SpecError(
                        f"marginal {name!r}, group {label!r}: unknown cells {sorted(unknown)}; "
                        f"cells are {cells}"
                    )
                hit = [c in wanted for c in cells]
            if not any(hit):
                raise SpecError(
                    f"marginal {name!r}, group {label!r}: pattern {pat!r} matches no cell; "
                    f"cells are {cells}"
                )
            rows.append(np.asarray(hit, dtype=np.int64))
        return cls(name, np.vstack(rows), tuple(groups))

    def apply(self, counts: np.ndarray) -> np.ndarray:
        """Answers for node counts of shape (n_nodes, n_cells) → (n_nodes, k), or for one
        node's (n_cells,) → (k,), as every :class:`LinearQuery`.

        Integer counts give exact int64 answers (a sum beyond the int64 range is refused,
        never wrapped around).

        Raises
        ------
        SpecError
            Counts that are not (n_nodes, n_cells) or (n_cells,) (no broadcasting).
        DataError
            An integer answer beyond the int64 range.
        """
        counts = np.asarray(counts)
        if counts.shape == (self.n_cells,):
            return self.apply(counts[None])[0]
        if counts.ndim != 2 or counts.shape[1] != self.n_cells:
            raise SpecError(
                f"query {self.name!r} is on {self.n_cells} cells but the counts have shape "
                f"{counts.shape}; counts must be (nodes, {self.n_cells})"
            )
        if self.is_identity:
            return np.array(counts, copy=True)
        matrix = np.asarray(self.matrix)
        if matrix.dtype.kind in "iu" and counts.dtype.kind in "iu":
            weight = int(np.abs(matrix).sum(axis=1).max(initial=0))
            out, overflow = exact_int64(lambda a: a @ matrix.T.astype(a.dtype), counts, weight)
            if overflow is not None:
                node, row = np.argwhere(overflow)[0]
                raise DataError(
                    f"query {self.name!r}, row {self.labels[row]!r}, node {int(node)}: the "
                    "answer exceeds the int64 range (2^63 - 1), so it cannot be held exactly; "
                    "check the counts for a unit or scale error"
                )
            return out
        return counts @ matrix.T


def level_position(level_names: Sequence[str], level: str | int, what: str = "level") -> int:
    """The index of a level given by name (what the docs teach) or by index.

    Every public function of the flat API resolves its levels here, once, at the edge: a
    name is looked up in the hierarchy's ``level_names``; an integer index (accepted for one
    release) may be negative, counted from the leaves as in Python.

    Parameters
    ----------
    level_names : sequence of str
        The hierarchy's level names, root first (``Hierarchy.names``).
    level : str or int
    what : str
        What the level is for, named in the error (e.g. ``"invariant 'total'"``).

    Raises
    ------
    SpecError
        An unknown name or an index out of range: one line naming the level and the known
        levels.
    """
    names = [str(n) for n in level_names]
    if isinstance(level, str):
        if level in names:
            return names.index(level)
        raise SpecError(
            f"{what}: unknown level {level!r}; the levels are {names} (use one of these names)"
        )
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)):
        raise SpecError(
            f"{what}: a level is a name (one of {names}) or an index, not {type(level).__name__}"
        )
    k = int(level)
    if not -len(names) <= k < len(names):
        raise SpecError(
            f"{what}: level index {k} is out of range for the {len(names)} levels {names} "
            "(name the level instead)"
        )
    return k % len(names)


@dataclass(frozen=True, eq=False)
class Measurement:
    """A noisy answer to ``query`` at every node of level ``level``.

    Attributes
    ----------
    level : str or int
        The level's name (``"county"``), or its index in the hierarchy; the estimators
        resolve it once against the hierarchy (:func:`at_level_indices`) and work with the
        index, keeping the name in ``level_name``.
    query : Query
    values : numpy.ndarray
        (n_nodes, k) noisy answers.
    law : NoiseLaw
        The noise law of every entry (its variance is the measurement variance).
    level_name : str, optional
        The level's name (keyword only): set by :func:`measure` and by
        :func:`at_level_indices`, and from ``level`` when that is a name.

    Raises
    ------
    SpecError
        ``level`` a name that disagrees with ``level_name``.
    """

    level: str | int
    query: Query
    values: np.ndarray
    law: NoiseLaw
    level_name: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        _name_from_level(self)

    @property
    def variance(self) -> float:
        return float(self.law.variance)

    @property
    def label(self) -> str:
        """``"level: query"``, e.g. ``"county: detailed"`` (the level's name when known)."""
        return f"{self.level_name or self.level}: {self.query.name}"


@dataclass(frozen=True, eq=False)
class Invariant:
    """An exact answer to ``query`` at every node of level ``level``.

    Attributes
    ----------
    level : str or int
        The level's name or index, as for :class:`Measurement`.
    query : Query
    values : numpy.ndarray
        (n_nodes, k) exact answers.
    level_name : str, optional
        The level's name (keyword only), as for :class:`Measurement`.
    """

    level: str | int
    query: Query
    values: np.ndarray
    level_name: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        _name_from_level(self)

    @property
    def label(self) -> str:
        """``"level: query"``, e.g. ``"state: total"`` (the level's name when known)."""
        return f"{self.level_name or self.level}: {self.query.name}"


def _name_from_level(item: Measurement | Invariant) -> None:
    """A name given as ``level`` is the ``level_name``; the two may not disagree."""
    if not isinstance(item.level, str):
        return
    if item.level_name is None:
        object.__setattr__(item, "level_name", item.level)
    elif item.level_name != item.level:
        raise SpecError(
            f"{type(item).__name__.lower()} {item.query.name!r}: level {item.level!r} but "
            f"level_name {item.level_name!r}; give the level once"
        )


def at_level_indices(level_names: Sequence[str], items: Sequence) -> list:
    """Measurements or invariants with ``level`` the index and ``level_name`` the name.

    The one resolution of levels at the edge of every estimator (:func:`level_position`):
    a level given by name or by index gives the same item, so the releases are identical bit
    for bit. Values are not copied.

    Raises
    ------
    SpecError
        An unknown level name, an index out of range, or a ``level_name`` that is not the
        name of the level's index.
    """
    names = [str(n) for n in level_names]
    out = []
    for it in items:
        what = f"{type(it).__name__} {it.query.name!r}"
        k = level_position(names, it.level, what)
        if it.level_name is not None and it.level_name != names[k]:
            raise SpecError(
                f"{what}: level {it.level!r} is {names[k]!r}, but its level_name says "
                f"{it.level_name!r}; give the level once"
            )
        if type(it.level) is int and it.level == k and it.level_name == names[k]:
            out.append(it)
        else:
            out.append(dataclasses.replace(it, level=k, level_name=names[k]))
    return out


def stream_label(level_name: str, query_name: str) -> str:
    """The keyed-stream label of one (level, query) measurement."""
    return f"measure/{level_name}/{query_name}"


def measure_range(
    true_answers: np.ndarray,
    level_name: str,
    n_nodes: int,
    start: int,
    query: Query,
    law: NoiseLaw,
    rng: KeyedRNG,
) -> np.ndarray:
    """Noisy answers for nodes ``[start, start + len(true_answers))`` of a level.

    ``true_answers`` are the exact answers ``query.apply(counts)`` of those nodes. An
    integer law needs integer answers (integral floats up to 2⁵³ are converted exactly),
    so that the measurements are integers.

    Raises
    ------
    DataError
        Non-integer answers under an integer noise law.
    """
    true_answers = np.asarray(true_answers)
    if law.is_integer and true_answers.dtype.kind not in "iu":
        finite = np.isfinite(true_answers)
        exact = finite & (np.abs(np.where(finite, true_answers, 0.0)) <= FLOAT_EXACT)
        exact &= true_answers == np.round(np.where(exact, true_answers, 0.0))
        if true_answers.dtype.kind != "f" or not exact.all():
            raise DataError(
                f"level {level_name!r}, query {query.name!r}: the counts are not integers "
                f"(dtype {true_answers.dtype}) but the noise law {law!r} is an integer law; "
                "give int64 counts (or use a continuous law)"
            )
        true_answers = true_answers.astype(np.int64)
    stop = start + true_answers.shape[0]
    add = getattr(law, "add_window", None)
    if add is not None and true_answers.dtype == np.int64:  # answers and noise in one pass
        label = stream_label(level_name, query.name)
        return rng.add_draws(label, n_nodes, start, stop, true_answers, add, query.n_rows)
    noise = rng.draw(
        stream_label(level_name, query.name), n_nodes, start, stop, law.sample, query.n_rows,
        window=law.sample_window,
    )  # fmt: skip
    return true_answers + noise


def measure(
    level_names: Sequence[str],
    level_counts: Sequence[np.ndarray],
    plan: Sequence[tuple[str | int, Query, NoiseLaw]],
    rng: KeyedRNG,
) -> list[Measurement]:
    """Measure every (level, query, law) of ``plan`` at every node of its level.

    Parameters
    ----------
    level_names : sequence of str
        The hierarchy's level names (stream labels), root first.
    level_counts : sequence of arrays
        Exact counts per level, (n_nodes, n_cells), e.g. ``Hierarchy.aggregate(leaf_counts)``.
    plan : sequence of (level name, Query, NoiseLaw)
        E.g. ``[("county", Query.detailed(cells), DiscreteGaussian(20))]``; a level index is
        accepted for one release and measures the same (:func:`level_position`).
    rng : KeyedRNG

    Returns
    -------
    list of Measurement
        In plan order, ``level`` the index and ``level_name`` the name.

    Raises
    ------
    SpecError
        An unknown level name or an index out of range (naming the known levels).
    """
    out = []
    for level, q, law in plan:
        k = level_position(level_names, level, f"measurement {q.name!r}")
        counts = level_counts[k]
        truth = q.apply(counts)
        name = str(level_names[k])
        vals = measure_range(truth, name, counts.shape[0], 0, q, law, rng)
        out.append(Measurement(k, q, vals, law, level_name=name))
    return out


def invariant(
    level_counts: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    level: str | int,
    query: Query,
    *,
    level_names: Sequence[str] | None = None,
) -> Invariant:
    """The exact answers of ``query`` at level ``level``.

    Parameters
    ----------
    level_counts : mapping of level name → array, or sequence of arrays
        Exact counts per level, root first (e.g. ``Table.all_levels()``).
    level : str or int
        The level's name (``"state"``; needs ``level_names`` or a mapping), or its index
        (accepted for one release).
    query : Query
    level_names : sequence of str, optional
        The hierarchy's level names (``h.names``), as for
        :func:`~censusdp.mechanisms.product_measure.product_invariant`.

    Raises
    ------
    SpecError
        An unknown level name or index, or a name without ``level_names``.
    DataError
        Answers beyond the int64 range, or beyond 2⁵³ (:func:`check_float_exact`).
    """
    what = f"invariant {query.name!r}"
    if isinstance(level_counts, Mapping):
        level_names, level_counts = list(level_counts), list(level_counts.values())
    if level_names is None:
        if isinstance(level, str):
            raise SpecError(
                f"{what} at level {level!r}: a level name needs the hierarchy's level names; "
                f"call invariant(counts, {level!r}, query, level_names=h.names)"
            )
        k = level_position([str(j) for j in range(len(level_counts))], level, what)
        name = None
    else:
        if len(level_names) != len(level_counts):
            raise SpecError(
                f"{what}: {len(level_names)} level names for {len(level_counts)} levels of "
                "counts; give one name per level, root first (h.names)"
            )
        k = level_position(level_names, level, what)
        name = str(level_names[k])
    values = query.apply(level_counts[k])
    check_float_exact(
        values, f"{what} at level {k}" if name is None else f"{what} at level {name!r}"
    )
    return Invariant(k, query, values, level_name=name)


def check_float_exact(values: np.ndarray, what: str) -> None:
    """Refuse exact values beyond 2⁵³ in magnitude.

    The estimators compute in float64, where integers above 2⁵³ are rounded (2⁵³ + 1
    becomes 2⁵³): an invariant that large would be released changed, with a standard error
    of 0. It is refused instead of being silently changed.

    Raises
    ------
    DataError
        Naming ``what``, never the value.
    """
    v = np.asarray(values)
    if v.size == 0:
        return
    if v.dtype.kind in "iu":
        big = int(v.max()) > FLOAT_EXACT or -int(v.min()) > FLOAT_EXACT
    else:
        big = bool((np.abs(v) > FLOAT_EXACT).any())
    if big:
        raise DataError(
            f"{what}: values beyond 2^53 cannot be held exactly by the estimators' float64 "
            "arithmetic (they would be released changed with a standard error of 0); check "
            "the counts for a unit or scale error, or hold a smaller statistic invariant"
        )


def exact_matrix(rows: np.ndarray):  # -> flint.fmpz_mat | flint.fmpq_mat
    """A query matrix in exact arithmetic: python-flint integers, or rationals (the exact
    binary value of each float) when an entry is not an integer."""
    import flint

    m = np.asarray(rows)
    if m.dtype.kind in "iub" or bool(np.all(m == np.round(m))):
        return flint.fmpz_mat([[int(v) for v in r] for r in m.tolist()])
    return flint.fmpq_mat(
        [[flint.fmpq(*float(v).as_integer_ratio()) for v in r] for r in m.tolist()]
    )


def exact_rank(rows: np.ndarray) -> int:
    """The rank of a (small) query matrix in exact rational arithmetic (python-flint)."""
    m = np.asarray(rows)
    if m.size == 0:
        return 0
    return int(exact_matrix(m).rank())


def exactly_released(
    level_names: Sequence[str],
    measured: Sequence[tuple[int, Query]],
    invariants: Sequence[tuple[int, Query]],
) -> dict[str, tuple[str, ...]]:
    """Levels whose every measured query the invariants determine, with those queries.

    An invariant at level j fixes its query at every node of level j, hence (summing the
    children) at every node of every level above j. A measured query at level k is therefore
    determined when its rows lie in the span of the invariant rows at levels k and below
    (an exact rank test). A level all of whose measurements are determined releases them
    exactly: the noise there protects nothing (e.g. ``detailed`` held invariant at the
    leaves releases the confidential leaf table).

    Parameters
    ----------
    level_names : sequence of str
    measured, invariants : sequence of (level name or index, Query)

    Returns
    -------
    dict
        Level name → names of its measured queries, for each level where all are determined.

    References
    ----------
    Gao, Gong & Yu (2022), subspace differential privacy, §3: the guarantee holds among
    databases sharing the invariants, which is none other than the data itself when the
    invariants span the measured queries.
    """
    measured = _indexed_pairs(level_names, measured, "measured query")
    invariants = _indexed_pairs(level_names, invariants, "invariant")
    out: dict[str, tuple[str, ...]] = {}
    for k in sorted({k for k, _ in measured}):
        below = [q.matrix for j, q in invariants if j >= k]
        if not below:
            continue
        inv = np.vstack(below)
        meas = [q for j, q in measured if j == k]
        if exact_rank(np.vstack([inv, *(q.matrix for q in meas)])) == exact_rank(inv):
            out[level_names[k]] = tuple(q.name for q in meas)
    return out


def _indexed_pairs(
    level_names: Sequence[str], pairs: Sequence[tuple[str | int, Query]], what: str
) -> list[tuple[int, Query]]:
    return [(level_position(level_names, j, f"{what} {q.name!r}"), q) for j, q in pairs]


def exact_release_note(determined: Mapping[str, Sequence[str]]) -> str:
    """The privacy statement's note for levels released exactly (:func:`exactly_released`)."""
    what = "; ".join(f"{lvl} ({', '.join(qs)})" for lvl, qs in determined.items())
    return (
        f"NO PRIVACY PROTECTION at {what}: the invariants determine every value measured "
        "there, so those values are released exactly and carry no privacy protection; the "
        "budget above does not protect them"
    )


def guard_exact_release(
    level_names: Sequence[str],
    measured: Sequence[tuple[int, Query]],
    invariants: Sequence[tuple[int, Query]],
    privacy: PrivacyStatement,
    *,
    acknowledge: bool = False,
) -> PrivacyStatement:
    """Refuse invariants that determine every measured value, unless acknowledged.

    When at every measured level the invariants at or below determine all measured queries
    (:func:`exactly_released`), the noise protects nothing: the release is a function of
    the invariants alone and gives away exactly what they fix (with ``detailed`` held at the
    leaves, the confidential table), while a budget "ε = 1" would still be stated. Levels
    determined while another level keeps protected values only repeat what the declared
    invariants already imply, and pass.

    Parameters
    ----------
    level_names : sequence of str
    measured, invariants : sequence of (level name or index, Query)
    privacy : PrivacyStatement
        The statement of the measurements. A statement that already carries the
        :func:`exact_release_note` of these levels counts as acknowledged.
    acknowledge : bool
        Release them exactly on purpose (``[invariants] acknowledge_exact_release = true``).

    Returns
    -------
    PrivacyStatement
        ``privacy``, with the exact-release note added when levels are released exactly.

    Raises
    ------
    SpecError
        Every measured level released exactly, without acknowledgement (naming the levels
        and the invariants).
    """
    measured = _indexed_pairs(level_names, measured, "measured query")
    invariants = _indexed_pairs(level_names, invariants, "invariant")
    determined = exactly_released(level_names, measured, invariants)
    if len(determined) < len({k for k, _ in measured}):
        return privacy  # some level keeps protected values; the rest the invariants declare
    note = exact_release_note(determined)
    if note in privacy.notes:
        return privacy
    if not acknowledge:
        lvls = ", ".join(repr(lvl) for lvl in determined)
        held = ", ".join(f"{level_names[j]}: {q.name}" for j, q in invariants)
        raise SpecError(
            f"the invariants ({held}) determine every measured value (at level(s) {lvls}): "
            "the release would be exact, with no privacy protection, whatever the budget "
            "says; hold fewer statistics invariant, or set [invariants] "
            "acknowledge_exact_release = true (Python: guard_exact_release(..., "
            "acknowledge=True)) to release them exactly on purpose"
        )
    return privacy.with_notes(note)
