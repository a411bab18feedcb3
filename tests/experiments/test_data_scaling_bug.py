"""``experiments.data_scaling_bug`` end to end at --tiny size."""

import json

from experiments import data_scaling_bug


def test_tiny_run(tmp_path):
    data_scaling_bug.main(["--tiny", "--out", str(tmp_path)])
    assert (tmp_path / "data_scaling_bug.png").stat().st_size > 10_000
    data = json.loads((tmp_path / "data_scaling_bug.json").read_text())
    assert {"config", "conditions", "conclusion"} <= set(data)
    norm, raw = data["conditions"]["normalised"], data["conditions"]["raw 0..255"]
    for cond in (norm, raw):
        assert {"input_range", "step0", "by_lr"} <= set(cond)
        assert set(cond["by_lr"]) == {f"{lr:g}" for lr in data["config"]["lrs"]}
        whole = cond["step0"]["whole_network"]
        assert {"clipped_fraction_1d", "clipped_fraction_2d", "rms_gradient_element"} <= set(whole)
    assert raw["input_range"][1] > 200 and norm["input_range"][1] < 5
    # the bug is visible at step 0: raw inputs push many gradient elements out of the histogram's range
    assert raw["step0"]["whole_network"]["clipped_fraction_1d"] > 0.05
    assert norm["step0"]["whole_network"]["clipped_fraction_1d"] < 0.01
    assert raw["step0"]["layers"][0]["rms_gradient_element"] > 20 * norm["step0"]["layers"][0]["rms_gradient_element"]
