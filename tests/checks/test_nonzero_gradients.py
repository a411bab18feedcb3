"""``nonzero_gradients``: names the parameters without a gradient; the optimizer says what is trainable."""

import pytest
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


class _BiLSTMReadLast(torch.nn.Module):
    """A bidirectional LSTM classifier that reads ``out[:, -1]`` (a common mistake); ``first``: the
    reverse half read at the first position instead (the fix the check names)."""

    def __init__(self, first=False):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 4, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(8, 3)
        self.first = first

    def forward(self, x):
        out, _ = self.lstm(x)
        if self.first:
            return self.head(torch.cat([out[:, -1, :4], out[:, 0, 4:]], 1))
        return self.head(out[:, -1])


def test_a_bidirectional_rnn_read_at_its_last_position_is_named_with_the_fix():
    """Its reverse direction starts at the last position from a zero state: ``weight_hh_l0_reverse`` gets an
    exactly zero gradient (a finding, as before), and the fix now names the readout; reading the reverse half
    at the first position, as it says, passes."""
    torch.manual_seed(0)
    batch = (torch.randn(16, 5, 3), torch.randint(0, 3, (16,)))
    result = checks.run(_BiLSTMReadLast(), torch.nn.functional.cross_entropy, batch,
                        checks=["nonzero_gradients"])["nonzero_gradients"]
    assert result.passed is False and "zero gradient: lstm.weight_hh_l0_reverse" in result.message
    assert result.fix.startswith("lstm.weight_hh_l0_reverse: a bidirectional RNN whose output is read at the last")
    assert "out[:, 0, hidden:]" in result.fix
    fixed = checks.run(_BiLSTMReadLast(first=True), torch.nn.functional.cross_entropy, batch,
                       checks=["nonzero_gradients"])["nonzero_gradients"]
    assert fixed.passed, fixed.message


class _ZeroInitResidual(torch.nn.Module):
    """A residual block whose last BatchNorm starts at zero (timm's ResNets), then a head; ``detached``: the
    head also reads a detached copy of the stem through a layer of its own (a real missing gradient)."""

    def __init__(self, detached=False):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU())
        self.branch = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4))
        torch.nn.init.zeros_(self.branch[1].weight)
        self.side = torch.nn.Linear(4, 10) if detached else None
        self.head = torch.nn.Linear(4, 10)

    def forward(self, x):
        h = self.stem(x)
        pooled = (h + self.branch(h)).relu().mean((2, 3))
        out = self.head(pooled)
        return out if self.side is None else out + self.side(pooled).detach()


def test_a_branch_behind_a_zero_initialised_scale_is_no_failure():
    """The branch's conv and the BatchNorm's bias get an exactly zero gradient until the zero scale moves:
    a failure before (timm's ResNet-18: 32 of 62 tensors, with the detach/dead-ReLU fix). Now a pass naming
    the scale; a real detached layer beside it still fails, alone."""
    case = CASES["digits_mlp"]()
    batch = (case.batch[0].reshape(-1, 1, 8, 8), case.batch[1])
    torch.manual_seed(0)
    result = checks.run(_ZeroInitResidual(), torch.nn.functional.cross_entropy, batch,
                        checks=["nonzero_gradients"])["nonzero_gradients"]
    assert result.passed, result.message
    assert "get a gradient, 2 of them only once the exactly zero branch.1.weight, branch.1.bias move" in result.message
    torch.manual_seed(0)
    broken = checks.run(_ZeroInitResidual(detached=True), torch.nn.functional.cross_entropy, batch,
                        checks=["nonzero_gradients"])["nonzero_gradients"]
    assert broken.passed is False and broken.message.startswith(
        "2 of 10 parameter tensors: no gradient (None): side.weight, side.bias; 2 more get one only once"), broken.message


class _Nested(torch.nn.Module):
    """``_BiLSTMReadLast`` one level down (``body.lstm``), beside a tensor named like a reverse weight that the loss
    never reaches (``gate_reverse``, of the model itself)."""

    def __init__(self):
        super().__init__()
        self.body = _BiLSTMReadLast()
        self.gate_reverse = torch.nn.Parameter(torch.ones(2))

    def forward(self, x):
        return self.body(x)


class _BiLSTMReadFirst(_BiLSTMReadLast):
    """Both halves read at the first position: the forward direction's recurrent weights get no gradient."""

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, 0])


