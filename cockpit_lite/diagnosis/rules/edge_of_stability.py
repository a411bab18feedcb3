"""``edge_of_stability``: η λ_max ≥ ``EOS`` (1 + β) for SGD with learning rate η and
momentum β (Cohen et al. 2021), on ``EOS_RECORDS`` records where ``HessMaxEV`` is tracked.
The message quotes λ_max and η of the first such record, the step it names.

Severity ``info`` while the loss still falls (the median of its last 3 records below
``LEARNING`` (0.9) L₀): gradient descent trains at the edge of stability as a rule, its loss
falling over the long run while λ_max rises back to 2/η after any lower rate (progressive
sharpening); ``warning`` when the loss does not fall."""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import Streak, finite, fmt, plain
from cockpit_lite.diagnosis.rules.base import Rule


def severity(history):
    loss, ref = history.median_recent_loss(3), history.loss_ref
    return "info" if finite(loss) and finite(ref) and loss < T.LEARNING * ref else "warning"


class EdgeOfStability(Rule):
    KIND = "edge_of_stability"
    SIGNALS = ("HessMaxEV", "GradPresence", "learning_rate")

    def __init__(self):
        self.lr, self.momentum, self.sgd = None, 0.0, True
        self.count, self.first = 0, None

    def observe(self, step, entry, history):
        presence = entry.get("GradPresence")
        if isinstance(presence, dict) and presence.get("lr") is not None:
            self.lr, self.sgd = presence["lr"], presence.get("optimizer") in (None, "SGD")
            self.momentum = presence.get("momentum") or 0.0
        elif finite(entry.get("learning_rate")):
            self.lr = float(entry["learning_rate"])
        sharpness = entry.get("HessMaxEV")
        if not (finite(sharpness) and self.lr and self.sgd):
            return []
        product = self.lr * float(sharpness)
        limit = T.EOS * (1 + self.momentum)
        if product < limit:
            return []
        self.count += 1
        if self.first is None:
            self.first = (step, self.lr, float(sharpness), product)
        if self.count != T.EOS_RECORDS:
            return []
        at, lr, lam, first_product = self.first  # every number quoted is the named step's
        return [Finding(
            self.KIND, None, at, severity(history),
            f"lr * lambda_max = {fmt(lr)} * {fmt(lam)} = {fmt(first_product)} >= {fmt(limit)} (the stability "
            f"limit 2(1+momentum)) at step {at}, and {fmt(product)} at step {step}: the step size is at the edge of "
            "stability",
            f"lower the learning rate below {fmt(limit / lam, 2)} if the loss oscillates; or accept it (training at "
            "the edge of stability is common) and watch the loss",
            {"lr": plain(lr), "lambda_max": plain(lam), "product": plain(first_product), "limit": plain(limit),
             "step_confirmed": step, "product_confirmed": plain(product)},
        )]
