"""``exploding_gradients``: not from a tiny or zero-initialised tensor's relative gradient on its own;
found late (gradients that start exploding at step 100) and while the loss spikes too (one finding: a
spike after small updates is not lr_too_high);
its layer choice is no near-tie of floats."""

import logging

import pytest
import torch
from torch import nn

import cockpit_lite
from cockpit_lite.diagnosis import Diagnosis
from cockpit_lite.diagnosis.rules.exploding_gradients import robust_argmax
from experiments.common import load_digits_tensors

logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)

NAMES = ["cls_token", "patch.weight", "patch.bias", "block.weight", "block.bias", "head.weight", "head.bias"]
SHAPES = [(1, 1, 32), (32, 64), (32,), (32, 32), (32,), (10, 32), (10,)]


def entry(step, cls_norm, grads=None, loss=2.3):
    grads = grads or [0.33, 0.5, 0.05, 0.4, 0.05, 0.3, 0.05]
    return {"Loss": loss, "GradNorm": grads, "ParamNorm": [cls_norm, 4.0, 0.5, 3.0, 0.5, 2.0, 0.3],
            "UpdateSize": [1e-3, 4e-3, 5e-4, 3e-3, 5e-4, 2e-3, 3e-4]}


def kinds(entries):
    diagnosis = Diagnosis(names=NAMES, shapes=SHAPES)
    for step, e in enumerate(entries):
        diagnosis.feed(step, e)
    return diagnosis.findings


def test_a_zero_initialised_class_token_does_not_fire_on_its_own():
    # the class token starts at 0 and grows slowly: ||g||/||w|| = 830 at ||w|| = 4e-4, the total norm flat
    found = kinds([entry(s, 4e-4 * (s + 1)) for s in range(12)])
    assert [f for f in found if f.kind in ("exploding_gradients", "vanishing_gradients")] == [], found


def _relative_gradients(first, second):
    """GradNorm giving the weight tensors (cls_token, patch, block, head: ‖θ‖ 0.5, 4, 3, 2, alike per entry)
    relative gradients ``first``, ``second``, 0.4/3 and 0.15 (the output end: max 0.15)."""
    return [first * 0.5, second * 4.0, 0.05, 0.4, 0.05, 0.3, 0.05]


def test_one_odd_tensor_at_the_input_end_does_not_fire_on_its_own():
    """r of the first weight tensor 200x the output end's, the second's ordinary (0.125 / 0.15): the
    input end is the smaller of the two, 0.83x, far below 50x."""
    found = kinds([entry(s, 0.5, _relative_gradients(30.0, 0.125)) for s in range(8)])
    assert [f for f in found if f.kind == "exploding_gradients"] == [], found


def test_the_second_tensor_alone_at_the_input_end_does_not_fire_either():
    """r of the second weight tensor 200x the output end's, the first's ordinary: the input end is min(0.125, 30)."""
    found = kinds([entry(s, 0.5, _relative_gradients(0.125, 30.0)) for s in range(8)])
    assert [f for f in found if f.kind == "exploding_gradients"] == [], found


def test_with_three_weight_tensors_the_input_end_is_the_first():
    """Weights a, b, c with ||w|| 1 and ||g|| 20, 0.1, 0.2: r 20 at the input end against max(0.1, 0.2) at the
    output end (the last two), 100x: found (too few tensors to ask for two at the input end)."""
    diagnosis = Diagnosis(names=["a.weight", "b.weight", "c.weight"], shapes=[(4, 4)] * 3)
    for step in range(4):
        diagnosis.feed(step, {"Loss": 2.3, "GradNorm": [20.0, 0.1, 0.2], "ParamNorm": [1.0, 1.0, 1.0]})
    hits = [f for f in diagnosis.findings if f.kind == "exploding_gradients"]
    assert [(f.step, f.layer, f.evidence["input_to_output"]) for f in hits] == [(0, "a", 100.0)]


