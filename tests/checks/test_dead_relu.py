"""``reinit_dead_relus``: a network with more than 70% dead units learns again after the re-init."""

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


def test_only_dead_rows_change():
    model = _dead_net()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    (x, _), _ = digits()
    checks.reinit_dead_relus(model, x[:256])
    assert torch.equal(model[1].weight[56:], before["1.weight"][56:])
    assert torch.equal(model[5].weight, before["5.weight"])
    assert not torch.equal(model[1].weight[:56], before["1.weight"][:56])
