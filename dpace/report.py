"""From evaluation summaries to the tidy metrics CSV, and from that CSV to the paper's tables."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dpace.experiments import ARTIFACTS, REFERENCE_EXPERIMENT, eval_location, reference_drafter
from dpace.intervals import experiment_comparisons
from dpace.io import atomic_write_text
from dpace.metrics_frame import mean_over_seeds
from dpace.training_records import read_steps, read_summary

METRIC_COLUMNS = [
    "target", "target_label", "variant", "experiment", "objective", "depth", "block_size", "alpha", "k", "gamma",
    "normalization", "epoch", "suite", "benchmark", "temperature", "verification", "tau", "speedup",
    "ar_tpot_s", "spec_tpot_s", "num_prompts", "num_output_tokens", "greedy_mismatches", "greedy_ties", "greedy_failures",
    "method", "training_seed",
    # replayed tau (eval.tau: replay): SR's decoded subset, and the exactness check's counts over it
    "tau_source", "num_requests", "num_timed_requests", "replay_compared", "replay_equal", "replay_ties",
    "replay_failures",
]
REPLAY_CHECK_COLUMNS = {"replay_compared": "requests_compared", "replay_equal": "equal", "replay_ties": "ties",
                        "replay_failures": "failures"}


def experiment_metrics(
    variants: list[dict], summary_paths: list[str]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One row per (variant, epoch, suite, benchmark, temperature), every per-block record, and the
    paired bootstrap comparison of every drafter with the experiment's DFlash drafter (``dpace.intervals``)."""
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
        for result in json.loads(Path(path).read_text()):
            row = dict(base)
            for key in METRIC_COLUMNS:
                if key in result:
                    row[key] = result[key]
            for column, key in REPLAY_CHECK_COLUMNS.items():
                row[column] = (result.get("replay_check") or {}).get(key)
            rows.append(row)
            requests.append(result.get("requests"))
        block_file = Path(path).with_name("blocks.csv")
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


def read_metrics(paths) -> pd.DataFrame:
    """Concatenate experiment metrics CSVs. One evaluation may appear under several experiments (variants are
    shared), so rows are kept per experiment: every table selects its experiments explicitly."""
    frames = [pd.read_csv(path) for path in paths]
    return pd.concat(frames, ignore_index=True).drop_duplicates()


@dataclass
class ArtifactInputs:
    """What one artifact reads (its registry entry says which: ``dpace.experiments.ARTIFACTS``): the
    experiments' metrics (seeds averaged) and comparisons, Table 1's per-block and training records."""

    metrics: pd.DataFrame | None
    comparisons: pd.DataFrame | None
    blocks: str | Path | None
    train_steps: str | Path | None
    train_runs: str | Path | None

    def reference(self, objective: str) -> str:
        """The id of Table 1's reference drafter of ``objective`` (``dpace.experiments.reference_drafter``)."""
        rows = self.metrics[self.metrics["experiment"] == REFERENCE_EXPERIMENT]
        return reference_drafter(rows.to_dict("records"), objective)["variant"]


def _renderers() -> dict:
    """Every artifact's renderer: a table's returns its LaTeX, a figure's writes its PDF and PNG."""
    from dpace import figures, tables

    def table(function):  # the tables that read their experiments' metrics only
        return lambda inputs, out, out_png: function(inputs.metrics)

    return {
        "table_main": lambda inputs, out, out_png: tables.table_main(inputs.metrics, comparisons=inputs.comparisons),
        "table_cross_model": table(tables.table_cross_model),
        "table_ablation": table(tables.table_ablation),
        "table_block_size": table(tables.table_block_size),
        "table_smoothing": table(tables.table_smoothing),
        "table_target_prob": table(tables.table_target_prob),
        "table_training_time": lambda inputs, out, out_png: tables.table_training_time(
            pd.read_csv(inputs.train_runs), metrics=inputs.metrics),
        "table_correlation": lambda inputs, out, out_png: tables.table_correlation(
            pd.read_csv(inputs.blocks), variant=inputs.reference("dflash")),
        "table_objectives_extra": table(tables.table_objectives_extra),
        "table_normalization": table(tables.table_normalization),
        "fig_motivation": lambda inputs, out, out_png: figures.fig_motivation(
            pd.read_csv(inputs.blocks), inputs.metrics, out, out_png, variant=inputs.reference("dflash")),
        "fig_weight_dynamics": lambda inputs, out, out_png: figures.fig_weight_dynamics(
            pd.read_csv(inputs.train_steps), out, out_png,
            dpace_variant=inputs.reference("dpace"), dflash_variant=inputs.reference("dflash")),
        "fig_tau_trajectory": lambda inputs, out, out_png: figures.fig_tau_trajectory(inputs.metrics, out, out_png),
    }


def render_artifact(
    name: str, *, metrics=(), comparisons=(), blocks=None, train_steps=None, train_runs=None, out, out_png=None
) -> None:
    """Render one table (LaTeX) or figure (PDF + PNG) of the paper from the tidy CSVs."""
    if name not in ARTIFACTS:
        raise ValueError(f"unknown artifact {name!r}; valid: {', '.join(ARTIFACTS)}")
    inputs = ArtifactInputs(
        metrics=mean_over_seeds(read_metrics(metrics)) if metrics else None,
        comparisons=read_metrics(comparisons) if comparisons else None,
        blocks=blocks, train_steps=train_steps, train_runs=train_runs,
    )
    text = _renderers()[name](inputs, out, out_png)
    if ARTIFACTS[name].kind == "table":
        atomic_write_text(out, text)
