"""Which modules are activation functions, and of which family, from their class name.

Libraries bring their own activation classes: Hugging Face's ``GELUActivation``,
``NewGELUActivation``, ``ReLUSquaredActivation``; timm's ``GELU``, ``Sigmoid``, ``Tanh``,
``HardSwishMe``; minGPT's ``NewGELU``. None of them subclasses ``torch.nn``'s, so
``isinstance`` misses them, and a model built from them had no activation statistics.
Their names say what they compute; ``family(name)`` reads it, the first match in ``NAMES``
deciding (``"gelu"`` before ``"tanh"``: ``PytorchGELUTanh`` is a GELU; ``"relu6"`` before
``"relu"``; ``"log"`` first: ``LogSigmoid`` is not a sigmoid's range).

Pure Python: the diagnosis reads the families of the recorded class names with it.
"""

from typing import NamedTuple, Optional


class Family(NamedTuple):
    """``kind``: the statistic beyond mean and std that applies (``"relu"``: dead units;
    ``"tanh"``/``"sigmoid"``: saturated entries; ``None``: neither); ``unbounded``: whether the
    output grows with the input (the diagnosis reads the forward gain on these)."""

    kind: Optional[str]
    unbounded: bool


NAMES = (
    ("log", None),  # LogSigmoid, LogSoftmax
    ("gelu", Family(None, True)), ("silu", Family(None, True)), ("swish", Family(None, True)),
    ("mish", Family(None, True)), ("softplus", Family(None, True)), ("leaky", Family(None, True)),
    ("prelu", Family(None, True)), ("rrelu", Family(None, True)), ("selu", Family(None, True)),
    ("celu", Family(None, True)),
    ("relu6", Family("relu", False)), ("relu", Family("relu", True)), ("elu", Family(None, True)),
    ("hardtanh", Family("tanh", False)), ("tanh", Family("tanh", False)), ("softsign", Family("tanh", False)),
    ("sigmoid", Family("sigmoid", False)),
)
"""``(part of the lower-cased class name, family or None)``: the first part found decides."""


OTHER = ("loss", "gate", "glu", "attn", "attention", "norm", "pool", "conv", "linear", "block", "head", "embed")
"""Parts of a class name that say it is more than an activation (a ``SigmoidFocalLoss``, a ``ReLUConvBN``
block, a ``GatedGELU``): such a class is none, whatever activation it names."""


def family(name):
    """The ``Family`` of an activation class named ``name``, or ``None`` for any other name."""
    lowered = str(name).lower()
    if any(part in lowered for part in OTHER):
        return None
    return next((found for part, found in NAMES if part in lowered), None)
