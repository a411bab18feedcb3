"""configuration(level, curvature=...): the levels, and the curvature choice reaching the record."""

import pytest
import torch

import problems
from cockpit_lite import configuration, quantities
from cockpit_lite.quantities.curvature import CurvatureQuantity
from cockpit_lite.utils.configuration import quantities_cls_for_configuration


def test_levels_are_supersets():
    names = {level: {q.name for q in configuration(level)} for level in ("economy", "business", "full")}
    assert names["economy"] < names["business"] < names["full"]
    assert names["business"] - names["economy"] == {"HessTrace", "TICDiag"}
    assert names["full"] - names["business"] == {"HessMaxEV", "GradHist2d"}


@pytest.mark.parametrize("level", ["economy", "business", "full"])
def test_levels_are_cockpits_class_for_class(level):
    """As Cockpit's own configuration test asserts: the same classes, nothing more (a ported
    run must record what Cockpit's plotter can draw)."""
    cockpit = pytest.importorskip("cockpit")
    from cockpit.utils.configuration import quantities_cls_for_configuration as peer

    assert [cls.__name__ for cls in quantities_cls_for_configuration(level)] == [cls.__name__ for cls in peer(level)]
    assert [q.name for q in configuration(level)] == [cls.__name__ for cls in peer(level)]
    del cockpit


def test_extras_add_what_cockpit_tracked_at_no_level():
    extra = {level: {q.name for q in configuration(level, extras=True)} - {q.name for q in configuration(level)}
             for level in ("economy", "business", "full")}
    assert extra == {"economy": {"MeanGSNR", "GradVariance"}, "business": {"MeanGSNR", "GradVariance", "TICTrace"},
                     "full": {"MeanGSNR", "GradVariance", "TICTrace"}}
    with pytest.raises(ValueError, match="unknown level 'premium'"):
        configuration("premium", extras=True)


@pytest.mark.parametrize("curvature", ["auto", "diag_h", "diag_ggn_exact", "diag_ggn_mc", "hutchinson"])
def test_curvature_reaches_every_curvature_quantity(curvature):
    built = configuration("full", curvature=curvature, extras=True)
    chosen = {q.name: q.curvature for q in built if isinstance(q, CurvatureQuantity)}
    assert chosen == {"HessTrace": curvature, "TICDiag": curvature, "TICTrace": curvature}


def test_unknown_curvature_lists_the_choices():
    with pytest.raises(ValueError, match="'auto', 'diag_h', 'diag_ggn_exact', 'diag_ggn_mc', 'hutchinson'"):
        configuration("business", curvature="exact")


@pytest.mark.parametrize("curvature, method", [("auto", "diag_h"), ("hutchinson", "hutchinson"), ("diag_ggn_exact", "diag_ggn_exact")])
def test_the_record_says_which_curvature_ran(curvature, method):
    """A BackPACK-extended MLP: auto takes the exact Hessian diagonal; an explicit choice is kept
    (the TICs take no estimate: None)."""
    business = [q for q in configuration("business", curvature=curvature, extras=True) if isinstance(q, CurvatureQuantity)]
    cp, _ = problems.run(problems.make("mlp", 3, steps=1), business)
    meta = cp.get_output()[0]["meta"]
    expected = {q.name: None if q.EXACT_ONLY and method == "hutchinson" else method for q in business}
    assert {q.name: meta[q.name]["curvature"] for q in business} == expected
    assert ("se" in meta["HessTrace"]) == (method == "hutchinson")


def test_auto_on_a_realistic_model_says_what_ran():
    """BackPACK cannot serve a ResNet with BatchNorm in training mode: HessTrace estimates the
    Hessian's trace, the TICs take the engine's exact GGN diagonal; every value is finite."""
    problem = problems.make("resnet_bn_train", 3, steps=1)
    cp, _ = problems.run(problem, configuration("full", extras=True))
    entry = cp.get_output()[0]
    assert entry["meta"]["HessTrace"]["curvature"] == "hutchinson"
    assert entry["meta"]["TICTrace"] == entry["meta"]["TICDiag"] == {"curvature": "diag_ggn_exact", "passes": 2}
    values = [entry["HessMaxEV"], *entry["HessTrace"], entry["TICTrace"], entry["TICDiag"]]
    assert torch.isfinite(torch.tensor(values)).all()
    assert isinstance(quantities.REGISTRY["HessTrace"](), CurvatureQuantity)
