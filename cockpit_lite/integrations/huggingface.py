"""Track a Hugging Face ``Trainer``: ``CockpitTrainer`` (or ``CockpitTrainerMixin`` for your own subclass).

    from cockpit_lite.integrations.huggingface import CockpitTrainer
    trainer = CockpitTrainer(model=model, args=args, train_dataset=data)   # Trainer's arguments
    trainer.train()
    trainer.cockpit.get_output()

Needs ``transformers`` and ``accelerate`` (``pip install ".[hf]" in a clone of cockpit-lite``).

Why a ``Trainer`` mixin and not a ``TrainerCallback``: a Cockpit step must be entered
after the forward pass and before ``loss.backward()`` (it plans the step from the
forward pass and must see the backward pass). ``TrainerCallback`` has no event there:
``on_step_begin`` comes before the forward pass, ``on_pre_optimizer_step`` and
``on_optimizer_step`` after the backward pass (and after clipping), and a callback
gets neither the loss nor the backward call. The mixin wraps the one call the
``Trainer`` makes, ``self.accelerator.backward(loss)`` inside ``training_step``, for
the duration of that step; everything else about training is the ``Trainer``'s own.

- The step is ``state.global_step`` (optimizer steps so far). With
  ``gradient_accumulation_steps=k > 1`` the Cockpit accumulates (``Cockpit(accumulate=True)``,
  unless ``cockpit_kwargs`` say otherwise): every micro-batch's backward pass is tracked and
  the quantities describe the effective batch of all ``k`` micro-batches the optimizer
  steps with (``batch.passes`` is ``k``), for the loss the ``Trainer`` backpropagates (for a
  causal LM with labels: the sum of token losses divided by the tokens of all ``k``
  micro-batches).
- ``max_grad_norm`` clipping runs after the backward pass: the quantities see the
  unclipped gradients.
- A dashboard per epoch (``cockpit__primary__epoch_<n>.png``) and a JSON-lines log
  ``cockpit.jsonl`` go to ``cockpit_dir`` (default ``<output_dir>/cockpit``); only the
  main process writes them.
- Several processes (``torchrun``, the ``Trainer``'s ``DistributedDataParallel``): the Cockpit
  is created at the first training step, on the wrapped model the ``Trainer`` trains
  (``trainer.cockpit`` is ``None`` before), and describes the global batch.
- ``Alpha`` needs each sample's loss: a causal LM's loss is a sum divided by the token
  count, which cannot be re-evaluated per sample from the graph; leave ``Alpha`` out
  or override ``compute_loss`` to return it (and use ``lr_scheduler_type="constant"``:
  a scheduler between two steps makes ``Alpha`` NaN, flagged).
- Checkpoints carry the Cockpit (``Cockpit.state_dict``): every checkpoint folder gets
  ``cockpit_state.pt`` (``cockpit_state_rank<i>.pt`` for process ``i > 0``) beside the
  optimizer's state, and ``trainer.train(resume_from_checkpoint=...)`` loads it with
  ``torch.load(weights_only=True)``, so the resumed run records what the uninterrupted
  one would have and continues its run in ``cockpit.jsonl``. (The ``Trainer``'s own
  callback state, ``TrainerState.stateful_callbacks``, is JSON in ``trainer_state.json``
  and rebuilds callbacks from constructor arguments: no place for θ₀ or other tensors.)
  A checkpoint without the file (saved without a Cockpit) starts a new run, with a warning.
"""

import os
import warnings

from cockpit_lite.integrations import require

_transformers = require("transformers", "hf")
require("accelerate", "hf")


