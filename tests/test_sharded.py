"""A model sharded by FSDP2 (``fully_shard``, CPU processes, gloo, float64): every first-order
quantity, the curvature quantities, the diagnosis signals and findings equal those of one process on
the whole batch; the global path is NaN with the reason; what is not supported is refused with a fix
that works. One set of processes runs every multi-process case (starting them costs more than the
training)."""

import math

import pytest
import torch
import torch.distributed as dist
from torch import nn

import problems
from cockpit_lite import Cockpit, configuration, quantities, sharded
from benchmarks import memory_flatness
from experiments import fsdp_equality
from experiments.fsdp_equality import Case

RTOL = 1e-12
SIGNAL_RTOL = 1e-5
"""The diagnosis signal ``ActivationStats`` reduces in float32 in one process (by design); the sharded
run adds the ranks' float64 sums."""
CURVATURE_RTOL = 1e-10
"""The curvature quantities: Hutchinson's traces are means of ±products that cancel (a layer's trace
near 0 has the relative rounding of the products' size); measured ≤ 2e-14."""
CURVATURE = ("HessTrace", "HessMaxEV", "TICDiag", "TICTrace")
"""Hutchinson's ``HessTrace`` and ``HessMaxEV``'s Lanczos from Hessian-vector products averaged over the
ranks; the TICs from the engine's exact GGN diagonal, reduce-scattered in its passes."""


def _loss_of(loss_class):
    return lambda out, y: loss_class()(out.reshape(-1, out.shape[-1]) if out.dim() > 2 else out,
                                       y.reshape(-1) if y.dim() > 1 else y)


PROBLEMS = {name: (build, inputs, targets, _loss_of(loss)) for name, (build, loss, inputs, targets)
            in problems.BUILDERS.items() if name in ("vit_like", "gpt", "custom", "resnet_gn", "resnet_bn_train")}
"""Models of ``tests/problems.py`` as ``fsdp_equality.MODELS`` entries (``Case(source=...)``)."""

PROBLEMS["regression"] = (lambda: nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1, bias=False)),
                          fsdp_equality.MODELS["mlp"][1], lambda g, b: torch.randn(b, 1, generator=g, dtype=torch.float64),
                          torch.nn.functional.mse_loss)
"""One output per sample: the Monte-Carlo GGN's Rademacher sign squares away, so its draws are the exact
diagonal's, on any rank, and the sharded estimate is comparable with one process's. (No last bias: one
number, whose gradient tests are rounding noise.)"""



class Wide(nn.Module):
    """A Linear layer over a sequence whose individual gradients (4 samples × 131,072 elements) exceed a CPU
    chunk (``per_sample.CPU_GRAD_BATCH_ELEMENTS``): its transforms run on chunks of samples."""

    def __init__(self):
        super().__init__()
        self.wide, self.head = nn.Linear(256, 512), nn.Linear(512, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.wide(x)).mean(1))


PROBLEMS["wide"] = (Wide, lambda g, b: torch.randn(b, 4, 256, generator=g, dtype=torch.float64),
                    lambda g, b: torch.randint(0, 3, (b,), generator=g), torch.nn.functional.cross_entropy)

HERE = "test_sharded:PROBLEMS"

SECONDS = 600
"""How long the processes of one ``run_cases`` may take (about 60 s on 2 loaded cores): ranks whose collectives
do not match wait for each other forever, and the test fails instead."""

