"""From evaluation summaries and training records to the tidy CSVs the report reads (metrics, per-block
records, comparisons, training steps and runs); ``dpace.report.render`` draws the tables and figures from them."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dpace.experiments import ARTIFACTS
from dpace.io import atomic_write_text, read_json, verify_recorded
from dpace.paths import eval_location
from dpace.report.intervals import experiment_comparisons
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
    variants: list[dict], summary_paths: list[str]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One row per (variant, epoch, suite, benchmark, temperature), every per-block record, and the
    paired bootstrap comparison of every drafter with the experiment's DFlash drafter (``dpace.report.intervals``)."""
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
    return metrics, block_frame, comparisons


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


def write_experiment_metrics(variants, summary_paths, *, metrics_csv, blocks_csv, comparisons_csv=None) -> None:
    metrics, blocks, comparisons = experiment_metrics(variants, list(summary_paths))
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
