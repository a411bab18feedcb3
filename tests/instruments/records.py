"""Synthetic but realistic records for the instrument tests (no torch needed).

``full_record`` has every quantity over 60 steps on realistic schedules (dense,
every k steps, logarithmic), per-layer values and per-layer histograms, a NaN loss
flagged at one step and epoch keys every 20 steps. ``economy_record`` has only what
``configuration("economy")`` tracks. ``write_jsonl`` writes a record the way a
training run does (the two-step quantities one line later).
"""

import math

import numpy as np

from cockpit_lite.log import JSONLinesWriter

PARAMS = [
    {"name": "conv1.weight", "shape": [16, 3, 3, 3]},
    {"name": "conv1.bias", "shape": [16]},
    {"name": "conv2.weight", "shape": [32, 16, 3, 3]},
    {"name": "conv2.bias", "shape": [32]},
    {"name": "fc.weight", "shape": [10, 512]},
    {"name": "fc.bias", "shape": [10]},
]
NAMES = [p["name"] for p in PARAMS]
N_LAYERS = len(PARAMS)
NAN_STEP = 33
EPOCH_STEPS = (0, 20, 40, 59)
LOG_STEPS = (0, 1, 2, 3, 5, 8, 13, 21, 34, 55)

ECONOMY = ("Alpha", "Distance", "GradHist1d", "GradNorm", "InnerTest", "Loss", "NormTest", "OrthoTest",
           "UpdateSize", "MeanGSNR", "GradVariance")


def _hist1d(values, bins=100, lo=-2.0, hi=2.0):
    clipped = int(((values < lo) | (values > hi)).sum())
    hist, edges = np.histogram(np.clip(values, lo, hi), bins=bins, range=(lo, hi))
    return {"hist": hist.astype(np.int64), "edges": edges, "clipped": clipped, "nonfinite": 0}


def _hist2d(grads, params, bins=(40, 50), ranges=((-1.0, 1.0), (-2.0, 2.0))):
    (glo, ghi), (plo, phi) = ranges
    clipped = int(((grads < glo) | (grads > ghi) | (params < plo) | (params > phi)).sum())
    hist, xedges, yedges = np.histogram2d(np.clip(grads, glo, ghi), np.clip(params, plo, phi), bins=bins,
                                          range=ranges)
    return {"hist": hist.astype(np.int64), "edges": [xedges, yedges], "clipped": clipped, "nonfinite": 0}


def _layer_samples(rng, step, n=4000):
    """Per-layer (gradient elements, parameter values) samples at ``step``."""
    out = []
    for j in range(N_LAYERS):
        scale = 0.05 * (1 + j) * math.exp(-step / 40) + 0.01
        grads = rng.laplace(0.0, scale, size=n)
        if j == 4 and step > 45:  # the last layer's gradients grow heavy tails late in training
            grads[:40] *= 60
        params = rng.normal(0.0, 0.3 + 0.1 * j, size=n) if j % 2 == 0 else rng.normal(0.05 * step / 60, 0.02, n)
        out.append((grads, params))
    return out


