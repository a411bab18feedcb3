"""``GradNorm``: the gradient norm of every parameter tensor."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity


class GradNorm(SingleStepQuantity):
    """Per parameter tensor ``‖g‖₂``, a list in parameter order.

    The whole-network norm is the root of the sum of squares of the list.
    """

    SCALED_BACKWARD = True

    def compute(self, step, data):
        return Output(list(data.grad_norms))
