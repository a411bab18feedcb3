"""One prepared check of cockpit-lite on a GPU: correctness, host synchronisation, the histogram
kernel, overhead and memory, in one command of at most 8 minutes on one H200.

Usage::

    python -m experiments.gpu_check OUTDIR [--device cuda|cpu] [--quick] [--budget SECONDS]
        [--parts correctness syncs histogram overhead memory] [--workers N] [--wheels DIR]

It writes ``OUTDIR/gpu_check.json`` (every number; per part its status, ``ok``, ``error`` with
the last lines of the traceback, or ``skipped`` with the reason), ``OUTDIR/summary.txt`` (also
printed), ``OUTDIR/pytest.log`` (the test run's output) and ``OUTDIR/dashboard.png``. A part that
fails is recorded and the next one runs; a time guard (``--budget``, 450 s; 120 s with
``--quick``) gives each part a share of the time and skips what no longer fits, saying so.

Parts:

1. ``correctness``: the test files of ``DEVICE_TESTS`` (``QUICK_TESTS`` with ``--quick``) by
   pytest in a subprocess with ``COCKPIT_LITE_TEST_DEVICE`` set to the device, so that every test
   built on ``tests/problems.py`` (quantities, curvature, layer rules on the realistic models,
   histograms, ``samples=k``) runs there with its float64 brute force; the counts and the
   failures, read from this module as a pytest plugin (one line per test outcome, so a run cut
   short still counts). Then checks of our own on the device: bf16 autocast, and fp16 autocast
   with a ``GradScaler``, against a brute-force loop of the same forward pass; the dashboard
   data path (a ``configuration("full")`` run on the device, its record free of tensors, the
   dashboard rendered).
2. ``syncs``: every host synchronisation (``torch.cuda.set_sync_debug_mode("warn")``, each one
   with where it happened) of a plain step, an untracked step, the default ``Cockpit(model)``
   between its due steps, the histogram kernels, and tracked steps at each level, split into the
   Cockpit's entry, the backward pass (its hooks), the step's end and ``optimizer.step()``. The
   untracked step, the histogram and the hooks must have none. On the CPU: not applicable.
3. ``histogram``: ``histogram1d`` / ``histogram2d`` against a ``put_``-based kernel (Cockpit's
   approach), ``torch.histc``, a ``bincount`` of the same index and ``torch.histogramdd`` where
   it runs, on uniform and skewed data of 1e6, 1e8 and 1e9 values; counts compared with ours,
   times by CUDA events (median of 3 after a warm-up; one call where a call takes over a second).
4. ``overhead``: step time over the plain step, interleaved rounds in one process, CUDA events:
   untracked, the default ``Cockpit(model)`` (diagnosis only, whole periods of its schedule),
   economy, economy ``samples=8``, business, full, cockpit-lite with NormTest + GradVariance, and
   Opacus and torch.func doing that work; on a CIFAR-size CNN (batch 128), a ResNet-18 with
   BatchNorm (batch 128) and a GPT-2-small (124M parameters, T = 256, batch 16) in fp32 and in
   bf16 autocast. Every configuration that reports NormTest and GradVariance at its first step,
   and each peer, is checked first against a brute-force loop over the samples.
5. ``memory``: ``torch.cuda.max_memory_allocated`` growth of each configuration's step (taken
   while part 4 times it) and its excess over the plain step's; the largest batch that fits for
   the plain step and for economy on GPT-2-small in bf16 autocast (doubling, then bisection, to
   1/8 of the batch). On the CPU: not applicable.

On a GPU machine without network access (BackPACK, Cockpit and Opacus missing there), the
packages travel as pure-Python wheels. Where pip reaches an index, fetch them once into the
folder ``.wheels`` of the repository root (ignored by git; 0.7 MiB)::

    bash experiments/gpu_wheels.sh

Then run one command in the repository root of the GPU machine, with ``.wheels`` carried along
with the working tree (the only path to carry) and a limit of 600 seconds (the check ends within
``--budget``, 450 s, plus about half a minute of start-up)::

    PYTHONUNBUFFERED=1 python3 -m experiments.gpu_check "$OUT/gpu_check" --device cuda

``$OUT`` stands for a folder whose files come back from that machine: the four files above land
in ``$OUT/gpu_check``; the JSON and the summary are rewritten after every part, so a run stopped
early keeps what it measured. Missing packages are installed from ``--wheels`` (default
``.wheels``) by ``pip install --no-deps --no-index`` into a temporary folder put on the path of
this process and of the test run. ``--device cpu --quick`` runs every part small on the CPU
(``tests/experiments/test_gpu_check.py``).
"""

import argparse
import contextlib
import gc
import importlib.util
import json
import logging
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("correctness", "syncs", "histogram", "overhead", "memory")
SHARES = {"correctness": 0.32, "syncs": 0.06, "histogram": 0.12, "overhead": 0.36, "memory": 0.14}
"""Each part's share of the time budget (time a part leaves unused goes to the parts after it)."""
BUDGET_S, QUICK_BUDGET_S = 450.0, 120.0
PACKAGES = {"backpack": "backpack_for_pytorch", "cockpit": "cockpit_for_pytorch", "opacus": "opacus",
            "unfoldNd": "unfoldNd", "json_tricks": "json_tricks", "einops": "einops"}
