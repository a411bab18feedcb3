"""Alpha against a brute-force float64 reference over two consecutive steps."""

import math
import warnings

import numpy as np
import pytest
import torch

import problems
from cockpit_lite import Cockpit, schedules
from cockpit_lite.quantities import Alpha


def observations(problem, snapshot, direction):
    """Loss, its per-sample variance, mean slope along ``direction`` and the slopes' variance."""
    grads = problems.individual_gradients(problem, snapshot)
    flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads], 1)
    direction = direction.to(flat.dtype)
    slopes = flat @ direction / direction.norm()
    losses = problems.individual_losses(problem, snapshot)
    return float(problems.loss(problem, snapshot)), float(losses.var()), float(slopes.mean()), float(slopes.var())


def reference(problem, snapshots, step):
    """Weighted least squares (rows scaled by 1/σ) of q(x)=μ₀+μ₁x+μ₂x² to f(0), f(t), f'(0), f'(t)."""
    start, end = snapshots[step], snapshots[step + 1]
    direction = torch.cat([(b - a).reshape(-1) for a, b in zip(start.params, end.params)])
    t = float(direction.norm())
    f0, var_f0, df0, var_df0 = observations(problem, start, direction)
    f1, var_f1, df1, var_df1 = observations(problem, end, direction)
    design = np.array([[1, 0, 0], [1, t, t**2], [0, 1, 0], [0, 1, 2 * t]], dtype=float)
    sigma = np.sqrt([var_f0, var_f1, var_df0, var_df1])
    mu = np.linalg.lstsq(design / sigma[:, None], np.array([f0, f1, df0, df1]) / sigma, rcond=None)[0]
    return -1.0 if mu[2] < 0 else 2 * t / (-mu[1] / mu[2]) - 1


@pytest.mark.parametrize("case", problems.FIRST_ORDER_CASES, ids=problems.case_id)
def test_matches_brute_force(case):
    problems.check(Alpha(), reference, case, steps=4, layers=False, schedule_steps=[0, 1, 2])


OPTIMIZERS = {
    "sgd_momentum_wd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-2, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3),
}


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=str)
def test_any_elementwise_optimizer(optimizer):
    """The update is predicted inside backprop for optimizers with state (not only plain SGD)."""
    problems.check(
        Alpha(), reference, ("cnn", 3, "mean"), steps=4, layers=False,
        schedule_steps=[0, 1, 2], optimizer=OPTIMIZERS[optimizer],
    )


class Together(list):
    """Several optimizers that step the model together, passed as ``info["optimizer"] = [a, b]``; the loop
    steps them one after the other."""

    def zero_grad(self):
        for optimizer in self:
            optimizer.zero_grad()

    def step(self):
        for optimizer in self:
            optimizer.step()


def muon_and_adamw(params):
    """Muon for the matrices, AdamW for the rest (the biases)."""
    params = list(params)
    return Together([torch.optim.Muon([p for p in params if p.dim() == 2], lr=0.02),
                     torch.optim.AdamW([p for p in params if p.dim() != 2], lr=1e-2, weight_decay=0.1)])


@pytest.mark.parametrize("case", [("mlp", 4, "mean"), ("mse", 5, "sum")], ids=problems.case_id)
def test_several_optimizers_that_step_the_model_together(case):
    """The update is whole once both have stepped: predicted per parameter by the one that updates it."""
    problems.check(Alpha(), reference, case, steps=4, layers=False, schedule_steps=[0, 1, 2], optimizer=muon_and_adamw)


def test_schedules_linear_and_logarithmic():
    linear = Alpha(track_schedule=schedules.linear(2, offset=1))
    problems.check(linear, reference, ("mlp", 3, "sum"), steps=6, layers=False, schedule_steps=[1, 3])
    logarithmic = Alpha(track_schedule=schedules.logarithmic(0, 0.7, steps=3))
    problems.check(logarithmic, reference, ("mse", 5, "mean"), steps=7, layers=False, schedule_steps=[0, 1, 2, 5])


def clip_norm(opt, params):
    assert torch.nn.utils.clip_grad_norm_(params, max_norm=1e-3) > 1e-2  # the clipping did shorten it


def halve_lr(opt, params):
    for group in opt.param_groups:
        group["lr"] /= 2


def clip_value(opt, params):
    torch.nn.utils.clip_grad_value_(params, 1e-3)


def start_lr(opt, params):
    for group in opt.param_groups:
        group["lr"] = 0.1


def zero_first(opt, params):
    params[0].grad.zero_()


def freeze_first(opt, params):
    """The first layer frozen after its step-0 gradient (from step 1 on it has no ``.grad``, which
    Adam skips: an update of zero, not the one its momentum would make)."""
    params[0].requires_grad_(False)
    params[1].requires_grad_(False)


CHANGED = "changed between backward and optimizer.step()"

BETWEEN = {  # (what happens between backward and step at every step, optimizer, steps whose α is NaN)
    "clip_norm-sgd": (clip_norm, lambda ps: torch.optim.SGD(ps, lr=0.1), []),
    "halve_lr-sgd": (halve_lr, lambda ps: torch.optim.SGD(ps, lr=0.1), []),
    "halve_lr-momentum": (halve_lr, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), []),
    "halve_lr-adam": (halve_lr, lambda ps: torch.optim.Adam(ps, lr=1e-2), []),
    "clip_norm-adam": (clip_norm, lambda ps: torch.optim.Adam(ps, lr=1e-2), [0]),
    "clip_norm-adamw": (clip_norm, lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1), [0]),
    # the first step: the momentum buffer is the (clipped) gradient itself, so the update is only rescaled
    "clip_norm-momentum": (clip_norm, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), [1]),
    "clip_value-sgd": (clip_value, lambda ps: torch.optim.SGD(ps, lr=0.1), [0]),
    "clip_value-adam": (clip_value, lambda ps: torch.optim.Adam(ps, lr=1e-2), [0]),
    "zero_first-sgd": (zero_first, lambda ps: torch.optim.SGD(ps, lr=0.1), [0]),
    # a warm-up from 0: the update predicted in backward is zero, the real one is not
    "start_lr-sgd_from_zero": (start_lr, lambda ps: torch.optim.SGD(ps, lr=0.0), [0]),
}


def run_changed(case, optimizer, change, steps=4, scaler=None, dtype=None):
    """Train with ``change(opt, params)`` between backward and step at every step; return the record and
    the snapshots. With a ``GradScaler``, backward runs on the scaled loss and the scaler steps; with
    ``dtype``, the model is converted to it (the brute force stays float64)."""
    problem = problems.make(*case, steps=steps)
    if dtype is not None:
        problem.model.to(dtype)
    params = list(problem.model.parameters())
    opt = optimizer(params)
    cp = problems.Cockpit(problem.model, [Alpha()], strict=True, diagnose=False)
    snapshots = {}
    for step, (x, y) in enumerate(problem.batches):
        snapshots[step] = problems.Snapshot([p.detach().clone() for p in params], x, y)
        opt.zero_grad()
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is not None:
            scaler.unscale_(opt)
        change(opt, params)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
    return problem, cp.get_output(), snapshots


