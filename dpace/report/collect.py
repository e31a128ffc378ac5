"""From evaluation summaries and training records to the tidy CSVs the report reads (metrics, per-block
records, comparisons, training steps and runs); ``dpace.report.render`` draws the tables and figures from them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dpace.experiments import ARTIFACTS
from dpace.io import atomic_write_text, read_json, verify_recorded
from dpace.paths import eval_location
from dpace.report.intervals import COMPARISON_COLUMNS, experiment_comparisons
from dpace.report.timing import AUTOREGRESSIVE, interleaved_comparisons, interleaved_speedups
from dpace.training.training_records import STEPS_FILE, SUMMARY_FILE, read_steps, read_summary

METRIC_COLUMNS = [
    "target", "target_label", "variant", "experiment", "objective", "depth", "block_size", "alpha", "k", "gamma",
    "normalization", "epoch", "suite", "benchmark", "temperature", "verification", "tau", "speedup",
    "ar_tpot_s", "spec_tpot_s", "num_prompts", "num_output_tokens", "greedy_mismatches", "greedy_ties", "greedy_failures",
    "method", "training_seed",
    # replayed tau (eval.tau: replay): SR's decoded subset, and the exactness check's counts over it
    "tau_source", "num_requests", "num_timed_requests", "replay_compared", "replay_equal", "replay_ties",
    "replay_failures",
    # requests whose prompt + max_new_tokens + block exceed the target's context: skipped and counted by
    # dpace.evaluation, so tau and SR come from the others (render.py warns in the table)
    "skipped_too_long",
]
REPLAY_CHECK_COLUMNS = {"replay_compared": "requests_compared", "replay_equal": "equal", "replay_ties": "ties",
                        "replay_failures": "failures"}


def experiment_metrics(
    variants: list[dict], summary_paths: list[str], timing_paths: Sequence[str] = (), *,
    max_repeat_spread: float | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One row per (variant, epoch, suite, benchmark, temperature), every per-block record, and the
    paired bootstrap comparison of every drafter with the experiment's DFlash drafter (``dpace.report.intervals``).

    ``timing_paths``: the experiment's timing jobs' files (``dpace.evaluation.timing_run``): SR, its TPOTs and
    the SR comparisons come from them (``with_timed_speedups``), not from the evaluations, which under replayed
    tau time nothing."""
    meta = {(v["target"], v["variant"]): v for v in variants}
    rows, blocks, requests = [], [], []
    for path in summary_paths:
        target, variant_id, epoch, suite = eval_location(path)
        info = meta[(target, variant_id)]
        hparams = info.get("hparams", {})
        base = {
            "target": target,
            "target_label": info.get("target_label", target),
            "variant": variant_id,
            # train.seeds: the variants of one method are its training seeds (their mean is what tables show).
            "method": info.get("method", variant_id),
            "training_seed": info.get("training_seed", math.nan),
            "experiment": info["experiment"],
            "objective": info["objective"],
            "depth": info["depth"],
            "block_size": info["block_size"],
            "alpha": hparams.get("alpha", math.nan),
            "k": hparams.get("k", math.nan),
            "gamma": hparams.get("gamma", math.nan),
            "normalization": info.get("normalization", "default"),
            "epoch": epoch,
            "suite": suite,
        }
        fix = f"delete {Path(path).parent} and rerun (its evaluation runs again)"
        results = read_json(path)
        verify_recorded(path, what="the evaluation", fix=fix)  # a file edited or cut short after the job
        for result in results:
            row = dict(base)
            for key in METRIC_COLUMNS:
                if key in result:
                    row[key] = result[key]
            for column, key in REPLAY_CHECK_COLUMNS.items():
                row[column] = (result.get("replay_check") or {}).get(key)
            rows.append(row)
            requests.append(result.get("requests"))
        block_file = Path(path).with_name("blocks.csv")
        if block_file.exists():
            verify_recorded(block_file, what="the evaluation", fix=fix)
        if block_file.exists() and block_file.stat().st_size > 0:
            frame = pd.read_csv(block_file)
            frame.insert(0, "variant", variant_id)
            frame.insert(0, "target", target)
            frame.insert(2, "objective", info["objective"])
            frame.insert(3, "epoch", epoch)
            blocks.append(frame)
    metrics = pd.DataFrame(rows, columns=METRIC_COLUMNS)
    block_frame = pd.concat(blocks, ignore_index=True) if blocks else pd.DataFrame()
    with_requests = metrics.assign(requests=requests)
    comparisons = experiment_comparisons(with_requests[with_requests["requests"].notna()])
    # SR rows of evaluations that timed nothing (replayed tau) say nothing: left out
    comparisons = comparisons[(comparisons["metric"] != "speedup") | (comparisons["num_prompts"] > 0)]
    if timing_paths:
        metrics, comparisons = with_timed_speedups(metrics, comparisons, meta, timing_paths,
                                                   max_repeat_spread=max_repeat_spread)
    return metrics, block_frame, comparisons.reset_index(drop=True)


