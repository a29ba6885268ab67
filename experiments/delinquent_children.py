"""Delinquent children by county and household-head education: a 4 × 4 contingency table
with both margins invariant, privatised by the generalized Laplace mechanism (ℓ₁ and ℓ₂).

The table is Table 4 of the Federal Committee on Statistical Methodology's Statistical
Policy Working Paper 22 (2005), reproduced as Table 2 of the paper. Gamma's row total is 25
(3 + 10 + 10 + 2); the seed's 35 is a typo (the grand total 135 needs 25).

References
----------
Dharangutte, Gao, Gong & Yu, "Integer Subspace Differential Privacy", AAAI 2023, §5,
Fig. 1, Table 1, Appendix E.3 (Tables 2–3, Figs. 6–7).
Federal Committee on Statistical Methodology (2005), Statistical Policy Working Paper 22,
Table 4.
"""

from __future__ import annotations

import numpy as np

from censusdp.experiments._lattice_tables import LatticeTable, run_table_experiment
from censusdp.experiments.registry import ExperimentInfo
from censusdp.mechanisms.lattice import table_margins_incidence

__all__ = ["TABLE", "COUNTIES", "EDUCATION", "EPSILON", "run"]

#: What this study reproduces, for ``censusdp experiment --list`` and the README.
INFO = ExperimentInfo(
    reproduces="integer subspace DP: 4 × 4 table with invariant margins, ℓ₁ (Gibbs moves) / ℓ₂ (Metropolis) lattice Laplace, TV bound < 0.01 and R̂ < 1.01 certified",
    paper="Dharangutte, Gao, Gong & Yu (2023), Integer Subspace Differential Privacy, Fig. 1 and Table 1",
    data=(),
    full_run="21 s",
)

COUNTIES = ("Alpha", "Beta", "Gamma", "Delta")
EDUCATION = ("Low", "Medium", "High", "Very High")
#: County × education counts (row totals 20, 55, 25, 35; column totals 50, 35, 30, 20).
TABLE = np.array([[15, 1, 3, 1], [20, 10, 10, 15], [3, 10, 10, 2], [12, 14, 7, 2]], dtype=np.int64)
#: The seed's ε value is not recoverable from its text; 0.2 gives noise of a few units.
EPSILON = 0.2


def run(ctx) -> dict:
    """Both margins invariant; ℓ₁ and ℓ₂ generalized Laplace; 1,000 independent draws."""
    a = table_margins_incidence(4, 4)
    labels = [f"{c[:2]}/{e}" for c in COUNTIES for e in EDUCATION]
    return run_table_experiment(
        ctx,
        LatticeTable(
            name="delinquent-children",
            title="Delinquent children: 4 × 4 table with invariant margins",
            incidence=a,
            data=TABLE.reshape(-1),
            epsilon=EPSILON,
            cell_labels=labels,
            table_shape=(4, 4),
            row_names=COUNTIES,
            col_names=EDUCATION,
            invariant_names=("row totals (county)", "column totals (education)"),
            description=(
                "The FCSM (2005) delinquent-children table (Gamma's row total is 25; the seed's "
                "35 is a typo). Both margins are held invariant. ε = 0.2 per unit ℓ distance "
                "(the paper's value is not recoverable from the seed text)."
            ),
        ),
    )
