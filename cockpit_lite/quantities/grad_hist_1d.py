"""``GradHist1d``: histogram of the individual-gradient elements."""

from cockpit_lite.histogram import edges
from cockpit_lite.quantities.grad_hist import GradHistogram
from cockpit_lite.engine.transforms import GradHistogram1d


class GradHist1d(GradHistogram):
    """Histogram of all individual-gradient elements ``g̃_{n,d}`` (every sample, every parameter).

    ``bins`` equal bins over ``range`` (default 100 over (−2, 2)); values outside the
    range are counted in the edge bins and reported in ``"clipped"``, NaN/Inf are
    left out and reported in ``"nonfinite"`` (see ``cockpit_lite.histogram``).
    ``per_layer=True`` also records one histogram per parameter tensor. With the
    default (even) number of bins, 0 is an edge and exact zeros (common: inactive
    ReLU units, zero inputs) land in the bin just right of it; an odd number of bins
    centres a bin on 0. Values are on the scale of the individual gradients, so one
    range may suit some layers poorly: ``per_layer`` with a narrower range shows the
    small ones. ``adapt``: a bin adaptation policy (``bin_adaptation.GradAbsMax``, as
    in Cockpit) that moves the range on its own schedule.
    """

    TRANSFORM = GradHistogram1d

    def __init__(self, track_schedule=None, verbose=False, bins=100, range=(-2, 2), adapt=None, per_layer=False):
        super().__init__(track_schedule, verbose, bins, range, per_layer, adapt=(adapt,))

    def _edges(self):
        return edges(self.bins, self.range)

    @staticmethod
    def _axes(range):
        return (range,)

    @staticmethod
    def _with_axis(range, axis, limits):
        return limits
