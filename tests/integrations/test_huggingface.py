"""CockpitTrainer with the real transformers Trainer on a tiny GPT-2 (random weights, nothing downloaded).

GPT-2 uses its own ``Conv1D`` layer (transposed weights) and ties the output head to the
token embedding; its first-order quantities are checked against a brute-force float64
reference: one forward pass, a loop of ``torch.autograd.grad`` over each sequence's
term of the loss the Trainer backpropagates.
"""

import functools
import os

import pytest
import torch

from cockpit_lite import quantities

B, T, VOCAB = 4, 8, 97
REASON = "the hf extra is not installed (pip install '.[hf]' in a clone of cockpit-lite)"


@functools.cache
def _hf():
    """transformers, the Trainer subclass and the recording test Trainer, imported on first use:
    the Trainer's imports take seconds, which at collection would cost every parallel test worker."""
    transformers = pytest.importorskip("transformers", reason=REASON)
    pytest.importorskip("accelerate", reason=REASON)
    from cockpit_lite.integrations.huggingface import CockpitTrainer

    class _Recording(CockpitTrainer):
        """Keeps each tracked step's parameters and batch for the reference."""

        seen = None

        def training_step(self, model, inputs, num_items_in_batch=None):
            self.seen = self.seen or {}
            self.seen[self.state.global_step] = ([p.detach().clone() for p in model.parameters()],
                                                 inputs["input_ids"].clone(), num_items_in_batch)
            return super().training_step(model, inputs, num_items_in_batch)

    return transformers, CockpitTrainer, _Recording


def _model():
    transformers, _, _ = _hf()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).double()


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, VOCAB, (n, T), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _args(tmp_path, **kwargs):
    transformers, _, _ = _hf()
    return transformers.TrainingArguments(**{
        "output_dir": str(tmp_path), "per_device_train_batch_size": B, "num_train_epochs": 1, "learning_rate": 1e-2,
        "lr_scheduler_type": "constant", "report_to": "none", "save_strategy": "no", "use_cpu": True,
        "disable_tqdm": True, "logging_strategy": "no", "dataloader_num_workers": 0, "seed": 0, **kwargs,
    })


def _reference(params, ids, num_items):
    """Per-sequence individual gradients g̃_n = B ∇c_n, c_n = sequence n's summed token losses / num_items."""
    model = _model()
    with torch.no_grad():
        for p, value in zip(model.parameters(), params):
            p.copy_(value)
    logits = model(input_ids=ids).logits
    token_losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="none").reshape(B, T - 1)
    contributions = token_losses.sum(1) / num_items
    rows = [torch.autograd.grad(contributions[n], list(model.parameters()), retain_graph=True) for n in range(B)]
    return [B * torch.stack([r[i] for r in rows]) for i in range(len(params))]


def test_gpt2_first_order_quantities_match_brute_force(tmp_path):
    transformers, CockpitTrainer, _Recording = _hf()
    trainer = _Recording(
        model=_model(), args=_args(tmp_path, max_steps=3), train_dataset=_Tokens(3 * B),
        cockpit_quantities=[quantities.NormTest(), quantities.GradVariance(), quantities.GradNorm()],
    )
    trainer.train()
    record = trainer.cockpit.get_output()
    assert sorted(record) == [0, 1, 2]
    assert len(trainer.cockpit.names) == len(list(trainer.model.parameters()))  # the tied head is one tensor
    for step, (params, ids, num_items) in trainer.seen.items():
        assert int(num_items) == B * T  # the Trainer counts every label; the shifted loss has B·(T−1) terms
        individual = _reference(params, ids, num_items)
        flat = torch.cat([g.reshape(B, -1) for g in individual], 1)
        g = flat.mean(0)
        norm_test = torch.sqrt(((flat - g) ** 2).sum() / ((B - 1) * B * (g**2).sum()))
        variance = [i.reshape(B, -1).var(0, unbiased=True).sum().item() for i in individual]
        assert record[step]["NormTest"] == pytest.approx(norm_test.item(), rel=1e-6)
        assert record[step]["GradVariance"] == pytest.approx(variance, rel=1e-6)  # the suite's tolerance (tests/problems.py); LayerNorm biases reach 1.5e-8
        assert record[step]["GradNorm"] == pytest.approx([i.mean(0).norm().item() for i in individual], rel=1e-6)
    assert [os.path.basename(p) for p in trainer.dashboard_paths] == ["cockpit__primary__epoch_000.png"]