CASES_2 = {  # name -> Case, run by 2 ranks
    "mlp_unequal_sgd": Case("mlp", "sgd", shards=(5, 3), steps=3),  # + CABS and EarlyStopping
    "transformer_mixed_adamw": Case("transformer", "adamw", sharding="mixed", steps=3),
    "mlp_layernorm_momentum": Case("mlp_layernorm", "sgd_momentum", steps=3),
    "samples": Case("mlp", "sgd_momentum", shards=(5, 3), steps=3, options={"samples": 3}),
    "vit_like": Case("vit_like", "sgd_momentum", steps=2, source=HERE),  # attention, shared tensors
    "gpt_tied": Case("gpt", "adamw", steps=2, source=HERE),  # tied head, bare positions
    "custom_layer": Case("custom", "sgd", steps=2, source=HERE),  # torch.func's re-run (GENERIC)
    "group_norm": Case("resnet_gn", "sgd_momentum", steps=2, source=HERE),
    "chunked_unequal": Case("wide", "sgd_momentum", shards=(4, 3), steps=2, source=HERE),  # chunks scaled by B/W = 3.5
    "curvature_mlp": Case("mlp", "sgd_momentum", shards=(5, 3), steps=2, options={"diagnose": False}, more=CURVATURE),
    "curvature_transformer": Case("transformer", "adamw", steps=2, options={"diagnose": False},
                                  more=("HessTrace", "HessMaxEV", ("TICDiag", {"max_passes": 66}))),
    "curvature_monte_carlo": Case("regression", "sgd", steps=2, source=HERE, options={"diagnose": False},
                                  more=(("HessTrace", {"curvature": "diag_ggn_mc", "probes": 4}),)),
}
CASES_4 = {
    "mlp_4": Case("mlp", "adamw", steps=3),
    "transformer_4": Case("transformer", "sgd_momentum", shards=(3, 2, 2, 1), steps=3),
}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    cases = dict(CASES_2, bn_train=Case("resnet_bn_train", "sgd", steps=1, source=HERE),
                 subsampled_tics=Case("mlp", "sgd", shards=(5, 3), steps=1, options={"diagnose": False, "samples": 3},
                                      more=("TICDiag", "TICTrace")),
                 mixed_precision=Case("mlp_layernorm", "adamw", steps=2, dtype="float32", param_dtype="bfloat16",
                                      options={"diagnose": False}))
    return fsdp_equality.run_cases(cases, 2, _Checks, str(tmp_path_factory.mktemp("ranks")), seconds=SECONDS)


@pytest.mark.parametrize("name", sorted(CASES_2))
def test_two_ranks_equal_one_process(two_ranks, name):
    _assert_equal(CASES_2[name], two_ranks[name][0], name)


def test_four_ranks_equal_one_process(tmp_path):
    results = fsdp_equality.run_cases(CASES_4, 4, directory=str(tmp_path), seconds=SECONDS)
    for name, case in CASES_4.items():
        _assert_equal(case, results[name][0], name)


def test_a_mesh_of_some_ranks_combines_its_own_ranks_only(tmp_path):
    """FSDP2 over a mesh of some of the job's ranks (ranks 0 and 1 shard one model, rank 2 trains its own
    alone): each mesh's first rank keeps the record of its own ranks' batch, equal to one process's."""
    case = Case("mlp", "adamw", steps=3, meshes=((0, 1), (2,)))
    (_, findings), records = fsdp_equality.run_cases({"meshes": case}, 3, directory=str(tmp_path),
                                                     seconds=SECONDS)["meshes"]
    assert records[1] == {}, "only a mesh's first rank keeps the record"
    single = fsdp_equality.train(case)
    for record in records[0], records[2]:
        worst, problems_found = fsdp_equality.compare(single, (record, findings))
        assert not problems_found and "Alpha" in worst, problems_found
        assert max(error for quantity, error in worst.items() if quantity != "ActivationStats") <= RTOL, worst
        assert worst["ActivationStats"] <= SIGNAL_RTOL, worst


def _assert_equal(case, sharded_result, name):
    single = fsdp_equality.train(case)
    worst, problems_found = fsdp_equality.compare(single, sharded_result)
    assert not problems_found, (name, problems_found)
    assert set(worst) >= {"GradNorm", "NormTest", "InnerTest", "OrthoTest", "GradVariance", "MeanGSNR", "Alpha",
                          "Distance", "UpdateSize", "Loss", "GradHist1d", "GradHist2d"}, (name, sorted(worst))
    tracked = {entry if isinstance(entry, str) else entry[0] for entry in case.more}
    assert set(worst) >= tracked, (name, sorted(worst))
    for quantity, error in worst.items():
        if quantity.endswith("(counts)"):
            continue  # moved only around 0 (else ``compare`` names a problem)
        limit = (SIGNAL_RTOL if quantity == "ActivationStats" else
                 CURVATURE_RTOL if quantity in CURVATURE else RTOL)
        assert error <= limit, (name, quantity, error)
    record = single[0]
    if "samples" in case.options:
        assert all(record[step]["batch"].get("samples") == case.options["samples"] for step in record)


