"""From the tidy CSVs to one of the paper's tables (LaTeX) or figures (PDF + PNG): each artifact of the registry
(``dpace.experiments.ARTIFACTS``) rendered by the function its record names, with the inputs it names.

Apart from ``dpace.report.collect`` (which writes those CSVs) so that a job collecting metrics does not run,
and is not fingerprinted with, the table and figure code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dpace.experiments import ARTIFACTS, REFERENCE_EXPERIMENT, Artifact, reference_drafter
from dpace.io import atomic_write_text
from dpace.report import figures  # noqa: F401  (a renderer's module, as the tables below)
from dpace.report.metrics_frame import mean_over_seeds, skipped_requests_text

# The renderers' modules, which ``renderer`` finds by the registry's names: imported here so that the code
# fingerprint of a rendering job covers them (tests/test_experiments.py checks every record's module is here).
from dpace.report.tables import (  # noqa: F401
    ablation,
    averages,
    block_size,
    correlation,
    cross_model,
    main,
    smoothing,
    training_time,
)


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


def renderer(name: str) -> Callable:
    """The function that renders artifact ``name``: the one named like it in its record's module."""
    return getattr(importlib.import_module(ARTIFACTS[name].module), name)


def _render(artifact: Artifact, inputs: ArtifactInputs, out, out_png):
    """Call the artifact's renderer with the inputs its record names (``Artifact.arguments``): a table's returns
    its LaTeX, a figure's writes its PDF and PNG."""
    values = {"metrics": inputs.metrics, "comparisons": inputs.comparisons, "out": out, "out_png": out_png}
    files = {"blocks": inputs.blocks, "train_steps": inputs.train_steps, "train_runs": inputs.train_runs}
    args, kwargs = [], {}
    for argument in artifact.arguments:
        keyword, _, source = argument.rpartition("=")
        if source.startswith("reference:"):
            value = inputs.reference(source.split(":")[1])
        else:
            value = pd.read_csv(files[source]) if source in files else values[source]
        if keyword:
            kwargs[keyword] = value
        else:
            args.append(value)
    return renderer(artifact.name)(*args, **kwargs)


def render_artifact(
    name: str, *, metrics=(), comparisons=(), blocks=None, train_steps=None, train_runs=None, out, out_png=None
) -> None:
    """Render one table (LaTeX) or figure (PDF + PNG) of the paper from the tidy CSVs."""
    if name not in ARTIFACTS:
        raise ValueError(f"unknown artifact {name!r}; valid: {', '.join(ARTIFACTS)}")
    per_seed = read_metrics(metrics) if metrics else None
    inputs = ArtifactInputs(
        metrics=mean_over_seeds(per_seed) if metrics else None,
        comparisons=read_metrics(comparisons) if comparisons else None,
        blocks=blocks, train_steps=train_steps, train_runs=train_runs,
    )
    text = _render(ARTIFACTS[name], inputs, out, out_png)
    if ARTIFACTS[name].kind == "table":
        skipped = skipped_requests_text(per_seed) if per_seed is not None else ""
        if skipped:  # a LaTeX comment: the table still compiles, and whoever opens it reads the warning
            print(f"WARNING: {skipped}")
        atomic_write_text(out, (f"% WARNING: {skipped}\n" if skipped else "") + text)
