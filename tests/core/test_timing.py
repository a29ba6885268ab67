"""censusdp.timing.stage: wall and CPU seconds per stage, added up, recorded on errors."""

from __future__ import annotations

import threading
import time

import pytest

from censusdp.timing import stage


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_stage_records_wall_and_cpu_and_adds_up():
    seconds = {"other": 1.5}
    with stage(seconds, "sleep"):
        time.sleep(0.05)
    assert set(seconds) == {"other", "sleep", "cpu_sleep"}
    assert seconds["other"] == 1.5
    assert seconds["sleep"] >= 0.05
    assert seconds["cpu_sleep"] < 0.04  # sleeping takes wall time, not CPU
    first = seconds["sleep"]
    with stage(seconds, "sleep"):
        time.sleep(0.02)
    assert seconds["sleep"] >= first + 0.02


def test_stage_counts_only_the_calling_threads_cpu():
    seconds: dict = {}
    other = threading.Thread(target=_spin, args=(0.2,))
    with stage(seconds, "wait"):
        other.start()
        other.join()
    assert seconds["wait"] >= 0.15
    assert seconds["cpu_wait"] < 0.1  # the other thread's CPU is not this stage's
    with stage(seconds, "spin"):
        _spin(0.05)
    assert seconds["cpu_spin"] >= 0.05
    other = threading.Thread(target=_spin, args=(0.2,))
    with stage(seconds, "process", cpu=time.process_time):
        other.start()
        other.join()
    assert seconds["cpu_process"] >= 0.19  # the process clock counts the other thread


def test_stage_records_when_the_body_raises():
    seconds: dict = {}
    with pytest.raises(ValueError, match="boom"), stage(seconds, "fail"):
        time.sleep(0.01)
        raise ValueError("boom")
    assert seconds["fail"] >= 0.01 and "cpu_fail" in seconds


class _SlowReads(dict):
    """A dict whose reads give other threads the interpreter, so an unserialised
    read-add-write of the same key loses additions."""

    def get(self, key, default=None):
        value = super().get(key, default)
        time.sleep(0.0005)
        return value


def test_stage_adds_every_threads_seconds_to_a_shared_dict():
    """Each stage adds exactly 1 CPU second (a clock that reads 0 then 1); eight threads
    sharing one dict must leave all 200 additions in it."""
    counted = _SlowReads()
    n_threads, n_stages = 8, 25

    def count() -> None:
        clock = _one_per_call()
        for _ in range(n_stages):
            with stage(counted, "n", cpu=clock):
                pass

    threads = [threading.Thread(target=count) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counted["cpu_n"] == n_threads * n_stages


def _one_per_call():
    """A CPU clock that reads 0, 1, 0, 1, ...: one second per stage."""
    calls = iter(range(10**6))
    return lambda: float(next(calls) % 2)
