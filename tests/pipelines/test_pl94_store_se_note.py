"""The national pl94 store says its standard errors are GLS-only (issue 33: the national
stream rounds no replicates, so the stored integers' rounding error is not in them).

A small store written by the streamed engine: its manifest carries
:data:`~censusdp.pipelines.io.pl94_store.SE_NOTE` under ``standard_errors``, a reader returns it,
and it is inside the release digest (editing it is refused by a reader given the digest).
The store is small enough that a partition owns no covariance class (its blocks piece has
0 rows: written, where it used to fail on ``reshape(0, -1)``).
"""

from __future__ import annotations

import json

import pytest
from pl94_fixtures import PLAN, QUERIES, SCHEMA, small_us

from censusdp.errors import DataError
from censusdp.pipelines.io.pl94_store import SE_NOTE, Pl94Store, Pl94StoreWriter
from censusdp.pipelines.products.pl94_stream import stream_pl94
from censusdp.rng import KeyedRNG


def test_the_manifest_says_the_standard_errors_are_gls_only(tmp_path) -> None:
    h, source = small_us(counties=2, tracts=2, block_groups=2, blocks=12, population=300)
    path = tmp_path / "store"
    with Pl94StoreWriter(path, h, SCHEMA) as w:
        res = stream_pl94(h, SCHEMA, source, PLAN, KeyedRNG.reproducible(3, warn=False),
                          partitions=2, on_top=w.top, on_partition=w.partition)  # fmt: skip
        summary = w.finish(res, QUERIES)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["standard_errors"] == SE_NOTE
    assert SE_NOTE.startswith("GLS only") and "without rounding replicates" in SE_NOTE
    store = Pl94Store(path, expected_digest=summary["release_digest"])
    assert store.manifest["standard_errors"] == SE_NOTE
    # the note is bound by the release digest like the privacy statement
    manifest["standard_errors"] = "includes the rounding"
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    with pytest.raises(DataError):
        Pl94Store(path, expected_digest=summary["release_digest"]).tables("county")
