"""Parameters records copies of the parameter values."""

import numpy as np

import problems
from cockpit_lite.quantities import Parameters


def test_records_parameter_values_before_the_step():
    cp, snapshots = problems.run(problems.make("cnn", 2), [Parameters()])
    for step, snapshot in snapshots.items():
        for recorded, expected in zip(cp.get_output()[step]["Parameters"], snapshot.params):
            np.testing.assert_array_equal(recorded, expected.numpy())
