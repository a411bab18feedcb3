"""``nan_loss``: the first non-finite loss (NaN, ±Inf, or ``null`` in a log), with the module
(or ``"loss_fn"``) and the op where the first non-finite value appeared (``NonfiniteOrigin``)."""

import math

from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.rules.base import Rule

FIXES = {
    "log": "clamp the argument of log (x.clamp_min(1e-12)) or use a fused loss (log_softmax, "
           "binary_cross_entropy_with_logits)",
    "div": "guard the denominator (x / (d + eps), or d.clamp_min(eps))",
    "exp": "use logsumexp / torch.softmax instead of exp, or subtract the maximum first",
    "sqrt": "take sqrt of x.clamp_min(eps) (or of x**2 + eps)",
    "rsqrt": "add eps before rsqrt",
    "pow": "check the base's sign and size before pow (clamp it)",
    "input": "the batch itself contains NaN/Inf: clean the data (torch.nan_to_num, drop the rows) or fix the loader",
}
DIVERGED = "an earlier update diverged: lower the learning rate or clip the gradient norm"


class NanLoss(Rule):
    KIND = "nan_loss"
    SIGNALS = ("Loss", "flags", "NonfiniteOrigin")

    def __init__(self):
        self.done = False

    def observe(self, step, entry, history):
        if self.done:
            return []
        loss = entry.get("Loss")
        # a null loss (a log written by a tool that writes NaN as null) is non-finite, as the history reads it
        bad = "nonfinite_loss" in (entry.get("flags") or []) or ("Loss" in entry and (
            loss is None or isinstance(loss, (int, float)) and not math.isfinite(float(loss))))
        if not bad:
            return []
        self.done = True
        origin = entry.get("NonfiniteOrigin") if isinstance(entry.get("NonfiniteOrigin"), dict) else {}
        module, op = origin.get("module"), origin.get("op")
        layer = None if module in (None, "input") else module
        if origin.get("params_nonfinite"):
            suggestion = DIVERGED
        else:
            suggestion = FIXES.get(op, "find the operation named here and guard its argument")
        where = {"input": "in the model's input", "loss_fn": "in the loss function"}.get(
            module, f"first in the output of {module!r}" if module is not None else
            "in a forward pass no hook watched (its module is unknown)" if origin else "(origin not tracked)")
        if "rank" in origin:  # (torch.distributed: the rank that saw it first, at its step)
            where += f" (at step {origin.get('step')}, in the part of the batch of rank {origin['rank']})"
        return [Finding(
            self.KIND, layer, step, "error",
            f"the loss is {loss if loss is not None else 'non-finite'} at step {step}: the first non-finite value "
            f"appeared {where}" + (f", made by {op!r}" if op and op != "input" else ""),
            suggestion, {"module": module, "op": op, "params_nonfinite": bool(origin.get("params_nonfinite"))},
        )]
