"""Loss curves do not tell the whole story: the Cockpit paper's Figure 1 on a 2-d noisy quadratic.

    python -m experiments.noisy_quadratic [--steps 40] [--h 0.5 10] [--noise 0.2] [--batch-size 64]
                                          [--n-samples 64] [--lr-large 0.2] [--out runs/noisy_quadratic] [--tiny]

Problem. Every sample n has a random centre ``x_n ~ N(0, σ² I)`` (a data set of
``--n-samples`` centres drawn once) and the loss

    ℓ_n(θ) = ½ Σ_d h_d (θ_d − x_{n,d})²,     L_B(θ) = mean_{n∈B} ℓ_n(θ),

so the Hessian of every mini-batch loss is ``diag(h)``; the loss on the whole data
set is ``L(θ) = ½ Σ_d h_d [(θ_d − x̄_d)² + s_d²]`` (x̄, s² the centres' mean and
variance), minimal at x̄. As in the paper's experiment the default batch is the whole
data set (``--n-samples`` = ``--batch-size``: the noise is between samples, not between
steps); with more samples than the batch size the steps are stochastic too, and at
η·h_max = 2 the oscillation's amplitude then performs a random walk.

As a BackPACK-compatible torch model (``QuadraticModel``): θ is the weight of an
``nn.Linear(1, 2, bias=False)`` applied to a constant input 1, followed by a frozen
``nn.Linear(2, 2, bias=False)`` whose weight is ``diag(√h)`` (``requires_grad=False``,
not tracked); the target of sample n is ``√h ⊙ x_n``; the loss is ``nn.MSELoss()``
(mean over the B samples *and* the 2 output dimensions). Then

    MSE = 1/(2B) Σ_n Σ_d (√h_d θ_d − √h_d x_{n,d})² = 1/B Σ_n ½ Σ_d h_d (θ_d − x_{n,d})² = L_B(θ),

∂L_B/∂θ_d = h_d (θ_d − mean_n x_{n,d}) and ∂²L_B/∂θ_d∂θ_e = h_d δ_de: the Hessian is
``diag(h)`` (checked numerically by ``check_hessian``). Only θ is passed to the Cockpit.

Experiment (as in the paper). Two SGD runs from the same start on the same stream
of samples:

- *large constant* learning rate ``η = --lr-large`` (default 2/h_max: η·h_max = 2, the
  edge of stability) — the steep coordinate jumps from one wall of the valley to the
  other at every step, the shallow one converges;
- *small decaying* learning rate ``η_t = a·r^t`` whose (a, r) are fitted (least squares
  on the log of the noise-free excess loss) so that its loss curve matches the large
  run's — it creeps down the steep wall and hardly moves along the shallow axis.

The loss curves look alike, but Cockpit's instruments tell the runs apart: α ≈ +1
(overshooting to the mirror point: decrease the learning rate) vs α ≈ −1 (steps far
too short: increase it), and the update size and distance differ by orders of
magnitude. The figure also draws the θ trajectories over the loss contours.

Writes ``OUT/noisy_quadratic.png`` and ``OUT/noisy_quadratic.json``.
"""

import os

import numpy as np
import torch
from torch import nn

from cockpit_lite import Cockpit, extend, quantities
from experiments import common

NAME = "noisy_quadratic"


class QuadraticModel(nn.Sequential):
    """``θ ↦ √h ⊙ θ``: ``Linear(1, 2)`` (θ = its weight, shape [2, 1]), then a frozen diagonal ``Linear(2, 2)``.

    Feed it ``ones(B, 1)``; with targets ``√h ⊙ x_n`` and ``nn.MSELoss()`` the loss is
    ``mean_n ½ Σ_d h_d (θ_d − x_{n,d})²`` (see the module docstring).
    """

    def __init__(self, h, theta0):
        theta = nn.Linear(1, len(h), bias=False)
        scale = nn.Linear(len(h), len(h), bias=False)
        with torch.no_grad():
            theta.weight.copy_(torch.as_tensor(theta0, dtype=torch.float32).reshape(-1, 1))
            scale.weight.copy_(torch.diag(torch.as_tensor(h, dtype=torch.float32).sqrt()))
        scale.weight.requires_grad_(False)
        super().__init__(theta, scale)
        self.sqrt_h = torch.as_tensor(h, dtype=torch.float32).sqrt()

    @property
    def theta(self):
        """The trainable parameter θ (shape [2, 1])."""
        return self[0].weight

    def targets(self, centres):
        """Regression targets ``√h ⊙ x_n`` of the centres ``x_n`` ([B, 2])."""
        return centres * self.sqrt_h


