"""Integrations with other tools; each imports its package lazily (optional extras).

- ``sinks.Sink``: the interface of ``Cockpit(..., sinks=[...])``: objects that receive
  every recorded part of a step.
- ``tensorboard.TensorBoardSink``: scalars and histograms through
  ``torch.utils.tensorboard.SummaryWriter`` (extra ``tensorboard``).
- ``lightning.CockpitCallback``: a PyTorch Lightning callback (extra ``lightning``).
- ``huggingface.CockpitTrainer`` / ``CockpitTrainerMixin``: the Hugging Face ``Trainer``
  (extra ``hf``).
"""


def require(module, extra):
    """Import ``module``; if it is missing, raise ImportError naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{module} is not installed; this integration needs it: in a clone of cockpit-lite, "
            f"pip install \".[{extra}]\" (or pip install {module})"
        ) from error
