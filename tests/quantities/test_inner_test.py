"""InnerTest against a brute-force float64 reference."""

import pytest
import torch

import problems
from cockpit_lite.quantities import InnerTest


def inner_test(individual):
    """sqrt(Var̂_n(g_nᵀg) / (B ‖g‖⁴)) of flattened individual gradients [B, D]."""
    b = individual.shape[0]
    g = individual.mean(0)
    projections = individual @ g
    return torch.sqrt(projections.var(unbiased=True) / (b * (g @ g) ** 2))


def reference(problem, snapshots, step):
    grads = problems.individual_gradients(problem, snapshots[step])
    flat = [gr.reshape(gr.shape[0], -1) for gr in grads]
    return inner_test(torch.cat(flat, 1)), [inner_test(f) for f in flat]


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(InnerTest(), reference, case)


def test_a_spread_lost_in_rounding_is_nan_and_flagged():
    """float32 individual gradients of the last bias nearly the same in every sample (targets 10⁷
    away, as in tests/quantities/test_mean_gsnr.py, where GradVariance flags the same bias): the
    rounding of the projections g̃_nᵀg in float32 exceeds their spread (it came out 7.5e-9,
    unflagged; 10⁵ away they still resolve it, 1.684e-7 against 1.687e-7); the float64 brute force
    of the same float32 gradients is tiny but not 0 (2.3e-9). The last bias is NaN with one flag
    naming it; the other layers and the total keep their values."""
    problems.assert_lost_spread_flagged(InnerTest(), inner_test, offset=1e7)


class _TwoWeights(torch.nn.Module):
    """``y = a x₀ + c x₁``, each weight its own layer, both zero."""

    def __init__(self):
        super().__init__()
        self.large, self.small = torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.large.weight.zero_(), self.small.weight.zero_()

    def forward(self, inputs):
        return self.large(inputs[:, :1]) + self.small(inputs[:, 1:])


def test_each_parameters_rounding_level_is_its_own():
    """Two weights of a float32 linear regression whose projections differ by 10⁶ (inputs 10³ and 1, the
    residuals the same to 10⁻⁴ in every sample): the small weight's spread, 10⁻⁴ of its projections, is far
    above the rounding of float32, so it is resolved against the brute force; judged by the rounding level of
    the large weight's projections (the whole tensor's norm) it would be NaN."""
    from cockpit_lite import Cockpit

    b = 8
    x = torch.stack([torch.full((b,), 1e3), torch.ones(b)], 1)
    y = 5.0 + 1e-4 * torch.randn(b, generator=torch.Generator().manual_seed(0))
    model = _TwoWeights()
    cp = Cockpit(model, [InnerTest()], diagnose=False)
    loss = ((model(x)[:, 0] - y) ** 2).mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    entry = cp.get_output()[0]
    residuals = -y.double()  # the weights are zero
    individual = [2 * residuals[:, None] * x[:, i:i + 1].double() for i in range(2)]  # g̃_n = B ∇(r_n² / B)
    assert "flags" not in entry, entry.get("flags")
    problems.assert_close(entry["layers"]["InnerTest"], [inner_test(f) for f in individual], rtol=1e-2,
                          what="InnerTest, own rounding levels")


@pytest.mark.parametrize("ulps, lost", [(2, True), (3, False)])
def test_the_spread_against_its_rounding_level_is_sqrt_b_minus_1_times_the_variance(ulps, lost):
    """One float32 weight, zero, two samples with input 1 and targets 4 ∓ d (d = 2 or 3 ulps of 4, 2⁻²¹ each):
    g̃_n = −2 y_n and g = −8 exactly, so the projections are 64 ± 16 d exactly. Their spread
    √((B − 1) Var̂) = 16 √2 d against the rounding level 2 (u + √(D + B) u) ‖p‖ (u = 2⁻²⁴, D = 1, B = 2,
    ‖p‖ = 64 √2): 0.73 of the level at 2 ulps (lost: NaN, flagged for the weight and the whole network), 1.10 at 3
    (resolved, the brute force's value). √((B + 1) Var̂) would be 1.27 of the level at 2 ulps."""
    from cockpit_lite import Cockpit

    d = ulps * 2.0**-21
    u = 2.0**-24
    ratio = 16 * 2**0.5 * d / (2 * (u + 3**0.5 * u) * 64 * 2**0.5)
    assert (ratio < 1 < 3**0.5 * ratio) if lost else ratio > 1
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    x, y = torch.ones(2, 1), torch.tensor([4.0 - d, 4.0 + d])
    assert y.tolist() == [4.0 - d, 4.0 + d]  # exact in float32
    cp = Cockpit(model, [InnerTest()], diagnose=False)
    loss = ((model(x)[:, 0] - y) ** 2).mean()
    with cp(0, info={"loss": loss}):
        loss.backward()
    entry = cp.get_output()[0]
    value, (layer,) = entry["InnerTest"], entry["layers"]["InnerTest"]
    if lost:
        assert value != value and layer != layer
        assert len(entry["flags"]) == 2 and all("is lost in the rounding" in f for f in entry["flags"]), entry["flags"]
    else:
        expected = inner_test(-2 * y.double()[:, None])
        assert "flags" not in entry, entry["flags"]
        problems.assert_close([value, layer], [expected, expected], rtol=1e-6, what="InnerTest at 3 ulps")