def test_a_subsample_is_the_documented_estimator_on_the_brute_force(tmp_path):
    """``cockpit_kwargs={"samples": 2}``: each step's NormTest and its standard error from the two
    drawn sequences, as ``cockpit_lite.subsample`` documents, on the brute force."""
    from cockpit_lite import subsample
    from test_subsample import references

    transformers, CockpitTrainer, _Recording = _hf()
    trainer = _Recording(model=_model(), args=_args(tmp_path, max_steps=3), train_dataset=_Tokens(3 * B),
                         cockpit_quantities=[quantities.NormTest()], cockpit_kwargs={"samples": 2},
                         cockpit_dashboards=False)
    trainer.train()
    record = trainer.cockpit.get_output()
    assert sorted(record) == [0, 1, 2]
    for step, (params, ids, num_items) in trainer.seen.items():
        flat = torch.cat([g.reshape(B, -1) for g in _reference(params, ids, num_items)], 1)
        value, se = references(flat, subsample.draw(2, B, (0, step)).tolist())["NormTest"]
        assert record[step]["batch"]["samples"] == 2
        assert record[step]["NormTest"] == pytest.approx(value, rel=1e-6)
        assert record[step]["meta"]["NormTest"]["se"] == pytest.approx(se, rel=1e-6)


def test_accumulation_tracks_every_micro_batch_and_training_is_not_disturbed(tmp_path):
    transformers, CockpitTrainer, _Recording = _hf()
    tracked = CockpitTrainer(model=_model(), args=_args(tmp_path / "a", max_steps=2, gradient_accumulation_steps=2),
                             train_dataset=_Tokens(4 * B), cockpit_quantities=[quantities.NormTest()],
                             cockpit_dashboards=False)
    tracked.train()
    plain = transformers.Trainer(model=_model(), args=_args(tmp_path / "b", max_steps=2, gradient_accumulation_steps=2),
                                 train_dataset=_Tokens(4 * B))
    plain.train()
    record = tracked.cockpit.get_output()
    assert sorted(record) == [0, 1]
    assert all(record[s]["batch"] == {"size": 2 * B, "accumulated": False, "passes": 2} for s in record)
    for p, q in zip(tracked.model.parameters(), plain.model.parameters()):
        assert torch.equal(p, q)


def test_a_run_resumed_from_a_checkpoint_records_what_the_uninterrupted_run_records(tmp_path):
    transformers, CockpitTrainer, _Recording = _hf()
    import json

    from cockpit_lite import log

    def train(output_dir, max_steps, resume=None, **kwargs):
        trainer = CockpitTrainer(model=_model(), args=_args(output_dir, max_steps=max_steps, **kwargs),
                                 train_dataset=_Tokens(4 * B), cockpit_dashboards=False)
        trainer.train(resume_from_checkpoint=resume)
        return trainer.cockpit

    whole = train(tmp_path / "whole", 4)
    train(tmp_path / "run", 2, save_strategy="steps", save_steps=2)  # stopped after optimizer step 2 of 4
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert "version" in torch.load(checkpoint / "cockpit_state.pt", weights_only=True)
    resumed = train(tmp_path / "run", 4, resume=str(checkpoint))

    def text(record, first=0):
        return json.dumps(log.to_jsonable({s: e for s, e in record.items() if s >= first}), sort_keys=True)

    assert text(resumed.get_output(), 1) == text(whole.get_output(), 1) and sorted(whole.get_output()) == [0, 1, 2, 3]
    assert text(log.read(tmp_path / "run" / "cockpit" / "cockpit.jsonl")) == text(whole.get_output())