class _Checks:
    """What the ranks check in the same processes, after the cases (``run_cases``'s ``extra``)."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def run(self):
        found = {}
        model = fsdp_equality.MODELS["mlp"][0]().double()
        from torch.distributed.fsdp import fully_shard

        fully_shard(model[0])  # the root is not sharded: the rest's gradients are not averaged
        with pytest.raises(ValueError, match=r"fully_shard the root module too") as error:
            Cockpit(model, diagnose=False)
        found["unsharded_root"] = str(error.value)
        fully_shard(model)  # the fix
        found["fixed"] = Cockpit(model, configuration("economy"), diagnose=False).group.sharded
        found["in_backward"] = _runs_in_backward()
        found["undisturbed"] = _parameters_after(True) == _parameters_after(False)
        found["own_passes"] = _own_passes()
        found["alpha_after_an_edit"] = [_alpha_of_step_0(edit) for edit in (False, True)]
        found["nan_on_one_rank"] = _nan_on_one_rank()
        return found


def _nan_on_one_rank(steps=22, bad=13):
    """Rank 0's record of ``NonfiniteOrigin`` from step ``bad`` on, and its findings: the default
    ``Cockpit(model)`` on the sharded MLP, a NaN in the second rank's part of the batch at ``bad`` (an
    untracked step)."""
    torch.manual_seed(0)
    model = fsdp_equality.MODELS["mlp"][0]().double()
    fsdp_equality.shard(model, "layers")
    opt = fsdp_equality.OPTIMIZERS["sgd"](model.parameters())
    cp = Cockpit(model)
    rank, part = dist.get_rank(), fsdp_equality.BATCH // dist.get_world_size()
    batches = fsdp_equality.batches(Case("mlp", steps=2), fsdp_equality.BATCH)
    for step in range(steps):
        x, y = batches[step % len(batches)]
        x = x[rank * part:(rank + 1) * part].clone()
        if step == bad and rank == 1:
            x[0, 0] = math.nan
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y[rank * part:(rank + 1) * part])
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    record = cp.get_output()
    origins = {step: entry["NonfiniteOrigin"] for step, entry in record.items()
               if step >= bad and "NonfiniteOrigin" in entry}
    return (origins, [str(f) for f in cp.findings]) if rank == 0 else None


def _alpha_of_step_0(edit):
    """``(α, flags)`` of step 0 in the record (rank 0's) of the sharded MLP under SGD; with ``edit``, the
    second rank's rows of the first weight shrink after ``optimizer.step()`` (a max-norm constraint that
    only rows that rank holds exceed): the update is not the optimizer's on one rank alone."""
    torch.manual_seed(0)
    model = fsdp_equality.MODELS["mlp"][0]().double()
    fsdp_equality.shard(model, "layers")
    opt = fsdp_equality.OPTIMIZERS["sgd"](model.parameters())
    cp = Cockpit(model, [quantities.Alpha()], diagnose=False)
    rank, part = dist.get_rank(), fsdp_equality.BATCH // dist.get_world_size()
    for step, (x, y) in enumerate(fsdp_equality.batches(Case("mlp", steps=2), fsdp_equality.BATCH)):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[rank * part:(rank + 1) * part]), y[rank * part:(rank + 1) * part])
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
        if edit and rank == 1:
            with torch.no_grad():
                next(model.parameters()).to_local().mul_(0.99)
    record = cp.get_output()
    return (record[0]["Alpha"], record[0].get("flags", [])) if rank == 0 else None


