"""experiments.precedence: every pair the diagnosis orders by is what its run measured."""

import pytest

from cockpit_lite.diagnosis.precedence import CAUSES, key
from experiments import precedence

PAIRS = sorted((consequence, cause) for consequence, causes in CAUSES.items() for cause in causes)


def test_every_pair_has_its_run():
    assert sorted(precedence.EVIDENCE) == PAIRS


@pytest.mark.parametrize("consequence, cause", PAIRS, ids=[f"{c}<-{k}" for c, k in PAIRS])
def test_the_cause_s_fix_clears_the_consequence(consequence, cause):
    suite, name, seed = precedence.EVIDENCE[consequence, cause]
    found = precedence.findings(suite, name, seed)
    assert {consequence, cause} <= {key(f) for f in found} | {f.kind for f in found}, found
    fixed = precedence.findings(suite, name, seed, next(f for f in found if key(f) == cause))
    assert consequence not in precedence.kinds(fixed), fixed


def test_the_command_prints_a_row_per_multi_finding_run_and_the_pairs(capsys):
    precedence.main(["--seeds", "1", "--suite", "toy", "--only", "unnormalized_offset_synthetic"])
    out = capsys.readouterr().out
    assert "toy | unnormalized_offset_synthetic | 0 | unnormalized_inputs, dead_relu |" in out
    assert "unnormalized_inputs -> none" in out
    assert "the first-listed finding's fix clears the run: 1" in out
    assert "`dead_relu` | `unnormalized_inputs` | 1 of 1 |" in out