"""Module -> wheel file prefix of what ``experiments/gpu_wheels.sh`` downloads."""
DEVICE_TESTS = (
    "tests/quantities", "tests/curvature", "tests/engine/test_engine.py", "tests/engine/test_discovery.py",
    "tests/engine/test_window.py", "tests/test_cockpit.py", "tests/test_subsample.py", "tests/test_histogram.py",
    "tests/engine/test_transforms.py",
    # the cases of code a GPU alone runs, outside the files above (the survivors of the mutation runs,
    # docs/development.md): the embedding rule's keys, the generic re-run's random states and autocast, the
    # global path's random states, the batch-independence check's mask
    "tests/engine/test_rules.py::test_embedding_rule_matches_a_sample_loop",
    "tests/engine/test_rules.py::test_the_generic_re_run_leaves_buffers_and_the_random_state_alone",
    "tests/engine/test_rules.py::test_the_generic_re_run_runs_without_the_users_autocast",
    "tests/engine/test_global_path.py::test_backward_passes_that_recompute_a_dropout_leave_the_random_state_alone",
    "tests/checks/test_batch_independence.py::test_mixing_is_measured_and_fixed",
)
QUICK_TESTS = ("tests/quantities/test_norm_test.py::test_matches_brute_force[mlp-2-mean]",)
REPORTS_VARIABLE = "GPU_CHECK_REPORTS"
TEST_DEVICE_VARIABLE = "COCKPIT_LITE_TEST_DEVICE"
TOLERANCE = {"fp32": 1e-2, "bf16": 5e-2, "fp16": 5e-2}
"""Largest relative difference from the brute force (NormTest, GradVariance): cuDNN convolutions
run in TF32 by default; autocast rounds activations to 8 (bf16) or 11 (fp16) bits."""
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
SAMPLES = 8
PEERS = ("Opacus", "torch.func")
"""Configurations of other tools: a difference from the brute force is theirs ("differs"; Opacus takes
the positions of a position embedding for samples, see ``benchmarks.bench_per_sample``)."""


def tail(text, lines=8):
    """The last ``lines`` lines of ``text``."""
    return "\n".join(str(text).strip().splitlines()[-lines:])


class Guard:
    """The time budget: a deadline for the whole check and, per part, its share of what is left."""

    def __init__(self, budget):
        self.start = time.monotonic()
        self.end = self.start + budget

    def left(self):
        return self.end - time.monotonic()

    def elapsed(self):
        return time.monotonic() - self.start

    def part_deadline(self, part, parts):
        """Now plus this part's share of the time left, over the shares of the parts still to run."""
        later = parts[parts.index(part):]
        share = SHARES[part] / sum(SHARES[p] for p in later)
        return time.monotonic() + share * self.left()


@dataclass
class Context:
    device: torch.device
    quick: bool
    out: Path
    deadline: float = math.inf
    workers: int = 0
    pythonpath: list = field(default_factory=list)
    overhead: dict = field(default_factory=dict)

    @property
    def cuda(self):
        return self.device.type == "cuda"

    def left(self):
        return self.deadline - time.monotonic()


# ---------------------------------------------------------------------------------------------
# wheels


def ensure_packages(wheels):
    """Install the packages of ``PACKAGES`` that are missing from the wheels in ``wheels`` (pip,
    ``--no-deps --no-index``, into a temporary folder put first on ``sys.path``). Returns
    ``(the folders added to the path, {module: "present" | "installed" | reason})``."""
    status = {module: "present" for module in PACKAGES if importlib.util.find_spec(module) is not None}
    missing = [m for m in PACKAGES if m not in status]
    if not missing:
        return [], status
    files = [f for m in missing for f in sorted(Path(wheels).glob(f"{PACKAGES[m]}-*.whl"))]
    found = {m for m in missing if any(f.name.startswith(PACKAGES[m] + "-") for f in files)}
    for module in set(missing) - found:
        status[module] = f"missing: no {PACKAGES[module]}-*.whl in {wheels}"
    if not files:
        return [], status
    target = tempfile.mkdtemp(prefix="gpu_check_site_")
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
               "--disable-pip-version-check", "--target", target, *map(str, files)]
    done = subprocess.run(command, capture_output=True, text=True)
    for module in found:
        status[module] = "installed" if done.returncode == 0 else f"pip failed: {tail(done.stderr, 3)}"
    sys.path.insert(0, target)
    importlib.invalidate_caches()
    return [target], status


# ---------------------------------------------------------------------------------------------
# timing and memory


def timed(ctx, fn, count=1):
    """Seconds per call of ``fn`` over ``count`` calls (CUDA events on a GPU)."""
    if ctx.cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / count
    begin = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - begin) / count


def release(ctx):
    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# models and runners


@dataclass
class Spec:
    """A model to train: builder, batch maker ``(generator, batch size) -> (x, y)`` (CPU), loss,
    per-sample losses (``mean_n ℓ_n = L``), batch size, precision, BackPACK supports it."""

    name: str
    build: object
    batch: object
    loss: object
    individual: object
    batch_size: int
    precision: str = "fp32"
    backpack: bool = False


def autocast(ctx, precision):
    """The autocast region of ``precision`` ("fp32": none)."""
    dtype = AUTOCAST[precision]
    return contextlib.nullcontext() if dtype is None else torch.autocast(ctx.device.type, dtype=dtype)


def _cross_entropy(out, y):
    return torch.nn.functional.cross_entropy(out.float(), y)


def _cross_entropy_individual(out, y):
    return torch.nn.functional.cross_entropy(out.float(), y, reduction="none")


def _token_loss(out, y):
    return torch.nn.functional.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))


def _token_individual(out, y):
    losses = torch.nn.functional.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1), reduction="none")
    return losses.view(y.shape).mean(1)


def _images(shape):
    return lambda g, b: (torch.randn(b, *shape, generator=g), torch.randint(0, 10, (b,), generator=g))


def _text(vocab, length):
    def batch(g, b):
        ids = torch.randint(0, vocab, (b, length + 1), generator=g)
        return ids[:, :-1], ids[:, 1:]

    return batch


def gpt(vocab, d, length, blocks, heads):
    """``benchmarks.bench_per_sample.GPT`` (nanoGPT-style, tied head) of this size."""
    from benchmarks import bench_per_sample

    return lambda: bench_per_sample.GPT(vocab=vocab, d=d, length=length, blocks=blocks, heads=heads)


def overhead_specs(quick):
    """The models of part 4: GPT-2-small is 123.9M parameters with 256 positions."""
    from benchmarks import bench_overhead

    if quick:
        return [Spec("cnn", bench_overhead.cnn, _images((3, 32, 32)), _cross_entropy, _cross_entropy_individual, 4,
                     backpack=True),
                Spec("gpt", gpt(64, 32, 8, 1, 2), _text(64, 8), _token_loss, _token_individual, 2, precision="bf16")]
    image = dict(batch=_images((3, 32, 32)), loss=_cross_entropy, individual=_cross_entropy_individual,
                 batch_size=128)
    text = dict(build=gpt(50257, 768, 256, 12, 12), batch=_text(50257, 256), loss=_token_loss,
                individual=_token_individual, batch_size=16)
    return [Spec("cnn", bench_overhead.cnn, backpack=True, **image), Spec("resnet18", bench_overhead.resnet18, **image),
            Spec("gpt2-small", **text), Spec("gpt2-small", precision="bf16", **text)]


