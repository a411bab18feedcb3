"""Integrations with other tools; each imports its package lazily (optional extras).

- ``sinks.Sink``: the interface of ``Cockpit(..., sinks=[...])``: objects that receive
  every recorded part of a step.
- ``tensorboard.TensorBoardSink``: scalars and histograms through
  ``torch.utils.tensorboard.SummaryWriter`` (extra ``tensorboard``).
- ``lightning.CockpitCallback``: a PyTorch Lightning callback (extra ``lightning``).
- ``huggingface.CockpitTrainer`` / ``CockpitTrainerMixin``: the Hugging Face ``Trainer``
  (extra ``hf``).
"""

from cockpit_lite.integrations.requirements import require  # noqa: F401 (the integrations import it from here)

