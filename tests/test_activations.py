"""``cockpit_lite.utils.activations``: the family of an activation class, from its name."""

import pytest

from cockpit_lite.utils.activations import Family, family

RELU, BOUNDED_RELU = Family("relu", True), Family("relu", False)
TANH, SIGMOID, OTHER = Family("tanh", False), Family("sigmoid", False), Family(None, True)


@pytest.mark.parametrize("name, expected", [
    # torch.nn's
    ("ReLU", RELU), ("ReLU6", BOUNDED_RELU), ("LeakyReLU", OTHER), ("PReLU", OTHER), ("RReLU", OTHER),
    ("ELU", OTHER), ("CELU", OTHER), ("SELU", OTHER), ("GELU", OTHER), ("SiLU", OTHER), ("Hardswish", OTHER),
    ("Softplus", OTHER), ("Mish", OTHER), ("Tanh", TANH), ("Hardtanh", TANH), ("Softsign", TANH),
    ("Sigmoid", SIGMOID), ("Hardsigmoid", SIGMOID),
    # Hugging Face's (transformers.activations), timm's, minGPT's
    ("GELUActivation", OTHER), ("NewGELUActivation", OTHER), ("FastGELUActivation", OTHER),
    ("QuickGELUActivation", OTHER), ("ClippedGELUActivation", OTHER), ("PytorchGELUTanh", OTHER),
    ("GELUTanh", OTHER), ("ReLUSquaredActivation", RELU), ("MishActivation", OTHER), ("SiLUActivation", OTHER),
    ("NewGELU", OTHER), ("QuickGELU", OTHER), ("Swish", OTHER), ("SwishMe", OTHER), ("HardSwishMe", OTHER),
    ("HardSigmoidMe", SIGMOID), ("HardMishMe", OTHER),
])
def test_activation_classes_of_torch_and_other_libraries(name, expected):
    assert family(name) == expected


@pytest.mark.parametrize("name", ["LogSigmoid", "LogSoftmax", "Softmax", "Linear", "LinearActivation", "Identity",
                                  "LayerNorm", "Conv2d", "GLU", "Dropout", "SigmoidFocalLoss", "ReLUConvBN", "GatedGELU",
                                  "SwiGLU", "GEGLU", "TanhAttention", "SiLUBlock", "ReLUPool"])
def test_other_classes_are_no_activation(name):
    assert family(name) is None
