"""Tests of ``cockpit_lite/histogram.py`` against ``numpy.histogram`` / ``numpy.histogram2d``.

The reference drops non-finite values (pairs), clips the rest into ``[lo, hi]`` (so
out-of-range values land in the edge bins, as in ``cockpit_lite.histogram``) and bins
them in float64 on the edges ``numpy.linspace(lo, hi, bins + 1)``. Ranges and bin
widths are dyadic unless a test says otherwise, so that the float32 index arithmetic
is exact and the counts must be identical.
"""

import numpy as np
import pytest
import torch

from cockpit_lite import histogram
from cockpit_lite.histogram import edges, histogram1d, histogram2d

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


def _numpy(tensor):
    return tensor.detach().cpu().double().numpy()


def reference1d(values, bins, range, scale=1.0):
    """``(counts, clipped, nonfinite)`` by ``numpy.histogram``."""
    v = scale * _numpy(values).reshape(-1)
    finite = np.isfinite(v)
    v = v[finite]
    lo, hi = range
    counts, _ = np.histogram(np.clip(v, lo, hi), edges(bins, range))
    return counts, int(((v < lo) | (v > hi)).sum()), int((~finite).sum())


def reference2d(x, y, bins, range, scale=1.0):
    """``(counts, clipped, nonfinite)`` by ``numpy.histogram2d`` on the broadcast arrays."""
    x, y = np.broadcast_arrays(scale * _numpy(x), _numpy(y))
    x, y = x.reshape(-1), y.reshape(-1)
    finite = np.isfinite(x) & np.isfinite(y)
    x, y = x[finite], y[finite]
    (xlo, xhi), (ylo, yhi) = range
    counts, _, _ = np.histogram2d(
        np.clip(x, xlo, xhi),
        np.clip(y, ylo, yhi),
        bins=[edges(bins[0], range[0]), edges(bins[1], range[1])],
    )
    clipped = (x < xlo) | (x > xhi) | (y < ylo) | (y > yhi)
    return counts.astype(np.int64), int(clipped.sum()), int((~finite).sum())


def check(result, expected, device):
    counts, clipped, nonfinite = result
    assert counts.dtype == clipped.dtype == nonfinite.dtype == torch.int64
    assert counts.device.type == clipped.device.type == nonfinite.device.type == device
    assert clipped.dim() == nonfinite.dim() == 0
    np.testing.assert_array_equal(counts.cpu().numpy(), expected[0])
    assert (clipped.item(), nonfinite.item()) == expected[1:]


