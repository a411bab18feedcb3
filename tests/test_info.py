"""Derivation and validation of info keys."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cockpit_lite import extend
from cockpit_lite.info import (StepInfo, batch_size_from_graph, contributions_from_graph, individual_losses_from_graph,
                               normalise_individual_losses, penalty_term)

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
    "ce_smoothed": (lambda reduction: nn.CrossEntropyLoss(label_smoothing=0.1, reduction=reduction), LOGITS, CLASSES),
    "ce_weighted_ignore_smoothed": (
        lambda reduction: nn.CrossEntropyLoss(
            weight=torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64), ignore_index=1,
            label_smoothing=0.25, reduction=reduction,
        ),
        LOGITS,
        CLASSES,
    ),
    "ce_spatial_smoothed": (
        lambda reduction: nn.CrossEntropyLoss(label_smoothing=0.1, reduction=reduction),
        LOGITS.reshape(B, 4, 1).expand(B, 4, 3),
        SEGMENTS,
    ),
    "huber": (lambda reduction: nn.HuberLoss(delta=0.5, reduction=reduction), LOGITS, TARGETS),
    "smooth_l1": (lambda reduction: nn.SmoothL1Loss(beta=0.5, reduction=reduction), LOGITS, TARGETS),
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


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("name", ["ce_smoothed", "ce_weighted_ignore_smoothed", "huber"])
def test_contributions_of_smoothed_and_robust_losses_have_the_loss_gradient(name, reduction):
    """The exact global path differentiates c_n with its graph: Σ_n ∇c_n is the loss's gradient."""
    make, inputs, targets = LOSSES[name]
    loss = make(reduction=reduction)(inputs, targets)
    contributions = StepInfo({"loss": loss}, 0).contributions("Quantity")
    (from_contributions,) = torch.autograd.grad(contributions.sum(), LOGITS, retain_graph=True)
    (from_loss,) = torch.autograd.grad(loss, LOGITS)
    torch.testing.assert_close(from_contributions, from_loss)


def test_smoothed_token_losses_are_grouped_per_sequence():
    """Label-smoothed cross-entropy on ``logits.view(-1, V)`` of ``[B, T, V]``: the rows of each sequence are
    summed without a given batch size (the shape is read above the NLL node, as without smoothing)."""
    logits, targets = token_losses()
    loss = nn.CrossEntropyLoss(label_smoothing=0.1)(logits.reshape(B, T, 4).reshape(-1, 4), targets)
    unreduced = nn.CrossEntropyLoss(label_smoothing=0.1, reduction="none")(logits, targets).detach()
    torch.testing.assert_close(individual_losses_from_graph(loss), unreduced.reshape(B, T).sum(1) / T)


def test_a_sum_that_only_looks_like_label_smoothing_is_refused():
    """0.9 · cross-entropy plus another term (here the smoothing term with the wrong factor, and an
    L2 penalty) is not a label-smoothed cross-entropy."""
    nll = nn.CrossEntropyLoss()(LOGITS, CLASSES)
    smoothing = -LOGITS.log_softmax(1).sum(1).masked_fill(CLASSES == -100, 0.0).sum() / B
    for loss in (0.9 * nll + 0.05 * smoothing, 0.9 * nll + 0.025 * LOGITS.square().sum()):
        with pytest.raises(ValueError, match=r"loss function \(NllLossBackward0\) plus another term of the model's outputs"):
            individual_losses_from_graph(loss)


def test_underivable_loss_explains_the_fix():
    loss = nn.CrossEntropyLoss()(LOGITS, CLASSES) + LOGITS.square().mean()  # a regulariser of the outputs added
    with pytest.raises(ValueError, match=(
        r"plus another term of the model's outputs \(its autograd node is MeanBackward0, e\.g\. an "
        r"activation penalty\).*Fix: pass info\['individual_losses'\] = each sample's share"
    )):
        individual_losses_from_graph(loss)
    with pytest.raises(ValueError, match=r"Alpha needs info\['individual_losses'\] at step 3"):
        StepInfo({"loss": loss}, 3).require("individual_losses", "Alpha")
    shares = nn.CrossEntropyLoss(reduction="none")(LOGITS, CLASSES) + LOGITS.square().mean(1)  # the fix
    torch.testing.assert_close(StepInfo({"loss": loss, "individual_losses": shares}, 3).require(
        "individual_losses", "Alpha"), shares.detach())


PENALTY = (r"a loss function \(NllLossBackward0\) plus a term that reads no sample of the batch.*a penalty on "
           r"the parameters, such as an explicit L2 term, is no sum of per-sample terms\. Fix: backpropagate the "
           r"data loss inside the context and add the penalty's gradient outside it.*weight_decay=2\*lam")


