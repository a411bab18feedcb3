"""``noise_dominates``: the gradient noise scale B_simple = tr Σ / ‖G‖² (McCandlish et
al. 2018) is ≥ ``NOISE_RATIO`` times the batch size B over ``NOISE_WINDOW`` records.

tr Σ from ``GradVariance`` (unbiased), ‖g‖² of the mini-batch gradient from ``GradNorm``;
a batch's ‖g‖² overestimates the true ‖G‖² by tr Σ / B, so over the window
``B_simple = mean tr Σ / (mean ‖g‖² − mean tr Σ / B)`` (∞ when the noise explains all
of ‖g‖²). Without ``GradVariance``, ``NormTest² = tr Σ / (B ‖g‖²)`` gives the same parts.
"""

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import finite, fmt, plain, rss
from cockpit_lite.diagnosis.rules.base import Rule


class NoiseDominates(Rule):
    KIND = "noise_dominates"
    SIGNALS = ("GradVariance", "GradNorm", "batch", "NormTest")

    def __init__(self):
        self.parts = []
        self.done = False

    def observe(self, step, entry, history):
        parts = None if self.done else _parts(entry)
        if parts is None:
            return []
        self.parts.append((step, *parts))
        window = self.parts[-T.NOISE_WINDOW:]
        if len(window) < T.NOISE_WINDOW:
            return []
        batch = window[-1][3]
        trace = sum(w[1] for w in window) / len(window)
        signal = sum(w[2] for w in window) / len(window) - trace / batch
        ratio = trace / (signal * batch) if signal > 0 else float("inf")
        if ratio < T.NOISE_RATIO:
            return []
        self.done = True
        simple = ratio * batch
        return [Finding(
            self.KIND, None, window[0][0], "warning",
            f"the gradient noise scale B_simple = tr(Sigma)/|G|^2 is {fmt(ratio, 2)}x the batch size "
            f"({fmt(simple, 3)} vs B = {batch}) over steps {window[0][0]}-{step}: each step follows mostly noise",
            f"increase the batch size towards ~{fmt(min(simple, 1e6), 2)} (or accumulate gradients, or lower the "
            f"learning rate by ~{fmt(min(ratio, 1e6), 2)}x)",
            {"noise_over_batch": plain(ratio), "B_simple": plain(simple), "batch_size": batch},
        )]


def _parts(entry):
    """``(tr Σ, ‖g‖², B)`` of one record, or ``None``."""
    batch = (entry.get("batch") or {}).get("size")
    grads = entry.get("GradNorm")
    if not batch or not isinstance(grads, (list, tuple)):
        return None
    squared = rss(grads) ** 2
    variance, norm_test = entry.get("GradVariance"), entry.get("NormTest")
    if isinstance(variance, (list, tuple)):
        trace = sum(float(v) for v in variance)
    elif finite(norm_test):
        trace = float(norm_test) ** 2 * batch * squared
    else:
        return None
    return (trace, squared, batch) if finite(trace) and finite(squared) else None
