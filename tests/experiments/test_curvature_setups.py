"""``experiments.curvature_setups``: its judge tells an exact set-up, an estimate, a refusal and a wrong value apart."""

import pytest

from experiments import curvature_setups as setups


@pytest.fixture(autouse=True)
def held_out_models(monkeypatch):
    for name in ("bn1d_mlp", "contrastive_infonce", "batch_centering"):
        monkeypatch.setitem(setups.problems.BUILDERS, name, setups.HELD_OUT[name])


def test_the_judge_on_three_set_ups():
    """The plain MLP (BackPACK's exact curvature) is exact at full; the ResNet with GroupNorm is exact
    with the engine's GGN diagonal; the accumulated step's curvature is refused with its reason."""
    assert setups.judge("mlp", "full", steps=3) == ("exact", [])
    outcome, notes = setups.judge("resnet_gn", "business (GGN)", steps=2)
    assert outcome == "exact", notes
    outcome, notes = setups.judge("mlp_accumulated", "business", steps=2)
    assert outcome == "refused" and "TICDiag" in setups.compact(notes) and "accumulated step" in notes[0]


def test_a_wrong_value_is_called_wrong(monkeypatch):
    """A reference off by 1 % makes the first-order values WRONG (the judge can fail)."""
    reference = setups.REFERENCES["NormTest"]
    monkeypatch.setitem(setups.REFERENCES, "NormTest",
                        lambda *args: tuple(v * 1.01 if i == 0 else [w * 1.01 for w in v]
                                            for i, v in enumerate(reference(*args))))
    outcome, notes = setups.judge("mlp", "business", steps=2)
    assert outcome == "WRONG" and any(n.startswith("NormTest:") for n in notes)


def test_a_tensor_of_rounding_noise_stays_exact():
    """The bias before the BatchNorm: its gradient tests NaN with a flag, the set-up exact, noted."""
    outcome, notes = setups.judge("bn1d_mlp", "business (GGN)", steps=2)
    assert outcome == "exact" and any("zero up to rounding" in n for n in notes)


@pytest.mark.parametrize("name", ["contrastive_infonce", "batch_centering"])
def test_samples_mixed_outside_any_batchnorm_are_exact_with_the_ggn(name):
    """InfoNCE's logits of every pair, and batch statistics in ``forward``: the GGN diagonal's pseudo-loss
    pass probes its own samples' terms (``cockpit_lite/engine/independence.py``) before the first step's
    curvature; it was up to 19x off there (TICTrace 0.053 against 1.01), with no flag."""
    outcome, notes = setups.judge(name, "business (GGN)", steps=2)
    assert outcome == "exact", notes
