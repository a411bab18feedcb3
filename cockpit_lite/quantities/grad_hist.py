"""Base class of the gradient histograms."""

from cockpit_lite.quantities.base import Needs, Output, SingleStepQuantity


class GradHistogram(SingleStepQuantity):
    """A histogram accumulated over all tracked parameters, optionally kept per layer.

    Subclasses set ``TRANSFORM`` (a ``cockpit_lite.transforms`` histogram class
    taking ``bins, range``) and ``_edges()``.
    """

    TRANSFORM = None

    def __init__(self, track_schedule=None, verbose=False, bins=None, range=None, per_layer=False):
        super().__init__(track_schedule, verbose)
        self._transform = self.TRANSFORM(bins, range)
        self.bins, self.range = self._transform.bins, self._transform.range
        self.per_layer = per_layer

    def _needs(self, step, info):
        return Needs(transforms=(self._transform,))

    def observes(self, step):
        return self.is_due(step)

    def compute(self, step, data):
        parts = data.per_sample(self._transform.key)
        edge_arrays = self._edges()

        def as_value(counts, clipped, nonfinite):
            return {"hist": counts, "edges": edge_arrays, "clipped": clipped, "nonfinite": nonfinite}

        total = as_value(*(sum(part[i] for part in parts) for i in range(3)))
        layers = [as_value(*part) for part in parts] if self.per_layer else None
        return Output(total, layers)
