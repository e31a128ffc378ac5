"""From evaluation summaries to the tidy metrics CSV, and from that CSV to the paper's tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from dpace.io import atomic_write_text

METRIC_COLUMNS = [
    "target", "target_label", "variant", "group", "objective", "depth", "block_size", "alpha", "k", "gamma",
    "normalize", "epoch", "suite", "benchmark", "temperature", "verification", "tau", "speedup",
    "ar_tpot_s", "spec_tpot_s", "num_prompts", "num_output_tokens", "greedy_mismatches",
]


def _eval_location(summary_path: str | Path) -> tuple[str, str, int, str]:
    """``results/eval/<target>/<variant>/epoch-<e>/<suite>/summary.json`` -> its parts."""
    parts = Path(summary_path).parts
    target, variant, epoch_dir, suite = parts[-5], parts[-4], parts[-3], parts[-2]
    return target, variant, int(epoch_dir.removeprefix("epoch-")), suite


def group_metrics(variants: list[dict], summary_paths: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per (variant, epoch, suite, benchmark, temperature), and every per-block record."""
    meta = {(v["target"], v["variant"]): v for v in variants}
    rows, blocks = [], []
    for path in summary_paths:
        target, variant_id, epoch, suite = _eval_location(path)
        info = meta[(target, variant_id)]
        hparams = info.get("hparams", {})
        base = {
            "target": target,
            "target_label": info.get("target_label", target),
            "variant": variant_id,
            "group": info["group"],
            "objective": info["objective"],
            "depth": info["depth"],
            "block_size": info["block_size"],
            "alpha": hparams.get("alpha", math.nan),
            "k": hparams.get("k", math.nan),
            "gamma": hparams.get("gamma", math.nan),
            "normalize": info.get("normalize", "default"),
            "epoch": epoch,
            "suite": suite,
        }
        for result in json.loads(Path(path).read_text()):
            row = dict(base)
            for key in METRIC_COLUMNS:
                if key in result:
                    row[key] = result[key]
            rows.append(row)
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
    return metrics, block_frame


def write_group_metrics(variants, summary_paths, *, metrics_csv, blocks_csv) -> None:
    metrics, blocks = group_metrics(variants, list(summary_paths))
    atomic_write_text(metrics_csv, metrics.to_csv(index=False))
    atomic_write_text(blocks_csv, blocks.to_csv(index=False))


def read_metrics(paths) -> pd.DataFrame:
    """Concatenate group metrics CSVs. One evaluation may appear under several groups (variants are
    shared), so rows are kept per group: every table selects its groups explicitly."""
    frames = [pd.read_csv(path) for path in paths]
    return pd.concat(frames, ignore_index=True).drop_duplicates()


def render_table(name: str, metrics_csvs, out_path, **kwargs) -> None:
    """Render ``dpace.tables.<name>`` from the metrics CSVs and write it atomically."""
    from dpace import tables

    atomic_write_text(out_path, getattr(tables, name)(read_metrics(metrics_csvs), **kwargs))
