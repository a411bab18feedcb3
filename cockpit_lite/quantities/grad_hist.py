"""Base class of the gradient histograms."""

from cockpit_lite import subsample
from cockpit_lite.quantities.base import Needs, Output, SingleStepQuantity


class GradHistogram(SingleStepQuantity):
    """A histogram accumulated over all tracked parameters, optionally kept per layer.

    Subclasses set ``TRANSFORM`` (a ``cockpit_lite.engine.transforms`` histogram class
    taking ``bins, range``), ``_edges()`` and ``_axes(range)`` / ``_with_axis(range,
    axis, limits)`` (how the range splits into the axes that ``adapt`` policies move).

    ``adapt``: one ``cockpit_lite.quantities.bin_adaptation`` policy per axis (or
    ``None`` for a fixed axis), on its own schedule; at a step where one is due, the
    histogram (if due) uses the current range and the new limits apply afterwards.
    The current (adapted) range is the saved state (``STATE``).

    Subsampled (``k`` of ``B`` samples, ``cockpit_lite.subsample``): the counts of the
    subsample's ``k · P`` elements times ``B/k`` (float64), an unbiased estimate of the
    counts of the batch's ``B · P``; the ``meta`` says ``samples`` and has no standard
    error per bin.
    """

    TIER = 1  # (overhead budget: per-sample)

    SCALED_BACKWARD = True

    SUBSAMPLE = True
    TRANSFORM = None
    STATE = ("range",)

    def __init__(self, track_schedule=None, verbose=False, bins=None, range=None, per_layer=False, adapt=()):
        super().__init__(track_schedule, verbose)
        self._transform = self.TRANSFORM(bins, range)
        self.bins, self.range = self._transform.bins, self._transform.range
        self.per_layer = per_layer
        self._adapt = [(axis, policy) for axis, policy in enumerate(adapt) if policy is not None]

    def load_state_dict(self, state):
        """Restore the saved range (the histogram then counts in it)."""
        super().load_state_dict(state)
        self._transform = self.TRANSFORM(self.bins, self.range)
        self.range = self._transform.range

    def _adapting(self, step):
        return [(axis, policy) for axis, policy in self._adapt if policy.is_due(step)]

    def needs(self, step, info):
        adapting = self._adapting(step)
        if not adapting:
            return super().needs(step, info)
        transforms = (self._transform,) if self.is_due(step) else ()
        for _, policy in adapting:
            transforms += policy.transforms()
        return Needs(transforms=transforms)

    def _needs(self, step, info):
        return Needs(transforms=(self._transform,))

    def observes(self, step):
        return self.is_due(step) or any(policy.transforms() for _, policy in self._adapting(step))

    def compute(self, step, data):
        out = self._histogram(data) if self.is_due(step) else None
        adapting = self._adapting(step)
        if adapting:
            new_range = self.range
            for axis, policy in adapting:
                current = self._axes(self.range)[axis]
                new_range = self._with_axis(new_range, axis, policy.limits(step, data, current))
            self._transform = self.TRANSFORM(self.bins, new_range)
            self.range = self._transform.range
        return out

    def _histogram(self, data):
        parts = data.per_sample(self._transform.key)
        edge_arrays = self._edges()

        scale = None if data.subset is None else data.batch_size / data.samples

        def as_value(counts, clipped, nonfinite):
            if scale is not None:  # the subsample's counts, scaled to the batch
                counts, clipped, nonfinite = (c.double() * scale for c in (counts, clipped, nonfinite))
            return {"hist": counts, "edges": edge_arrays, "clipped": clipped, "nonfinite": nonfinite}

        total = as_value(*(sum(part[i] for part in parts) for i in range(3)))
        layers = [as_value(*part) for part in parts] if self.per_layer else None
        meta = None if scale is None else subsample.meta(data.samples, data.batch_size, None)
        return Output(total, layers, meta=meta)
