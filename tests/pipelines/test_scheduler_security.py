"""Remote Dask schedulers: TLS off the loopback, plaintext only where it stays on this machine
or where the spec says it accepts the risk. Refusals are checked without any network (the
addresses are RFC 5737 documentation addresses, never contacted); the one real connection is
a TLS cluster on 127.0.0.1."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from censusdp.app.cli import main
from censusdp.errors import SpecError
from censusdp.pipelines.execute import (
    DaskExecutor,
    is_loopback,
    open_executor,
    scheduler_security,
)
from censusdp.pipelines.specs import parse_spec

REMOTE = "tcp://192.0.2.7:8786"  # TEST-NET-1: documentation only, never routed


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to connect a Dask client fails the test."""
    import dask.distributed

    def refuse(*args, **kwargs):
        raise AssertionError("a refused address was contacted")

    monkeypatch.setattr(dask.distributed, "Client", refuse)


@pytest.mark.parametrize(
    ("host", "loop"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("192.0.2.7", False),
        ("0.0.0.0", False),
        ("::", False),
        ("localhost.example.org", False),
        ("127.0.0.1.example.org", False),
        ("scheduler", False),
    ],
)
def test_loopback_hosts(host, loop):
    assert is_loopback(host) is loop


def test_plain_tcp_off_the_loopback_is_refused_with_the_risk_explained(no_network):
    with pytest.raises(SpecError) as err:
        scheduler_security(REMOTE)
    msg = str(err.value)
    for part in ("plaintext", "confidential counts", "subtract the noise", "tls://", "tls_ca_file"):
        assert part in msg
    assert "allow_insecure_network = true" in msg
    with pytest.raises(SpecError, match="plaintext"), open_executor(REMOTE):
        pass
    with pytest.raises(SpecError, match="plaintext"), open_executor("distributed", address=REMOTE):
        pass
    with pytest.raises(SpecError, match="plaintext"):
        DaskExecutor(REMOTE)


def test_plain_tcp_on_the_loopback_or_acknowledged_needs_no_tls():
    for address in ("tcp://127.0.0.1:8786", "tcp://localhost:1", "tcp://[::1]:8786"):
        assert scheduler_security(address) is None
    assert scheduler_security(REMOTE, allow_insecure_network=True) is None


def test_tls_needs_its_three_files(tmp_path, no_network):
    import dask

    with dask.config.set({"distributed.comm.tls.ca-file": None}):
        with pytest.raises(SpecError, match="tls_ca_file, tls_cert, tls_key"):
            scheduler_security("tls://192.0.2.7:8786")
        with pytest.raises(SpecError, match=r"\[run\] tls_cert: .* is not a file"):
            ca = tmp_path / "ca.pem"
            ca.write_text("x")
            scheduler_security(
                "tls://192.0.2.7:8786",
                tls_ca_file=ca,
                tls_cert=tmp_path / "nope.pem",
                tls_key=ca,
            )
    with pytest.raises(SpecError, match="expected tls://HOST:PORT"):
        scheduler_security("ucx://192.0.2.7:8786")
    with pytest.raises(SpecError, match="has no host"):
        scheduler_security("tcp://:8786")


def test_a_cluster_with_plaintext_workers_elsewhere_is_refused():
    """A loopback scheduler whose workers listen in plaintext on other machines would ship
    the tasks there: refused before any task is submitted."""

    class _Client:
        scheduler = type("S", (), {"address": "tcp://127.0.0.1:8786"})()
        closed = False

        def scheduler_info(self):
            return {"workers": {"tcp://127.0.0.1:40001": {}, "tcp://192.0.2.9:40002": {}}}

        def submit(self, *a, **k):
            raise AssertionError("a task was submitted")

        def close(self):
            self.closed = True

    with pytest.raises(SpecError, match="192.0.2.9"):
        DaskExecutor(client=_Client())
    ex = DaskExecutor(client=_Client(), allow_insecure_network=True)
    assert ex.workers == 2


SPEC = """
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
level_shares = {{ state = 0.5, county = 0.5 }}
[queries]
state = ["detailed"]
county = ["detailed"]
[mechanism]
noise = "discrete_laplace"
[estimators]
run = ["gls"]
"""


def _spec_file(tmp_path: Path, extra: str = "") -> Path:
    data = tmp_path / "d.csv"
    data.write_text("fips,pop\n01001,10\n01003,20\n02001,5\n02002,7\n")
    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent(SPEC.format(data=data)) + extra)
    return spec


