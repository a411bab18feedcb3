"""``cockpit_lite.extend``: models BackPACK's hooks would break are refused up front, and the fix works."""

import math
import re
import warnings

import pytest
import torch
from torch import nn

from cockpit_lite import Cockpit, configuration, extend


class _WithChild(nn.Module):
    """A layer whose sub-module is called ``output`` (as Hugging Face's ``BertAttention``)."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(3, 3)
        self.output = nn.Linear(3, 2)

    def forward(self, x):
        return self.output(torch.tanh(self.dense(x)))


class _WithBuffer(nn.Module):
    """A buffer ``output`` that BackPACK's forward hook would silently replace."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.register_buffer("output", torch.ones(2))

    def forward(self, x):
        return self.linear(x) * self.output


class _WithProperty(nn.Linear):
    """A read-only attribute ``input0`` of the class."""

    @property
    def input0(self):
        return self.weight


def _hooked(model):
    return [name for name, m in model.named_modules() if getattr(m, "_backpack_extend", False)]


@pytest.mark.parametrize("make, path, found", [
    (lambda: nn.Sequential(nn.Linear(3, 3), _WithChild()), "'1' (_WithChild)", "'output'"),
    (lambda: nn.Sequential(_WithBuffer()), "'0' (_WithBuffer)", "'output'"),
    (lambda: _WithProperty(3, 2), "the model (_WithProperty)", "'input0'"),
])
def test_a_module_whose_attribute_backpack_would_overwrite_is_refused_before_any_hook(make, path, found):
    model = make()
    with pytest.raises(ValueError, match=(
        rf"BackPACK cannot extend .*{re.escape(path)} has {found}.*"
        r"Fix: give the Cockpit the model without extending it, Cockpit\(model\)"
    )):
        extend(model)
    assert _hooked(model) == []  # refused before BackPACK touched it: the model runs as before
    model(torch.randn(2, 3)).sum().backward()


def test_the_converter_traces_a_custom_module_away_and_extends_its_layers():
    """The converter inlines a custom module's code: its child ``output`` is then one more layer."""
    model = nn.Sequential(nn.Linear(3, 3), _WithChild())
    x = torch.randn(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # BackPACK's converter, about torch.tanh
        converted = extend(model, use_converter=True)
    assert "1.output" in _hooked(converted)
    torch.testing.assert_close(converted(x), model(x))


def test_a_module_dict_with_a_key_output_is_extended():
    """Containers without a forward of their own are never called, so their children's names are free."""
    model = nn.Sequential(nn.Linear(3, 3))
    model.heads = nn.ModuleDict({"output": nn.Linear(3, 2)})
    assert "heads.output" in _hooked(extend(model))


def test_extending_an_extended_model_again_is_accepted():
    model = extend(nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2)))
    model(torch.randn(2, 3))  # BackPACK's stored outputs are on the modules now
    assert extend(model) is model


def _bert():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(config)


def test_bert_is_refused_by_extend_naming_the_module_and_the_fix_and_the_fix_works():
    model = _bert()
    with pytest.raises(ValueError, match=(
        r"'bert\.encoder\.layer\.0\.attention' \(BertAttention\) has 'output'.*"
        r"Fix: give the Cockpit the model without extending it, Cockpit\(model\)"
    )):
        extend(model)
    with pytest.raises(ValueError, match=(
        r"converter cannot trace BertForSequenceClassification.*Fix: give the Cockpit the model without "
        r"extending it, Cockpit\(model\) \(BackPACK cannot extend it without the converter either: "
        r"'bert\.encoder\.layer\.0' \(BertLayer\) has 'output'"
    )):
        extend(model, use_converter=True)
    # the fix: Cockpit(model), model not extended
    cp = Cockpit(model, configuration("business"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    ids, y = torch.randint(0, 50, (4, 6), generator=g), torch.tensor([0, 1, 1, 0])
    for step in range(2):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(input_ids=ids).logits, y)
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
    cp.close()
    record = cp.get_output()[1]
    assert record["GradNorm"] == pytest.approx([float(g.norm()) for g in grads], rel=1e-5, abs=1e-12)
    assert math.isfinite(record["NormTest"]) and math.isfinite(record["InnerTest"])
    assert record["meta"]["HessTrace"]["curvature"] == "hutchinson"
    assert record["meta"]["TICDiag"] == {"curvature": "diag_ggn_exact", "passes": 1}
    assert math.isfinite(record["TICDiag"]) and record["TICDiag"] > 0
