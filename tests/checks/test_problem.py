"""``Problem``: the perturbation the dependence checks apply, by hand."""

import torch

from cockpit_lite.checks.problem import Problem


def test_perturbed_adds_noise_of_the_inputs_std_at_the_index_only():
    """Two entries 1 and 3: std sqrt(2) (unbiased); the noise is the next standard normal draw times it."""
    x = torch.tensor([[1.0], [3.0]])
    problem = Problem(torch.nn.Linear(1, 2), torch.nn.functional.cross_entropy, (x, torch.tensor([0, 1])))
    torch.manual_seed(0)
    out = problem.perturbed(x, (1,))
    torch.manual_seed(0)
    noise = torch.randn(1, 1)
    assert torch.equal(out[0], x[0])
    torch.testing.assert_close(out[1] - x[1], 2.0 ** 0.5 * noise[0], rtol=1e-6, atol=0)
