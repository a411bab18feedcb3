"""CockpitCallback with the real Lightning Trainer: accumulation, clipping, loggers, dashboards."""

import csv
import functools
import math
import glob
import os

import pytest
import torch
from torch import nn


from cockpit_lite import quantities, subsample
from test_subsample import references

BATCH, BATCHES = 6, 4


@functools.cache
def _lightning():
    """Lightning, the callback and the test module, imported on first use: importing Lightning
    takes ~10 s, which at collection would cost every parallel test worker."""
    pl = pytest.importorskip("lightning.pytorch", reason="the lightning extra is not installed (pip install '.[lightning]' in a clone of cockpit-lite)")
    from cockpit_lite.integrations.lightning import CockpitCallback

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
            self.seen = {}  # batch_idx of the current epoch -> (parameters before, batch)

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen[(self.current_epoch, batch_idx)] = ([p.detach().clone() for p in self.parameters()], x, y)
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.3)  # clipping scales its update uniformly

    return pl, CockpitCallback, Module


def _loader():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH * BATCHES, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (BATCH * BATCHES,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)


def _fit(tmp_path, callbacks, accumulate_grad_batches=2):
    pl, CockpitCallback, Module = _lightning()
    module = Module()
    trainer = pl.Trainer(
        max_epochs=2, accumulate_grad_batches=accumulate_grad_batches, gradient_clip_val=0.05, accelerator="cpu", devices=1,
        logger=pl.loggers.CSVLogger(tmp_path), enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, callbacks=callbacks, log_every_n_steps=1,
    )
    trainer.fit(module, _loader())
    return module, trainer


def _net(params):
    pl, CockpitCallback, Module = _lightning()
    net = Module().net
    with torch.no_grad():
        for p, value in zip(net.parameters(), params):
            p.copy_(value)
    return net


def _individual_gradients(module, params, x, y):
    """Brute force: one forward pass, a loop of autograd.grad over the samples' losses (g̃_n = ∇ℓ_n)."""
    net = _net(params)
    losses = nn.functional.cross_entropy(net(x), y, reduction="none")
    rows = [torch.autograd.grad(losses[n], list(net.parameters()), retain_graph=True) for n in range(len(y))]
    return [torch.stack([r[i] for r in rows]) for i in range(len(params))]


def test_callback_tracks_the_optimizer_steps(tmp_path):
    pl, CockpitCallback, Module = _lightning()
    callback = CockpitCallback([quantities.Loss(), quantities.GradNorm(), quantities.NormTest(), quantities.Alpha()])
    module, trainer = _fit(tmp_path, [callback])
    record = callback.cockpit.get_output()
    assert sorted(s for s in record if "NormTest" in record[s]) == list(range(trainer.global_step)) == [0, 1, 2, 3]
    for step in range(4):
        # the two micro-batches of optimizer step `step` (accumulate_grad_batches=2), one batch of 2·BATCH:
        # Lightning backpropagates loss / 2 of each, so the optimizer's objective is the mean over both
        seen = [module.seen[divmod(2 * step + k, BATCHES)] for k in range(2)]
        params = seen[0][0]
        assert all(torch.equal(p, q) for p, q in zip(params, seen[1][0]))
        x, y = torch.cat([s[1] for s in seen]), torch.cat([s[2] for s in seen])
        individual = _individual_gradients(module, params, x, y)
        b = 2 * BATCH
        flat = torch.cat([g.reshape(b, -1) for g in individual], 1)
        g = flat.mean(0)
        norm_test = torch.sqrt(((flat - g) ** 2).sum() / ((b - 1) * b * (g**2).sum()))
        entry = record[step]
        assert entry["batch"] == {"size": b, "accumulated": False, "passes": 2}
        assert entry["NormTest"] == pytest.approx(norm_test.item(), rel=1e-9)
        # the accumulated gradient, before the trainer clipped it
        assert entry["GradNorm"] == pytest.approx([i.mean(0).norm().item() for i in individual], rel=1e-9)
        assert entry["Loss"] == pytest.approx(nn.functional.cross_entropy(_net(params)(x), y).item(), rel=1e-9)
    assert all(not entry.get("flags") for entry in record.values())  # Alpha exact under clipping by norm
    assert all(math.isfinite(record[s]["Alpha"]) for s in range(3))

    with open(glob.glob(os.path.join(trainer.logger.log_dir, "metrics.csv"))[0]) as file:
        rows = [r for r in csv.DictReader(file) if r.get("cockpit/NormTest")]
    assert [float(r["cockpit/NormTest"]) for r in rows] == pytest.approx([record[s]["NormTest"] for s in range(4)])

    assert [os.path.basename(p) for p in callback.dashboard_paths] == [
        "cockpit__primary__epoch_000.png", "cockpit__primary__epoch_001.png"]
    assert all(os.path.isfile(p) for p in callback.dashboard_paths)
    assert os.path.isfile(os.path.join(callback.dirpath, "cockpit.jsonl"))


