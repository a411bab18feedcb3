"""``noise_dominates``: the gradient noise scale B_simple = tr Σ / ‖G‖² (McCandlish et
al. 2018) is ≥ ``NOISE_RATIO`` times the batch size B over ``NOISE_WINDOW`` records.

tr Σ from ``GradVariance`` (unbiased), ‖g‖² of the mini-batch gradient from ``GradNorm``;
a batch's ‖g‖² overestimates the true ‖G‖² by tr Σ / B, so over the window
``B_simple = mean tr Σ / (mean ‖g‖² − mean tr Σ / B)`` (∞ when the noise explains all
of ‖g‖²). A ratio above ``NOISE_QUOTE`` (or ∞) quotes no batch size or learning-rate factor:
the mean gradient is then indistinguishable from zero and any number would be noise.
Severity ``info`` while the loss still falls (the median of its last 3 records, or of the
window's, below ``LEARNING`` (0.9) L₀: the first reacts to a fast fall, the second does not swing with
the batches' noise, which is what this rule is about), ``warning`` otherwise.
Without ``GradVariance``, ``NormTest² = tr Σ / (B ‖g‖²)`` gives the same parts.
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
        ref = history.loss_ref
        loss = min(history.median_recent_loss(3), history.median_recent_loss(T.NOISE_WINDOW))
        learning = finite(ref) and finite(loss) and loss < T.LEARNING * ref
        severity = "info" if learning else "warning"  # a loss that falls anyway: the noise costs speed only
        span = f"over steps {window[0][0]}-{step}"
        if finite(ratio) and ratio <= T.NOISE_QUOTE:
            simple = ratio * batch
            message = (f"the gradient noise scale B_simple = tr(Sigma)/|G|^2 is {fmt(ratio, 2)}x the batch size "
                       f"({fmt(simple, 3)} vs B = {batch}) {span}: each step follows mostly noise")
            suggestion = (f"increase the batch size towards ~{fmt(simple, 2)} (or accumulate gradients), or lower the "
                          f"learning rate by ~{fmt(ratio, 2)}x")
        else:  # the noise explains all (or nearly all) of |g|^2: no meaningful size to quote
            simple = ratio * batch if finite(ratio) else float("inf")
            message = (f"the mini-batch gradients' variance tr(Sigma)/B ({fmt(trace / batch)}) explains "
                       f"{'nearly all' if finite(ratio) else 'all'} of their squared norm "
                       f"({fmt(trace / batch + max(signal, 0.0))}, mean) {span}: the mean gradient is not measurably "
                       f"different from zero at B = {batch}, so each step follows noise")
            suggestion = ("if the loss has stopped improving, use a several times larger batch (or accumulate "
                          "gradients) or a lower learning rate; near a minimum this is expected")
        return [Finding(
            self.KIND, None, window[0][0], severity, message, suggestion,
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
