"""``gradient_check``: names the parameter upstream of a wrong backward; kinks and BatchNorm pass."""

from check_cases import BROKEN, CASES

from cockpit_lite import checks


def _result(case):
    return checks.run(case.model, case.loss_fn, case.batch, **case.options,
                      checks=["gradient_check"])["gradient_check"]


def test_wrong_custom_backward_names_the_parameter():
    result = _result(BROKEN["wrong_backward"]())
    assert result.passed is False and result.message.startswith("`1.")  # the layer before the custom ReLU


def test_relu_maxpool_batchnorm_and_attention_agree():
    for name in ("bn_cnn", "causal_transformer", "lstm_classifier"):
        result = _result(CASES[name]())
        assert result.passed and result.value < 1e-5, result.message
        assert "parameter tensors agree (largest error" in result.message


class _DetachedBranch(__import__("torch").nn.Module):
    """Every parameter gets a gradient, yet ``body``'s features reach the head's second input detached:
    the check must see the dependence autograd drops."""

    def __init__(self):
        from torch import nn

        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Tanh())
        self.head = nn.Linear(32, 10)
        self.gate = nn.Linear(32, 10)

    def forward(self, x):
        h = self.body(x)
        return self.head(h) * self.gate(h.detach()).sigmoid()  # BUG: .detach() on one of the two uses


def _digits_batch():
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images[:32], dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.tensor(digits.target[:32])


def test_a_detach_inside_forward_fails():
    import torch

    torch.manual_seed(0)
    result = checks.run(_DetachedBranch(), torch.nn.functional.cross_entropy, _digits_batch(),
                        checks=["gradient_check"])["gradient_check"]
    assert result.passed is False and result.message.startswith("`body.1."), result.message


def test_a_detached_layer_without_any_gradient_fails_and_says_the_graph_is_cut():
    result = _result(BROKEN["detached_layer"]())
    assert result.passed is False and "no gradient" in result.message and "detach" in result.fix


def test_frozen_parameters_are_not_checked():
    result = _result(CASES["frozen_mlp"]()) if "frozen_mlp" in CASES else _result(BROKEN["frozen_layer"]())
    assert result.passed, result.message


class _NonContiguousFirst(__import__("torch").nn.Module):
    """A non-contiguous parameter first (not checked: perturbing ``view(-1)`` needs contiguous memory), then a
    layer whose output is detached: its parameters get no gradient although the loss depends on them."""

    def __init__(self):
        import torch

        super().__init__()
        self.first = torch.nn.Parameter(0.1 * torch.randn(10, 64).t())
        self.cut = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = x.flatten(1)
        return x @ self.first + self.cut(x).detach() ** 2


def test_the_parameters_after_a_non_contiguous_one_are_checked():
    import torch

    torch.manual_seed(0)
    result = checks.run(_NonContiguousFirst(), torch.nn.functional.cross_entropy, _digits_batch(),
                        checks=["gradient_check"])["gradient_check"]
    assert result.passed is False and "autograd gives `cut." in result.message, result.message
