"""Statistics of the global batch under DDP (2 CPU processes, gloo, float64) equal those of one
process on the whole batch, the curvature quantities' too (Hessian-vector products averaged over the
ranks, the engine's GGN diagonal), and training with them is that without a Cockpit, bit for bit."""

import contextlib
import math
import os
import pickle
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from unittest import mock

import models
import problems
from experiments.fsdp_equality import flatten, histograms_agree
from cockpit_lite import Cockpit, budget, configuration, quantities
from cockpit_lite.engine import per_sample
from cockpit_lite.quantities import alpha
from cockpit_lite.quantities.bin_adaptation import GradAbsMax, ParamAbsMax

WORLD = 2
STEPS = 3


def _quantities(curvature=False):
    """``economy`` with the extras; with ``curvature`` also Hutchinson's HessTrace, HessMaxEV and the TICs
    (the engine's exact GGN diagonal); ``"monte_carlo"``: only HessTrace of the engine's Monte-Carlo GGN
    (the gradient tests of a one-output model's last bias are rounding noise, flagged with its size)."""
    if curvature == "monte_carlo":
        return [quantities.HessTrace(curvature="diag_ggn_mc", probes=4)]
    more = [quantities.HessTrace(), quantities.HessMaxEV(), quantities.TICDiag(), quantities.TICTrace()] if curvature else []
    adapted = quantities.GradHist2d(adapt=(GradAbsMax(None), ParamAbsMax(None)))  # maxima over the ranks' samples
    signals = [quantities.ActivationStats(), quantities.InputStats()]  # (the diagnosis's: of the global batch too)
    return configuration("economy", extras=True) + [quantities.CABS(), quantities.EarlyStopping(), adapted] + signals + more


class TiedInOwnCode(torch.nn.Module):
    """``lin``'s weight and bias read by their layer and again by the model's own code: the
    engine flags them at the first step and serves them by the global path from then on
    (deferred under DDP)."""

    def __init__(self):
        super().__init__()
        self.lin, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.head(F.linear(torch.tanh(self.lin(x)), self.lin.weight, self.lin.bias))


def _regression():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


LOCAL = {"tied_in_own_code": (TiedInOwnCode, models._features((4,)), models._classes),
         "sparse_expert": (models.SparseExpert, models.routed_to_expert, models._classes),
         "regression": (_regression, models._features((4,)), models._features((1,))),
         "one_feature": (lambda: torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)),
                         models._features((1,)), models._classes)}
"""Models of these tests only: ``name -> (builder, input maker, target maker)``. ``sparse_expert``'s inputs
route samples 6 and 7 to its expert: with shards (5, 3) the first rank skips the expert (DDP:
``find_unused_parameters=True``) and only the second calls its activation (after the activation both call),
one process on the whole batch reaches it. ``regression`` has one
output per sample (MSE): the Monte-Carlo GGN's Rademacher sign squares away, so its draws are the exact
diagonal's on any rank, and the ranks' estimate is comparable with one process's. ``one_feature``'s input
has one entry per sample: a rank of one sample holds a single entry of the input's statistics."""


def _model(name):
    return (LOCAL[name][0] if name in LOCAL else problems.BUILDERS[name][0])().double()


def _batches(name, batch):
    if name in LOCAL:
        _, inputs, targets = LOCAL[name]
        g = torch.Generator().manual_seed(4)
        return [(inputs(g, batch), targets(g, batch)) for _ in range(STEPS)]
    return problems.make(name, batch, steps=STEPS, seed=3).batches


def _loss(model, x, y, name, scale):
    """The mean loss over ``x``, times ``scale`` (unequal shards: the rank's share of the global mean)."""
    out = model(x)
    if name == "gpt":
        out, y = out.reshape(-1, out.shape[-1]), y.reshape(-1)
    return (F.mse_loss if name == "regression" else F.cross_entropy)(out, y) * scale


