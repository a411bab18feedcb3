"""``Loss``: the mini-batch loss L."""

from cockpit_lite.quantities.base import Output, SingleStepQuantity


class Loss(SingleStepQuantity):
    """The mini-batch loss ``L`` as passed in ``info["loss"]``."""

    INFO = ("loss",)

    def compute(self, step, data):
        return Output(data.info.require("loss", self.name).detach().reshape(()))