def check_hessian(h, theta0=(1.0, -1.0), batch_size=5, seed=0):
    """Return the Hessian of the mini-batch MSE w.r.t. θ (float64, autograd); it must be ``diag(h)``."""
    centres = torch.randn(batch_size, len(h), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    sqrt_h = torch.as_tensor(h, dtype=torch.float64).sqrt()

    def loss(theta):
        outputs = (theta * sqrt_h).expand(batch_size, -1)
        return nn.functional.mse_loss(outputs, centres * sqrt_h)

    return torch.autograd.functional.hessian(loss, torch.as_tensor(theta0, dtype=torch.float64))


def excess_losses(h, theta0, lrs):
    """Noise-free excess loss ``½ Σ_d h_d θ_d,t²`` along GD with step sizes ``lrs`` (vectorised over rows).

    ``lrs`` has shape [K, T]; returns [K, T + 1].
    """
    h = np.asarray(h, dtype=float)
    factors = 1.0 - lrs[..., None] * h  # [K, T, D]
    theta = np.asarray(theta0, dtype=float) * np.concatenate(
        [np.ones(lrs.shape[:1] + (1, len(h))), np.cumprod(factors, axis=1)], axis=1)
    return 0.5 * (h * theta**2).sum(-1)


def fit_decay(h, theta0, lr_large, steps, max_eta_h=0.5):
    """Fit ``η_t = a·r^t`` (with ``a·h_max ≤ max_eta_h``) to the large run's noise-free loss curve.

    Returns ``(a, r, rms log error)``.
    """
    target = np.log(excess_losses(h, theta0, np.full((1, steps), lr_large))[0] + 1e-12)
    h_max = max(h)
    a_grid = np.geomspace(1e-3 / h_max, max_eta_h / h_max, 160)
    r_grid = np.linspace(0.70, 1.0, 121)
    a, r = np.meshgrid(a_grid, r_grid, indexing="ij")
    a, r = a.reshape(-1), r.reshape(-1)
    lrs = a[:, None] * r[:, None] ** np.arange(steps)
    curves = np.log(excess_losses(h, theta0, lrs) + 1e-12)
    error = np.sqrt(((curves - target) ** 2).mean(1))
    best = int(np.argmin(error))
    return float(a[best]), float(r[best]), float(error[best])


def make_centres(args, dim):
    """The data set: ``--n-samples`` centres ``x_n ~ N(0, σ² I)`` drawn once (seeded)."""
    return args.noise * torch.randn(args.n_samples, dim, generator=torch.Generator().manual_seed(args.seed + 1))


def full_loss(thetas, h, centres):
    """The loss on the whole data set, ``L(θ) = ½ Σ_d h_d [(θ_d − x̄_d)² + s_d²]`` (s²: population variance)."""
    c = np.asarray(centres, dtype=float)
    mean, var = c.mean(0), c.var(0)
    return 0.5 * (np.asarray(h) * ((np.atleast_2d(thetas) - mean) ** 2 + var)).sum(-1)


def run(name, schedule, args, h, theta0):
    """One SGD run with learning rates ``schedule(t)``; returns the record and the per-step arrays."""
    torch.manual_seed(args.seed)
    model = extend(QuadraticModel(h, theta0))
    lossfunc = extend(nn.MSELoss())
    optimizer = torch.optim.SGD([model.theta], lr=schedule(0))
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: schedule(t) / schedule(0))
    cp = Cockpit([("theta", model.theta)], quantities=[
        quantities.Alpha(), quantities.Loss(), quantities.Distance(), quantities.UpdateSize(),
        quantities.GradNorm(),
    ])
    data = make_centres(args, len(h))
    batches = torch.Generator().manual_seed(args.seed + 2)  # the same batch sequence for both runs
    ones = torch.ones(args.batch_size, 1)
    thetas, losses, lrs = [model.theta.detach().reshape(-1).tolist()], [], []
    for step in range(args.steps):
        if args.n_samples == args.batch_size:
            centres = data
        else:
            centres = data[torch.randperm(args.n_samples, generator=batches)[: args.batch_size]]
        optimizer.zero_grad()
        loss = lossfunc(model(ones), model.targets(centres))
        with cp(step, info={"loss": loss, "optimizer": optimizer}):
            loss.backward()
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # the learning rate changes after the step, so α's update prediction holds
        sched.step()
        losses.append(loss.item())
        thetas.append(model.theta.detach().reshape(-1).tolist())
    cp.close()
    record = cp.get_output()
    thetas = np.asarray(thetas)
    full = full_loss(thetas, h, data)

    def series(key):
        return [record[s].get(key, float("nan")) for s in range(args.steps)]

    alphas = series("Alpha")
    updates = series("UpdateSize")
    distances = series("Distance")
    finite_alpha = common.finite(alphas)
    return record, {
        "name": name,
        "lrs": lrs,
        "theta": thetas.tolist(),
        "minibatch_loss": losses,
        "full_loss": full.tolist(),
        "alpha": alphas,
        "update_size": [u[0] if isinstance(u, list) else u for u in updates],
        "distance": [d[0] if isinstance(d, list) else d for d in distances],
        "median_alpha": float(np.median(finite_alpha)) if finite_alpha.size else float("nan"),
        "alpha_iqr": (np.percentile(finite_alpha, [25, 75]).tolist() if finite_alpha.size else [None, None]),
        "final_full_loss": float(full[-1]),
        "final_minibatch_loss": losses[-1],
        "mean_update_size": common.median([u[0] if isinstance(u, list) else u for u in updates]),
        "final_distance": float(np.linalg.norm(thetas[-1] - thetas[0])),
    }


