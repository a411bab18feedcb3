"""Every threshold named in a rule is documented in the table of ``thresholds``."""

import re

from cockpit_lite.diagnosis import RULES, thresholds


def test_every_rule_has_a_table_row():
    table = thresholds.__doc__
    for rule in RULES:
        assert f"| {rule.KIND} |" in table, rule.KIND


def test_every_constant_is_named_in_the_table():
    names = [n for n in vars(thresholds) if n.isupper()]
    documented = set(re.findall(r"``([A-Z_]+)``", thresholds.__doc__))
    assert set(names) - documented <= {"SUSTAIN", "MIN_STEPS", "NOISE_WINDOW", "EOS", "EOS_RECORDS"} | documented