def _parameters_after(tracked, steps=3):
    """This rank's rows of every parameter after ``steps`` AdamW steps of the sharded transformer, with
    ``economy``, the curvature quantities (the Cockpit's own passes: Hessian-vector products, the GGN's) and
    the diagnosis at every step (``tracked``) or without a Cockpit (as bytes)."""
    case = Case("transformer", "adamw")
    torch.manual_seed(0)
    model = fsdp_equality.GPT().double()
    fsdp_equality.shard(model, "layers")
    opt = fsdp_equality.OPTIMIZERS["adamw"](model.parameters())
    curvature = [quantities.HessTrace(probes=2), quantities.HessMaxEV(maxiter=4), quantities.TICDiag(max_passes=66)]
    cp = Cockpit(model, configuration("economy") + curvature) if tracked else None
    rank, part = dist.get_rank(), fsdp_equality.BATCH // dist.get_world_size()
    for step, (x, y) in enumerate(fsdp_equality.batches(case, fsdp_equality.BATCH)[:steps]):
        opt.zero_grad()
        loss = fsdp_equality.token_loss(model(x[rank * part:(rank + 1) * part]), y[rank * part:(rank + 1) * part])
        memory_flatness.backward(cp, step, loss, opt)
        opt.step()
    return [p.to_local().detach().numpy().tobytes() for p in model.parameters()]


def _own_passes():
    """What FSDP2 holds after the forward pass (which parameters are sharded, the settings, the order of
    backward prefetching) before and after the Cockpit's Hessian-vector products (``ShardedGroup.own_passes``),
    and the shapes of Hutchinson's group sums: this rank's rows of each parameter (``[(kept, local)]``)."""
    from cockpit_lite.curvature import hutchinson
    from cockpit_lite.curvature.hvp import HessianVectorProducts

    torch.manual_seed(0)
    model = fsdp_equality.GPT().double()
    fsdp_equality.shard(model, "layers")
    group, params = sharded.group_for_sharded(model), list(model.parameters())
    x, y = fsdp_equality.batches(Case("transformer"), 4)[0]
    loss = fsdp_equality.token_loss(model(x), y)

    def held():
        contexts = {id(s._state_ctx): s._state_ctx.is_last_backward for s in sharded.fsdp_states(model)}
        return ([(g.is_sharded, g.reshard_after_backward, g.reduce_grads, list(g._post_forward_indices))
                 for g in sharded.fsdp_groups(model)], sorted(contexts.values()))

    before = held()
    with group.own_passes(model, params, whole=True) as leaves:
        estimate = hutchinson.estimate(HessianVectorProducts(loss, leaves, 0, model, group, params), 2, 0)
    return before, held(), [(tuple(s.shape[1:]), tuple(p.to_local().shape), tuple(p.shape))
                            for s, p in zip(estimate.group_sums, params)]


def _runs_in_backward():
    """Whether every rule-served parameter's transforms ran inside the backward pass (its layer's)."""
    inside, original = [], sharded.ShardedGroup.run

    def recording(self, transforms, per_sample, batch=None, scratch=None):
        inside.append(torch._C._current_graph_task_id() >= 0)
        return original(self, transforms, per_sample, batch, scratch)

    sharded.ShardedGroup.run = recording
    try:
        fsdp_equality.train(Case("transformer", "sgd", steps=1, options={"diagnose": False}), dist.get_rank(),
                            dist.get_world_size())
    finally:
        sharded.ShardedGroup.run = original
    return inside


def test_parameters_changed_after_the_step_on_one_rank_alone_are_flagged(two_ranks):
    """α's check that the update is the optimizer's sees every rank's rows: an edit of the second rank's rows
    after the step makes the first rank's record NaN with the flag; without it, α is a number."""
    (plain, plain_flags), (edited, edited_flags) = two_ranks["_checks"][0]["alpha_after_an_edit"]
    assert math.isfinite(plain) and not plain_flags, (plain, plain_flags)
    assert math.isnan(edited) and any("changed after optimizer.step()" in flag for flag in edited_flags), edited_flags


def test_a_nan_on_one_rank_is_located_there_and_recorded_at_the_next_tracked_step(two_ranks):
    """A NaN in one rank's part of the batch at an untracked step: that rank alone tracking the step would
    leave the others waiting (before: a collective mismatch stopped the training). It is located on that rank
    (the input; no replay of a sharded forward pass is needed for it) and recorded at step 20 with its step
    and rank."""
    origins, findings = two_ranks["_checks"][0]["nan_on_one_rank"]
    assert origins[20] == {"module": "input", "op": "input", "params_nonfinite": False, "step": 13, "rank": 1}
    assert min(origins) == 20, origins
    assert any("nan_loss" in f and "at step 13, in the part of the batch of rank 1" in f for f in findings), findings


