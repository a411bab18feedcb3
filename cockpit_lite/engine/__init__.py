"""The per-sample engine: exact individual-gradient statistics on any model, without BackPACK.

Its rooms: ``engine`` (``Engine``: arming, planning, the backward pass's hooks, finishing;
its module docstring tells how a step runs), ``step`` (what one step collects), ``capture``
(the forward pass's calls), ``routes`` (which rule serves each use of a parameter),
``rules`` (the layer rules), ``broadcast`` (tensors shared by the samples), ``global_path``
(batched vector-Jacobian products), ``check`` (the individual gradients' sum against
autograd's) and ``window`` (deferred steps: DDP, accumulation).
"""

from cockpit_lite.engine.check import GRAD_CHECK_RTOL
from cockpit_lite.engine.engine import Engine

__all__ = ["Engine", "GRAD_CHECK_RTOL"]
