"""Lightning with ``accumulate_grad_batches=2`` (the README's example): healthy accumulation raises no
``missing_zero_grad`` (nor any warning); the Cockpit measures every optimizer step's two micro-batches."""

import functools
import logging

import pytest
import torch
from torch import nn


logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)
logging.getLogger("lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


@functools.cache
def _lightning():
    """Lightning, the callback and the test module, imported on first use: importing Lightning
    takes ~10 s, which at collection would cost every parallel test worker."""
    pl = pytest.importorskip("lightning.pytorch", reason="the lightning extra is not installed")
    from cockpit_lite.integrations.lightning import CockpitCallback

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return pl, CockpitCallback, Module


def test_lightning_accumulation_is_not_a_missing_zero_grad(tmp_path):
    pl, CockpitCallback, Module = _lightning()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8 * 24, 5, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    callback = CockpitCallback(dashboards=False)
    trainer = pl.Trainer(max_epochs=2, accumulate_grad_batches=2, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, callbacks=[callback])
    trainer.fit(Module(), loader)
    kinds = [f.kind for f in callback.cockpit.findings]
    assert "missing_zero_grad" not in kinds, callback.cockpit.findings
    assert not [f for f in callback.cockpit.findings if f.severity in ("warning", "error")], callback.cockpit.findings
    presence = [e["GradPresence"] for e in callback.cockpit.get_output().values() if "GradPresence" in e]
    # every micro-batch tracked (the callback accumulates): each step starts from zeroed gradients
    assert presence and all(p["before"] == 0 and p["first_backward"] == 0 for p in presence[1:])
    assert all(e["batch"]["passes"] == 2 for e in callback.cockpit.get_output().values() if "batch" in e)
