"""Alpha against a brute-force float64 reference over two consecutive steps."""

import numpy as np
import pytest
import torch

import problems
from cockpit_lite import schedules
from cockpit_lite.quantities import Alpha


def observations(problem, snapshot, direction):
    """Loss, its per-sample variance, mean slope along ``direction`` and the slopes' variance."""
    grads = problems.individual_gradients(problem, snapshot)
    flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads], 1)
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


BETWEEN = {  # (what happens between backward and step, optimizer, α exact?)
    "clip_norm-sgd": (clip_norm, lambda ps: torch.optim.SGD(ps, lr=0.1), True),
    "halve_lr-sgd": (halve_lr, lambda ps: torch.optim.SGD(ps, lr=0.1), True),
    "halve_lr-momentum": (halve_lr, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), True),
    "halve_lr-adam": (halve_lr, lambda ps: torch.optim.Adam(ps, lr=1e-2), True),
    "clip_norm-adam": (clip_norm, lambda ps: torch.optim.Adam(ps, lr=1e-2), False),
    # the first step: the momentum buffer is the (clipped) gradient itself, so the update is only rescaled
    "clip_norm-momentum_first_step": (clip_norm, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), True),
    "clip_value-sgd": (clip_value, lambda ps: torch.optim.SGD(ps, lr=0.1), False),
    # a warm-up from 0: the predicted update is zero, the real one is not
    "start_lr-sgd_from_zero": (start_lr, lambda ps: torch.optim.SGD(ps, lr=0.0), False),
}


@pytest.mark.parametrize("case", [("mlp", 4, "mean"), ("cnn", 5, "sum")], ids=problems.case_id)
@pytest.mark.parametrize("between", BETWEEN, ids=str)
def test_changes_between_backward_and_step(case, between):
    """A change between backward and step that only rescales the update (norm clipping of
    plain SGD's gradient, a new learning rate) leaves α exact: equal to the brute force along
    the real update. One that turns it (element-wise clipping, norm clipping under Adam)
    gives NaN and a flag.

    At step 1 a changed direction (one parameter's gradient zeroed) is flagged too; step 0's clipped update is 10-1000× shorter than the predicted one, so start
    slopes normalised by the wrong length are far from the reference.
    """
    change, optimizer, exact = BETWEEN[between]
    problem = problems.make(*case, steps=3)
    params = list(problem.model.parameters())
    opt = optimizer(params)
    cp = problems.Cockpit(problem.model, [Alpha()], strict=True)
    snapshots = {}
    for step, (x, y) in enumerate(problem.batches):
        snapshots[step] = problems.Snapshot([p.detach().clone() for p in params], x, y)
        opt.zero_grad()
        loss = problem.lossfunc(problem.model(x), y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        if step == 0:
            change(opt, params)
        else:
            params[0].grad.zero_()
        opt.step()
    record = cp.get_output()
    if exact:
        assert "flags" not in record[0]
        problems.assert_close(record[0]["Alpha"], reference(problem, snapshots, 0), rtol=1e-9, what="Alpha, changed")
    else:
        assert np.isnan(record[0]["Alpha"]) and any("predicted update" in f for f in record[0]["flags"])
    assert np.isnan(record[1]["Alpha"])
    assert any("predicted update" in flag for flag in record[1]["flags"])


def test_no_update_is_nan_and_flagged():
    problem = problems.make("mlp", 4, steps=2)
    cp, _ = problems.run(problem, [Alpha()], lr=0.0)
    entry = cp.get_output()[0]
    assert np.isnan(entry["Alpha"]) and "did not change" in entry["flags"][0]


def test_needs_optimizer_before_backward():
    problem = problems.make("mlp", 4)
    cp = problems.Cockpit(problem.model, [Alpha()])
    x, y = problem.batches[0]
    loss = problem.lossfunc(problem.model(x), y)
    with pytest.raises(ValueError, match=r"Alpha needs info\['optimizer'\]"):
        cp(0, info={"loss": loss})


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


def test_the_step_after_a_due_step_is_observed():
    """α of step 0 needs step 1's forward pass; a schedule due at step 0 only must not leave it
    unobserved (that would warn and take the slow global path)."""
    import warnings

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

    assert np.isnan(alpha_from_fit(None, 1.0)) and np.isnan(alpha_from_fit(np.array([1.0, np.nan, 2.0]), 1.0))
    assert alpha_from_fit(np.array([1.0, -2.0, 1.0]), 1.0) == 0.0  # minimum at x = 1 = t
    assert alpha_from_fit(np.array([1.0, -2.0, -1.0]), 1.0) == -1.0  # concave


def test_verbose_prints_each_value(capsys):
    problems.assert_prints_only_when_verbose(Alpha, capsys)