def test_the_readout_fix_names_only_the_reverse_recurrent_weights_of_a_bidirectional_rnn():
    """Found under a nested name; a tensor of another module whose name ends in ``_reverse``, and the forward
    direction's ``weight_hh_l0`` (zero when the output is read at the first position), are not among them."""
    torch.manual_seed(0)
    batch = (torch.randn(16, 5, 3), torch.randint(0, 3, (16,)))
    nested = checks.run(_Nested(), torch.nn.functional.cross_entropy, batch,
                        checks=["nonzero_gradients"])["nonzero_gradients"]
    assert "gate_reverse" in nested.message and "body.lstm.weight_hh_l0_reverse" in nested.message
    assert nested.fix.startswith("body.lstm.weight_hh_l0_reverse: a bidirectional RNN"), nested.fix
    first = checks.run(_BiLSTMReadFirst(), torch.nn.functional.cross_entropy, batch,
                       checks=["nonzero_gradients"])["nonzero_gradients"]
    assert first.passed is False and "zero gradient: lstm.weight_hh_l0" in first.message, first.message
    assert first.fix.startswith("look between these parameters and the loss"), first.fix


def test_a_model_without_parameters_is_skipped():
    result = checks.run(torch.nn.Identity(), torch.nn.functional.mse_loss, (torch.randn(4, 3), torch.randn(4, 3)),
                        task="regression", checks=["nonzero_gradients"])["nonzero_gradients"]
    assert (result.name, result.status, result.message) == ("nonzero_gradients", "skipped", "the model has no parameters")


class _Root(torch.nn.Module):
    """``√w · x`` with ``w`` starting at (0, 1, 1): the gradient of its first entry is infinite."""

    def __init__(self):
        super().__init__()
        self.w, self.head = torch.nn.Parameter(torch.tensor([0.0, 1.0, 1.0])), torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.w.sqrt() * x)


def test_a_pass_reports_0_of_all_tensors_and_a_non_finite_gradient_is_named():
    passed = _result(CASES["regression_mlp"]())
    assert (passed.passed, passed.value, passed.threshold) == (True, 0, "== 0")
    assert passed.message == f"all {len(list(CASES['regression_mlp']().model.parameters()))} parameter tensors get a gradient"
    batch = (torch.randn(4, 3), torch.randint(0, 2, (4,)))
    infinite = checks.run(_Root(), torch.nn.functional.cross_entropy, batch,
                          checks=["nonzero_gradients"])["nonzero_gradients"]
    assert (infinite.passed, infinite.value, infinite.threshold) == (False, 1, "== 0")
    assert infinite.message == "1 of 3 parameter tensors: non-finite gradient: w"


class _ManyGates(_ZeroInitResidual):
    """``_ZeroInitResidual`` with more exactly zero tensors (the stem's bias and the branch conv's bias, before the
    branch's BatchNorm scale in the parameters' order) and, with ``dead``, a layer of dead ReLUs added to the output:
    a gradient that stays zero whatever the scales are."""

    def __init__(self, zeros, dead=False):
        super().__init__()
        with torch.no_grad():
            for name in zeros:
                self.get_parameter(name).zero_()
        self.dead = torch.nn.Linear(64, 10) if dead else None
        if dead:
            torch.nn.init.constant_(self.dead.bias, -100.0)

    def forward(self, x):
        out = super().forward(x)
        return out if self.dead is None else out + torch.relu(self.dead(x.flatten(1))).sum(1, keepdim=True)


@pytest.mark.parametrize("zeros, named", [
    (["branch.0.bias"], "branch.1.weight, branch.0.bias, branch.1.bias"),
    (["stem.0.bias", "branch.0.bias"], "branch.1.weight, stem.0.bias, branch.0.bias and 1 more"),
])
def test_zero_scales_are_named_weights_first_three_at_most(zeros, named):
    case = CASES["digits_mlp"]()
    batch = (case.batch[0].reshape(-1, 1, 8, 8), case.batch[1])
    torch.manual_seed(0)
    result = checks.run(_ManyGates(zeros), torch.nn.functional.cross_entropy, batch,
                        checks=["nonzero_gradients"])["nonzero_gradients"]
    assert result.passed and f"only once the exactly zero {named} move" in result.message, result.message


def test_a_gradient_that_stays_zero_once_the_scales_move_is_still_a_failure():
    case = CASES["digits_mlp"]()
    batch = (case.batch[0].reshape(-1, 1, 8, 8), case.batch[1])
    torch.manual_seed(0)
    result = checks.run(_ManyGates([], dead=True), torch.nn.functional.cross_entropy, batch,
                        checks=["nonzero_gradients"])["nonzero_gradients"]
    assert result.passed is False and result.message.startswith("2 of 10 parameter tensors: zero gradient: dead.weight, "
                                                                "dead.bias; 2 more get one only once"), result.message
