"""Every quantity cockpit-lite can track (Cockpit's class names and output layout).

One class per file; ``REGISTRY`` maps each name to its class.
"""

from cockpit_lite.quantities.activation_stats import ActivationStats
from cockpit_lite.quantities.alpha import Alpha
from cockpit_lite.quantities.base import Needs, Output, Quantity, SingleStepQuantity
from cockpit_lite.quantities.cabs import CABS
from cockpit_lite.quantities.distance import Distance
from cockpit_lite.quantities.early_stopping import EarlyStopping
from cockpit_lite.quantities.grad_hist_1d import GradHist1d
from cockpit_lite.quantities.grad_hist_2d import GradHist2d
from cockpit_lite.quantities.grad_norm import GradNorm
from cockpit_lite.quantities.grad_presence import GradPresence
from cockpit_lite.quantities.grad_variance import GradVariance
from cockpit_lite.quantities.hess_max_ev import HessMaxEV
from cockpit_lite.quantities.hess_trace import HessTrace
from cockpit_lite.quantities.inner_test import InnerTest
from cockpit_lite.quantities.input_stats import InputStats
from cockpit_lite.quantities.loss import Loss
from cockpit_lite.quantities.mean_gsnr import MeanGSNR
from cockpit_lite.quantities.nonfinite_origin import NonfiniteOrigin
from cockpit_lite.quantities.norm_test import NormTest
from cockpit_lite.quantities.ortho_test import OrthoTest
from cockpit_lite.quantities.param_norm import ParamNorm
from cockpit_lite.quantities.parameters import Parameters
from cockpit_lite.quantities.tic_diag import TICDiag
from cockpit_lite.quantities.tic_trace import TICTrace
from cockpit_lite.quantities.time import Time
from cockpit_lite.quantities.update_size import UpdateSize

REGISTRY = {
    cls.__name__: cls
    for cls in (
        Alpha, CABS, Distance, EarlyStopping, GradHist1d, GradHist2d, GradNorm,
        GradVariance, HessMaxEV, HessTrace, InnerTest, Loss, MeanGSNR, NormTest,
        OrthoTest, Parameters, TICDiag, TICTrace, Time, UpdateSize,
        ActivationStats, GradPresence, InputStats, NonfiniteOrigin, ParamNorm,  # diagnosis signals
    )
}

__all__ = sorted(REGISTRY) + ["Needs", "Output", "Quantity", "SingleStepQuantity", "REGISTRY"]
