"""The diagnosis rules, one file each; ``RULES`` lists them (a new rule: one file and one line here)."""

from cockpit_lite.diagnosis.rules.dead_relu import DeadRelu
from cockpit_lite.diagnosis.rules.edge_of_stability import EdgeOfStability
from cockpit_lite.diagnosis.rules.exploding_gradients import ExplodingGradients
from cockpit_lite.diagnosis.rules.lr_too_high import LrTooHigh
from cockpit_lite.diagnosis.rules.lr_too_low import LrTooLow
from cockpit_lite.diagnosis.rules.missing_zero_grad import MissingZeroGrad
from cockpit_lite.diagnosis.rules.nan_loss import NanLoss
from cockpit_lite.diagnosis.rules.noise_dominates import NoiseDominates
from cockpit_lite.diagnosis.rules.overfitting import Overfitting
from cockpit_lite.diagnosis.rules.saturated_activations import SaturatedActivations
from cockpit_lite.diagnosis.rules.shuffled_labels import ShuffledLabels
from cockpit_lite.diagnosis.rules.unnormalized_inputs import UnnormalizedInputs
from cockpit_lite.diagnosis.rules.vanishing_gradients import VanishingGradients

RULES = (
    NanLoss, LrTooHigh, LrTooLow, ExplodingGradients, VanishingGradients, DeadRelu, SaturatedActivations,
    UnnormalizedInputs, MissingZeroGrad, ShuffledLabels, NoiseDominates, EdgeOfStability, Overfitting,
)
"""Rule classes, in reporting order."""