def assert_exact_but(problem, record, snapshots, nan_steps, rtol=1e-9):
    """α equals the brute force along the real update at every step but ``nan_steps``, which are NaN
    with a flag naming the change (those after it keep the individual gradients until the step)."""
    for step in range(len(snapshots) - 1):
        entry = record[step]
        if step in nan_steps:
            assert np.isnan(entry["Alpha"]) and any(CHANGED in flag and "from the next tracked step on α keeps the "
                                                    "individual gradients" in flag for flag in entry["flags"]), entry
        else:
            assert "flags" not in entry, entry
            problems.assert_close(entry["Alpha"], reference(problem, snapshots, step), rtol=rtol, what=f"Alpha, step {step}")


@pytest.mark.parametrize("keep", ["kept", "predicted"])
@pytest.mark.parametrize("case", [("mlp", 4, "mean"), ("cnn", 5, "sum")], ids=problems.case_id)
def test_a_layer_frozen_mid_run_under_adam(case, keep, monkeypatch):
    """Frozen after step 0's backward: step 0's update moved the layer, whose gradient at the step's
    end no longer exists, so α of step 0 is NaN with a flag naming it (it was a silently different
    number). From step 1 on Adam skips the layer (no ``.grad``); its update is predicted as zero, not
    as the step its momentum would make, and α equals the brute force (it was NaN, flagged as
    turned). "kept": the probe steps keep the weights' individual gradients; "predicted": no probe steps
    (``PROBE_STEPS`` 0), so the frozen weight's update is predicted (a prediction of Adam's momentum
    step would be off the real update's line: NaN, flagged as turned)."""
    if keep == "predicted":
        from cockpit_lite.quantities import alpha as alpha_module

        monkeypatch.setattr(alpha_module, "PROBE_STEPS", 0)
    with pytest.warns(UserWarning, match="no longer requires a gradient"):
        problem, record, snapshots = run_changed(case, lambda ps: torch.optim.Adam(ps, lr=1e-2), freeze_first)
    assert np.isnan(record[0]["Alpha"])
    assert any("0.weight, 0.bias moved in the step and then stopped requiring a gradient" in flag
               for flag in record[0]["flags"]), record[0]
    for step in (1, 2):
        assert "flags" not in record[step], record[step]
        problems.assert_close(record[step]["Alpha"], reference(problem, snapshots, step), rtol=1e-9,
                              what=f"Alpha, step {step}")


@pytest.mark.parametrize("probe", [True, False], ids=["probed", "predicted"])
@pytest.mark.parametrize("case", [("mlp", 4, "mean"), ("cnn", 5, "sum")], ids=problems.case_id)
@pytest.mark.parametrize("between", BETWEEN, ids=str)
def test_changes_between_backward_and_step(case, between, probe, monkeypatch):
    """The first ``PROBE_STEPS`` start steps keep the individual gradients until the step and check the
    update predicted in backward against the real one: a change between backward and step that turns
    it from the start (clipping under Adam/AdamW or momentum, element-wise clipping, an edited
    gradient) is exact at every step ("probed"). Without the probe ("predicted", as after it): a
    change that only rescales the update (norm clipping of plain SGD's gradient, a new learning rate)
    leaves the projections made in backward exact; one that turns it makes that step NaN with a flag,
    and from then on the individual gradients are kept until the step and projected there, so every
    later step equals the brute force along the real update."""
    from cockpit_lite.quantities import alpha

    change, optimizer, nan_steps = BETWEEN[between]
    if not probe:
        monkeypatch.setattr(alpha, "PROBE_STEPS", 0)
    problem, record, snapshots = run_changed(case, optimizer, change)
    assert_exact_but(problem, record, snapshots, nan_steps if not probe else [])


@pytest.mark.parametrize("case", [("gpt", 4, "mean"), ("resnet_bn_train", 6, "sum"), ("lstm", 4, "mean")], ids=problems.case_id)
def test_kept_individual_gradients_of_every_form(case, monkeypatch):
    """AdamW with norm clipping on models whose individual gradients come as factors with sequence
    axes, embedding rows, a tied weight, a bare parameter (GPT), chunks of the global path (BatchNorm
    in training mode: 4 samples, then one at a time) and a re-run rule (LSTM): kept until the step
    (from the first, probed, step on), they give the brute force."""
    from cockpit_lite.engine import global_path

    monkeypatch.setattr(global_path, "CHUNK_ELEMENTS", 1)
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)  # noqa: E731
    problem, record, snapshots = run_changed(case, adamw, clip_norm)
    assert_exact_but(problem, record, snapshots, [])


@pytest.mark.parametrize("case", [("gpt", 4, "mean"), ("cnn", 5, "sum")], ids=problems.case_id)
def test_a_large_model_s_update_formed_a_parameter_at_a_time(case, monkeypatch):
    """Beyond ``DIFFERENCE_ELEMENTS`` parameters the update is formed a parameter at a time when
    read, and ``fingerprint`` sums each parameter's bits in place: the brute force, also
    where the individual gradients are kept until the step (AdamW with norm clipping)."""
    from cockpit_lite.quantities import alpha as alpha_module

    monkeypatch.setattr(alpha_module, "DIFFERENCE_ELEMENTS", 0)
    monkeypatch.setattr(alpha_module, "FINGERPRINT_GATHER", 5)
    problems.check(Alpha(), reference, case, steps=4, layers=False, schedule_steps=[0, 1, 2])
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)  # noqa: E731
    problem, record, snapshots = run_changed(case, adamw, clip_norm)
    assert_exact_but(problem, record, snapshots, [])


@pytest.mark.parametrize(
    ("optimizer", "change", "nan_steps"),
    [
        (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1), clip_norm, [0]),
        (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), clip_norm, [1]),  # step 0: the buffer is the gradient
        (lambda ps: torch.optim.SGD(ps, lr=0.1), lambda opt, params: None, []),
    ],
    ids=["adamw-clip_norm", "momentum-clip_norm", "sgd"],
)
@pytest.mark.parametrize("probe", [True, False], ids=["probed", "predicted"])
def test_grad_scaler(optimizer, change, nan_steps, probe, monkeypatch):
    """torch.amp.GradScaler("cpu"): backward on the scaled loss (scale 2¹⁰, doubled every step), the
    gradient unscaled (and norm-clipped) before the scaler steps. The individual gradients are those of
    the scaled loss; divided by the scale (the gradient reaching info['loss']) they are the loss's,
    and α equals the brute force at every step (probed), or, without the probe, but at the step where
    the update first turned."""
    from cockpit_lite.quantities import alpha

    if not probe:
        monkeypatch.setattr(alpha, "PROBE_STEPS", 0)
    nan_steps = nan_steps if not probe else []
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    problem, record, snapshots = run_changed(("mlp", 4, "mean"), optimizer, change, steps=5, scaler=scaler)
    assert scaler.get_scale() == 2.0**15  # no step was skipped
    assert_exact_but(problem, record, snapshots, nan_steps)


