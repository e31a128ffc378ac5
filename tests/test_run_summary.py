"""benchmarks/run_summary.py: the README's Table 1 summary is read from the comparisons CSV, not typed."""

from __future__ import annotations

import math

import pandas as pd

from dpace.gpu_check import load_benchmark
from dpace.report.intervals import COMPARISON_COLUMNS

run_summary = load_benchmark("run_summary")


def row(objective: str, metric: str, value: float, low: float, high: float, **extra) -> dict:
    out = dict.fromkeys(COMPARISON_COLUMNS, math.nan)
    reference = 1.40 if metric == "tau" else 0.66
    out.update({"experiment": "main", "epoch": 6, "temperature": 0.0, "objective": objective, "metric": metric,
                "benchmark": "avg", "value": value, "reference_value": reference, "difference": value - reference,
                "ci_low": low, "ci_high": high, "num_seeds": 1})
    out.update(extra)
    return out


def test_the_table_reads_averages_and_intervals_from_the_comparisons():
    comparisons = pd.DataFrame([
        row("dpace", "tau", 1.45, 0.03, 0.07), row("dpace", "speedup", 0.67, -0.02, 0.04),
        row("accept-rate", "tau", 1.00, -0.42, -0.38), row("accept-rate", "speedup", 0.47, -0.22, -0.16),
        row("dpace", "tau", 9.0, 8.0, 10.0, benchmark="gsm8k"),  # not the average: never shown
        row("dpace", "tau", 9.0, 8.0, 10.0, epoch=3),  # not the final epoch
    ])
    lines = run_summary.table(comparisons, 0.0).splitlines()
    assert lines[2].startswith("| DFlash | 1.400 |") and "0.66" in lines[2]
    # Ranked as the tables rank them (Accept-rate before D-PACE); bold where the interval excludes 0.
    assert lines[3].startswith("| Accept-rate | 1.000 | **-0.400 [-0.420, -0.380]** | 0.020 | 0.47 |")
    assert lines[4].startswith("| D-PACE | 1.450 | **+0.050 [+0.030, +0.070]** | 0.020 | 0.67 | +0.010 [-0.020, +0.040]")
    assert len(lines) == 5 and "seeds" not in lines[0]


def test_with_seeds_the_table_splits_the_variance():
    comparisons = pd.DataFrame([
        row("dpace", "tau", 1.45, 0.03, 0.07, num_seeds=3, seed_pairing="paired", var_prompts=3e-4, var_seeds=1e-4),
        row("dpace", "speedup", 0.67, -0.02, 0.04, num_seeds=3),
    ])
    lines = run_summary.table(comparisons, 0.0).splitlines()
    assert lines[0].endswith("seeds' share of the variance |")
    assert lines[3].endswith("| 25% seeds (3 seeds, paired) |")


def sweep_metrics(settings: dict[str, dict]) -> pd.DataFrame:
    """A metrics frame with one row per drafter: its objective and settings."""
    base = {"depth": 2, "block_size": 8, "alpha": math.nan, "k": math.nan, "gamma": math.nan, "normalization": "default"}
    return pd.DataFrame([{**base, "variant": variant, **values} for variant, values in settings.items()])


