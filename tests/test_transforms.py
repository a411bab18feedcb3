"""Per-sample primitives: the factored (ghost) forms against explicit individual gradients."""

import pytest
import torch

from cockpit_lite import transforms

B, O, I = 5, 3, 4


def factored_and_explicit(positions, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(B, positions, I, generator=g, dtype=torch.float64)
    delta = torch.randn(B, positions, O, generator=g, dtype=torch.float64)
    param = torch.zeros(O, I, dtype=torch.float64)
    explicit = torch.stack([sum(torch.outer(delta[n, l], a[n, l]) for l in range(positions)) for n in range(B)])
    return (
        transforms.PerSample(param, 0, factors=(a, delta)),
        transforms.PerSample(param, 0, grad_batch=explicit),
        explicit.reshape(B, -1),
    )


@pytest.mark.parametrize("positions", [1, 7])
def test_factored_primitives_equal_explicit_individual_gradients(positions):
    factored, materialised, flat = factored_and_explicit(positions)
    vector = torch.randn(O * I, dtype=torch.float64)
    for per_sample in (factored, materialised):
        torch.testing.assert_close(per_sample.grad, flat.sum(0))
        torch.testing.assert_close(per_sample.dots(vector), flat @ vector)
        torch.testing.assert_close(per_sample.squared_norms(), (flat**2).sum(1))
        torch.testing.assert_close(per_sample.sum_of_squares(), (flat**2).sum(0))
    torch.testing.assert_close(factored.grad_batch.reshape(B, -1), flat)


def test_transforms_scale_contributions_to_individual_gradients():
    """g̃_n = B · grad_batch[n]."""
    _, per_sample, flat = factored_and_explicit(2)
    individual = B * flat
    g = individual.mean(0)
    torch.testing.assert_close(transforms.BatchL2()(per_sample), (individual**2).sum(1))
    torch.testing.assert_close(transforms.BatchDotGrad()(per_sample), individual @ g)
    torch.testing.assert_close(transforms.SumGradSquared()(per_sample).reshape(-1), (individual**2).sum(0))
    direction = torch.randn(O * I, dtype=torch.float64)
    dot = transforms.BatchDotDirection("d", lambda ps: direction)
    torch.testing.assert_close(dot(per_sample), individual @ direction)


def test_histograms_run_after_the_cheap_transforms():
    factored, _, _ = factored_and_explicit(1)
    order = []

    class Spy(transforms.GradHistogram1d):
        def __call__(self, per_sample):
            order.append(("hist", "grad_batch" in vars(per_sample)))
            return super().__call__(per_sample)

    class Norms(transforms.BatchL2):
        def __call__(self, per_sample):
            order.append(("norms", "grad_batch" in vars(per_sample)))
            return super().__call__(per_sample)

    transforms.run([Spy(10, (-1, 1)), Norms()], factored)
    assert order == [("norms", False), ("hist", False)]


def test_batched_histograms_equal_one_call_per_parameter(monkeypatch):
    """Small parameters wait in the batch; their values equal the direct calls once it computes."""
    monkeypatch.setattr(transforms, "BATCH_FLUSH_ELEMENTS", 3 * B * O * I)
    hist = transforms.GradHistogram1d(20, (-1, 1))
    batch = transforms.Batch()
    explicit, results = [], []
    for seed in range(7):
        _, per_sample, _ = factored_and_explicit(1, seed=seed)
        results.append(transforms.run([hist, transforms.BatchL2()], per_sample, batch))
        explicit.append(per_sample)
        assert transforms.BatchL2.key in results[-1]
        assert (hist.key in results[-1]) == (seed % 3 == 2)  # full after every third parameter
    batch.flush()
    for per_sample, result in zip(explicit, results):
        for value, expected in zip(result[hist.key], hist(per_sample)):
            torch.testing.assert_close(value, expected, rtol=0, atol=0)


def test_large_parameters_skip_the_batch(monkeypatch):
    monkeypatch.setattr(transforms, "BATCH_ELEMENTS", B * O * I - 1)
    _, per_sample, _ = factored_and_explicit(1)
    hist = transforms.GradHistogram1d(20, (-1, 1))
    assert hist.key in transforms.run([hist], per_sample, transforms.Batch())


@pytest.mark.parametrize("range_", [(-1, 1), (0.25, 1)], ids=["zero inside", "zero clipped"])
def test_histogram_leaves_out_zero_rows_exactly(range_):
    """Rows of switched-off units are counted as zeros without being built; 0 · ∞ still counts as NaN."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(B, 1, I, generator=g, dtype=torch.float64)
    a[1, 0, 2] = float("inf")  # sample 1: all its rows must be built
    delta = torch.randn(B, 1, O, generator=g, dtype=torch.float64)
    delta[delta < 0.3] = 0.0
    param = torch.zeros(O, I, dtype=torch.float64)
    factored = transforms.PerSample(param, 0, factors=(a, delta))
    explicit = torch.einsum("nlo,nli->noi", delta, a)
    left_out = int((delta[[0, 2, 3, 4]] == 0).sum()) * I
    zeros, chunks = transforms.PerSample(param, 0, factors=(a, delta)).nonzero_element_chunks(max_elements=2 * I)
    assert zeros == left_out > 0 and sum(c.numel() for c in chunks) == explicit.numel() - left_out

    hist = transforms.GradHistogram1d(8, range_)
    expected = hist(transforms.PerSample(param, 0, grad_batch=explicit))
    for value, reference in zip(hist(factored), expected):
        torch.testing.assert_close(value, reference, rtol=0, atol=0)
    assert expected[2] == O  # every product with the infinite input: ±∞, or NaN where δ = 0