@pytest.mark.parametrize("reduction", problems.REDUCTIONS)
def test_adamw_first_step_on_exact_zero_gradients(reduction):
    """An attention key bias has a gradient that is zero in exact arithmetic (the softmax cannot see
    it): in float32 rounding gives it a sign, different in the engine's gradient and autograd's, and
    AdamW's first update there is about ± the learning rate, so no prediction matches the update.
    Its individual gradients (a 1-D parameter's, kept at every start step, see
    ``test_kept_individual_gradients_are_released_at_the_step``) are projected onto the real update:
    α equals the brute force from step 0 on, with no flag (it was NaN, "turned", and every later
    step kept all individual gradients)."""
    problem, record, snapshots = run_changed(("gpt", 8, reduction), lambda params: torch.optim.AdamW(params, lr=1e-3),
                                             lambda opt, params: None, steps=3, dtype=torch.float32)
    assert_exact_but(problem, record, snapshots, nan_steps=(), rtol=1e-3)


def test_the_probe_steps_keep_then_predict_once_predictions_held():
    """Plain SGD (predictions hold): the first ``PROBE_STEPS`` start steps keep every parameter's
    individual gradients until the step, the later ones only the 1-D parameters' (their updates
    predicted in backward); a recipe that clips under Adam keeps them all at every start step."""
    from cockpit_lite.quantities import alpha as alpha_module

    for optimizer, change, kept_later in (
        (lambda ps: torch.optim.SGD(ps, lr=0.1), lambda opt, params: None, "1-D"),
        (lambda ps: torch.optim.Adam(ps, lr=1e-2), clip_norm, "all"),
    ):
        params, _, kept, record = _kept_at_each_step(optimizer, change)
        everything = set(range(len(params)))
        later = everything if kept_later == "all" else {i for i, p in enumerate(params) if p.dim() == 1}
        assert kept == [everything] * alpha_module.PROBE_STEPS + [later] * (6 - alpha_module.PROBE_STEPS)
        assert all("flags" not in record[step] and np.isfinite(record[step]["Alpha"]) for step in range(5))


def _kept_at_each_step(optimizer, change):
    """Alpha on the MLP over 6 steps, ``change(opt, params)`` between backward and step: ``(params, the
    quantity, the parameters kept until each start step's optimizer.step(), the record)``."""
    problem = problems.make("mlp", 4, steps=6)
    params = list(problem.model.parameters())
    opt = optimizer(params)
    alpha = Alpha()
    cp = problems.Cockpit(problem.model, [alpha], strict=True, diagnose=False)
    kept = []
    for step, (x, y) in enumerate(problem.batches):
        opt.zero_grad()
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        change(opt, params)
        kept.append(set(alpha._start["kept"]))
        opt.step()
    return params, alpha, kept, cp.get_output()


def test_kept_individual_gradients_are_released_at_the_step(monkeypatch):
    """Kept individual gradients live from backward to optimizer.step(), not longer; the step
    post-hook is registered for the tracked step only (removed by the next step's context).
    Without the probe, only the 1-D parameters' are kept until an edit was seen."""
    from cockpit_lite.quantities import alpha as alpha_module

    monkeypatch.setattr(alpha_module, "PROBE_STEPS", 0)
    problem = problems.make("mlp", 4, steps=3)
    params = list(problem.model.parameters())
    opt = torch.optim.Adam(params, lr=1e-2)
    alpha = Alpha(track_schedule=lambda s: s in (0, 1))
    cp = problems.Cockpit(problem.model, [alpha], strict=True, diagnose=False)
    for step, (x, y) in enumerate(problem.batches):
        opt.zero_grad()
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        assert len(opt._optimizer_step_post_hooks) == (step < 2)
        clip_norm(opt, params)
        kept = set(alpha._start["kept"]) if alpha._start else set()
        # 1-D parameters at every start step, all of them once the edit was seen at step 0
        assert kept == {i for i, p in enumerate(params) if step < 2 and (step == 1 or p.dim() == 1)}
        opt.step()
        assert not (alpha._start and alpha._start["kept"])
    assert not opt._optimizer_step_post_hooks
    record = cp.get_output()
    assert np.isnan(record[0]["Alpha"]) and np.isfinite(record[1]["Alpha"])


def test_an_optimizer_step_with_a_closure():
    """optimizer.step(closure) with the tracked backward pass inside the closure (Lightning's automatic
    optimization), clipping under AdamW: the post-hook sees the update the step made (kept from the
    first, probed, step on)."""
    problem = problems.make("mlp", 4, steps=4)
    params = list(problem.model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    cp = problems.Cockpit(problem.model, [Alpha()], strict=True, diagnose=False)
    snapshots = {}
    for step, (x, y) in enumerate(problem.batches):
        snapshots[step] = problems.Snapshot([p.detach().clone() for p in params], x, y)

        def closure():
            opt.zero_grad()
            loss = problem.lossfunc(problem.model(x), y)
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            clip_norm(opt, params)
            return loss

        opt.step(closure)
    assert_exact_but(problem, cp.get_output(), snapshots, [])


def _after_step_run(after_backward, after_step, steps=2, optimizer=lambda params: torch.optim.SGD(params, lr=0.1)):
    """Alpha on the MLP with hooks around the optimizer step; returns the record."""
    problem = problems.make("mlp", 4, steps=steps)
    params = list(problem.model.parameters())
    opt = optimizer(params)
    cp = problems.Cockpit(problem.model, [Alpha()], strict=True, diagnose=False)
    for step, (x, y) in enumerate(problem.batches):
        opt.zero_grad()
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        if after_backward(opt, params):
            opt.step()
        after_step(params)
    return cp.get_output()


def test_updates_that_are_not_the_optimizer_s_are_flagged():
    """Parameters changed after optimizer.step() (a weight clamp), or changed by hand instead of by the
    optimizer: NaN with a flag."""
    def shrink(params):
        with torch.no_grad():
            params[0].mul_(0.9)

    def by_hand(opt, params):
        with torch.no_grad():
            for p in params:
                p.sub_(0.1 * p.grad)

    def clamp_data(params):  # WGAN's weight clipping: through .data, which bumps no version counter
        params[0].data.clamp_(-0.05, 0.05)

    for after_step in (shrink, clamp_data):
        record = _after_step_run(lambda opt, params: True, after_step)
        assert np.isnan(record[0]["Alpha"]) and any("after optimizer.step()" in f for f in record[0]["flags"])
    record = _after_step_run(lambda opt, params: by_hand(opt, params), lambda params: None)
    assert np.isnan(record[0]["Alpha"]) and any("without a step of info['optimizer']" in f for f in record[0]["flags"])


def test_a_failing_projection_never_breaks_the_optimizer_step(monkeypatch):
    """Kept individual gradients that cannot be projected, or an update whose sums fail: the optimizer still
    steps, α is NaN with a flag."""
    import cockpit_lite.quantities.alpha as alpha_module

    def broken(per_samples, direction):
        raise RuntimeError("broken")

    monkeypatch.setattr(alpha_module, "dots_of_kept", broken)
    record = _after_step_run(lambda opt, params: clip_value(opt, params) or True, lambda params: None, steps=3)
    for step in (0, 1):  # kept from the first, probed, step on
        assert np.isnan(record[step]["Alpha"]) and any("RuntimeError('broken')" in f for f in record[step]["flags"])
    monkeypatch.undo()
    monkeypatch.setattr(alpha_module, "gram", lambda items: broken(None, None))  # the update's sums
    record = _after_step_run(lambda opt, params: True, lambda params: None, steps=3)
    for step in (0, 1):
        assert np.isnan(record[step]["Alpha"]) and any("placing the step failed: RuntimeError('broken')" in f
                                                       for f in record[step]["flags"])


def test_a_subsampled_step_that_lands_exactly_in_the_minimum_is_alpha_0():
    """An interpolating regression (``y = 2x``, ``x = ±1``, MSE) from ``w = 1`` under SGD at lr 0.5 lands
    exactly on ``w = 2``, where every residual and gradient is 0: the losses 1 and 0 and the slopes −2 and 0
    lie on ``(x − 1)²``, whose minimum is the step's end, so α = 0 whatever the variances. The end's batch of
    4 is drawn (``samples=3``; the start's 3 are the whole batch): its mean slope is the exact ``gᵀd / ‖d‖``,
    exactly 0, and its drawn slopes are all equal, so their variance (0) spans 0 to ∞ in the interval, every
    corner of which is α = 0 too; no warning."""
    model = torch.nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.0)
    x = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]], dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    cp = Cockpit(model, [Alpha()], samples=3, diagnose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step, size in enumerate((3, 4)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[:size]), 2 * x[:size])
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            opt.step()
            assert model.weight.item() == 2.0
    record = cp.get_output()[0]
    assert record["Alpha"] == pytest.approx(0.0, abs=1e-9), record
    assert record["meta"]["Alpha"]["interval"] == pytest.approx([0.0, 0.0], abs=1e-9), record