def test_a_sweep_shows_every_drafter_of_an_objective_by_the_setting_it_changes():
    """Table 5's drafters are all D-PACE: each gets its row, named by its alpha (one row per objective once
    showed alpha 0's numbers as "D-PACE" and dropped the others)."""
    comparisons = pd.DataFrame([
        row("dpace", "tau", 1.01, -0.41, -0.36, variant="dpace-alpha0", reference_variant="dflash-b8"),
        row("dpace", "speedup", 0.58, -0.27, -0.16, variant="dpace-alpha0", reference_variant="dflash-b8"),
        row("dpace", "tau", 1.45, 0.03, 0.07, variant="dpace-alpha0.5", reference_variant="dflash-b8"),
        row("dpace", "speedup", 0.85, -0.01, 0.11, variant="dpace-alpha0.5", reference_variant="dflash-b8"),
    ])
    metrics = sweep_metrics({"dflash-b8": {"objective": "dflash", "gamma": 4.0},
                             "dpace-alpha0": {"objective": "dpace", "alpha": 0.0},
                             "dpace-alpha0.5": {"objective": "dpace", "alpha": 0.5}})
    lines = run_summary.table(comparisons, 0.0, metrics).splitlines()
    assert lines[2].startswith("| DFlash | 1.400 |")
    assert lines[3].startswith("| D-PACE (alpha = 0) | 1.010 | **-0.390 [-0.410, -0.360]** |")
    assert lines[4].startswith("| D-PACE (alpha = 0.5) | 1.450 | **+0.050 [+0.030, +0.070]** |")
    assert len(lines) == 5


def test_a_block_size_sweep_shows_each_drafter_under_its_own_dflash():
    comparisons = pd.DataFrame([
        row("dpace", "tau", 1.45, 0.03, 0.07, variant="dpace-b8", reference_variant="dflash-b8"),
        row("dpace", "speedup", 0.85, 0.15, 0.23, variant="dpace-b8", reference_variant="dflash-b8"),
        row("dpace", "tau", 1.43, 0.07, 0.11, variant="dpace-b12", reference_variant="dflash-b12",
            reference_value=1.34, difference=0.09),
        row("dpace", "speedup", 0.73, 0.03, 0.12, variant="dpace-b12", reference_variant="dflash-b12",
            reference_value=0.65, difference=0.08),
    ])
    metrics = sweep_metrics({"dflash-b8": {"objective": "dflash", "gamma": 4.0},
                             "dflash-b12": {"objective": "dflash", "block_size": 12, "gamma": 6.0},
                             "dpace-b8": {"objective": "dpace", "alpha": 0.5},
                             "dpace-b12": {"objective": "dpace", "block_size": 12, "alpha": 0.5}})
    lines = run_summary.table(comparisons, 0.0, metrics).splitlines()
    assert lines[2:] == [
        "| DFlash (B = 8, gamma = 4) | 1.400 |  |  | 0.66 |  |",
        "| D-PACE (B = 8) | 1.450 | **+0.050 [+0.030, +0.070]** | 0.020 | 0.85 | **+0.190 [+0.150, +0.230]** |",
        "| DFlash (B = 12, gamma = 6) | 1.340 |  |  | 0.65 |  |",
        "| D-PACE (B = 12) | 1.430 | **+0.090 [+0.070, +0.110]** | 0.020 | 0.73 | **+0.080 [+0.030, +0.120]** |",
    ]


def test_sr_is_said_to_come_from_the_timing_job_where_the_comparisons_have_repeats():
    """Under replayed tau no evaluation decodes a timed request: the header names the timing job's prompts and
    repeats (it once said "SR over 0 decoded requests"); a decode-everything run keeps the evaluations' count."""
    timed = pd.DataFrame([row("dpace", "speedup", 0.87, -0.01, 0.06, num_prompts=12, num_repeats=4),
                          row("dpace", "speedup", 0.70, -0.01, 0.06, num_prompts=6, num_repeats=4, temperature=1.0),
                          row("dpace", "tau", 1.45, 0.03, 0.07, num_prompts=120)])
    assert run_summary.timed_text(timed, 0.0, 0) == "from the timing job over 12 prompts x 4 repeats, interleaved"
    assert run_summary.timed_text(timed, 1.0, 0) == "from the timing job over 6 prompts x 4 repeats, interleaved"
    decoded = pd.DataFrame([row("dpace", "speedup", 0.87, -0.01, 0.06, num_prompts=14)])  # num_repeats: NaN
    assert run_summary.timed_text(decoded, 0.0, 14) == "over 14 decoded requests"