def with_timed_speedups(metrics: pd.DataFrame, comparisons: pd.DataFrame, meta: dict, timing_paths: Sequence[str],
                        *, max_repeat_spread: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``metrics`` with SR (``speedup``, ``ar_tpot_s``, ``spec_tpot_s``) of the timed drafters' full-suite rows
    from the timing files, and ``comparisons`` with their SR rows (metric ``speedup``, every benchmark and
    ``avg``) from ``dpace.report.timing.interleaved_comparisons``: each drafter against the DFlash drafter of
    its depth and block size, with intervals over prompts and repeats and the stability check's columns
    (``num_repeats``, ``timing_stable``, ``repeat_spread``, ``timing_note``)."""
    spread = {} if max_repeat_spread is None else {"max_spread": float(max_repeat_spread)}
    times = pd.concat([pd.read_csv(path) for path in timing_paths], ignore_index=True)
    metrics, new_rows = metrics.copy(), []
    for (target, temperature), cell in times.groupby(["target", "temperature"], sort=True):
        timed = metrics[(metrics["target"] == target) & (metrics["suite"] == "full")
                        & np.isclose(metrics["temperature"].astype(float), float(temperature))]
        epochs = timed.groupby("variant")["epoch"].max()
        for row in interleaved_speedups(cell):
            at = timed.index[(timed["variant"] == row["variant"]) & (timed["benchmark"] == row["benchmark"])
                             & (timed["epoch"] == epochs.get(row["variant"]))]
            metrics.loc[at, ["speedup", "ar_tpot_s", "spec_tpot_s"]] = (row["speedup"], row["ar_tpot_s"],
                                                                        row["spec_tpot_s"])
        drafters = [{**meta[(target, v)], "variant": v} for v in cell["drafter"].unique() if (target, v) in meta]
        groups = pd.DataFrame(drafters).groupby(["depth", "block_size"], sort=True) if drafters else []
        for (depth, block_size), group in groups:
            # train.seeds: a method's variants are its training seeds, compared seed by seed with DFlash's
            group = group.assign(method=group["method"].fillna(group["variant"]) if "method" in group else group["variant"],
                                 training_seed=group["training_seed"] if "training_seed" in group else 0)
            seeds = {method: list(rows.sort_values("training_seed")["variant"])
                     for method, rows in group.groupby("method", sort=True)}
            references = group[group["objective"] == "dflash"]["method"].unique()
            if len(references) != 1 or len({len(s) for s in seeds.values()}) != 1:
                continue  # no single DFlash method to compare with in this cell (or seeds that do not pair)
            reference = seeds.pop(references[0])
            objectives = dict(zip(group["method"], group["objective"], strict=True))
            names = {*reference, *(v for s in seeds.values() for v in s), AUTOREGRESSIVE}
            for row in interleaved_comparisons(cell[cell["drafter"].isin(names)], reference, methods=seeds, **spread):
                new_rows.append({"target": target, "experiment": group["experiment"].iloc[0],
                                 "epoch": epochs.get(row["variant"]), "suite": "full", "temperature": temperature,
                                 "depth": depth, "block_size": block_size, "objective": objectives[row["variant"]],
                                 **row})
    if new_rows:
        timed_cells = pd.DataFrame(new_rows)[["target", "temperature", "depth", "block_size"]].drop_duplicates()
        keys = ["target", "temperature", "depth", "block_size"]
        replaced = comparisons[keys].merge(timed_cells, on=keys, how="left", indicator=True)["_merge"] == "both"
        comparisons = comparisons[~(replaced.to_numpy() & (comparisons["metric"] == "speedup").to_numpy())
                                  | (comparisons["suite"] != "full").to_numpy()]
        comparisons = pd.concat([comparisons, pd.DataFrame(new_rows)], ignore_index=True)[COMPARISON_COLUMNS]
    return metrics, comparisons


def _metrics_files(artifact) -> set[str]:
    """The results/metrics/ files one artifact is drawn from (as rule render_table/render_figure's inputs)."""
    files = {f"{e}{suffix}" for e in artifact.experiments for suffix in (".csv", "_comparisons.csv")}
    if artifact.blocks:
        files |= {"main_blocks.csv", "main_local_blocks.csv"}
    if artifact.train:
        files |= {"main_train_steps.csv", "main_train_runs.csv"}
    return files


def remove_stale_reports(outputs) -> list[Path]:
    """Remove the tables, figures and scorecard drawn from ``outputs`` (results/metrics/ files about to be
    remade). Snakemake removes only a failed job's own outputs: a metrics job that failed left the previous
    run's tables in place, as if they were current. Those that the run asks for are drawn again after it."""
    removed = []
    for output in map(Path, outputs):
        results = output.parent.parent
        stale = [results / "findings.md"] + [
            results / f"{artifact.name}{suffix}" for artifact in ARTIFACTS.values() if output.name in _metrics_files(artifact)
            for suffix in ((".tex",) if artifact.kind == "table" else (".pdf", ".png"))]
        for path in stale:
            if path.exists():
                path.unlink()
                removed.append(path)
    return removed


def write_experiment_metrics(variants, summary_paths, *, metrics_csv, blocks_csv, comparisons_csv=None, timing_paths=(),
                             max_repeat_spread=None) -> None:
    metrics, blocks, comparisons = experiment_metrics(variants, list(summary_paths), list(timing_paths),
                                                      max_repeat_spread=max_repeat_spread)
    atomic_write_text(metrics_csv, metrics.to_csv(index=False))
    atomic_write_text(blocks_csv, blocks.to_csv(index=False))
    if comparisons_csv is not None:
        atomic_write_text(comparisons_csv, comparisons.to_csv(index=False))


def training_frames(variants: list[dict], drafter_dirs: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-step training rows (with per-position mean weights ``w_0..w_{B-1}``) and per-run times."""
    meta = {v["variant"]: v for v in variants}
    steps, runs = [], []
    for folder in map(Path, drafter_dirs):
        info = meta[folder.name]
        for name in (STEPS_FILE, SUMMARY_FILE):  # edited or cut short after the training
            verify_recorded(folder / name, what="the training", fix=f"delete {folder} and rerun its training")
        rows = read_steps(folder)
        for row in rows:
            flat = {k: v for k, v in row.items() if k != "weight_per_position"}
            # Figures label steps by their global index; the position within the epoch stays available.
            flat["step_in_epoch"], flat["step"] = flat["step"], flat["global_step"]
            flat.update({f"w_{j}": w for j, w in enumerate(row["weight_per_position"])})
            steps.append({"target": info["target"], "variant": folder.name, "objective": info["objective"], **flat})
        summary = read_summary(folder)
        settings = summary.get("config", {})
        accumulation = settings.get("grad_accumulation", math.nan)
        micro_batch = settings.get("micro_batch_size")
        # Table 7's per-iteration unit: one micro-batch (of one rank), as the paper counts iterations.
        iterations = math.ceil(summary["num_sequences"] / micro_batch) if micro_batch and summary.get("num_sequences") else math.nan
        runs.append({
            "target": info["target"], "variant": folder.name, "objective": info["objective"],
            "depth": info["depth"], "block_size": info["block_size"], "epochs": summary["epochs"],
            "steps": summary["steps"], "time_per_epoch_s": summary["time_per_epoch_s"],
            "time_per_step_s": summary["time_per_step_s"],
            "grad_accumulation": accumulation,
            "iterations_per_epoch": iterations,
        })
    return pd.DataFrame(steps), pd.DataFrame(runs)


def write_experiment_training(variants, drafter_dirs, *, steps_csv, runs_csv) -> None:
    steps, runs = training_frames(variants, list(drafter_dirs))
    atomic_write_text(steps_csv, steps.to_csv(index=False))
    atomic_write_text(runs_csv, runs.to_csv(index=False))
