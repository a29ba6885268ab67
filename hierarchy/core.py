"""The geographic hierarchy as arrays per level.

Nodes are stored level by level in contiguous integer index ranges. Within a level, nodes are
sorted by ``(parent, code)``, so the children of a node are a contiguous range of the level
below (CSR: ``child_start``, ``child_count``). An 8-million-leaf tree is a handful of arrays,
never one Python object per node. Level 0 is the root level and holds exactly one node.

Node order is canonical (it depends on the codes only, never on input row order): noise is
keyed by node index (:mod:`censusdp.rng`), so a canonical order makes seeded releases
independent of how the input file was sorted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from censusdp.errors import DataError, HierarchyError

__all__ = ["Level", "Hierarchy", "STRING_DTYPE", "as_codes", "exact_int64"]

#: Codes are stored as numpy variable-width strings (short codes are stored inline).
STRING_DTYPE = np.dtypes.StringDType()


def as_codes(values: object) -> np.ndarray:
    """Convert any sequence of codes to a 1-D array of :data:`STRING_DTYPE`."""
    arr = np.asarray(values, dtype=object) if not isinstance(values, np.ndarray) else values
    return np.asarray(arr, dtype=STRING_DTYPE).reshape(-1)


@dataclass(frozen=True, eq=False)
class Level:
    """One level of a :class:`Hierarchy`.

    Attributes
    ----------
    name : str
        Level name, e.g. ``"county"``.
    codes : numpy.ndarray
        Stable string id of every node (GISJOIN, FIPS, ...), unique within the level.
    parent : numpy.ndarray
        int64 index of each node's parent in the level above (``-1`` for the root);
        non-decreasing.
    child_start, child_count : numpy.ndarray
        int64 CSR offsets of each node's children in the level below (zeros on the leaves).
    """

    name: str
    codes: np.ndarray
    parent: np.ndarray
    child_start: np.ndarray
    child_count: np.ndarray

    @property
    def size(self) -> int:
        return int(self.codes.shape[0])

    def __len__(self) -> int:
        return self.size


def _csr(parent: np.ndarray, n_parents: int) -> tuple[np.ndarray, np.ndarray]:
    count = np.bincount(parent, minlength=n_parents).astype(np.int64)
    start = np.zeros(n_parents, dtype=np.int64)
    np.cumsum(count[:-1], out=start[1:])
    return start, count


class Hierarchy:
    """A rooted tree of nested geographies, stored as arrays per level.

    Build one with the builders of :mod:`censusdp.hierarchy.builders` or with
    :meth:`from_parents`; do not fill the arrays by hand.
    """

    __slots__ = ("levels",)

    def __init__(self, levels: Sequence[Level]) -> None:
        self.levels: tuple[Level, ...] = tuple(levels)
        if not self.levels or self.levels[0].size != 1:
            raise HierarchyError("a hierarchy needs a root level with exactly one node")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_parents(
        cls,
        names: Sequence[str],
        codes: Sequence[object],
        parents: Sequence[np.ndarray | None],
        *,
        return_order: bool = False,
    ) -> Hierarchy | tuple[Hierarchy, list[np.ndarray]]:
        """Build from per-level codes and parent indices (into the input order above).

        Parameters
        ----------
        names : sequence of str
            Level names, root first.
        codes : sequence of array-like
            Codes per level in input order; the root level has one code.
        parents : sequence of int arrays
            For level ``k >= 1``, the index (in the *input* order of level ``k-1``) of each
            node's parent; ``parents[0]`` is ignored.
        return_order : bool
            Also return, per level, ``order`` such that canonical node ``i`` is input node
            ``order[i]`` (use it to align data rows with nodes).
        """
        if not (len(names) == len(codes) == len(parents)):
            raise HierarchyError("names, codes and parents must have one entry per level")
        if len(set(names)) != len(names):
            raise HierarchyError(f"level names must be unique, got {list(names)}")
        levels: list[Level] = []
        orders: list[np.ndarray] = []
        inv_prev = np.zeros(1, dtype=np.int64)
        for k, (name, raw_codes) in enumerate(zip(names, codes, strict=True)):
            c = as_codes(raw_codes)
            if k == 0:
                if c.size != 1:
                    raise HierarchyError(f"level {name!r}: the root level must have one node")
                levels.append(Level(name, c, np.full(1, -1, np.int64), *_empty_csr(1)))
                orders.append(np.zeros(1, dtype=np.int64))
                continue
            if c.size == 0:
                raise HierarchyError(
                    f"level {name!r} is empty: every level needs at least one node"
                )
            p_in = np.asarray(parents[k], dtype=np.int64).reshape(-1)
            if p_in.shape != c.shape:
                raise HierarchyError(f"level {name!r}: {c.size} codes but {p_in.size} parents")
            n_up = levels[-1].size
            bad = np.flatnonzero((p_in < 0) | (p_in >= n_up))
            if bad.size:
                raise HierarchyError(
                    f"level {name!r}: node {str(c[bad[0]])!r} has no parent in level "
                    f"{levels[-1].name!r} (orphan); every node needs a parent one level up"
                )
            p = inv_prev[p_in]
            order = _canonical_order(c, p)
            if order is None:  # already canonical: no gathers
                order, c_sorted, p_sorted, inv_prev = np.arange(c.size), c, p, None
            else:
                c_sorted, p_sorted = c[order], p[order]
                inv_prev = np.empty_like(order)
                inv_prev[order] = np.arange(order.size)
            start, count = _csr(p_sorted, n_up)
            up = levels[-1]
            levels[-1] = Level(up.name, up.codes, up.parent, start, count)
            levels.append(Level(name, c_sorted, p_sorted, *_empty_csr(c.size)))
            orders.append(order)
            if inv_prev is None:
                inv_prev = order
        h = cls(levels)
        return (h, orders) if return_order else h

    # ------------------------------------------------------------------ access
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(lv.name for lv in self.levels)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(lv.size for lv in self.levels)

    @property
    def depth(self) -> int:
        """Number of levels, root included."""
        return len(self.levels)

    @property
    def leaves(self) -> Level:
        return self.levels[-1]

    def __len__(self) -> int:
        return len(self.levels)

    def __iter__(self) -> Iterator[Level]:
        return iter(self.levels)

    def level_index(self, level: str | int) -> int:
        """Index of a level given by name or (possibly negative) position."""
        if isinstance(level, str):
            try:
                return self.names.index(level)
            except ValueError:
                raise HierarchyError(
                    f"no level named {level!r}; the levels are {list(self.names)}"
                ) from None
        k = int(level)
        if not -self.depth <= k < self.depth:
            raise HierarchyError(f"level index {k} out of range for {self.depth} levels")
        return k % self.depth

    def __getitem__(self, level: str | int) -> Level:
        return self.levels[self.level_index(level)]

    def __repr__(self) -> str:
        body = ", ".join(f"{lv.name}={lv.size}" for lv in self.levels)
        return f"Hierarchy({body})"

    # ------------------------------------------------------------------ structure
    def ancestor_index(self, level: str | int, ancestor_level: str | int) -> np.ndarray:
        """For every node of ``level``, the index of its ancestor at ``ancestor_level``."""
        k, a = self.level_index(level), self.level_index(ancestor_level)
        if a > k:
            raise HierarchyError(
                f"level {self.names[a]!r} is below {self.names[k]!r}; ancestors are above"
            )
        idx = np.arange(self.levels[k].size, dtype=np.int64)
        for j in range(k, a, -1):
            idx = self.levels[j].parent[idx]
        return idx

    def descendant_range(self, level: str | int, node: int, below: str | int) -> tuple[int, int]:
        """The contiguous index range ``[lo, hi)`` of ``node``'s descendants at ``below``."""
        k, b = self.level_index(level), self.level_index(below)
        if b < k:
            raise HierarchyError(f"level {self.names[b]!r} is above {self.names[k]!r}")
        lo, hi = int(node), int(node) + 1
        for j in range(k, b):
            lv = self.levels[j]
            if hi > lo:
                lo, hi = (
                    int(lv.child_start[lo]),
                    int(lv.child_start[hi - 1] + lv.child_count[hi - 1]),
                )
        return lo, hi

    def subtree(self, level: str | int, node: int) -> Hierarchy:
        """The hierarchy rooted at ``node`` of ``level``, with every level below it.

        Descendants are contiguous in canonical order, so the subtree is a slice of each
        level: its node ``j`` at depth ``d`` is node ``lo_d + j`` of level ``level + d``
        here, with ``lo_d`` from :meth:`descendant_range`. Levels below that hold no
        descendant are dropped. The canonical order is preserved.
        """
        k = self.level_index(level)
        if not 0 <= int(node) < self.levels[k].size:
            raise HierarchyError(
                f"node {int(node)} out of range for level {self.names[k]!r} "
                f"({self.levels[k].size} nodes)"
            )
        lo, hi = int(node), int(node) + 1
        out: list[Level] = []
        parent = np.full(1, -1, np.int64)
        for j in range(k, self.depth):
            lv = self.levels[j]
            start, count = lv.child_start[lo:hi], lv.child_count[lo:hi]
            child_lo, child_hi = int(start[0]), int(start[-1] + count[-1])
            if child_hi == child_lo:
                out.append(Level(lv.name, lv.codes[lo:hi], parent, *_empty_csr(hi - lo)))
                break
            out.append(Level(lv.name, lv.codes[lo:hi], parent, start - child_lo, count))
            parent = self.levels[j + 1].parent[child_lo:child_hi] - lo
            lo, hi = child_lo, child_hi
        return type(self)(out)

    def __eq__(self, other: object) -> bool:
        """Same level names, codes and parents (hence the same canonical tree)."""
        if not isinstance(other, Hierarchy):
            return NotImplemented
        return self.names == other.names and all(
            a.size == b.size
            and np.array_equal(a.parent, b.parent)
            and bool((a.codes == b.codes).all())
            for a, b in zip(self.levels, other.levels, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]  # equality is by value over arrays

    # ------------------------------------------------------------------ aggregation
    def aggregate_up(
        self, level: str | int, values: np.ndarray, *, cells: Sequence[str] | None = None
    ) -> np.ndarray:
        """Sum node values of ``level`` into their parents (one level up).

        Integer sums are exact: a sum beyond the int64 range is a :class:`DataError` naming
        the parent node, its level and the cell (``cells``: names of the columns), never a
        wrapped-around value.
        """
        k = self.level_index(level)
        if k == 0:
            raise HierarchyError("the root level has no parent level")
        up = self.levels[k - 1]
        values = np.asarray(values)
        if values.shape[0] != self.levels[k].size:
            raise HierarchyError(
                f"level {self.names[k]!r} has {self.levels[k].size} nodes but the values "
                f"have {values.shape[0]} rows"
            )
        out = np.zeros((up.size,) + values.shape[1:], dtype=values.dtype)
        nz = up.child_count > 0
        if values.shape[0]:
            starts = up.child_start[nz]
            terms = int(up.child_count.max())
            sums, overflow = exact_int64(
                lambda a: np.add.reduceat(a, starts, axis=0), values, terms
            )
            if overflow is not None:
                node, *cell = np.argwhere(overflow)[0]
                what = ""
                if cell:
                    what = f", cell {cells[cell[0]]!r}" if cells else f", cell {int(cell[0])}"
                raise DataError(
                    f"node {str(up.codes[np.flatnonzero(nz)[node]])!r} of level {up.name!r}"
                    f"{what}: the sum of its children in level {self.names[k]!r} exceeds the "
                    "int64 range (2^63 - 1), so it cannot be held exactly; check the input "
                    "counts for a unit or scale error"
                )
            out[nz] = sums
        return out

    def aggregate(
        self, leaf_values: np.ndarray, *, cells: Sequence[str] | None = None
    ) -> list[np.ndarray]:
        """Sum leaf values (shape ``(n_leaves, ...)``) to every level, root first (exact
        for integers, see :meth:`aggregate_up`)."""
        out = [np.asarray(leaf_values)]
        for k in range(self.depth - 1, 0, -1):
            out.append(self.aggregate_up(k, out[-1], cells=cells))
        return out[::-1]


_INT64_MAX = int(np.iinfo(np.int64).max)


def exact_int64(
    op: Callable[[np.ndarray], np.ndarray], values: np.ndarray, weight: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """``op(values)`` for a linear ``op`` with integer coefficients on int64 ``values``,
    and where its exact result leaves the int64 range.

    int64 arithmetic wraps around silently; it is exact modulo 2⁶⁴, so the int64 result is
    the exact one wherever the exact result lies in the int64 range, whatever happens to
    partial sums. ``weight`` bounds Σ|coefficient| of every output (the number of summands
    of a sum). When ``max|value| · weight`` fits, nothing can leave the range (one pass over
    the values); otherwise the result is bounded in float64 (error below
    2·(weight + 1)·2⁻⁵³·Σ|terms|) and only outputs near the bound are computed again in
    Python integers.

    Returns
    -------
    result : numpy.ndarray
        ``op(values)`` (int64 for int64 input; other dtypes are passed through unchecked).
    overflow : numpy.ndarray of bool or None
        None when every output is exact; else the outputs beyond the int64 range.
    """
    values = np.asarray(values)
    if values.dtype.kind not in "iu" or values.size == 0:
        return op(values), None
    if values.dtype.kind == "u":
        if int(values.max()) > _INT64_MAX:
            exact = op(values.astype(object))
            return exact, np.vectorize(lambda v: v > _INT64_MAX, otypes=[bool])(exact)
        values = values.astype(np.int64)
    out = op(values)
    big = max(int(values.max()), -int(values.min()))
    if big * max(int(weight), 1) <= _INT64_MAX:
        return out, None
    as_float = values.astype(np.float64)
    approx = np.abs(op(as_float))
    bound = op(np.abs(as_float))
    suspect = approx + 2.0 * (weight + 1) * 2.0**-53 * bound >= 2.0**63 * (1 - 2.0**-50)
    if not suspect.any():
        return out, None
    exact = op(values.astype(object))[suspect]
    over = np.zeros(out.shape, dtype=bool)
    over[suspect] = [v > _INT64_MAX or v < -_INT64_MAX - 1 for v in exact]
    return out, (over if over.any() else None)


#: From this many nodes on, ASCII codes are sorted as big-endian integer words.
INT_SORT_MIN = 1 << 16


def _ascii_words(codes: np.ndarray, max_words: int = 4) -> list[np.ndarray] | None:
    """Codes as big-endian uint64 words (NUL-padded ASCII), or None when not ASCII or long.

    Lexicographic order of NUL-padded ASCII bytes is the order of the strings (codes are
    assumed to contain no NUL characters), so sorting by the words sorts the codes.
    """
    width = int(np.strings.str_len(codes).max())
    words = max(1, -(-width // 8))
    if words > max_words:
        return None
    try:
        raw = codes.astype(f"S{8 * words}")
    except UnicodeEncodeError:
        return None
    view = raw.view(">u8").reshape(codes.shape[0], words)
    return [view[:, j].astype(np.uint64) for j in range(words)]


def _canonical_order(codes: np.ndarray, parent: np.ndarray) -> np.ndarray | None:
    """The permutation sorting nodes by ``(parent, code)`` (``np.lexsort((codes, parent))``),
    or None when the input is already in that order.

    Input that is already canonical (the usual case for files sorted by geography) is
    recognised in one linear pass. Otherwise the codes are sorted (stable) and then the
    parents by a stable integer sort; large levels of short ASCII codes are sorted as
    integer words, about twice as fast as a string sort.
    """
    n = codes.shape[0]
    if n < 2:
        return None
    dp = np.diff(parent)
    if bool((dp >= 0).all()) and bool(((dp > 0) | np.greater(codes[1:], codes[:-1])).all()):
        return None
    words = _ascii_words(codes) if n >= INT_SORT_MIN else None
    if words is None:
        order = np.argsort(codes, kind="stable")
    else:
        order = np.argsort(words[-1], kind="stable")
        for w in words[-2::-1]:
            order = order[np.argsort(w[order], kind="stable")]
    return order[np.argsort(parent[order], kind="stable")].astype(np.int64, copy=False)


def _empty_csr(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
