"""``saturated_activations``: at least ``SATURATED`` of a tanh/sigmoid module's outputs (of a
recurrent layer's gate values) sit in the flat tails (derivative < 2 % of its peak), sustained."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.rules.activation_rule import ActivationRule


class SaturatedActivations(ActivationRule):
    KIND = "saturated_activations"
    FIELD = "saturated"
    THRESHOLD = T.SATURATED
    SUGGESTION = ("scale the initialisation down (Xavier/Glorot for tanh/sigmoid), normalise the inputs, or add "
                  "a normalisation layer before the activation")

    def describe(self, module, type_name, value, start):
        what = "gate values" if type_name in ("LSTM", "GRU") else "outputs"
        return (f"{module!r} ({type_name}): {100 * value:.0f}% of its {what} are saturated (flat tails, almost "
                f"no gradient) since step {start}")