def full_record(n_steps=60, seed=0):
    """Every quantity, realistic schedules, per-layer values, a flagged NaN loss."""
    rng = np.random.default_rng(seed)
    record = {}
    distance = np.zeros(N_LAYERS)
    t0 = 1_700_000_000.0
    for step in range(n_steps):
        e = record.setdefault(step, {})
        decay = math.exp(-step / 20)
        loss = 2.3 * decay + 0.15 + 0.08 * rng.standard_normal()
        e["Loss"] = float("nan") if step == NAN_STEP else float(loss)
        if step == NAN_STEP:
            e["flags"] = ["nonfinite_loss"]
        e["Time"] = t0 + 0.25 * step + 0.01 * rng.random()
        layer_scale = np.array([1.0, 0.1, 0.7, 0.05, 0.4, 0.02])
        grad_norm = layer_scale * (0.3 + 2 * decay) * np.exp(0.1 * rng.standard_normal(N_LAYERS))
        e["GradNorm"] = grad_norm.tolist()
        e["Distance"] = distance.tolist()
        update = layer_scale * 0.05 * (0.3 + decay) * np.exp(0.2 * rng.standard_normal(N_LAYERS))
        distance = distance + update * (0.6 + 0.4 * rng.random(N_LAYERS))
        if step < n_steps - 1:  # known one step later
            e["UpdateSize"] = update.tolist()
            alpha = 0.3 + 0.5 * rng.standard_normal()
            if step in (7, 19):
                alpha = -1.0  # concave fits
            if step == 25:
                alpha = 4.2  # an outlier beyond the clipping range
            e["Alpha"] = float(alpha)
        norm_test = 0.4 + 1.6 * (1 - decay) + 0.1 * rng.random()
        e["NormTest"] = float(norm_test)
        e["InnerTest"] = float(0.5 * norm_test + 0.05 * rng.random())
        e["OrthoTest"] = float(1.3 * norm_test + 0.1 * rng.random())
        gsnr = 2.0 * decay + 0.05
        e["MeanGSNR"] = float(gsnr * math.exp(0.1 * rng.standard_normal()))
        e["GradVariance"] = (layer_scale**2 * 40 * (0.5 + decay) * np.exp(0.1 * rng.standard_normal(N_LAYERS))).tolist()
        e["EarlyStopping"] = float(-2.0 * decay + 0.4 + 0.2 * rng.standard_normal())
        layers = {
            "NormTest": (norm_test * np.exp(0.3 * rng.standard_normal(N_LAYERS))).tolist(),
            "MeanGSNR": (gsnr * np.exp(0.5 * rng.standard_normal(N_LAYERS))).tolist(),
        }
        if step % 2 == 0:
            e["CABS"] = float(32 + 200 * (1 - decay) + 10 * rng.standard_normal())
        if step % 5 == 0:
            samples = _layer_samples(rng, step)
            per_layer = [_hist1d(g) for g, _ in samples]
            e["GradHist1d"] = _hist1d(np.concatenate([g for g, _ in samples]))
            layers["GradHist1d"] = per_layer
            trace = layer_scale * 50 * (1.5 - decay) - (5.0 if step == 0 else 0.0)
            e["HessTrace"] = trace.tolist()
            e["TICDiag"] = float(3.0 + 2 * decay + 0.3 * rng.standard_normal())
            e["TICTrace"] = float(1.0 + 0.5 * decay + 0.1 * rng.standard_normal())
            layers["TICDiag"] = (e["TICDiag"] / N_LAYERS * np.exp(0.3 * rng.standard_normal(N_LAYERS))).tolist()
            if step % 10 == 0:
                e["GradHist2d"] = _hist2d(np.concatenate([g for g, _ in samples]),
                                          np.concatenate([p for _, p in samples]))
                layers["GradHist2d"] = [_hist2d(g, p) for g, p in samples]
        if step in LOG_STEPS:
            e["HessMaxEV"] = float(5 + 40 * (1 - decay) + rng.standard_normal())
        if step == 0:
            e["Parameters"] = [[[0.1, -0.2], [0.3, 0.0]], [0.0, 0.0]]
        if step in EPOCH_STEPS:
            epoch = EPOCH_STEPS.index(step)
            e.update({
                "epoch_count": epoch,
                "train_loss": float(2.3 * decay + 0.12),
                "valid_loss": float(2.3 * decay + 0.2 + 0.002 * step),
                "test_loss": float(2.3 * decay + 0.21 + 0.002 * step),
                "train_accuracy": float(0.1 + 0.85 * (1 - decay)),
                "valid_accuracy": float(0.1 + 0.78 * (1 - decay)),
                "test_accuracy": float(0.1 + 0.77 * (1 - decay)),
                "learning_rate": (0.1, 0.1, 0.03, 0.01)[epoch],
            })
        e["layers"] = layers
    return record



def one_epoch_record(n_steps=44):
    """``full_record`` after one epoch: the epoch values (losses, accuracies, learning rate) are
    logged once, at the last step, as a one-epoch run of the demo logs them."""
    record = full_record(n_steps)
    epoch_keys = ("epoch_count", "train_loss", "valid_loss", "test_loss", "train_accuracy", "valid_accuracy",
                  "test_accuracy", "learning_rate")
    last = max(record)
    for step, entry in record.items():
        for key in epoch_keys:
            entry.pop(key, None)
    record[last].update({"epoch_count": 0, "train_loss": 1.16, "test_loss": 1.12, "train_accuracy": 0.734,
                         "test_accuracy": 0.753, "learning_rate": 0.2})
    return record


