"""The one partition driver (pipelines/partition_driver.py) against an obviously-correct
reference: a toy step whose three passes are a per-partition sum (up), an exclusive prefix
sum over the partitions (top) and each element plus its partition's offset times a weight
(down), so every result is known in closed form. Every executor, order, thread count and
cache budget must give the reference exactly (``==``), the cache must hold exactly the
states that fit, and what the run left on the executor must be released, also on errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.errors import SpecError
from censusdp.pipelines.execute import SyncExecutor, ThreadExecutor
from censusdp.pipelines.partition_driver import (
    DriverOptions,
    PartitionDriver,
    Task,
    drive,
)


def _up(values: np.ndarray) -> np.ndarray:
    return values.copy()  # the state: the partition's values


def _message(state: np.ndarray) -> tuple[int, int]:
    return int(state.sum()), state.nbytes


def _down(item: tuple, weight: int) -> tuple[np.ndarray, bool]:
    state, values, offset = item
    fresh = state is None
    if fresh:
        state = _up(values)
    return state + weight * offset, fresh


@dataclass(eq=False)
class _PrefixStep:
    parts: list[np.ndarray]
    weight: int = 3
    offsets: list[int] = field(default_factory=list)
    fail_top: bool = False
    message_fn = staticmethod(_message)

    def up(self, pos: int) -> Task:
        return Task(_up, self.parts[pos])

    def top(self, messages: list[int]) -> None:
        if self.fail_top:
            raise RuntimeError("top failed")
        self.offsets = [int(x) for x in np.concatenate([[0], np.cumsum(messages)[:-1]])]

    def down(self, pos: int, state: np.ndarray | None) -> Task:
        values = None if state is not None else self.parts[pos]
        return Task(_down, (state, values, self.offsets[pos]), (self.weight,))


def _reference(parts: list[np.ndarray], weight: int = 3) -> list[np.ndarray]:
    out, offset = [], 0
    for p in parts:
        out.append(np.array([int(v) + weight * offset for v in p], dtype=np.int64))
        offset += sum(int(v) for v in p)
    return out


def _parts(sizes: list[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-50, 50, size=n).astype(np.int64) for n in sizes]


def _run(parts, executor=None, **opts):
    step = _PrefixStep(parts)
    driver = PartitionDriver(len(parts), executor, DriverOptions(**opts))
    got: dict[int, tuple] = {}
    drive(step, driver, got.__setitem__)
    return [got[i][0] for i in range(len(parts))], [got[i][1] for i in range(len(parts))], driver


class _Recording(SyncExecutor):
    """The reference backend, recording every task it runs and every handle released."""

    def __init__(self) -> None:
        self.tasks: list[str] = []
        self.released = 0

    def submit(self, fn, items, *extra, cost=None):
        self.tasks += [fn.__name__] * len(items)
        return super().submit(fn, items, *extra, cost=cost)

    def release(self, handles):
        self.released += len(handles)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=7),
    seed=st.integers(0, 2**16),
    budget=st.one_of(st.none(), st.integers(0, 200)),
    workers=st.integers(1, 3),
    data=st.data(),
)
def test_driver_equals_reference_for_any_order_workers_and_budget(
    sizes, seed, budget, workers, data
):
    parts = _parts(sizes, seed)
    order = data.draw(st.permutations(range(len(parts))))
    want = _reference(parts)
    got, fresh, driver = _run(parts, cache_bytes=budget, order=order, workers=workers)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    # the cache holds, in submission order, every state that still fits the budget
    used, cached = 0, set()
    for pos in order:
        size = parts[pos].nbytes
        if budget is None or used + size <= budget:
            cached.add(pos)
            used += size
    assert [not f for f in fresh] == [i in cached for i in range(len(parts))]
    stats = driver.stats()
    assert stats["partitions_regenerated"] == len(parts) - len(cached)
    assert stats["cache_bytes_used"] == used


@pytest.mark.parametrize("make", [SyncExecutor, lambda: ThreadExecutor(3), _Recording])
def test_every_executor_gives_the_reference(make):
    parts = _parts([5, 0, 3, 7, 1, 4], 7)
    ex = make()
    try:
        for budget in (None, 0, 64):
            got, _, driver = _run(parts, ex, cache_bytes=budget, order=[3, 1, 5, 0, 2, 4])
            assert all(np.array_equal(a, b) for a, b in zip(got, _reference(parts), strict=True))
            assert driver.stats()["executor"] == ex.name
    finally:
        ex.close()


def test_tasks_go_through_the_executor_and_are_released():
    parts = _parts([2, 3, 4], 1)
    ex = _Recording()
    got, _, _ = _run(parts, ex, cache_bytes=None)
    assert ex.tasks == ["_up", "_message"] * 3 + ["_down"] * 3
    # per partition: its message handle after pass 1, its state and result after pass 3
    assert ex.released == 3 * 3


def test_keep_returns_results_by_position():
    parts = _parts([4, 2, 5], 3)
    for ex in (None, _Recording()):
        step = _PrefixStep(parts)
        driver = PartitionDriver(len(parts), ex, DriverOptions(cache_bytes=40, order=[2, 0, 1]))
        kept = drive(step, driver)
        got = [value for value, _ in kept]
        assert all(np.array_equal(a, b) for a, b in zip(got, _reference(parts), strict=True))
        assert [fresh for _, fresh in kept] == [True, True, False]  # only partition 2 fits


def test_an_error_in_the_top_releases_what_the_run_holds():
    parts = _parts([3, 3], 2)
    ex = _Recording()
    step = _PrefixStep(parts, fail_top=True)
    driver = PartitionDriver(2, ex, DriverOptions(cache_bytes=None))
    driver.share(np.arange(3))
    with pytest.raises(RuntimeError, match="top failed"):
        drive(step, driver)
    assert driver.cached == {} and driver.shared == []
    assert ex.released == 2 + 1 + 2  # two messages; then the shared value and two states


def test_bad_options_are_refused():
    with pytest.raises(SpecError, match="every partition position once"):
        PartitionDriver(3, None, DriverOptions(order=[0, 0, 1]))
    with pytest.raises(SpecError, match="not both"):
        PartitionDriver(3, SyncExecutor(), DriverOptions(workers=2))


def test_dask_as_completed_and_cached_handles_give_the_reference(dask_executor):
    """On Dask the messages and (``in_order=False``) the results are taken as they complete
    and placed by position; cached states stay on the workers as handles."""
    parts = _parts([6, 1, 4, 0, 5, 3, 2], 11)
    for budget, in_order in ((None, False), (60, False), (0, True)):
        step = _PrefixStep(parts)
        opts = DriverOptions(cache_bytes=budget, order=[6, 0, 5, 1, 4, 2, 3], ahead=3)
        driver = PartitionDriver(len(parts), dask_executor, opts)
        got: dict[int, tuple] = {}
        drive(step, driver, got.__setitem__, in_order=in_order)
        want = _reference(parts)
        assert all(np.array_equal(got[i][0], want[i]) for i in range(len(parts)))
        fresh = sum(f for _, f in got.values())
        assert fresh == driver.stats()["partitions_regenerated"]
        if budget is None:
            assert fresh == 0
        elif budget == 0:  # only the empty partition's state fits
            assert fresh == sum(p.size > 0 for p in parts) == len(parts) - 1
        else:  # which fit depends on the completion order; some do, not all
            assert 0 < fresh < len(parts)
