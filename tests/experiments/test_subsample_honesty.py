"""``experiments.subsample_honesty`` runs end to end on a tiny setting and reports every estimate."""

import json

from experiments import realistic_diagnosis, subsample_honesty


def test_tiny_run(capsys, tmp_path):
    out = tmp_path / "honesty.json"
    subsample_honesty.main(["--draws", "3", "--samples", "4", "--batch", "12", "--warmup", "1", "--models", "mlp",
                            "--probes", "4", "--reference", "16", "--json", str(out)])
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    rows = results["mlp k=4"]
    assert {"NormTest", "InnerTest", "OrthoTest", "GradVariance", "Alpha"} <= set(rows)
    for q in ("NormTest", "GradVariance", "Alpha"):
        assert 0.0 <= rows[q]["outside"] <= 1.0 and 0.0 <= rows[q]["beyond"] <= 1.0, q
    assert 0.0 <= results["mlp probes=4"]["HessTrace"]["outside"] <= 1.0
    assert "mlp k=4" in printed and "outside" in printed


def test_findings_compared_with_and_without_samples(capsys):
    differ = realistic_diagnosis.compare_samples(["small_batch_sgd"], 2, seeds=1, steps=3)
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if line.startswith("small_batch_sgd seed 0: "))
    assert ("DIFFERENT" in line) == bool(differ)
    assert f"{len(differ)} of 1 runs differ in their findings with samples=2" in printed