def test_no_update_is_nan_and_flagged():
    problem = problems.make("mlp", 4, steps=2)
    cp, _ = problems.run(problem, [Alpha()], lr=0.0)  # a warm-up from 0 (transformers' schedules) at its first step
    entry = cp.get_output()[0]
    assert np.isnan(entry["Alpha"]) and "did not change" in entry["flags"][0]
    assert "the learning rate was 0" in entry["flags"][0]
    saved = {}

    def keep(opt, params):
        saved.setdefault("before", [p.detach().clone() for p in params])
        return True

    def undone(params):  # a learning rate, but the step put back: no hint about the learning rate
        with torch.no_grad():
            for p, before in zip(params, saved["before"]):
                p.copy_(before)

    entry = _after_step_run(keep, undone)[0]
    assert np.isnan(entry["Alpha"])
    assert entry["flags"][0] == "Alpha: the parameters did not change between the two steps"  # no learning-rate hint


class _SignDescent(torch.optim.Optimizer):
    """An element-wise optimizer whose parameter groups hold no "lr"."""

    def __init__(self, params, step_size=0.01):
        super().__init__(params, {"step_size": step_size})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.sub_(group["step_size"] * p.grad.sign())


def test_no_update_of_an_optimizer_without_a_learning_rate_gives_no_learning_rate_hint():
    """Parameter groups without "lr" and a step of size 0: the parameters did not change, and nothing can be
    said of a learning rate that does not exist (the hint is for an "lr" of 0 only)."""
    entry = _after_step_run(lambda opt, params: True, lambda params: None,
                            optimizer=lambda params: _SignDescent(params, step_size=0.0))[0]
    assert np.isnan(entry["Alpha"])
    assert entry["flags"] == ["Alpha: the parameters did not change between the two steps"]


def test_an_optimizer_without_a_learning_rate_key():
    """Parameter groups without "lr" (an element-wise optimizer of one's own): the brute force."""
    problems.check(Alpha(), reference, ("mlp", 4, "mean"), steps=4, layers=False, schedule_steps=[0, 1, 2],
                   optimizer=_SignDescent)


@pytest.mark.parametrize("missing", ["optimizer", "loss"])
def test_needs_the_optimizer_and_the_loss_before_backward(missing):
    problem = problems.make("mlp", 4)
    cp = problems.Cockpit(problem.model, [Alpha()])
    x, y = problem.batches[0]
    info = {"loss": problem.lossfunc(problem.model(x), y), "optimizer": torch.optim.SGD(problem.model.parameters())}
    del info[missing]
    with pytest.raises(ValueError, match=rf"^Alpha needs info\['{missing}'\] at step 0"):
        cp(0, info=info)


def test_diverged_update_is_named():
    problem = problems.make("mlp", 4, steps=2)
    cp = problems.Cockpit(problem.model, [Alpha()])
    opt = torch.optim.SGD(problem.model.parameters(), lr=float("inf"))
    for step, (x, y) in enumerate(problem.batches):
        opt.zero_grad()
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt, "individual_losses": torch.ones(4) * loss}):
            loss.backward()
        opt.step()
    entry = cp.get_output()[0]
    assert np.isnan(entry["Alpha"]) and "not finite" in entry["flags"][0]


def test_a_zero_variance_pins_its_observation():
    """Cockpit replaces a zero variance by 1e-10: the fit then passes through that observation
    (here both losses, exactly known, with noisy slopes that disagree with them)."""
    from cockpit_lite.quantities.alpha import fit_quadratic

    t, fs, dfs = 0.5, [1.0, 0.7], [-2.0, 1.5]
    mu = fit_quadratic(t, fs, dfs, [0.0, 0.0], [0.3, 0.2])
    q = lambda x: mu[0] + mu[1] * x + mu[2] * x**2  # noqa: E731
    assert abs(q(0.0) - 1.0) < 1e-8 and abs(q(t) - 0.7) < 1e-8
    # against the closed form of the constrained fit: μ₀ = f(0), μ₂ = (f(t) − f(0) − μ₁ t) / t²,
    # μ₁ minimising the weighted slope residuals r₀ = μ₁ − f'(0), r₁ = 2 μ₂ t + μ₁ − f'(t) = c − μ₁ − f'(t)
    c = 2 * (fs[1] - fs[0]) / t
    mu1 = (dfs[0] / 0.3 + (c - dfs[1]) / 0.2) / (1 / 0.3 + 1 / 0.2)
    np.testing.assert_allclose(mu, [fs[0], mu1, (fs[1] - fs[0] - mu1 * t) / t**2], rtol=1e-7)
    assert np.allclose(fit_quadratic(t, fs, dfs, [0.0] * 2, [0.0] * 2),
                       fit_quadratic(t, fs, dfs, [1.0] * 2, [1.0] * 2))  # all zero: equal weights


