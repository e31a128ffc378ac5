"""Paired bootstrap intervals (dpace.intervals) on constructed evaluations with a known truth."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dpace.intervals import compare_summaries, experiment_comparisons, main, paired_bootstrap

BENCHMARKS = ("gsm8k", "mbpp", "mt_bench")


def _requests(taus: np.ndarray, ar_tpot: float = 0.05, spec_tpot: np.ndarray | None = None) -> dict:
    """One request per prompt per benchmark: taus[b, p]; speculative time per token spec_tpot[b, p]."""
    spec_tpot = np.full_like(taus, 0.1) if spec_tpot is None else spec_tpot
    return {
        benchmark: [
            {"id": f"{benchmark}-{p}", "tau": float(taus[b, p]), "ar_tpot_s": ar_tpot, "spec_tpot_s": float(spec_tpot[b, p])}
            for p in range(taus.shape[1])
        ]
        for b, benchmark in enumerate(BENCHMARKS)
    }


def _prompt_difficulty(prompts: int, seed: int = 0) -> np.ndarray:
    # Prompts differ far more from each other than the two drafters do: what pairing cancels.
    return 1.3 + 0.6 * np.random.default_rng(seed).random((len(BENCHMARKS), prompts))


def _avg(rows, metric="tau"):
    return next(r for r in rows if r["benchmark"] == "avg" and r["metric"] == metric)


def test_a_known_five_percent_difference_is_detected_with_its_size():
    base = _prompt_difficulty(12)
    noise = np.random.default_rng(1).normal(0, 0.02, base.shape)
    better = base * 1.05 + noise
    row = _avg(paired_bootstrap(_requests(better), _requests(base), seed=0))
    true_difference = float((better - base).mean())
    assert row["difference"] == pytest.approx(true_difference)
    assert row["ci_low"] > 0 and row["significant"]
    assert row["ci_low"] < true_difference < row["ci_high"]
    assert row["relative_difference"] == pytest.approx(true_difference / base.mean(), rel=1e-9)
    assert row["num_prompts"] == 36
    worse = _avg(paired_bootstrap(_requests(base), _requests(better), seed=0))  # a worse drafter is flagged too
    assert worse["ci_high"] < 0 and worse["significant"]


def test_identical_drafters_and_pure_noise_are_not_significant():
    base = _prompt_difficulty(12)
    same = _avg(paired_bootstrap(_requests(base), _requests(base)))
    assert (same["difference"], same["ci_low"], same["ci_high"], same["significant"]) == (0.0, 0.0, 0.0, False)
    # Two drafters of equal quality: symmetric noise around the same prompts. Across many seeds the
    # 95% interval excludes 0 about 5% of the time, never much more.
    false_positives = 0
    for seed in range(40):
        rng = np.random.default_rng(100 + seed)
        a, b = base + rng.normal(0, 0.05, base.shape), base + rng.normal(0, 0.05, base.shape)
        false_positives += _avg(paired_bootstrap(_requests(a), _requests(b), resamples=500, seed=seed))["significant"]
    assert false_positives <= 6


def test_pairing_is_what_detects_a_small_difference_among_very_different_prompts():
    base = _prompt_difficulty(12)
    better = base + 0.03  # 2% better on every prompt; prompts spread over 1.3-1.9
    row = _avg(paired_bootstrap(_requests(better), _requests(base)))
    assert row["significant"] and row["ci_low"] == pytest.approx(0.03) and row["ci_high"] == pytest.approx(0.03)
    # Unpaired (independent resamples of each drafter) the same data would give an interval ~0.1 wide.
    rng = np.random.default_rng(0)
    unpaired = [
        np.mean([better[b, rng.integers(0, 12, 12)].mean() - base[b, rng.integers(0, 12, 12)].mean() for b in range(3)])
        for _ in range(2000)
    ]
    assert np.quantile(unpaired, 0.025) < 0 < np.quantile(unpaired, 0.975)


def test_speedup_interval_uses_ratio_of_mean_times():
    base = _prompt_difficulty(8)
    slow, fast = np.full_like(base, 0.10), np.full_like(base, 0.08)
    row = _avg(paired_bootstrap(_requests(base, spec_tpot=fast), _requests(base, spec_tpot=slow)), "speedup")
    assert row["value"] == pytest.approx(0.05 / 0.08) and row["reference_value"] == pytest.approx(0.05 / 0.10)
    assert row["significant"]


def test_different_prompts_are_refused():
    base = _prompt_difficulty(4)
    other = _requests(base)
    other["mbpp"][0]["id"] = "another prompt"
    with pytest.raises(ValueError, match="different prompts"):
        paired_bootstrap(_requests(base), other)


def test_experiment_comparisons_pair_each_drafter_with_the_dflash_of_its_cell():
    base = _prompt_difficulty(10)
    rows = []
    for depth, bump in ((1, 0.2), (3, 0.0)):
        for objective, shift in (("dflash", 0.0), ("dpace", bump)):
            for temperature in (0.0, 1.0):
                for benchmark, requests in _requests(base + shift + depth).items():
                    rows.append({"target": "t", "experiment": "main", "epoch": 2, "suite": "full", "temperature": temperature,
                                 "depth": depth, "block_size": 8, "variant": f"{objective}-d{depth}",
                                 "objective": objective, "benchmark": benchmark, "requests": requests})
    comparisons = experiment_comparisons(pd.DataFrame(rows))
    avg = comparisons[(comparisons["benchmark"] == "avg") & (comparisons["metric"] == "tau")]
    assert sorted(zip(avg["variant"], avg["reference_variant"], avg["temperature"], strict=True)) == [
        ("dpace-d1", "dflash-d1", 0.0), ("dpace-d1", "dflash-d1", 1.0),
        ("dpace-d3", "dflash-d3", 0.0), ("dpace-d3", "dflash-d3", 1.0)]
    by_depth = avg.groupby("depth")["difference"].first()
    assert by_depth[1] == pytest.approx(0.2) and by_depth[3] == pytest.approx(0.0)
    assert avg.set_index("depth")["significant"].groupby(level=0).all().to_dict() == {1: True, 3: False}


def test_one_prompt_per_benchmark_gives_no_interval_and_no_significance():
    base = _prompt_difficulty(1)
    row = _avg(paired_bootstrap(_requests(base + 0.5), _requests(base)))
    assert row["difference"] == pytest.approx(0.5)
    assert np.isnan(row["ci_low"]) and np.isnan(row["ci_high"]) and not row["significant"]


def test_interval_width_matches_the_unbiased_standard_error_with_few_prompts():
    rng = np.random.default_rng(5)
    base = _prompt_difficulty(3)
    shifted = base + rng.normal(0.1, 0.1, base.shape)
    row = _avg(paired_bootstrap(_requests(shifted), _requests(base), resamples=20000))
    differences = shifted - base
    # Average over 3 benchmarks of a mean of 3 paired differences: its standard error, unbiased.
    standard_error = np.sqrt((differences.var(axis=1, ddof=1) / 3).sum()) / 3
    width = row["ci_high"] - row["ci_low"]
    assert width == pytest.approx(2 * 1.96 * standard_error, rel=0.1)  # unwidened: 0.82 of it


def _summary_file(path, cells: dict[float, dict]) -> str:
    """An evaluate job's summary.json: one row per (benchmark, temperature), with its requests."""
    rows = [{"benchmark": benchmark, "temperature": temperature, "tau": float(np.mean([r["tau"] for r in requests])),
             "requests": requests}
            for temperature, by_benchmark in cells.items() for benchmark, requests in by_benchmark.items()]
    path.write_text(json.dumps(rows))
    return str(path)


