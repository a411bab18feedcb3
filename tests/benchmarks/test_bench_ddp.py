"""The DDP benchmark runs end to end (two processes, one timed step)."""

from benchmarks import bench_ddp


def test_bench_ddp_prints_the_ratios(capsys):
    bench_ddp.main(["--steps", "1", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "plain" in out and "default" in out and "economy" in out and "1.00x" in out
