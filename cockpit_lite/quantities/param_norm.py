"""``ParamNorm``: the norm of every parameter tensor."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity
from cockpit_lite.utils.norms import norms


class ParamNorm(SingleStepQuantity):
    """Per parameter tensor ``‖θ‖₂`` (a list in parameter order), at the step's start.

    With ``UpdateSize`` it gives the update-to-parameter ratio ``‖θ_{t+1} − θ_t‖ / ‖θ_t‖``
    per layer (Karpathy's rule of thumb: about 1e-3 for a healthy learning rate).
    """

    NEEDS_BACKWARD = False

    def compute(self, step, data):
        return Output(norms(p.detach() for p in data.params))