def test_both_tensors_at_the_input_end_fire():
    """r 30 and 20 at the input end, 0.15 at the output end: min(30, 20) / 0.15 = 133x from the first
    record on, found after SUSTAIN (3) records; the layer is the largest r's."""
    found = kinds([entry(s, 0.5, _relative_gradients(30.0, 20.0)) for s in range(8)])
    hits = [f for f in found if f.kind == "exploding_gradients"]
    assert len(hits) == 1, found
    assert hits[0].step == 0 and hits[0].layer == "cls_token"
    assert hits[0].evidence["input_to_output"] == pytest.approx(20.0 / 0.15, rel=1e-3)  # 4 digits kept
    assert hits[0].evidence["largest"] == pytest.approx(30.0, rel=1e-3)


def test_records_without_gradient_or_parameter_norms_before_the_streak_do_not_stop_it():
    """Step 0 has no GradNorm, step 1 no ParamNorm (no relative gradients), step 2 ordinary ones (0.83x); from
    step 3 on the input end is 8.43 / 0.15 = 56.2x the output end's: found at step 3, the factor quoted to 2
    digits."""
    records = [entry(s, 0.5, _relative_gradients(30.0, 8.43)) for s in range(9)]
    del records[0]["GradNorm"], records[1]["ParamNorm"]
    records[2] = entry(2, 0.5, _relative_gradients(0.125, 0.125))
    diagnosis = Diagnosis(names=NAMES, shapes=SHAPES)
    for step, record in enumerate(records):
        diagnosis.feed(step, record)
    hits = [f for f in diagnosis.findings if f.kind == "exploding_gradients"]
    assert diagnosis.failures == [] and len(hits) == 1 and hits[0].step == 3, diagnosis.findings
    assert "are 56x those at the output end at step 3 (56x at step 5)" in hits[0].message, hits[0].message


def test_growth_over_the_early_level_is_found_while_the_loss_spikes_and_the_spike_is_not_lr_too_high():
    """The loss spikes after updates of 1e-3 of the weights: the gradients exploded, the step size did not
    overshoot; one kind, exploding_gradients, in the tensor with the largest ||g||/||w||."""
    grads = [0.33, 0.5, 0.05, 0.4, 0.05, 0.3, 0.05]
    entries = [entry(s, 0.5) for s in range(3)]
    for s, factor in ((3, 30.0), (4, 4e4)):  # an LSTM without clipping: 0.6 -> 15,600 by step 4
        spiked = [g * (factor if i in (3, 4) else 2.0) for i, g in enumerate(grads)]
        entries.append(entry(s, 0.5, spiked, loss=2.3 * 10.0 ** (s - 2)))  # 23, then 230: the loss spikes too
    found = kinds(entries)
    assert [f.kind for f in found] == ["exploding_gradients"], found
    assert found[0].layer == "block" and found[0].step == 4
    # block.weight's gradient 0.4 -> 1.6e4 (its own early norm 0.4 x 4e4), against its weights 1.6e4 / 3
    assert found[0].evidence["layer_growth"] == pytest.approx(4e4, rel=1e-3)
    assert found[0].evidence["relative"] == pytest.approx(1.6e4 / 3.0, rel=1e-3)


def test_a_loss_spike_after_a_large_update_is_lr_too_high():
    """The same spike after updates of 0.5 of the weights' norm: a step that overshot."""
    entries = [entry(s, 0.5) for s in range(3)]
    entries.append({**entry(3, 0.5, loss=23.0 * 2.3), "UpdateSize": [0.25, 2.0, 0.25, 1.5, 0.25, 1.0, 0.15]})
    found = kinds(entries)
    assert [f.kind for f in found] == ["lr_too_high"] and found[0].step == 3, found
    assert found[0].evidence["update_ratio"] >= 0.2


def test_the_layer_is_the_first_within_a_factor_2_of_the_largest():
    assert robust_argmax([98.0, 98.1, 40.0]) == 0
    assert robust_argmax([98.1, 98.0, 40.0]) == 0
    assert robust_argmax([10.0, 98.0, 60.0]) == 1
    assert robust_argmax([1.0, 2.0]) == 0  # exactly half of the largest: within the factor 2