def plot(results, records, h, theta0, args, a, r, centres, path):
    """Figure 1 layout: trajectories left/right, loss curves middle; instruments below."""
    from instruments import draw_gauge

    centre = np.asarray(centres, dtype=float).mean(0)

    large, small = results
    rec_large, rec_small = records
    colors = {"large": "#d62728", "small": "#1f77b4"}
    fig = common.new_figure(16.5, 9.5)
    grid = fig.add_gridspec(2, 3, height_ratios=[1.15, 1])
    ax_tl = fig.add_subplot(grid[0, 0])
    ax_loss = fig.add_subplot(grid[0, 1])
    ax_tr = fig.add_subplot(grid[0, 2], sharex=ax_tl, sharey=ax_tl)
    ax_al = fig.add_subplot(grid[1, 0])
    ax_dist = fig.add_subplot(grid[1, 1])
    ax_ar = fig.add_subplot(grid[1, 2])

    all_theta = np.concatenate([np.asarray(large["theta"]), np.asarray(small["theta"])])
    pad = 0.15 * np.ptp(all_theta, axis=0) + 0.2
    x = np.linspace(all_theta[:, 0].min() - pad[0], all_theta[:, 0].max() + pad[0], 200)
    y = np.linspace(all_theta[:, 1].min() - pad[1], all_theta[:, 1].max() + pad[1], 200)
    X, Y = np.meshgrid(x, y)
    Z = 0.5 * (h[0] * (X - centre[0]) ** 2 + h[1] * (Y - centre[1]) ** 2)
    levels = np.geomspace(max(Z.min(), 1e-3), Z.max(), 12)
    for ax, res, label in ((ax_tl, large, "large constant η"), (ax_tr, small, "small decaying η")):
        ax.contourf(X, Y, Z, levels=levels, cmap="Greys", alpha=0.55)
        ax.contour(X, Y, Z, levels=levels, colors="gray", linewidths=0.5)
        t = np.asarray(res["theta"])
        ax.plot(t[:, 0], t[:, 1], "-o", color=colors[res["name"]], ms=3, lw=1.2)
        ax.plot(*t[0], "s", color="k", ms=7, label="start θ₀")
        ax.plot(*t[-1], "D", color=colors[res["name"]], mec="k", ms=7, label=f"end (step {len(t) - 1})")
        ax.plot(*centre, "*", color="gold", mec="k", ms=14, label="minimum of L(θ)")
        ax.set_xlabel("θ₁  (shallow, h₁ = %g)" % h[0])
        ax.set_ylabel("θ₂  (steep, h₂ = %g)" % h[1])
        ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    ax_tl.set_title(f"large constant η = {large['lrs'][0]:.3g} (η·h_max = {large['lrs'][0] * max(h):.2f}):\n"
                    "zig-zags across the valley", fontsize=10, color=colors["large"])
    ax_tr.set_title(f"small decaying η_t = {a:.2g}·{r:.3f}^t (η₀·h_max = {a * max(h):.2f}):\n"
                    "creeps down the steep wall, hardly moves along the valley", fontsize=10,
                    color=colors["small"])

    steps = np.arange(args.steps)
    for res, label in ((large, "large constant η"), (small, "small decaying η")):
        c = colors[res["name"]]
        ax_loss.plot(steps, res["minibatch_loss"], color=c, alpha=0.35, lw=0.9)
        ax_loss.plot(np.arange(args.steps + 1), res["full_loss"], color=c, lw=2.2,
                     label=f"{label}: final L = {res['final_full_loss']:.2f}")
    floor = float(full_loss(centre, h, centres)[0])
    ax_loss.axhline(floor, color="k", lw=0.7, ls=":", label=f"minimum L(x̄) = {floor:.2f}")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (thin: mini-batch, bold: full-data L(θ))")
    ax_loss.legend(fontsize=8.5)
    ratio = large["final_full_loss"] / small["final_full_loss"]
    ax_loss.set_title(f"loss curves look alike (final loss ratio {ratio:.2f})\n"
                      "…but the runs behave completely differently", fontsize=10)

    for ax, res, rec in ((ax_al, large, rec_large), (ax_ar, small, rec_small)):
        draw_gauge("alpha", rec, ax, last_fraction=0.25)
        lo, hi = res["alpha_iqr"]
        verdict = ("≈ +1: jumps to the mirror point → decrease η" if res["median_alpha"] > 0.5 else
                   "< 0: steps fall short of the minimum → increase η" if res["median_alpha"] < 0 else
                   "≈ 0: lands in the minimum")
        ax.set_title(f"α (cockpit-lite, all {len(common.finite(res['alpha']))} steps): median "
                     f"{res['median_alpha']:+.2f} [IQR {lo:+.2f}, {hi:+.2f}]\n{verdict}", fontsize=10,
                     color=colors[res["name"]])

    for res, label in ((large, "large"), (small, "small")):
        c = colors[res["name"]]
        ax_dist.plot(steps[1:], res["distance"][1:], color=c, lw=2, label=f"{label}: distance ‖θ_t − θ₀‖")
        ax_dist.plot(steps, res["update_size"], color=c, lw=1.2, ls="--",
                     label=f"{label}: update size ‖θ_t+1 − θ_t‖ (median {res['mean_update_size']:.2g})")
    ax_dist.set_yscale("log")
    ax_dist.set_xlabel("step")
    ax_dist.set_ylabel("length in parameter space")
    ax_dist.legend(fontsize=8, loc="lower right")
    upd_ratio = large["mean_update_size"] / small["mean_update_size"]
    ax_dist.set_title(f"distance and update size (cockpit-lite): updates {upd_ratio:.0f}× larger\n"
                      f"final distance {large['final_distance']:.2f} vs {small['final_distance']:.2f}", fontsize=10)

    fig.suptitle(
        f"Noisy quadratic ℓ_n(θ) = ½ Σ_d h_d (θ_d − x_n,d)², h = {tuple(h)}, {args.n_samples} centres x_n ~ "
        f"N(0, {args.noise:g}² I), batch {args.batch_size}, θ₀ = {tuple(theta0)}, {args.steps} SGD steps: "
        "similar loss curves, "
        "opposite diagnoses (cf. Cockpit paper Fig. 1)", fontsize=11)
    return common.save_figure(fig, path)


