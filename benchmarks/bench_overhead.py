"""Overhead of tracking: step time and peak memory relative to a plain training step.

Usage::

    python -m benchmarks.bench_overhead [--repeats 5] [--steps 5] [--quick] [--json PATH]
        [--problems mlp cnn transformer gpt resnet_bn resnet18] [--configs "lite economy" ...]
        [--leave-one-out] [--optimizer sgd|adamw]
    python -m benchmarks.bench_overhead --budget [FACTOR] [--budget-lengths 100 300 1000 ...]
    python -m benchmarks.bench_overhead --period [--repeats 200] [--problems mlp ...]

For each problem (an MLP 784-64-10 and a small CNN on 3×32×32 inputs, a transformer
encoder classifier: embedding, 2 layers, d=64, 4 heads, sequence 32, and a small ResNet
with BatchNorm in training mode on 3×32×32; on request, ``gpt``, ``bench_per_sample``'s
nanoGPT-style GPT with its token loss, and ``resnet18``, a torchvision-style
ResNet-18 in training mode on 3×32×32; batch 64, cross-entropy, SGD, or with ``--optimizer adamw``
AdamW) it times, in one
process with one thread (``--configs``: only the configurations named, and the plain step):

- the plain step (forward, backward, SGD step; no BackPACK),
- the untracked step: a Cockpit with the economy level present but nothing due
  (model not BackPACK-extended: nothing first-order needs BackPACK),
- diagnosis alone: ``Cockpit(model)`` with its default signals and schedule
  (``cockpit_lite.diagnosis.schedule``), timed over whole periods of the schedule after
  its dense first steps (the steady state of a long run), model not BackPACK-extended; also as
  ``Cockpit(model.parameters())``, "(parameters)"; with ``--signals``, each of its signals alone on
  its schedule ("  signal Q", ``diagnose=False``): what each costs,
- cockpit-lite at each level (economy, business, full), every step tracked (the level's
  quantities only, ``diagnose=False``); the Cockpit gets the model (its fast layer rules
  need the module); economy runs on the plain model; for business and full MLP and CNN
  are BackPACK-extended, so their curvature is BackPACK's exact Hessian diagonal; the transformer and the ResNet are not (BackPACK cannot do
  them) and their curvature is Hutchinson's estimate,
- cockpit-lite with each quantity alone,
- with ``--leave-one-out``: economy with ``samples=8`` without each of its quantities in turn,
  "  without Q" (what each quantity adds to the others' shared work),
- Cockpit's recipe with cockpit-lite, "(recipe)" (MLP, CNN): model and loss BackPACK-extended,
  ``Cockpit(model.parameters(), configuration(level))``, ``info`` with ``batch_size`` and
  ``individual_losses``, ``create_graph=cp.create_graph(step)`` (always False: Cockpit's script line,
  a plain backward; diagnosis off, as the
  level rows),
- the original Cockpit at each level on the same recipe, when ``cockpit-for-pytorch`` is
  installed (MLP, CNN).

``--budget [FACTOR]`` instead prints the table of problems × run lengths (``--budget-lengths``,
default 100, 300, 1000 and 3000 steps) of ``Cockpit(model, configuration("full"), budget=FACTOR)``
(default 1.25; ``--budget-level``), with the default diagnosis on and with ``diagnose=False``,
not BackPACK-extended (BackPACK's hooks alone slow every step down): the time of a budgeted
run (a fresh model and Cockpit each) over a plain twin's, alternated plain, budgeted,
budgeted, plain (rounds enough for 3 s of plain steps, at most 40: a load spike of the
machine lasts milliseconds), with the steps each tier was recorded at.

``--period`` instead prints where the default ``Cockpit(model)`` spends its time: the time it adds
at each step of the diagnosis schedule's period (``cockpit_lite.diagnosis.EVERY`` steps after the
dense start: the recorded step, the step after it, where ``UpdateSize`` takes its difference, and
the untracked steps), each the median over ``--repeats`` rounds of that step's time minus the plain
step's at the same place of the period (a round runs one period of each, interleaved).

Timings are medians over ``--repeats`` interleaved rounds (every configuration runs
once per round, so a load change on the machine hits all of them alike); a
round times ``--steps`` steps after one warm-up step. Ratios are to the plain step
of the same round set. Memory is the growth of the process's peak resident set
over 4 steps (from after building model, data and cockpit), in a fresh process
per configuration, in MiB: allocator reuse makes it coarse (±a few MiB), and a plain
step of these small models may need no new pages at all.
"""