def test_gradients_that_start_exploding_at_step_100_are_found_within_30_steps():
    """An MLP trains normally; from step 100 the loss is scaled up 10x every 5 steps (a loss-scale bug)."""
    torch.manual_seed(0)
    (x, y), _ = load_digits_tensors(seed=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cp = cockpit_lite.Cockpit(model)
    g = torch.Generator().manual_seed(1)
    for step in range(150):
        index = torch.randint(0, len(x), (32,), generator=g)
        opt.zero_grad()
        scale = 10.0 ** (max(0, step - 100) / 5)
        loss = scale * nn.functional.cross_entropy(model(x[index]), y[index])
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        with torch.no_grad():  # keep the weights finite: the update is what a clipped optimizer would do
            for p in model.parameters():
                p -= 0.05 * p.grad / max(1.0, scale)
    cp.close()
    hits = [f for f in cp.findings if f.kind == "exploding_gradients"]
    assert hits and 100 <= hits[0].step <= 130, cp.findings
    assert not [f for f in cp.findings if f.step < 100 and f.severity != "info"], cp.findings


def test_the_layer_of_a_recurrent_explosion_is_the_recurrent_matrix_not_the_embedding():
    """The embedding's gradient grew most over its own (tiny) early norm; the recurrent matrix's gradient is by
    far the largest against its weights: that is where the backward signal is amplified."""
    diagnosis = Diagnosis(names=["embed.weight", "rnn.weight_hh_l0", "head.weight"],
                          shapes=[(90, 32), (64, 64), (90, 64)])
    for step, grads in enumerate([[0.5, 30.0, 8.0]] * 3 + [[5e4, 1e6, 1e4]]):
        diagnosis.feed(step, {"Loss": 4.5, "GradNorm": grads, "ParamNorm": [54.0, 8.0, 5.0]})
    [hit] = diagnosis.findings
    assert (hit.kind, hit.layer, hit.step) == ("exploding_gradients", "rnn", 3), hit
    assert hit.evidence["growth"] > 100


def relu_chain(rms, type_name="ReLU"):
    return {"ActivationStats": {str(2 * i + 2): {"type": type_name, "mean": r, "std": 0.5 * r}
                                for i, r in enumerate(rms)}}


@pytest.mark.parametrize("rms, found", [
    ([4.2, 37.0, 260.0], True),   # weights from torch.randn: ~8x per layer
    ([0.55, 0.7, 0.92], False),   # a ResNet's blocks: 1.3x
    ([0.16, 0.085, 0.054], False),  # PyTorch's default init: the activations shrink
])
def test_activations_growing_through_the_layers_at_initialisation(rms, found):
    diagnosis = Diagnosis(names=NAMES, shapes=SHAPES)
    for step in range(4):
        diagnosis.feed(step, {**entry(step, 0.5), **relu_chain(rms)})
    hits = [f for f in diagnosis.findings if f.kind == "exploding_gradients"]
    assert bool(hits) == found, diagnosis.findings
    if found:
        assert hits[0].layer is None and hits[0].step == 0 and hits[0].evidence["gain"] == pytest.approx(
            (260.0 / 4.2) ** 0.5, rel=1e-3)
        # RMS = sqrt(mean^2 + std^2) = 1.25^0.5 mean, of the first and the last module
        assert hits[0].evidence["rms_first"] == pytest.approx(4.2 * 1.25 ** 0.5, rel=1e-3)
        assert hits[0].evidence["rms_last"] == pytest.approx(260.0 * 1.25 ** 0.5, rel=1e-3)
        assert hits[0].evidence["modules"] == 3
        # the fix names the init of the third case, which is not found
        assert "Kaiming" in hits[0].suggestion and "PyTorch's default init" in hits[0].suggestion



@pytest.mark.parametrize("type_name, read", [
    ("GELU", True), ("GELUActivation", True), ("NewGELUActivation", True), ("NewGELU", True), ("SiLU", True),
    ("ReLUSquaredActivation", True), ("ReLU6", False), ("Hardtanh", False), ("Tanh", False), ("Sigmoid", False),
])
def test_the_forward_gain_is_read_on_the_unbounded_activations_of_any_library(type_name, read):
    """Hugging Face's ``GELUActivation``, minGPT's ``NewGELU`` grow with their input as ``nn.GELU`` does; a
    bounded activation's output cannot show the weights' scale."""
    diagnosis = Diagnosis(names=NAMES, shapes=SHAPES)
    for step in range(4):
        diagnosis.feed(step, {**entry(step, 0.5), **relu_chain([4.2, 37.0, 260.0], type_name)})
    assert bool([f for f in diagnosis.findings if f.kind == "exploding_gradients"]) == read, diagnosis.findings


class GELUActivation(nn.Module):
    """Hugging Face's GELU (``transformers.activations``): not a subclass of ``nn.GELU``."""

    def forward(self, x):
        return nn.functional.gelu(x)


def test_weights_drawn_with_std_1_in_a_net_of_another_librarys_gelu_are_found_at_initialisation():
    """Before, only ``torch.nn``'s activations had statistics: this net's were not seen."""
    torch.manual_seed(0)
    (x, y), _ = load_digits_tensors(seed=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), GELUActivation(), nn.Linear(128, 128), GELUActivation(),
                          nn.Linear(128, 128), GELUActivation(), nn.Linear(128, 10))
    with torch.no_grad():
        for layer in model[1::2]:
            layer.weight.normal_()  # torch.randn: std 1 instead of ~1/sqrt(fan_in)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    cp = cockpit_lite.Cockpit(model)
    for step in range(5):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[:32]), y[:32])
        with cp(step, info={"loss": loss, "optimizer": opt}):
            loss.backward()
        opt.step()
    cp.close()
    hits = [f for f in cp.findings if f.kind == "exploding_gradients"]
    assert hits and hits[0].step == 0 and hits[0].layer is None and hits[0].evidence["modules"] == 3, cp.findings

