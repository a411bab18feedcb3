"""``nonzero_gradients``: names the parameters without a gradient; the optimizer says what is trainable."""

import torch
from check_cases import BROKEN, CASES

from cockpit_lite import checks


def _result(case, **options):
    return checks.run(case.model, case.loss_fn, case.batch, **{**case.options, **options},
                      checks=["nonzero_gradients"])["nonzero_gradients"]


def test_detached_layer_is_named():
    result = _result(BROKEN["detached_layer"]())
    assert result.value == 2 and "no gradient (None): body.1.weight, body.1.bias" in result.message
    assert ".detach()" in result.fix and "torch.no_grad()" in result.fix


def test_frozen_parameters_fail_unless_left_out_of_the_optimizer():
    case = BROKEN["frozen_layer"]()
    assert "frozen (requires_grad=False): 1.weight, 1.bias" in _result(case).message
    everything = torch.optim.SGD(case.model.parameters(), lr=0.1)
    assert _result(case, optimizer=everything).passed is False
    trained = torch.optim.SGD([p for p in case.model.parameters() if p.requires_grad], lr=0.1)
    assert _result(case, optimizer=trained).passed


def test_zero_gradient_of_dead_units():
    case = CASES["digits_mlp"]()
    with torch.no_grad():
        case.model[1].bias.fill_(-100.0)
    result = _result(case)
    assert result.passed is False and "zero gradient: 1.weight, 1.bias" in result.message
