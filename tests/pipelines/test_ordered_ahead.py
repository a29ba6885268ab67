"""``ordered_ahead``: results in order, a free thread takes the next item at once, at most
``workers`` items computed ahead of the consumer, errors raised where the item is consumed."""

from __future__ import annotations

import threading
import time

import pytest

from censusdp.pipelines.execute import ordered_ahead


def test_results_in_order_whatever_finishes_first() -> None:
    delays = [0.05, 0.0, 0.03, 0.0, 0.01, 0.0]

    def work(i: int) -> int:
        time.sleep(delays[i])
        return i * i

    for workers in (1, 2, 3):
        assert list(ordered_ahead(work, range(len(delays)), workers)) == [i * i for i in range(6)]


def test_a_free_thread_takes_the_next_item_while_a_slow_one_runs() -> None:
    """Item 0 waits until item 2 has started: with groups of two that wait for their slower
    one, item 2 would never start and item 0 would time out."""
    third_started = threading.Event()

    def work(i: int) -> bool:
        if i == 2:
            third_started.set()
        return third_started.wait(10) if i == 0 else True

    assert list(ordered_ahead(work, range(4), 2)) == [True] * 4


def test_at_most_workers_items_ahead_of_the_consumer() -> None:
    started = 0
    lock = threading.Lock()

    def work(i: int) -> int:
        nonlocal started
        with lock:
            started += 1
        return i

    for consumed, i in enumerate(ordered_ahead(work, range(20), 3), start=1):
        time.sleep(0.002)
        with lock:
            # the consumed ones, the one being handed over and at most three submitted ahead
            assert started <= consumed + 3
        assert i == consumed - 1


def test_an_error_is_raised_in_the_consumer() -> None:
    def work(i: int) -> int:
        if i == 3:
            raise ValueError("item 3")
        return i

    got = []
    with pytest.raises(ValueError, match="item 3"):
        for x in ordered_ahead(work, range(6), 2):
            got.append(x)
    assert got == [0, 1, 2]