@pytest.mark.parametrize("t", [0.047, 0.5, 3.0])
def test_the_fit_is_exact_when_one_observation_is_far_more_precise_than_the_others(t):
    """Against the weighted least squares in exact rational arithmetic (sympy): a slope's or a loss's
    variance from 1e-3 down to 1e-60 against the others' 1e-2 (late in training, or slopes that agree to
    the last bits), both slopes' together, and variances up to 1e150 (an interval's corners). The normal
    equations in float64 put μ 4% off at 1e-16 and gave garbage below; within 1e-8 here."""
    import sympy

    from cockpit_lite.quantities.alpha import fit_quadratic

    def exact(fs, dfs, variances):
        rational = lambda x: sympy.Rational(float(x))  # noqa: E731 (the floats' exact values)
        phi = sympy.Matrix([[1, 0, 0], [1, t, t**2], [0, 1, 0], [0, 1, 2 * t]]).applyfunc(rational)
        weights = sympy.diag(*[1 / rational(v) for v in variances])
        y = sympy.Matrix([rational(v) for v in fs + dfs])
        return np.array((phi.T * weights * phi).solve(phi.T * weights * y), dtype=float).reshape(-1)

    fs, dfs = [1.0739, 1.0252], [-0.4743, -0.1305]
    cases = [case for tiny in (1e-3, 1e-8, 1e-14, 1e-16, 1e-18, 1e-24, 1e-33, 1e-60)
             for case in ([5e-3, 1.2e-2, 3.7e-2, tiny], [5e-3, 1.2e-2, tiny, 3.7e-2], [5e-3, 1.2e-2, tiny, tiny],
                          [tiny, 1.2e-2, 3e-2, 2e-2])]
    # far less precise as well (an interval's corner: a variance times e^30): it drops its observation,
    # or, both slopes so, the losses pin two coefficients and the slopes' ratio the third
    cases += [[5e-3, 1.2e-2, tiny, huge] for tiny in (1e-2, 1e-16, 1e-60) for huge in (1e20, 1e150)]
    cases += [[tiny, 1.2e-2, 3e-2, huge] for tiny in (1e-2, 1e-16, 1e-60) for huge in (1e20, 1e150)]
    cases += [[5e-3, 1.2e-2, 3e-2 * huge, 1e-2 * huge] for huge in (1e13, 1e20, 1e150)]
    for variances in cases:
        expected = exact(fs, dfs, variances)
        mu = fit_quadratic(t, fs, dfs, variances[:2], variances[2:])
        assert np.abs(mu - expected).max() <= 1e-8 * np.abs(expected).max(), variances


def test_an_infinite_variance_drops_its_observation_and_two_dropped_leave_no_fit():
    """One slope's variance ∞: the quadratic through the other three observations exactly (three equations,
    three coefficients, solved by hand); both slopes' ∞: two losses determine no quadratic, μ NaN, while the
    other fits of the same call are their own."""
    from cockpit_lite.quantities.alpha import fit_quadratic

    t, fs, dfs = 0.5, [1.0, 0.7], [-2.0, 1.5]
    mu = fit_quadratic(t, fs, [dfs, dfs, dfs], [0.1, 0.2], [[np.inf, 0.3], [0.3, np.inf], [np.inf, np.inf]])
    through_end_slope = np.linalg.solve([[1, 0, 0], [1, t, t**2], [0, 1, 2 * t]], [fs[0], fs[1], dfs[1]])
    through_start_slope = np.linalg.solve([[1, 0, 0], [1, t, t**2], [0, 1, 0]], [fs[0], fs[1], dfs[0]])
    np.testing.assert_allclose(mu[0], through_end_slope, rtol=1e-12)
    np.testing.assert_allclose(mu[1], through_start_slope, rtol=1e-12)
    assert np.isnan(mu[2]).all()


def test_the_step_after_a_due_step_is_observed():
    """α of step 0 needs step 1's forward pass; a schedule due at step 0 only must not leave it
    unobserved (that would warn and take the slow global path)."""

    problem = problems.make("mlp", 4, steps=2)
    params = list(problem.model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    cp = problems.Cockpit(problem.model, [Alpha(track_schedule=lambda s: s == 0)], strict=True)
    snapshots = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step, (x, y) in enumerate(problem.batches):
            snapshots[step] = problems.Snapshot([p.detach().clone() for p in params], x, y)
            opt.zero_grad()
            loss = problem.lossfunc(problem.model(x), y)
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            opt.step()
    problems.assert_close(cp.get_output()[0]["Alpha"], reference(problem, snapshots, 0), rtol=1e-9, what="Alpha")


def test_alpha_from_fit_without_a_finite_fit_is_nan():
    from cockpit_lite.quantities.alpha import alpha_from_fit

    assert np.isnan(alpha_from_fit(np.array([1.0, np.nan, 2.0]), 1.0))
    assert alpha_from_fit(np.array([1.0, -2.0, 1.0]), 1.0) == 0.0  # minimum at x = 1 = t
    assert alpha_from_fit(np.array([1.0, -2.0, -1.0]), 1.0) == -1.0  # concave


def test_verbose_prints_each_value(capsys):
    problems.assert_prints_only_when_verbose(Alpha, capsys)


def test_a_bf16_model_under_adamw_with_clipping():
    """bf16 parameters: the check of the update against the optimizer's runs in float32 (in bf16 its own
    rounding, 2⁻⁸, failed the 1e-4 test at every step). The clipping turns the update from the first
    step on, which the probe sees: the individual gradients are kept until the step, and α matches
    the fit to float64 observations of the same bf16 model (individual gradients by autograd,
    rounded to bf16 there, hence 5e-2) at every step."""
    torch.manual_seed(0)
    build = lambda: torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).bfloat16()  # noqa: E731
    model = build()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-2)
    cp = problems.Cockpit(model, [Alpha()], strict=True, diagnose=False)
    g = torch.Generator().manual_seed(1)
    snapshots = []
    for step in range(3):
        x, y = torch.randn(16, 6, generator=g).bfloat16(), torch.randint(0, 3, (16,), generator=g)
        snapshots.append(([p.detach().clone() for p in params], x, y))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.1)
        opt.step()

    def observe(snapshot, direction):
        replica = build()
        with torch.no_grad():
            for p, value in zip(replica.parameters(), snapshot[0]):
                p.copy_(value)
        losses = torch.nn.functional.cross_entropy(replica(snapshot[1]), snapshot[2], reduction="none")
        grads = [torch.autograd.grad(losses[n], list(replica.parameters()), retain_graph=True) for n in range(16)]
        slopes = torch.stack([torch.cat([t.reshape(-1) for t in gr]).double() for gr in grads]) @ direction / direction.norm()
        losses = losses.detach().double()
        return float(losses.mean()), float(losses.var()), float(slopes.mean()), float(slopes.var())

    direction = torch.cat([(b.double() - a.double()).reshape(-1) for a, b in zip(snapshots[1][0], snapshots[2][0])])
    t = float(direction.norm())
    (f0, v0, s0, w0), (f1, v1, s1, w1) = observe(snapshots[1], direction), observe(snapshots[2], direction)
    design = np.array([[1, 0, 0], [1, t, t**2], [0, 1, 0], [0, 1, 2 * t]], dtype=float)
    sigma = np.sqrt([v0, v1, w0, w1])
    mu = np.linalg.lstsq(design / sigma[:, None], np.array([f0, f1, s0, s1]) / sigma, rcond=None)[0]
    record = cp.get_output()
    assert "flags" not in record[0] and "flags" not in record[1] and np.isfinite(record[0]["Alpha"])
    problems.assert_close(record[1]["Alpha"], 2 * t / (-mu[1] / mu[2]) - 1, rtol=5e-2, what="Alpha bf16")


