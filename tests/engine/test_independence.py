"""The probe of sample independence (``cockpit_lite/engine/independence.py``): code outside any layer
that mixes the samples (a contrastive loss, batch statistics in ``forward``) sends the layers before it
to the exact global path; individual gradients against a float64 brute force of the loss's terms (one
forward pass, one ``torch.autograd.grad`` per sample's term)."""

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cockpit_lite import Cockpit
from cockpit_lite.quantities import GradVariance

B, STEPS = 6, 2


class Encoder(nn.Module):
    """Two layers; ``mixing`` in between: ``"center"`` subtracts the batch mean, ``"batch_norm"`` is a
    functional batch normalisation (no module), ``None`` nothing."""

    def __init__(self, mixing=None, dropout=0.0):
        super().__init__()
        self.mixing = mixing
        self.a, self.b = nn.Linear(5, 7), nn.Linear(7, 4)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        h = self.a(x)
        if self.mixing == "center":
            h = h - h.mean(0, keepdim=True)
        elif self.mixing == "batch_norm":
            h = F.batch_norm(h, None, None, training=True)
        return self.b(self.drop(torch.tanh(h)))


class SequenceFirst(nn.Module):
    """A sequence-first ``[T, B, 5]`` tensor with ``T = B`` (the samples along axis 1) through two Linear
    layers, averaged over ``T``: the Linear rule reads its first axis of size B, here ``T``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 7), nn.Linear(7, 4)

    def forward(self, x):
        steps = torch.linspace(0.5, 1.5, len(x), dtype=x.dtype)
        return self.b(torch.tanh(self.a(torch.sin(steps[:, None, None] * x))).mean(0))


def _infonce_terms(model, x, y):
    """InfoNCE over the batch's pairs: sample n's term is the cross-entropy of row n of ``z1 z2ᵀ``."""
    z1 = F.normalize(model(x), dim=1)
    z2 = F.normalize(model(x + 0.1 * torch.sin(x)), dim=1)
    return F.cross_entropy(z1 @ z2.T / 0.5, torch.arange(len(x)), reduction="none") / len(x)


def _infonce(model, x, y):
    z1 = F.normalize(model(x), dim=1)
    z2 = F.normalize(model(x + 0.1 * torch.sin(x)), dim=1)
    return F.cross_entropy(z1 @ z2.T / 0.5, torch.arange(len(x)))


def _ce_terms(model, x, y):
    return F.cross_entropy(model(x), y, reduction="none") / len(x)


def _ce(model, x, y):
    return F.cross_entropy(model(x), y)


def _squares(model, x, y):
    """A loss cockpit-lite cannot split into samples' terms (a hand-written mean of squares)."""
    return ((model(x) - F.one_hot(y, 4)) ** 2).mean()


def _squares_terms(model, x, y):
    return ((model(x) - F.one_hot(y, 4)) ** 2).sum(1) / (4 * len(x))


def _batches(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, 5, generator=g, dtype=torch.float64), torch.randint(0, 4, (B,), generator=g))
            for _ in range(STEPS)]


def _brute_force_variances(model, terms, x, y):
    """Per parameter, Σ_elements var_n(B ∇c_n) (unbiased), from the terms of one forward pass."""
    params = list(model.parameters())
    c = terms(model, x, y)
    grads = [torch.autograd.grad(c[n], params, retain_graph=True) for n in range(B)]
    return [torch.stack([B * g[i] for g in grads]).reshape(B, -1).var(0).sum() for i in range(len(params))]


def _squares_given(model, x, y):
    """The same loss, with its samples' losses passed: ``(loss, info)``."""
    losses = ((model(x) - F.one_hot(y, 4)) ** 2).mean(1)
    return losses.mean(), {"individual_losses": losses}


