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
