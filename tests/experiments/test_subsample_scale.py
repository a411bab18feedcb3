"""``experiments.subsample_scale`` times the plain step and economy tracking and tabulates ratios."""

import json

from experiments import subsample_scale


def test_a_short_run_tabulates_each_configuration_over_the_plain_step(capsys, tmp_path):
    out = tmp_path / "scale.json"
    subsample_scale.main(["--problems", "gpt", "--batch-size", "4", "--repeats", "1", "--steps", "1", "--exact",
                          "--json", str(out)])
    printed = capsys.readouterr().out
    assert "| problem | batch | plain step | economy | economy, samples=8 |" in printed
    (row,) = [line for line in printed.splitlines() if line.startswith("| gpt | 4 |")]
    assert row.count("×") == 2
    seconds = json.loads(out.read_text())["gpt"]
    assert set(seconds) == {"plain", "economy", "economy, samples=8"} and all(s > 0 for s in seconds.values())


def test_the_tracked_runner_trains_the_same_model_as_the_plain_one():
    """Same seed, same batches: the configurations time the same work on the same model."""
    plain, tracked = subsample_scale.Runner("gpt", tracked=False, batch_size=2), subsample_scale.Runner("gpt", samples=8, batch_size=2)
    for (px, py), (tx, ty) in zip(plain.batches, tracked.batches):
        assert px.equal(tx) and py.equal(ty)
    assert all(p.equal(q) for p, q in zip(plain.model.parameters(), tracked.model.parameters()))
    assert plain.cp is None and tracked.cp is not None


def test_the_language_models_run_at_more_samples_than_are_drawn():
    """At ``memory_flatness``'s batch 8, ``samples=8`` would be the exact path."""
    assert subsample_scale.batch_of("gpt2_small") == 32 and subsample_scale.batch_of("transformer512") == 64
    assert subsample_scale.batch_of("gpt2_small", 4) == 4
