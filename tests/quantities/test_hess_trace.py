"""HessTrace against the diagonal of the brute-force Hessian (and GGN)."""

import pytest

import problems
from cockpit_lite.quantities import HessTrace

CURVATURE_MATRIX = {"diag_h": problems.hessian, "diag_ggn_exact": problems.ggn}


def reference_for(curvature):
    def reference(problem, snapshots, step):
        diagonal = CURVATURE_MATRIX[curvature](problem, snapshots[step]).diagonal()
        return [diagonal[block].sum() for block in problems.layer_blocks(problem)]

    return reference


@pytest.mark.parametrize("case", problems.CASES, ids=problems.case_id)
def test_hessian_diagonal_matches_brute_force(case):
    problems.check(HessTrace(), reference_for("diag_h"), case, layers=False)


@pytest.mark.parametrize("case", problems.CASES[::3], ids=problems.case_id)
def test_ggn_diagonal_matches_brute_force(case):
    quantity = HessTrace(curvature="diag_ggn_exact")
    problems.check(quantity, reference_for("diag_ggn_exact"), case, layers=False)


def test_unknown_curvature_is_named():
    with pytest.raises(ValueError, match="diag_ggn_mc"):
        HessTrace(curvature="diag_hessian")
