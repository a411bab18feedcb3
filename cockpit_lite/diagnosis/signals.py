"""What the diagnosis collects by default (``SIGNALS``) and when (``schedule``): the signals the
``Cockpit`` adds for the rules, and their constructor arguments."""

SIGNALS = (
    "Loss", "GradNorm", "ParamNorm", "UpdateSize", "ActivationStats", "NonfiniteOrigin", "GradPresence",
    "InputStats",
)
"""Quantity class names (``cockpit_lite.quantities.REGISTRY``) the diagnosis collects by default."""

DENSE_STEPS = 10
"""The sparse signals are recorded at every one of the first ``DENSE_STEPS`` steps ..."""
EVERY = 10
"""... and then at every ``EVERY``-th step (``UpdateSize`` also looks at the step after)."""


def schedule(step):
    """The default schedule of the diagnosis signals: the first ``DENSE_STEPS`` steps, then every ``EVERY``-th.

    The rules count *records* (a streak of 3 records, 10 records before judging the
    learning rate), so a problem present from the start is found within the dense
    steps; one that appears later within a few ``EVERY`` steps. ``NonfiniteOrigin`` is
    not on it: it looks at every step's loss (and records only a non-finite one).
    """
    return step < DENSE_STEPS or step % EVERY == 0


SPARSE = ("Loss", "GradNorm", "ParamNorm", "UpdateSize", "ActivationStats", "GradPresence", "InputStats")
"""The signals the Cockpit tracks on ``schedule`` (the others at every step)."""

SIGNAL_OPTIONS = {name: {"track_schedule": schedule} for name in SPARSE}
SIGNAL_OPTIONS["Loss"]["required"] = False
"""Constructor arguments of the signals the Cockpit adds (``schedule``; a step without info['loss'] still runs)."""