def _run(model, loss, terms):
    """Train with a Cockpit; per step the recorded GradVariance, the brute force, and the warnings
    (``loss`` may return ``(loss, info)``)."""
    torch.manual_seed(0)
    model = model.double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, quantities=[GradVariance()], diagnose=False)
    got, expected = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, (x, y) in enumerate(_batches()):
            expected.append(_brute_force_variances(copy.deepcopy(model), terms, x, y))
            opt.zero_grad()
            value = loss(model, x, y)
            value, given = value if isinstance(value, tuple) else (value, {})
            with cp(step, info={"loss": value, **given}):
                value.backward()
            opt.step()
            got.append(cp.get_output()[step]["GradVariance"])
    return got, expected, [str(w.message) for w in caught if "cockpit-lite" in str(w.message)]


def _assert_brute_force(got, expected):
    """The recorded values against the brute force's; a bias that centering hides from the loss (zero in
    exact arithmetic, rounding noise in both) is NaN."""
    for values, reference in zip(got, expected):
        values, reference = torch.tensor(values, dtype=torch.float64), torch.stack(reference)
        zero = reference < 1e-20
        assert values[zero].isnan().all(), (values, reference)
        torch.testing.assert_close(values[~zero], reference[~zero], rtol=1e-6, atol=1e-12)


CASES = {
    "infonce": (lambda: Encoder(), _infonce, _infonce_terms),
    "center": (lambda: Encoder("center"), _ce, _ce_terms),
    "batch_norm": (lambda: Encoder("batch_norm"), _ce, _ce_terms),
    "sequence_first": (SequenceFirst, _ce, _ce_terms),
}


@pytest.mark.parametrize("case", CASES)
def test_mixed_samples_match_brute_force(case):
    """Before the probe these were silently wrong by up to 8x (InfoNCE) and 2x (centering), with no
    flag: the layers' individual gradients still summed to autograd's gradient. A sequence-first input
    with T = B was too while the probe took the best of the axes of size B instead of the one the rule
    reads."""
    build, loss, terms = CASES[case]
    got, expected, messages = _run(build(), loss, terms)
    _assert_brute_force(got, expected)
    mixed = [m for m in messages if "depend on other samples' outputs" in m]
    assert len(mixed) == 1 and "outputs of a" in mixed[0], messages


def test_a_loss_without_terms_finds_mixing_inside_the_model_and_names_the_fix():
    """A hand-written loss has no terms to probe from: the model's own output stands in for it, the
    mixing inside the model is found, and the global path, which needs the terms, asks for them; the
    fix it names (info['individual_losses']) gives the brute force's values."""
    got, _, messages = _run(Encoder("center"), _squares, _squares_terms)
    assert all(v != v for v in got[0][:2]), got  # a's weight and bias: NaN
    assert any("info['individual_losses']" in m for m in messages), messages
    _assert_brute_force(*_run(Encoder("center"), _squares_given, _squares_terms)[:2])


@pytest.mark.parametrize("build", [lambda: Encoder(), lambda: nn.Sequential(nn.Linear(5, 6), nn.LayerNorm(6), nn.Linear(6, 4))])
def test_independent_samples_keep_the_layer_rules(build):
    got, expected, messages = _run(build(), _ce, _ce_terms)
    assert not messages
    _assert_brute_force(got, expected)


@pytest.mark.parametrize("mixing", [None, "center"])
def test_the_probe_runs_once_per_plan_and_leaves_training_as_it_was(mixing):
    """The parameters after the steps equal those of training without the Cockpit, bit for bit (dropout
    draws included); on independent samples the probe's two backward passes through the layers come at
    the first tracked step only."""
    def train(with_cockpit):
        torch.manual_seed(0)
        model = Encoder(mixing, dropout=0.3).double()
        passes = []

        def count(module, args, out):
            out.register_hook(lambda g: passes.append(1))

        model.a.register_forward_hook(count)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cp = Cockpit(model, quantities=[GradVariance()], diagnose=False) if with_cockpit else None
        counts = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for step, (x, y) in enumerate(_batches() * 2):
                opt.zero_grad()
                loss = _ce(model, x, y)
                before = len(passes)
                if cp is None:
                    loss.backward()
                else:
                    with cp(step, info={"loss": loss}):
                        loss.backward()
                counts.append(len(passes) - before)
                opt.step()
        return [p.detach().clone() for p in model.parameters()], counts

    plain, _ = train(False)
    observed, counts = train(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, observed))
    if mixing is None:
        assert counts == [3, 1, 1, 1]  # the probe's two products and the user's backward, then the user's alone


