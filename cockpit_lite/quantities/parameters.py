"""``Parameters``: the parameter values themselves."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity


class Parameters(SingleStepQuantity):
    """A copy of every tracked parameter tensor (array per parameter). Large: use a sparse schedule."""

    NEEDS_BACKWARD = False

    def compute(self, step, data):
        return Output(data.params_copy)
