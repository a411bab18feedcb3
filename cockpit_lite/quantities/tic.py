"""Base class of the Takeuchi information criterion quantities (Thomas et al., 2020)."""

from cockpit_lite import intervals, subsample
from cockpit_lite.curvature import ggn
from cockpit_lite.quantities.curvature import AUTO, MAX_PASSES, CurvatureQuantity
from cockpit_lite.engine.transforms import SumGradSquared


class TIC(CurvatureQuantity):
    """The gradient's uncentred second moment ``(1/B) Σ_n g̃_n²`` against a curvature ``C``.

    Subclasses combine ``second_moments(data)`` with the curvature; ``epsilon``
    guards the division.

    ``C`` is an exact diagonal only (``EXACT_ONLY``): BackPACK's Hessian diagonal
    (``curvature="diag_h"``, what ``"auto"`` takes where BackPACK supports the model and
    the loss) or the exact GGN diagonal (``"diag_ggn_exact"``; what ``"auto"`` takes on the
    other models, the engine's, ``cockpit_lite.curvature.ggn``, when it takes at most
    ``max_passes`` backward passes). A ratio with an estimated denominator is not an
    estimate of the ratio: measured against the exact Hessian, TICs from Hutchinson's
    diagonal missed by 6.6-27 of their own jackknife standard errors on transformers,
    per-layer TICTrace by thousands, TICDiag came out negative (−2.1 against 213.6), and
    TICTrace was 2× off on a ReLU MLP. Where only an estimate could run (``"hutchinson"``,
    ``"diag_ggn_mc"``, or ``"auto"`` with neither exact diagonal) the value is NaN with a
    flag naming why and the fix; nothing is computed for it and no graph is kept.

    Subsampled (``k`` of ``B`` samples, ``cockpit_lite.subsample``): the curvature is the
    whole batch's, exact, so every value is a population mean ``(1/B) Σ_n x_n`` of per-sample
    terms over an exact denominator; ``(1/k) Σ_{n∈S} x_n`` estimates it without bias, with the
    standard error of ``subsample.total`` (its interval on the log scale with a GGN diagonal, whose
    terms are nonnegative; a Hessian diagonal can be negative). Subclasses give the terms
    (``sample_terms``).
    """

    SCALED_BACKWARD = True

    EXACT_ONLY = True
    SUBSAMPLE = True
    TRANSFORMS = (SumGradSquared,)

    def __init__(self, track_schedule=None, verbose=False, curvature=AUTO, epsilon=1e-7, max_passes=MAX_PASSES):
        """
        Args:
            curvature: one of ``CHOICES`` (only ``"auto"``, ``"diag_h"`` and
                ``"diag_ggn_exact"`` give values).
            epsilon: added to the curvature in the denominator.
            max_passes: the most backward passes of the engine's exact GGN diagonal that
                ``curvature="auto"`` takes per step where BackPACK cannot serve the model.
        """
        super().__init__(track_schedule, verbose, curvature, max_passes=max_passes)
        self.epsilon = epsilon

    @staticmethod
    def second_moments(data):
        """Per parameter ``(1/B) Σ_n g̃_n²`` elementwise."""
        return [sgs / data.batch_size for sgs in data.per_sample(SumGradSquared.key)]

    def compute(self, step, data):
        if data.subset is None or self._method is None:
            return super().compute(step, data)
        method = self._method
        diagonal = data.curvature(method)
        terms, denominators = self.sample_terms(data, diagonal)
        t, se = subsample.total(terms, data.batch_size)
        scale = 1 / (data.batch_size * denominators)
        # a GGN diagonal is nonnegative, so are the terms: their total's interval on the log scale
        nonnegative = isinstance(method, ggn.Request) or method == "diag_ggn_exact"
        out = subsample.output(t * scale, se * scale.abs(), data.samples, data.batch_size,
                               scale=intervals.LOG if nonnegative else None)
        if isinstance(method, ggn.Request):
            found = data.diagonal(method)
            out.meta.update(curvature=method.method, passes=found.passes)
            out.flags.extend(found.flags)
        else:
            out.meta["curvature"] = method
        return out

    def sample_terms(self, data, diagonal):
        """``(x [k, 1 + L], D [1 + L])`` at a subsampled step: the drawn samples' terms, whose
        mean over the batch divided by the exact ``D`` is the value (the whole network's
        column first, then one per parameter)."""
        raise NotImplementedError