def _gains(gains):
    """Findings of records whose two ReLU modules have RMS 1 and g (std 0): the gain per layer is g exactly."""
    diagnosis = Diagnosis(names=NAMES, shapes=SHAPES)
    for step, gain in enumerate(gains):
        stats = {"2": {"type": "ReLU", "mean": 1.0, "std": 0.0}, "4": {"type": "ReLU", "mean": gain, "std": 0.0}}
        diagnosis.feed(step, {**entry(step, 0.5), "ActivationStats": stats})
    return [f for f in diagnosis.findings if f.kind == "exploding_gradients"]


def test_a_gain_of_exactly_3_per_layer_on_the_first_3_records_is_found():
    (hit,) = _gains([3.0, 3.0, 3.0])
    assert hit.step == 0 and hit.evidence == {"gain": 3.0, "rms_first": 1.0, "rms_last": 3.0, "modules": 2}


def test_the_message_quotes_the_first_record_s_gain_and_rms_and_the_last_record_s_gain():
    """Gains 3.25, 4, 5.125 on the first three records: 2 digits of the gains, 3 of the RMS."""
    (hit,) = _gains([3.25, 4.0, 5.125])
    assert hit.message == ("at step 0 the activations grow 3.2x per layer on average (RMS 1 in '2' to 3.25 in '4', 2 "
                           "activation modules; still 5.1x at step 2): the initial weights are too large, and the "
                           "gradients grow by the same factor per layer towards the input")


def test_an_overflowed_gradient_norm_is_not_judged_against_the_early_level():
    """A record whose gradient norm is inf (a GradScaler's overflow, a step the scaler skips) is no growth of
    "infx its early level": the rule reads finite norms only."""
    grads = [0.33, 0.5, 0.05, 0.4, 0.05, 0.3, 0.05]
    entries = [entry(step, 0.5) for step in range(4)] + [entry(4, 0.5, grads=[float("inf")] + grads[1:])]
    assert not [f for f in kinds(entries) if f.kind == "exploding_gradients"]


def _totals(grads, names=("a.weight", "b.weight")):
    """exploding_gradients' findings of records with these per-tensor gradient norms (no parameter norms)."""
    diagnosis = Diagnosis(names=list(names), shapes=[(4, 4)] * len(names))
    for step, norms in enumerate(grads):
        diagnosis.feed(step, {"Loss": 2.3, "GradNorm": norms})
    assert diagnosis.failures == []  # records without parameter norms hold no input-to-output streak either
    return [f for f in diagnosis.findings if f.kind == "exploding_gradients"]


def test_zero_gradients_from_the_start_have_no_early_level_to_grow_from():
    """All-zero gradients (every weight zero-initialised): no early level, nothing judged against it."""
    assert _totals([[0.0, 0.0]] * 5) == []