#: Findings as the diagnosis writes them for the README's first example (inputs on a 0..255 scale)
#: and for a run at the edge of stability: sentence-long messages and fixes.
LONG_FINDINGS = [
    {"kind": "unnormalized_inputs", "layer": None, "step": 0, "severity": "warning",
     "message": "the model's inputs have mean 122 and std 66.8 (range 1.13 .. 254) at step 1, far from unit scale",
     "suggestion": "standardise the inputs (subtract the training mean, divide by the std; images: divide by 255 "
                   "first)", "evidence": {}},
    {"kind": "lr_too_high", "layer": None, "step": 1, "severity": "error",
     "message": "the loss spiked to 3.65e+03 at step 1, 89x its first value 41",
     "suggestion": "lower the learning rate (by 3-10x), add warm-up, or clip the gradient norm", "evidence": {}},
    {"kind": "edge_of_stability", "layer": None, "step": 39, "severity": "warning",
     "message": "lr * lambda_max = 0.2 * 11.7 = 2.34 >= 2 (the stability limit 2(1+momentum)) at step 39, and "
                "4.41 at step 40: the step size is at the edge of stability",
     "suggestion": "lower the learning rate below 0.17 if the loss oscillates; or accept it (training at the edge "
                   "of stability is common) and watch the loss", "evidence": {}},
]


def with_findings(record, found=LONG_FINDINGS):
    """A copy of ``record`` with ``found`` written at their steps."""
    record = {step: dict(entry) for step, entry in record.items()}
    for finding in found:
        record[finding["step"]]["findings"] = record[finding["step"]].get("findings", []) + [finding]
    return record


def full_record_without_tic(n_steps=60):
    """``full_record`` of a model without an exact curvature diagonal: both TICs NaN at every step,
    each step flagged with the sentence-long reason (as the Cockpit records it)."""
    record = full_record(n_steps)
    reason = ("TICTrace: not computed: the model (TransformerClassifier) is not BackPACK-extended, so "
              "curvature='auto' has no exact Hessian diagonal, and TICTrace from an estimated one "
              "(Hutchinson's) would not be an estimate of the ratio. Fix: wrap the model and the loss "
              "module in cockpit_lite.extend(...)")
    for entry in record.values():
        if "TICDiag" in entry:
            entry["TICDiag"] = entry["TICTrace"] = float("nan")
            entry.setdefault("layers", {}).pop("TICDiag", None)
            entry.setdefault("flags", []).extend([reason, reason.replace("TICTrace", "TICDiag")])
    return record

def economy_record(n_steps=60, seed=1):
    """Only the economy quantities (no per-layer histograms, no epoch keys)."""
    full = full_record(n_steps, seed)
    out = {}
    for step, entry in full.items():
        kept = {k: v for k, v in entry.items() if k in ECONOMY or k == "flags"}
        layers = {k: v for k, v in entry.get("layers", {}).items() if k in ECONOMY and k != "GradHist1d"}
        if layers:
            kept["layers"] = layers
        out[step] = kept
    return out


def subsampled_economy_record(n_steps=60, seed=1, k=8, batch=64):
    """``economy_record`` as ``Cockpit(samples=k)`` records it: the per-sample quantities with
    standard errors (10 % of the value), ``k − 1`` degrees of freedom and log-scale intervals in
    ``meta``, histograms without."""
    out = economy_record(n_steps, seed)
    for entry in out.values():
        meta = entry.setdefault("meta", {})
        for name in ("NormTest", "InnerTest", "OrthoTest"):
            if name in entry:
                layers = entry.get("layers", {}).get(name, [])
                meta[name] = {"samples": k, "of": batch, "se": 0.1 * abs(entry[name]), "df": k - 1,
                              "layers_se": [0.1 * abs(v) for v in layers], "scale": "log"}
        if "GradVariance" in entry:
            meta["GradVariance"] = {"samples": k, "of": batch, "se": [0.1 * v for v in entry["GradVariance"]],
                                    "total_se": 0.1 * sum(entry["GradVariance"]), "df": k - 1, "scale": "log"}
        if "GradHist1d" in entry:
            meta["GradHist1d"] = {"samples": k, "of": batch, "se": None}
    return out


def write_jsonl(path, record, params=PARAMS, late=("Alpha", "UpdateSize")):
    """Write ``record`` as a training run would: one line per step, ``late`` keys one step later."""
    writer = JSONLinesWriter(path, {"params": params, "quantities": sorted({k for e in record.values() for k in e})})
    steps = sorted(record)
    for i, step in enumerate(steps):
        entry = record[step]
        writer.append(step, {k: v for k, v in entry.items() if k not in late})
        if i > 0:
            previous = steps[i - 1]
            delayed = {k: v for k, v in record[previous].items() if k in late}
            if delayed:
                writer.append(previous, delayed)
    writer.close()
    return path


