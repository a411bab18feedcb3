"""``Loss``: the mini-batch loss L."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity


class Loss(SingleStepQuantity):
    """The mini-batch loss ``L`` as passed in ``info["loss"]``."""

    NEEDS_BACKWARD = False

    INFO = ("loss",)

    def __init__(self, track_schedule=None, verbose=False, required=True):
        """
        Args:
            required: ``False``: a step without ``info["loss"]`` records nothing instead of
                raising (as when the diagnosis tracks it on its own, ``diagnose=True``).
        """
        super().__init__(track_schedule, verbose)
        self.required = required

    def needs(self, step, info):
        if not self.required and "loss" not in info:
            return None
        return super().needs(step, info)

    def compute(self, step, data):
        return Output(data.info.require("loss", self.name).detach().reshape(()))