def test_a_penalty_on_the_parameters_is_named_with_its_fix():
    """``ce + lam * sum ||p||^2``: no per-sample share of the penalty can be derived, nor would one the user
    passes make the per-sample losses of the data loss; both refusals name the cause and the fix."""
    layer = nn.Linear(4, 4).double()
    x = torch.randn(B, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    outputs = layer(x)
    penalty = 1e-3 * sum(p.square().sum() for p in layer.parameters())
    loss = F.cross_entropy(outputs, CLASSES) + penalty
    with pytest.raises(ValueError, match=PENALTY):
        individual_losses_from_graph(loss)
    with pytest.raises(ValueError, match=r"Alpha needs info\['individual_losses'\] at step 0: cannot derive.*" + PENALTY):
        StepInfo({"loss": loss}, 0).require("individual_losses", "Alpha")
    data_only = F.cross_entropy(outputs, CLASSES, reduction="none")
    with pytest.raises(ValueError, match=r"reduce to neither the loss.*" + PENALTY):
        StepInfo({"loss": loss, "individual_losses": data_only}, 0).require("individual_losses", "Alpha")
    assert penalty_term(F.cross_entropy(outputs, CLASSES)) is None  # the fix: the data loss alone
    torch.testing.assert_close(StepInfo({"loss": F.cross_entropy(outputs, CLASSES)}, 0).require(
        "individual_losses", "Alpha"), data_only.detach())


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


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_bce_with_logits_keeps_its_weights(reduction):
    """ℓ_n from a BCE-with-logits loss with per-element weights and positive-class weights."""
    weight = 0.5 + torch.rand(B, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    pos_weight = torch.tensor([0.5, 2.0, 3.0, 1.5], dtype=torch.float64)
    make = lambda r: nn.BCEWithLogitsLoss(weight=weight, pos_weight=pos_weight, reduction=r)  # noqa: E731
    loss = make(reduction)(LOGITS, TARGETS.sigmoid())
    unreduced = make("none")(LOGITS, TARGETS.sigmoid()).detach()
    expected = B * unreduced.sum(1) / (unreduced.numel() if reduction == "mean" else 1)
    torch.testing.assert_close(individual_losses_from_graph(loss), expected)
    torch.testing.assert_close(individual_losses_from_graph(loss).mean(), loss.detach())


@pytest.mark.parametrize("ignore_index", [-100, -(2**63), 130], ids=["default", "int64 min", "large positive"])
def test_ignored_samples_have_zero_loss(ignore_index):
    """Negative ignore indices (saved as unsigned 64-bit integers) and positive ones; the mean is over
    the kept samples."""
    targets = CLASSES.clone()
    targets[[1, 4]] = ignore_index
    loss = nn.CrossEntropyLoss(ignore_index=ignore_index)(LOGITS, targets)
    kept = [n for n in range(B) if n not in (1, 4)]
    expected = torch.zeros(B, dtype=torch.float64)
    for n in kept:  # each kept sample's cross-entropy, one at a time
        expected[n] = B * -LOGITS[n].detach().log_softmax(0)[CLASSES[n]] / len(kept)
    torch.testing.assert_close(individual_losses_from_graph(loss), expected)


def test_user_given_losses_are_detached_by_default():
    given = nn.MSELoss(reduction="none")(LOGITS, TARGETS)
    losses = normalise_individual_losses(given, nn.MSELoss()(LOGITS, TARGETS))
    assert losses.grad_fn is None and not losses.requires_grad


T = 3


def token_losses():
    """Cross-entropy of B sequences of T tokens, flattened batch-major: ``[B·T]`` rows."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(B * T, 4, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 4, (B * T,), generator=g)
    return logits, targets


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_user_given_token_losses_are_grouped_per_sequence(reduction):
    logits, targets = token_losses()
    loss = nn.CrossEntropyLoss(reduction=reduction)(logits, targets)
    given = nn.CrossEntropyLoss(reduction="none")(logits, targets)
    expected = torch.stack([
        given[n * T:(n + 1) * T].mean() if reduction == "mean" else B * given[n * T:(n + 1) * T].sum()
        for n in range(B)
    ]).detach()
    torch.testing.assert_close(normalise_individual_losses(given, loss, batch_size=B), expected)
    info = StepInfo({"loss": loss, "individual_losses": given}, 0, batch_size=B)
    torch.testing.assert_close(info.require("individual_losses", "Alpha"), expected)
    torch.testing.assert_close(expected.mean(), loss.detach())
    with pytest.raises(ValueError, match="has 7 entries for a batch of 3"):
        normalise_individual_losses(torch.ones(7), None, batch_size=3)


@pytest.mark.parametrize("loss", [None, torch.tensor(float("nan"))], ids=["no loss", "nan loss"])
def test_without_a_finite_loss_the_mean_is_assumed(loss):
    given = torch.arange(2.0 * B, dtype=torch.float64).reshape(B, 2)
    torch.testing.assert_close(normalise_individual_losses(given, loss), given.mean(1))


def test_rounding_differences_are_tolerated():
    """The given losses reduce to the loss up to 1e-4 relative, 1e-6 absolute (float32 reductions differ)."""
    losses = 0.5 + torch.rand(B, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    off = 1 + 5e-5
    torch.testing.assert_close(normalise_individual_losses(losses, losses.mean() * off), losses)
    torch.testing.assert_close(normalise_individual_losses(losses, losses.sum() * off), B * losses)
    zeros = torch.zeros(B, dtype=torch.float64)
    torch.testing.assert_close(normalise_individual_losses(zeros, torch.tensor(5e-7, dtype=torch.float64)), zeros)
    with pytest.raises(ValueError, match="neither"):
        normalise_individual_losses(losses, losses.mean() * (1 + 1e-3))


def test_contains_and_get_see_the_given_keys_only():
    loss = nn.CrossEntropyLoss()(LOGITS, CLASSES)
    info = StepInfo({"loss": loss}, 0)
    info.require("individual_losses", "Alpha")  # derived, not given
    assert "loss" in info and "individual_losses" not in info
    assert info.get("loss") is loss and info.get("individual_losses", 5) == 5


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_contributions_from_given_losses_keep_their_graph(reduction):
    """c_n (Σ_n c_n = loss) from info['individual_losses'] with its graph: its gradient is the loss's."""
    loss = nn.MSELoss(reduction=reduction)(LOGITS, TARGETS)
    given = nn.MSELoss(reduction="none")(LOGITS, TARGETS)
    contributions = StepInfo({"loss": loss, "individual_losses": given}, 0).contributions("Quantity")
    expected = given.detach().sum(1) / (given.numel() if reduction == "mean" else 1)
    torch.testing.assert_close(contributions.detach(), expected)
    (from_contributions,) = torch.autograd.grad(contributions.sum(), LOGITS, retain_graph=True)
    (from_loss,) = torch.autograd.grad(loss, LOGITS)
    torch.testing.assert_close(from_contributions, from_loss)


def test_contributions_of_given_token_losses_are_grouped_per_sequence():
    logits, targets = token_losses()
    loss = nn.CrossEntropyLoss()(logits, targets)
    given = nn.CrossEntropyLoss(reduction="none")(logits, targets)
    contributions = StepInfo({"loss": loss, "individual_losses": given}, 0, batch_size=B).contributions("Quantity")
    expected = torch.stack([given[n * T:(n + 1) * T].sum() for n in range(B)]).detach() / (B * T)
    torch.testing.assert_close(contributions.detach(), expected)


def test_only_views_and_log_softmax_tell_the_flattened_batch():
    """A temperature after ``view(-1, C)`` hides the ``[3, 2, C]`` shape: without a batch size, rows are
    samples; with one, the rows of each sample are summed (derived losses and graph contributions)."""
    h = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 4, (6,), generator=torch.Generator().manual_seed(5))
    loss = nn.CrossEntropyLoss()(h.reshape(6, 4) * 2.0, targets)
    unreduced = nn.CrossEntropyLoss(reduction="none")(h.detach().reshape(6, 4) * 2.0, targets)
    torch.testing.assert_close(individual_losses_from_graph(loss), unreduced)  # ℓ_n = 6 · u_n / 6
    per_sequence = unreduced.reshape(3, 2).sum(1) / 6
    torch.testing.assert_close(individual_losses_from_graph(loss, batch_size=3), 3 * per_sequence)
    torch.testing.assert_close(StepInfo({"loss": loss}, 0, batch_size=3).require("individual_losses", "Alpha"), 3 * per_sequence)
    contributions = StepInfo({"loss": loss}, 0, batch_size=3).contributions("Quantity")
    torch.testing.assert_close(contributions.detach(), per_sequence)
    assert contributions.grad_fn is not None


def test_derived_losses_are_detached():
    loss = nn.CrossEntropyLoss()(LOGITS, CLASSES)
    assert not individual_losses_from_graph(loss).requires_grad
    assert not StepInfo({"loss": loss}, 0).require("individual_losses", "Alpha").requires_grad


def test_an_unreduced_loss_is_refused():
    """``reduction="none"`` on a batch of one is a one-element tensor, but not a mean or a sum."""
    loss = nn.CrossEntropyLoss(reduction="none")(LOGITS[:1], CLASSES[:1])
    with pytest.raises(ValueError, match="reduction 'mean' or 'sum'"):
        individual_losses_from_graph(loss)


def test_constant_factors_of_every_form():
    """``2 · loss``, ``tensor(3) · loss`` (the constant first), ``loss / tensor(4)``, and a hooked loss module
    whose output is scaled inside it; a loss times another loss or a vector is no constant factor."""
    base = nn.CrossEntropyLoss(reduction="none")(LOGITS, CLASSES).detach()
    ce = lambda: nn.CrossEntropyLoss()(LOGITS, CLASSES)  # noqa: E731

    class HalfCrossEntropy(nn.Module):
        def forward(self, inputs, targets):
            return nn.functional.cross_entropy(inputs, targets) * 0.5

    hooked = HalfCrossEntropy()
    hooked.register_full_backward_hook(lambda *args: None)
    for loss, factor in (
        (ce() * 2, 2.0),
        (torch.tensor(3.0, dtype=torch.float64) * ce(), 3.0),
        (ce() / torch.tensor(4.0, dtype=torch.float64), 0.25),
        ((torch.tensor(3.0, dtype=torch.float64) * ce()) / 4, 0.75),
        (hooked(LOGITS, CLASSES), 0.5),
    ):
        torch.testing.assert_close(individual_losses_from_graph(loss), base * factor)
    for loss in (ce() * ce(), ce() * torch.ones(3, dtype=torch.float64)):
        with pytest.raises(ValueError, match="MulBackward0"):
            individual_losses_from_graph(loss)


@pytest.mark.parametrize("value", [torch.ones(3), 0.5], ids=["vector", "float"])
def test_the_loss_must_be_a_scalar_tensor(value):
    with pytest.raises(ValueError, match=r"Alpha needs info\['loss'\] at step 2 as a scalar tensor"):
        StepInfo({"loss": value}, 2).require("loss", "Alpha")


def test_a_given_batch_size_groups_the_rows_of_each_sample():
    """info['batch_size'] (here a tensor) overrides the engine's count and groups the token rows."""
    h = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 4, (6,), generator=torch.Generator().manual_seed(7))
    loss = nn.CrossEntropyLoss()(h.reshape(6, 4) * 2.0, targets)
    unreduced = nn.CrossEntropyLoss(reduction="none")(h.detach().reshape(6, 4) * 2.0, targets)
    info = StepInfo({"loss": loss, "batch_size": torch.tensor(3)}, 0, batch_size=6)
    assert info.batch_size == 3 and type(info.batch_size) is int
    torch.testing.assert_close(info.require("individual_losses", "Alpha"), unreduced.reshape(3, 2).sum(1) / 2)
    assert StepInfo({"loss": loss}, 0, batch_size=6).batch_size == 6


