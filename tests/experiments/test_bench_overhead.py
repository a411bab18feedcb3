"""``experiments.bench_overhead`` runs end to end in its quick mode (about 10 s on one thread)."""

from experiments import bench_overhead


def test_quick_mlp(capsys, tmp_path):
    out = tmp_path / "overhead.json"
    bench_overhead.main(["--quick", "--no-peer", "--problems", "mlp", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "plain" in printed and "lite economy" in printed
    assert out.exists()
