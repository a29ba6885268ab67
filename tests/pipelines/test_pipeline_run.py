"""End-to-end runs: outputs, invariants, the main job, and determinism across schedulers."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pandas as pd
import pytest

from censusdp.experiments.registry import run_experiment
from censusdp.hierarchy.synthetic import synthetic_us
from censusdp.pipelines.data import load_data
from censusdp.pipelines.runner import execute_spec, run_spec
from censusdp.pipelines.specs import load_spec

SPEC = """
[data]
source = "csv"
path = "{path}"
cells = ["population"]
[hierarchy]
levels = ["nation", "state", "county", "tract", "block"]
codes = {{ state = "block:2", county = "block:5", tract = "block:11", block = "block" }}
[privacy]
accounting = "zcdp"
rho = 0.5
level_shares = {{ county = 0.3, tract = 0.3, block = 0.4 }}
[queries]
county = ["detailed"]
tract = ["detailed"]
block = ["detailed"]
[invariants]
state = "total"
[mechanism]
noise = "discrete_gaussian"
[estimators]
run = {estimators}
integer = "{integer}"
[run]
repetitions = 2
seed = 11
"""


@pytest.fixture(scope="module")
def synthetic_csv(tmp_path_factory):
    table = synthetic_us(3, states=4, counties=20, tracts=60, blocks=300, population=60_000)
    df = pd.DataFrame(
        {
            "block": table.hierarchy.leaves.codes.astype(object),
            "population": table.leaf_counts[:, 0],
        }
    )
    path = tmp_path_factory.mktemp("data") / "blocks.csv"
    df.sample(frac=1.0, random_state=1).to_csv(path, index=False)  # row order must not matter
    return path, table


def _spec(tmp_path, csv, estimators='["gls", "topdown"]', integer="round"):
    p = tmp_path / "spec.toml"
    p.write_text(textwrap.dedent(SPEC.format(path=csv, estimators=estimators, integer=integer)))
    return load_spec(p)


def test_lattice_integer_step_conditions_on_the_integer_lattice(tmp_path):
    table = synthetic_us(5, states=2, counties=3, tracts=6, blocks=12, population=3_000)
    df = pd.DataFrame(
        {
            "block": table.hierarchy.leaves.codes.astype(object),
            "population": table.leaf_counts[:, 0],
        }
    )
    csv = tmp_path / "small.csv"
    df.to_csv(csv, index=False)
    text = SPEC.format(path=csv, estimators='["gls", "conditioning"]', integer="lattice")
    text = text.replace('accounting = "zcdp"\nrho = 0.5', 'accounting = "pure"\nepsilon = 2.0')
    (tmp_path / "spec.toml").write_text(text.replace("discrete_gaussian", "discrete_laplace"))
    spec = load_spec(tmp_path / "spec.toml")
    assert spec.mechanism.noise == "discrete_laplace"
    run_spec(spec, out=tmp_path / "out", progress=False)
    est = pd.read_parquet(tmp_path / "out" / "release" / "estimates.parquet")
    truth = table.hierarchy.aggregate(table.leaf_counts)
    for name in ("gls", "conditioning"):
        mine = est[est["estimator"] == name]
        blocks = mine[mine["level"] == "block"]["value"].to_numpy()
        assert np.array_equal(blocks, np.round(blocks)), name  # integers
        states = mine[mine["level"] == "state"]["value"].to_numpy()
        assert np.array_equal(states, truth[1][:, 0].astype(float)), name
    manifest = json.loads((tmp_path / "out" / "release" / "manifest.json").read_text())
    assert manifest["spec"]["estimators"]["integer"] == "lattice"


def test_lattice_integer_step_needs_an_integer_noise_law(tmp_path, synthetic_csv):
    from censusdp.errors import SpecError

    text = SPEC.format(path=synthetic_csv[0], estimators='["conditioning"]', integer="lattice")
    p = tmp_path / "spec.toml"
    p.write_text(textwrap.dedent(text).replace('"discrete_gaussian"', '"gaussian"'))
    with pytest.raises(SpecError, match="estimators.integer.*integer noise law"):
        load_spec(p)


def test_run_writes_every_output_and_keeps_invariants(tmp_path, synthetic_csv):
    csv, table = synthetic_csv
    res = run_spec(_spec(tmp_path, csv), out=tmp_path / "out", progress=False)
    out = tmp_path / "out"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [
        "censusdp-output.json",
        "evaluation/CONFIDENTIAL.txt",
        "evaluation/bias_slopes.png",
        "evaluation/bias_slopes.svg",
        "evaluation/errors_by_level.png",
        "evaluation/errors_by_level.svg",
        "evaluation/errors_by_size.png",
        "evaluation/errors_by_size.svg",
        "evaluation/manifest.json",
        "evaluation/metrics.csv",
        "evaluation/regressions.parquet",
        "evaluation/report.md",
        "evaluation/size_classes.csv",
        "release/estimates.parquet",
        "release/manifest.json",
        "release/privacy.md",
    ]
    assert res.release_dir == out / "release" and res.evaluation_dir == out / "evaluation"
    est = pd.read_parquet(out / "release" / "estimates.parquet")
    assert set(est["estimator"]) == {"gls", "topdown"}
    truth = table.hierarchy.aggregate(table.leaf_counts)[1][:, 0]
    for name in ("gls", "topdown"):
        states = est[(est["estimator"] == name) & (est["level"] == "state")]["value"].to_numpy()
        assert np.array_equal(states, truth.astype(float))  # invariant, exactly
        blocks = est[(est["estimator"] == name) & (est["level"] == "block")]["value"].to_numpy()
        assert np.array_equal(blocks, np.round(blocks))  # integer release
    manifest = json.loads((out / "release" / "manifest.json").read_text())
    assert manifest["confidential"] is False
    assert json.loads((out / "evaluation" / "manifest.json").read_text())["confidential"] is True
    assert "not for publication" in (out / "evaluation" / "report.md").read_text()
    assert manifest["spec"]["run"]["seed"] == "<redacted>"
    assert "11" not in json.dumps(manifest["spec"]["run"])
    assert "induced subspace" in manifest["privacy"]["gls"]["text"]
    assert len(res.metrics) == 2 * 2 * 5  # repetitions × estimators × levels


def test_demo_shows_topdown_bias_and_unbiased_gls(tmp_path):
    out, metrics = run_experiment("midwest-demo", out=tmp_path / "demo", quick=True, seed=2)
    tight = metrics["budgets"]["rho_0.001"]
    assert set(tight) == {"gls", "topdown"}  # conditioning: see CONDITIONING_REPETITIONS
    assert tight["topdown"]["mean_slope"] < -2.0
    assert abs(tight["gls"]["mean_slope"]) < 2.0
    assert tight["topdown"]["groups_with_negative_mean_slope_interval"] >= 1
    assert (out / "report.md").read_text().count("|") > 50
    assert (out / "rho_0.01" / "release" / "estimates.parquet").is_file()


def _frame(path):
    return pd.read_parquet(path / "release" / "estimates.parquet")


@pytest.fixture
def cluster(dask_executor) -> str:
    """The address of the shared local cluster (``dask_executor`` in conftest)."""
    return dask_executor.client.scheduler.address


@pytest.fixture
def own_cluster():
    """A cluster of the test's own, for a test that kills one of its workers."""
    from dask.distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=50,
        ) as c,
        Client(c) as client,
    ):
        yield c, client


