"""A fast subset of the realistic suite (``experiments/realistic_diagnosis.py``): healthy recipes raise
no warning or error, each faulty twin is found (right kind and layer) within 30 steps of its onset."""

import logging

import pytest

from experiments import realistic_diagnosis as rd

logging.getLogger("cockpit_lite.diagnosis").setLevel(logging.CRITICAL)

FAST = {  # name -> steps (short where the finding comes early)
    "accumulation_x4": 40,
    "huber_outliers": 120,
    "bn_first_raw255": 40,
    "accumulation_no_zero_grad": 20,
    "lr_collapse_multistep": 70,
    "shuffled_labels_test_slot": 40,
    "irnn_lm_unclipped": 8,
    "masked_mean_empty_row": 5,
    "lstm_gates_saturated_init": 12,
    "deep_sigmoid_mlp": 20,
    "overfit_noisy_small_train_set": 200,
    "full_batch_gd_lr_above_2_over_lambda": 6,
    "lr_collapse_cnn_sgd": 90,
    "lr_decay_exponential_mlp": 70,
    "lr_tiny_mlp_sgd": 20,
    "irnn_wide_sgd_unclipped": 5,
    "mlp_three_step_decays": 160,
    "deep_relu_default_sgd": 60,
    "sgdr_restarts_mlp": 150,
}


def test_the_suite_has_a_dozen_healthy_recipes_and_fifteen_faulty_twins():
    assert len(rd.HEALTHY) >= 12 and len(rd.FAULTY) >= 15
    assert set(FAST) <= set(rd.RECIPES)


@pytest.mark.parametrize("name", list(FAST))
def test_recipe(name):
    cp, summary = rd.train(name, seed=0, steps=FAST[name])
    passed, first = rd.outcome(name, cp, FAST[name])
    assert passed, f"{name}: {rd.RECIPES[name].expect or 'healthy'}, got {cp.findings}"
    if rd.RECIPES[name].expect is None:
        assert summary["last"] < summary["first"], summary  # it genuinely trains