def test_rows_are_compared_with_their_weights_along_an_axis_of_the_batch_size():
    """Hand-made products: rows scaled by their weights (along axis 1 here) are independent; one row
    that holds 1e-4 of another's is mixed at float64's tolerance; a row of zeros is compared against the
    largest row's scale (``FLOOR``), so its rounding noise is not mixing."""
    from cockpit_lite.engine.independence import _mixes

    g = torch.Generator().manual_seed(0)
    weights = torch.tensor([0.6, 1.3, 0.9, 1.1], dtype=torch.float64)
    ones = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    ones[:, 2] = 0.0
    weighted = weights.reshape(1, 4, 1) * ones
    assert not _mixes(ones, weighted, weights, 1e-6, 1)
    noisy = weighted.clone()
    noisy[:, 2] = 1e-12  # below FLOOR (1e-3) of the largest row, times the tolerance
    assert not _mixes(ones, noisy, weights, 1e-6, 1)
    mixed = weighted.clone()
    mixed[:, 0] += 1e-4 * ones[:, 1]
    assert _mixes(ones, mixed, weights, 1e-6, 1) and not _mixes(ones, mixed, weights, 1e-3, 1)


def test_a_step_with_a_nonfinite_loss_is_probed_again_at_the_next():
    """The first tracked step's batch holds a NaN: its products tell nothing, so the next step of the same
    plan is probed, finds the centring, and matches the brute force."""
    torch.manual_seed(0)
    model = Encoder("center").double()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # (the NaN gradient must not reach the weights)
    cp = Cockpit(model, quantities=[GradVariance()], diagnose=False)
    (x0, y0), (x1, y1) = _batches()
    x0 = x0.clone()
    x0[2, 1] = float("nan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, (x, y) in enumerate([(x0, y0), (x1, y1)]):
            if step == 1:
                expected = _brute_force_variances(copy.deepcopy(model), _ce_terms, x, y)
            opt.zero_grad()
            loss = _ce(model, x, y)
            with cp(step, info={"loss": loss}):
                loss.backward()
    assert sum("depend on other samples' outputs of a" in str(w.message) for w in caught) == 1
    _assert_brute_force([cp.get_output()[1]["GradVariance"]], [expected])


def test_accumulated_micro_batches_of_a_contrastive_loss_match_brute_force():
    """``accumulate=True``, two micro-batches of InfoNCE (each its own pairs), ``loss / 2`` each: the
    statistics of the effective batch of 2B samples, against the brute force of both micro-batches' terms."""
    torch.manual_seed(0)
    model = Encoder().double()
    (x0, _), (x1, _) = _batches()
    reference = copy.deepcopy(model)
    rows = []
    for x in (x0, x1):
        c = _infonce_terms(reference, x, None) / 2
        rows += [[2 * B * g for g in torch.autograd.grad(c[n], list(reference.parameters()), retain_graph=True)]
                 for n in range(B)]
    expected = [torch.stack(parts).reshape(2 * B, -1).var(0).sum() for parts in zip(*rows)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, quantities=[GradVariance()], diagnose=False, accumulate=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x in (x0, x1):
            loss = _infonce(model, x, None) / 2
            with cp(0, info={"loss": loss, "optimizer": opt}):
                loss.backward()
        opt.step()
    _assert_brute_force([cp.get_output()[0]["GradVariance"]], [expected])


def test_departure_is_the_largest_row_s_relative_difference():
    from cockpit_lite.engine.independence import departure

    g = torch.Generator().manual_seed(0)
    weights = torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64)
    ones = torch.randn(3, 4, generator=g, dtype=torch.float64)
    weighted = weights[:, None] * ones
    assert departure(ones, weighted, weights, 0) == 0.0
    weighted[1] += 1e-3 * ones[1]  # row 1 off by 1e-3 of its own (weight-1) size
    assert math.isclose(departure(ones, weighted, weights, 0), 1e-3, rel_tol=1e-9)
    assert departure(torch.ones(2, 4), torch.ones(2, 4), weights, 0) == float("inf")