def test_a_non_finite_loss_is_not_called_a_batch_of_one_sample():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [Alpha()], diagnose=False)
    for step in range(3):
        x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        if step == 1:
            x[0, 0] = float("nan")
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    flags = cp.get_output()[0]["flags"]
    assert any("individual losses are not finite" in f for f in flags)
    assert not any("one sample" in f for f in flags)


def test_the_prediction_check_holds_on_a_vector_of_every_parameter_of_a_large_model():
    """torch's float32 dot and norm of 1.3·10⁷ elements (a 13M-parameter GPT) are off by about 5·10⁻⁴
    relative on a CPU, more than the check's 10⁻⁴: an update exactly twice its prediction looked
    turned, and α was NaN at every step. The sums are float64; at this size the distance is the
    residual's."""
    from cockpit_lite.quantities.alpha import _on_line
    from cockpit_lite.utils.norms import dot, gram

    def on_line(predicted, real):
        (squared, cross), (_, length) = gram(zip(predicted, real))
        return _on_line(predicted, real, (squared, cross, length))

    predicted = 1e-3 * torch.randn(13_000_000, generator=torch.Generator().manual_seed(0))
    assert on_line([predicted], [2 * predicted]) == pytest.approx(2.0, rel=1e-12)
    turned = 2 * predicted
    turned[:2000] += 0.01  # 6 % of its length off the line
    assert on_line([predicted], [turned]) is None
    assert on_line([predicted], [-predicted]) is None
    assert math.sqrt(dot([predicted], [predicted])) == pytest.approx(float(predicted.double().norm()), rel=1e-9)
    pieces = list(predicted.split([4_000_000, 9_000_000]))  # one vector across parameters
    assert on_line(pieces, [2 * p for p in pieces]) == pytest.approx(2.0, rel=1e-12)
    assert on_line(pieces, [2 * pieces[0], -2 * pieces[1]]) is None


@pytest.mark.parametrize("size", [1000, 3_000_000])  # the distance from the sums; from the residual
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_prediction_check_s_tolerance_is_the_same_whichever_way_it_takes_the_distance(size, dtype):
    """Small float32 vectors take the distance from the Gram sums, others from the residual: both
    accept an update 10⁻² of the tolerance off its prediction's line and refuse one 10² off it."""
    from cockpit_lite.quantities.alpha import PREDICTION_RTOL, _on_line
    from cockpit_lite.utils.norms import gram

    g = torch.Generator().manual_seed(1)
    predicted = torch.randn(size, generator=g, dtype=torch.float64)
    across = torch.randn(size, generator=g, dtype=torch.float64)
    across -= (across @ predicted) / (predicted @ predicted) * predicted  # orthogonal to the prediction
    rtol = PREDICTION_RTOL.get(dtype, 1e-4)
    for off, accepted in [(1e-2, True), (1e2, False)]:
        real = (3 * predicted + off * rtol * 3 * predicted.norm() / across.norm() * across).to(dtype)
        pred = predicted.to(dtype)
        (squared, cross), (_, length) = gram([(pred, real)])
        scale = _on_line([pred], [real], (squared, cross, length))
        assert (scale is not None) == accepted
        if accepted:
            assert scale == pytest.approx(3.0, rel=10 * rtol)


def test_the_fingerprint_sees_every_change_and_is_the_same_in_any_thread_count():
    """The check "the parameters changed after optimizer.step()" compares exact integer sums of the
    parameters' bits: one ulp of one element, or two elements swapped, changes them; the same bits
    give the same sums whatever the thread count."""
    from cockpit_lite.quantities.alpha import FINGERPRINT_GATHER, FINGERPRINT_ROW, fingerprint

    g = torch.Generator().manual_seed(0)
    params = [torch.randn(FINGERPRINT_GATHER + 7, generator=g), torch.randn(3, 4, generator=g).to(torch.bfloat16),
              torch.randn(5, dtype=torch.float64, generator=g), torch.randn(6, generator=g), torch.randn(2, generator=g)]
    before = fingerprint(params)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert fingerprint(params) == before
    finally:
        torch.set_num_threads(threads)
    for i in range(len(params)):
        changed = [p.clone() for p in params]
        bits = changed[i].view(-1).view({2: torch.int16, 4: torch.int32, 8: torch.int64}[changed[i].element_size()])
        bits[-1] += 1  # the next float
        assert fingerprint(changed) != before
        swapped = [p.clone() for p in params]
        flat = swapped[i].view(-1)
        flat[0], flat[1] = params[i].view(-1)[1], params[i].view(-1)[0]
        assert fingerprint(swapped) != before
    moved = [params[0], params[1], params[2], params[4], params[3]]  # two small tensors' places swapped
    assert fingerprint(moved) != before
    for other in (FINGERPRINT_ROW, FINGERPRINT_ROW + 3):  # same column of another row; another row and column
        swapped = params[0].clone()
        swapped[0], swapped[other] = params[0][other], params[0][0]
        assert fingerprint([swapped] + params[1:]) != before


def test_the_fingerprint_s_sums_are_the_sums_of_the_bits_and_their_positions():
    """``Σ_j b_j`` and ``Σ_j (j+1) b_j`` from a piece's row and column sums, rows and a tail, equal
    the sums taken element by element (small integers: no wrapping)."""
    from cockpit_lite.quantities.alpha import FINGERPRINT_ROW, _bit_sums

    for n in (5, FINGERPRINT_ROW, 3 * FINGERPRINT_ROW + 11, 2 * FINGERPRINT_ROW**2 + 1):  # rows > row length
        bits = torch.randint(-1000, 1000, (n,), dtype=torch.int32, generator=torch.Generator().manual_seed(n))
        values = bits.tolist()
        assert _bit_sums(bits) == (sum(values), sum((j + 1) * b for j, b in enumerate(values)))