def test_sequence_first_token_rows_are_grouped_along_the_batch_axis():
    """Logits ``[T, B, V]`` flattened time-major (PyTorch's word language model): with the batch size
    given, sample n's loss sums rows n, B + n, 2B + n, ... (they were grouped as if batch-major)."""
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(4, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 5, (12,), generator=g)
    loss = nn.functional.cross_entropy(logits.view(-1, 5), targets)
    unreduced = nn.functional.cross_entropy(logits.detach().view(-1, 5), targets, reduction="none")
    expected = torch.stack([unreduced.view(4, 3)[:, n].sum() for n in range(3)]) / 12
    torch.testing.assert_close(contributions_from_graph(loss, batch_size=3), expected)


def test_the_batch_size_is_read_from_the_graph_only_where_each_sample_has_one_row():
    """``batch_size_from_graph``: ``B`` for ``[B, C]`` logits and ``[B, k]`` regression outputs (also
    scaled, as ``loss / k``), ``None`` for token losses flattened from ``[B, T, V]`` (for a
    sequence-first model the first axis would be ``T``), a loss of its own kind and a detached loss."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4, generator=g, requires_grad=True)
    targets = torch.randint(0, 4, (6,), generator=g)
    assert batch_size_from_graph(nn.functional.cross_entropy(logits, targets)) == 6
    assert batch_size_from_graph(nn.functional.cross_entropy(logits, targets, reduction="sum") / 3) == 6
    outputs = torch.randn(5, 3, generator=g, requires_grad=True)
    assert batch_size_from_graph(nn.functional.mse_loss(outputs, torch.zeros(5, 3))) == 5
    tokens = torch.randn(6, 7, 4, generator=g, requires_grad=True)
    flattened = nn.functional.cross_entropy(tokens.view(-1, 4), torch.randint(0, 4, (42,), generator=g))
    assert batch_size_from_graph(flattened) is None
    assert batch_size_from_graph(outputs.pow(2).mean()) is None
    assert batch_size_from_graph(nn.functional.cross_entropy(logits, targets).detach()) is None
    freed = nn.functional.cross_entropy(logits * 2, targets)
    freed.backward()
    assert batch_size_from_graph(freed) is None