def test_transforms_run_inside_the_layers_backward_pass(two_ranks):
    """A rank never holds a layer's individual gradients past its backward pass: their transforms ran
    there, each parameter's (2 Linear per block of 2 blocks, 2 LayerNorm, 1 embedding, the head...)."""
    inside = two_ranks["_checks"][0]["in_backward"]
    assert len(inside) == sum(1 for _ in fsdp_equality.GPT().parameters()) and all(inside)


def test_training_is_not_disturbed(two_ranks):
    """The parameters after three tracked steps are those of the same sharded training without a Cockpit,
    bit for bit, on every rank."""
    assert all(checks["undisturbed"] for checks in two_ranks["_checks"])


def test_own_passes_leave_fsdp_as_the_forward_pass_left_it(two_ranks):
    """After the Cockpit's Hessian-vector products (every parameter gathered and kept whole meanwhile) the
    same groups are sharded (the root's stays whole, the layers' are sharded again), FSDP2's settings and
    its order of backward prefetching are back; Hutchinson's group sums hold this rank's rows only."""
    for checks in two_ranks["_checks"]:
        before, after, shapes = checks["own_passes"]
        assert before == after
        assert [sharded_now for sharded_now, *_ in before[0]] == [False, True, True]  # the root (whole), two blocks
        assert all(kept == local for kept, local, _ in shapes) and any(kept != whole for kept, _, whole in shapes)


def test_unsharded_root_is_refused_with_the_fix(two_ranks):
    checks = two_ranks["_checks"][0]
    assert "0.weight" not in checks["unsharded_root"] and "2.weight" in checks["unsharded_root"]
    assert checks["fixed"]


def test_batchnorm_in_training_mode_is_flagged(two_ranks):
    """Parameters before a BatchNorm in training mode need the global path: NaN with the reason
    under FSDP2 (one process: exact), the others as one process."""
    record = two_ranks["bn_train"][0][0][0]
    flags = " ".join(record.get("flags", []))
    assert "global path" in flags and "Fix: BatchNorm in eval mode" in flags
    norms = record["layers"]["NormTest"] if "layers" in record and "NormTest" in record["layers"] else None
    assert math.isnan(record["NormTest"]) and norms is not None and any(math.isnan(v) for v in norms)
    assert all(math.isfinite(v) for v in record["GradNorm"])


def test_curvature_comes_from_the_cockpits_own_passes(two_ranks):
    """The curvature cases above are compared with one process; here: by what they were computed."""
    for name, methods in (("curvature_mlp", {"HessTrace": "hutchinson", "TICDiag": "diag_ggn_exact"}),
                          ("curvature_monte_carlo", {"HessTrace": "diag_ggn_mc"})):
        for entry in two_ranks[name][0][0].values():
            assert {q: entry["meta"][q]["curvature"] for q in methods} == methods
            assert "flags" not in entry, entry.get("flags")
            if name == "curvature_mlp":
                assert entry["meta"]["HessMaxEV"]["products"] >= 5 and entry["meta"]["TICTrace"]["passes"] == 2  # C - 1


def test_subsampled_tic_diag_is_flagged_tic_trace_estimated(two_ranks):
    """``samples=k``: TICTrace's estimate (per-sample norms) equals one process's; TICDiag's needs each drawn
    sample's squares of the whole parameters, which the sharding has no layout for: NaN, with the fix (which
    works: ``curvature_mlp``, the exact TICDiag without ``samples``)."""
    case = Case("mlp", "sgd", shards=(5, 3), steps=1, options={"diagnose": False, "samples": 3}, more=("TICTrace",))
    sharded_record = two_ranks["subsampled_tics"][0][0][0]
    single = fsdp_equality.train(case)[0][0]
    assert sharded_record["TICTrace"] == pytest.approx(single["TICTrace"], rel=RTOL)
    assert sharded_record["meta"]["TICTrace"]["se"] == pytest.approx(single["meta"]["TICTrace"]["se"], rel=RTOL)
    assert math.isnan(sharded_record["TICDiag"])
    assert any(f.startswith("TICDiag: not computed on a model sharded by FSDP2 at this step: it needs "
                            "individual_squares") and "Fix: Cockpit(samples=None)" in f for f in sharded_record["flags"])