def test_a_model_sharded_by_fully_shard_records_what_the_unsharded_model_records(tmp_path):
    """Accelerate shards with FSDP only on accelerators (its FSDP plugin sets no FSDP distributed type
    for CPU processes): what runs here is the Trainer on a GPT-2 whose blocks and root are
    ``fully_shard``-ed by hand, in one process: its record equals the unsharded model's."""
    import math

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    transformers, CockpitTrainer, _ = _hf()

    def train(shard):
        model = _model()
        if shard:
            for block in model.transformer.h:
                fully_shard(block)
            fully_shard(model)
        trainer = CockpitTrainer(model=model, args=_args(tmp_path / str(shard), max_steps=2),
                                 train_dataset=_Tokens(2 * B), cockpit_kwargs={"diagnose": False},
                                 cockpit_quantities=[quantities.NormTest(), quantities.GradVariance(),
                                                     quantities.GradNorm(), quantities.InnerTest()])
        trainer.train()
        return trainer.cockpit

    plain = train(False).get_output()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        cockpit = train(True)
        sharded = cockpit.get_output()
        assert cockpit.group is not None and cockpit.group.sharded
    finally:
        dist.destroy_process_group()
    assert sorted(sharded) == sorted(plain) == [0, 1]
    for step in plain:
        for name in ("NormTest", "GradVariance", "GradNorm", "InnerTest"):
            expected, got = plain[step][name], sharded[step][name]
            assert got == pytest.approx(expected, rel=1e-12) and not any(map(math.isnan, torch.tensor(got).reshape(-1).tolist()))


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_reentrant_names_the_fix_and_the_fix_works(reentrant):
    """``gradient_checkpointing_enable`` with ``use_reentrant=True``: the blocks' rules fail inside the
    user's backward pass; their flags name the fix (they quoted a bare "element 0 of tensors does not
    require grad"); with ``use_reentrant=False`` (transformers' default) every value is finite."""
    import warnings

    from cockpit_lite import Cockpit

    model = _model()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    cp = Cockpit(model, quantities=[quantities.NormTest()], diagnose=False)
    ids = torch.randint(0, VOCAB, (4, T), generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = model(input_ids=ids, labels=ids).loss
        with cp(0, info={"loss": loss}):
            loss.backward()
    entry = cp.get_output()[0]
    if reentrant:
        assert entry["flags"] and all("Fix: checkpoint with use_reentrant=False" in f for f in entry["flags"])
    else:
        assert not entry.get("flags") and all(v == v for v in entry["layers"]["NormTest"])


def _distributed_run(rank, world, port, path):
    """``CockpitTrainer`` for 3 steps of 8 sequences: on ``world`` processes (``torchrun``'s environment,
    gloo), each 8 / ``world`` of them, or in this process (``world`` 1). Rank 0's record goes to ``path``."""
    import pickle

    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                          LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
        torch.set_num_threads(1)
    _, CockpitTrainer, _ = _hf()
    args = _args(f"{path}.{rank}", max_steps=3, per_device_train_batch_size=8 // world,
                 **({"ddp_backend": "gloo"} if world > 1 else {}))
    trainer = CockpitTrainer(model=_model(), args=args, train_dataset=_Tokens(64), cockpit_quantities=[
        quantities.Loss(), quantities.GradNorm(), quantities.NormTest(), quantities.GradVariance()])
    assert (trainer.cockpit is None) == (world > 1)  # (several processes: created on the wrapped model)
    trainer.train()
    if rank == 0:
        with open(path, "wb") as file:
            pickle.dump(trainer.cockpit.get_output(), file)
    if world > 1:
        os._exit(0)  # gloo's threads sometimes abort in the interpreter's teardown


def test_ddp_under_torchrun_records_what_one_process_records(tmp_path):
    """Two processes (the Trainer wraps the model in DistributedDataParallel; accelerate gives each its part of
    every batch of the same order): the record equals one process's on the whole batch. Before, the Cockpit,
    built in ``__init__`` on the bare model under a process group, refused it."""
    import pickle
    import socket

    import numpy as np
    import torch.multiprocessing as mp
    from experiments.fsdp_equality import flatten

    _hf()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_distributed_run, args=(2, port, str(tmp_path / "ranks")), nprocs=2, join=True)
    _distributed_run(0, 1, None, str(tmp_path / "single"))
    records = []
    for name in ("ranks", "single"):
        with open(tmp_path / name, "rb") as file:
            records.append(pickle.load(file))
    ranks, single = records
    assert sorted(ranks) == sorted(single) == [0, 1, 2]
    for step in single:
        expected = dict(flatten({k: v for k, v in single[step].items() if k != "Time"}))
        got = dict(flatten({k: v for k, v in ranks[step].items() if k != "Time"}))
        assert sorted(got) == sorted(expected), (step, sorted(set(got) ^ set(expected)))
        for key, value in expected.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                # (the Trainer's loss: float32 on its way; the activations' statistics: one process reduces in float32)
                tight = "Loss" not in key and "ActivationStats" not in key
                np.testing.assert_allclose(got[key], value, rtol=1e-10 if tight else 1e-6, err_msg=f"{step} {key}")
            else:
                assert got[key] == value, (step, key)
