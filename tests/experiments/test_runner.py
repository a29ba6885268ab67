"""The studies' shared simulate-and-summarise loop (``registry.repeat``) and stage timer
(``ExperimentContext.timed``): checked against the loop every study used to write by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from censusdp.experiments.registry import ExperimentContext, repeat
from censusdp.rng import KeyedRNG


def _measure(rr: KeyedRNG) -> np.ndarray:
    return rr.child("measure").generator("noise").normal(size=4)


ESTIMATORS = {
    "mean": lambda m, rr: float(m.mean()),
    "shifted": lambda m, rr: m + rr.generator("own").integers(0, 10, size=4),
}


def test_repeat_is_the_hand_written_loop_run_by_run():
    rng = KeyedRNG.reproducible(5, warn=False)
    clock: dict[str, float] = {}
    out, measured = repeat(3, rng, _measure, ESTIMATORS, clock)
    for r in range(3):  # the reference: stream run/r, its measurements, then each estimator
        rr = rng.child(f"run/{r}")
        m = _measure(rr)
        assert np.array_equal(measured[r], m)
        assert out["mean"][r] == float(m.mean())
        assert np.array_equal(out["shifted"][r], m + rr.generator("own").integers(0, 10, size=4))
    assert list(out) == list(ESTIMATORS)  # the estimators' order
    # every estimator timed under its name, wall and CPU
    assert set(clock) == {"mean", "shifted", "cpu_mean", "cpu_shifted"}
    assert all(v >= 0 for v in clock.values())


def test_run_r_does_not_depend_on_the_number_of_runs_and_streams_differ():
    rng = KeyedRNG.reproducible(6, warn=False)
    few, _ = repeat(2, rng, _measure, ESTIMATORS)
    more, _ = repeat(4, rng, _measure, ESTIMATORS)
    assert few["mean"] == more["mean"][:2]
    assert len(set(more["mean"])) == 4  # every run its own noise
    other, _ = repeat(2, rng, _measure, ESTIMATORS, stream="release/{}")
    assert other["mean"] != few["mean"]
    ref = _measure(rng.child("release/1"))
    assert other["mean"][1] == float(ref.mean())


def test_timed_records_the_stage_seconds(tmp_path: Path):
    ctx = ExperimentContext(out=tmp_path, rng=KeyedRNG.reproducible(1, warn=False))
    with ctx.timed("load"):
        sum(range(1000))
    with ctx.timed("solve", cpu=True):
        sum(range(1000))
    assert list(ctx.timings) == ["load_seconds", "solve_seconds", "solve_cpu_seconds"]
    assert all(v >= 0 for v in ctx.timings.values())
    with pytest.raises(ZeroDivisionError), ctx.timed("fails"):
        1 / 0  # noqa: B018
    assert "fails_seconds" not in ctx.timings  # a failed stage writes nothing
