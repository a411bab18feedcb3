"""``benchmarks.bench_per_sample``: every peer's statistics are checked against cockpit-lite's
before it is timed, and a peer that computes something else is marked as such."""

import importlib.util

import pytest
import torch

from benchmarks import bench_per_sample

HAS_OPACUS = importlib.util.find_spec("opacus") is not None


def test_statistics_of_individual_gradients_match_a_float64_brute_force():
    torch.manual_seed(0)
    individual = [torch.randn(6, 3, 2, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)]
    flat = torch.cat([g.reshape(6, -1) for g in individual], 1)
    g = flat.mean(0)
    norm_test = (((flat - g) ** 2).sum() / (5 * 6 * (g ** 2).sum())).sqrt()
    variance = flat.var(0, unbiased=True).sum()
    gsnr = (g ** 2 / (flat.var(0, unbiased=False) + bench_per_sample.EPSILON)).mean()
    assert bench_per_sample.from_individual(individual) == pytest.approx([norm_test.item(), variance.item(), gsnr.item()], rel=1e-10)


@pytest.mark.parametrize("problem", ["mlp", "cnn", "resnet_gn"])
def test_every_peer_agrees_with_cockpit_lite(problem):
    torch.set_num_threads(1)
    plain, results = bench_per_sample.measure(problem, repeats=1, steps=1)
    assert plain > 0
    for name, (seconds, check) in results.items():
        if seconds is None:  # not installed, or not supported (BackPACK beyond Sequential models)
            assert check in ("not installed", "unsupported"), (name, check)
            continue
        assert check <= bench_per_sample.TOLERANCE, (name, check)


@pytest.mark.skipif(not HAS_OPACUS, reason="opacus not installed")
def test_opacus_on_a_gpt_with_a_position_embedding_is_marked_as_different(capsys):
    """Opacus takes ``wpe(arange(T))``'s T positions for samples: its numbers are not the batch's."""
    measured = {"gpt": bench_per_sample.measure("gpt", repeats=1, steps=1, tools=("cockpit-lite", "Opacus"))}
    _, results = measured["gpt"]
    assert results["Opacus"][1] > bench_per_sample.TOLERANCE
    assert "(differs:" in bench_per_sample.table(measured).splitlines()[-1]


def test_main_prints_the_table(capsys, tmp_path):
    out = tmp_path / "per_sample.json"
    bench_per_sample.main(["--repeats", "1", "--steps", "1", "--problems", "mlp", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "| mlp |" in printed and "cockpit-lite" in printed
    assert out.exists()
