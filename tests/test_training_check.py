"""The GPU check's training comparison (dpace.training.training_check), run on the CPU: a bf16 autocast curve
follows the committed float32 reference, and a broken loss does not."""

from __future__ import annotations

import json

import pytest

from dpace.training.training_check import (
    CHECK,
    REFERENCE,
    TOLERANCE,
    compare_curves,
    prepare_check,
    run_check,
)


def test_compare_curves_reports_the_largest_relative_deviation():
    result = compare_curves([10.0, 8.0, 4.0], [10.1, 8.0, 4.2], tolerance=0.04)
    assert result["step"] == 2 and result["max_relative_deviation"] == pytest.approx(0.05)
    assert not result["ok"]
    assert compare_curves([10.0, 8.0], [10.1, 8.0], tolerance=0.04)["ok"]
    assert not compare_curves([10.0, 8.0], [10.0], tolerance=0.04)["ok"]  # a run that stopped early


def test_the_committed_reference_is_the_check_it_is_used_for():
    reference = json.loads(REFERENCE.read_text())
    assert reference["check"] == json.loads(json.dumps(CHECK))  # made with the settings the check trains with
    steps = CHECK["sequences"] // CHECK["train"]["micro_batch_size"] * CHECK["train"]["epochs"]
    assert len(reference["losses"]) == steps == len(reference["cpu_bf16_losses"])
    # every supervised position is an anchor, so CUDA's generator picks the same anchors as the CPU's
    longest = max(len(s["input_ids"]) - s["prompt_tokens"] for s in reference["sequences"])
    assert CHECK["train"]["num_anchors"] >= longest
    assert reference["cpu_bf16_deviation"] < TOLERANCE / 10  # the tolerance's stated margin


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The check's target and features, built once for both training runs."""
    return prepare_check(work_dir=tmp_path_factory.mktemp("training-check"))


def test_cpu_bf16_training_follows_the_float32_reference(prepared):
    result = run_check(device="cpu", precision="bf16", attention_backend="sdpa", prepared=prepared)
    assert result["ok"], result
    assert 0 < result["max_relative_deviation"] < TOLERANCE  # bf16 changes the arithmetic, not the curve
    assert result["last_loss"] < 0.7 * result["first_loss"]  # and the drafter learns


def test_a_broken_loss_fails_the_comparison(prepared):
    # float32 as the reference, but every objective value 10% too large
    result = run_check(device="cpu", precision="fp32", attention_backend="sdpa", prepared=prepared,
                       objective_scale=1.1)
    assert not result["ok"]
    assert result["max_relative_deviation"] == pytest.approx(0.1, abs=0.01)


def test_a_target_or_drafter_initialised_otherwise_is_refused_with_the_command_to_rerun(prepared):
    """Another torch or transformers may initialise the random target or drafter otherwise: the curves
    would then differ for that reason, so the check refuses and names the command that remakes the reference."""
    from dpace.targets import load_target
    from dpace.training.training_check import load_check_data

    target, tokenizer = load_target(prepared["target_json"])
    reference = prepared["reference"]
    assert len(load_check_data(reference, target, tokenizer)) == CHECK["sequences"]
    for key in ("target_checksum", "drafter_checksum"):
        with pytest.raises(RuntimeError, match="--make-reference"):
            load_check_data({**reference, key: reference[key] * 1.001}, target, tokenizer)
