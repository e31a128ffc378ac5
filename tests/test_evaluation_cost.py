"""The arithmetic of docs/evaluation-cost.md (benchmarks/evaluation_cost.py), checked by hand on small cases."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "evaluation_cost", Path(__file__).resolve().parents[1] / "benchmarks" / "evaluation_cost.py")
cost = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = cost  # dataclasses look their module up
SPEC.loader.exec_module(cost)

OURS = cost.DECODERS[0]


def test_table1_workload_is_the_papers():
    assert cost.requests() == {"gsm8k": 128, "math500": 128, "humaneval": 164, "mbpp": 128, "mt_bench": 160, "alpaca": 128}
    assert len(cost.PAPER_TAU) == 16 and OURS.drafter_block_s == pytest.approx(0.0094)


def test_decoding_hours_are_steps_times_step_cost():
    hours = cost.decoding_hours(OURS, 100, ar_per_drafter=False)
    steps = sum(n * 100 / tau for taus in cost.PAPER_TAU.values() for n, tau in zip(cost.requests().values(), taus, strict=True))
    assert hours["speculative"] == pytest.approx(steps * 0.0379 / 3600)
    assert hours["autoregressive"] == pytest.approx(2 * 836 * 100 * 0.0285 / 3600)
    assert cost.decoding_hours(OURS, 100)["autoregressive"] == pytest.approx(8 * hours["autoregressive"])


def test_replay_bound_counts_one_decode_step_per_16_positions():
    parts = cost.replay_hours(OURS, 100, prompt_tokens=28, estimate="bound")
    assert parts["target_forward_s"] == pytest.approx(8 * 0.0285)  # ceil(128 / 16) forwards of 16 tokens
    assert parts["drafter_pass_s"] == pytest.approx(math.ceil(100 / 16) * 0.0094)
    assert parts["drafters"] == pytest.approx(16 * 836 * parts["drafter_pass_s"] / 3600)
    assert parts["answers"] == pytest.approx(2 * 836 * 100 * 0.0285 / 3600)


def test_replay_throughput_estimate_uses_the_measured_training_rate():
    assert 2e14 < cost.achieved_flops_per_s() < 5e14  # 34% of an H200's dense bf16 peak
    parts = cost.replay_hours(OURS, 2048, estimate="throughput")
    assert parts["drafter_pass_s"] == pytest.approx(2048 * cost.TABLE7_ITERATION_S / 3 / 1024, rel=0.05)
    assert cost.replay_hours(OURS, 8, estimate="throughput")["target_forward_s"] == OURS.ar_token_s  # launch-bound floor
    assert parts["total"] < cost.decoding_hours(OURS, 2048, ar_per_drafter=False)["total"] / 4


def test_exactness_check_decodes_n_prompts_a_benchmark_at_one_temperature_each():
    # 6 benchmarks x 2 prompts = 12 of 756 prompts, each at one of the two temperatures: 12 / 756 / 2 of the
    # speculative decoding of every prompt at every temperature, and nothing of the AR part.
    without = cost.replay_hours(OURS, 100, estimate="bound")
    parts = cost.replay_hours(OURS, 100, estimate="bound", decoded_prompts_per_benchmark=2)
    speculative = cost.decoding_hours(OURS, 100)["speculative"]
    assert parts["decoded_subset"] == pytest.approx(12 / 756 / 2 * speculative)
    assert parts["total"] == pytest.approx(without["total"] + parts["decoded_subset"])
    assert without["decoded_subset"] == 0


def test_sr_timing_decodes_the_timed_prompts_by_the_target_and_every_drafter_each_repeat():
    shared = cost.decoding_hours(OURS, 100, ar_per_drafter=False)
    assert cost.timing_hours(OURS, 100, prompts_per_benchmark=8, repeats=4) == pytest.approx(
        4 * 48 / 756 * (shared["speculative"] + shared["autoregressive"]))
    assert cost.timing_hours(OURS, 100, prompts_per_benchmark=8, repeats=2) == pytest.approx(
        cost.timing_hours(OURS, 100, prompts_per_benchmark=4, repeats=4))
