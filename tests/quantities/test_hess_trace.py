"""HessTrace against the diagonal of the brute-force Hessian (and GGN); the curvature choice;
Hutchinson's estimator unbiased with honest standard errors on every realistic model."""

import warnings

import pytest
import torch

import models
import problems
from cockpit_lite import Cockpit, extend
from cockpit_lite.curvature import derivatives, hutchinson
from cockpit_lite.curvature.hvp import HessianVectorProducts
from cockpit_lite.quantities import HessTrace

CURVATURE_MATRIX = {"diag_h": problems.hessian, "diag_ggn_exact": problems.ggn}
ESTIMATED = [name for name in models.REALISTIC if name != "lstm"] + ["mlp", "cnn"]
"""The models of the 512-product unbiasedness test (the LSTM's double backward alone took a
third of it: the LSTM's estimate is checked against its exact trace by the ``auto`` test below)."""


def reference_for(curvature):
    def reference(problem, snapshots, step):
        diagonal = CURVATURE_MATRIX[curvature](problem, snapshots[step]).diagonal()
        return [diagonal[block].sum() for block in problems.layer_blocks(problem)]

    return reference


@pytest.mark.parametrize("case", problems.CASES, ids=problems.case_id)
def test_hessian_diagonal_matches_brute_force(case):
    record = problems.check(HessTrace(), reference_for("diag_h"), case, layers=False)
    assert all(entry["meta"]["HessTrace"] == {"curvature": "diag_h"} for entry in record.values())


@pytest.mark.parametrize("case", problems.CASES[::3], ids=problems.case_id)
def test_ggn_diagonal_matches_brute_force(case):
    quantity = HessTrace(curvature="diag_ggn_exact")
    problems.check(quantity, reference_for("diag_ggn_exact"), case, layers=False)


def test_unknown_curvature_is_named():
    with pytest.raises(ValueError, match="hutchinson"):
        HessTrace(curvature="diag_hessian")


def _products(name, batch_size=4):
    problem = problems.make(name, batch_size, steps=1)
    model = problem.model
    state = {k: v.clone() for k, v in model.state_dict().items()}
    snapshot = problems.Snapshot(
        [p.detach().clone() for p in model.parameters()], *problem.batches[0], state, torch.get_rng_state()
    )
    derivatives.enable()
    loss = problem.lossfunc(model(snapshot.x), snapshot.y)
    return problem, snapshot, HessianVectorProducts(loss, list(model.parameters()), 0)


@pytest.mark.parametrize("name", ESTIMATED)
def test_hutchinson_is_unbiased_and_its_standard_error_is_honest(name):
    """Mean over 256 probes within 3 standard errors of the exact trace; the reported standard
    error of 16-probe estimates within a factor 2 of their spread over 16 independent draws."""
    problem, snapshot, products = _products(name)
    exact = problems.hessian(problem, snapshot).diagonal().sum()
    many = hutchinson.DiagonalEstimate(products, 256, torch.Generator().manual_seed(5))
    total = lambda d: torch.stack([sum(x.sum() for x in d)])  # noqa: E731
    value, se = total(many.diagonal)[0], many.standard_error(total)[0]
    assert abs(value - exact) <= 3 * se, f"{name}: {value} vs exact {exact} (SE {se})"
    values, errors = [], []
    for seed in range(16):
        few = hutchinson.DiagonalEstimate(products, 16, torch.Generator().manual_seed(100 + seed))
        values.append(total(few.diagonal)[0])
        errors.append(few.standard_error(total)[0])
    empirical, reported = torch.stack(values).std(), torch.stack(errors).mean()
    assert 0.5 <= float(reported / empirical) <= 2, f"{name}: reported SE {reported} vs empirical {empirical}"


@pytest.mark.parametrize("name", ["resnet_bn_train", "gpt", "lstm"])
def test_auto_uses_the_estimator_where_backpack_cannot_and_records_it(name):
    problem = problems.make(name, 3, steps=1)
    cp, snapshots = problems.run(problem, [HessTrace(probes=8)])
    for step, entry in cp.get_output().items():
        meta = entry["meta"]["HessTrace"]
        assert meta["curvature"] == "hutchinson" and meta["probes"] == 8 and meta["df"] == 7  # one group per probe
        exact = sum(reference_for("diag_h")(problem, snapshots, step))
        assert abs(sum(entry["HessTrace"]) - float(exact)) <= 5 * meta["se"]
        assert len(meta["layers_se"]) == len(entry["HessTrace"])


