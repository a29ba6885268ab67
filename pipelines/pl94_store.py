"""The release store of a streamed ``pl94`` run, written partition by partition.

:class:`Pl94StoreWriter` plugs into :func:`~censusdp.pipelines.pl94_stream.stream_pl94`
(``on_top=store.top``, ``on_partition=store.partition``) and writes each piece as it comes,
so memory never holds more than one partition's tables. :class:`Pl94Store` reads it back and
trusts nothing it reads.

What is stored, per level and node:

* the integer **P1–P5 tables** (:func:`~censusdp.pipelines.pl94_tables.tabulate` of the rounded
  cell tensors: 298 columns), in the smallest integer dtype that holds the file's values;
* the **variance information** from which the standard error of any product query row (table
  column or not) is computed: the GLS covariance blocks in the marginal basis
  (:class:`~censusdp.estimation.marginal_basis.BlockDiagonal`, one small ``n_S × n_S`` block
  per axis subset). Nodes of one *downward shape class*
  (:func:`~censusdp.hierarchy.shape_classes.shape_classes`: same subtree shape, parents in
  one class) have the same covariance — it depends on the tree's shape and the per-level noise
  laws only, never on the counts (Hay et al. 2010; :mod:`censusdp.estimation.predict`) — so
  each node stores its class (int32) and each class's blocks are stored once, by the partition
  holding the class's first node: 8.2 million blocks share about as many classes as there
  are tracts. The blocks stored are the first node's own; another node of the class may differ
  in the last bits (its children summed in another order), which the writer measures
  (``class_blocks_max_relative_difference`` in the manifest);
* optionally (``histograms=True``) the rounded cell tensors themselves, sparse
  ``(node, cell, count)`` of the non-zero cells.

Layout::

    tables/<level>/top.npy.gz | part-00007.npy.gz  int (n_nodes, 298)
    classes/<level>/top.npy.gz | part-…npy.gz      int32 global class of each node
    blocks/<level>/top.npy.gz | part-…npy.gz       float64 (n_owned, Σ_S n_S²): the blocks,
                                                   mask by mask in increasing order, flat
    owned/<level>/top.npy.gz | part-…npy.gz        int64 global class ids of those blocks
    identified/<mask>.npy                          the projector onto the identified subspace
    histograms/<level>/top.npy.gz | part-…npy.gz   (optional) int64 (3, nnz): node, cell, count

The pieces are ``.npy`` files compressed with gzip (``gzip -d`` gives the ``.npy``): the
narrow-integer tables (many cells of a block's tables are zero) take about half their bytes
(2.1× on the 120-block test state; storing them column by column gained 3% more, not
kept). Stores of format ``/1`` (plain ``.npy`` pieces) are read too.
    manifest.json                                  levels, sizes, cut, partitions, basis
                                                   queries, columns, privacy, digest, checks
    checksums.json                                 SHA-256 of every file above; written last

Every file is written through a temporary name and renamed
(:mod:`censusdp.pipelines.release_store`'s ``_save``), the directory under a temporary name
renamed into place when the run completes (:func:`censusdp.atomic.atomic_dir`).

The **digest** of a release is the SHA-256 of its content in a canonical order: every level's
tables in node order (int64), every level's class blocks in class order (float64), the class
of every node; it does not depend on how the run was partitioned, in which order, on how
many workers, or on how the files were compressed (the files do).

References
----------
Hay, Rastogi, Miklau & Suciu (2010). Boosting the accuracy of differentially private
    histograms through consistency. PVLDB 3(1).
U.S. Census Bureau (2021). 2020 Census Redistricting Data (Public Law 94-171) Summary File,
    table shells P1–P5.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from censusdp.atomic import atomic_dir
from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.estimation.marginal_basis import BlockDiagonal, MarginalBasis
from censusdp.estimation.structured_gls import StructuredPiece, identified_rows
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.shape_classes import shape_classes
from censusdp.jsonable import to_jsonable
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.partition import Partition
from censusdp.pipelines.pl94_stream import PartitionRelease, Pl94StreamResult, TopRelease
from censusdp.pipelines.pl94_tables import pl94_codebook
from censusdp.pipelines.release_store import (
    CHECKSUMS,
    MANIFEST,
    _checksums,
    _read_json,
    _save,
    _sha256,
    _verified,
)
from censusdp.schema import Schema

__all__ = ["FORMAT", "Pl94Store", "Pl94StoreWriter", "StorePieceWriter"]

FORMAT = "censusdp-pl94-store/2"
#: Formats read, and the suffix of their pieces.
_SUFFIX = {"censusdp-pl94-store/1": ".npy", FORMAT: ".npy.gz"}
_TOP = "top"


def _piece_name(index: int | None, suffix: str = _SUFFIX[FORMAT]) -> str:
    return f"{_TOP}{suffix}" if index is None else f"part-{index:05d}{suffix}"


def _save_gz(path: Path, array: np.ndarray, level: int = 1) -> str:
    """``array`` as a gzip-compressed ``.npy`` at ``path`` (the same bytes every time: no
    time stamp; level 1: on a partition's block tables, 14.7 MB of ``.npy``, level 6 took
    2.1 CPU s, 15% of the national run's partition time, for the same 7.0 MB as level 1 in
    0.26 s), through a temporary name as :func:`~censusdp.pipelines.release_store._save`
    (a task run again replaces the file whole). Returns the file's SHA-256 (hex)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    data = gzip.compress(buf.getvalue(), compresslevel=level, mtime=0)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return _sha256(data)


