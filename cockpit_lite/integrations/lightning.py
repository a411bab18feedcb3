"""``CockpitCallback``: track a ``LightningModule``'s training with ``Trainer(callbacks=[...])``.

    from cockpit_lite.integrations.lightning import CockpitCallback
    trainer = lightning.Trainer(max_epochs=3, callbacks=[CockpitCallback()])
    trainer.fit(module, loader)

Needs ``lightning`` (``pip install ".[lightning]" in a clone of cockpit-lite``). How it hooks in:

- ``on_before_backward`` enters the Cockpit's step context (``cp(step, info={"loss",
  "optimizer"})``) and ``on_after_backward`` leaves it, so the Cockpit sees exactly the
  backward pass Lightning runs (automatic optimization, or ``self.manual_backward``).
- The step is ``trainer.global_step``, the number of optimizer steps so far. With
  ``accumulate_grad_batches=k > 1`` (automatic optimization) the Cockpit accumulates
  (``Cockpit(accumulate=True)``, unless given otherwise): every micro-batch's backward pass
  is tracked and every quantity describes the effective batch of all ``k`` micro-batches
  the optimizer steps with (``batch.passes`` is ``k`` in the record); the step completes
  inside ``optimizer.step(closure)``, after the last micro-batch's backward pass.
- Lightning backpropagates ``loss / k`` under accumulation: the quantities describe the
  objective the optimizer minimises, the sum of those, so ``Loss`` is the mean over the
  ``k`` micro-batches. The individual losses are derived from the loss ``training_step``
  returned.
- Gradient clipping configured in the ``Trainer`` runs after ``on_after_backward``: the
  quantities describe the unclipped gradients; ``Alpha`` reads the update the optimizer
  made (its step post-hook) and is exact under plain SGD, and under momentum or Adam when
  the run clips from its first tracked steps (``Alpha``'s probe steps keep the individual
  gradients until the optimizer's step); clipping that starts later makes its first step
  NaN with a flag, the later ones exact.
- ``strategy="ddp"``: Lightning wraps the module in ``DistributedDataParallel``, and the
  Cockpit gets that wrapper (the statistics of the global batch; rank 0 keeps the record).
- The scalar quantities go to every logger of the trainer (``logger.log_metrics``,
  tags ``cockpit/<name>``; per-parameter values with ``log_layers=True``); a
  JSON-lines log ``cockpit.jsonl`` and one dashboard per epoch,
  ``cockpit__primary__epoch_<n>.png``, go to ``dirpath`` (default
  ``<trainer.log_dir or default_root_dir>/cockpit``).
- Quantities that need Hessian-vector products (``HessMaxEV``, Hutchinson's estimator)
  take them from the loss ``on_before_backward`` receives, before Lightning's backward
  pass, which stays plain: no override of ``LightningModule.backward`` is needed.
- ``CockpitCallback(samples=k)`` (keyword arguments go to the ``Cockpit``): the batch size
  the subsample is drawn from comes from the loss's graph (the Cockpit sees no forward call
  of the module itself) where its loss function has one row per sample
  (``info.batch_size_from_graph``), else the step is exact with a warning; refused under
  accumulation.
- Checkpoints carry the Cockpit: ``state_dict`` (Lightning's ``Callback.state_dict``,
  saved in the checkpoint's ``"callbacks"``) is ``{"cockpit": Cockpit.state_dict()}``,
  plain tensors and Python values; ``trainer.fit(module, ckpt_path=...)`` restores it into
  the new Cockpit when fitting starts, so the resumed run records what the uninterrupted
  one would have and continues its run in the log (``cockpit.jsonl`` under ``dirpath``;
  pass the first run's ``dirpath`` to keep one file, a new ``log_dir`` starts another
  file that still names the run).
"""

import os

import torch

from cockpit_lite.info import batch_size_from_graph, contributions_from_graph
from cockpit_lite.integrations import require
from cockpit_lite.integrations.sinks import Sink, scalars

_pl = require("lightning.pytorch", "lightning")


class _LoggerSink(Sink):
    """Send the scalars of each recorded step to the trainer's loggers."""

    def __init__(self, trainer, layers):
        self.trainer = trainer
        self.layers = layers

    def write(self, step, entries, names):
        metrics = {f"cockpit/{tag}": value for tag, value in scalars(entries, names) if self.layers or "/" not in tag}
        if metrics:
            for logger in self.trainer.loggers:
                logger.log_metrics(metrics, step=step)


