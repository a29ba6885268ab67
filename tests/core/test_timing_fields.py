"""Stage timing through censusdp.timing.stage keeps every reported field (issue 34 point 6).

The library reads the clocks only through :func:`censusdp.timing.stage`; the diagnostics,
manifests and metrics that report seconds keep their keys (no ``cpu_`` key leaks from a
stage into a field that reported wall seconds only) and their nesting (a run's total holds
its stages).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np

from censusdp.estimation.gls.predict import predict_errors
from censusdp.estimation.gls.tree import tree_gls
from censusdp.hierarchy.synthetic import random_hierarchy
from censusdp.mechanisms.laws import Gaussian
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.mechanisms.queries import Query, measure
from censusdp.rng import KeyedRNG
from censusdp.schema import Schema

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("censusdp", "hierarchy", "mechanisms", "estimation", "pipelines", "experiments", "app")
#: The one place that reads the clocks, and the files other work still moves onto it (remove
#: an entry when its file no longer reads a clock; never add one).
CLOCK_READERS = {"censusdp/timing.py"}
CLOCK_CALL = re.compile(r"\b(perf_counter|process_time|thread_time|monotonic)\(\)|time\.time\(\)")


def test_the_library_reads_clocks_only_through_stage():
    readers = {
        p.relative_to(ROOT).as_posix()
        for d in LIBRARY
        for p in (ROOT / d).rglob("*.py")
        if CLOCK_CALL.search(p.read_text(encoding="utf-8"))
    }
    assert readers - CLOCK_READERS == set(), "time a stage with censusdp.timing.stage"
    assert "censusdp/timing.py" in readers  # the pattern finds a reader where there is one


def test_tree_gls_and_predict_keep_their_timing_keys():
    gen = np.random.default_rng(3)
    h = random_hierarchy(gen, [(2, 3), (1, 4)])
    counts = h.aggregate(gen.integers(0, 50, size=(h.leaves.size, 1)))
    total = Query.total(["pop"])
    plan = [(k, total, Gaussian(2.0)) for k in range(h.depth)]
    meas = measure(h.names, counts, plan, KeyedRNG.reproducible(1, warn=False))
    rel = tree_gls(h, ["pop"], meas, [], None)
    timed = {k: v for k, v in rel.diagnostics.items() if "seconds" in k}
    assert set(timed) == {"seconds_setup", "seconds_solve"}
    assert all(isinstance(v, float) and v >= 0.0 for v in timed.values())

    s = Schema.load("sex_age5")
    q = ProductQuery.parse(s, "sex * ageband")
    pred = predict_errors(h, s, [(n, q, Gaussian(1.0)) for n in h.names], [])
    timed = {k: v for k, v in pred.diagnostics.items() if "seconds" in k}
    assert set(timed) == {"seconds_classes", "seconds_passes"}
    assert all(isinstance(v, float) and v >= 0.0 for v in timed.values())

    from censusdp.estimation.gls.structured import structured_gls
    from censusdp.mechanisms.product_measure import measure_products

    leaves = gen.integers(0, 5, size=(h.leaves.size, *s.shape))
    detailed = ProductQuery.parse(s, "sex * ageband")
    plan = [(n, detailed, Gaussian(1.0)) for n in h.names]
    meas = measure_products(h.aggregate(leaves), plan, KeyedRNG.reproducible(2, warn=False),
                            level_names=h.names)  # fmt: skip
    rel = structured_gls(h, s, meas)
    timed = {k: v for k, v in rel.diagnostics.items() if "seconds" in k}
    assert set(timed) == {"seconds_setup", "seconds_solve", "seconds_output"}
    assert all(isinstance(v, float) and v >= 0.0 for v in timed.values())


def test_a_run_manifest_keeps_its_timings_and_total_holds_the_stages(tmp_path):
    from censusdp.pipelines.data import load_data
    from censusdp.pipelines.runner import execute_spec
    from censusdp.pipelines.specs import load_spec

    data = tmp_path / "d.csv"
    data.write_text("fips,pop\n01001,10\n01003,20\n02001,5\n02002,7\n")
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(
        textwrap.dedent(
            f"""
            [data]
            source = "csv"
            path = "{data}"
            cells = ["pop"]
            [hierarchy]
            levels = ["nation", "state", "county"]
            codes = {{ state = "fips:2", county = "fips" }}
            [privacy]
            accounting = "pure"
            epsilon = 1.0
            level_shares = {{ nation = 0.2, state = 0.3, county = 0.5 }}
            [queries]
            nation = ["detailed"]
            state = ["detailed"]
            county = ["detailed"]
            [mechanism]
            noise = "discrete_laplace"
            [estimators]
            run = ["topdown", "gls"]
            [run]
            repetitions = 2
            """
        )
    )
    spec = load_spec(spec_file)
    _, _, _, manifest = execute_spec(spec, load_data(spec, None), seed=1, progress=False)
    t = manifest["timings_seconds"]
    assert list(t) == ["plan", "measure", "topdown", "gls", "total"]  # order as first run
    assert all(isinstance(v, float) and v > 0.0 for v in t.values())
    parts = t["plan"] + t["measure"] + t["topdown"] + t["gls"]
    assert t["total"] >= parts - 1e-9  # disjoint stages within the run's wall time