def main(argv=None):
    p = common.parser(NAME, __doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--h", type=float, nargs=2, default=[0.5, 10.0], help="Hessian diagonal (shallow, steep)")
    p.add_argument("--noise", type=float, default=0.2, help="std σ of the centres x_n")
    p.add_argument("--n-samples", type=int, default=None, help="number of centres (default: the batch size)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--theta0", type=float, nargs=2, default=[-4.0, 1.0])
    p.add_argument("--lr-large", type=float, default=None, help="default 2 / max(h)")
    args = p.parse_args(argv)
    if args.tiny:
        args.steps = 8
    args.n_samples = args.n_samples or args.batch_size
    if args.n_samples < args.batch_size:
        p.error("--n-samples must be at least the batch size")
    common.single_thread()
    h = [float(v) for v in args.h]
    theta0 = [float(v) for v in args.theta0]
    hessian = check_hessian(h)
    assert torch.allclose(hessian, torch.diag(torch.tensor(h, dtype=torch.float64))), hessian
    lr_large = args.lr_large or 2.0 / max(h)
    centres = make_centres(args, len(h))
    offset = (np.asarray(theta0) - centres.double().mean(0).numpy()).tolist()  # θ₀ − x̄: what GD contracts
    a, r, fit_error = fit_decay(h, offset, lr_large, args.steps)
    rec_large, large = run("large", lambda t: lr_large, args, h, theta0)
    rec_small, small = run("small", lambda t: a * r**t, args, h, theta0)
    ratio = large["final_full_loss"] / small["final_full_loss"]
    large_reading = ("large run overshoots to about the mirror point" if large["median_alpha"] > 0.5
                     else "large run does not overshoot")
    small_reading = ("small run stops short of the minimum" if small["median_alpha"] < 0
                     else "small run does not stop short")
    conclusion = (
        f"Loss curves alike: final full-data loss {large['final_full_loss']:.2f} (large η) vs "
        f"{small['final_full_loss']:.2f} (small decaying η), ratio {ratio:.2f}. "
        f"α tells them apart: median {large['median_alpha']:+.2f} vs {small['median_alpha']:+.2f} "
        f"({large_reading}; {small_reading}). "
        f"Median update size {large['mean_update_size']:.3g} vs {small['mean_update_size']:.3g} "
        f"({large['mean_update_size'] / small['mean_update_size']:.0f}×); final distance from θ₀ "
        f"{large['final_distance']:.2f} vs {small['final_distance']:.2f}."
    )
    print(conclusion)
    os.makedirs(args.out, exist_ok=True)
    png = plot((large, small), (rec_large, rec_small), h, theta0, args, a, r, centres,
               os.path.join(args.out, f"{NAME}.png"))
    summary = {
        "experiment": NAME,
        "config": {"h": h, "noise": args.noise, "batch_size": args.batch_size, "n_samples": args.n_samples,
                   "centres_mean": centres.mean(0).tolist(), "steps": args.steps,
                   "theta0": theta0, "lr_large": lr_large, "decay": {"a": a, "r": r, "fit_rms_log_error": fit_error},
                   "seed": args.seed, "tiny": args.tiny},
        "hessian_check": hessian.tolist(),
        "runs": {"large": large, "small": small},
        "conclusion": conclusion,
        "figure": png,
    }
    return common.report(args.out, NAME, summary)


if __name__ == "__main__":
    main()
