"""The digest of a run does not depend on the BLAS kernels (issue 36).

A small two-state pl94 run (streamed engine: measurements, structured GLS, standard errors,
controlled rounding, store) is made in two processes, one with OpenBLAS's Haswell kernels and
one with its Sandybridge kernels (``OPENBLAS_CORETYPE``), and the store digests must be equal.
Before the per-block algebra moved to :mod:`censusdp.estimation.gls.block_kernels` they were not
(the estimates and covariance blocks differed in their last bits; the integer tables did not).

The test shows its power in the same run: the two processes must get different bits from
numpy's own BLAS/LAPACK (a 64 × 64 product and ``eigh``) — else the core type did not take
effect here (another BLAS, a processor without AVX2) and the test is skipped, not passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import hashlib, json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import numpy as np
from pl94_fixtures import PLAN, QUERIES, SCHEMA, small_us
from censusdp.pipelines.io.pl94_store import Pl94StoreWriter
from censusdp.pipelines.products.pl94_stream import Pl94StreamOptions, stream_pl94
from censusdp.rng import KeyedRNG

h, source = small_us(counties=3, tracts=6, block_groups=12, blocks=200, population=5000)
rng = KeyedRNG.reproducible(11, warn=False)
with tempfile.TemporaryDirectory() as d:
    with Pl94StoreWriter(Path(d) / "s", h, SCHEMA) as w:
        res = stream_pl94(h, SCHEMA, source, PLAN, rng, on_top=w.top, on_partition=w.partition,
                          options=Pl94StreamOptions(partitions=2))
        digest = w.finish(res, QUERIES)["digest"]
g = np.random.default_rng(0)
A = g.normal(size=(64, 64))
blas = hashlib.sha256(np.linalg.eigh(A @ A.T)[1].tobytes() + (A @ A).tobytes()).hexdigest()
print(json.dumps({"digest": digest, "blas": blas}))
"""


def _openblas() -> bool:
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
    return "openblas" in str(blas.get("name", "")).lower()


@pytest.mark.skipif(not _openblas(), reason="numpy is not built with OpenBLAS")
def test_digest_is_the_same_under_haswell_and_sandybridge_kernels() -> None:
    procs = []
    for core in ("Haswell", "Sandybridge"):
        env = {**os.environ, "OPENBLAS_CORETYPE": core, "OPENBLAS_NUM_THREADS": "1"}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SCRIPT, str(TESTS)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-2000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    haswell, sandybridge = out
    if haswell["blas"] == sandybridge["blas"]:
        pytest.skip("OPENBLAS_CORETYPE gives the same BLAS bits on this machine: no power")
    assert haswell["digest"] == sandybridge["digest"]
