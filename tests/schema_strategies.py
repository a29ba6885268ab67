"""Hypothesis strategies for random schemas (nested recodes, slices) and product workloads."""

from __future__ import annotations

from hypothesis import strategies as st

from censusdp.schema import Schema


@st.composite
def schemas(
    draw, max_attributes: int = 4, max_domain: int = 7, max_cells: int | None = None
) -> Schema:
    """1–``max_attributes`` attributes, domains 1–``max_domain`` (at most ``max_cells`` cells
    in all), chains of random recodes and random slices."""
    k = draw(st.integers(1, max_attributes))
    attrs = []
    cells = 1
    for a in range(k):
        cap = max_domain if max_cells is None else max(1, min(max_domain, max_cells // cells))
        d = draw(st.integers(1, cap))
        cells *= d
        labels = [f"a{a}v{i}" for i in range(d)]
        spec: dict = {"name": f"x{a}", "labels": labels, "recodes": [], "slices": []}
        parent, parent_labels = f"x{a}", labels
        for j in range(draw(st.integers(0, 2))):
            n = len(parent_labels)
            if n < 2:
                break
            n_groups = draw(st.integers(1, n - 1))
            # a random surjection parent rows → groups
            assign = draw(st.lists(st.integers(0, n_groups - 1), min_size=n, max_size=n))
            assign = [g % n_groups for g in assign]
            assign[:n_groups] = range(n_groups)  # every group non-empty
            assign = draw(st.permutations(assign))
            groups = {
                f"a{a}r{j}g{g}": [parent_labels[i] for i in range(n) if assign[i] == g]
                for g in range(n_groups)
            }
            name = f"x{a}r{j}"
            spec["recodes"].append({"name": name, "of": parent, "groups": groups})
            parent, parent_labels = name, list(groups)
        if d > 1 and draw(st.booleans()):
            src = draw(st.sampled_from([spec["name"]] + [r["name"] for r in spec["recodes"]]))
            rows = (
                labels
                if src == spec["name"]
                else list(next(r for r in spec["recodes"] if r["name"] == src)["groups"])
            )
            if len(rows) > 1:
                keep = draw(
                    st.lists(st.sampled_from(rows), min_size=1, max_size=len(rows) - 1, unique=True)
                )
                spec["slices"].append({"name": f"x{a}s", "of": src, "groups": keep})
        attrs.append(spec)
    return Schema.from_dict({"name": "random", "attributes": attrs})


@st.composite
def query_texts(draw, schema: Schema) -> str:
    """A random product query over ``schema`` (one element or 'all' per attribute)."""
    terms = []
    for a in schema.attributes:
        choices = [n for n, e in a.elements.items() if e.kind != "all"] + [None]
        pick = draw(st.sampled_from(choices))
        if pick is not None:
            terms.append(pick)
    return " * ".join(terms) if terms else "total"
