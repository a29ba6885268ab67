"""file_sha256, the one file hash of the ownership manifests, against hashlib on the bytes."""

from __future__ import annotations

import hashlib

import numpy as np

from censusdp.atomic import file_sha256


def test_matches_hashlib_on_the_bytes(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 3 * (1 << 20) + 17, np.uint8).tobytes()
    for name, body in [("empty", b""), ("big", data)]:
        (tmp_path / name).write_bytes(body)
        assert file_sha256(tmp_path / name) == hashlib.sha256(body).hexdigest()
    # power: one byte changed anywhere changes the digest
    changed = bytearray(data)
    changed[-1] ^= 1
    (tmp_path / "changed").write_bytes(bytes(changed))
    assert file_sha256(tmp_path / "changed") != file_sha256(tmp_path / "big")