def test_a_subsample_under_accumulation_is_refused_naming_the_trainer_s_setting_and_the_fix_works(tmp_path):
    """``samples=k`` with ``accumulate_grad_batches > 1`` (the callback then accumulates): a clear
    error naming the setting; the fix it names (``samples=None``) tracks, and without accumulation
    the subsample is drawn."""
    pl, CockpitCallback, Module = _lightning()
    with pytest.raises(ValueError, match=r"accumulate_grad_batches.*Fix: samples=None"):
        _fit(tmp_path / "a", [CockpitCallback([quantities.NormTest()], dashboards=False, samples=3)])
    fixed = CockpitCallback([quantities.NormTest()], dashboards=False, samples=None)
    _fit(tmp_path / "b", [fixed])
    assert all(math.isfinite(entry["NormTest"]) for entry in fixed.cockpit.get_output().values())
    drawn = CockpitCallback([quantities.NormTest()], dashboards=False, samples=3)
    drawn_module_seen = _fit(tmp_path / "c", [drawn], accumulate_grad_batches=1)[0].seen
    record = drawn.cockpit.get_output()
    assert sorted(record) == list(range(2 * BATCHES))
    for step, entry in record.items():  # the documented estimator on the brute force of the drawn samples
        params, x, y = drawn_module_seen[divmod(step, BATCHES)]
        flat = torch.cat([g.reshape(BATCH, -1) for g in _individual_gradients(None, params, x, y)], 1)
        value, se = references(flat, subsample.draw(3, BATCH, (0, step)).tolist())["NormTest"]
        assert entry["batch"]["samples"] == 3
        assert entry["NormTest"] == pytest.approx(value, rel=1e-9)
        assert entry["meta"]["NormTest"]["se"] == pytest.approx(se, rel=1e-9)


def test_training_is_not_disturbed(tmp_path):
    pl, CockpitCallback, Module = _lightning()
    tracked, _ = _fit(tmp_path / "a", [CockpitCallback(dashboards=False)])
    plain, _ = _fit(tmp_path / "b", [])
    for p, q in zip(tracked.parameters(), plain.parameters()):
        assert torch.equal(p, q)


def test_hessian_quantities_need_no_override_of_backward(tmp_path):
    """HessMaxEV takes its products from the loss before Lightning's (plain) backward pass."""
    pl, CockpitCallback, Module = _lightning()
    callback = CockpitCallback([quantities.HessMaxEV()], dashboards=False)
    _fit(tmp_path, [callback], accumulate_grad_batches=1)  # (of several accumulated passes: NaN, flagged)
    values = [entry["HessMaxEV"] for entry in callback.cockpit.get_output().values() if "HessMaxEV" in entry]
    assert values and all(math.isfinite(v) for v in values) and not callback.create_graph(0)


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_a_run_resumed_from_a_checkpoint_records_what_the_uninterrupted_run_records(tmp_path):
    pl, CockpitCallback, Module = _lightning()
    import json

    from cockpit_lite import log

    def fit(ckpt_path=None, checkpoints=()):
        module, callback = Module(), CockpitCallback(dirpath=str(tmp_path / "cockpit"), dashboards=False)
        trainer = pl.Trainer(
            max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=tmp_path, callbacks=[callback, *checkpoints],
            enable_checkpointing=bool(checkpoints),
        )
        trainer.fit(module, _loader(), ckpt_path=ckpt_path)
        return callback.cockpit

    saving = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_epochs=1, save_top_k=-1)
    whole = fit(checkpoints=[saving])
    first = sorted(glob.glob(str(tmp_path / "ckpt" / "epoch=0*.ckpt")))[0]  # after optimizer step 3 of 8
    assert "cockpit" in torch.load(first, weights_only=True)["callbacks"][CockpitCallback.__qualname__]
    resumed = fit(ckpt_path=first)

    def text(record):
        return json.dumps(log.to_jsonable({s: e for s, e in record.items() if s >= BATCHES - 1}), sort_keys=True)

    assert all(set(e) == {"findings"} for s, e in resumed.get_output().items() if s < BATCHES - 1)
    assert text(resumed.get_output()) == text(whole.get_output()) and len(whole.get_output()) > BATCHES
    everything = log.read(tmp_path / "cockpit" / "cockpit.jsonl")  # the resumed run replaced steps 4-7
    assert json.dumps(log.to_jsonable(everything), sort_keys=True) == json.dumps(
        log.to_jsonable(whole.get_output()), sort_keys=True)


