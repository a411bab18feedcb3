"""configuration(level, curvature=...): the levels, and the curvature choice reaching the record."""

import pytest
import torch

import problems
from cockpit_lite import configuration, quantities
from cockpit_lite.quantities.curvature import CurvatureQuantity


def test_levels_are_supersets():
    names = {level: {q.name for q in configuration(level)} for level in ("economy", "business", "full")}
    assert names["economy"] < names["business"] < names["full"]
    assert {"HessTrace", "TICDiag", "TICTrace"} <= names["business"] - names["economy"]
    assert {"HessMaxEV", "GradHist2d"} <= names["full"] - names["business"]


@pytest.mark.parametrize("curvature", ["auto", "diag_h", "diag_ggn_exact", "diag_ggn_mc", "hutchinson"])
def test_curvature_reaches_every_curvature_quantity(curvature):
    built = configuration("full", curvature=curvature)
    chosen = {q.name: q.curvature for q in built if isinstance(q, CurvatureQuantity)}
    assert chosen == {"HessTrace": curvature, "TICDiag": curvature, "TICTrace": curvature}


def test_unknown_curvature_lists_the_choices():
    with pytest.raises(ValueError, match="'auto', 'diag_h', 'diag_ggn_exact', 'diag_ggn_mc', 'hutchinson'"):
        configuration("business", curvature="exact")


@pytest.mark.parametrize("curvature, method", [("auto", "diag_h"), ("hutchinson", "hutchinson"), ("diag_ggn_exact", "diag_ggn_exact")])
def test_the_record_says_which_curvature_ran(curvature, method):
    """A BackPACK-extended MLP: auto takes the exact Hessian diagonal; an explicit choice is kept."""
    business = [q for q in configuration("business", curvature=curvature) if isinstance(q, CurvatureQuantity)]
    cp, _ = problems.run(problems.make("mlp", 3, steps=1), business)
    meta = cp.get_output()[0]["meta"]
    assert {meta[q.name]["curvature"] for q in business} == {method}
    assert ("se" in meta["HessTrace"]) == (method == "hutchinson")


def test_auto_on_a_realistic_model_estimates_and_says_so():
    problem = problems.make("resnet_bn_train", 3, steps=1)
    cp, _ = problems.run(problem, configuration("full"))
    entry = cp.get_output()[0]
    assert entry["meta"]["TICTrace"]["curvature"] == "hutchinson"
    assert torch.isfinite(torch.tensor([entry["TICTrace"], entry["HessMaxEV"], *entry["HessTrace"]])).all()
    assert isinstance(quantities.REGISTRY["HessTrace"](), CurvatureQuantity)
