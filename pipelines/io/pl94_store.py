"""The release store of a streamed ``pl94`` run, written partition by partition.

:class:`Pl94StoreWriter` plugs into :func:`~censusdp.pipelines.products.pl94_stream.stream_pl94`
(``on_top=store.top``, ``on_partition=store.partition``) and writes each piece as it comes,
so memory never holds more than one partition's tables. :class:`Pl94Store` reads it back and
trusts nothing it reads.

What is stored, per level and node:

* the integer **P1–P5 tables** (:func:`~censusdp.pipelines.products.pl94_tables.tabulate` of the rounded
  cell tensors: 298 columns), in the smallest integer dtype that holds the file's values;
* the **variance information** from which the standard error of any product query row (table
  column or not) is computed: the GLS covariance blocks in the marginal basis
  (:class:`~censusdp.estimation.gls.marginal_basis.BlockDiagonal`, one small ``n_S × n_S`` block
  per axis subset). Nodes of one *downward shape class*
  (:func:`~censusdp.hierarchy.shape_classes.shape_classes`: same subtree shape, parents in
  one class) have the same covariance — it depends on the tree's shape and the per-level noise
  laws only, never on the counts (Hay et al. 2010; :mod:`censusdp.estimation.gls.predict`) — so
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
    manifest.json                                  levels, sizes, cut, partitions, basis
                                                   queries, columns, privacy, what the
                                                   standard errors cover (SE_NOTE: GLS
                                                   only), content digest, files_digest,
                                                   checks
    checksums.json                                 SHA-256 of every file above; written last

The pieces are ``.npy`` files compressed with gzip (``gzip -d`` gives the ``.npy``): the
narrow-integer tables (many cells of a block's tables are zero) take about half their bytes
(2.1× on the 120-block test state; storing them column by column gained 3% more, not
kept). Stores of format ``/1`` (plain ``.npy`` pieces) and ``/2`` (no ``files_digest``) are
read too.

The store is the one format of :mod:`censusdp.pipelines.io.store`, whose
:class:`~censusdp.pipelines.io.store.StoreWriter` this writer is: every file written through a
temporary name and renamed, the directory under a temporary name renamed into place when the
run completes, ``overwrite`` replacing only a pl94 store whose every file its checksums
list, the manifest then the checksums written last; its reader's checks are that module's.
:func:`~censusdp.pipelines.io.release_store.read_release` reads this store too.

Two digests:

* The **content digest** (``digest`` in the manifest and in :meth:`Pl94StoreWriter.finish`'s
  result) is the SHA-256 of the release's content in a canonical order: level by level, its
  tables in node order (int64), the class of every node (int32), its class blocks in class
  order (float64). It does not depend on how the run was partitioned, in which order, on
  how many workers, or on how the files were compressed (the files do); it is the digest
  earlier runs recorded (unchanged by format ``/3``), to compare runs by.
* The **release digest** (``release_digest``) is the SHA-256 of ``manifest.json``. The
  manifest holds the content digest, the privacy statement, the schema name, the levels and
  everything else a reader trusts, and ``files_digest``: the SHA-256 of the SHA-256 of every
  piece (``sha256sum`` lines, sorted by path). So the release digest binds every byte a
  reader returns, and a reader given it (``Pl94Store(path, expected_digest=...)``) refuses
  any change; what is detected without it is said in :class:`Pl94Store`. It depends on the
  partitioning (the manifest lists the partitions): it names one store, not one content.

References
----------
Hay, Rastogi, Miklau & Suciu (2010). Boosting the accuracy of differentially private
    histograms through consistency. PVLDB 3(1).
U.S. Census Bureau (2021). 2020 Census Redistricting Data (Public Law 94-171) Summary File,
    table shells P1–P5.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from censusdp.budget import PrivacyStatement
from censusdp.errors import DataError, SpecError
from censusdp.estimation.covariance import BlockCovariance
from censusdp.estimation.gls.marginal_basis import BlockDiagonal, MarginalBasis
from censusdp.estimation.gls.structured import StructuredPiece
from censusdp.hierarchy import Hierarchy
from censusdp.hierarchy.shape_classes import shape_classes
from censusdp.jsonable import to_jsonable
from censusdp.mechanisms.product_query import ProductQuery
from censusdp.pipelines.io.store import (
    CHECKSUMS,
    MANIFEST,
    StoreWriter,
    check_checksum,
    check_listed,
    check_tiling,
    files_digest,
    is_int,
    load_array,
    load_piece,
    manifest_error,
    read_bytes,
    read_checksums,
    read_privacy,
    save_npy,
    sha256_hex,
    store_file,
)
from censusdp.pipelines.partition import Partition
from censusdp.pipelines.products.pl94_stream import PartitionRelease, Pl94StreamResult, TopRelease
from censusdp.pipelines.products.pl94_tables import pl94_codebook, pl94_column_values
from censusdp.schema import Schema, available_schemas

__all__ = ["FORMAT", "FORMATS", "SE_NOTE", "Pl94Store", "Pl94StoreWriter", "StorePieceWriter"]

FORMAT = "censusdp-pl94-store/3"  # 3: the manifest binds its pieces (files_digest)
#: What the store's standard errors cover (``manifest["standard_errors"]``): the national
#: stream rounds no replicates, so the stored tables' rounding error has no estimate here.
SE_NOTE = (
    "GLS only: the standard errors the store gives (standard_errors, column_standard_errors, "
    "from the class blocks) are those of the real-valued GLS estimates. The stored tables "
    "are integers by unbiased controlled rounding, whose own error (mean zero, adding its "
    "variance) they leave out: this national stream ran without rounding replicates, so they "
    "understate the error of the stored integers, most above the block (the privatize PPMF "
    "route's _se include it)"
)
#: Formats read, and the suffix of their pieces.
_SUFFIX = {"censusdp-pl94-store/1": ".npy", "censusdp-pl94-store/2": ".npy.gz", FORMAT: ".npy.gz"}
#: The manifest formats of a pl94 store (those read).
FORMATS = tuple(_SUFFIX)
_TOP = "top"
#: A level name, as it names the store's folders: never a path.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_HEX = re.compile(r"[0-9a-f]{64}")
_INTS = (np.int8, np.int16, np.int32, np.int64)


def _piece_name(index: int | None, suffix: str = _SUFFIX[FORMAT]) -> str:
    return f"{_TOP}{suffix}" if index is None else f"part-{index:05d}{suffix}"


def _narrow(x: np.ndarray) -> np.ndarray:
    """``x`` in the smallest signed integer dtype holding its values."""
    lo, hi = (int(x.min()), int(x.max())) if x.size else (0, 0)
    for dt in (np.int8, np.int16, np.int32):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return x.astype(dt)
    return x.astype(np.int64)


class Pl94StoreWriter(StoreWriter):
    """Writes a streamed run's store piece by piece (see the module docstring): the
    :class:`~censusdp.pipelines.io.store.StoreWriter` of a pl94 store.

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
        super().__init__(path, FORMATS, "pl94", overwrite=overwrite)
        bad = [n for n in hierarchy.names if not _NAME.fullmatch(n)]
        if bad:
            raise SpecError(
                f"level {bad[0]!r}: a store names a folder after each level; use letters, "
                "digits, '_' and '-' only"
            )
        self.h, self.schema, self.histograms = hierarchy, schema, histograms
        sc = shape_classes(hierarchy)
        self.node_class = [c.astype(np.int32) for c in sc.node_class]
        # the first node (in node order) of every class: its blocks are the class's
        self.first_node = [
            np.unique(c, return_index=True)[1].astype(np.int64) for c in sc.node_class
        ]
        self.partitions: dict[int, list[list[int]]] = {}
        self.class_diff = 0.0
        self.basis: MarginalBasis | None = None
        self._pieces_lock = threading.Lock()

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
        worker: :func:`~censusdp.pipelines.products.pl94_stream.stream_pl94`'s ``sink``); hand what it
        returns to :meth:`add`. The store's directory must be reachable from the workers."""
        if self.root is None:
            raise DataError(f"{self.path}: open the store (with ...) before writing pieces")
        return StorePieceWriter(str(self.root), self.histograms)

    def add(self, written: dict) -> None:
        """Record a piece written by :meth:`piece_sink` (its checksums, bytes, ranges)."""
        self.record(written["digests"], written["bytes"])
        with self._pieces_lock:
            self.class_diff = max(self.class_diff, written["class_diff"])
            if written["partition"] is not None:
                self.partitions[written["partition"]] = written["ranges"]

    def top(self, top: TopRelease) -> None:
        """``on_top``: the levels down to the cut (and the identified projector)."""
        piece = top.piece
        self.basis = piece.basis
        for mask, b in piece.identified.blocks.items():
            self.save(f"identified/{mask}.npy", np.asarray(b, np.float64))
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
        """Write the manifest, then ``checksums.json`` (last); return the digests and bytes.

        The result's ``digest`` is the content digest and ``release_digest`` the SHA-256 of
        the manifest (the module docstring): record the release digest apart from the store
        (a run prints it) and pass it to :class:`Pl94Store` as ``expected_digest``.

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
        root = self.root

        def load(kind: str, level: str, name: str, _rows: int | None = None) -> np.ndarray:
            file = root / kind / level / name
            return load_array(file, file.read_bytes())

        layout = _layout(h, result.partitions[0].cut, self.partitions)
        digest = _content_digest(load, h.names, layout, bool(self.basis and self.basis.subsets))
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
            "standard_errors": SE_NOTE,
            "persons": int(result.persons),
            "digest": digest,
            "files_digest": files_digest(self.digests),
            "info": to_jsonable(info or {}),
        }
        text = super().finish(manifest)
        return {
            "digest": digest,
            "release_digest": sha256_hex(text),
            "bytes_written": self.bytes,
            "files": len(self.digests) + 1,
        }


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
            out["digests"][rel] = save_npy(file, array, compresslevel=1)
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
                # (the width named: a piece owning no class has 0 rows, which -1 cannot size)
                flat_blocks.append(b[owned_local].reshape(owned.size, b.shape[-2] * b.shape[-1]))
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


def _content_digest(load, names: Sequence[str], layout: list[list], blocks: bool) -> str:
    """SHA-256 of tables (int64, node order), classes (int32) and class blocks (float64,
    class order) of every level: independent of the partitioning and of the files'
    compression. ``load(kind, level, name[, rows])`` gives a piece's array (``rows``: the
    blocks' rows, the size of the piece's owned classes); ``layout`` per level the
    ``(first node, file name)`` of its pieces in node order."""
    hsh = hashlib.sha256()
    for k, lvl in enumerate(names):
        hsh.update(f"level {lvl}\n".encode())
        for _, name in layout[k]:
            hsh.update(np.ascontiguousarray(load("tables", lvl, name), "<i8"))
        for _, name in layout[k]:
            hsh.update(np.ascontiguousarray(load("classes", lvl, name), "<i4"))
        if blocks:
            owned = [load("owned", lvl, name) for _, name in layout[k]]
            flat = np.concatenate(
                [
                    load("blocks", lvl, name, o.size)
                    for (_, name), o in zip(layout[k], owned, strict=True)
                ]
            )
            order = np.argsort(np.concatenate(owned), kind="stable")
            hsh.update(np.ascontiguousarray(flat[order], "<f8"))
    return hsh.hexdigest()


class Pl94Store:
    """A store written by :class:`Pl94StoreWriter`, read back piece by piece.

    The store trusts nothing it reads. On opening it checks ``manifest.json`` against
    ``checksums.json``, that the manifest is well formed (its ``schema`` names a shipped
    schema, never a path; its levels name folders, never paths; its pieces tile every level;
    its privacy statement has positive finite budgets) and that ``checksums.json`` lists
    exactly the files the manifest describes. Every file is opened inside the store only (an
    entry with ``..`` or an absolute path, or a symbolic link leading out of the store, is
    refused). Every piece a reader (:meth:`tables`, :meth:`standard_errors`,
    :meth:`column_standard_errors`) reads is checked before anything is returned: its
    SHA-256 against ``checksums.json``, its dtype, its exact shape, its values (finite;
    class ids in range). Every failure is a one-line
    :class:`~censusdp.errors.DataError` naming the store, the file and what is wrong, never
    a value of the release.

    **What is detected.** The *release digest* (:attr:`release_digest`, returned by
    :meth:`Pl94StoreWriter.finish` and printed by the run) is the SHA-256 of
    ``manifest.json``; the manifest holds the privacy statement, the schema, levels, sizes,
    partitions, basis queries, the content digest (:attr:`digest`) and, since format ``/3``,
    the SHA-256 of the list of every piece's checksum (``files_digest``), so the release
    digest binds every byte a reader returns.

    * With ``expected_digest`` (the release digest recorded when the run wrote the store,
      kept apart from it): a changed manifest (a privacy statement, ρ, the schema name, a
      level, anything in it) is refused on opening, a changed checksum of a piece too, and
      a changed piece when it is read (by a reader that needs it; :meth:`verify` reads them
      all), whether or not the checksums and the manifest were rewritten to match: what a
      reader returns chains to that digest through SHA-256 only.
    * Without it the store is only checked against itself: damage, a changed piece, and a
      piece rewritten together with ``checksums.json`` (it no longer matches the manifest's
      ``files_digest``) are refused, but a store whose manifest was rewritten too — new
      checksums, new digests, another ρ — is a consistent store and is read. No check inside
      a store can tell it from the original: that needs a reference digest (or a signature
      of ``manifest.json`` by the publisher).

    Stores of the formats before ``/3`` have no ``files_digest`` (their manifest does not
    bind their pieces): they are read as before, and refused with ``expected_digest``
    (write them again).

    Parameters
    ----------
    path : path-like
        The store directory.
    expected_digest : str, optional
        The release digest the store must have (64 hex digits).

    Raises
    ------
    DataError
        As above.
    """

    def __init__(self, path: str | os.PathLike[str], expected_digest: str | None = None) -> None:
        self.path = root = Path(path)
        if not root.is_dir():
            raise DataError(f"{root}: not a directory; pass the directory of a pl94 store")
        store_file(root, CHECKSUMS)  # not a link leading out of the store
        self.sums = read_checksums(root)
        data = read_bytes(root, MANIFEST)
        #: The SHA-256 of ``manifest.json``: see the class docstring.
        self.release_digest = sha256_hex(data)
        self.manifest: dict[str, Any] = {}
        self._expect(expected_digest)
        check_checksum(root, MANIFEST, data, self.sums)
        try:
            self.manifest = json.loads(data)
        except ValueError as exc:
            raise DataError(f"{root / MANIFEST}: not valid JSON ({exc})") from None
        self._check_manifest()
        self._expect(expected_digest)
        self._rows: dict = {}
        self.identified = BlockDiagonal(
            self.basis,
            {
                m: self._piece(
                    f"identified/{m}.npy", "float64", (n, n), "a projector", "rows, columns"
                )
                for m in self.masks
                for n in [self.basis.block_size(m)]
            },
        )

    # -- the manifest -----------------------------------------------------------------------
    def _expect(self, expected_digest: str | None) -> None:
        """Refuse the store unless its release digest is ``expected_digest`` (None: no
        reference) and, once the manifest is read, its format binds its pieces (``/3``)."""
        if expected_digest is None:
            return
        if not isinstance(expected_digest, str) or not _HEX.fullmatch(expected_digest):
            raise SpecError(
                "expected_digest: not a SHA-256 hex digest (64 lowercase hex digits); pass "
                "the release digest the run printed"
            )
        if self.release_digest != expected_digest:
            raise DataError(
                f"{self.path / MANIFEST}: its SHA-256 is not the expected release digest; the "
                "store is not the release it should be (altered, or another run's)"
            )
        fmt = self.manifest.get("format", FORMAT)
        if fmt != FORMAT:
            raise DataError(
                f"{self.path / MANIFEST}: format {fmt!r} does not bind its pieces to the "
                "manifest, so no release digest covers them; write the store again"
            )

    def _fail(self, key: str, message: str) -> DataError:
        return manifest_error(self.path / MANIFEST, key, message)

    def _check_manifest(self) -> None:
        """Check every manifest key a reader trusts and the checksums' file list."""
        m, file = self.manifest, self.path / MANIFEST
        if not isinstance(m, dict) or m.get("format") not in _SUFFIX:
            raise DataError(f"{file}: not a {FORMAT} manifest; write the store again")
        fmt = m["format"]
        keys = ["schema", "levels", "sizes", "cut", "partitions", "columns", "basis_queries",
                "masks", "n_classes", "histograms", "privacy", "persons", "digest"]  # fmt: skip
        if fmt == FORMAT:
            keys.append("files_digest")
        missing = [k for k in keys if k not in m]
        if missing:
            raise DataError(f"{file}: the manifest has no {missing[0]!r}; the store is incomplete")
        self._check_geography(m, fmt)
        self._check_basis(m)
        self._check_counts(m, keys)
        self._check_file_list(m, fmt)

    def _check_geography(self, m: dict[str, Any], fmt: str) -> None:
        """The schema, levels, node counts, cut and partitions; sets the pieces' layout."""
        file = self.path / MANIFEST
        shipped = available_schemas()
        if not isinstance(m["schema"], str) or m["schema"] not in shipped:
            raise self._fail(
                "schema",
                f"not a shipped schema ({', '.join(shipped)}); a store names its schema, "
                "never a path",
            )
        self.schema = Schema.load(m["schema"])
        levels, sizes = m["levels"], m["sizes"]
        if (
            not isinstance(levels, list)
            or not levels
            or not all(isinstance(x, str) and _NAME.fullmatch(x) for x in levels)
            or len(set(levels)) != len(levels)
        ):
            raise self._fail(
                "levels", "expected distinct level names (letters, digits, '_', '-'; never a path)"
            )
        if (
            not isinstance(sizes, list)
            or len(sizes) != len(levels)
            or not all(is_int(x) and x >= 0 for x in sizes)
        ):
            raise self._fail("sizes", f"expected {len(levels)} node counts, one per level")
        self.levels: list[str] = list(levels)
        self.sizes: list[int] = list(sizes)
        depth, cut = len(levels), m["cut"]
        if not is_int(cut) or not 0 <= cut < depth:
            raise self._fail("cut", f"expected the index of a level, 0 to {depth - 1}")
        self.cut = cut
        parts = m["partitions"]
        if not isinstance(parts, list) or not all(
            isinstance(p, list)
            and len(p) == depth - cut
            and all(isinstance(r, list) and len(r) == 2 and all(map(is_int, r)) for r in p)
            for p in parts
        ):
            raise self._fail(
                "partitions",
                f"expected per partition {depth - cut} [start, stop) node ranges (the cut and "
                "each level below it)",
            )
        self.layout = _pieces(file, levels, sizes, cut, dict(enumerate(parts)), _SUFFIX[fmt])

    def _check_basis(self, m: dict[str, Any]) -> None:
        """The table columns, the basis queries (sets the basis) and its masks."""
        if m["columns"] != list(pl94_codebook().columns):
            raise self._fail("columns", "not the P1–P5 columns of the pl94 codebook")
        self.columns: list[str] = list(m["columns"])
        bq = m["basis_queries"]
        if not isinstance(bq, list) or not bq or not all(isinstance(q, str) for q in bq):
            raise self._fail("basis_queries", "expected a list of product queries")
        try:
            self.basis = MarginalBasis.for_queries(
                self.schema, [ProductQuery.parse(self.schema, q) for q in bq]
            )
        except (SpecError, ValueError):
            raise self._fail(
                "basis_queries", f"not product queries of the {m['schema']!r} schema"
            ) from None
        masks = m["masks"]
        if masks not in ([], sorted(int(s) for s in self.basis.subsets)) or not all(
            map(is_int, masks)
        ):
            raise self._fail("masks", "not the subsets of the basis of the basis queries")
        self.masks: list[int] = list(masks)

    def _check_counts(self, m: dict[str, Any], keys: list[str]) -> None:
        """Class counts, the histograms flag, the privacy statement, persons and digests."""
        depth = len(self.levels)
        n_classes = m["n_classes"]
        if (
            not isinstance(n_classes, list)
            or len(n_classes) != depth
            or not all(
                is_int(c) and 0 <= c <= n for c, n in zip(n_classes, self.sizes, strict=True)
            )
        ):
            raise self._fail(
                "n_classes", f"expected {depth} class counts, at most each level's nodes"
            )
        self.n_classes: list[int] = list(n_classes)
        if not isinstance(m["histograms"], bool):
            raise self._fail("histograms", "expected true or false")
        self._privacy = read_privacy(self.path / MANIFEST, m["privacy"])
        if not is_int(m["persons"]) or m["persons"] < 0:
            raise self._fail("persons", "expected a count")
        for key in ("digest", "files_digest"):
            if key in keys and not (isinstance(m[key], str) and _HEX.fullmatch(m[key])):
                raise self._fail(key, "not a SHA-256 hex digest")

    def _check_file_list(self, m: dict[str, Any], fmt: str) -> None:
        """The checksummed files: exactly those the manifest describes, bound to it by
        ``files_digest``."""
        kinds = ["tables", "classes", "owned"]
        kinds += ["blocks"] * bool(self.masks) + ["histograms"] * m["histograms"]
        wanted = {MANIFEST} | {f"identified/{k}.npy" for k in self.masks}
        wanted |= {
            f"{kind}/{lvl}/{name}"
            for kind in kinds
            for lvl, pieces in zip(self.levels, self.layout, strict=True)
            for _, _, name in pieces
        }
        check_listed(self.path, self.sums, wanted)
        if fmt == FORMAT and files_digest(self.sums) != m["files_digest"]:
            raise DataError(
                f"{self.path / CHECKSUMS}: the checksums of the pieces do not match the "
                "manifest's files_digest; a piece and the checksums were rewritten after the "
                "store was written"
            )

    @property
    def digest(self) -> str:
        """The content digest: SHA-256 of the tables, classes and class blocks in a canonical
        order (the module docstring), independent of the partitioning and the compression;
        the same as the stores before format ``/3`` recorded (``digest`` in the manifest)."""
        return str(self.manifest["digest"])

    @property
    def privacy(self) -> PrivacyStatement:
        """The privacy statement the manifest records (bound by the release digest)."""
        return self._privacy

    # -- pieces -----------------------------------------------------------------------------
    def _piece(
        self,
        rel: str,
        dtype: Any,
        shape: Sequence[int | None],
        why: str,
        axes: str,
        below: int | None = None,
    ) -> np.ndarray:
        """The array at ``rel``: inside the store, its SHA-256 checked against the
        checksums, then its dtype, exact shape and finiteness (``below``: integers in
        ``[0, below)``)."""
        a = load_piece(self.path, rel, self.sums, dtype, shape, why, axes)
        if below is not None and a.size and (int(a.min()) < 0 or int(a.max()) >= below):
            raise DataError(f"{self.path / rel}: ids outside 0 to {below - 1} ({axes})")
        return a

    def _level(self, level: str) -> int:
        try:
            return self.levels.index(level)
        except ValueError:
            raise SpecError(
                f"level {level!r} is not in the store {self.path} ({', '.join(self.levels)})"
            ) from None

    def _load(self, kind: str, level: str, name: str, n: int | None = None) -> np.ndarray:
        """Piece ``name`` of ``kind`` at ``level`` (``n`` nodes; blocks: ``n`` rows),
        checked."""
        k, rel = self._level(level), f"{kind}/{level}/{name}"
        if n is None:
            n = next(b - a for a, b, x in self.layout[k] if x == name)
        if kind == "tables":
            return self._piece(rel, _INTS, (n, len(self.columns)),
                               "the P1–P5 tables are integers", "nodes, columns")  # fmt: skip
        if kind == "classes":
            return self._piece(rel, "int32", (n,), "class ids", "nodes", self.n_classes[k])
        if kind == "owned":
            return self._piece(rel, "int64", (None,), "class ids", "classes", self.n_classes[k])
        if kind == "blocks":
            width = sum(self.basis.block_size(m) ** 2 for m in self.masks)
            return self._piece(rel, "float64", (n, width), "covariance blocks",
                               "classes, blocks' entries")  # fmt: skip
        return self._piece(rel, "int64", (3, None), "node, cell, count", "rows, entries")

    def _pieces(self, level: str, lo: int, hi: int) -> list[tuple[int, int, str]]:
        k = self._level(level)
        return [(a, b, name) for a, b, name in self.layout[k] if a < hi and b > lo]

    def _gather(self, kind: str, level: str, lo: int, hi: int | None) -> np.ndarray:
        size = self.sizes[self._level(level)]
        hi = size if hi is None else hi
        ints = all(isinstance(x, int | np.integer) and not isinstance(x, bool) for x in (lo, hi))
        if not (ints and 0 <= lo <= hi <= size):
            raise SpecError(
                f"nodes [{lo}, {hi}) of level {level!r}: expected 0 <= lo <= hi <= {size}"
            )
        out = [
            self._load(kind, level, name)[max(lo, a) - a : min(hi, b) - a]
            for a, b, name in self._pieces(level, lo, hi)
        ]
        if out:
            return np.concatenate(out)
        return np.empty((0, len(self.columns)) if kind == "tables" else 0, np.int64)

    def tables(self, level: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The P1–P5 tables of nodes ``[lo, hi)`` of ``level``: int64 ``(n, 298)``, every
        piece read checked first (the class docstring)."""
        return self._gather("tables", level, lo, hi).astype(np.int64)

    def _class_covariance(self, level: str) -> BlockCovariance:
        """The class blocks of ``level`` as a covariance whose "nodes" are its classes."""
        k = self._level(level)
        names = [name for _, _, name in self.layout[k]]
        if not self.masks:
            raise DataError(f"{self.path}: the store has no covariance blocks (manifest 'masks')")
        owned = [self._load("owned", level, n) for n in names]
        flat = np.concatenate(
            [self._load("blocks", level, n, o.size) for n, o in zip(names, owned, strict=True)]
        )
        owned = np.concatenate(owned)
        order = np.argsort(owned, kind="stable")
        if not np.array_equal(owned[order], np.arange(self.n_classes[k])):
            raise DataError(
                f"{self.path}: the class blocks of level {level!r} do not cover its classes"
            )
        flat = flat[order]
        out, at = {}, 0
        for m in self.masks:
            n_s = self.basis.block_size(m)
            out[m] = flat[:, at : at + n_s * n_s].reshape(-1, n_s, n_s)
            at += n_s * n_s
        blocks = (BlockDiagonal(self.basis, out),)
        return BlockCovariance(blocks, self.identified, (self.n_classes[k],), self._rows)

    def standard_errors(
        self, level: str, query: ProductQuery | str, lo: int = 0, hi: int | None = None
    ) -> np.ndarray:
        """GLS standard errors of every row of ``query`` at nodes ``[lo, hi)`` of ``level``,
        ``(n, n_rows)``, from the nodes' class blocks; NaN for unidentified rows
        (:meth:`BlockCovariance.query_variances`). Every piece read is checked first (the
        class docstring)."""
        q = ProductQuery.parse(self.schema, query) if isinstance(query, str) else query
        se = np.sqrt(self._class_covariance(level).query_variances(0, q))
        return se[self._gather("classes", level, lo, hi).astype(np.int64)]

    def column_standard_errors(self, level: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """GLS standard errors of every P1–P5 column at nodes ``[lo, hi)``: ``(n, 298)``.

        GLS only: the stored integers' error also holds the rounding's (the national stream
        rounds no replicates, :func:`~censusdp.pipelines.products.pl94_stream.stream_pl94`
        ``rounding_replicates``), which these leave out."""
        cls = self._gather("classes", level, lo, hi).astype(np.int64)
        cov = self._class_covariance(level)
        return pl94_column_values(lambda q: np.sqrt(cov.query_variances(0, q))[cls])

    def verify(self, expected_digest: str | None = None) -> str:
        """Check every file of the store and recompute the content digest (returned).

        Every file the manifest describes is read and checked as a reader checks it
        (checksum, dtype, shape, values), the histograms too, and the content digest is
        recomputed from the pieces and compared with the manifest's. What this detects is
        the class docstring's: with ``expected_digest`` (here, or given when the store was
        opened) any change; without it, only a store inconsistent with itself.

        Parameters
        ----------
        expected_digest : str, optional
            The release digest (:attr:`release_digest`) the store must have.

        Returns
        -------
        str
            The content digest (:attr:`digest`), comparable with the digests of earlier
            runs and formats.
        """
        self._expect(expected_digest)
        layout = [[(a, name) for a, _, name in lv] for lv in self.layout]
        digest = _content_digest(self._load, self.levels, layout, bool(self.masks))
        if self.manifest["histograms"]:
            for lvl, pieces in zip(self.levels, self.layout, strict=True):
                for _, _, name in pieces:
                    self._load("histograms", lvl, name)
        if digest != self.digest:
            raise DataError(
                f"{self.path / MANIFEST}: the digest of the content does not match the "
                "manifest's; the store was changed after it was written"
            )
        return digest


def _pieces(
    file: Path,
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
        check_tiling(file, lvl, sizes[k], [(a, b) for a, b, _ in pieces])
        out.append(pieces)
    return out
