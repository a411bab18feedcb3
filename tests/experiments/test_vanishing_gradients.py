"""``experiments.vanishing_gradients`` end to end at --tiny size."""

import json

from experiments import vanishing_gradients


def test_tiny_run(tmp_path):
    vanishing_gradients.main(["--tiny", "--out", str(tmp_path)])
    assert (tmp_path / "vanishing_gradients.png").stat().st_size > 10_000
    data = json.loads((tmp_path / "vanishing_gradients.json").read_text())
    expected = {"config", "activations", "rms_ratio_relu_over_sigmoid", "sigmoid_collapsed_layers", "conclusion"}
    assert expected <= set(data)
    relu, sig = data["activations"]["ReLU"], data["activations"]["sigmoid"]
    for act in (relu, sig):
        assert {"whole_network", "layers", "final_train_loss", "test_accuracy"} <= set(act)
        assert len(act["layers"]) == len(data["config"]["widths"]) + 1
        for layer in act["layers"]:
            assert {"rms_gradient_element", "grad_norm", "central_bin_fraction", "clipped_fraction"} <= set(layer)
    # step 0, identical weights: the sigmoid net's first layer gets far smaller gradients and collapses
    assert sig["layers"][0]["rms_gradient_element"] * 10 < relu["layers"][0]["rms_gradient_element"]
    assert 1 in data["sigmoid_collapsed_layers"] and 1 not in data["relu_collapsed_layers"]