def test_estimates_are_reproducible_and_leave_the_user_random_state_alone():
    values = []
    for _ in range(2):
        problem = problems.make("custom", 3, steps=2)
        state = torch.get_rng_state()
        cp, _ = problems.run(problem, [HessTrace(curvature="hutchinson", probes=4)])
        assert torch.equal(state, torch.get_rng_state())
        values.append([cp.get_output()[s]["HessTrace"] for s in (0, 1)])
    assert values[0] == values[1]


def test_without_the_model_auto_finds_it_and_is_exact():
    """Cockpit's recipe, parameters of an extended model: the exact diagonal, as with the model."""
    problem = problems.make("mlp", 3, steps=1)
    x, y = problem.batches[0]
    cp = Cockpit(problem.model.parameters(), [HessTrace(probes=4)])
    loss = problem.lossfunc(problem.model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward(create_graph=cp.create_graph(0))
    assert cp.get_output()[0]["meta"]["HessTrace"]["curvature"] == "diag_h"


def test_explicit_backpack_curvature_on_an_unsupported_model_names_layer_and_fix():
    """Refused before the backward pass (a BackPACK failure inside it would stop training); the fix works."""
    torch.manual_seed(0)
    model, lossfunc = extend(models.ResNet(models._group_norm).double()), extend(torch.nn.CrossEntropyLoss())
    x, y = torch.randn(3, 2, 4, 4, dtype=torch.float64), torch.tensor([0, 1, 2])
    cp = Cockpit(model, [HessTrace(curvature="diag_h")])
    loss = lossfunc(model(x), y)
    with pytest.raises(ValueError, match=r"HessTrace cannot use curvature='diag_h'.*the model \(ResNet\).*curvature='hutchinson'"):
        cp(0, info={"loss": loss})
    cp = Cockpit(model, [HessTrace(curvature="hutchinson")])  # the fix
    loss = lossfunc(model(x), y)
    with cp(0, info={"loss": loss}):
        loss.backward(create_graph=cp.create_graph(0))
    assert torch.isfinite(torch.tensor(cp.get_output()[0]["HessTrace"])).all()


def test_converter_failure_names_the_fix_and_the_fix_works():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"converter cannot trace GPT.*cockpit_lite.extend\(model\) without"):
        extend(models.GPT().double(), use_converter=True)
    model = extend(models.GPT().double())  # the fix
    x = torch.randint(0, models.VOCAB, (2, models.SEQ))
    cp = Cockpit(model, [HessTrace(probes=2)])
    loss = models.TokenCrossEntropy()(model(x), x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with cp(0, info={"loss": loss}):
            loss.backward(create_graph=cp.create_graph(0))
    assert cp.get_output()[0]["meta"]["HessTrace"]["curvature"] == "hutchinson"


def test_backpack_is_detected_per_layer():
    """Exact where every layer and the loss are supported; the reason names what is not."""
    from cockpit_lite.backend import curvature_support

    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    model = extend(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)))
    assert curvature_support(model, extend(torch.nn.CrossEntropyLoss())(model(x), y), "diag_h") is None
    assert "not computed by an extended" in curvature_support(model, torch.nn.CrossEntropyLoss()(model(x), y), "diag_h")
    assert "not computed by an extended" in curvature_support(
        model, extend(torch.nn.NLLLoss())(model(x).log_softmax(1), y), "diag_h"
    )
    gelu = extend(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GELU(), torch.nn.Linear(4, 2)))
    assert "1 (GELU)" in curvature_support(gelu, extend(torch.nn.CrossEntropyLoss())(gelu(x), y), "diag_h")
    bn = extend(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)))
    loss = extend(torch.nn.CrossEntropyLoss())(bn(x), y)
    assert "training mode" in curvature_support(bn, loss, "diag_ggn_exact")
    bn.eval()
    assert curvature_support(bn, extend(torch.nn.CrossEntropyLoss())(bn(x), y), "diag_ggn_exact") is None
    assert "not BackPACK-extended" in curvature_support(torch.nn.Sequential(torch.nn.Linear(3, 2)), loss, "diag_h")