@pytest.mark.parametrize(
    "matrix",
    [
        ([("threads", 3)], (3,)),
        pytest.param(
            ([("sync", 3), ("sync", 17), ("threads", 1), ("threads", 17)], (1, 17)),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["fast", "full"],
)
def test_estimates_identical_for_every_scheduler_and_partition_count(
    synthetic_csv, tmp_path, cluster, matrix
):
    """Every scheduler and partition count gives the one-partition sync run's release frame (what
    ``estimates.parquet`` holds) and metrics of every repetition: the fast form checks threads
    and the cluster at 3 partitions, the slow one the rest. In memory (``execute_spec``): the
    figures and report that ``run_spec`` adds do not depend on the scheduler."""
    local, on_cluster = matrix
    csv, _ = synthetic_csv
    spec = _spec(tmp_path, csv)
    data = load_data(spec)

    def frames(sched: str, parts: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        releases, metrics, _, _ = execute_spec(
            spec, data, scheduler=sched, partitions=parts, progress=False
        )
        return pd.concat([r.to_frame() for r in releases.values()], ignore_index=True), metrics

    ref, ref_metrics = frames("sync", 1)
    assert set(ref["estimator"]) == {"gls", "topdown"} and set(ref_metrics["repetition"]) == {0, 1}
    for sched, parts in local + [(cluster, n) for n in on_cluster]:
        got, metrics = frames(sched, parts)
        pd.testing.assert_frame_equal(got, ref, check_exact=True)
        pd.testing.assert_frame_equal(metrics, ref_metrics, check_exact=True)


@pytest.mark.slow  # ~20 s of CPU; the fast form: the [fast] case of the test above
def test_county_table_identical_across_schedulers(tmp_path, shared_file, cluster):
    spec_path = tmp_path / "county.toml"
    spec_path.write_text(
        textwrap.dedent(f"""
        [data]
        source = "csv"
        path = "{shared_file("county_totalpop_2010.csv")}"
        cells = ["pop_sf2010"]
        [hierarchy]
        levels = ["nation", "state", "county"]
        codes = {{ state = "state_fips", county = "fips" }}
        [privacy]
        accounting = "pure"
        epsilon = 0.192
        [queries]
        county = ["detailed"]
        [invariants]
        state = "total"
        [mechanism]
        noise = "discrete_laplace"
        [estimators]
        run = ["gls"]
        [run]
        seed = 5
    """)
    )
    spec = load_spec(spec_path)
    ref = _frame(
        run_spec(spec, out=tmp_path / "a", scheduler="sync", partitions=1, progress=False).out
    )
    for i, (sched, parts) in enumerate([("threads", 17), (cluster, 3)]):
        got = _frame(
            run_spec(
                spec, out=tmp_path / f"b{i}", scheduler=sched, partitions=parts, progress=False
            ).out
        )
        pd.testing.assert_frame_equal(got, ref, check_exact=True)
    states = ref[(ref["level"] == "state")]["value"].sum()
    assert states == 312_471_327  # the 52 state-level areas, held exactly


@pytest.mark.slow  # a worker process is killed and restarted (~50 s of CPU)
def test_killing_a_worker_mid_run_gives_the_same_output(tmp_path, synthetic_csv, own_cluster):
    from distributed import WorkerPlugin

    class KillOnce(WorkerPlugin):
        """Exits the first worker process that starts its third task (once per test)."""

        def __init__(self, marker):
            self.marker = marker
            self.started = 0

        def transition(self, key, start, finish, **kwargs):
            if finish == "executing":
                self.started += 1
                if self.started == 3 and not os.path.exists(self.marker):
                    open(self.marker, "w").close()
                    os._exit(1)

    csv, _ = synthetic_csv
    spec = _spec(tmp_path, csv)
    ref = _frame(
        run_spec(spec, out=tmp_path / "ref", scheduler="sync", partitions=3, progress=False).out
    )
    c, client = own_cluster
    marker = tmp_path / "killed"
    client.register_plugin(KillOnce(str(marker)), name="kill-once")
    try:
        got = _frame(
            run_spec(
                spec,
                out=tmp_path / "faulty",
                scheduler=c.scheduler_address,
                partitions=17,
                progress=False,
            ).out
        )
    finally:
        client.unregister_worker_plugin("kill-once")
    assert marker.exists(), "no worker was killed: the fault was not injected"
    pd.testing.assert_frame_equal(got, ref, check_exact=True)
    client.wait_for_workers(2, timeout=60)
