"""``python -m benchmarks.bench_sharpness`` end to end on one tiny round: ratios measured, the log schedule's
points counted, the extrapolation made from them."""

from benchmarks import bench_sharpness


def test_ratios_and_the_extrapolation():
    results = bench_sharpness.main(["--problems", "mlp", "--repeats", "1", "--steps", "12"])
    r = results["mlp"]
    assert r["hess_max_ev"] > 1.0 and r["default"] > 0.5 and r["default + sparse"] > 0.5
    assert bench_sharpness.points(12) == 6  # steps 0, 1, 2, 4, 6 and 10: the log grid below 12
    for n, value in r["extrapolated"].items():
        assert abs(value - (r["default"] + bench_sharpness.points(n) * (r["hess_max_ev"] - 1) / n)) < 1e-12
