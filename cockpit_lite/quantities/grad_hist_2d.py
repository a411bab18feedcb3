"""``GradHist2d``: 2-d histogram of individual-gradient elements against parameter values."""

from cockpit_lite.histogram import edges
from cockpit_lite.quantities.grad_hist import GradHistogram
from cockpit_lite.engine.transforms import GradHistogram2d


class GradHist2d(GradHistogram):
    """2-d histogram of the pairs (individual-gradient element ``g̃_{n,d}``, parameter value ``θ_d``).

    ``bins=(40, 50)`` over ``range=((−1, 1), (−2, 2))`` by default; edge-bin and
    NaN rules as ``GradHist1d``. ``per_layer=True`` (Cockpit's name:
    ``keep_individual=True``) also records one per parameter tensor, in
    ``record[step]["layers"]["GradHist2d"]``. ``adapt=(policy for g̃, policy for θ)``,
    e.g. ``(GradAbsMax(schedule), ParamAbsMax(schedule))`` as in Cockpit.
    """

    TRANSFORM = GradHistogram2d

    def __init__(
        self, track_schedule=None, verbose=False, bins=(40, 50), range=((-1, 1), (-2, 2)), adapt=(None, None),
        keep_individual=False, per_layer=False,
    ):
        super().__init__(track_schedule, verbose, bins, range, per_layer or keep_individual, adapt=tuple(adapt))

    def _edges(self):
        return [edges(b, r) for b, r in zip(self.bins, self.range)]

    @staticmethod
    def _axes(range):
        return tuple(range)

    @staticmethod
    def _with_axis(range, axis, limits):
        return tuple(limits if i == axis else r for i, r in enumerate(range))