def test_cli_refuses_a_plaintext_remote_scheduler_before_any_work(tmp_path, capsys, no_network):
    spec = _spec_file(tmp_path)
    out = tmp_path / "out"
    code = main(["run", str(spec), "--out", str(out), "--seed", "1", "--scheduler", REMOTE])
    err = capsys.readouterr().err
    assert code == 2 and "plaintext" in err and "Traceback" not in err
    assert not out.exists()
    spec = _spec_file(tmp_path, f'[run]\nscheduler = "distributed"\naddress = "{REMOTE}"\n')
    assert main(["run", str(spec), "--out", str(out), "--seed", "1"]) == 2
    assert "allow_insecure_network" in capsys.readouterr().err and not out.exists()


def test_spec_network_keys(tmp_path):
    doc = {
        "data": {"source": "midwest"},
        "hierarchy": {"levels": ["region", "state", "county"]},
        "privacy": {"accounting": "zcdp", "rho": 1.0},
        "queries": {"county": ["total"]},
        "mechanism": {"noise": "discrete_gaussian"},
        "run": {
            "scheduler": "distributed",
            "address": "tls://127.0.0.1:8786",
            "tls_ca_file": "ca.pem",
            "tls_cert": "/abs/client.pem",
            "tls_key": "client.key",
        },
    }
    spec = parse_spec(doc, "s.toml", tmp_path)
    assert spec.run.tls_ca_file == tmp_path / "ca.pem"
    assert spec.run.tls_cert == Path("/abs/client.pem")
    assert spec.run.network()["allow_insecure_network"] is False
    assert parse_spec(spec.to_dict(redact_seed=False), "s.toml").run == spec.run
    del doc["run"]["tls_key"]
    with pytest.raises(SpecError, match="run.tls_key: missing; TLS needs all of"):
        parse_spec(doc, "s.toml", tmp_path)
    doc["run"] = {"allow_insecure_network": "yes"}
    with pytest.raises(SpecError, match="run.allow_insecure_network: expected true or false"):
        parse_spec(doc, "s.toml")
    doc["run"] = {"allow_insecure_network": True}
    assert parse_spec(doc, "s.toml").run.network()["allow_insecure_network"] is True


def _certificates(d: Path) -> dict[str, Path]:
    """A CA and one certificate it signs for 127.0.0.1 (used by scheduler, workers and
    client alike), made with the openssl command."""
    ca_key, ca, key, csr, cert = (d / n for n in ("ca.key", "ca.pem", "k.pem", "c.csr", "c.pem"))
    ext = d / "ext.cnf"
    ext.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    new = ("req", "-newkey", "rsa:2048", "-nodes", "-subj")
    run(
        *new, "/CN=censusdp-test-ca", "-x509", "-days", "1", "-keyout", str(ca_key), "-out", str(ca)
    )
    run(*new, "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr))
    run(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext),
    )  # fmt: skip
    return {"ca": ca, "cert": cert, "key": key}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_tls_cluster_on_the_loopback_gives_the_same_measurements(tmp_path):
    """Joining a TLS scheduler with spec-given files: encrypted, and bit-identical."""
    from dask.distributed import LocalCluster
    from distributed.security import Security

    from censusdp.hierarchy import Hierarchy
    from censusdp.mechanisms.discrete import DiscreteGaussian
    from censusdp.mechanisms.queries import Query, measure
    from censusdp.pipelines.measure import measure_partitioned
    from censusdp.pipelines.partition import partition_units
    from censusdp.rng import KeyedRNG

    files = _certificates(tmp_path)
    both = {"tls_ca_file": str(files["ca"])}
    for role in ("scheduler", "worker", "client"):
        both[f"tls_{role}_cert"] = str(files["cert"])
        both[f"tls_{role}_key"] = str(files["key"])
    server = Security(require_encryption=True, **both)
    h = Hierarchy.from_parents(
        ["nation", "state", "county"],
        [["US"], ["a", "b"], ["a1", "a2", "b1"]],
        [None, np.zeros(2, int), np.array([0, 0, 1])],
    )
    counts = h.aggregate(np.array([[3, 4], [5, 6], [7, 8]]))
    plan = [(k, Query.detailed(["x", "y"]), DiscreteGaussian(2.0)) for k in (1, 2)]
    rng = KeyedRNG.reproducible(9, warn=False)
    want = measure(h.names, counts, plan, rng)
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol="tls://",
        host="127.0.0.1",
        security=server,
        dashboard_address=None,
    ) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:")
        with open_executor(
            address,
            tls_ca_file=files["ca"],
            tls_cert=files["cert"],
            tls_key=files["key"],
        ) as ex:
            assert ex.client.security.require_encryption
            got = measure_partitioned(h.names, counts, plan, rng, partition_units(h, 1, 2), ex)
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a.values, b.values)