class CockpitTrainerMixin:
    """Adds a ``Cockpit`` to a ``transformers.Trainer`` subclass (put it first in the bases).

    Keyword arguments (all others go to the ``Trainer``):
        cockpit_quantities: list of quantities (default ``configuration("economy")``
            without ``Alpha``, see the module docs).
        cockpit_dir: folder of the log and dashboards.
        cockpit_dashboards: draw a dashboard at the end of every epoch.
        cockpit_sinks: sinks passed to the Cockpit (e.g. ``TensorBoardSink``).
        cockpit_kwargs: dict passed to ``Cockpit`` (``strict``, ``seed``, ``samples``; ``samples`` is
            refused with ``gradient_accumulation_steps > 1``).
    """

    def __init__(self, *args, cockpit_quantities=None, cockpit_dir=None, cockpit_dashboards=True, cockpit_sinks=(),
                 cockpit_kwargs=None, **kwargs):
        super().__init__(*args, **kwargs)
        from cockpit_lite import Cockpit, configuration

        if cockpit_quantities is None:
            cockpit_quantities = [q for q in configuration("economy") if q.name != "Alpha"]
        self.cockpit_dir = cockpit_dir or os.path.join(self.args.output_dir, "cockpit")
        main = self.is_world_process_zero()
        cockpit_kwargs = dict(cockpit_kwargs or {})
        cockpit_kwargs.setdefault("accumulate", self.args.gradient_accumulation_steps > 1)
        self._new_cockpit = lambda model: Cockpit(
            model, cockpit_quantities, log=os.path.join(self.cockpit_dir, "cockpit.jsonl") if main else None,
            sinks=list(cockpit_sinks), **cockpit_kwargs,
        )
        self._cockpit_resume = None  # a checkpoint's Cockpit state, until the Cockpit exists
        # several processes: the Cockpit takes the DistributedDataParallel the Trainer wraps the model in once
        # training starts (``training_step``'s model); it is None until then
        self.cockpit = self._new_cockpit(self.model) if self.args.world_size == 1 else None
        self.dashboard_paths = []
        self.add_callback(_Dashboards(self, cockpit_dashboards and main))

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.cockpit is None:
            self.cockpit = self._new_cockpit(model)
            if self._cockpit_resume is not None:
                self.cockpit.load_state_dict(self._cockpit_resume)
                self._cockpit_resume = None
        if not (self.cockpit.accumulate or self.accelerator.sync_gradients):  # not tracked: an earlier micro-batch
            return super().training_step(model, inputs, num_items_in_batch)
        accelerator = self.accelerator
        backward = accelerator.backward
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's wrapper holds it
        step = self.state.global_step

        def tracked_backward(loss, **kwargs):
            with self.cockpit(step, info={"loss": loss, "optimizer": optimizer}):
                backward(loss, **kwargs)

        accelerator.backward = tracked_backward
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            del accelerator.backward  # the instance attribute; the class's method again

    def _cockpit_state_file(self, folder):
        index = self.args.process_index
        return os.path.join(folder, "cockpit_state.pt" if index == 0 else f"cockpit_state_rank{index}.pt")

    def _save_optimizer_and_scheduler(self, output_dir):
        super()._save_optimizer_and_scheduler(output_dir)
        import torch

        if self.cockpit is None:  # (no step trained yet)
            return
        os.makedirs(output_dir, exist_ok=True)
        torch.save(self.cockpit.state_dict(), self._cockpit_state_file(output_dir))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        import torch

        path = self._cockpit_state_file(checkpoint)
        if not os.path.exists(path):
            warnings.warn(f"cockpit-lite: {checkpoint} holds no Cockpit state ({os.path.basename(path)}): the "
                          "resumed run is tracked as a new run (Distance from the resumed parameters, the "
                          "diagnosis from scratch)", stacklevel=2)
            return
        state = torch.load(path, weights_only=True)
        if self.cockpit is None:
            self._cockpit_resume = state
        else:
            self.cockpit.load_state_dict(state)

    def _cockpit_dashboard(self, epoch):
        from instruments import CockpitPlotter

        if self.cockpit is not None and self.cockpit.get_output():
            path = CockpitPlotter().plot(self.cockpit, show_plot=False, save_plot=True, savedir=self.cockpit_dir,
                                         savename_append=f"epoch_{epoch:03d}")
            self.dashboard_paths.append(path)


class _Dashboards(_transformers.TrainerCallback):
    """Draws the dashboard at each epoch's end and closes the Cockpit when training ends."""

    def __init__(self, trainer, draw):
        self.trainer = trainer
        self.draw = draw

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.draw:
            self.trainer._cockpit_dashboard(round(state.epoch or 0) - 1)

    def on_train_end(self, args, state, control, **kwargs):
        if self.trainer.cockpit is not None:
            self.trainer.cockpit.close()


class CockpitTrainer(CockpitTrainerMixin, _transformers.Trainer):
    """``transformers.Trainer`` with a Cockpit (see ``CockpitTrainerMixin`` for the extra arguments)."""
