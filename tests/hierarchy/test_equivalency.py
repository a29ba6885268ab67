"""Block → area equivalency files: mapping to leaves against a slow reference, formats
(BAF pipes, GISJOIN blocks, latin-1), and refusals naming file, row and column."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from censusdp.errors import DataError
from censusdp.hierarchy.equivalency import equivalency_from_arrays, read_equivalency
from censusdp.hierarchy.synthetic import random_hierarchy, synthetic_state


def _h():
    return synthetic_state(4, blocks=200).hierarchy


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 9), st.floats(0.0, 0.9))
def test_mapping_equals_slow_reference(seed, n_areas, unassigned):
    """Random trees, random block → area maps in random row order: the leaf → area pairs and
    the sums of leaves equal a dict-and-loop reference."""
    gen = np.random.default_rng(seed)
    h = random_hierarchy(gen, [(1, 3), (1, 4), (1, 5)])
    codes = [str(c) for c in h.leaves.codes]
    rows = [(c, f"A{gen.integers(n_areas)}") for c in codes if gen.random() >= unassigned]
    rows = [rows[i] for i in gen.permutation(len(rows))]
    if not rows:
        return
    eq = equivalency_from_arrays(h, [b for b, _ in rows], [a for _, a in rows])
    ref = {codes.index(b): a for b, a in rows}  # slow: a list search per row
    got = {int(lf): str(eq.codes[a]) for lf, a in zip(eq.leaf, eq.area, strict=True)}
    assert got == ref
    assert list(eq.codes) == sorted(set(ref.values()))
    values = gen.integers(0, 50, size=(h.leaves.size, 3))
    sums = eq.sum_leaves(values)
    for a, code in enumerate(eq.codes):
        want = sum(values[lf] for lf, c in ref.items() if c == code)
        assert np.array_equal(sums[a], want)  # integers: exact
    inc = eq.incidence().toarray()
    assert np.array_equal(inc.sum(axis=1), [lf in ref for lf in range(h.leaves.size)])


def test_baf_pipes_gisjoin_blocks_and_latin1(tmp_path):
    h = _h()
    codes = [str(c) for c in h.leaves.codes]
    # a Census BAF: pipe-delimited, blank place for blocks in no place
    baf = tmp_path / "BlockAssign_ST01_AL_INCPLACE_CDP.txt"
    baf.write_text(
        "BLOCKID|PLACEFP\n" + "".join(f"{c}|{'' if i % 4 == 0 else f'{i % 5:05d}'}\n"
                                      for i, c in enumerate(codes)),
        encoding="utf-8",
    )  # fmt: skip
    eq = read_equivalency(baf, h, block_column="BLOCKID", area_column="PLACEFP",
                          skip_blank_areas=True)  # fmt: skip
    assert eq.name == "placefp" and eq.leaf.size == 150 and eq.n_areas == 5
    # NHGIS: GISJOIN block codes (G SS 0 CCC 0 TTTTTT BBBB) and a latin-1 place name column
    nh = tmp_path / "nhgis_blk_place.csv"
    lines = ["GISJOIN,PLACE\n"]
    for i, c in enumerate(codes):
        lines.append(f"G{c[:2]}0{c[2:5]}0{c[5:11]}{c[11:]},Peñasco {i % 3}\n")
    nh.write_bytes("".join(lines).encode("latin-1"))
    eq2 = read_equivalency(nh, h, block_column="GISJOIN", area_column="PLACE", gisjoin=True)
    assert eq2.leaf.size == 200 and list(eq2.codes) == [f"Peñasco {i}" for i in range(3)]


def test_refusals_name_file_row_and_column(tmp_path):
    h = _h()
    codes = [str(c) for c in h.leaves.codes]
    p = tmp_path / "eq.csv"

    def write(rows, header="block,area"):
        p.write_text(header + "\n" + "".join(f"{b},{a}\n" for b, a in rows), encoding="utf-8")
        return p

    good = [(c, f"P{i % 7}") for i, c in enumerate(codes)]
    with pytest.raises(DataError, match=r"eq.csv: no column 'area'"):
        read_equivalency(write(good, header="block,place"), h)
    with pytest.raises(DataError, match=r"eq.csv, data row 4 \(line 5\), column 'block': block "):
        read_equivalency(write(good[:3] + [("01001X", "P1")] + good[3:]), h)
    with pytest.raises(DataError, match=r"data row 201 \(line 202\), column 'block': .*listed again"
                       r" \(first at data row 5"):  # fmt: skip
        read_equivalency(write(good + [(codes[4], "P2")]), h)
    with pytest.raises(DataError, match=r"data row 10 \(line 11\), column 'area': blank area"):
        read_equivalency(write(good[:9] + [(codes[9], "")] + good[10:]), h)
    with pytest.raises(DataError, match=r"eq.csv: a header but no data rows"):
        read_equivalency(write([]), h)
    q = tmp_path / "g.csv"
    gis = [f"G{c[:2]}0{c[2:5]}0{c[5:]}" for c in codes[:2]] + [f"G{codes[2]}"]
    q.write_text("GISJOIN,area\n" + "".join(f"{g},A\n" for g in gis), encoding="utf-8")
    with pytest.raises(DataError, match=r"g.csv, data row 3, column 'GISJOIN'.*not a GISJOIN"):
        read_equivalency(q, h, block_column="GISJOIN", gisjoin=True)