# ----------------------------------------------------------------------------- diagnosis runs


def diagnosis_schedule(step):
    """The default schedule of the diagnosis signals: the first 10 steps, then every 10th."""
    return step < 10 or step % 10 == 0


def _finding(kind, step, layer=None, severity="error", message=None):
    return {"kind": kind, "layer": layer, "step": step, "severity": severity,
            "message": message or f"{kind} since step {step}: a synthetic finding for the tests",
            "suggestion": "a synthetic fix, long enough to wrap onto a second line of the diagnosis panel "
                          "when the panel is narrow",
            "evidence": {}}


def diagnosis_record(n_steps=200, n_params=6, n_relu=3, n_tanh=1, broken=True, seed=2, every=None):
    """What ``Cockpit(model)`` records with its default signals only, on the diagnosis schedule.

    ``broken``: the ReLUs die after a blown-up step at ``n_steps // 10`` (with the
    findings the rules would make); otherwise a healthy run without findings.
    ``every``: record every ``every``-th step instead of the diagnosis schedule.
    """
    rng = np.random.default_rng(seed)
    spike = max(2, n_steps // 10)
    record = {}
    norms = 1.0 + rng.random(n_params) * 5
    relus = [f"features.{2 * i + 1}" for i in range(n_relu)]
    tanhs = [f"head.{i}" for i in range(n_tanh)]
    for step in range(n_steps):
        due = diagnosis_schedule(step) if every is None else step % every == 0
        if not due:
            continue
        decay = math.exp(-step / max(n_steps / 4, 1))
        dead_now = broken and step >= spike
        loss = 2.3 * decay + 0.2 + 0.05 * rng.standard_normal()
        if broken and step == spike:
            loss = 60.0
        elif dead_now:
            loss = 2.2 + 0.05 * rng.standard_normal()
        scale = np.geomspace(1.0, 1e-2 if not dead_now else 1e-6, n_params)
        grad = scale * (0.3 + decay) * np.exp(0.2 * rng.standard_normal(n_params))
        if dead_now:
            grad[: n_params // 2] = 0.0
        update = 0.1 * grad * (50 if broken and step == spike else 1)
        norms = norms + update * 0.1
        stats = {}
        for i, name in enumerate(relus):
            dead = min(1.0, 0.9 + 0.05 * i) if dead_now else 0.05 + 0.02 * rng.random()
            stats[name] = {"type": "ReLU", "mean": 0.3, "std": 0.5, "zeros": 0.5 + dead / 2, "dead": dead,
                           "saturated": None}
        for name in tanhs:
            stats[name] = {"type": "Tanh", "mean": 0.0, "std": 0.6, "zeros": 0.0, "dead": None,
                           "saturated": float(np.clip(0.1 + (0.6 if dead_now else 0.0) + 0.05 * rng.random(), 0, 1))}
        entry = {
            "Loss": float(loss),
            "GradNorm": grad.tolist(),
            "ParamNorm": norms.tolist(),
            "UpdateSize": update.tolist(),
            "ActivationStats": stats,
            "InputStats": {"mean": 0.1, "std": 1.0, "min": -3.0, "max": 3.0, "nonfinite": 0.0},
            "GradPresence": {"before": 0.0, "after": float(np.sqrt((grad**2).sum())), "stepped": 1,
                             "first_backward": 0.0, "optimizer": "SGD", "lr": 0.1, "momentum": 0.0},
        }
        if broken and step == spike:
            entry["findings"] = [_finding("lr_too_high", step)]
        if broken and step == spike + 10:
            entry["findings"] = [_finding("dead_relu", spike + 1, relus[0]),
                                 _finding("saturated_activations", spike + 1, tanhs[0] if tanhs else None,
                                          "warning")]
        record[step] = entry
    return record


def diagnosis_params(n_params=6):
    """Header ``params`` for a ``diagnosis_record`` (``features.k.weight`` / ``.bias``)."""
    return [{"name": f"features.{2 * (i // 2)}.{'weight' if i % 2 == 0 else 'bias'}", "shape": [4]}
            for i in range(n_params)]


def economy_with_diagnosis(n_steps=60):
    """``Cockpit(model, configuration("economy"))``: Cockpit's quantities plus the diagnosis signals."""
    record = economy_record(n_steps)
    signals = diagnosis_record(n_steps, n_params=N_LAYERS, broken=False)
    for step, entry in signals.items():
        merged = record.setdefault(step, {})
        for key, value in entry.items():
            merged.setdefault(key, value)
    return record
