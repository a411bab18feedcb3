"""``dead_relu``: at least ``DEAD`` of a ReLU module's units never fire in a batch, sustained."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.rules.activation_rule import ActivationRule


class DeadRelu(ActivationRule):
    KIND = "dead_relu"
    FIELD = "dead"
    THRESHOLD = T.DEAD
    SUGGESTION = ("lower the learning rate, initialise biases at 0 (or small positive), or use LeakyReLU/GELU; "
                  "check the layer feeding it for a large negative bias")

    def describe(self, module, type_name, value, start):
        return (f"{module!r} ({type_name}): {100 * value:.0f}% of its units have not fired on any sample of the "
                f"batch since step {start}: they are dead and pass no gradient")