class CockpitCallback(_pl.Callback):
    """Collect cockpit quantities during ``Trainer.fit``.

    Args:
        quantities: list of quantities; default ``configuration("economy")``.
        dirpath: folder of the JSON-lines log and the dashboards (see module docs).
        dashboards: draw a dashboard at the end of every training epoch.
        log_layers: also send the per-parameter values to the loggers.
        sinks: more sinks (e.g. ``TensorBoardSink``), passed to the Cockpit.
        **cockpit_kwargs: passed to ``Cockpit`` (``strict``, ``seed``).

    After ``fit``, ``callback.cockpit`` is the ``Cockpit`` (its record in
    ``callback.cockpit.get_output()``) and ``callback.dashboard_paths`` the saved files.
    """

    def __init__(self, quantities=None, dirpath=None, dashboards=True, log_layers=False, sinks=(), **cockpit_kwargs):
        self._quantities = quantities
        self.dirpath = dirpath
        self.dashboards = dashboards
        self.log_layers = log_layers
        self._sinks = list(sinks)
        self._cockpit_kwargs = cockpit_kwargs
        self.cockpit = None
        self.dashboard_paths = []
        self._context = None
        self._batch_idx = 0
        self._returned_loss = None
        self._resume = None  # a checkpoint's Cockpit state, loaded once the Cockpit exists

    def create_graph(self, global_step):
        """``False``: the backward pass never needs to keep its graph (see ``Cockpit.create_graph``)."""
        return False

    def on_fit_start(self, trainer, pl_module):
        from cockpit_lite import Cockpit, configuration

        if type(trainer.strategy).__name__ == "FSDPStrategy":  # (its wrapper is outside the module the Cockpit gets)
            raise ValueError(
                "Lightning's FSDPStrategy shards the model with FSDP1 (FullyShardedDataParallel), whose flattened "
                "parameters cockpit-lite cannot map to the layers. Fix: strategy=ModelParallelStrategy("
                "data_parallel_size=N, tensor_parallel_size=1) and fully_shard each layer, then the model, in the "
                "LightningModule's configure_model (FSDP2; the Cockpit then describes the global batch)"
            )
        if self.dirpath is None:
            self.dirpath = os.path.join(trainer.log_dir or trainer.default_root_dir, "cockpit")
        quantities = configuration("economy") if self._quantities is None else self._quantities
        kwargs = dict(self._cockpit_kwargs)
        kwargs.setdefault("accumulate", pl_module.automatic_optimization and trainer.accumulate_grad_batches > 1)
        wrapped = getattr(trainer.strategy, "model", None)  # DDPStrategy: the module DistributedDataParallel wraps
        ddp = isinstance(wrapped, torch.nn.parallel.DistributedDataParallel) and wrapped.module is pl_module
        self.cockpit = Cockpit(
            wrapped if ddp else pl_module, quantities, log=os.path.join(self.dirpath, "cockpit.jsonl"),
            sinks=[_LoggerSink(trainer, self.log_layers), *self._sinks], **kwargs,
        )
        training_step = pl_module.training_step

        def remembering_training_step(*args, **kwargs):
            output = training_step(*args, **kwargs)
            self._returned_loss = output.get("loss") if isinstance(output, dict) else output
            return output

        pl_module.training_step = remembering_training_step  # removed again in teardown
        if self._resume is not None:
            state, self._resume = self._resume, None
            self.cockpit.load_state_dict(state)

    def state_dict(self):
        """``{"cockpit": the Cockpit's state_dict()}`` (empty before fitting started)."""
        return {"cockpit": self.cockpit.state_dict()} if self.cockpit is not None else {}

    def load_state_dict(self, state_dict):
        """Load a checkpoint's Cockpit state, or keep it for the Cockpit ``on_fit_start`` creates (Lightning
        restores callbacks before that, unless the strategy restores after its setup)."""
        if "cockpit" not in state_dict:
            return
        if self.cockpit is not None:
            self.cockpit.load_state_dict(state_dict["cockpit"])
        else:
            self._resume = state_dict["cockpit"]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._batch_idx = batch_idx

    def _steps_after_this_backward(self, trainer):
        """Whether the optimizer steps after this backward pass (the last of an accumulation window:
        the one tracked when the Cockpit does not accumulate)."""
        if not trainer.lightning_module.automatic_optimization:  # manual_backward: every call is a step
            return True
        k = trainer.accumulate_grad_batches
        last = trainer.num_training_batches
        return (self._batch_idx + 1) % k == 0 or (self._batch_idx + 1) == last

    def on_before_backward(self, trainer, pl_module, loss):
        if self.cockpit is None or not (self.cockpit.accumulate or self._steps_after_this_backward(trainer)):
            return
        info = {"loss": loss, "optimizer": list(trainer.optimizers) or None}  # (several: stepped together)
        returned, self._returned_loss = self._returned_loss, None
        if torch.is_tensor(returned) and returned.grad_fn is not None and returned is not loss:
            try:  # the loss Lightning scaled (loss / k) is no longer a loss function's node
                contributions = contributions_from_graph(returned, keep_graph=True)  # with graph: the global path may need it
                info["individual_losses"] = contributions * (contributions.shape[0] * (loss / returned).detach())
            except ValueError:
                pass  # a loss of its own kind: quantities that need individual losses say so
        if self.cockpit.samples is not None or (self.cockpit.group is not None and self.cockpit.group.sharded):
            # the subsample is drawn before the backward pass, a sharded model's layers are served by their
            # rules with the batch size known then, and the Cockpit sees no forward call of the module
            # itself (training_step calls its layers)
            size = batch_size_from_graph(loss)
            if size is not None:  # else the Cockpit warns that the step is exact
                info["batch_size"] = size
        self._context = self.cockpit(trainer.global_step, info=info)
        self._context.__enter__()

    def on_after_backward(self, trainer, pl_module):
        context, self._context = self._context, None
        if context is not None:
            context.__exit__(None, None, None)

    def on_exception(self, trainer, pl_module, exception):
        context, self._context = self._context, None
        if context is not None:
            context.__exit__(type(exception), exception, exception.__traceback__)
        self._close()

    def on_train_epoch_end(self, trainer, pl_module):
        if not self.dashboards or self.cockpit is None or not self.cockpit.get_output():
            return
        if trainer.is_global_zero:
            from instruments import CockpitPlotter

            path = CockpitPlotter().plot(
                self.cockpit, show_plot=False, save_plot=True, savedir=self.dirpath,
                savename_append=f"epoch_{trainer.current_epoch:03d}",
            )
            self.dashboard_paths.append(path)

    def on_fit_end(self, trainer, pl_module):
        self._close()

    def teardown(self, trainer, pl_module, stage):
        vars(pl_module).pop("training_step", None)

    def _close(self):
        if self.cockpit is not None:
            self.cockpit.close()