class Runner:
    """One configuration of one model on the device: model, optimizer, batches and its step.

    ``kind``: ``"plain"``, ``"cockpit"`` (``make_cockpit(model)``), ``"opacus"`` or ``"func"``.
    ``period``/``skip``: time whole periods of a sparse schedule after its first ``skip`` steps.
    """

    def __init__(self, ctx, spec, kind="plain", make_cockpit=None, extend=False, period=1, skip=0):
        self.ctx, self.spec, self.kind = ctx, spec, kind
        torch.manual_seed(0)
        with ctx.device:  # initialised where it trains (a GPT-2's 124M parameters: seconds on a CPU)
            self.model = spec.build()
        self.loss_fn = spec.loss
        if extend:
            from cockpit_lite import extend as backpack_extend

            self.model = backpack_extend(self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.cp = make_cockpit(self.model) if kind == "cockpit" else None
        self.module = self._peer() if kind in ("opacus", "func") else None
        g = torch.Generator().manual_seed(1)
        self.batches = [tuple(t.to(ctx.device) for t in spec.batch(g, spec.batch_size)) for _ in range(2)]
        self.step, self.period, self.skip = 0, period, skip
        self.first = None  # the statistics of the first step (peers), for the check

    def autocast(self):
        return autocast(self.ctx, self.spec.precision)

    def _peer(self):
        if self.kind == "opacus":
            from opacus import GradSampleModule

            return GradSampleModule(self.model)
        from torch.func import functional_call, grad, vmap

        model, loss_fn = self.model, self.loss_fn
        buffers = dict(model.named_buffers())

        def one(params, x, y):
            return loss_fn(functional_call(model, (params, buffers), (x[None],)), y[None])

        return vmap(grad(one), in_dims=(None, 0, 0))

    def run_step(self, phases=None):
        """One training step; ``phases(name)`` is told when each stage starts (syncs)."""
        from benchmarks.bench_per_sample import from_individual

        mark = phases or (lambda name: None)
        x, y = self.batches[self.step % len(self.batches)]
        mark("forward")
        self.opt.zero_grad(set_to_none=True)
        stats = None
        if self.kind == "func":
            params = {n: p.detach() for n, p in self.model.named_parameters()}
            with self.autocast():
                individual = self.module(params, x, y)
            for name, p in self.model.named_parameters():
                p.grad = individual[name].mean(0)
            stats = from_individual(list(individual.values()))
        else:
            with self.autocast():
                out = (self.model if self.module is None else self.module)(x)
            loss = self.loss_fn(out, y)
            if self.cp is None:
                mark("backward")
                loss.backward()
            else:
                context = self.cp(self.step, info={"loss": loss, "optimizer": self.opt})
                mark("enter")
                context.__enter__()
                mark("backward")
                loss.backward(create_graph=self.cp.create_graph(self.step))
                mark("exit")
                context.__exit__(None, None, None)
            if self.kind == "opacus":
                params = [p for p in self.module.parameters() if p.requires_grad]
                stats = from_individual([p.grad_sample for p in params])
                for p in params:
                    p.grad_sample = None
        mark("optimizer")
        self.opt.step()
        self.step += 1
        return stats

    def time_steps(self, steps):
        """Seconds per step over ``steps`` steps (whole periods) after a warm-up step."""
        self.run_step()
        while self.step < self.skip or self.step % self.period:
            self.run_step()
        steps = -(-steps // self.period) * self.period
        return timed(self.ctx, self.run_step, steps)

    def statistics(self):
        """``{"NormTest": ..., "GradVariance": total}`` of the first step, as far as recorded."""
        if self.first is not None:
            return dict(zip(("NormTest", "GradVariance"), self.first))
        entry = self.cp.get_output().get(0, {}) if self.cp is not None else {}
        return {name: entry[name] if name == "NormTest" else sum(entry[name])
                for name in ("NormTest", "GradVariance") if name in entry}


def brute_force_statistics(ctx, spec):
    """``{"NormTest": ..., "GradVariance": total}`` of the first batch at the initial weights by a loop of
    ``autograd.grad`` over the per-sample losses of one forward pass (same precision)."""
    from benchmarks.bench_per_sample import statistics_of

    runner = Runner(ctx, spec)
    model = runner.model
    x, y = runner.batches[0]
    params = [p for p in model.parameters() if p.requires_grad]
    with runner.autocast():
        out = model(x)
    losses = spec.individual(out, y)
    b = losses.shape[0]
    sq_norms = torch.zeros(b, dtype=torch.float64, device=ctx.device)
    sums = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    squares = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    for n in range(b):
        grads = torch.autograd.grad(losses[n], params, retain_graph=n + 1 < b)
        for s, q, g in zip(sums, squares, grads):
            g = g.double()
            s.add_(g)
            q.add_(g * g)
            sq_norms[n] += (g * g).sum()
    return dict(zip(("NormTest", "GradVariance"), statistics_of(b, sq_norms, sums, squares)))


def relative_difference(values, reference):
    return max(abs(v - r) / max(abs(r), 1e-30) for v, r in zip(values, reference))


def configurations(spec):
    """{name: Runner keyword arguments} of part 4 (and of part 2, on small models)."""
    from cockpit_lite import Cockpit, configuration, diagnosis, quantities
    from benchmarks.bench_overhead import never

    def lite(level, **kwargs):
        return lambda m: Cockpit(m, configuration(level), diagnose=False, **kwargs)

    return {
        "plain": {},
        "untracked": dict(kind="cockpit", make_cockpit=lambda m: Cockpit(
            m, configuration("economy", track_schedule=never), diagnose=False)),
        "diagnosis": dict(kind="cockpit", make_cockpit=lambda m: Cockpit(m), period=diagnosis.EVERY,
                          skip=diagnosis.DENSE_STEPS),
        "economy": dict(kind="cockpit", make_cockpit=lite("economy")),
        f"economy samples={SAMPLES}": dict(kind="cockpit", make_cockpit=lite("economy", samples=SAMPLES)),
        "business": dict(kind="cockpit", make_cockpit=lite("business"), extend=spec.backpack),
        "full": dict(kind="cockpit", make_cockpit=lite("full"), extend=spec.backpack),
        "lite NormTest+GradVariance": dict(kind="cockpit", make_cockpit=lambda m: Cockpit(
            m, [quantities.NormTest(), quantities.GradVariance()], diagnose=False)),
        "Opacus": dict(kind="opacus"),
        "torch.func": dict(kind="func"),
    }


# ---------------------------------------------------------------------------------------------
# part 1: correctness


def pytest_runtest_logreport(report):
    """pytest hook (this module as a plugin, ``-p experiments.gpu_check``): one JSON line per test
    outcome into the file ``GPU_CHECK_REPORTS`` names (on the controller of an xdist run only)."""
    path = os.environ.get(REPORTS_VARIABLE)
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when != "call" and report.outcome == "passed":
        return
    line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome}
    if report.outcome == "failed":
        line["message"] = tail(report.longreprtext, 6)
    with open(path, "a", encoding="utf-8") as file:
        file.write(json.dumps(line) + "\n")


def run_tests(ctx, selection):
    """The test files of ``selection`` on ``ctx.device`` in a pytest subprocess: counts, failures."""
    reports = ctx.out / "pytest_reports.jsonl"
    reports.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
    env.update({TEST_DEVICE_VARIABLE: str(ctx.device), REPORTS_VARIABLE: str(reports)})  # (run from an xdist worker too)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*ctx.pythonpath, str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "experiments.gpu_check",
               "-W", "ignore::DeprecationWarning", *selection]
    if ctx.workers > 1 and importlib.util.find_spec("xdist") is not None:
        command += ["-n", str(ctx.workers)]
    timeout = max(10.0, ctx.left() - (30.0 if not ctx.quick else 5.0))
    log = ctx.out / "pytest.log"
    with open(log, "w", encoding="utf-8") as file:
        # a process group of its own: the time guard stops the xdist workers with it
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=file, stderr=subprocess.STDOUT, process_group=0)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = f"stopped by the time guard after {timeout:.0f} s"
    lines = [json.loads(line) for line in reports.read_text().splitlines()] if reports.exists() else []
    reports.unlink(missing_ok=True)
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failures = []
    for line in lines:
        if line["outcome"] == "failed":
            counts["failed" if line["when"] == "call" else "errors"] += 1
            failures.append({"test": line["test"], "when": line["when"], "message": line.get("message", "")})
        else:
            counts[line["outcome"]] += 1
    return {"selection": list(selection), "exit": code, "counts": counts, "failures": failures,
            "log_tail": tail(log.read_text(), 5)}


