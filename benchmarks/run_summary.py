"""One finished run's Table 1 in Markdown: what the README's Results and a closing note quote.

Reads ``results/metrics/<experiment>.csv`` and ``<experiment>_comparisons.csv`` of a run and prints, per
temperature, each method's average tau and SR (the mean over its training seeds), its difference to the
experiment's DFlash drafter with the 95% interval (bold where the interval excludes 0) and the interval's
half-width; where a method has several seeds, how the variance of its difference splits between prompts and
training seeds; and the replay's exactness check (requests decoded for real against replayed). Every number
is the pipeline's; nothing is typed by hand.

    python benchmarks/run_summary.py --run-dir /path/to/run              # Table 1 (experiment main)
    python benchmarks/run_summary.py --run-dir /path/to/run --experiment ablation
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from dpace.report.latex import objective_label
from dpace.report.metrics_frame import k_of, sort_objectives


def interval_text(row: pd.Series) -> str:
    text = f"{row['difference']:+.3f} [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]"
    return f"**{text}**" if row["ci_low"] > 0 or row["ci_high"] < 0 else text


def seed_split(row: pd.Series) -> str:
    """Share of the difference's variance that training seeds contribute (NaN with one seed)."""
    prompts, seeds = row.get("var_prompts", math.nan), row.get("var_seeds", math.nan)
    if not (isinstance(seeds, float) and math.isfinite(seeds)):
        return ""
    total = max(prompts, 0.0) + max(seeds, 0.0)
    share = max(seeds, 0.0) / total if total > 0 else math.nan
    return f"{100 * share:.0f}% seeds ({int(row['num_seeds'])} seeds, {row['seed_pairing']})"


# Settings that tell two drafters of one objective apart (an experiment's sweep), as the tables write them.
SETTINGS = {"depth": "depth {}", "block_size": "B = {}", "alpha": "alpha = {}", "gamma": "gamma = {}",
            "normalization": "normalization {}"}


def _settings(frame: pd.DataFrame | None, variant: str) -> dict:
    if frame is None or "variant" not in frame:
        return {}
    rows = frame[frame["variant"] == variant]
    if rows.empty:
        return {}
    first = rows.iloc[0]
    return {key: first[key] for key in SETTINGS if key in first and pd.notna(first[key])}


def _distinguishing(settings: dict[str, dict]) -> dict[str, str]:
    """Each variant's suffix: the settings in which it differs from the others of its group ("" if none)."""
    keys = [k for k in SETTINGS if len({str(s.get(k)) for s in settings.values()}) > 1]
    return {variant: ", ".join(SETTINGS[k].format(f"{s[k]:g}" if isinstance(s.get(k), float) else s.get(k))
                                for k in keys if k in s) for variant, s in settings.items()}


def _label(name: str, suffix: str) -> str:
    return f"{name} ({suffix})" if suffix else name