import argparse
import json
import logging
import os
import subprocess
import sys
import statistics
import time
import warnings

import torch
from torch import nn

from cockpit_lite import Cockpit, configuration, diagnosis, extend, quantities
from cockpit_lite.quantities.curvature import CurvatureQuantity
from cockpit_lite.utils.configuration import quantities_cls_for_configuration
from instruments.data import budget_bought

BATCH = 64
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
}
OPTIMIZER = "sgd"
"""The optimizer of every configuration (``--optimizer``)."""
SAMPLES = 8
"""``Cockpit(samples=k)`` of the subsampled economy row."""
LEVELS = ("economy", "business", "full")


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1024, 10),
    )


class TransformerClassifier(nn.Module):
    """Token embedding + learned positions, 2 encoder layers (d=64, 4 heads), mean, linear head."""

    def __init__(self, vocab=100, d=64, length=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.02 * torch.randn(length, d))
        layer = nn.TransformerEncoderLayer(d, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens) + self.pos).mean(1))


class ResidualBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


def resnet_bn():
    """Stem conv 16 + BatchNorm, two residual blocks (16 and 32 channels), pooling, linear (train mode)."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), ResidualBlock(16),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), ResidualBlock(32),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block: two 3×3 conv + BatchNorm, a 1×1 conv + BatchNorm shortcut
    where the shape changes."""

    def __init__(self, inputs, channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or inputs != channels:
            self.downsample = nn.Sequential(nn.Conv2d(inputs, channels, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(channels))

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + shortcut)


def resnet18(classes=10):
    """A torchvision-style ResNet-18 (its layout, written here: torchvision is not imported): 7×7/2
    stem conv + BatchNorm + 3×3/2 max pooling, four stages of two basic blocks (64, 128, 256, 512
    channels), average pooling, linear; 11M parameters, BatchNorm in training mode."""
    layers = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, stride=2, padding=1)]
    inputs = 64
    for channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(inputs, channels, stride), BasicBlock(channels, channels, 1)]
        inputs = channels
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


def _images(shape):
    return lambda g: torch.randn(BATCH, *shape, generator=g)


def gpt():
    """``bench_per_sample``'s nanoGPT-style GPT (2 pre-norm blocks, d = 64, T = 32, vocabulary 256, tied head)."""
    from benchmarks.bench_per_sample import GPT

    return GPT()


class TokenLoss(nn.Module):
    """Mean cross-entropy over every token of ``[B, T, V]`` logits (a sample is a sequence)."""

    def forward(self, logits, targets):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _tokens(vocab):
    return lambda g: torch.randint(0, vocab, (BATCH, 32), generator=g)


PROBLEMS = {
    # name: (model, inputs, BackPACK supports its curvature[, loss, targets]; default: cross-entropy, 10 classes)
    "mlp": (mlp, _images((1, 28, 28)), True),
    "cnn": (cnn, _images((3, 32, 32)), True),
    "transformer": (TransformerClassifier, _tokens(100), False),
    "gpt": (gpt, _tokens(256), False, TokenLoss, _tokens(256)),
    "resnet_bn": (resnet_bn, _images((3, 32, 32)), False),
    "resnet18": (resnet18, _images((3, 32, 32)), False),
}
DEFAULT_PROBLEMS = ("mlp", "cnn", "transformer", "resnet_bn")
"""What a run measures unless ``--problems`` says otherwise (``resnet18`` is slow: ask for it)."""


def never(step):
    """A schedule that is never due (the untracked step)."""
    return False


