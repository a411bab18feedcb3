"""``cockpit_lite.diagnosis.precedence``: causes first, consequences under their root.

The pairs themselves are checked against the runs they were measured on in
tests/experiments/test_precedence.py; here the order, on hand-made findings and on the
README's first example, whose fixes are applied and re-run."""

import pytest
import torch

import cockpit_lite
from cockpit_lite.diagnosis import Finding, diagnose, format_report, recorded
from cockpit_lite.diagnosis.precedence import CAUSES, ordered


def finding(kind, step, layer=None, **evidence):
    return Finding(kind, layer, step, "warning", f"{kind} seen", f"fix {kind}", evidence)


def test_the_cause_comes_first_and_its_consequences_follow_it():
    lr, inputs, dead = finding("lr_too_high", 1), finding("unnormalized_inputs", 0), finding("dead_relu", 1, "1")
    assert ordered([lr, inputs, dead]) == [(inputs, None), (lr, inputs), (dead, inputs)]


def test_a_consequence_hangs_under_the_root_of_its_cause_s_chain():
    other = finding("noise_dominates", 0)
    lr, dead, inputs = finding("lr_too_high", 2), finding("dead_relu", 3, "1"), finding("unnormalized_inputs", 5)
    assert ordered([other, lr, dead, inputs]) == [(other, None), (inputs, None), (lr, inputs), (dead, inputs)]


def test_unrelated_findings_keep_the_order_they_were_found_in():
    a, b = finding("noise_dominates", 5), finding("lr_too_high", 3)
    assert ordered([a, b]) == [(b, None), (a, None)]  # by step; noise is no measured cause of lr_too_high


def test_non_finite_data_is_a_root_even_beside_exploding_gradients():
    grown = finding("exploding_gradients", 1, "rnn", growth=3e4)
    data = finding("nan_loss", 2, module="input", op="input")
    made = finding("nan_loss", 2, "rnn", module="rnn", op=None)
    assert ordered([grown, data]) == [(grown, None), (data, None)]
    assert ordered([grown, made]) == [(grown, None), (made, grown)]


def test_ordering_twice_changes_nothing_and_the_pairs_form_no_cycle():
    items = [finding("dead_relu", 1, "1"), finding("lr_too_high", 1), finding("unnormalized_inputs", 0),
             finding("lr_too_low", 9), finding("saturated_activations", 0, "2")]
    once = [f for f, _ in ordered(items)]
    assert [f for f, _ in ordered(once)] == once
    for kind in CAUSES:
        seen, todo = set(), [kind]
        while todo:
            for cause in CAUSES.get(todo.pop(), ()):
                assert cause != kind, f"{kind} would cause itself"
                if cause not in seen:
                    seen.add(cause)
                    todo.append(cause)


def test_the_report_names_the_root_under_each_consequence():
    inputs, lr = finding("unnormalized_inputs", 0), finding("lr_too_high", 1)
    text = format_report([lr, inputs], {})
    assert text.index("unnormalized_inputs, step 0") < text.index("lr_too_high, step 1")
    assert "probably caused by unnormalized_inputs (step 0): fix that first" in text
    assert text.count("probably caused by") == 1


def _readme_example(normalise=False, lr=0.1, log=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = 255 * torch.rand(64, 8), torch.randint(0, 3, (64,))
    if normalise:
        x = (x - x.mean(0)) / x.std(0)
    cp = cockpit_lite.Cockpit(model, log=log)
    for step in range(20):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        with cp(step, info={"loss": loss, "optimizer": optimizer}):
            loss.backward()
        optimizer.step()
    cp.close()
    return cp


def test_the_readme_example_lists_its_cause_first_and_fixing_it_clears_the_run(tmp_path):
    """The README: normalising the inputs clears all three findings; lowering the learning rate leaves the
    first, by 10x (what lr_too_high used to say) two, by the 380x it now says one; every reader lists the
    cause first."""
    log = tmp_path / "run.jsonl"
    cp = _readme_example(log=str(log))
    kinds = [f.kind for f in cp.findings]
    assert kinds == ["unnormalized_inputs", "lr_too_high", "dead_relu"]
    assert [f.kind for f in diagnose(str(log))] == kinds
    assert [f.kind for f in recorded(cp.get_output())] == kinds
    assert _readme_example(normalise=True).findings == []
    assert len(_readme_example(lr=0.01).findings) == 2
    divisor = next(f for f in cp.findings if f.kind == "lr_too_high").evidence["lr_divisor"]
    assert divisor == 380 and "by ~380x" in next(f for f in cp.findings if f.kind == "lr_too_high").suggestion
    assert [f.kind for f in _readme_example(lr=0.1 / divisor).findings] == ["unnormalized_inputs"]


@pytest.mark.parametrize("kind", sorted(CAUSES))
def test_every_pair_names_known_kinds(kind):
    from cockpit_lite.diagnosis import KINDS

    assert kind in KINDS and set(CAUSES[kind]) <= set(KINDS) | {"exploding_gradients:init"}


def test_gradients_exploding_from_the_initialisation_are_a_root_later_growth_a_consequence():
    init = finding("exploding_gradients", 0, gain=8.2)
    lr, dead = finding("lr_too_high", 1), finding("dead_relu", 1, "2")
    assert ordered([lr, dead, init]) == [(init, None), (lr, init), (dead, init)]
    grown = finding("exploding_gradients", 1, "0", growth=240.0)
    assert ordered([lr, grown]) == [(lr, None), (grown, lr)]
