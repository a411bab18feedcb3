"""``experiments.subsample_honesty`` runs end to end on a tiny setting and reports every estimate."""

import json

from experiments import realistic_diagnosis, subsample_honesty


def test_tiny_run(capsys, tmp_path):
    out = tmp_path / "honesty.json"
    subsample_honesty.main(["--draws", "3", "--samples", "4", "--batch", "12", "--warmup", "1", "--models", "mlp",
                            "--json", str(out)])
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())["mlp k=4"]
    assert {"NormTest", "InnerTest", "OrthoTest", "GradVariance", "Alpha"} <= set(rows)
    assert all(0.0 <= rows[q]["inside"] <= 1.0 for q in ("NormTest", "GradVariance"))
    assert "mlp k=4" in printed and "|z|<=3" in printed


def test_findings_compared_with_and_without_samples(capsys):
    differ = realistic_diagnosis.compare_samples(["small_batch_sgd"], 2, seeds=1, steps=3)
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if line.startswith("small_batch_sgd seed 0: "))
    assert ("DIFFERENT" in line) == bool(differ)
    assert f"{len(differ)} of 1 runs differ in their findings with samples=2" in printed