def table(comparisons: pd.DataFrame, temperature: float, metrics: pd.DataFrame | None = None) -> str:
    """The average over benchmarks, as ``experiment_comparisons`` computed it: each drafter's ``value`` and its
    DFlash drafter's ``reference_value``, at the final epoch; one row per drafter (a sweep's drafters of one
    objective are told apart by the settings they differ in), each under its own DFlash drafter (a block-size
    sweep has one per B); labelled and ordered as the tables do (``k`` and the settings from ``metrics``,
    where given)."""
    cells = comparisons[(comparisons["benchmark"] == "avg") & (comparisons["temperature"] == temperature)]
    cells = cells[cells["epoch"] == cells["epoch"].max()]
    cells = cells.assign(**{c: cells[c].astype(object).fillna("") for c in ("variant", "reference_variant")})
    has_seeds = "num_seeds" in cells and (cells["num_seeds"].fillna(1) > 1).any()
    header = "| method | tau | tau - DFlash [95% CI] | half-width | SR | SR - DFlash [95% CI] |"
    header += " seeds' share of the variance |" if has_seeds else ""
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    source = metrics if metrics is not None else cells
    references = list(dict.fromkeys(cells["reference_variant"]))
    reference_suffix = _distinguishing({r: _settings(source, r) for r in references})
    suffix = {}  # each drafter against every other drafter of its objective
    for _, drafters in cells.groupby("objective"):
        suffix.update(_distinguishing({v: _settings(source, v) for v in dict.fromkeys(drafters["variant"])}))
    for reference in references:
        group = cells[cells["reference_variant"] == reference]
        reference_tau, reference_sr = (group[group["metric"] == metric].iloc[0]["reference_value"]
                                       for metric in ("tau", "speedup"))
        lines.append("| " + " | ".join([_label(objective_label("dflash"), reference_suffix[reference]),
                                        f"{reference_tau:.3f}", "", "", f"{reference_sr:.2f}", ""]
                                       + ([""] if has_seeds else [])) + " |")
        for objective in sort_objectives(group["objective"]):
            variants = list(dict.fromkeys(group.loc[group["objective"] == objective, "variant"]))
            k = None if metrics is None else k_of(metrics, objective)
            for variant in variants:
                compared = group[(group["objective"] == objective) & (group["variant"] == variant)]
                t = compared[compared["metric"] == "tau"].iloc[0]
                s = compared[compared["metric"] == "speedup"].iloc[0]
                cols = [_label(objective_label(objective, k), suffix[variant]), f"{t['value']:.3f}", interval_text(t),
                        f"{(t['ci_high'] - t['ci_low']) / 2:.3f}", f"{s['value']:.2f}",
                        interval_text(s) if math.isfinite(s["ci_low"]) else f"{s['difference']:+.3f} (no interval)"]
                if has_seeds:
                    cols.append(seed_split(t))
                lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def replay_check(metrics: pd.DataFrame) -> str:
    rows = metrics[(metrics["benchmark"] != "avg")]
    rows = rows[rows["epoch"] == rows["epoch"].max()]
    parts = []
    for temperature, cell in rows.groupby("temperature"):
        counts = {c: int(cell[c].fillna(0).sum()) for c in
                  ("num_requests", "num_timed_requests", "replay_compared", "replay_equal", "replay_ties", "replay_failures")}
        parts.append(f"T = {temperature:g}: {counts['num_requests']} requests ({counts['num_timed_requests']} decoded and "
                     f"timed); replay check {counts['replay_compared']} compared, {counts['replay_equal']} equal, "
                     f"{counts['replay_ties']} ties, {counts['replay_failures']} failures")
    return "; ".join(parts)


def timed_text(comparisons: pd.DataFrame, temperature: float, decoded_in_evaluations: int) -> str:
    """Where SR comes from: the experiment's timing job (its prompts and repeats, from the SR comparisons),
    or, in a run without one (eval.tau: decode), the evaluations' own decoded requests."""
    speedup = comparisons[(comparisons["metric"] == "speedup") & (comparisons["benchmark"] == "avg")
                          & (comparisons["temperature"] == temperature)]
    repeats = speedup["num_repeats"].max() if "num_repeats" in speedup else math.nan
    if len(speedup) and pd.notna(repeats) and repeats > 0:
        return (f"from the timing job over {int(speedup['num_prompts'].max())} prompts x {int(repeats)} repeats, "
                f"interleaved")
    return f"over {decoded_in_evaluations} decoded requests"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, default=Path("."))
    parser.add_argument("--experiment", default="main")
    args = parser.parse_args()
    folder = args.run_dir / "results" / "metrics"
    metrics = pd.read_csv(folder / f"{args.experiment}.csv")
    comparisons = pd.read_csv(folder / f"{args.experiment}_comparisons.csv")
    for temperature in sorted(metrics["temperature"].unique()):
        prompts = metrics[(metrics["temperature"] == temperature) & (metrics["benchmark"] != "avg")]
        per_drafter = prompts.groupby("variant")[["num_prompts", "num_timed_requests"]].sum().max()
        print(f"\nT = {temperature:g}: tau over {int(per_drafter['num_prompts'])} prompts per drafter, SR "
              f"{timed_text(comparisons, temperature, int(per_drafter['num_timed_requests']))}:\n")
        print(table(comparisons, temperature, metrics))
    print("\nExactness of the replayed tau (all drafters): " + replay_check(metrics))


if __name__ == "__main__":
    main()