def _train(name, shards, micro, rank=None, accumulate=False, curvature=False, diagnose=False, tracking=True,
           static=False, group=None, turned=False):
    """Train with a Cockpit (``tracking``; else without one); ``shards`` are the sample counts per rank (one
    process: the whole batch). Returns the record and the parameters after training.

    ``micro`` micro-batches per step (the first ones under ``no_sync``): only the last in
    ``cp(step)``, or with ``accumulate`` every one (``Cockpit(accumulate=True)``); ``curvature``:
    ``_quantities``' argument; ``static``: ``DistributedDataParallel(static_graph=True)``; ``group``: DDP's
    process group (``rank`` is the rank in it), else the default one; ``turned``: AdamW with
    ``clip_grad_value_`` after the backward pass (the update turns away from the one predicted in it).
    """
    torch.manual_seed(0)
    model = _model(name)
    tracked = model if rank is None else torch.nn.parallel.DistributedDataParallel(
        model, static_graph=static, find_unused_parameters=name == "sparse_expert", process_group=group)
    assert micro == 1 or rank is not None
    opt = torch.optim.AdamW(model.parameters(), lr=0.01) if turned else torch.optim.SGD(model.parameters(), lr=0.1)
    sgd_only = (quantities.CABS, quantities.EarlyStopping)
    tracks = [q for q in _quantities(curvature) if not (turned and isinstance(q, sgd_only))]
    cp = Cockpit(tracked, tracks, strict=name != "tied_in_own_code", diagnose=diagnose,  # (flagged at step 0)
                 accumulate=accumulate) if tracking else None
    total = sum(shards)
    start = 0 if rank is None else sum(shards[:rank])
    size = total if rank is None else shards[rank]
    world = 1 if rank is None else dist.get_world_size(group)
    for step, (x, y) in enumerate(_batches(name, total)):
        x, y = x[start:start + size], y[start:start + size]
        opt.zero_grad()
        parts = [slice(0, size)] if micro == 1 else [slice(0, size // 2), slice(size // 2, size)]
        for k, part in enumerate(parts):
            share = (part.stop - part.start) * world / total  # DDP averages the ranks: scale to the global mean
            last = k == len(parts) - 1
            with ExitStack() as stack:
                if not last:
                    stack.enter_context(tracked.no_sync())
                loss = _loss(tracked, x[part], y[part], name, share)
                if cp is not None and (last or accumulate):
                    stack.enter_context(cp(step, info={"loss": loss, "optimizer": opt}))
                loss.backward()
        if turned:
            torch.nn.utils.clip_grad_value_(model.parameters(), 1e-3)
        opt.step()
    return (cp.get_output() if cp is not None else None), [p.detach().clone() for p in model.parameters()]


def _worker(rank, cases, path):
    """Every case in one process group (starting the processes costs more than training)."""
    dist.init_process_group("gloo", init_method=f"file://{path}.pg", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        records = {}
        for case, (name, shards, micro, *options) in cases.items():
            with _patched(case):
                records[case], params = _train(name, shards, micro, rank, *options, static=case in STATIC,
                                               turned=case in TURNED)
            if rank != 0:
                assert records[case] == {}, "only rank 0 keeps the record"
            if case in STATIC:
                untracked = _train(name, shards, micro, rank, *options, tracking=False, static=True)[1]
                assert all(torch.equal(a, b) for a, b in zip(params, untracked)), f"{case}: training changed"
        tracked, untracked = (_train("resnet_bn_train", (3, 3), 1, rank, tracking=tracking, static=True)[1]
                              for tracking in (True, False))  # the global path at the first step
        assert all(torch.equal(a, b) for a, b in zip(tracked, untracked)), "global path: training changed"
        with pytest.raises(ValueError, match=r"not combined with torch.distributed.*Fix: samples=None"):
            Cockpit(torch.nn.parallel.DistributedDataParallel(_model("mlp")), [quantities.NormTest()], diagnose=False,
                    samples=2)  # a draw across ranks (the fix, samples=None: every case above)
        _empty_parts_name_the_fix()
        _ranks_that_keep_different_parameters()
        _rank_0_writes(path, records)
    finally:
        dist.destroy_process_group()
    _leave()


def _empty_parts_name_the_fix():
    """A rank's empty part of the batch (a last batch split by hand, ``x[rank * part:(rank + 1) * part]``; here
    every rank's, so that none waits for another) is refused with the fix for several ranks, not "skip it"
    (the other ranks would wait for the one that skips); the fix, a ``DistributedSampler`` with ``drop_last``,
    gives every rank samples in every batch, and each is tracked."""
    model = torch.nn.parallel.DistributedDataParallel(_model("mlp"))
    x, y = _batches("mlp", 5)[0]
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False)
    with pytest.raises(ValueError, match=r"batch is empty.*Fix: split the data with .*DistributedSampler.*drop_last"):
        with cp(0, info={"loss": F.cross_entropy(model(x[5:]), y[5:])}):
            pass
    data = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=False)
    model = torch.nn.parallel.DistributedDataParallel(_model("mlp"))
    cp = Cockpit(model, [quantities.NormTest()], diagnose=False)
    for step, (xs, ys) in enumerate(torch.utils.data.DataLoader(data, batch_size=2, sampler=sampler, drop_last=True)):
        loss = F.cross_entropy(model(xs), ys)
        with cp(step, info={"loss": loss}):
            loss.backward()
    assert dist.get_rank() != 0 or math.isfinite(cp.get_output()[0]["NormTest"]), cp.get_output()


def _ranks_that_keep_different_parameters():
    """α's slopes of parameters kept until the optimizer's step are gathered in its post-hook with which
    parameters each rank kept; ranks that disagree (here made to: rank 1 keeps no 1-D parameter, rank 0 all)
    give NaN with a flag, and no rank waits for another."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(_model("mlp"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, [quantities.Alpha()], diagnose=False)
    rank = dist.get_rank()
    with mock.patch.object(alpha, "KEEP_ELEMENTS", 0), mock.patch.object(alpha, "kept_always", lambda p: rank == 0):
        for step, (x, y) in enumerate(_batches("mlp", 8)):
            opt.zero_grad()
            loss = F.cross_entropy(model(x[4 * rank:4 * rank + 4]), y[4 * rank:4 * rank + 4])
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            opt.step()
    for step in (0, 1) if rank == 0 else ():
        record = cp.get_output()[step]
        assert math.isnan(record["Alpha"]) and any("kept the individual gradients of different parameters" in f
                                                   for f in record["flags"]), record


def _spawn_or_fail(worker, path, processes, seconds, why):
    """Run ``worker(rank, path)`` in ``processes`` processes; fail the test (naming ``why``) if they have not
    all finished after ``seconds``: ranks whose collectives do not match wait for each other forever."""
    context = mp.spawn(worker, args=(path,), nprocs=processes, join=False)
    for _ in range(2 * seconds):
        if context.join(timeout=0.5):
            return
    for process in context.processes:
        process.kill()
    pytest.fail(f"the ranks did not finish: {why}")


def _rank_0_writes(path, result):
    """Rank 0 pickles ``result`` (rank 0 keeps the record) to ``path``."""
    if dist.get_rank() == 0:
        with open(path, "wb") as file:
            pickle.dump(result, file)


def _leave():
    """End a worker that finished: skip the interpreter's teardown, where gloo's threads
    sometimes abort ("terminate called without an active exception") after all work is done."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


CASES = {  # case -> (model, samples per rank, micro-batches per step[, every micro-batch tracked[, curvature]])
    "equal": ("mlp", (4, 4), 1), "unequal": ("mlp", (5, 3), 1), "vit_like": ("vit_like", (3, 3), 1),
    "no_sync": ("mlp", (4, 4), 2), "global_path": ("tied_in_own_code", (5, 3), 1),
    "global_path_ggn": ("tied_in_own_code", (5, 3), 1, False, True),
    "accumulated": ("mlp", (5, 3), 2, True),
    "curvature": ("mlp", (5, 3), 1, False, True), "monte_carlo": ("regression", (5, 3), 1, False, "monte_carlo"),
    "diagnosed": ("mlp", (5, 3), 1, False, False, True),
    "skipped_on_a_rank": ("sparse_expert", (5, 3), 1),
    "one_input_entry_on_a_rank": ("one_feature", (3, 1), 1),
    "recurrent": ("lstm", (4, 3), 1),
    "turned": ("mlp", (4, 4), 1), "turned_unequal": ("mlp", (5, 3), 1), "turned_gpt": ("gpt", (3, 2), 1),
    "turned_without_room": ("mlp", (5, 3), 1), "turned_accumulated": ("gpt", (3, 3), 2, True),
    "kept_and_predicted": ("mlp", (5, 3), 1),
    "chunked_unequal": ("vit_like", (4, 3), 1),
}
"""``global_path``: the engine finds the tie in the user's backward pass (flagged at step 0); with the
curvature quantities, the GGN diagonal's first pass, which runs before it, finds it (nothing flagged,
step 0 exact)."""
TURNED = ("turned", "turned_unequal", "turned_gpt", "turned_without_room", "turned_accumulated")
"""Cases trained with AdamW and ``clip_grad_value_``, which turns every update away from the one α predicts
in the backward pass (``turned_accumulated``: nanoGPT's recipe, micro-batches under ``no_sync``). α's probe
keeps every parameter's individual gradients from the first start step on, every rank its samples' (α exact
at every step, as in one process); without room for them (``PATCHES``) it keeps the 1-D ones only, finds
the turn, and the first step is NaN with a flag, the next exact."""
PATCHES = {"turned_without_room": (alpha, "KEEP_ELEMENTS", 0), "kept_and_predicted": (alpha, "KEEP_ELEMENTS", 0),
           "chunked_unequal": (per_sample, "CPU_GRAD_BATCH_ELEMENTS", 64)}
"""A module's constant set for a case (one process's run too). ``kept_and_predicted``: α's slopes of each
sample are its 1-D parameters' kept ones (gathered in the optimizer's step post-hook) plus the others'
predicted ones (gathered after the backward pass). ``chunked_unequal``: every factored layer's transforms run
on chunks of samples, which scale by ``B / W = 3.5``."""
STATIC = ("curvature",)
"""Cases under ``DistributedDataParallel(static_graph=True)``, whose parameters are also compared with
those of training without a Cockpit: DDP queues the first step's gradient reduction from the first
backward pass through its output, and the Cockpit's own passes (Hessian-vector products, the GGN's and
the global path's, before the user's backward pass) must not take that turn."""


def _patched(case):
    return mock.patch.object(*PATCHES[case]) if case in PATCHES else contextlib.nullcontext()


def _every_case(rank, path):
    _worker(rank, CASES, path)


def test_ddp_equals_one_process_on_the_whole_batch(tmp_path):
    path = str(tmp_path / "records.pkl")
    _spawn_or_fail(_every_case, path, WORLD, 300, "their collectives did not match")
    with open(path, "rb") as file:
        records = pickle.load(file)
    for case, (name, shards, micro, *options) in CASES.items():
        with _patched(case):
            _check_case(case, name, shards, micro, records[case], *options, turned=case in TURNED)
    for case in TURNED:  # (equal to one process's above; here: a number where one process has one)
        alphas = [entry["Alpha"] for _, entry in sorted(records[case].items()) if "Alpha" in entry]
        assert len(alphas) == STEPS - 1 and math.isnan(alphas[0]) == (case == "turned_without_room"), (case, alphas)
        assert all(math.isfinite(a) for a in alphas[1:]), (case, alphas)
        turn = [f for f in records[case][0].get("flags", []) if "turned" in f]
        assert bool(turn) == (case == "turned_without_room"), (case, turn)
        assert all("keeps the individual gradients" in f for f in turn), turn
    curvature = records["curvature"]
    for entry in curvature.values():  # (compared with one process above; here: by what)
        assert {q: entry["meta"][q]["curvature"] for q in ("HessTrace", "TICDiag")} == {
            "HessTrace": "hutchinson", "TICDiag": "diag_ggn_exact"} and math.isfinite(entry["HessMaxEV"])
    assert all(entry["meta"]["HessTrace"]["curvature"] == "diag_ggn_mc" for entry in records["monte_carlo"].values())


def _check_case(case, name, shards, micro, distributed, accumulate=False, curvature=False, diagnose=False,
                turned=False):
    """Against one process on the whole batch (``no_sync``: on the same last micro-batches; every
    micro-batch accumulated: the whole batch, which is their union)."""
    single = (_train(name, (sum(shards),), 1, curvature=curvature, diagnose=diagnose, turned=turned)[0]
              if micro == 1 or accumulate else _train_single_micro(name, shards))
    assert sorted(distributed) == sorted(single), case
    for step in single:
        if accumulate:
            assert distributed[step]["batch"].pop("passes") == micro
            single[step]["batch"].pop("passes")
        if name == "tied_in_own_code":  # the engine's flag at step 0 on both (single: also α's, from the partial gradient)
            flagged = step == 0 and not curvature
            assert any("lin.weight unavailable" in f for f in distributed[step].get("flags", [])) == flagged
            user = [[f for f in record[step].get("flags", []) if not f.startswith("the GGN diagonal's")][:2]
                    for record in (distributed, single)]  # (the GGN pass's flag quotes each rank's own distance)
            assert user[0] == user[1]
        skip = ("Time", "flags") if name == "tied_in_own_code" else ("Time",)
        if accumulate:  # (of each forward call: a step of several micro-batches averages its calls, not the union's)
            skip += ("ActivationStats", "InputStats")
        expected = dict(flatten({k: v for k, v in single[step].items() if k not in skip}))
        got = dict(flatten({k: v for k, v in distributed[step].items() if k not in skip}))
        assert sorted(got) == sorted(expected), (case, step)
        for key, value in expected.items():
            other, key = got[key], f"{case}, step {step}: {key}"
            if key.endswith("/hist") and np.isnan(np.asarray(value, dtype=float)).all():
                assert np.isnan(np.asarray(other, dtype=float)).all(), key
            elif key.endswith("/hist"):  # (the two bins around 0 of each axis as one)
                assert histograms_agree(other, value), key
            elif isinstance(value, float) and math.isnan(value):
                assert math.isnan(other), key
            elif isinstance(value, (bool, str)) or value is None:
                assert other == value, key
            else:  # (the activations' statistics: float32 reductions in one process)
                tight = not key.split(": ")[-1].startswith("/ActivationStats")
                np.testing.assert_allclose(np.asarray(other, dtype=float), np.asarray(value, dtype=float),
                                           rtol=1e-10 if tight else 1e-6, atol=1e-12 if tight else 1e-7, err_msg=key)


SUBGROUP_CASES = {"diagnosed": ("mlp", (5, 3), 1, False, False, True), "gpt": ("gpt", (3, 2), 1)}
"""Trained by the first two of three processes, DDP over a process group of those two; the third trains
each case's whole batch alone, DDP over a group of itself. ``gpt`` takes token ids: ``InputStats`` records
no input on any rank."""


def _subgroup_worker(rank, path):
    dist.init_process_group("gloo", init_method=f"file://{path}.pg", rank=rank, world_size=3)
    try:
        torch.set_num_threads(1)
        pair, alone = dist.new_group([0, 1]), dist.new_group([2])  # (every rank creates every group)
        records = {}
        for case, (name, shards, micro, *options) in SUBGROUP_CASES.items():
            if rank < 2:
                records[case] = _train(name, shards, micro, rank, *options, group=pair)[0]
            else:
                records[case] = _train(name, (sum(shards),), micro, 0, *options, group=alone)[0]
        if rank != 1:
            with open(f"{path}.{rank}", "wb") as file:
                pickle.dump(records, file)
        else:
            assert all(record == {} for record in records.values()), "only the group's first rank keeps the record"
    finally:
        dist.destroy_process_group()
    _leave()


def test_ddp_over_a_subgroup_combines_the_ranks_of_its_group_only(tmp_path):
    """DDP given a process group (data parallel within a larger job): the Cockpit combines the statistics
    over that group's ranks, not over every process; each group's first rank keeps the record, and a group
    of one process is one process."""
    path = str(tmp_path / "subgroup")
    _spawn_or_fail(_subgroup_worker, path, 3, 180, "their collectives did not match")
    pairs, alone = (pickle.loads(Path(f"{path}.{rank}").read_bytes()) for rank in (0, 2))
    for case, (name, shards, micro, *options) in SUBGROUP_CASES.items():
        _check_case(case, name, shards, micro, pairs[case], *options)
        _check_case(case, name, (sum(shards),), micro, alone[case], *options)
    assert all("InputStats" not in entry for entry in pairs["gpt"].values())


def _train_single_micro(name, shards):
    """One process, the same micro-batches as the ranks together: micro-batch k of the
    whole batch is every rank's micro-batch k."""
    torch.manual_seed(0)
    model = _model(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(model, _quantities(), strict=name != "tied_in_own_code", diagnose=False)
    total = sum(shards)
    for step, (x, y) in enumerate(_batches(name, total)):
        halves = []
        for k in range(2):
            index, start = [], 0
            for size in shards:
                part = slice(start + (0 if k == 0 else size // 2), start + (size // 2 if k == 0 else size))
                index += list(range(part.start, part.stop))
                start += size
            halves.append(torch.tensor(index))
        opt.zero_grad()
        _loss(model, x[halves[0]], y[halves[0]], name, 0.5).backward()
        loss = _loss(model, x[halves[1]], y[halves[1]], name, 0.5)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    return cp.get_output()


def test_a_process_group_without_ddp_names_the_fix(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(3, 2)
        Cockpit(model, [quantities.NormTest()], diagnose=False)  # one process: nothing to combine
    finally:
        dist.destroy_process_group()
    from cockpit_lite import distributed

    with pytest.raises(ValueError, match="DistributedDataParallel"):
        class FakeGroup:  # the check as it runs with two processes
            pass
        original = dist.is_initialized, dist.get_world_size
        dist.is_initialized, dist.get_world_size = (lambda: True), (lambda: 2)
        try:
            distributed.group_for(torch.nn.Linear(3, 2))
        finally:
            dist.is_initialized, dist.get_world_size = original


BUDGET_STEPS = 80


class _StepClock:
    """A ``time`` stand-in for the step context: it moves only by what ``spend`` adds (10 ms a step, more on
    one rank's tracked steps), so the budget sees the same periods whatever the machine's load, and
    ``cp(step)`` calls that take no time."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def spend(self, seconds):
        self.now += seconds


def _budget_worker(rank, path):
    from cockpit_lite import step_context
    from cockpit_lite.budget import Budget

    dist.init_process_group("gloo", init_method=f"file://{path}.pg", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        clock = step_context.time = _StepClock()  # (this worker process only)
        model = torch.nn.parallel.DistributedDataParallel(problems.BUILDERS["mlp"][0]().double())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cp = Cockpit(model, configuration("economy"), diagnose=False, budget=Budget(1.5, horizon=100))
        x, y = _batches("mlp", 8)[0]
        for step in range(BUDGET_STEPS):
            clock.spend(0.01)
            opt.zero_grad()
            loss = F.cross_entropy(model(x[rank * 4:(rank + 1) * 4]), y[rank * 4:(rank + 1) * 4])
            with cp(step, info={"loss": loss, "optimizer": opt}):
                loss.backward()
            if rank == 1 and cp.budget.top(step) is not None:
                clock.spend(0.05)  # this rank measures far dearer tiers
            opt.step()
        with open(f"{path}.{rank}", "wb") as file:
            pickle.dump((cp.budget.plan, cp.get_output(), [t for t in range(BUDGET_STEPS) if cp.budget.top(t) is not None]),
                        file)
    finally:
        dist.destroy_process_group()
    _leave()


def test_ranks_fix_the_same_budget_plan(tmp_path):
    """Each rank times its own steps; planning alone, they would schedule the global-batch
    statistics at different steps and wait for each other's collectives forever."""
    path = str(tmp_path / "plan")
    _spawn_or_fail(_budget_worker, path, WORLD, 120, "they disagreed on the budget's schedules")
    plans = []
    for rank in range(WORLD):
        with open(f"{path}.{rank}", "rb") as file:
            plans.append(pickle.load(file))
    (plan, record, tracked), (other, rest, also) = plans
    assert plan == other and tracked == also and rest == {}
    assert len(budget.plans(record)) >= 2 and tracked  # re-planned after measuring, the same on both ranks
    assert set(record[tracked[0]]) & {q.name for q in configuration("economy")}  # recorded where both planned it


DIAGNOSED_STEPS, NAN_STEP = 22, 13
"""The default ``Cockpit(model)`` (the diagnosis alone) past its dense steps; rank 1's part of the batch at
``NAN_STEP`` holds a NaN (an untracked step: the origin is recorded at step 20, the next tracked one)."""


def _diagnosed(rank=None, world=WORLD):
    """The record and findings of ``Cockpit(model)`` on the MLP (one process: the whole batch; rank ``rank``:
    its half), with a NaN in the second half of the batch at ``NAN_STEP``."""
    torch.manual_seed(0)
    model = _model("mlp")
    tracked = model if rank is None else torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cp = Cockpit(tracked)
    batches = _batches("mlp", 8)
    for step in range(DIAGNOSED_STEPS):
        x, y = batches[step % STEPS]
        x = x.clone()
        if step == NAN_STEP:
            x[5, 0] = math.nan
        part = slice(0, 8) if rank is None else slice(4 * rank, 4 * rank + 4)
        opt.zero_grad()
        loss = F.cross_entropy(tracked(x[part]), y[part])
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    return cp.get_output(), [str(f) for f in cp.findings]


def _diagnosed_worker(rank, path):
    dist.init_process_group("gloo", init_method=f"file://{path}.pg", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        _rank_0_writes(path, _diagnosed(rank))
    finally:
        dist.destroy_process_group()
    _leave()


def test_the_default_diagnosis_under_ddp_and_a_nan_on_one_rank(tmp_path):
    """Every rank computes the diagnosis's signals (their collectives need all ranks; only rank 0 added them
    before, and the first recorded step waited forever). A NaN in one rank's part of the batch at an untracked
    step is located on that rank and recorded at the next tracked step, with its step and rank; before it, the
    record is one process's on the whole batch."""
    path = str(tmp_path / "diagnosed.pkl")
    _spawn_or_fail(_diagnosed_worker, path, WORLD, 180, "the ranks' collectives did not match")
    with open(path, "rb") as file:
        record, findings = pickle.load(file)
    single, _ = _diagnosed()
    assert sorted(s for s in record if s < NAN_STEP) == sorted(s for s in single if s < NAN_STEP) == list(range(11))
    for step in range(11):
        expected = dict(flatten({k: v for k, v in single[step].items() if k != "Time"}))
        got = dict(flatten({k: v for k, v in record[step].items() if k != "Time"}))
        assert sorted(got) == sorted(expected), step
        for key, value in expected.items():
            if isinstance(value, (bool, str)) or value is None:
                assert got[key] == value, (step, key)
            else:  # (the activations' statistics: float32 reductions in one process)
                np.testing.assert_allclose(np.asarray(got[key], dtype=float), np.asarray(value, dtype=float),
                                           rtol=1e-6, atol=1e-7, err_msg=f"step {step}: {key}")
    assert single[NAN_STEP]["NonfiniteOrigin"] == {"module": "input", "op": "input", "params_nonfinite": False}
    assert NAN_STEP not in record and math.isnan(record[20]["Loss"])
    assert record[20]["NonfiniteOrigin"] == {"module": "input", "op": "input", "params_nonfinite": False,
                                             "step": NAN_STEP, "rank": 1}
    assert any("nan_loss" in f and f"at step {NAN_STEP}, in the part of the batch of rank 1" in f for f in findings), findings


def test_gather_objects_returns_each_ranks_tensors_as_they_were(tmp_path):
    """The signals' gather sends tensors as NumPy arrays: every dtype, shape and stride comes back equal (bfloat16
    and float8, which NumPy lacks, by their bits)."""
    from cockpit_lite import distributed

    sent = {"calls": [[torch.tensor(3.0, dtype=torch.float64), torch.randn(4).expand(3, 4), torch.ones(1).expand(5)]],
            "other": (torch.randn(3).bfloat16(), torch.tensor([True, False]), torch.empty(0), torch.arange(5),
                      torch.zeros(2, dtype=torch.float8_e4m3fn), "a name", None)}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        (got,) = distributed.gather_objects(sent)
    finally:
        dist.destroy_process_group()
    expected, received = (torch.utils._pytree.tree_leaves(x) for x in (sent, got))
    assert len(expected) == len(received)
    for a, b in zip(expected, received):
        if torch.is_tensor(a):
            assert b.dtype == a.dtype and b.shape == a.shape
            assert torch.equal(b.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else b,
                               a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a)
        else:
            assert b == a