def test_mixed_precision_is_flagged_at_every_step(two_ranks):
    """FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16)``: the statistics of the bfloat16 passes, within
    bfloat16's rounding of the float32 step's (one process, no sharding), each step flagged with why."""
    sharded_record = two_ranks["mixed_precision"][0][0]
    single = fsdp_equality.train(Case("mlp_layernorm", "adamw", steps=2, dtype="float32", options={"diagnose": False}))[0]
    assert sorted(sharded_record) == sorted(single)
    for step, entry in sharded_record.items():
        assert any(f.startswith("FSDP2 mixed precision (param_dtype=torch.bfloat16)") and "Fix: MixedPrecisionPolicy"
                   in f for f in entry["flags"])
        for name in ("NormTest", "InnerTest", "OrthoTest", "MeanGSNR", "GradVariance"):
            assert entry[name] == pytest.approx(single[step][name], rel=5e-2), (step, name)


def test_one_rank_equals_no_sharding(one_rank):
    """``fully_shard`` on one process (the docs' block run as is): the values of the unsharded model."""
    case = Case("transformer", "adamw", steps=2)
    worst, found = fsdp_equality.compare(fsdp_equality.train(case), fsdp_equality.train(case, 0, 1))
    assert not found and max(e for q, e in worst.items() if q not in ("ActivationStats", "InputStats")) <= RTOL


def test_parameters_without_the_model_are_refused_with_the_fix(one_rank):
    from torch.distributed.fsdp import fully_shard

    model = fsdp_equality.MODELS["mlp"][0]().double()
    fully_shard(model)
    with pytest.raises(ValueError, match=r"Fix: pass the model, Cockpit\(model"):
        Cockpit(model.parameters(), diagnose=False)
    assert Cockpit(model, diagnose=False).group.sharded  # the fix


def test_accumulation_is_refused_with_the_fix(one_rank):
    from torch.distributed.fsdp import fully_shard

    model = fsdp_equality.MODELS["mlp"][0]().double()
    fully_shard(model)
    with pytest.raises(ValueError, match=r"accumulate=True\) on a model sharded by FSDP2.*Fix: accumulate=False"):
        Cockpit(model, diagnose=False, accumulate=True)
    assert not Cockpit(model, diagnose=False, accumulate=False).accumulate  # the fix


@pytest.mark.parametrize("style", ["ColwiseParallel", "RowwiseParallel"])
def test_tensor_parallel_is_refused_with_the_fix(one_rank, style):
    """Tensor parallel: a weight sharded by rows without fully_shard, or by columns; the fix
    (fully_shard) works: ``test_one_rank_equals_no_sharding``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import parallel

    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)).double()
    parallel.parallelize_module(model, init_device_mesh("cpu", (1,)), {"0": getattr(parallel, style)()})
    with pytest.raises(ValueError, match=r"(sharded otherwise|no module of it is sharded by fully_shard).*"
                                         r"Fix: shard the model with (torch.distributed.fsdp.)?fully_shard"):
        Cockpit(model, diagnose=False)


def test_fsdp1_is_refused_with_the_fix(one_rank, monkeypatch):
    """FSDP1 (``FullyShardedDataParallel``): refused, naming FSDP2's ``fully_shard`` (which works:
    ``test_one_rank_equals_no_sharding``). FSDP1 itself needs a GPU to wrap a model: a stand-in
    subclass of it is what the check sees."""
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp1

    class Wrapped(fsdp1.FullyShardedDataParallel):
        def __init__(self, module):
            nn.Module.__init__(self)
            self.inner = module

    with pytest.raises(ValueError, match=r"FullyShardedDataParallel \(FSDP1\).*Fix: shard it with FSDP2"):
        Cockpit(Wrapped(nn.Linear(3, 2)), diagnose=False)
