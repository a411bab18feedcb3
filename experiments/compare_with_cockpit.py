"""Same numbers as the original Cockpit: run both on identical training runs and compare.

Usage: ``python -m experiments.compare_with_cockpit`` prints, per quantity, the
largest relative difference between cockpit-lite and ``cockpit-for-pytorch``
(1.0.2) over several problems, batch sizes, both loss reductions and several
steps, in float64. Needs ``cockpit-for-pytorch`` (``import cockpit`` needs
``setuptools<81``).

``HessMaxEV`` is compared with the exact largest eigenvalue
(``torch.linalg.eigvalsh`` of the autograd Hessian) instead: Cockpit's power
iteration stops when two consecutive estimates agree to 1e-3, which can be far
from converged (it always stays below the exact value), and it targets the
eigenvalue of largest magnitude. The table shows both. ``Time`` is not compared.
"""

import argparse
import warnings

import numpy as np
import torch
from backpack import disable
from torch import nn

from cockpit_lite import Cockpit, configuration, extend

SHARED = (
    "Loss", "GradNorm", "Distance", "UpdateSize", "NormTest", "InnerTest", "OrthoTest",
    "GradHist1d", "GradHist2d", "MeanGSNR", "Alpha", "HessTrace", "TICDiag", "TICTrace",
    "EarlyStopping", "CABS",
)
TOLERANCE = 1e-5
EXACT = "HessMaxEV (exact)"

MODELS = {
    "mlp": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 4)), (12,)),
    "cnn": (
        lambda: nn.Sequential(
            nn.Conv2d(1, 3, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3 * 2 * 2, 4)
        ),
        (1, 6, 6),
    ),
}
PROBLEMS = [(m, b, r) for m in MODELS for b in (3, 8) for r in ("mean", "sum")]
RECIPES = ("parameters", "model")


def _train(use_lite, model_name, batch_size, reduction, steps, seed=0, recipe="parameters"):
    build, shape = MODELS[model_name]
    torch.manual_seed(seed)
    model = extend(build().double())
    lossfunc = extend(nn.CrossEntropyLoss(reduction=reduction))
    lossfunc_none = nn.CrossEntropyLoss(reduction="none")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if use_lite:  # curvature="auto" (the default) must find BackPACK's exact diagonal in both recipes
        tracked = model.parameters() if recipe == "parameters" else model
        cp = Cockpit(tracked, configuration("full", extras=True) + _extra_lite(), strict=True)
    else:
        import cockpit
        from cockpit.utils.configuration import configuration as peer_configuration

        quantities = peer_configuration("full") + _extra_peer(cockpit)
        cp = cockpit.Cockpit(model.parameters(), quantities=quantities)
    data = torch.Generator().manual_seed(seed + 1)
    default_dtype = torch.get_default_dtype()
    if not use_lite:  # Cockpit's power iteration makes float32 tensors unless float64 is the default
        torch.set_default_dtype(torch.float64)
    try:
        _loop(cp, model, lossfunc, lossfunc_none, opt, data, shape, batch_size, reduction, steps, use_lite)
    finally:
        torch.set_default_dtype(default_dtype)
    return cp.get_output()


def _loop(cp, model, lossfunc, lossfunc_none, opt, data, shape, batch_size, reduction, steps, use_lite):
    for step in range(steps):
        x = torch.randn(batch_size, *shape, generator=data, dtype=torch.float64)
        y = torch.randint(0, 4, (batch_size,), generator=data)
        opt.zero_grad()
        outputs = model(x)
        loss = lossfunc(outputs, y)
        info = {"loss": loss, "optimizer": opt, "batch_size": batch_size}
        scale = batch_size if reduction == "sum" else 1  # Cockpit's recipe passes them (lite also derives them)
        info["individual_losses"] = lossfunc_none(outputs, y) * scale
        with cp(step, info=info):
            loss.backward(create_graph=cp.create_graph(step))
        if use_lite:  # after the step's backward pass: BackPACK's stored inputs are used up
            cp.output.setdefault(step, {})[EXACT] = exact_max_eigenvalue(model, lossfunc, x, y)
        opt.step()


def exact_max_eigenvalue(model, lossfunc, x, y):
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss_of(vector):
        tensors = {n: v.reshape(s) for n, v, s in zip(names, vector.split(sizes), shapes)}
        return lossfunc(torch.func.functional_call(model, tensors, (x,)), y)

    with disable():
        return float(torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss_of, flat)).max())


def _extra_lite():
    from cockpit_lite import quantities

    return [quantities.EarlyStopping(), quantities.CABS()]


def _extra_peer(cockpit):
    q = cockpit.quantities
    return [q.MeanGSNR(track_schedule=_every), q.TICTrace(track_schedule=_every),
            q.EarlyStopping(track_schedule=_every), q.CABS(track_schedule=_every)]


def _every(step):
    return True


def _values(value):
    """Flatten a record value to a float array (histogram: its counts)."""
    if isinstance(value, dict):
        value = value["hist"]
    if torch.is_tensor(value):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=float).reshape(-1)


def relative_difference(ours, theirs):
    ours, theirs = _values(ours), _values(theirs)
    if ours.shape != theirs.shape:
        return float("inf")
    scale = np.maximum(np.abs(theirs), 1e-12)
    return float(np.max(np.abs(ours - theirs) / scale)) if ours.size else 0.0


def compare(model_name, batch_size, reduction, steps=4, recipe="parameters"):
    """Largest relative difference per shared quantity on one problem.

    ``recipe``: cockpit-lite given ``"parameters"`` (Cockpit's recipe, as Cockpit is run
    here) or the ``"model"``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = _train(True, model_name, batch_size, reduction, steps, recipe=recipe)
        theirs = _train(False, model_name, batch_size, reduction, steps)
    errors = {
        "HessMaxEV vs exact": max(relative_difference(ours[s]["HessMaxEV"], ours[s][EXACT]) for s in ours),
        "Cockpit HessMaxEV vs exact": max(
            relative_difference(theirs[s]["HessMaxEV"], ours[s][EXACT]) for s in theirs
        ),
    }
    for name in SHARED:
        steps_theirs = [s for s in theirs if name in theirs[s]]
        steps_ours = [s for s in ours if name in ours[s]]
        if steps_theirs != steps_ours:
            errors[name] = float("inf")
            continue
        errors[name] = max(relative_difference(ours[s][name], theirs[s][name]) for s in steps_ours)
    return errors


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    tables = {recipe: {} for recipe in RECIPES}
    for recipe, table in tables.items():
        for problem in PROBLEMS:
            for name, error in compare(*problem, steps=args.steps, recipe=recipe).items():
                table[name] = max(table.get(name, 0.0), error)
    print("max relative difference vs Cockpit 1.0.2 (Cockpit given the parameters), cockpit-lite given:")
    print(f"{'quantity':<28}" + "".join(f"{'the ' + recipe:>18}" for recipe in RECIPES))
    for name in (*SHARED, "HessMaxEV vs exact", "Cockpit HessMaxEV vs exact"):
        print(f"{name:<28}" + "".join(f"{tables[recipe][name]:>18.2e}" for recipe in RECIPES))
    print(f"over {len(PROBLEMS)} problems (MLP, CNN; B=3, 8; mean, sum), {args.steps} steps each, float64")


if __name__ == "__main__":
    main()
