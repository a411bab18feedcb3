"""``python -m experiments.seed_stability``: runs recorded once, judged offline by the step a finding was
raised at, and a threshold moved until a verdict flips."""

from experiments import seed_stability as ss


def test_record_judge_and_a_margin(tmp_path, capsys):
    out = str(tmp_path)
    ss.main(["record", "--out", out, "--seeds", "2", "--suite", "toy", "--only", "dead_relu_bias", "healthy_mlp_sgd"])
    rows = {r["scenario"]: r for r in ss.judge(out, ("toy",))}
    assert set(rows) == {"dead_relu_bias", "healthy_mlp_sgd"}
    assert [s["ok"] for s in rows["dead_relu_bias"]["seeds"]] == [True, True]
    assert rows["healthy_mlp_sgd"]["expect"] is None and all(s["ok"] for s in rows["healthy_mlp_sgd"]["seeds"])
    table = ss.seeds_table(list(rows.values()))
    assert table["header"][-1] == "result" and table["rows"][0][-1] == "found on every seed"
    runs = ss.load(out, ("toy",))
    # DEAD = 0.5: the broken net's layer is ~100 % dead, the healthy one's far below half
    assert ss.flip_factor(runs, "DEAD", "dead_relu", 1, healthy=False) > 1.5
    assert ss.flip_factor(runs, "DEAD", "dead_relu", 1, healthy=True) > 1.0  # clean as it is
    from cockpit_lite.diagnosis import thresholds
    from cockpit_lite.diagnosis.rules.dead_relu import DeadRelu

    assert thresholds.DEAD == DeadRelu.THRESHOLD == 0.5  # restored


def test_a_finding_is_judged_by_the_step_it_was_raised_at(tmp_path):
    out = str(tmp_path)
    ss.record(out, 1, ("toy",), ["shuffled_labels"])
    run = ss.Offline(ss.path(out, "toy", "shuffled_labels", 0))
    [finding] = [f for f in run.findings if f.kind == "shuffled_labels"]
    raised = [f for f in run.emitted().findings if f.kind == "shuffled_labels"][0]
    assert raised.step >= finding.step + 10  # named at its first log at chance, raised at the third
