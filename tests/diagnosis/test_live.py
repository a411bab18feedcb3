"""Live diagnosis: a crashing rule is contained, NaN origins on several ops, diagnose=False, the report."""

import logging

import pytest
import torch
from torch import nn

import cockpit_lite
from cockpit_lite.diagnosis import diagnose, recorded
from cockpit_lite.diagnosis.rules.base import Rule
from cockpit_lite.diagnosis import rules as rules_module

logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)


class Custom(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def run(model, steps=3, loss_fn=nn.functional.cross_entropy, x=None, y=None, **kwargs):
    torch.manual_seed(0)
    x = torch.randn(16, 6) if x is None else x
    y = torch.randint(0, 3, (16,)) if y is None else y
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = cockpit_lite.Cockpit(model, **kwargs)
    for step in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    return cp


@pytest.mark.parametrize("fn, op", [
    (lambda x: torch.log(x - 10), "log"),
    (lambda x: x / (x - x), "div"),
    (lambda x: torch.exp(1000 * x), "exp"),
    (lambda x: torch.sqrt(x), "sqrt"),
])
def test_nan_origin_names_module_and_op(fn, op):
    model = nn.Sequential(nn.Linear(6, 4), Custom(fn), nn.LayerNorm(4), nn.Linear(4, 3))
    findings = [f for f in run(model).findings if f.kind == "nan_loss"]
    assert len(findings) == 1
    assert findings[0].layer == "1" and findings[0].evidence["op"] == op and findings[0].step == 0


def test_nan_in_handwritten_loss_is_loss_fn():
    model = nn.Sequential(nn.Linear(6, 1))

    def loss_fn(out, target):  # BCE by hand: sigmoid rounds to 1, log(1 - p) = log(0)
        p = torch.sigmoid(1e4 * out.squeeze(1))
        return -(target * torch.log(p) + (1 - target) * torch.log(1 - p)).mean()

    cp = run(model, loss_fn=loss_fn, y=torch.zeros(16))
    nan = [f for f in cp.findings if f.kind == "nan_loss"][0]
    assert nan.layer == "loss_fn" and nan.evidence["op"] == "log"


def test_a_failing_rule_is_a_flag_not_a_crash(monkeypatch):
    class Broken(Rule):
        KIND = "lr_too_high"

        def observe(self, step, entry, history):
            raise RuntimeError("boom")

    from cockpit_lite.diagnosis import Diagnosis

    monkeypatch.setattr(Diagnosis.__init__, "__defaults__", (None, None, (Broken,) + rules_module.RULES[1:]))
    cp = run(nn.Sequential(nn.Linear(6, 3)), steps=3)
    cp.close()
    flags = [f for entry in cp.output.values() for f in entry.get("flags", [])]
    assert any("rule lr_too_high failed" in f for f in flags)


def test_diagnose_false_tracks_nothing_and_finds_nothing():
    cp = run(nn.Sequential(nn.Linear(6, 3)), diagnose=False)
    assert cp.quantities == [] and cp.findings == []


def test_default_signals_only_and_added_to_explicit_lists():
    cp = run(nn.Sequential(nn.Linear(6, 3)), steps=1)
    assert sorted(q.name for q in cp.quantities) == sorted(cockpit_lite.diagnosis.SIGNALS)
    cp = run(nn.Sequential(nn.Linear(6, 3)), steps=1, quantities=cockpit_lite.configuration("economy"))
    assert set(cockpit_lite.diagnosis.SIGNALS) <= {q.name for q in cp.quantities}


def test_findings_are_logged_once_written_to_the_log_and_read_back(tmp_path, capsys):
    torch.manual_seed(1)  # a run with two findings, the later-found one at the earlier step
    x = torch.randn(16, 6) * 100
    cp = run(nn.Sequential(nn.Linear(6, 3)), x=x, log=tmp_path / "run.jsonl")
    cp.close()
    kinds = [f.kind for f in cp.findings]
    assert "unnormalized_inputs" in kinds and len(kinds) == 2
    from cockpit_lite import log

    _, record = log.read_jsonl(tmp_path / "run.jsonl")
    assert cp.findings == diagnose(str(tmp_path / "run.jsonl"))  # both in the order they were found
    in_log = recorded(record)  # the log keeps them by step
    assert len(in_log) == len(cp.findings) and all(f in cp.findings for f in in_log)
    text = cp.report()
    assert "unnormalized_inputs" in text and "parameters (step" in text


def test_observing_does_not_disturb_training():
    def train(diagnose):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        cp = run(model, steps=4, diagnose=diagnose)
        return [p.detach().clone() for p in model.parameters()], cp

    with_, _ = train(True)
    without, _ = train(False)
    assert all(torch.equal(a, b) for a, b in zip(with_, without))


def test_sparse_signals_and_a_nan_between_their_steps():
    """The signals follow ``diagnosis.schedule``; a NaN at a step off that schedule is still caught there."""
    from cockpit_lite.diagnosis import schedule

    state = {"bad": False}
    model = nn.Sequential(nn.Linear(6, 4), Custom(lambda x: torch.log(x - 10) if state["bad"] else x),
                          nn.Linear(4, 3))
    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cp = cockpit_lite.Cockpit(model)
    bad_step = 25
    assert not schedule(bad_step)
    for step in range(bad_step + 3):
        state["bad"] = step == bad_step
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        if not state["bad"]:
            opt.step()
    recorded_at = sorted(s for s, entry in cp.output.items() if "ActivationStats" in entry or "Loss" in entry)
    assert recorded_at == [s for s in range(bad_step + 3) if schedule(s)]
    nan = [f for f in cp.findings if f.kind == "nan_loss"]
    assert len(nan) == 1 and nan[0].step == bad_step and nan[0].layer == "1" and nan[0].evidence["op"] == "log"


def test_missing_zero_grad_counts_updates_between_contexts_not_records():
    """Correct accumulation over 3 micro-batches raises nothing, although records are 10 steps apart."""
    model = nn.Sequential(nn.Linear(6, 3))
    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cp = cockpit_lite.Cockpit(model)
    for step in range(60):
        if step % 3 == 0:
            opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        if step % 3 == 2:
            opt.step()
    presence = {s: e["GradPresence"] for s, e in cp.output.items() if "GradPresence" in e}
    assert presence[20]["before"] > 0 and presence[20]["stepped"] == 0  # 2nd micro-batch: no update since step 19
    assert presence[30]["stepped"] == 1 and presence[30]["before"] == 0
    assert "missing_zero_grad" not in [f.kind for f in cp.findings]