def _narrow(x: np.ndarray) -> np.ndarray:
    """``x`` in the smallest signed integer dtype holding its values."""
    lo, hi = (int(x.min()), int(x.max())) if x.size else (0, 0)
    for dt in (np.int8, np.int16, np.int32):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return x.astype(dt)
    return x.astype(np.int64)


def _not_a_store(path: Path) -> str | None:
    """Why ``path`` is not a pl94 store that :class:`Pl94StoreWriter` may replace (its
    manifest of a known format, every file in it listed in its checksums), or None."""
    if path.is_symlink() or not path.is_dir():
        return "is not a directory"
    try:
        sums = _checksums(path)
        _, manifest = _read_json(path / MANIFEST)
    except DataError:
        return f"has no readable {MANIFEST} and {CHECKSUMS} of a store"
    if not isinstance(manifest, dict) or manifest.get("format") not in _SUFFIX:
        return f"has a {MANIFEST} that is not a pl94 store's"
    listed = {*sums, CHECKSUMS}
    other = sorted(
        str(f.relative_to(path)) for f in path.rglob("*")
        if not f.is_dir() and str(f.relative_to(path)) not in listed
    )  # fmt: skip
    if other:
        return f"holds {other[0]!r}, which the store does not list"
    return None


class Pl94StoreWriter:
    """Writes a streamed run's store piece by piece (see the module docstring).

    Use as a context manager around the run; call :meth:`finish` with the run's result
    inside it. On an exception nothing is left at ``path``.

    Parameters
    ----------
    path : path-like
        The store directory (created; its parent too).
    hierarchy : Hierarchy
    schema : Schema
        ``pl94``.
    overwrite : bool
        Replace an existing ``path`` once the new store is complete.
    histograms : bool
        Also store the rounded cell tensors, sparse.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        hierarchy: Hierarchy,
        schema: Schema,
        *,
        overwrite: bool = False,
        histograms: bool = False,
    ) -> None:
        self.path = Path(path)
        self.h, self.schema, self.overwrite, self.histograms = (
            hierarchy, schema, overwrite, histograms,
        )  # fmt: skip
        sc = shape_classes(hierarchy)
        self.node_class = [c.astype(np.int32) for c in sc.node_class]
        # the first node (in node order) of every class: its blocks are the class's
        self.first_node = [
            np.unique(c, return_index=True)[1].astype(np.int64) for c in sc.node_class
        ]
        self.digests: dict[str, str] = {}
        self.bytes = 0
        self.partitions: dict[int, list[list[int]]] = {}
        self.class_diff = 0.0
        self.basis: MarginalBasis | None = None
        self._lock = threading.Lock()
        self._ctx = None
        self._finished = False
        self.root: Path | None = None

    def __enter__(self) -> Pl94StoreWriter:
        if self.path.exists() or self.path.is_symlink():
            if not self.overwrite:
                raise FileExistsError(
                    f"{self.path} exists; write the store elsewhere, remove it, or pass overwrite"
                )
            why = _not_a_store(self.path)
            if why:
                raise SpecError(
                    f"{self.path} {why}: overwrite replaces only a pl94 store; write the "
                    "store elsewhere"
                )
        self._ctx = atomic_dir(self.path, overwrite=self.overwrite)
        self.root = self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> bool | None:
        ctx, self._ctx = self._ctx, None
        if exc[0] is None and not self._finished:
            err = DataError(
                f"{self.path}: the store was closed before finish() wrote its manifest; "
                "nothing was kept (call finish(result, queries) inside the with block)"
            )
            ctx.__exit__(DataError, err, None)
            raise err
        return ctx.__exit__(*exc)

    # -- pieces -----------------------------------------------------------------------------
    def _payload(self, names: Sequence[str], ranges: Sequence[tuple[int, int]]) -> tuple:
        """Per level of a piece: its nodes' classes, the classes whose blocks it stores
        (their first node is in the piece) and each node's class representative (local
        index; out of range when elsewhere)."""
        out = []
        for lvl, (lo, hi) in zip(names, ranges, strict=True):
            k = self.h.level_index(lvl)
            cls = self.node_class[k][lo:hi]
            first = self.first_node[k]
            owned = np.flatnonzero((first >= lo) & (first < hi))
            out.append((cls, owned.astype(np.int64), first[owned] - lo, first[cls] - lo))
        return tuple(out)

    def payload(self, part: Partition) -> tuple:
        """What :meth:`piece_sink` needs for partition ``part`` (its ``sink_payload``)."""
        names = self.h.names[part.cut + 1 :]
        return part.index, self._payload(names, part.ranges[1:])

    def piece_sink(self) -> StorePieceWriter:
        """The writer of partition pieces, to run where they are computed (a sink on a
        worker: :func:`~censusdp.pipelines.pl94_stream.stream_pl94`'s ``sink``); hand what it
        returns to :meth:`add`. The store's directory must be reachable from the workers."""
        if self.root is None:
            raise DataError(f"{self.path}: open the store (with ...) before writing pieces")
        return StorePieceWriter(str(self.root), self.histograms)

    def add(self, written: dict) -> None:
        """Record a piece written by :meth:`piece_sink` (its checksums, bytes, ranges)."""
        with self._lock:
            self.digests.update(written["digests"])
            self.bytes += written["bytes"]
            self.class_diff = max(self.class_diff, written["class_diff"])
            if written["partition"] is not None:
                self.partitions[written["partition"]] = written["ranges"]

    def top(self, top: TopRelease) -> None:
        """``on_top``: the levels down to the cut (and the identified projector)."""
        piece = top.piece
        self.basis = piece.basis
        for mask, b in piece.identified.blocks.items():
            rel = f"identified/{mask}.npy"
            file = self.root / rel
            file.parent.mkdir(parents=True, exist_ok=True)
            digest = _save(file, np.asarray(b, np.float64))
            self.add({"digests": {rel: digest}, "bytes": file.stat().st_size,
                      "class_diff": 0.0, "partition": None})  # fmt: skip
        payload = None, self._payload(piece.names, piece.ranges)
        self.add(self.piece_sink().write(piece, top.counts, top.tables, payload))

    def partition(self, out: PartitionRelease) -> None:
        """``on_partition``: one partition's levels below the cut, written here."""
        self.add(self.piece_sink()(out, self.payload(out.partition)))

    # -- close ------------------------------------------------------------------------------
    def finish(
        self,
        result: Pl94StreamResult,
        queries: Sequence[ProductQuery],
        info: dict | None = None,
    ) -> dict:
        """Write the manifest, then ``checksums.json`` (last); return the digest and bytes.

        Parameters
        ----------
        result : Pl94StreamResult
            The run's (its privacy statement and partitions).
        queries : sequence of ProductQuery
            The measured and invariant queries, in the order the GLS got them (the basis of
            the covariance blocks is rebuilt from them on reading).
        info : dict, optional
            Anything JSON-able to keep in the manifest (e.g. the run's checks).
        """
        if len(self.partitions) != len(result.partitions):
            raise DataError(
                f"{self.path}: {len(self.partitions)} of {len(result.partitions)} partitions "
                "were written; the store is incomplete"
            )
        h = self.h
        rebuilt = MarginalBasis.for_queries(self.schema, list(queries))
        if self.basis is not None and rebuilt.subsets != self.basis.subsets:
            raise DataError("the queries given do not rebuild the basis of the covariance blocks")
        digest = _content_digest(
            self.root, h.names, _layout(h, result.partitions[0].cut, self.partitions), self.basis
        )
        manifest = {
            "format": FORMAT,
            "schema": self.schema.name,
            "levels": list(h.names),
            "sizes": [int(s) for s in h.sizes],
            "cut": int(result.partitions[0].cut),
            "partitions": [self.partitions[i] for i in range(len(self.partitions))],
            "columns": list(pl94_codebook().columns),
            "basis_queries": [q.name for q in queries],
            "masks": sorted(int(m) for m in self.basis.subsets) if self.basis else [],
            "n_classes": [int(f.size) for f in self.first_node],
            "class_blocks_max_relative_difference": self.class_diff,
            "histograms": self.histograms,
            "privacy": result.privacy.to_dict(),
            "persons": int(result.persons),
            "digest": digest,
            "info": to_jsonable(info or {}),
        }
        text = (json.dumps(manifest, indent=1) + "\n").encode()
        (self.root / MANIFEST).write_bytes(text)
        self.digests[MANIFEST] = _sha256(text)
        files = dict(sorted(self.digests.items()))
        sums = {"format": FORMAT, "algorithm": "sha256", "files": files}
        (self.root / CHECKSUMS).write_text(json.dumps(sums, indent=1) + "\n")  # last
        self.bytes += len(text) + (self.root / CHECKSUMS).stat().st_size
        self._finished = True
        return {"digest": digest, "bytes_written": self.bytes, "files": len(files) + 1}


class StorePieceWriter:
    """Writes pieces of a store being written (:meth:`Pl94StoreWriter.piece_sink`) where
    they are: each file atomically (a temporary name renamed), returning their checksums and
    bytes; small and picklable (the store's path and whether histograms are kept)."""

    def __init__(self, root: str, histograms: bool) -> None:
        self.root, self.histograms = root, histograms

    def __call__(self, out: PartitionRelease, payload: tuple) -> dict:
        """``sink``: partition ``out``'s levels below the cut, with
        :meth:`Pl94StoreWriter.payload` of its partition."""
        written = self.write(out.piece, out.counts, out.tables, payload)
        written["ranges"] = [list(r) for r in out.partition.ranges]
        return written

    def write(
        self,
        piece: StructuredPiece,
        counts: Sequence[np.ndarray],
        tables: Sequence[np.ndarray],
        payload: tuple,
    ) -> dict:
        """Every level's tables, classes, owned class blocks (and histograms) of ``piece``."""
        index, levels = payload
        root, name = Path(self.root), _piece_name(index)
        out: dict = {"digests": {}, "bytes": 0, "class_diff": 0.0, "partition": index}

        def save(rel: str, array: np.ndarray) -> None:
            file = root / rel
            file.parent.mkdir(parents=True, exist_ok=True)
            out["digests"][rel] = _save_gz(file, array)
            out["bytes"] += file.stat().st_size

        for j, lvl in enumerate(piece.names):
            lo, _ = piece.ranges[j]
            cls, owned, owned_local, rep = levels[j]
            c = np.asarray(counts[j])
            save(f"tables/{lvl}/{name}", _narrow(tables[j]))
            if self.histograms:
                flat = c.reshape(c.shape[0], -1)
                node, cell = np.nonzero(flat)
                save(
                    f"histograms/{lvl}/{name}",
                    np.stack([node + lo, cell, flat[node, cell]]).astype(np.int64),
                )
            save(f"classes/{lvl}/{name}", cls)
            save(f"owned/{lvl}/{name}", owned)
            if piece.covariances is None:
                continue
            # each node's blocks beside its class representative's, where that is in the piece
            n = cls.size
            here = (rep >= 0) & (rep < n)
            flat_blocks = []
            for mask in sorted(piece.covariances[j].blocks):
                b = piece.covariances[j].blocks[mask]
                b = np.broadcast_to(b, (n, *b.shape[-2:]))
                flat_blocks.append(b[owned_local].reshape(owned.size, -1))
                if here.any():
                    d = np.abs(b[here] - b[rep[here]]).max(initial=0.0)
                    scale = max(float(np.abs(b).max(initial=0.0)), 1e-300)
                    out["class_diff"] = max(out["class_diff"], float(d) / scale)
            save(f"blocks/{lvl}/{name}", np.concatenate(flat_blocks, axis=1))
        return out


def _layout(h: Hierarchy, cut: int, partitions: dict[int, list[list[int]]]) -> list[list]:
    """Per level, the ``(first node, file name)`` of its pieces in node order."""
    out: list[list] = [[(0, _piece_name(None))] if k <= cut else [] for k in range(h.depth)]
    for i, ranges in partitions.items():
        for j, (lo, _) in enumerate(ranges[1:], start=cut + 1):
            out[j].append((lo, _piece_name(i)))
    return [sorted(x) for x in out]


def _load(root: Path, rel: str, sums: dict[str, str] | None) -> np.ndarray:
    file = root / rel
    try:
        data = file.read_bytes()
    except OSError:
        raise DataError(f"{file}: missing; the store is incomplete") from None
    if sums is not None:
        _verified(root, rel, data, sums)
    try:
        if rel.endswith(".gz"):
            data = gzip.decompress(data)
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise DataError(f"{file}: not a numpy array file ({err})") from None


def _content_digest(
    root: Path,
    names: Sequence[str],
    layout: list[list],
    basis: MarginalBasis | None,
    sums: dict[str, str] | None = None,
) -> str:
    """SHA-256 of tables (int64, node order), classes (int32) and class blocks (float64,
    class order) of every level: independent of the partitioning."""
    hsh = hashlib.sha256()
    masks = basis is not None and basis.subsets
    for k, lvl in enumerate(names):
        hsh.update(f"level {lvl}\n".encode())
        for _, name in layout[k]:
            hsh.update(np.ascontiguousarray(_load(root, f"tables/{lvl}/{name}", sums), "<i8"))
        for _, name in layout[k]:
            hsh.update(np.ascontiguousarray(_load(root, f"classes/{lvl}/{name}", sums), "<i4"))
        if masks:
            owned = [_load(root, f"owned/{lvl}/{name}", sums) for _, name in layout[k]]
            blocks = [_load(root, f"blocks/{lvl}/{name}", sums) for _, name in layout[k]]
            o = np.concatenate(owned)
            hsh.update(
                np.ascontiguousarray(np.concatenate(blocks)[np.argsort(o, kind="stable")], "<f8")
            )
    return hsh.hexdigest()


class Pl94Store:
    """A store written by :class:`Pl94StoreWriter`, read back piece by piece.

    Every file read is checked against ``checksums.json`` (a changed, damaged or missing
    file is refused with a :class:`~censusdp.errors.DataError` naming it); :meth:`verify`
    checks them all and recomputes the digest.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.sums = _checksums(self.path)
        data, manifest = _read_json(self.path / MANIFEST)
        _verified(self.path, MANIFEST, data, self.sums)
        if not isinstance(manifest, dict) or manifest.get("format") not in _SUFFIX:
            raise DataError(f"{self.path / MANIFEST}: not a {FORMAT} manifest")
        suffix = _SUFFIX[manifest["format"]]
        self.manifest: dict[str, Any] = manifest
        self.levels: list[str] = list(manifest["levels"])
        self.sizes: list[int] = [int(s) for s in manifest["sizes"]]
        self.cut = int(manifest["cut"])
        self.schema = Schema.load(manifest["schema"])
        self.columns: list[str] = list(manifest["columns"])
        parts = {i: r for i, r in enumerate(manifest["partitions"])}
        self.layout = _pieces(self.levels, self.sizes, self.cut, parts, suffix)
        self.basis = MarginalBasis.for_queries(
            self.schema, [ProductQuery.parse(self.schema, q) for q in manifest["basis_queries"]]
        )
        self.identified = BlockDiagonal(
            self.basis,
            {m: self._load(f"identified/{m}.npy") for m in sorted(self.basis.subsets)},
        )
        self._rows: dict = {}

    @property
    def digest(self) -> str:
        return str(self.manifest["digest"])

    @property
    def privacy(self) -> PrivacyStatement:
        return PrivacyStatement.from_dict(self.manifest["privacy"])

    def _load(self, rel: str) -> np.ndarray:
        return _load(self.path, rel, self.sums)

    def _pieces(self, level: str, lo: int, hi: int) -> list[tuple[int, int, str]]:
        k = self.levels.index(level)
        return [(a, b, name) for a, b, name in self.layout[k] if a < hi and b > lo]

    def _gather(self, kind: str, level: str, lo: int, hi: int | None) -> np.ndarray:
        hi = self.sizes[self.levels.index(level)] if hi is None else hi
        out = [
            self._load(f"{kind}/{level}/{name}")[max(lo, a) - a : min(hi, b) - a]
            for a, b, name in self._pieces(level, lo, hi)
        ]
        return np.concatenate(out) if out else np.empty(0)

    def tables(self, level: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The P1–P5 tables of nodes ``[lo, hi)`` of ``level``: int64 ``(n, 298)``."""
        return self._gather("tables", level, lo, hi).astype(np.int64)

    def _class_blocks(self, level: str) -> dict[int, np.ndarray]:
        k = self.levels.index(level)
        names = [name for _, _, name in self.layout[k]]
        owned = np.concatenate([self._load(f"owned/{level}/{n}") for n in names])
        order = np.argsort(owned, kind="stable")
        if not np.array_equal(owned[order], np.arange(owned.size)):
            raise DataError(
                f"{self.path}: the class blocks of level {level!r} do not cover its classes"
            )
        flat = np.concatenate([self._load(f"blocks/{level}/{n}") for n in names])[order]
        out, at = {}, 0
        for m in sorted(self.basis.subsets):
            n_s = self.basis.block_size(m)
            out[m] = flat[:, at : at + n_s * n_s].reshape(-1, n_s, n_s)
            at += n_s * n_s
        if at != flat.shape[1]:
            raise DataError(
                f"{self.path}: the class blocks of level {level!r} have the wrong width"
            )
        return out

    def standard_errors(
        self, level: str, query: ProductQuery | str, lo: int = 0, hi: int | None = None
    ) -> np.ndarray:
        """GLS standard errors of every row of ``query`` at nodes ``[lo, hi)`` of ``level``,
        ``(n, n_rows)``, from the nodes' class blocks; NaN for unidentified rows."""
        q = ProductQuery.parse(self.schema, query) if isinstance(query, str) else query
        cov = BlockDiagonal(self.basis, self._class_blocks(level))
        var = np.maximum(cov.query_variances(q), 0.0).reshape(-1, q.n_rows)
        cls = self._gather("classes", level, lo, hi).astype(np.int64)
        ok = identified_rows(self.basis, self.identified, q, self._rows)
        return np.where(ok[None, :], np.sqrt(var[cls]), np.nan)

    def column_standard_errors(self, level: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """GLS standard errors of every P1–P5 column at nodes ``[lo, hi)``: ``(n, 298)``."""
        rows = pl94_codebook().rows
        cls = self._gather("classes", level, lo, hi).astype(np.int64)
        cov = BlockDiagonal(self.basis, self._class_blocks(level))
        out = np.empty((cls.size, len(rows)))
        for qi, q in enumerate(rows.queries):
            sel = np.flatnonzero(rows.query_of_row == qi)
            var = np.maximum(cov.query_variances(q), 0.0).reshape(-1, q.n_rows)
            ok = identified_rows(self.basis, self.identified, q, self._rows)
            se = np.where(ok[None, :], np.sqrt(var), np.nan)
            out[:, sel] = se[cls][:, rows.row_of_row[sel]]
        return out

    def verify(self) -> str:
        """Check every file against its checksum and recompute the digest (returned)."""
        for rel in self.sums:
            data = (self.path / rel).read_bytes() if (self.path / rel).is_file() else None
            if data is None:
                raise DataError(f"{self.path / rel}: missing; the store is incomplete")
            _verified(self.path, rel, data, self.sums)
        layout = [[(a, name) for a, _, name in lv] for lv in self.layout]
        digest = _content_digest(self.path, self.levels, layout, self.basis, self.sums)
        if digest != self.digest:
            raise DataError(
                f"{self.path / MANIFEST}: the digest of the content does not match the "
                "manifest's; the store was changed after it was written"
            )
        return digest


def _pieces(
    levels: Sequence[str],
    sizes: Sequence[int],
    cut: int,
    parts: dict[int, list[list[int]]],
    suffix: str,
) -> list[list[tuple[int, int, str]]]:
    """Per level, ``(lo, hi, file name)`` of its pieces in node order, checked to tile it."""
    out: list[list[tuple[int, int, str]]] = []
    for k, lvl in enumerate(levels):
        if k <= cut:
            pieces = [(0, sizes[k], _piece_name(None, suffix))]
        else:
            pieces = sorted(
                (int(r[k - cut][0]), int(r[k - cut][1]), _piece_name(i, suffix))
                for i, r in parts.items()
            )
        at = 0
        for a, b, _ in pieces:
            if a != at or b < a:
                raise DataError(f"manifest: the pieces of level {lvl!r} do not tile it")
            at = b
        if at != sizes[k]:
            raise DataError(f"manifest: the pieces of level {lvl!r} do not tile it")
        out.append(pieces)
    return out
