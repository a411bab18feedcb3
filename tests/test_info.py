"""Derivation and validation of info keys."""

import pytest
import torch
from torch import nn

from cockpit_lite import extend
from cockpit_lite.info import StepInfo, individual_losses_from_graph, normalise_individual_losses

B = 6
g = torch.Generator().manual_seed(0)
LOGITS = torch.randn(B, 4, generator=g, dtype=torch.float64, requires_grad=True)
CLASSES = torch.randint(0, 4, (B,), generator=g)
TARGETS = torch.randn(B, 4, generator=g, dtype=torch.float64)
SEGMENTS = torch.randint(0, 4, (B, 3), generator=g)

LOSSES = {
    # name: (loss module, input, target)
    "ce": (nn.CrossEntropyLoss, LOGITS, CLASSES),
    "ce_weighted_ignore": (
        lambda reduction: nn.CrossEntropyLoss(
            weight=torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64), ignore_index=1, reduction=reduction
        ),
        LOGITS,
        CLASSES,
    ),
    "ce_spatial": (nn.CrossEntropyLoss, LOGITS.reshape(B, 4, 1).expand(B, 4, 3), SEGMENTS),
    "nll": (nn.NLLLoss, LOGITS.log_softmax(1), CLASSES),
    "mse": (nn.MSELoss, LOGITS, TARGETS),
    "bce_logits": (nn.BCEWithLogitsLoss, LOGITS, TARGETS.sigmoid()),
}


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("extended", [False, True])
def test_derived_individual_losses_average_to_the_loss(name, reduction, extended):
    """ℓ_n is B × sample n's share of the reduced loss, from a per-sample loop."""
    make, inputs, targets = LOSSES[name]
    lossfunc = make(reduction=reduction)
    if extended:
        lossfunc = extend(lossfunc)
    loss = lossfunc(inputs, targets)
    derived = individual_losses_from_graph(loss)
    unreduced = make(reduction="none")(inputs, targets).detach()
    if reduction == "sum":
        expected = B * unreduced.reshape(B, -1).sum(1)
    elif name.startswith("ce_weighted"):
        weights = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64)[CLASSES] * (CLASSES != 1)
        expected = B * unreduced / weights.sum()
    else:
        expected = B * unreduced.reshape(B, -1).sum(1) / unreduced.numel()
    torch.testing.assert_close(derived, expected)
    torch.testing.assert_close(derived.mean(), loss.detach())


def test_a_loss_times_a_constant_is_derived():
    """``loss / accumulation_steps`` and scaled DDP shard losses: ``mean_n ℓ_n`` is the scaled loss."""
    base = nn.CrossEntropyLoss(reduction="none")(LOGITS, CLASSES)
    for loss, factor in ((nn.CrossEntropyLoss()(LOGITS, CLASSES) / 4, 0.25), (3 * nn.CrossEntropyLoss()(LOGITS, CLASSES), 3.0)):
        torch.testing.assert_close(individual_losses_from_graph(loss), base * factor)


def test_underivable_loss_explains_the_fix():
    loss = nn.CrossEntropyLoss()(LOGITS, CLASSES) + LOGITS.square().mean()  # a regulariser added
    with pytest.raises(ValueError, match=r"AddBackward0.*individual_losses"):
        individual_losses_from_graph(loss)
    with pytest.raises(ValueError, match=r"Alpha needs info\['individual_losses'\] at step 3"):
        StepInfo({"loss": loss}, 3).require("individual_losses", "Alpha")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_user_given_individual_losses_are_normalised(reduction):
    loss = nn.MSELoss(reduction=reduction)(LOGITS, TARGETS)
    given = nn.MSELoss(reduction="none")(LOGITS, TARGETS)  # per element: averaged per sample
    info = StepInfo({"loss": loss, "individual_losses": given}, 0)
    losses = info.require("individual_losses", "Alpha")
    torch.testing.assert_close(losses.mean(), loss.detach())
    expected = given.detach().sum(1) * B if reduction == "sum" else given.detach().mean(1)
    torch.testing.assert_close(losses, expected)


def test_inconsistent_individual_losses_are_refused():
    loss = nn.CrossEntropyLoss()(LOGITS, CLASSES)
    with pytest.raises(ValueError, match="neither"):
        normalise_individual_losses(torch.ones(B), loss)
    with pytest.raises(ValueError, match="one entry per sample"):
        normalise_individual_losses(torch.tensor(1.0), loss)


def test_validation_of_given_keys():
    info = StepInfo({"optimizer": "sgd"}, 0)
    with pytest.raises(ValueError, match="torch.optim.Optimizer"):
        info.require("optimizer", "CABS")
    with pytest.raises(TypeError, match="dict"):
        StepInfo([("loss", 1)], 0)
