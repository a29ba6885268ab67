"""Euclidean projection onto capped simplices, every group of a level at once.

For a group of values ``z_1 … z_m`` with integer caps ``T_i ≥ 0`` and a target ``N`` with
``0 ≤ N ≤ Σ T_i``, the projection

    argmin ‖x − z‖²  subject to  0 ≤ x_i ≤ T_i,  Σ_i x_i = N

is ``x_i = clip(z_i − θ, 0, T_i)`` with ``θ`` the root of the dual function
``g(θ) = Σ_i clip(z_i − θ, 0, T_i) − N`` (the KKT conditions of the quadratic knapsack
problem: Helgason, Kennington & Lall 1980; Kiwiel 2008; for the capped simplex Wang & Lu
2015). ``g`` is continuous, non-increasing and piecewise linear with breakpoints
``z_i − T_i`` (where ``x_i`` leaves its cap) and ``z_i`` (where it reaches 0); its slope after
a breakpoint is minus the number of values strictly between their bounds. Sorting the ``2m``
breakpoints of every group (one ``lexsort`` for a whole level), ``g`` at each breakpoint is a
running sum within the group; the root lies in the last segment where ``g ≥ 0`` and is found
there by linear interpolation, then recomputed from that segment's free and capped sets
(``θ = (Σ_free z + Σ_capped T − N) / |free|``) as sums over the group alone, so that its
accuracy does not depend on the other groups. ``O(m log m)`` per group, no loop over groups.

References
----------
Helgason, R., Kennington, J. & Lall, H. (1980). A polynomially bounded algorithm for a
    singly constrained quadratic program. Math. Programming 18.
Kiwiel, K. C. (2008). Breakpoint searching algorithms for the continuous quadratic knapsack
    problem. Math. Programming 112.
Wang, W. & Lu, C. (2015). Projection onto the capped simplex. arXiv:1503.01002.
"""

from __future__ import annotations

import numpy as np

from censusdp.errors import DataError

__all__ = ["project_capped_simplex"]


def project_capped_simplex(
    z: np.ndarray, cap: np.ndarray, total: np.ndarray, count: np.ndarray, *, what: str = "groups"
) -> np.ndarray:
    """Project every group of ``z`` onto ``{0 ≤ x ≤ cap, Σ_group x = total}`` (module docstring).

    Parameters
    ----------
    z : (n,) float
        Values, sorted by group (``count[0]`` values of group 0 first, ...).
    cap : (n,) array
        Non-negative upper bounds (integers in the H1 use; any reals work).
    total : (P,) array
        Every group's target, ``0 ≤ total[p] ≤ Σ cap`` of the group.
    count : (P,) int
        Values per group.
    what : str
        What the groups are, for messages (e.g. ``"the blocks of block group 3"``).

    Returns
    -------
    (n,) float
        The projection; exact up to float rounding (``Σ_group x`` meets ``total`` to a few
        ulps of the group's magnitude).

    Raises
    ------
    DataError
        A non-finite value, a negative cap, or a group whose target is outside
        ``[0, Σ cap]`` (no feasible point), naming the first such group by index.
    """
    z = np.asarray(z, dtype=np.float64)
    cap = np.asarray(cap, dtype=np.float64)
    total = np.asarray(total, dtype=np.float64)
    count = np.asarray(count, dtype=np.int64)
    n, P = z.shape[0], count.shape[0]
    if cap.shape != z.shape or total.shape != (P,) or int(count.sum()) != n:
        raise DataError(
            f"capped-simplex projection of {what}: {n} values, {cap.shape[0]} caps, "
            f"{total.shape[0]} targets and {int(count.sum())} counted values; give one cap per "
            "value and one target per group"
        )
    if not (np.isfinite(z).all() and np.isfinite(cap).all() and np.isfinite(total).all()):
        raise DataError(f"capped-simplex projection of {what}: a value is not finite")
    grp = np.repeat(np.arange(P), count)
    room = np.bincount(grp, weights=cap, minlength=P)
    if (cap < 0).any():
        raise DataError(
            f"capped-simplex projection of {what}: a cap is negative; caps are the values' "
            "upper bounds (>= 0)"
        )
    bad = np.flatnonzero((total < 0) | (total > room + 1e-9 * np.maximum(1.0, room)))
    if bad.size:
        raise DataError(
            f"capped-simplex projection of {what}, group {int(bad[0])}: the target must lie "
            "in [0, sum of the group's caps]; the targets are not consistent with the caps"
        )
    if n == 0:
        return z.copy()
    # breakpoints of g, sorted within each group; +1 free value entering, -1 leaving
    b = np.concatenate([z - cap, z])
    g2 = np.concatenate([grp, grp])
    order = np.lexsort((b, g2))
    b, g2 = b[order], g2[order]
    step = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])[order]
    start = np.concatenate([[0], np.cumsum(2 * count)[:-1]])
    # number of free values just after each breakpoint, within its group (integer, exact)
    free = np.cumsum(step)
    free -= np.repeat(free[start] - step[start], 2 * count)
    # g(β_k) = Σ cap − Σ_{j<k} free_j (β_{j+1} − β_j), within the group
    inc = np.zeros(2 * n)
    inc[1:] = free[:-1] * np.diff(b)
    inc[start] = 0.0
    run = np.cumsum(inc)
    g = room[g2] - (run - np.repeat(run[start], 2 * count))
    # the last breakpoint with g ≥ total (g is non-increasing; g at the first one is Σ cap)
    above = np.bincount(g2, weights=g >= total[g2] - 1e-9 * np.maximum(1.0, room[g2]),
                        minlength=P).astype(np.int64)  # fmt: skip
    has = count > 0
    k = start[has] + np.maximum(above[has], 1) - 1
    theta = np.zeros(P)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = free[k].astype(np.float64)
        theta[has] = np.where(slope > 0, b[k] + (g[k] - total[has]) / slope, b[k])
    # recompute θ from its segment's free and capped sets, by sums over the group alone
    # (twice: the second pass settles a θ that the running sums put across a breakpoint)
    for _ in range(2):
        t = theta[grp]
        is_free = (z - t > 0.0) & (z - t < cap)
        n_free = np.bincount(grp, weights=is_free, minlength=P)
        s = np.bincount(grp, weights=np.where(is_free, z, 0.0), minlength=P)
        s += np.bincount(grp, weights=np.where(z - t >= cap, cap, 0.0), minlength=P)
        with np.errstate(divide="ignore", invalid="ignore"):
            theta = np.where(n_free > 0, (s - total) / n_free, theta)
    return np.clip(z - theta[grp], 0.0, cap)