def randn(*shape, std=1.0, seed=0, dtype=torch.float32, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return (std * torch.randn(shape, generator=generator)).to(dtype=dtype, device=device)


def near_edges(values, bins, range, ulps=4):
    """Mask of the values within ``ulps`` float32 ulps of an edge."""
    v = _numpy(values).reshape(-1)
    grid = edges(bins, range)
    right = np.clip(np.searchsorted(grid, v), 1, bins)
    neighbours = np.stack([grid[right - 1], grid[right]])  # the edges around each value
    ulp = np.spacing(np.maximum(np.abs(v), np.abs(neighbours)).astype(np.float32))
    near = (np.abs(v - neighbours) <= ulps * ulp.astype(np.float64)).any(0)
    return torch.from_numpy(near).reshape(values.shape)


@pytest.mark.parametrize("device", DEVICES)
def test_random_1d(device):
    values = randn(200, 300, std=1.2, device=device)  # about 10% outside the range
    check(histogram1d(values, 32, (-2.0, 2.0)), reference1d(values, 32, (-2.0, 2.0)), device)


@pytest.mark.parametrize("device", DEVICES)
def test_random_2d(device):
    x = randn(100, 400, std=0.6, seed=1, device=device)
    y = randn(100, 400, std=2.0, seed=2, device=device)
    bins, range = (16, 64), ((-1.0, 1.0), (-4.0, 4.0))
    check(histogram2d(x, y, bins, range), reference2d(x, y, bins, range), device)


@pytest.mark.parametrize("device", DEVICES)
def test_skewed(device):
    """Most mass in the two central bins, plus tiny values on both sides of the edge at 0."""
    x = randn(50_000, std=1e-3, seed=3, device=device)
    tiny = torch.tensor([1e-30, -1e-30, 1e-40, -1e-40, 0.0, -0.0], device=device)
    x = torch.cat([x, tiny])
    y = randn(x.numel(), std=0.1, seed=4, device=device)
    check(histogram1d(x, 40, (-1.0, 1.0)), reference1d(x, 40, (-1.0, 1.0)), device)
    bins, range = (40, 64), ((-1.0, 1.0), (-2.0, 2.0))
    check(histogram2d(x, y, bins, range), reference2d(x, y, bins, range), device)
    counts, _, _ = histogram1d(x, 40, (-1.0, 1.0))
    assert counts[19:21].sum() > 0.99 * x.numel()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("range", [(-2.0, 2.0), (1.0, 3.0), (-3.0, -1.0), (0.0, 4.0)])
def test_values_on_edges(device, range):
    """Every edge goes into the bin on its right, ``hi`` into the last bin, and the
    neighbours of ``lo`` and ``hi`` outside the range are clipped."""
    bins = 16
    grid = torch.tensor(edges(bins, range), dtype=torch.float32)
    below = torch.nextafter(grid, torch.tensor(-np.inf))
    above = torch.nextafter(grid, torch.tensor(np.inf))
    values = torch.cat([grid, below, above]).to(device)
    expected = reference1d(values, bins, range)
    assert expected[1] == 2  # below lo and above hi
    one_per_bin = np.ones(bins)
    one_per_bin[-1] = 2  # the last interior edge and hi
    check(histogram1d(grid.to(device), bins, range), (one_per_bin, 0, 0), device)
    check(histogram1d(values, bins, range), expected, device)
    x, y = torch.meshgrid(values, values.flip(0), indexing="ij")
    bins2, range2 = (bins, 8), (range, range)
    check(histogram2d(x, y, bins2, range2), reference2d(x, y, bins2, range2), device)


@pytest.mark.parametrize("range", [(-1.0, 0.9), (0.3, 2.2)])
def test_non_dyadic_range(range):
    """With bin widths that are not float32 numbers, values more than a few ulps away
    from every edge are binned as numpy does; the others move by at most one bin."""
    bins, (lo, hi) = 40, range
    generator = torch.Generator().manual_seed(5)
    values = lo - 0.1 + (hi - lo + 0.2) * torch.rand(400_000, generator=generator)
    near = near_edges(values, bins, range)
    far = values[~near]
    check(histogram1d(far, bins, range), reference1d(far, bins, range), "cpu")

    grid = torch.tensor(edges(bins, range), dtype=torch.float32)
    close = torch.cat([values[near], grid, torch.nextafter(grid, torch.tensor(-np.inf)),
                       torch.nextafter(grid, torch.tensor(np.inf))])
    assert near_edges(close, bins, range).all()
    expected = np.searchsorted(edges(bins, range), np.clip(_numpy(close), lo, hi), side="right") - 1
    expected = np.minimum(expected, bins - 1)
    ours = np.array([histogram1d(v[None], bins, range)[0].argmax().item() for v in close])
    assert np.abs(ours - expected).max() <= 1


@pytest.mark.parametrize("device", DEVICES)
def test_range_far_from_zero(device):
    """Near 1e6 a float32 has 4 fractional bits: the index is taken relative to the
    range (``v - lo``), not as ``v * bins / (hi - lo)``, which would round to integers."""
    range = (1e6, 1e6 + 1.0)
    values = 1e6 + 0.0625 * torch.arange(-8, 25, dtype=torch.float32)
    values = values.to(device)
    check(histogram1d(values, 10, range), reference1d(values, 10, range), device)
    check(histogram2d(values, values, (10, 5), (range, range)),
          reference2d(values, values, (10, 5), (range, range)), device)


def test_float64_values_are_binned_with_float64_constants():
    """Values 1e-10 of a bin (or less) above and below an interior edge land in the bins on either side (numpy's
    rule), which needs the axis' constants in float64: the pivot 0.1 of the range (0.1, 0.2) (10 bins, first
    binned in float32, whose constants are cached too: float32's pivot is 1.5e-9 larger, 0.15 ppm of a bin), and
    the offset 1/7 of the range (-0.01, 0.2) with 3 bins (float32's is 6e-9 of a bin larger)."""
    assert histogram1d(torch.tensor([0.15]), 10, (0.1, 0.2))[0].tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    for bins, range, k in ((10, (0.1, 0.2), 3), (3, (-0.01, 0.2), 1)):
        edge = edges(bins, range)[k]
        for value, expected in ((edge + 1e-12, k), (edge - 1e-12, k - 1)):
            counts = histogram1d(torch.tensor([value], dtype=torch.float64), bins, range)[0]
            assert counts.argmax().item() == expected and counts.sum().item() == 1, (range, value, counts)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range(device):
    values = torch.tensor([-1e30, -5.0, -2.0, -1.5, 0.0, 1.999, 2.0, 2.5, 1e4, 1e30], device=device)
    check(histogram1d(values, 8, (-2.0, 2.0)), reference1d(values, 8, (-2.0, 2.0)), device)
    counts, clipped, _ = histogram1d(values, 8, (-2.0, 2.0))
    assert clipped.item() == 5 and counts[0].item() == 3 and counts[-1].item() == 5
    y = torch.tensor([0.0, 0.0, 10.0, 0.0, -10.0, 0.0, 0.0, 0.0, 0.0, 0.0], device=device)
    bins, range = (8, 4), ((-2.0, 2.0), (-1.0, 1.0))
    check(histogram2d(values, y, bins, range), reference2d(values, y, bins, range), device)
    assert histogram2d(values, y, bins, range)[1].item() == 7  # 5 by x, 2 more by y


@pytest.mark.parametrize("device", DEVICES)
def test_nonfinite(device):
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([nan, inf, -inf, 0.5, 3.0, -0.5, nan, 0.25, 0.0], device=device)
    y = torch.tensor([0.0, 0.0, 0.0, nan, inf, 5.0, 0.1, -inf, 0.0], device=device)
    expected = reference1d(x, 4, (-1.0, 1.0))
    assert expected[1:] == (1, 4)
    check(histogram1d(x, 4, (-1.0, 1.0)), expected, device)
    bins, range = (4, 8), ((-1.0, 1.0), (-2.0, 2.0))
    expected = reference2d(x, y, bins, range)
    assert expected[1:] == (1, 7)  # (-0.5, 5.0) clipped; (3.0, inf) is non-finite, not clipped
    check(histogram2d(x, y, bins, range), expected, device)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    empty = torch.empty(0, 5, device=device)
    check(histogram1d(empty, 8, (-1.0, 1.0)), (np.zeros(8), 0, 0), device)
    check(histogram2d(empty, torch.zeros(5, device=device), (8, 4), ((-1, 1), (0, 1))),
          (np.zeros((8, 4)), 0, 0), device)
    out = torch.arange(8, device=device)
    assert histogram1d(empty, 8, (-1.0, 1.0), out=out)[0] is out
    np.testing.assert_array_equal(out.cpu().numpy(), np.arange(8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes(device, dtype):
    x = randn(64, 256, std=0.7, seed=6, dtype=dtype, device=device)
    y = randn(256, std=1.5, seed=7, dtype=dtype, device=device)
    x[0, :3] = torch.tensor([float("nan"), float("inf"), 5.0], dtype=dtype)
    check(histogram1d(x, 64, (-2.0, 2.0)), reference1d(x, 64, (-2.0, 2.0)), device)
    bins, range = (32, 16), ((-1.0, 1.0), (-2.0, 2.0))
    check(histogram2d(x, y, bins, range), reference2d(x, y, bins, range), device)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous(device):
    base = randn(300, 200, std=1.0, seed=8, device=device)
    x = base.t()[::2, 3:]  # transposed and strided
    y = randn(200, 300, std=1.0, seed=9, device=device)[::2, 3:]
    assert not x.is_contiguous() and not y.is_contiguous()
    check(histogram1d(x, 16, (-2.0, 2.0)), reference1d(x, 16, (-2.0, 2.0)), device)
    bins, range = (16, 8), ((-2.0, 2.0), (-1.0, 1.0))
    check(histogram2d(x, y, bins, range), reference2d(x, y, bins, range), device)
    check(histogram2d(x, y[0], bins, range), reference2d(x, y[0], bins, range), device)


@pytest.mark.parametrize("device", DEVICES)
def test_scale(device):
    x = randn(32, 500, std=0.05, seed=10, device=device)
    y = randn(500, std=0.3, seed=11, device=device)
    for scale in (32.0, 0.25, -8.0):
        check(histogram1d(x, 64, (-2.0, 2.0), scale=scale),
              reference1d(x, 64, (-2.0, 2.0), scale=scale), device)
        bins, range = (64, 16), ((-2.0, 2.0), (-1.0, 1.0))
        check(histogram2d(x, y, bins, range, scale=scale),
              reference2d(x, y, bins, range, scale=scale), device)


def test_scale_not_dyadic():
    """``scale`` is folded into the float32 slope: the counts are numpy's on the float64
    products for every product more than a few ulps away from an edge."""
    x = randn(100_000, std=0.1, seed=12)
    far = x[~near_edges(5.0 * x.double(), 64, (-2.0, 2.0))]
    check(histogram1d(far, 64, (-2.0, 2.0), scale=5.0),
          reference1d(far, 64, (-2.0, 2.0), scale=5.0), "cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_out_accumulates(device):
    first = randn(1000, std=1.0, seed=13, device=device)
    second = randn(3000, std=0.5, seed=14, device=device)
    out = torch.zeros(32, dtype=torch.int64, device=device)
    for values in (first, second):
        counts, _, _ = histogram1d(values, 32, (-2.0, 2.0), out=out)
        assert counts is out
    expected = reference1d(first, 32, (-2.0, 2.0))[0] + reference1d(second, 32, (-2.0, 2.0))[0]
    np.testing.assert_array_equal(out.cpu().numpy(), expected)

    y = randn(1000, std=1.0, seed=15, device=device)
    out = torch.zeros(8, 16, dtype=torch.int64, device=device)
    bins, range = (8, 16), ((-2.0, 2.0), (-2.0, 2.0))
    histogram2d(first, y, bins, range, out=out)
    histogram2d(second[:1000], y, bins, range, out=out)
    expected = reference2d(first, y, bins, range)[0] + reference2d(second[:1000], y, bins, range)[0]
    np.testing.assert_array_equal(out.cpu().numpy(), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "xshape, yshape",
    [
        ((8, 3, 50), (3, 50)),  # the typical call: y shared by the rows of x
        ((8, 150), (8, 1)),
        ((150,), (8, 150)),  # x shared by the rows of y
        ((8, 1), (1, 150)),  # neither operand has the full shape
        ((), (40,)),
    ],
)
def test_broadcasting(device, xshape, yshape):
    x = randn(*xshape, std=1.0, seed=16, device=device)
    y = randn(*yshape, std=1.0, seed=17, device=device)
    bins, range = (16, 32), ((-2.0, 2.0), (-2.0, 2.0))
    expected = reference2d(x, y, bins, range, scale=2.0)
    check(histogram2d(x, y, bins, range, scale=2.0), expected, device)


@pytest.mark.parametrize("shape", [(5000,), (7, 300), (3, 5, 400), (2, 2000), (40, 1), (3, 600), (2, 10, 10, 10)])
def test_cpu_blocks(monkeypatch, shape):
    """Block boundaries (whole rows, slices of rows, leading dimensions; rows longer than half a
    block; three trailing dimensions in one block) lose nothing."""
    monkeypatch.setattr(histogram, "_CPU_BLOCK", 1000)
    x = randn(*shape, std=1.0, seed=18)
    y = randn(*shape[1:], std=1.0, seed=19)
    check(histogram1d(x, 16, (-2.0, 2.0)), reference1d(x, 16, (-2.0, 2.0)), "cpu")
    bins, range = (16, 8), ((-2.0, 2.0), (-2.0, 2.0))
    check(histogram2d(x, y, bins, range), reference2d(x, y, bins, range), "cpu")
    check(histogram2d(x, x, bins, range), reference2d(x, x, bins, range), "cpu")


def test_many_bins_use_float64_arithmetic():
    """More than 2**22 slots do not fit float32 integers: the kernel switches to float64. Here
    (2 · 1022 + 4) · (2 · 1023 + 4) = 2**22 + 4096 slots, so that only the last ones (values
    above a range's end, the drop slot of non-finite pairs) are beyond 2**22."""
    x = randn(20_000, std=1.0, seed=20)
    x[:3] = float("nan")
    y = randn(20_000, std=1.0, seed=21)
    bins, range = (1022, 1023), ((-4.0, 4.0), (-2.0, 2.0))
    check(histogram2d(x, y, bins, range), reference2d(x, y, bins, range), "cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_mode(device):
    x = randn(5000, std=1.0, seed=22, device=device)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        result = histogram1d(x, 16, (-2.0, 2.0))
    finally:
        torch.use_deterministic_algorithms(previous)
    check(result, reference1d(x, 16, (-2.0, 2.0)), device)


@pytest.mark.parametrize("device", DEVICES)
def test_accumulators(device):
    """Every accumulation primitive adds the counts of the slots into ``slots``."""
    generator = torch.Generator().manual_seed(26)
    index = torch.randint(0, 50, (10_000,), generator=generator, dtype=torch.int32)
    expected = np.bincount(index.numpy(), minlength=60) + 7
    accumulators = [histogram._accumulate_bincount, histogram._accumulate_index_put]
    if device == "cuda":
        accumulators.append(histogram._accumulate_histc)
    for accumulate in accumulators:
        slots = torch.full((60,), 7, dtype=torch.int64, device=device)
        accumulate(slots, index.to(device))
        np.testing.assert_array_equal(slots.cpu().numpy(), expected)


def test_requires_grad_and_numpy_edges():
    param = torch.nn.Parameter(randn(100, std=1.0, seed=23))
    check(histogram2d(param, param, (8, 8), ((-2, 2), (-2, 2))),
          reference2d(param, param, (8, 8), ((-2, 2), (-2, 2))), "cpu")
    np.testing.assert_array_equal(edges(5, (-1.0, 1.5)), np.linspace(-1.0, 1.5, 6))


@pytest.mark.parametrize(
    "bins, range, error",
    [(0, (-1, 1), ValueError), (4, (1, 1), ValueError), (4, (0, float("inf")), ValueError)],
)
def test_invalid_arguments(bins, range, error):
    with pytest.raises(error):
        histogram1d(torch.zeros(3), bins, range)
    with pytest.raises(TypeError):
        histogram1d(torch.zeros(3, dtype=torch.int64), 4, (-1, 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_no_host_sync():
    x = randn(64, 1000, std=1e-3, seed=24, device="cuda")
    y = randn(1000, std=0.1, seed=25, device="cuda")
    histogram2d(x, y, (40, 50), ((-1, 1), (-2, 2)))  # warm-up: fold maps are cached
    torch.cuda.set_sync_debug_mode("error")
    try:
        histogram2d(x, y, (40, 50), ((-1, 1), (-2, 2)), scale=64.0)
        histogram1d(x, 40, (-1, 1))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_equals_numpy_per_tensor(device, dtype):
    """``histogram1d_batch`` gives each tensor's own histogram: no count crosses to a neighbour."""
    special = torch.tensor([0.0, -0.0, 2.0, -2.0, 1e-30, -1e-30, 5.0, -7.0, float("nan"), float("inf"), -float("inf")])
    tensors = [
        randn(5, 7, std=0.3, seed=1),
        special,
        torch.empty(0),
        randn(3, std=4.0, seed=2),
        randn(2, 3, 4, std=1.0, seed=3),
        torch.full((9,), float("nan")),
    ]
    tensors = [t.to(dtype=dtype, device=device) for t in tensors]
    counts, clipped, nonfinite = histogram.histogram1d_batch(tensors, 16, (-2, 2), scale=0.5)
    assert counts.shape == (len(tensors), 16) and clipped.shape == nonfinite.shape == (len(tensors),)
    for i, t in enumerate(tensors):
        check((counts[i], clipped[i], nonfinite[i]), reference1d(t, 16, (-2, 2), scale=0.5), device)


def test_batch_rejects_nothing_and_integers():
    with pytest.raises(ValueError, match="^histogram1d_batch needs at least one tensor$"):
        histogram.histogram1d_batch([], 4, (-1, 1))
    with pytest.raises(TypeError, match="^expected a floating-point tensor, got torch.int64$"):
        histogram.histogram1d_batch([torch.zeros(3), torch.zeros(3, dtype=torch.int64)], 4, (-1, 1))


def test_batch_of_more_slots_than_float32_integers_uses_float64():
    """``histogram1d_batch`` over so many tensors that their slots pass 2**22 (float32 integers
    are exact only below it): every tensor's value still lands in its own bin. Each of the
    ~66 000 one-value tensors holds a bin centre, so numpy's bin is unambiguous."""
    bins, lo, hi = 30, -1.5, 1.5
    width = (hi - lo) / bins
    count = (1 << 22) // (2 * bins + 5) + 1000
    chosen = np.random.default_rng(0).integers(0, bins, count)
    values = torch.tensor(lo + (chosen + 0.5) * width, dtype=torch.float32)
    counts, clipped, nonfinite = histogram.histogram1d_batch(list(values.reshape(-1, 1)), bins, (lo, hi))
    assert counts.shape == (count, bins) and int(clipped.sum()) == 0 and int(nonfinite.sum()) == 0
    assert torch.equal(counts.argmax(1), torch.as_tensor(chosen)) and torch.equal(counts.sum(1), torch.ones(count, dtype=torch.int64))


@pytest.mark.parametrize("scale", [0.0, float("inf"), float("nan")])
def test_a_zero_or_non_finite_scale_is_refused(scale):
    with pytest.raises(ValueError, match="^scale must be finite and non-zero"):
        histogram1d(torch.zeros(3), 4, (-1, 1), scale=scale)


def test_shapes_that_do_not_broadcast_are_refused():
    with pytest.raises(ValueError, match="are not broadcastable$"):
        histogram2d(torch.zeros(3), torch.zeros(4), (2, 2), ((-1, 1), (-1, 1)))


@pytest.mark.parametrize("scale", [4.0, -0.25])
def test_scale_with_a_range_away_from_zero(scale):
    """The pivot (the range's point nearest to 0) is in scaled units: ``scale · x`` lands where
    numpy puts it."""
    x = randn(5000, std=3.0, seed=30) + 12 / scale
    check(histogram1d(x, 13, (10.0, 14.5), scale=scale), reference1d(x, 13, (10.0, 14.5), scale=scale), "cpu")


def test_a_zero_dimensional_tensor_is_one_value():
    check(histogram1d(torch.tensor(0.3), 4, (-1, 1)), reference1d(torch.tensor([0.3]), 4, (-1, 1)), "cpu")
    check(histogram2d(torch.tensor(0.3), torch.tensor(-0.9), (4, 2), ((-1, 1), (-1, 1))),
          reference2d(torch.tensor([0.3]), torch.tensor([-0.9]), (4, 2), ((-1, 1), (-1, 1))), "cpu")


def test_an_unhashable_scale_is_accepted():
    """A 0-d numpy array (unhashable, so not cached) gives the histogram of its float value."""
    x = randn(1000, std=1.0, seed=31)
    check(histogram1d(x, 8, (-2, 2), scale=np.array(0.5)), reference1d(x, 8, (-2, 2), scale=0.5), "cpu")
