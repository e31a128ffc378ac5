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
