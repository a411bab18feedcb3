"""``cockpit_lite.intervals``: the intervals of recorded estimates, against scipy's Student-t and the
documented formulas; and that the module stays free of torch (the instruments import it)."""

import math
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats

from cockpit_lite import intervals


@pytest.mark.parametrize("df", [1, 7, 15, 2.5])
@pytest.mark.parametrize("coverage", [0.6827, 0.95, 0.9973])
def test_quantile_is_students_t(df, coverage):
    assert intervals.quantile(df, coverage) == pytest.approx(scipy.stats.t.ppf((1 + coverage) / 2, df), rel=1e-10)


def test_a_record_without_degrees_of_freedom_takes_the_normal_quantile():
    assert intervals.quantile(None, 0.9973) == pytest.approx(scipy.stats.norm.ppf(0.99865), rel=1e-10)
    assert intervals.quantile(math.inf, 0.95) == pytest.approx(1.959964, rel=1e-6)
    assert intervals.quantile(7) == pytest.approx(scipy.stats.t.ppf((1 + intervals.COVERAGE) / 2, 7), rel=1e-10)


def test_linear_interval():
    q = scipy.stats.t.ppf(0.975, 7)
    low, high = intervals.interval([2.0, -1.0], [0.5, 0.1], 7, 0.95)
    assert low == pytest.approx([2 - 0.5 * q, -1 - 0.1 * q]) and high == pytest.approx([2 + 0.5 * q, -1 + 0.1 * q])


def test_log_interval_is_the_t_interval_of_the_log():
    """value · exp(±q se/value); [0, q se] at 0; a negative value's is the mirror image; NaN stays NaN."""
    q = scipy.stats.t.ppf(0.99865, 7)
    low, high = intervals.interval([2.0, 0.0, -2.0, math.nan], [0.5, 0.3, 0.5, 0.1], 7, 0.9973, scale=intervals.LOG)
    factor = math.exp(q * 0.25)
    assert low[:3] == pytest.approx([2 / factor, 0.0, -2 * factor], rel=1e-12)
    assert high[:3] == pytest.approx([2 * factor, 0.3 * q, -2 / factor], rel=1e-12)
    assert np.isnan(low[3]) and np.isnan(high[3])
    assert low[0] * high[0] == pytest.approx(4.0)  # symmetric around the value on the log scale


def test_the_module_imports_no_torch():
    code = "import sys, cockpit_lite.intervals; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