def test_two_summaries_are_compared_per_temperature_from_their_files(tmp_path, capsys):
    base = _prompt_difficulty(12)
    sampled = _prompt_difficulty(1, seed=3)  # T = 1: one prompt per benchmark, as the embedded default
    better = _summary_file(tmp_path / "a.json", {0.0: _requests(base * 1.05), 1.0: _requests(sampled + 0.2)})
    reference = _summary_file(tmp_path / "b.json", {0.0: _requests(base), 1.0: _requests(sampled)})

    table = main([better, reference, "--resamples", "500"])

    t0 = table[(table["temperature"] == 0.0) & (table["benchmark"] == "avg") & (table["metric"] == "tau")].iloc[0]
    assert t0["significant"] and t0["ci_low"] <= 0.05 * base.mean() <= t0["ci_high"]
    assert t0["difference"] == pytest.approx(0.05 * base.mean())
    t1 = table[(table["temperature"] == 1.0) & (table["benchmark"] == "avg") & (table["metric"] == "tau")].iloc[0]
    assert t1["difference"] == pytest.approx(0.2) and not t1["significant"]  # one prompt: no interval
    assert "avg" in capsys.readouterr().out
    swapped = compare_summaries(reference, better, resamples=500)  # the same comparison, the other way round
    assert swapped.query("temperature == 0 and benchmark == 'avg' and metric == 'tau'")["ci_high"].iloc[0] < 0


def test_summaries_of_other_prompts_or_temperatures_are_refused(tmp_path):
    base = _prompt_difficulty(4)
    reference = _summary_file(tmp_path / "b.json", {0.0: _requests(base)})
    other_prompts = _requests(base)
    other_prompts["mbpp"][0]["id"] = "mbpp-elsewhere"
    with pytest.raises(ValueError, match="different prompts"):
        compare_summaries(_summary_file(tmp_path / "a.json", {0.0: other_prompts}), reference)
    with pytest.raises(ValueError, match="temperatures differ"):
        compare_summaries(_summary_file(tmp_path / "c.json", {0.0: _requests(base), 1.0: _requests(base)}), reference)
