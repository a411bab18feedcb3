"""experiments.precedence: every pair the diagnosis orders by is what its run measured."""

import pytest

from cockpit_lite.diagnosis.precedence import CAUSES
from experiments import precedence

PAIRS = sorted((consequence, cause) for consequence, causes in CAUSES.items() for cause in causes)


def test_every_pair_has_its_run():
    assert sorted(precedence.EVIDENCE) == PAIRS


@pytest.mark.parametrize("consequence, cause", PAIRS, ids=[f"{c}<-{k}" for c, k in PAIRS])
def test_the_cause_s_fix_clears_the_consequence(consequence, cause):
    name, seed = precedence.EVIDENCE[consequence, cause]
    found = precedence.kinds(name, seed)
    assert {consequence, cause} <= set(found), found
    assert consequence not in precedence.kinds(name, seed, cause)


def test_the_command_prints_a_row_per_multi_finding_run(capsys):
    precedence.main(["--seeds", "1", "--only", "unnormalized_offset_synthetic"])
    out = capsys.readouterr().out
    assert "unnormalized_offset_synthetic | 0 | dead_relu, unnormalized_inputs |" in out
    assert "unnormalized_inputs -> none" in out