def test_fsdp1_strategy_is_refused_naming_fsdp2(tmp_path):
    """Lightning's FSDPStrategy (FSDP1) needs a GPU to run; the callback refuses it at fit start, naming
    ModelParallelStrategy with fully_shard (which works: the next test)."""
    pl, CockpitCallback, Module = _lightning()
    from lightning.pytorch.strategies import FSDPStrategy

    trainer = type("Trainer", (), {"strategy": FSDPStrategy()})()
    with pytest.raises(ValueError, match=r"FSDP1.*Fix: strategy=ModelParallelStrategy.*fully_shard"):
        CockpitCallback(dashboards=False).on_fit_start(trainer, Module())


def _ranks_fit(rank, world, path, port, strategy="fsdp2"):
    """One rank of ``world`` (``torchrun``'s environment, so Lightning starts no processes of its own):
    ``_fit``'s ``strategy``."""
    import pickle

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", TORCHELASTIC_RUN_ID="cockpit")
    torch.set_num_threads(1)
    record = _fit_ranks(path, world, rank, strategy)
    if rank == 0:  # (only rank 0 keeps the record)
        with open(f"{path}.0", "wb") as file:
            pickle.dump(record, file)
    os._exit(0)  # gloo's threads sometimes abort in the interpreter's teardown


def _fit_ranks(path, world, rank=0, strategy="fsdp2"):
    """The record of a fit on ``world`` ranks, each its part of every batch: ``strategy`` "fsdp2",
    ModelParallelStrategy with every layer and the net ``fully_shard``-ed in configure_model; "ddp",
    Lightning's DDPStrategy, with the diagnosis on; "ddp_accumulated", that with
    ``accumulate_grad_batches=2`` (DDP's ``no_sync`` for the first micro-batch)."""
    pl, CockpitCallback, Module = _lightning()
    from lightning.pytorch.strategies import ModelParallelStrategy

    from cockpit_lite import configuration

    class Sharded(Module):
        def configure_model(self):
            if world > 1 and strategy == "fsdp2":
                from torch.distributed.fsdp import fully_shard

                mesh = self.device_mesh["data_parallel"]
                for layer in (self.net[0], self.net[2]):
                    fully_shard(layer, mesh=mesh)
                fully_shard(self.net, mesh=mesh)

    ddp = strategy.startswith("ddp")
    callback = CockpitCallback(configuration("economy", extras=True), dirpath=f"{path}.cockpit", dashboards=False,
                               diagnose=ddp)
    chosen = ("auto" if world == 1 else "ddp" if ddp else
              ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1))
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=world, strategy=chosen, logger=False,
                         accumulate_grad_batches=2 if strategy == "ddp_accumulated" else 1,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=path, callbacks=[callback], use_distributed_sampler=False)
    part = BATCH // world  # rank r: its part of every batch of the other tests
    mine = [i for i in range(BATCH * BATCHES) if (i % BATCH) // part == rank]
    data = torch.utils.data.Subset(_loader().dataset, mine)
    trainer.fit(Sharded(), torch.utils.data.DataLoader(data, batch_size=part))
    return callback.cockpit.get_output()


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp", "ddp_accumulated"])
def test_data_parallel_strategies_equal_one_process(tmp_path, strategy):
    """FSDP2 (ModelParallelStrategy) and DDP (``strategy="ddp"``, whose DistributedDataParallel wraps the
    LightningModule: the callback gives the Cockpit that wrapper; before, the Cockpit refused the bare module
    under a process group) under Lightning, 2 CPU processes, gloo, each rank its half of every batch: the
    callback's record equals one process's on the whole batch (DDP with the diagnosis's signals, and with
    ``accumulate_grad_batches=2``)."""
    import pickle
    import socket

    import torch.multiprocessing as mp
    from experiments import fsdp_equality

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = str(tmp_path / "record")
    mp.spawn(_ranks_fit, args=(2, path, port, strategy), nprocs=2, join=True)
    with open(f"{path}.0", "rb") as file:
        ranks = pickle.load(file)
    single = _fit_ranks(str(tmp_path / "single"), 1, strategy=strategy)
    worst, problems = fsdp_equality.compare((single, []), (ranks, []))
    assert not problems and set(worst) >= {"GradNorm", "NormTest", "GradVariance", "Alpha"}, (problems, worst)
    if strategy != "fsdp2":
        assert {"ActivationStats", "GradPresence"} <= set(worst), sorted(worst)
    tolerance = {"ActivationStats": 1e-6}  # (float32 reductions in one process)
    assert all(error <= tolerance.get(name, 1e-12) for name, error in worst.items() if "counts" not in name), worst
