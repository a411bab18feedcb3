"""The broken-network suite: every kind fires on its scenario (right layer, first 20 % of the run);
healthy twins raise nothing; offline (from the log) equals live."""

import logging

import pytest
import torch

import cockpit_lite
from cockpit_lite.diagnosis import KINDS
from experiments import broken_networks as bn

logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)


def test_suite_covers_every_kind():
    assert {bn.SCENARIOS[n].expect[0] for n in bn.BROKEN} == set(KINDS)
    assert len(bn.BROKEN) >= 15 and len(bn.HEALTHY) >= 5


@pytest.mark.parametrize("name", bn.BROKEN)
def test_broken_scenario_is_found(name, tmp_path):
    log = tmp_path / "run.jsonl"
    cp = bn.train(name, log=log)
    passed, first, findings = bn.outcome(name, cp)
    kind, layer = bn.SCENARIOS[name].expect
    assert passed, f"{name}: expected {kind} [{layer}] by step {0.2 * bn.SCENARIOS[name].steps}, got {findings}"
    assert cockpit_lite.diagnose(str(log)) == findings  # offline equals live


@pytest.mark.parametrize("name", bn.HEALTHY)
def test_healthy_twin_raises_nothing(name):
    cp = bn.train(name)
    assert cp.findings == [], cp.findings


@pytest.mark.parametrize("name", ["exploding_deep_batchnorm", "vanishing_deep_sigmoid", "dead_relu_cnn",
                                  "healthy_cnn_batchnorm"])
def test_findings_do_not_depend_on_the_thread_count(name):
    """Float reductions differ with the thread count; no finding (kind, layer, step) may hinge on it."""
    seen = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        seen.append([(f.kind, f.layer, f.step) for f in bn.train(name, steps=25).findings])
    assert seen[0] == seen[1], seen
