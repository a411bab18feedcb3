"""The dependence machinery of the batch-independence and causal checks: a relative leak up to ``LEAK`` (1e-5),
the bound included, passes with the clean sentence; above it fails with the leaking one and the fix."""

import torch

from cockpit_lite import checks
from cockpit_lite.checks import dependence
from cockpit_lite.checks.problem import Problem


def test_a_result_states_the_leak_its_bound_and_the_fix_of_a_failure():
    clean = dependence.result("c", 1e-5, "outputs unchanged", ["BatchNorm1d (1) in eval mode"], "fix it")
    assert (clean.passed, clean.value, clean.threshold, clean.fix) == (True, 1e-5, "<= 1e-05", "")
    assert clean.message == "no dependence: outputs unchanged (BatchNorm1d (1) in eval mode)"
    leaking = dependence.result("c", 2e-5, "outputs move", [], "fix it")
    assert (leaking.passed, leaking.threshold, leaking.fix) == (False, "<= 1e-05", "fix it")
    assert leaking.message == "relative leak 2e-05: outputs move"


def test_a_backward_leak_on_the_bound_passes_in_the_clean_sentence(monkeypatch):
    problem = Problem(torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy,
                      (torch.randn(4, 3), torch.zeros(4, dtype=torch.long)))
    for leak, passed, sentence in [(1e-5, True, "no dependence: the inputs are clean"),
                                   (1.5e-5, False, "relative leak 1.5e-05: the inputs leak")]:
        monkeypatch.setattr(dependence, "backward_leak", lambda *args, leak=leak: leak)
        result = dependence.backward_check("c", problem, [], "{where} leak", "{where} are clean", "fix it")
        assert (result.passed, result.message) == (passed, sentence)


class _InputFree(torch.nn.Module):
    """Outputs that do not depend on the inputs (a learned constant per class)."""

    def __init__(self):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return self.logits.expand(len(x), 3)


def test_a_backward_check_without_any_gradient_at_the_inputs_is_skipped_naming_where():
    batch = (torch.randn(4, 3), torch.zeros(4, dtype=torch.long))
    result = checks.run(_InputFree(), torch.nn.functional.cross_entropy, batch,
                        checks=["batch_independence_backward"])["batch_independence_backward"]
    assert result.status == "skipped" and result.message == "no gradient reaches the inputs (see nonzero_gradients)"


class _SharedSum(torch.nn.Module):
    """One output per sample, ``out_n = Σ_i x_{n,i} + c Σ_{m,i} x_{m,i}``: its gradient is ``1 + c`` at the own
    sample's entries and ``c`` at every other's."""

    def __init__(self, c):
        super().__init__()
        self.c = c

    def forward(self, x):
        return x.sum(1, keepdim=True) + self.c * x.sum()


def test_the_backward_leak_is_the_largest_forbidden_gradient_over_the_largest_allowed():
    """A one-entry output's random projection scales both gradients alike: the leak is ``c / (1 + c)``
    exactly, whatever the draw (0.25 / 1.25 = 0.2)."""
    x = torch.randn(4, 3, dtype=torch.float64)
    problem = Problem(_SharedSum(0.25), torch.nn.functional.mse_loss, (x, torch.zeros(4, 1, dtype=torch.float64)))
    cases = [((i,), [j for j in range(4) if j != i], (i,)) for i in range(2)]
    assert abs(dependence.backward_leak(problem, problem.model, cases) - 0.2) < 1e-12