@pytest.mark.parametrize("early, late, found", [
    (1e-3, 0.5, True),      # small gradients grow 500x: the size of the norm itself does not matter
    (1.0, 100.0, True),     # exactly 100x the early level, included
    (1.0, 99.0, False),
])
def test_the_growth_over_the_early_level_decides(early, late, found):
    """One tensor's norm: ``early`` on 3 records, then ``late``; the other tensor's gradient is 0."""
    hits = _totals([[early, 0.0]] * 3 + [[late, 0.0]])
    assert [(f.step, f.layer, f.evidence["growth"]) for f in hits] == \
        ([(3, "a", pytest.approx(late / early, rel=1e-3))] if found else [])


def test_a_tensor_that_was_not_in_the_early_records_has_no_early_norm():
    """The early records hold two tensors; the exploding record three (a parameter added to the optimizer mid-run):
    the new tensor's own growth is 0 (no early norm, however large its norm), the growth is found in the first
    tensor."""
    hits = _totals([[1.0, 1.0]] * 3 + [[300.0, 1.0, 1000.0]], names=("a.weight", "b.weight", "c.weight"))
    assert [(f.step, f.layer, f.evidence["layer_growth"]) for f in hits] == [(3, "a", 300.0)]


@pytest.mark.parametrize("early, late, layer, own", [
    # the tensor whose norm grew most over its own early norm, not the first
    ([1.0, 1.0], [1.0, 300.0], "b", 300.0),
    # no tensor grew over an early norm of its own (a's was 0; b's gradient is now 0, or shrank): the growth is in
    # a, which had no early gradient: the largest gradient, and no "0x its own early norm"
    ([0.0, 1.0], [300.0, 0.0], "a", None),
    ([0.0, 1.0], [300.0, 0.5], "a", None),
])
def test_without_parameter_norms_the_layer_is_the_one_that_grew_most_over_its_own_early_norm(early, late, layer, own):
    (hit,) = _totals([early] * 3 + [late])
    assert (hit.step, hit.layer, hit.evidence["layer_growth"]) == (3, layer, own)
    assert ("no early gradient of its own)" in hit.message) == (own is None), hit.message


@pytest.mark.parametrize("params, end", [
    (None, ")"),                     # no parameter norms: b grew most over its own early norm
    ([2.0, 4.0], ", ||g||/||w|| = 63)"),  # b's relative gradient 250.5 / 4 = 62.6 is the largest
])
def test_the_growth_message_quotes_the_growth_the_early_level_and_the_layer_s_numbers(params, end):
    """Early norms [1, 1] (total sqrt 2 = 1.41), then [1, 250.5]: the total 250.502 is 177x the early level; b's
    norm 250.5x its own."""
    diagnosis = Diagnosis(names=["a.weight", "b.weight"], shapes=[(4, 4), (4, 4)])
    for step, grads in enumerate([[1.0, 1.0]] * 3 + [[1.0, 250.5]]):
        diagnosis.feed(step, {"Loss": 2.3, "GradNorm": grads, **({"ParamNorm": params} if params else {})})
    (hit,) = [f for f in diagnosis.findings if f.kind == "exploding_gradients"]
    assert hit.message == ("the gradient norm is 1.8e+02x its early level 1.41 at step 3; largest against its weights "
                           "in 'b' (2.5e+02x its own early norm" + end)
    assert hit.suggestion.startswith("clip the gradient norm (torch.nn.utils.clip_grad_norm_)")
    assert hit.evidence == {"growth": 177.1, "early_level": 1.414, "layer_growth": 250.5,
                            "relative": 62.62 if params else None}


def test_records_without_parameter_norms_break_the_input_to_output_streak():
    """The input end is 133x the output end's on every record, but steps 1 and 2 have no ParamNorm: the streak of 3
    restarts at step 3 and is found at step 5, from step 3."""
    records = [entry(s, 0.5, _relative_gradients(30.0, 20.0)) for s in range(7)]
    del records[1]["ParamNorm"], records[2]["ParamNorm"]
    diagnosis = Diagnosis(names=NAMES, shapes=SHAPES)
    seen = []
    for step, record in enumerate(records):
        seen += [(f.step, step) for f in diagnosis.feed(step, record)[0] if f.kind == "exploding_gradients"]
    assert seen == [(3, 5)]


