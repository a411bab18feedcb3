"""``cockpit_lite.utils.norms`` against float64 norms, and the quantities that use it on a large tensor."""

import math

import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit
from cockpit_lite.quantities import Distance, GradNorm, ParamNorm, UpdateSize
from cockpit_lite.utils.norms import CHUNK, EXACT, GATHER, dot, gathered, norms


def test_a_vector_of_every_parameter_of_a_gpt_2_sized_model():
    """1.3·10⁷ float32 elements: torch's own norm is off by about 5·10⁻⁴ relative on a CPU."""
    x = 1e-3 * torch.randn(13_000_003, generator=torch.Generator().manual_seed(0))
    exact = float(x.double().norm())
    (value,) = norms([x])
    assert value.dtype == torch.float32
    assert float(value) == pytest.approx(exact, rel=1e-7)


@pytest.mark.parametrize("size, rel", [(CHUNK + 1, 1.2e-7), (50_176, 1.2e-7), (EXACT, 1.2e-7), (EXACT + 1, 3e-6)])
def test_equal_entries_the_worst_case_of_a_float32_sum(size, rel):
    """Up to ``EXACT`` elements the norm is reduced in float64: the float32 result's rounding only (a float32
    sum of 50,176 equal squares is 2·10⁻⁶ off); above, rows of ``CHUNK`` elements: the bound the module gives."""
    for value in (0.1, 1.1, 2.1):
        x = torch.full((size,), value)
        (norm,) = norms([x])
        assert float(norm) == pytest.approx(value * math.sqrt(size), rel=rel)


def test_small_and_large_mixed_keep_their_order_and_dtypes():
    g = torch.Generator().manual_seed(1)
    tensors = [torch.randn(3, 4, generator=g), torch.randn(CHUNK + 7, generator=g, dtype=torch.float64),
               torch.randn(50, 200, generator=g).t(), torch.randn(CHUNK * 3, generator=g).bfloat16(),
               torch.randn(5, generator=g).bfloat16(), torch.zeros(0)]
    values = norms(tensors)
    assert [v.dtype for v in values] == [torch.float32, torch.float64, torch.float32, torch.float32,
                                         torch.float32, torch.float32]
    for t, v in zip(tensors, values):
        assert float(v) == pytest.approx(float(t.double().norm()), rel=1e-6, abs=1e-30)


def test_dot_of_a_gpt_2_sized_vector_and_of_mixed_tensors_matches_float64():
    """The dot product of 1.3·10⁷ float32 elements with a mean (torch's float32 ``dot`` is off by about
    5·10⁻⁴ there), and of several tensors of different sizes, shapes and dtypes taken as one vector."""
    g = torch.Generator().manual_seed(2)
    x = 1e-3 * (torch.randn(13_000_003, generator=g) + 1)
    y = 1e-3 * (torch.randn(13_000_003, generator=g) + 2)
    assert dot([x], [y]) == pytest.approx(float(x.double() @ y.double()), rel=1e-8)
    a = [torch.randn(3, 4, generator=g), torch.randn(CHUNK * 2 + 5, generator=g).bfloat16(),
         torch.randn(40, 300, generator=g, dtype=torch.float64).t()]
    b = [torch.randn(12, generator=g), torch.randn(CHUNK * 2 + 5, generator=g),
         torch.randn(300, 40, generator=g)]
    exact = sum(float(u.double().reshape(-1) @ v.double().reshape(-1)) for u, v in zip(a, b))
    assert dot(a, b) == pytest.approx(exact, rel=1e-7)
    assert dot([], []) == 0.0
    assert dot(t for t in a) == pytest.approx(sum(float(t.double().norm()) ** 2 for t in a), rel=1e-7)


def test_small_tensors_are_gathered_in_order_and_large_ones_stay_alone():
    tensors = [torch.full((3,), 1.0), torch.full((2, 2), 2.0), torch.full((GATHER + 1,), 3.0), torch.full((5,), 4.0)]
    pieces = list(gathered((t, 2 * t) for t in tensors))
    assert [p[0].tolist() for p in pieces[:1]] == [[1.0] * 3 + [2.0] * 4]
    assert [len(p[0]) for p in pieces] == [7, GATHER + 1, 5]
    torch.testing.assert_close(torch.cat([p[1] for p in pieces]), 2 * torch.cat([t.reshape(-1) for t in tensors]))
    assert [len(p[0]) for p in gathered([(torch.ones(4),)] * 5, size=8)] == [8, 8, 4]


def test_non_finite_values_propagate():
    big = torch.ones(CHUNK * 2)
    big[5] = float("nan")
    huge = torch.ones(CHUNK * 2)
    huge[-1] = float("inf")
    values = norms([big, huge, torch.tensor([float("nan")])])
    assert math.isnan(values[0]) and math.isinf(values[1]) and math.isnan(values[2])


def test_norm_quantities_of_a_large_embedding_match_float64():
    """GradNorm, ParamNorm, UpdateSize and Distance on a 4M-element embedding (float32): within 10⁻⁶
    of the float64 norms (torch's float32 norm of that size is off by about 7·10⁻⁵)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(4096, 1024), nn.Flatten(), nn.Linear(1024 * 4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    cp = Cockpit(model, [GradNorm(), ParamNorm(), UpdateSize(), Distance()], diagnose=False)
    initial = [p.detach().double().clone() for p in model.parameters()]
    x, y = torch.randint(0, 4096, (8, 4)), torch.randint(0, 3, (8,))
    records = []
    for step in range(2):
        before = [p.detach().double().clone() for p in model.parameters()]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        grads = [p.grad.double().norm() for p in model.parameters()]
        opt.step()
        records.append((before, grads, [p.detach().double().clone() for p in model.parameters()]))
    out = cp.get_output()
    before, grads, after = records[0]
    expected = {
        "GradNorm": grads,
        "ParamNorm": [p.norm() for p in before],
        "UpdateSize": [(a - b).norm() for a, b in zip(after, before)],
        "Distance": [(b - i).norm() for b, i in zip(records[1][0], initial)],
    }
    for name, values in expected.items():
        entry = out[1 if name == "Distance" else 0][name]
        for got, want in zip(entry, values):
            assert got == pytest.approx(float(want), rel=1e-6), name