def test_the_fingerprint_is_each_dtype_s_sums_of_bits_and_positions_modulo_its_width():
    """``fingerprint`` per dtype, in the order the dtypes first occur: ``(Σ_j b_j, Σ_j (j+1) b_j)`` over the
    dtype's parameters concatenated (``j`` counting on across them), equal to the element-by-element sums
    modulo ``2^w`` (``w`` = 32 for float32 and bfloat16, whose 16-bit patterns are widened; 64 for float64).
    The bfloat16 tensors span whole rows, whose 16-bit row sums would wrap at 2^16, and a float32 one is
    larger than ``FINGERPRINT_GATHER``."""
    from cockpit_lite.quantities.alpha import FINGERPRINT_GATHER, FINGERPRINT_ROW, fingerprint

    g = torch.Generator().manual_seed(0)
    params = [torch.randn(3, 5, generator=g), torch.randn(2 * FINGERPRINT_ROW + 9, generator=g).to(torch.bfloat16),
              torch.randn(FINGERPRINT_GATHER + 700, generator=g), torch.randn(4, dtype=torch.float64, generator=g),
              torch.randn(FINGERPRINT_ROW, generator=g).to(torch.bfloat16), torch.randn(7, generator=g)]
    width = {torch.float32: 32, torch.bfloat16: 32, torch.float64: 64}
    expected = {}
    for p in params:
        bits = p.view(-1).view({2: torch.int16, 4: torch.int32, 8: torch.int64}[p.element_size()])
        expected.setdefault(p.dtype, []).extend(bits.tolist())  # (bfloat16's patterns sign-extended, as widened)
    found = fingerprint(params)
    assert [name for name, _, _ in found] == [str(d) for d in (torch.float32, torch.bfloat16, torch.float64)]
    for (name, total, weighted), (dtype, values) in zip(found, expected.items()):
        modulus = 2 ** width[dtype]
        assert total % modulus == sum(values) % modulus, name
        assert weighted % modulus == sum((j + 1) * b for j, b in enumerate(values)) % modulus, name


def test_a_probe_checks_the_kept_parameters_updates_against_their_prediction_as_one_vector():
    """Parameters 0 and 2 checked (1 is not: its update, turned, is not read): their updates twice their
    predictions are on the line; with parameter 2's turned half a prediction's length off it they are not.
    Nothing checked (every kept parameter 1-D) is on the line."""
    from cockpit_lite.quantities.alpha import _predicted_on_line

    g = torch.Generator().manual_seed(0)
    predicted = [torch.randn(6, generator=g), torch.randn(3, generator=g), torch.randn(4, generator=g)]
    across = torch.tensor([1.0, -1.0, 1.0, -1.0])
    across -= (across @ predicted[2]) / (predicted[2] @ predicted[2]) * predicted[2]
    turned = 2 * predicted[2] + 0.5 * predicted[2].norm() / across.norm() * across
    update = [2 * predicted[0], -predicted[1], 2 * predicted[2]]
    assert _predicted_on_line([0, 2], predicted, update)
    assert not _predicted_on_line([0, 2], predicted, [update[0], update[1], turned])
    assert not _predicted_on_line([0, 2], predicted, [-update[0], update[1], -update[2]])
    assert _predicted_on_line([], predicted, update)


def test_a_probe_that_could_keep_nothing_but_1d_parameters_lets_later_steps_predict(monkeypatch):
    """No room to keep a weight's individual gradients (``KEEP_ELEMENTS`` 0): the probe steps keep the
    biases only, and check nothing; the later start steps predict (they keep the biases only, as
    after a probe that held), and α is finite without a flag at every step."""
    from cockpit_lite.quantities import alpha as alpha_module

    monkeypatch.setattr(alpha_module, "KEEP_ELEMENTS", 0)
    params, alpha, kept, record = _kept_at_each_step(lambda ps: torch.optim.SGD(ps, lr=0.1), lambda opt, params: None)
    assert kept == [{i for i, p in enumerate(params) if p.dim() == 1}] * 6
    assert alpha._keep is False
    assert all("flags" not in record[step] and np.isfinite(record[step]["Alpha"]) for step in range(5))


def test_keeping_spends_the_room_only_on_what_it_keeps_in_the_order_the_backward_pass_decides(monkeypatch):
    """``_keeps`` with room for 10 elements, parameters decided in the order 1-D, 12, 10, 1 elements (each
    on its first chunk; later chunks follow it): the bias always, the 12 not (no room spent), the 10 exactly
    (the room is then empty), the 1 not; the probe runs once for the one weight kept. At a subsampled step a
    chunk of 4 of the batch's samples holding 8 elements counts for the 2 drawn samples: 4 elements (a
    share in whole elements: 9 count as 4). Neither
    subsampled nor probing: the 1-D parameters only."""
    from types import SimpleNamespace

    from cockpit_lite.quantities import alpha as alpha_module

    monkeypatch.setattr(alpha_module, "KEEP_ELEMENTS", 10)

    def chunk(index, shape, held, samples=4):
        return SimpleNamespace(index=index, param=torch.zeros(shape), batch_size=samples, num_samples=samples,
                               held_elements=lambda: held)

    chunks = [chunk(0, (3,), 12), chunk(1, (3, 4), 12), chunk(2, (2, 5), 10), chunk(3, (1, 1), 1), chunk(2, (2, 5), 10)]
    probed = []
    keeps = alpha_module._keeps(SimpleNamespace(subset=None), lambda per_sample: probed.append(per_sample.index))
    assert [keeps(c) for c in chunks] == [True, False, True, False, True]
    assert probed == [2]
    drawn = alpha_module._keeps(SimpleNamespace(subset=[0, 5]))
    assert [drawn(c) for c in (chunk(0, (3, 2), 8), chunk(1, (3, 2), 8), chunk(2, (3, 2), 8))] == [True, True, False]
    drawn = alpha_module._keeps(SimpleNamespace(subset=[0, 5]))  # shares of 8, 5 and 9 elements: 4, 2 and 4 (whole)
    assert [drawn(c) for c in (chunk(0, (3, 2), 8), chunk(1, (3, 2), 5), chunk(2, (3, 2), 9))] == [True, True, True]
    plain = alpha_module._keeps(SimpleNamespace(subset=None))
    assert [plain(c) for c in chunks] == [True, False, False, False, False]


def test_an_update_on_the_line_needs_a_positive_multiple_of_a_nonzero_prediction():
    """A prediction of length exactly 1 and an update twice it: c = 2. A zero update, or a zero prediction, has
    no c > 0 (the update did not follow the prediction)."""
    from cockpit_lite.quantities.alpha import _on_line
    from cockpit_lite.utils.norms import gram

    def on_line(predicted, real):
        (squared, cross), (_, length) = gram([(predicted, real)])
        return _on_line([predicted], [real], (squared, cross, length))

    unit = torch.tensor([0.5, 0.5, -0.5, 0.5])
    assert float(unit @ unit) == 1.0
    assert on_line(unit, 2 * unit) == 2.0
    assert on_line(unit, torch.zeros(4)) is None
    assert on_line(torch.zeros(4), unit) is None


