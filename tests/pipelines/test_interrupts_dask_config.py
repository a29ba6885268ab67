"""``workers_ignore_interrupts`` must leave Dask's configuration whole.

A ``dask.config.set`` of a ``distributed.*`` key made before ``distributed`` is imported
records the whole ``distributed`` section as new, and on exit deletes it — including what the
import inside the block added — so every later cluster in the process fails with
``KeyError: 'distributed'``. That is what the full suite showed after an in-process run whose
Dask workers died at start-up. The check runs in a fresh interpreter, where ``distributed``
has not been imported yet.
"""

from __future__ import annotations

import subprocess
import sys

CODE = """
import dask
from censusdp.pipelines.interrupts import workers_ignore_interrupts
with workers_ignore_interrupts("distributed"):
    import dask.distributed
print(dask.config.get("distributed.comm.require-encryption", default="MISSING"))
"""


def test_the_distributed_config_survives_the_preload_block():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() != "MISSING", out.stdout
