"""``noise_dominates``: the gradient noise scale B_simple = tr Σ / ‖g‖² (McCandlish et
al. 2018) is ≥ ``NOISE_RATIO`` times the batch size B, median over ``NOISE_WINDOW``
records (tr Σ from ``GradVariance``; without it ``NormTest²`` = B_simple / B)."""

import statistics

from cockpit_lite.diagnosis import thresholds as T
from cockpit_lite.diagnosis.finding import Finding
from cockpit_lite.diagnosis.history import finite, fmt, plain, rss
from cockpit_lite.diagnosis.rules.base import Rule


class NoiseDominates(Rule):
    KIND = "noise_dominates"
    SIGNALS = ("GradVariance", "GradNorm", "batch", "NormTest")

    def __init__(self):
        self.values = []

    def observe(self, step, entry, history):
        ratio = _noise_over_batch(entry)
        if ratio is None:
            return []
        self.values.append((step, ratio))
        window = self.values[-T.NOISE_WINDOW:]
        if len(window) < T.NOISE_WINDOW:
            return []
        median = statistics.median(v for _, v in window)
        if median < T.NOISE_RATIO:
            return []
        self.values = []
        batch = (entry.get("batch") or {}).get("size")
        simple = median * batch if batch else None
        return [Finding(
            self.KIND, None, window[0][0], "warning",
            f"the gradient noise scale B_simple = tr(Sigma)/|g|^2 is {fmt(median, 2)}x the batch size"
            + (f" ({fmt(simple, 3)} vs B = {batch})" if batch else "")
            + f" over steps {window[0][0]}-{step}: each step follows mostly noise",
            f"increase the batch size towards ~{fmt(simple, 2) if simple else 'B_simple'} (or lower the learning "
            f"rate by ~{fmt(median, 2)}x / accumulate gradients)",
            {"noise_over_batch": plain(median), "B_simple": plain(simple), "batch_size": batch},
        )]


def _noise_over_batch(entry):
    batch = (entry.get("batch") or {}).get("size")
    variance, grads = entry.get("GradVariance"), entry.get("GradNorm")
    if batch and isinstance(variance, (list, tuple)) and isinstance(grads, (list, tuple)):
        squared = rss(grads) ** 2
        if squared > 0 and finite(squared):
            value = sum(float(v) for v in variance) / squared / batch
            return value if finite(value) else None
    norm_test = entry.get("NormTest")
    if finite(norm_test):
        return float(norm_test) ** 2
    return None