def test_no_gradient_at_the_output_end_is_blocked_not_exploding():
    """Weights a, b, c with ||w|| 1 and ||g|| 20, 0, 0: the output end's r is 0, no factor to compare against."""
    diagnosis = Diagnosis(names=["a.weight", "b.weight", "c.weight"], shapes=[(4, 4)] * 3)
    for step in range(4):
        diagnosis.feed(step, {"Loss": 2.3, "GradNorm": [20.0, 0.0, 0.0], "ParamNorm": [1.0, 1.0, 1.0]})
    assert [f for f in diagnosis.findings if f.kind == "exploding_gradients"] == [] and diagnosis.failures == []


def _three_weights(first_norms):
    """exploding_gradients' findings of records of weights a, b, c (||w|| 1) with ||g|| = first, 0.1, 0.2."""
    diagnosis = Diagnosis(names=["a.weight", "b.weight", "c.weight"], shapes=[(4, 4)] * 3)
    for step, first in enumerate(first_norms):
        diagnosis.feed(step, {"Loss": 2.3, "GradNorm": [first, 0.1, 0.2], "ParamNorm": [1.0, 1.0, 1.0]})
    return [f for f in diagnosis.findings if f.kind == "exploding_gradients"]


def test_an_input_end_exactly_50_times_the_output_end_s_is_found():
    """r 10 at the input end, 0.2 at the output end: 10 / 0.2 = 50 exactly (the bound, included)."""
    assert [f.step for f in _three_weights([10.0] * 3)] == [0]
    assert _three_weights([9.9] * 3) == []


def test_the_input_to_output_message_quotes_the_first_and_the_last_record_s_factors():
    """r at the input end 20.37, 25, 30 against 0.2: 102x at step 0, 150x at step 2; a's r 20.37 at step 0."""
    (hit,) = _three_weights([20.37, 25.0, 30.0])
    assert hit.message == ("relative to their weights, the gradients at the input end are 1e+02x those at the output "
                           "end at step 0 (1.5e+02x at step 2); largest in 'a' (||g||/||w|| = 20 at step 0)")
    assert hit.suggestion.startswith("clip the gradient norm (torch.nn.utils.clip_grad_norm_)")
    assert hit.evidence == {"input_to_output": 101.8, "largest": 20.37}


def test_a_tensor_that_joins_the_streak_late_is_quoted_at_its_first_record():
    """The class token is too small to judge at step 0 (||w|| 1e-9), 0.5 from step 1: the input end is patch's r 20
    at step 0, min(30, 20) after, 133x the output end's 0.15; the largest r, the class token's 30, is quoted at
    step 1, its first record (not "nan at step 0")."""
    found = kinds([entry(s, 1e-9 if s == 0 else 0.5, _relative_gradients(30.0, 20.0)) for s in range(3)])
    (hit,) = [f for f in found if f.kind == "exploding_gradients"]
    assert (hit.step, hit.layer, hit.evidence["largest"]) == (0, "cls_token", 30.0)
    assert hit.message.endswith("largest in 'cls_token' (||g||/||w|| = 30 at step 1)"), hit.message


def test_an_explosion_is_reported_once_even_in_another_layer_later():
    """Growth in a at step 3 (300x), then in b at step 4: one finding. Then the input end 100x the output end
    (a, steps 0-2), then growth in c at step 3: one finding."""
    assert [(f.step, f.layer) for f in _totals([[1.0, 1.0]] * 3 + [[300.0, 1.0], [1.0, 300.0]])] == [(3, "a")]
    assert [(f.step, f.layer) for f in _three_weights([20.0] * 3)] == [(0, "a")]
    diagnosis = Diagnosis(names=["a.weight", "b.weight", "c.weight"], shapes=[(4, 4)] * 3)
    for step, grads in enumerate([[20.0, 0.1, 0.2]] * 3 + [[20.0, 0.1, 2500.0]]):
        diagnosis.feed(step, {"Loss": 2.3, "GradNorm": grads, "ParamNorm": [1.0, 1.0, 1.0]})
    assert [(f.step, f.layer) for f in diagnosis.findings if f.kind == "exploding_gradients"] == [(0, "a")]
