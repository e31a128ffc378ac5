"""From the tidy CSVs to one of the paper's tables (LaTeX) or figures (PDF + PNG): the renderer of each
artifact of the registry (``dpace.experiments.ARTIFACTS``).

Apart from ``dpace.report.collect`` (which writes those CSVs) so that a job collecting metrics does not run,
and is not fingerprinted with, the table and figure code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dpace.experiments import ARTIFACTS, REFERENCE_EXPERIMENT, reference_drafter
from dpace.io import atomic_write_text
from dpace.report import figures
from dpace.report.metrics_frame import mean_over_seeds
from dpace.report.tables.ablation import table_ablation
from dpace.report.tables.averages import table_normalization, table_objectives_extra, table_target_prob
from dpace.report.tables.block_size import table_block_size
from dpace.report.tables.correlation import table_correlation
from dpace.report.tables.cross_model import table_cross_model
from dpace.report.tables.main import table_main
from dpace.report.tables.smoothing import table_smoothing
from dpace.report.tables.training_time import table_training_time


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

    def table(function):  # the tables that read their experiments' metrics only
        return lambda inputs, out, out_png: function(inputs.metrics)

    return {
        "table_main": lambda inputs, out, out_png: table_main(inputs.metrics, comparisons=inputs.comparisons),
        "table_cross_model": table(table_cross_model),
        "table_ablation": table(table_ablation),
        "table_block_size": table(table_block_size),
        "table_smoothing": table(table_smoothing),
        "table_target_prob": table(table_target_prob),
        "table_training_time": lambda inputs, out, out_png: table_training_time(
            pd.read_csv(inputs.train_runs), metrics=inputs.metrics),
        "table_correlation": lambda inputs, out, out_png: table_correlation(
            pd.read_csv(inputs.blocks), variant=inputs.reference("dflash")),
        "table_objectives_extra": table(table_objectives_extra),
        "table_normalization": table(table_normalization),
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
