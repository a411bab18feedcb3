"""``reinit_dead_relus``: a network with more than 70% dead units learns again after the re-init."""

import pytest
import torch
from check_cases import digits

from cockpit_lite import checks
from experiments import common


def _train(model, x, y, steps=60):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    return loss.item()


def _dead_net():
    torch.manual_seed(0)
    model = common.mlp([64, 64])
    with torch.no_grad():
        model[1].bias[:56] = -50.0  # 56 of 64 first-layer units (87%) and
        model[3].bias[:] = -50.0  # all 64 second-layer units never fire
    return model


def test_dead_units_are_revived_and_the_network_learns_again():
    (x, y), _ = digits()
    x, y = x[:256], y[:256]
    dead = _dead_net()
    stuck = _train(dead, x, y)
    revived = _dead_net()
    rng = torch.get_rng_state()
    count = checks.reinit_dead_relus(revived, x)
    assert torch.equal(rng, torch.get_rng_state())
    assert count >= 0.7 * 128
    assert stuck > 2.0  # only the output bias learns: about ln 10
    assert _train(revived, x, y) < 0.5 * stuck


def _fired(model, x):
    """Per hidden ReLU (after model[1] and model[3]): which of its units fire on some sample, by a plain forward."""
    with torch.no_grad():
        h1 = torch.relu(model[1](model[0](x)))
        h2 = torch.relu(model[3](h1))
    return [(h1 > 0).any(0), (h2 > 0).any(0)]


def test_only_dead_rows_change_to_kaiming_uniform_draws_and_the_count_is_of_revived_units():
    model = _dead_net()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    (x, _), _ = digits()
    dead = [~fired for fired in _fired(model, x[:256])]
    count = checks.reinit_dead_relus(model, x[:256])
    assert torch.equal(model[1].weight[56:], before["1.weight"][56:])
    assert torch.equal(model[5].weight, before["5.weight"])
    assert not torch.equal(model[1].weight[:56], before["1.weight"][:56])
    # U(-b, b), b = sqrt(6 / fan_in), fan_in 64: 56 x 64 draws fill the interval
    drawn = model[1].weight[dead[0]].abs()
    assert drawn.max() <= (6.0 / 64) ** 0.5 and drawn.max() > 0.95 * (6.0 / 64) ** 0.5
    assert torch.all(model[1].bias[dead[0]] == 0.0)
    revived = sum(int((was & now).sum()) for was, now in zip(dead, _fired(model, x[:256])))
    assert count == revived and 0 < revived < int(dead[0].sum() + dead[1].sum())


def _killed(layer, count):
    """``layer`` with its first ``count`` units given a bias of -50 (dead on any input of order 1)."""
    with torch.no_grad():
        layer.bias[:count] = -50.0
    return layer


@pytest.mark.parametrize("kind", ["conv", "sequence"])
def test_the_units_are_a_convolutions_channels_and_a_linear_layers_last_axis(kind):
    """Dead channels of a Conv2d (units along axis 1, every position) and dead features of a Linear applied to a
    sequence ``[B, T, C]`` (units along the last axis): exactly their rows are drawn anew."""
    torch.manual_seed(0)
    if kind == "conv":
        layer, x = _killed(torch.nn.Conv2d(3, 8, 3), 5), torch.randn(6, 3, 7, 7)
        model = torch.nn.Sequential(layer, torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 25, 2))
    else:
        layer, x = _killed(torch.nn.Linear(4, 8), 5), torch.randn(6, 7, 4)
        model = torch.nn.Sequential(layer, torch.nn.ReLU(), torch.nn.Linear(8, 2))
    before = layer.weight.detach().clone()
    checks.reinit_dead_relus(model, x)
    assert torch.equal(layer.weight[5:], before[5:]) and not (layer.weight[:5] == before[:5]).any()
    assert torch.all(layer.bias[:5] == 0.0)


def test_a_layer_of_one_dead_unit_is_drawn_anew():
    torch.manual_seed(0)
    model = torch.nn.Sequential(_killed(torch.nn.Linear(4, 1), 1), torch.nn.ReLU(), torch.nn.Linear(1, 2))
    assert checks.reinit_dead_relus(model, torch.randn(32, 4)) == 1


def test_a_float64_layer_gets_float64_draws_and_the_default_seed_is_0():
    """The new rows are drawn in the layer's dtype (float32 draws would all be float32 numbers), from a generator
    seeded with ``seed``: 0 by default."""
    weights = []
    for seed in ({}, {"seed": 0}, {"seed": 1}):
        torch.manual_seed(0)
        layer = _killed(torch.nn.Linear(4, 8).double(), 5)
        checks.reinit_dead_relus(torch.nn.Sequential(layer, torch.nn.ReLU()), torch.randn(6, 4, dtype=torch.float64),
                                 **seed)
        weights.append(layer.weight[:5].detach().clone())
    assert not torch.equal(weights[0].float().double(), weights[0])
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])