def test_alpha_from_fit_row_by_row_without_a_warning():
    """α = 2t / (−μ₁/μ₂) − 1 of each row: a row with an infinite coefficient is NaN, the others keep theirs. A fit
    without curvature (μ₂ = 0) going down or up is −1 (the minimum is not ahead of the step: 2t / ∓∞ − 1); a flat
    one (μ₁ = μ₂ = 0) has no α. No division warns."""

    from cockpit_lite.quantities.alpha import alpha_from_fit

    mu = np.array([[1.0, -2.0, 1.0], [1.0, np.inf, 1.0], [1.0, -4.0, 1.0], [1.0, -2.0, 0.0], [1.0, 2.0, 0.0],
                   [1.0, 0.0, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted = alpha_from_fit(mu, 1.0)
        single = [alpha_from_fit(row, 1.0) for row in mu]
    np.testing.assert_array_equal(fitted, [0.0, np.nan, -0.5, -1.0, -1.0, np.nan])
    np.testing.assert_array_equal(single, fitted)
    assert all(type(value) is float for value in single)  # one fit's α is a number, not a 0-d array


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # the distance from the sums; the residual's
def test_an_update_exactly_at_the_tolerance_from_the_line_is_on_it(dtype, monkeypatch):
    """A tolerance of 1/2 (so that the bound is exact): the prediction (1, 0, 0, 0) and the update (3, 1, 1, 1),
    whose distance² from the line, 3, is exactly (1/2)² of its length², 12: on the line, c = 3."""
    from cockpit_lite.quantities import alpha as alpha_module
    from cockpit_lite.utils.norms import gram

    monkeypatch.setattr(alpha_module, "PREDICTION_RTOL", {dtype: 0.5})
    predicted, real = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=dtype), torch.tensor([3.0, 1.0, 1.0, 1.0], dtype=dtype)
    (squared, cross), (_, length) = gram([(predicted, real)])
    assert (squared, cross, length) == (1.0, 3.0, 12.0)
    assert alpha_module._on_line([predicted], [real], (squared, cross, length)) == 3.0
    assert alpha_module._on_line([predicted], [real + torch.tensor([0.0, 0.0, 0.0, 0.01], dtype=dtype)],
                                 (squared, cross, float((real[3] + 0.01) ** 2 + 11))) is None


def test_fit_quadratic_broadcasts_slopes_and_their_variances_over_leading_axes():
    """Slopes [2] with variances [3, 2], and slopes [3, 2] with variances [2]: the fits of each row, which solve
    the weighted least squares of the four observations (f(0), f(t), f'(0), f'(t)) by hand."""
    from cockpit_lite.quantities.alpha import fit_quadratic

    def by_hand(t, fs, dfs, var_fs, var_dfs):
        phi = np.array([[1.0, 0.0, 0.0], [1.0, t, t**2], [0.0, 1.0, 0.0], [0.0, 1.0, 2 * t]])
        w = 1 / np.array([*var_fs, *var_dfs])
        return np.linalg.lstsq(phi * np.sqrt(w)[:, None], np.array([*fs, *dfs]) * np.sqrt(w), rcond=None)[0]

    fs, var_fs = [1.0, 0.7], [0.1, 0.2]
    slopes, variances = np.array([[-1.0, 0.5], [-2.0, 0.1], [-0.5, -0.2]]), np.array([[0.3, 0.4], [1.0, 2.0], [0.5, 0.1]])
    for t in (0.5, 2.0):
        np.testing.assert_allclose(fit_quadratic(t, fs, slopes[0], var_fs, variances),
                                   [by_hand(t, fs, slopes[0], var_fs, v) for v in variances], rtol=1e-9)
        np.testing.assert_allclose(fit_quadratic(t, fs, slopes, var_fs, variances[1]),
                                   [by_hand(t, fs, s, var_fs, variances[1]) for s in slopes], rtol=1e-9)


def test_a_step_of_the_whole_batch_has_no_standard_error():
    """Without subsampling α is the fit of the whole batch's losses and slopes: the brute force's, with no
    standard error or interval (those are a subsample's, ``tests/test_subsample.py``)."""
    problem = problems.make("mlp", 4, steps=2)
    cp, snapshots = problems.run(problem, [Alpha(track_schedule=lambda s: s == 0)])
    record = cp.get_output()[0]
    problems.assert_close(record["Alpha"], reference(problem, snapshots, 0), rtol=1e-9, what="Alpha")
    assert "Alpha" not in record.get("meta", {}), record["meta"]


def test_a_second_optimizer_step_in_one_step_is_an_update_that_is_not_the_optimizer_s():
    """optimizer.step() twice after one backward pass (the second on the same gradient): the training goes on,
    and α of the step is NaN, flagged as parameters changed after optimizer.step()."""
    record = _after_step_run(lambda opt, params: opt.step() or True, lambda params: None)
    assert np.isnan(record[0]["Alpha"]) and any("after optimizer.step()" in f for f in record[0]["flags"])


def test_the_predicted_update_and_the_gradient_copy_are_released_at_the_step():
    """A subsampled start step keeps the update predicted in backward and a copy of g (for gᵀd) until
    optimizer.step(), not longer: both are released by the step post-hook."""
    problem = problems.make("mlp", 8, steps=2)
    params = list(problem.model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    alpha = Alpha(track_schedule=lambda s: s == 0)
    cp = problems.Cockpit(problem.model, [alpha], strict=True, diagnose=False, samples=4)
    x, y = problem.batches[0]
    loss = problem.lossfunc(problem.model(x), y)
    with cp(0, info={"loss": loss, "optimizer": opt}):
        loss.backward()
    assert alpha._start["grad"] is not None and any(p is not None for p in alpha._start["backward_predicted"])
    opt.step()
    assert alpha._start["grad"] is None and alpha._start["backward_predicted"] is None


def test_a_float32_update_rescaled_between_backward_and_step_stays_on_the_line(monkeypatch):
    """A float32 GPT (the distance from the Gram sums), without the probe: the rate halved between backward and
    step (the update half its prediction, c = 1/2) and doubled (c = 2) are on the predicted line, and α
    equals the brute force at every step (to float32's rounding)."""
    from cockpit_lite.quantities import alpha

    def double_lr(opt, params):
        for group in opt.param_groups:
            group["lr"] = 0.1
        return True

    monkeypatch.setattr(alpha, "PROBE_STEPS", 0)
    for change in (halve_lr, double_lr):
        sgd = lambda ps: torch.optim.SGD(ps, lr=0.05)  # noqa: E731
        problem, record, snapshots = run_changed(("gpt", 4, "mean"), sgd, change, steps=3, dtype=torch.float32)
        assert_exact_but(problem, record, snapshots, nan_steps=(), rtol=1e-3)


def test_a_batch_of_one_sample_is_nan_and_flagged():
    """One sample: no variance of the losses and slopes, which the fit weighs by; NaN, with the flag."""
    problem = problems.make("mlp", 1, steps=2)
    cp, _ = problems.run(problem, [Alpha(track_schedule=lambda s: s == 0)])
    entry = cp.get_output()[0]
    assert np.isnan(entry["Alpha"])
    assert entry["flags"] == ["Alpha: a batch of one sample has no variance of the losses and slopes, which the fit needs"]