def autocast_check(ctx, precision, scaler):
    """A float32 CNN + MLP head under autocast (with a GradScaler for fp16): NormTest, GradVariance
    and GradNorm of two steps against a brute-force loop over the same forward pass, of the loss
    that is backpropagated (with a GradScaler, the scaled loss: its gradients are what the
    Cockpit sees before ``scaler.step`` unscales them, and every step must carry the flag that
    says so and no other; without one, ``strict=True`` stops at any flag)."""
    from cockpit_lite import Cockpit, quantities

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5)).to(ctx.device)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-2)
    grad_scaler = torch.amp.GradScaler(ctx.device.type, init_scale=2.0**10) if scaler else None
    cp = Cockpit(model, [quantities.NormTest(), quantities.GradVariance(), quantities.GradNorm()],
                 strict=not scaler, diagnose=False)
    g = torch.Generator().manual_seed(2)
    worst, flagged = 0.0, True
    for step in range(2):
        x, y = torch.randn(16, 3, 8, 8, generator=g).to(ctx.device), torch.randint(0, 5, (16,), generator=g).to(ctx.device)
        with torch.autocast(ctx.device.type, dtype=AUTOCAST[precision]):
            out = model(x)
        losses = torch.nn.functional.cross_entropy(out.float(), y, reduction="none")
        grads = [torch.cat([gr.double().reshape(-1) for gr in torch.autograd.grad(losses[n], params, retain_graph=True)])
                 for n in range(16)]
        flat = torch.stack(grads)
        mean = flat.mean(0)
        norm_test = (((flat - mean) ** 2).sum() / (15 * 16 * (mean**2).sum())).sqrt()
        scale = grad_scaler.get_scale() if scaler else 1.0
        expected = [float(norm_test), scale**2 * float(flat.var(0).sum()), scale * float(mean.norm())]
        loss = losses.mean()
        opt.zero_grad()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            (grad_scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            grad_scaler.step(opt)
            grad_scaler.update()
        else:
            opt.step()
        entry = cp.get_output()[step]
        got = [entry["NormTest"], sum(entry["GradVariance"]), math.sqrt(sum(v * v for v in entry["GradNorm"]))]
        worst = max(worst, relative_difference(got, expected))
        flags = entry.get("flags", [])
        flagged = flagged and (not scaler or (len(flags) == 1 and "was scaled by" in flags[0]))
    return {"relative_difference": worst, "tolerance": TOLERANCE[precision], "scale_flagged": flagged,
            "passed": worst <= TOLERANCE[precision] and flagged}


def dashboard_check(ctx):
    """``configuration("full")`` for three steps of a small CNN on the device; the record holds no
    tensors; the dashboard renders from the live Cockpit."""
    import numpy as np

    import instruments
    from cockpit_lite import Cockpit, configuration
    from benchmarks import bench_overhead

    torch.manual_seed(0)
    model = bench_overhead.cnn().to(ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    cp = Cockpit(model, configuration("full"))
    g = torch.Generator().manual_seed(3)
    for step in range(3):
        x, y = torch.randn(8, 3, 32, 32, generator=g).to(ctx.device), torch.randint(0, 10, (8,), generator=g).to(ctx.device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward(create_graph=cp.create_graph(step))
        opt.step()
    record = cp.get_output()
    bad = []

    def visit(value, where):
        if isinstance(value, torch.Tensor):
            bad.append(where)
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(v, f"{where}/{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value[:3]):
                visit(v, f"{where}[{i}]")
        elif not isinstance(value, (int, float, str, bool, type(None), np.ndarray, np.generic)):
            bad.append(f"{where}: {type(value).__name__}")

    visit(record, "record")
    path = instruments.render(cp, str(ctx.out / "dashboard.png"))
    size = os.path.getsize(path)
    names = sorted({name for entry in record.values() for name in entry})
    return {"quantities": names, "not_host_values": bad[:10], "png_bytes": size, "passed": not bad and size > 0}


def part_correctness(ctx):
    result = {"tests": run_tests(ctx, QUICK_TESTS if ctx.quick else DEVICE_TESTS)}
    own = {}
    checks = {"bf16 autocast": lambda: autocast_check(ctx, "bf16", False),
              "fp16 autocast + GradScaler": lambda: autocast_check(ctx, "fp16", True),
              "dashboard data path": lambda: dashboard_check(ctx)}
    for name, check in checks.items():
        try:
            own[name] = check()
        except Exception:
            own[name] = {"passed": False, "error": tail(traceback.format_exc())}
    result["own_checks"] = own
    return result


# ---------------------------------------------------------------------------------------------
# part 2: host synchronisations


class SyncTrace:
    """Every synchronising CUDA call in the ``with`` block (sync debug mode ``"warn"``), each with
    the stage it happened in and the frames of this repository that led to it."""

    MESSAGE = "synchronizing CUDA operation"

    def __init__(self, cuda=True):
        self.syncs, self.phase, self.cuda = [], "-", cuda

    def mark(self, phase):
        self.phase = phase

    def _show(self, message, category, filename, lineno, file=None, line=None):
        if self.MESSAGE not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1]
                  if f.filename.startswith(str(ROOT)) and "site-packages" not in f.filename
                  and f.filename != __file__]
        stack = [f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} {f.name}" for f in frames[-5:]]
        self.syncs.append({"phase": self.phase, "where": stack[-1] if stack else f"{filename}:{lineno}",
                           "stack": stack})

    def __enter__(self):
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._show
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
        self._warnings.__exit__(*exc)
        return False


def sync_specs(quick):
    from benchmarks import bench_overhead

    image = dict(batch=_images((3, 32, 32)), loss=_cross_entropy, individual=_cross_entropy_individual,
                 batch_size=4 if quick else 16)
    return [Spec("cnn", bench_overhead.cnn, backpack=True, **image), Spec("resnet_bn", bench_overhead.resnet_bn, **image),
            Spec("gpt", gpt(256, 64, 32, 2, 4), _text(256, 32), _token_loss, _token_individual, 8),
            Spec("gpt", gpt(256, 64, 32, 2, 4), _text(256, 32), _token_loss, _token_individual, 8, precision="bf16")]


def histogram_syncs(ctx):
    from cockpit_lite.histogram import histogram1d, histogram1d_batch, histogram2d

    x = 1e-3 * torch.randn(64, 1000, device=ctx.device)
    y = 0.1 * torch.randn(1000, device=ctx.device)
    calls = [lambda: histogram1d(x, 40, (-1, 1)), lambda: histogram2d(x, y, (40, 50), ((-1, 1), (-2, 2)), scale=64.0),
             lambda: histogram1d_batch([x, y], 40, (-1, 1)), lambda: histogram1d(x.double(), 40, (-1, 1))]
    for call in calls:  # warm-up: cached constants and fold maps
        call()
    if ctx.cuda:
        torch.cuda.synchronize()
    with SyncTrace(ctx.cuda) as trace:
        for call in calls:
            call()
    return trace.syncs


def part_syncs(ctx):
    """The syncs of each stage of a step (see ``SyncTrace``); on the CPU the same steps run (of the
    first model only with ``--quick``), and the part is "not applicable"."""
    result = {"histogram": {"syncs": histogram_syncs(ctx)}, "steps": {}}
    names = ["plain", "untracked", "diagnosis", "economy", f"economy samples={SAMPLES}", "business", "full"]
    specs = sync_specs(ctx.quick)
    for spec in specs[:1] if ctx.quick and not ctx.cuda else specs:
        label = f"{spec.name} {spec.precision}"
        for name in names:
            if ctx.left() < 5:
                result["steps"].setdefault("skipped", []).append(f"{label} {name}")
                continue
            try:
                kwargs = dict(configurations(spec)[name])
                kwargs.pop("period", None), kwargs.pop("skip", None)
                runner = Runner(ctx, spec, **kwargs)
                steps = {}
                count = 13 if name == "diagnosis" else 2  # diagnosis: steps 0-10 are due (and 11 ends UpdateSize), 12 is not
                for step in range(count):
                    with SyncTrace(ctx.cuda) as trace:
                        runner.run_step(trace.mark)
                    steps[step] = trace.syncs
                if name == "diagnosis":
                    entry = {"due step 1": steps[1], "not due step 12": steps[12]}
                else:
                    entry = {"first step": steps[0], "second step": steps[1]}
                result["steps"][f"{label} {name}"] = entry
                del runner
            except Exception:
                result["steps"][f"{label} {name}"] = {"error": tail(traceback.format_exc())}
        release(ctx)
    result["verdict"] = sync_verdict(result)
    if not ctx.cuda:
        result.update(status="not applicable", reason="no CUDA device: the CPU has no host synchronisation")
    return result


def sync_verdict(result):
    """Syncs where there must be none (histogram, untracked steps, a tracked step's backward hooks),
    where they are allowed (a tracked step's entry, end and optimizer step; the default
    ``Cockpit(model)`` between its sparse steps, where ``NonfiniteOrigin`` checks every step's loss
    once), of the plain step (for reference), and how often each place synchronised."""
    verdict = {"histogram": len(result["histogram"]["syncs"]), "plain": 0, "untracked": 0, "hooks": 0,
               "step end": 0, "diagnosis between": 0, "places": {}}
    for label, entry in result["steps"].items():
        if label == "skipped" or "error" in entry:
            continue
        for which, syncs in entry.items():
            for sync in syncs:
                if label.endswith(" plain"):
                    verdict["plain"] += 1
                    continue
                if label.endswith(" untracked"):
                    verdict["untracked"] += 1
                elif which.startswith("not due"):
                    verdict["diagnosis between"] += 1
                else:
                    verdict["hooks" if sync["phase"] == "backward" else "step end"] += 1
                place = f'{sync["phase"]}: {sync["where"]}'
                verdict["places"][place] = verdict["places"].get(place, 0) + 1
    verdict["passed"] = verdict["histogram"] == verdict["untracked"] == verdict["hooks"] == 0
    return verdict


# ---------------------------------------------------------------------------------------------
# part 3: histogram kernel


def put_histogram(index_of, values, bins):
    """Cockpit's approach: the flat bin index of every value, then ``put_(..., accumulate=True)``."""
    index = index_of(values)
    counts = torch.zeros(math.prod(bins), dtype=torch.int64, device=index.device)
    counts.put_(index, torch.ones_like(index), accumulate=True)
    return counts.view(bins)


def bincount_histogram(index_of, values, bins):
    return torch.bincount(index_of(values), minlength=math.prod(bins)).view(bins)


def flat_index(bins, ranges):
    """``values -> flat bin index`` (int64, clamped into the range) for 1 or 2 coordinates."""
    def index_of(values):
        flat = None
        for v, n, (lo, hi) in zip(values, bins, ranges):
            i = ((v - lo) * (n / (hi - lo))).floor_().clamp_(0, n - 1).long()
            flat = i if flat is None else flat * n + i
        return flat

    return index_of


def histogram_data(ctx, n, kind, dims, generator):
    from benchmarks.bench_histogram import RANGE

    if kind == "skewed":
        scales = (1e-3, 0.1)
        return [s * torch.randn(n, device=ctx.device, generator=generator) for s in scales[:dims]]
    return [lo + (hi - lo) * torch.rand(n, device=ctx.device, generator=generator) for lo, hi in RANGE[:dims]]


def histogram_contenders(ctx, dims):
    from cockpit_lite.histogram import histogram1d, histogram2d
    from benchmarks.bench_histogram import BINS, RANGE

    bins, ranges = (BINS[:1], RANGE[:1]) if dims == 1 else (BINS, RANGE)
    index_of = flat_index(bins, ranges)
    calls = {"ours": (lambda v: histogram1d(v[0], bins[0], ranges[0])[0]) if dims == 1 else
             (lambda v: histogram2d(v[0], v[1], bins, ranges)[0])}
    calls["put_ (Cockpit's approach)"] = lambda v: put_histogram(index_of, v, bins)
    calls["bincount"] = lambda v: bincount_histogram(index_of, v, bins)
    if dims == 1:
        calls["torch.histc"] = lambda v: torch.histc(v[0], bins[0], *ranges[0])
    else:
        calls["torch.histc (flat index)"] = lambda v: torch.histc(index_of(v).float(), math.prod(bins), 0,
                                                                  math.prod(bins)).view(bins)
    flat_range = [e for r in ranges for e in r]
    calls["torch.histogramdd"] = lambda v: torch.histogramdd(torch.stack(v, 1), bins=list(bins), range=flat_range)[0]
    return calls


def time_call(ctx, call, values):
    """(median seconds of 3 calls after a warm-up, or the warm-up's when it took over 1 s; counts)."""
    results = []
    seconds = timed(ctx, lambda: results.append(call(values)))
    if seconds <= 1.0:
        seconds = statistics.median(timed(ctx, lambda: call(values)) for _ in range(3))
    return seconds, results[0]


def part_histogram(ctx):
    sizes = (10**4,) if ctx.quick else (10**6, 10**8, 10**9)
    generator = torch.Generator(device=ctx.device).manual_seed(0)
    rows = []
    for dims in (1, 2):
        for kind in ("skewed", "uniform"):
            predicted = 0.0  # seconds of this row, from the row of the previous size
            for n in sizes:
                if ctx.left() < max(5.0, predicted):
                    rows.append({"dims": dims, "kind": kind, "n": n, "skipped": "time guard"})
                    continue
                begin = time.monotonic()
                values = histogram_data(ctx, n, kind, dims, generator)
                row = {"dims": dims, "kind": kind, "n": n, "ms": {}, "same_counts": {}, "errors": {}}
                reference = None
                for name, call in histogram_contenders(ctx, dims).items():
                    try:
                        seconds, counts = time_call(ctx, call, values)
                    except Exception as error:
                        row["errors"][name] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
                        continue
                    counts = counts.to(torch.int64)
                    row["ms"][name] = seconds * 1e3
                    if reference is None:
                        reference = counts
                    moved = int((counts - reference).abs().sum()) // 2
                    row["same_counts"][name] = "yes" if moved == 0 and int(counts.sum()) == int(reference.sum()) else f"no ({moved} moved)"
                    del counts
                rows.append(row)
                del values, reference
                release(ctx)
                following = sizes[sizes.index(n) + 1:]  # linear in n: an upper bound where launches dominate
                predicted = (time.monotonic() - begin) * following[0] / n if following else 0.0
    return {"rows": rows}


# ---------------------------------------------------------------------------------------------
# parts 4 and 5: overhead and memory


def measure_model(ctx, spec, deadline):
    """Step times (median of interleaved rounds), check against the brute force, memory growth."""
    result = {"model": spec.name, "precision": spec.precision, "batch": spec.batch_size}
    runners, errors = {}, {}
    for name, kwargs in configurations(spec).items():
        try:
            runner = Runner(ctx, spec, **kwargs)
            runner.first = runner.run_step()  # the first step: the statistics to check
            runners[name] = runner
        except Exception:
            errors[name] = tail(traceback.format_exc(), 4)
            release(ctx)
    result["parameters"] = sum(p.numel() for p in next(iter(runners.values())).model.parameters()) if runners else None
    checks = {}
    try:
        reference = brute_force_statistics(ctx, spec)
        result["brute_force"] = reference
        for name, runner in runners.items():
            got = runner.statistics()
            if got and "samples=" not in name:  # a subsampled estimate is not the batch's
                difference = relative_difference([got[k] for k in got], [reference[k] for k in got])
                checks[name] = {"relative_difference": difference, "passed": difference <= TOLERANCE[spec.precision]}
    except Exception:
        errors["brute force"] = tail(traceback.format_exc(), 4)
    release(ctx)
    times = {name: [] for name in runners}
    growth = {name: 0 for name in runners}
    steps = 1 if ctx.quick else 3
    rounds, round_seconds = 0, 0.0
    while rounds < (1 if ctx.quick else 5) and (rounds == 0 or time.monotonic() + round_seconds < deadline):
        begin = time.monotonic()
        for name, runner in runners.items():
            if ctx.cuda:
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            try:
                times[name].append(runner.time_steps(steps))
            except Exception:
                errors[name] = tail(traceback.format_exc(), 4)
            if ctx.cuda:
                growth[name] = max(growth[name], torch.cuda.max_memory_allocated() - before)
        rounds += 1
        round_seconds = time.monotonic() - begin
    medians = {name: statistics.median(t) for name, t in times.items() if t}
    plain = medians.get("plain")
    result.update(rounds=rounds, steps_per_round=steps, plain_ms=plain * 1e3 if plain else None,
                  ratio={name: m / plain for name, m in medians.items()} if plain else {},
                  checks=checks, errors=errors)
    if ctx.cuda:
        result["memory_growth_bytes"] = growth
    del runners
    release(ctx)
    return result


def part_overhead(ctx):
    specs = overhead_specs(ctx.quick)
    results = []
    for i, spec in enumerate(specs):
        if ctx.left() < 15:
            results.append({"model": spec.name, "precision": spec.precision, "skipped": "time guard"})
            continue
        deadline = time.monotonic() + ctx.left() / (len(specs) - i)
        try:
            results.append(measure_model(ctx, spec, deadline))
        except Exception:
            results.append({"model": spec.name, "precision": spec.precision, "error": tail(traceback.format_exc())})
            release(ctx)
    ctx.overhead = results
    return {"models": results}


def largest_batch(fits, start, cap, deadline, resolution=8):
    """The largest batch ``b <= cap`` with ``fits(b)``, by doubling from ``start`` and then
    bisection until the interval is under ``lo / resolution``. Returns ``(lo, hi, trials)``:
    ``lo`` fits (0 if ``start`` does not), ``hi`` does not (``None``: ``cap`` fits); stops early at
    ``deadline`` (``time.monotonic()``) with the bounds found so far."""
    lo, hi, trials = 0, None, []

    def trial(b):
        ok = fits(b)
        trials.append((b, ok))
        return ok

    b = start
    while b <= cap and time.monotonic() < deadline:
        if not trial(b):
            hi = b
            break
        lo = b
        b = min(2 * b, cap) if b < cap else cap + 1
    while hi is not None and lo and hi - lo > max(1, lo // resolution) and time.monotonic() < deadline:
        middle = (lo + hi) // 2
        if trial(middle):
            lo = middle
        else:
            hi = middle
    return lo, hi, trials


def batch_fits(ctx, spec, economy):
    """``fits(b)``: one step of ``spec`` with batch ``b`` (economy: under ``Cockpit(model,
    configuration("economy"))``, its NormTest finite) runs without running out of device memory."""
    from cockpit_lite import Cockpit, configuration

    torch.manual_seed(0)
    with ctx.device:
        model = spec.build()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(4)

    def fits(b):
        cp = Cockpit(model, configuration("economy"), strict=True, diagnose=False) if economy else None
        try:
            x, y = (t.to(ctx.device) for t in spec.batch(g, b))
            opt.zero_grad(set_to_none=True)
            with autocast(ctx, spec.precision):
                out = model(x)
            loss = spec.loss(out, y)
            if cp is None:
                loss.backward()
            else:
                with cp(0, info={"loss": loss, "optimizer": opt}):
                    loss.backward()
            opt.step()
            if ctx.cuda:
                torch.cuda.synchronize()
            # the engine turns a layer rule's failure (an OOM too) into NaN and a flag
            return cp is None or math.isfinite(cp.get_output()[0]["NormTest"])
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            x = y = out = loss = cp = None
            opt.zero_grad(set_to_none=True)
            release(ctx)

    return fits


def part_memory(ctx):
    if not ctx.cuda:
        return {"status": "not applicable", "reason": "no device memory counter on the CPU"}
    growth = {}
    for model in ctx.overhead:
        bytes_ = model.get("memory_growth_bytes")
        if not bytes_ or "plain" not in bytes_:
            continue
        plain = bytes_["plain"]
        growth[f'{model["model"]} {model["precision"]}'] = {
            name: {"growth_MiB": b / 2**20, "over_plain_MiB": (b - plain) / 2**20,
                   "ratio_to_plain": b / plain if plain else None} for name, b in bytes_.items()}
    spec = overhead_specs(ctx.quick)[-1]  # the GPT in bf16 autocast
    start, cap = (2, 64) if ctx.quick else (16, 4096)
    largest = {}
    for name, economy in (("plain", False), ("economy", True)):
        deadline = time.monotonic() + ctx.left() / (2 if name == "plain" else 1) - 5
        try:
            lo, hi, trials = largest_batch(batch_fits(ctx, spec, economy), start, cap, deadline)
            largest[name] = {"fits": lo, "does_not_fit": hi, "trials": trials}
        except Exception:
            largest[name] = {"error": tail(traceback.format_exc())}
        release(ctx)
    return {"growth": growth, "largest_batch_gpt2_small_bf16_T256": largest}


# ---------------------------------------------------------------------------------------------
# the run


def environment(ctx, packages):
    info = {"device": str(ctx.device), "torch": torch.__version__, "python": platform.python_version(),
            "packages": packages, "quick": ctx.quick}
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        info.update(name=props.name, cuda=torch.version.cuda, memory_GiB=props.total_memory / 2**30,
                    multiprocessors=props.multi_processor_count, tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                    tf32_cudnn=torch.backends.cudnn.allow_tf32)
    else:
        info["name"] = platform.processor() or platform.machine()
    return info


def summary(results):
    """A short text of the results (also written to ``summary.txt``)."""
    env = results["environment"]
    lines = [f"gpu_check on {env.get('name')} ({env['device']}, torch {env['torch']}"
             + (f", CUDA {env['cuda']}" if env.get("cuda") else "") + f"), {results['seconds']:.0f} s"]
    for part, entry in results["parts"].items():
        status = entry.get("status", "ok")
        if status != "ok":
            reason = entry.get("reason") or tail(entry.get("error", ""), 1)
            lines.append(f"{part}: {status}: {reason}")
            continue
        lines += globals()[f"_summary_{part}"](entry)
    return "\n".join(lines)


def _summary_correctness(entry):
    tests = entry["tests"]
    c = tests["counts"]
    lines = [f"correctness: tests {c['passed']} passed, {c['failed']} failed, {c['errors']} errors, "
             f"{c['skipped']} skipped (exit {tests['exit']})"]
    lines += [f"  FAILED {f['test']}: {tail(f['message'], 1)[:160]}" for f in tests["failures"][:12]]
    own = entry["own_checks"]
    lines.append("  own checks: " + ", ".join(
        f"{name} {'ok' if r.get('passed') else 'FAILED'}"
        + (f" ({r['relative_difference']:.1e})" if "relative_difference" in r else "") for name, r in own.items()))
    return lines


def _summary_syncs(entry):
    v = entry["verdict"]
    lines = [f"syncs: {'ok' if v['passed'] else 'FAILED'}: histogram {v['histogram']}, untracked {v['untracked']}, "
             f"backward hooks {v['hooks']}; allowed: step entry/end/optimizer {v['step end']}, default Cockpit "
             f"between its sparse steps {v['diagnosis between']}; plain steps {v['plain']}"]
    lines += [f"  {count}x {place}" for place, count in sorted(v["places"].items(), key=lambda kv: -kv[1])[:10]]
    return lines


def _summary_histogram(entry):
    lines = ["histogram (ms; same counts as ours):"]
    for row in entry["rows"]:
        if "skipped" in row:
            lines.append(f"  {row['dims']}-d {row['kind']} {row['n']:.0e}: skipped ({row['skipped']})")
            continue
        cells = [f"{name} {ms:.3g}" + ("" if row["same_counts"][name] == "yes" else f" [{row['same_counts'][name]}]")
                 for name, ms in row["ms"].items()]
        lines.append(f"  {row['dims']}-d {row['kind']} {row['n']:.0e}: " + ", ".join(cells)
                     + (f"; fails: {', '.join(row['errors'])}" if row["errors"] else ""))
    return lines


def _summary_overhead(entry):
    lines = ["overhead (step time / plain; check: relative difference from the brute force):"]
    for m in entry["models"]:
        head = f"  {m['model']} {m['precision']}"
        if "ratio" not in m:
            lines.append(f"{head}: {m.get('skipped') or tail(m.get('error', ''), 1)}")
            continue
        lines.append(f"{head} ({m['parameters'] or 0:,} parameters) batch {m['batch']}, "
                     f"plain {m['plain_ms'] or float('nan'):.2f} ms, {m['rounds']} rounds: "
                     + ", ".join(f"{n} {r:.2f}x" for n, r in m["ratio"].items() if n != "plain"))
        checks = ", ".join(f"{n} {c['relative_difference']:.1e}" + (
            "" if c["passed"] else " differs" if n in PEERS else " FAILED") for n, c in m["checks"].items())
        if checks:
            lines.append(f"    checks: {checks}")
        if m["errors"]:
            lines.append("    errors: " + "; ".join(f"{n}: {tail(e, 1)[:120]}" for n, e in m["errors"].items()))
    return lines


def _summary_memory(entry):
    lines = ["memory (peak growth of a step / plain's):"]
    for model, rows in entry["growth"].items():
        lines.append(f"  {model}: plain {rows['plain']['growth_MiB']:.0f} MiB; " + ", ".join(
            f"{n} {r['ratio_to_plain']:.2f}x" for n, r in rows.items() if n != "plain" and r["ratio_to_plain"]))
    for name, r in entry["largest_batch_gpt2_small_bf16_T256"].items():
        lines.append(f"  largest batch, GPT-2-small bf16 T=256, {name}: "
                     + (f"{r['fits']} fits, {r['does_not_fit']} does not" if "fits" in r else tail(r["error"], 1)))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="every part, small (seconds on a CPU)")
    parser.add_argument("--budget", type=float, help=f"seconds for all parts (default {BUDGET_S:.0f}; quick {QUICK_BUDGET_S:.0f})")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--workers", type=int, help="pytest-xdist workers of the test run (default 12 on CUDA, 0 on the CPU)")
    parser.add_argument("--wheels", default=str(ROOT / ".wheels"), help="folder of the wheels of missing packages")
    args = parser.parse_args(argv)
    diagnosis_logger = logging.getLogger("cockpit_lite.diagnosis")
    level, threads = diagnosis_logger.level, torch.get_num_threads()
    diagnosis_logger.setLevel(logging.ERROR)  # findings on random data are not the point
    if args.device == "cpu":
        torch.set_num_threads(1)  # the CPU run checks that the parts run, not how fast
    try:
        return run(args, parser)
    finally:
        diagnosis_logger.setLevel(level)
        torch.set_num_threads(threads)


def run(args, parser):
    guard = Guard(args.budget or (QUICK_BUDGET_S if args.quick else BUDGET_S))
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    workers = args.workers if args.workers is not None else (12 if device.type == "cuda" else 0)
    pythonpath, packages = ensure_packages(args.wheels)
    try:
        ctx = Context(device, args.quick, out, workers=workers, pythonpath=pythonpath)
        results = {"environment": environment(ctx, packages), "budget_s": guard.end - guard.start, "parts": {}}
        parts = [p for p in PARTS if p in args.parts]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # third-party notices on random data
            for part in parts:
                if guard.left() < 5:
                    used = f"time guard: {guard.elapsed():.0f} s of {guard.end - guard.start:.0f} s used"
                    results["parts"][part] = {"status": "skipped", "reason": used}
                else:
                    ctx.deadline = guard.part_deadline(part, parts)
                    begin = time.monotonic()
                    try:
                        entry = globals()[f"part_{part}"](ctx)
                        entry.setdefault("status", "ok")
                    except Exception:
                        entry = {"status": "error", "error": tail(traceback.format_exc(), 12)}
                    entry["seconds"] = time.monotonic() - begin
                    results["parts"][part] = entry
                    release(ctx)
                text = write(results, guard, out)  # after every part: a run killed later keeps what it measured
    finally:
        for folder in pythonpath:  # the packages installed for this run only
            shutil.rmtree(folder, ignore_errors=True)
    print(text)
    return results


def write(results, guard, out):
    """``gpu_check.json`` and ``summary.txt`` of the results so far; returns the summary."""
    from experiments.common import write_json

    results["seconds"] = guard.elapsed()
    write_json(str(out / "gpu_check.json"), results)
    text = summary(results)
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    return text


if __name__ == "__main__":
    main()