class Runner:
    """One configuration: a model, its optimizer, data, and how a step is run."""

    def __init__(self, problem, make_cockpit=None, peer=False, backpack=True, period=1, skip=0):
        """``period``/``skip``: time whole periods of a sparse schedule, after its first ``skip`` steps."""
        build, inputs, supported, loss, targets = (*PROBLEMS[problem], nn.CrossEntropyLoss,
                                                   lambda g: torch.randint(0, 10, (BATCH,), generator=g))[:5]
        torch.manual_seed(0)
        self.model, self.lossfunc = build(), loss()
        if make_cockpit is not None and supported and backpack:
            self.model, self.lossfunc = extend(self.model), extend(self.lossfunc)
        self.opt = OPTIMIZERS[OPTIMIZER](self.model.parameters())
        self.cp = make_cockpit(self.model) if make_cockpit is not None else None
        self.peer = peer
        g = torch.Generator().manual_seed(1)
        self.batches = [(inputs(g), targets(g)) for _ in range(4)]
        self.step = 0
        self.period, self.skip = period, skip

    def run_step(self):
        x, y = self.batches[self.step % len(self.batches)]
        self.opt.zero_grad()
        outputs = self.model(x)
        loss = self.lossfunc(outputs, y)
        if self.cp is None:
            loss.backward()
        else:
            info = {"loss": loss, "optimizer": self.opt}
            if self.peer:
                info["batch_size"] = BATCH
                info["individual_losses"] = nn.functional.cross_entropy(outputs, y, reduction="none")
            with self.cp(self.step, info=info):
                loss.backward(create_graph=self.cp.create_graph(self.step))
        self.opt.step()
        self.step += 1

    def time_steps(self, steps):
        self.run_step()  # warm-up (and the first step of two-step quantities)
        while self.step < self.skip or self.step % self.period:  # start at a due step of a sparse schedule
            self.run_step()
        steps = -(-steps // self.period) * self.period
        start = time.perf_counter()
        for _ in range(steps):
            self.run_step()
        return (time.perf_counter() - start) / steps



def peak_memory(problem, name):
    """Extra peak resident memory (bytes) of 4 steps of configuration ``name``.

    Measured in a fresh process: the high-water mark of the resident set after the
    steps minus the one after building the model, optimizer, data and cockpit. On
    Linux it is the process's own ``VmHWM``: ``getrusage``'s ``ru_maxrss`` starts a
    child at its parent's resident set, which would hide the child's growth behind
    a large benchmark process.
    """
    code = (
        "import sys, warnings; warnings.simplefilter('ignore');"
        "from benchmarks import bench_overhead as b; import torch; torch.set_num_threads(1);"
        f"b.OPTIMIZER = {OPTIMIZER!r};"
        f"runner = b.configurations({problem!r}, True, {name.startswith('Cockpit')!r})[{name!r}]();"
        "base = b.high_water_mark();"
        "[runner.run_step() for _ in range(4)];"
        "print(b.high_water_mark() - base)"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return int(out.stdout.split()[-1])


def high_water_mark():
    """Peak resident set of this process in bytes (``VmHWM`` where ``/proc`` has it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def configurations(problem, with_quantities, with_peer, leave_one_out=False, signals=False):
    configs = {"plain": lambda: Runner(problem)}
    configs["untracked"] = lambda: Runner(  # not extended: nothing it tracks needs BackPACK
        problem, lambda m: Cockpit(m, configuration("economy", track_schedule=never), diagnose=False),
        backpack=False,
    )
    configs["diagnosis alone"] = lambda: Runner(
        problem, lambda m: Cockpit(m), backpack=False, period=diagnosis.EVERY, skip=diagnosis.DENSE_STEPS
    )
    configs["diagnosis alone (parameters)"] = lambda: Runner(  # Cockpit's habit: the parameters, not the model
        problem, lambda m: Cockpit(m.parameters()), backpack=False, period=diagnosis.EVERY, skip=diagnosis.DENSE_STEPS
    )
    for level in LEVELS:  # economy needs no BackPACK; business and full use its exact curvature where it can
        configs[f"lite {level}"] = lambda level=level: Runner(
            problem, lambda m: Cockpit(m, configuration(level), diagnose=False), backpack=level != "economy"
        )
    configs["lite business (GGN)"] = lambda: Runner(  # every curvature the engine's exact GGN diagonal, shared
        problem, lambda m: Cockpit(m, configuration("business", curvature="diag_ggn_exact"), diagnose=False),
        backpack=False,
    )
    configs[f"lite economy (samples={SAMPLES})"] = lambda: Runner(
        problem, lambda m: Cockpit(m, configuration("economy"), diagnose=False, samples=SAMPLES), backpack=False
    )
    if with_quantities:
        for cls in quantities_cls_for_configuration("full") + (
            quantities.EarlyStopping, quantities.CABS,
        ):
            configs[f"  {cls.__name__}"] = lambda cls=cls: Runner(
                problem, lambda m: Cockpit(m, [cls()], diagnose=False),
                backpack=issubclass(cls, CurvatureQuantity),
            )
    for name in diagnosis.signals.SIGNALS if signals else ():  # each alone, on its own schedule, whole periods
        configs[f"  signal {name}"] = lambda name=name: Runner(
            problem, lambda m: Cockpit(m, [getattr(quantities, name)(**diagnosis.signals.SIGNAL_OPTIONS.get(name, {}))],
                                       diagnose=False),
            backpack=False, period=diagnosis.EVERY, skip=diagnosis.DENSE_STEPS,
        )
    for left_out in quantities_cls_for_configuration("economy") if leave_one_out else ():
        configs[f"  without {left_out.__name__}"] = lambda left_out=left_out: Runner(
            problem, lambda m: Cockpit(m, [q for q in configuration("economy") if type(q) is not left_out],
                                       diagnose=False, samples=SAMPLES), backpack=False,
        )
    if PROBLEMS[problem][2]:  # Cockpit's recipe: extended model and loss, parameters, its info keys
        for level in LEVELS:
            configs[f"lite {level} (recipe)"] = lambda level=level: Runner(
                problem, lambda m: Cockpit(m.parameters(), configuration(level), diagnose=False), peer=True
            )
    if with_peer and PROBLEMS[problem][2]:
        import cockpit
        from cockpit.utils.configuration import configuration as peer_configuration

        for level in LEVELS:
            configs[f"Cockpit {level}"] = lambda level=level: Runner(
                problem, lambda m: cockpit.Cockpit(m.parameters(), peer_configuration(level)), peer=True
            )
    return configs


def measure(problem, repeats, steps, with_quantities, with_peer, with_memory=True, only=None, leave_one_out=False,
            signals=False):
    """Median step time of each configuration (``only``: these, the plain step and the leave-one-out and
    signal rows), and their peak memory."""
    runners = {name: make() for name, make in configurations(problem, with_quantities, with_peer, leave_one_out,
                                                             signals).items()
               if only is None or name == "plain" or name in only or name.startswith(("  without ", "  signal "))}
    times = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            times[name].append(runner.time_steps(steps))
    medians = {name: statistics.median(t) for name, t in times.items()}
    memory = {name: peak_memory(problem, name) for name in runners if with_memory and not name.startswith("  ")}
    return medians, memory


ROUNDS_S = 3.0
"""``--budget``: the plain steps' time each run length is measured over, at least (in rounds)."""
MAX_ROUNDS = 40


def budget_twin(problem, factor, steps, diagnose, level="full", cycles=1):
    """Time of ``steps`` steps of ``Cockpit(model, configuration(level), budget=factor)`` over that of a
    plain twin: ``cycles`` rounds of plain, budgeted, budgeted, plain runs (each budgeted run a fresh
    model and Cockpit, calibrating anew), so that a load change hits both alike. (Interleaving single
    steps would put the twin's step inside every period the budget times.) Returns the ratio of the
    sums (of wall-clock time; of the process's CPU time, which other processes' load changes less), and the
    last budgeted record."""
    def timed(runner):
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            runner.run_step()
        return [time.perf_counter() - start, time.process_time() - cpu]

    totals, record = [[0.0, 0.0], [0.0, 0.0]], None
    for _ in range(cycles):
        for budgeted in (False, True, True, False):
            runner = Runner(problem, lambda m: Cockpit(m, configuration(level), budget=factor, diagnose=diagnose),
                            backpack=False) if budgeted else Runner(problem)
            totals[budgeted] = [total + t for total, t in zip(totals[budgeted], timed(runner))]
            if budgeted:
                runner.cp.close()
                record = runner.cp.get_output()
    (wall, cpu), (plain_wall, plain_cpu) = totals[1], totals[0]
    return wall / plain_wall, cpu / plain_cpu, record


def print_budget_lengths(factor, lengths, problems, level="full"):
    """The table of ``budget_twin`` ratios: problems × run lengths, with diagnosis on and off."""
    from cockpit_lite.budget import plans

    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for problem in problems:
            for diagnose in (True, False):
                plain = Runner(problem)
                plain.time_steps(5)  # (warm-up)
                step_s = plain.time_steps(20)
                for steps in lengths:  # rounds enough for ``ROUNDS_S`` of plain steps (a load spike is ms)
                    cycles = max(1, min(MAX_ROUNDS, round(ROUNDS_S / (steps * step_s))))
                    ratio, cpu, record = budget_twin(problem, factor, steps, diagnose, level, cycles=cycles)
                    last = plans(record)[-1]
                    results[(problem, diagnose, steps)] = (ratio, cpu)
                    print(f"{problem:<12} diagnose={diagnose!s:<6} {steps:>5} steps x {cycles:>2} rounds: {ratio:.2f}x "
                          f"(CPU time {cpu:.2f}x) "
                          f"(plain {last['plain_step_s'] * 1e3:.2f} ms, u {last['untracked_cost']:.2f}, steps recorded: "
                          + ", ".join(f"{tier} {entry['steps']}" for tier, entry in budget_bought(record)["tiers"].items())
                          + ")", flush=True)
    for kind, clock in (("wall-clock time", 0), ("CPU time", 1)):
        print(f"\nbudget={factor}, configuration({level!r}): {kind} over a plain twin's (runs alternated), 1 thread, "
              "batch 64 (diagnosis on / diagnose=False)")
        print(f"{'problem':<12}" + "".join(f"{n:>14}" for n in lengths))
        for problem in problems:
            print(f"{problem:<12}" + "".join(
                f"{results[(problem, True, n)][clock]:>7.2f}/{results[(problem, False, n)][clock]:.2f}" for n in lengths))
    return results


def period_costs(problem, rounds):
    """``(plain step seconds, [seconds Cockpit(model) adds at each step of the diagnosis period]``, the
    period's first step the recorded one): ``--period``."""
    runners = [Runner(problem), Runner(problem, lambda m: Cockpit(m), backpack=False)]
    for runner in runners:  # past the dense start, at the start of a period
        runner.run_step()
        while runner.step < diagnosis.DENSE_STEPS or runner.step % diagnosis.EVERY:
            runner.run_step()
    times = [[[] for _ in range(diagnosis.EVERY)] for _ in runners]
    for _ in range(rounds):
        for runner, per_step in zip(runners, times):
            for place in per_step:
                start = time.perf_counter()
                runner.run_step()
                place.append(time.perf_counter() - start)
    plain, observed = ([statistics.median(place) for place in per_step] for per_step in times)
    return statistics.median(plain), [o - p for o, p in zip(observed, plain)]


def print_period(problems, rounds):
    """The ``--period`` table: per problem, what the default diagnosis adds at each step of its period."""
    every = diagnosis.EVERY
    print(f"Cockpit(model) (default diagnosis): time added at each step of its {every}-step period, ms "
          f"(median of {rounds} interleaved periods, batch {BATCH}, 1 thread)")
    print(f"{'problem':<12}{'plain':>8}{'recorded':>10}{'after':>8}{'untracked (median)':>20}{'period':>9}")
    for problem in problems:
        plain, added = period_costs(problem, rounds)
        ratio = 1 + sum(added) / (every * plain)
        print(f"{problem:<12}{plain * 1e3:>8.3f}{added[0] * 1e3:>10.3f}{added[1] * 1e3:>8.3f}"
              f"{statistics.median(added[2:]) * 1e3:>20.3f}{ratio:>8.2f}x", flush=True)


def main(argv=None):
    global OPTIMIZER
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats, 2 steps, no per-quantity rows, no memory column")
    parser.add_argument("--no-quantities", action="store_true", help="no per-quantity rows")
    parser.add_argument("--no-peer", action="store_true", help="leave out the original Cockpit")
    parser.add_argument("--problems", nargs="+", default=list(DEFAULT_PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--configs", nargs="+", help="only these configurations (and the plain step)")
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    parser.add_argument("--leave-one-out", action="store_true",
                        help="also economy with samples=8 without each of its quantities in turn")
    parser.add_argument("--signals", action="store_true",
                        help="also each signal of the default diagnosis alone, on its schedule (whole periods)")
    parser.add_argument("--optimizer", default=OPTIMIZER, choices=list(OPTIMIZERS),
                        help="sgd: SGD, lr 0.01; adamw: AdamW, lr 1e-3, weight decay 0.01")
    parser.add_argument("--budget", type=float, nargs="?", const=1.25,
                        help="the budget table instead: problems x run lengths, against a plain twin")
    parser.add_argument("--budget-level", default="full", choices=LEVELS)
    parser.add_argument("--budget-lengths", type=int, nargs="+", default=[100, 300, 1000, 3000])
    parser.add_argument("--period", action="store_true",
                        help="where the default diagnosis's time goes: what it adds at each step of its period")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.steps = 2, 2
    OPTIMIZER = args.optimizer
    torch.set_num_threads(1)
    logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.ERROR)  # findings on random data: not the point
    if args.budget is not None:
        print_budget_lengths(args.budget, args.budget_lengths, args.problems, args.budget_level)
        return
    if args.period:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            print_period(args.problems, args.repeats)
        return
    with_peer = False
    if not args.no_peer:
        try:
            import cockpit  # noqa: F401

            with_peer = True
        except ImportError:
            print("cockpit-for-pytorch is not installed: the original Cockpit is left out")
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for problem in args.problems:
            medians, memory = measure(problem, args.repeats, args.steps, not (args.quick or args.no_quantities),
                                      with_peer, with_memory=not args.quick, only=args.configs,
                                      leave_one_out=args.leave_one_out, signals=args.signals)
            results[problem] = {"median_step_s": medians, "peak_memory_bytes": memory}
    print(f"step time / plain step time (median of {args.repeats} interleaved rounds of "
          f"{args.steps} steps, batch {BATCH}, 1 thread)")
    names = list(dict.fromkeys(name for r in results.values() for name in r["median_step_s"]))
    widths = {p: (max(12, len(p) + 6), max(10, len(p) + 6)) for p in results}
    first = max(22, *(len(name) + 1 for name in names))
    print(f"{'configuration':<{first}}" + "".join(f"{p + ' time':>{widths[p][0]}}{p + ' +MiB':>{widths[p][1]}}"
                                                  for p in results))
    for name in names:
        row = f"{name:<{first}}"
        for problem, r in results.items():
            time_width, memory_width = widths[problem]
            if name not in r["median_step_s"]:  # the original Cockpit runs on MLP and CNN only
                row += f"{'–':>{time_width}}{'':>{memory_width}}"
                continue
            ratio = r["median_step_s"][name] / r["median_step_s"]["plain"]
            mem = r["peak_memory_bytes"].get(name)
            row += f"{ratio:>{time_width - 1}.2f}x" + (f"{mem / 2**20:>{memory_width}.1f}" if mem is not None
                                                       else f"{'':>{memory_width}}")
        print(row)
    if not args.quick:
        print("+MiB: growth of the process's peak resident memory over 4 steps (fresh process)")
    for problem, r in results.items():
        print(f"plain {problem} step: {r['median_step_s']['plain'] * 1e3:.2f} ms")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
