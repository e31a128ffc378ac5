"""The registry of what the experiments show: every table and figure of the paper, which experiments'
metrics it reads, which per-block and training records it needs, and which of Table 1's drafters it
draws (the "reference drafters": the shallowest DFlash and D-PACE drafters of experiment main).

The workflow's targets and inputs (workflow/rules/common.smk), the renderers (``dpace.report.render``) and the
benchmark of each target's cost (benchmarks/target_times.py) all read this registry, so an artifact is
added here, and given a renderer in ``dpace.report.render``; tests/test_experiments.py checks both.
Imports nothing heavy: the Snakefile reads it while it parses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Artifact:
    name: str  # results/<name>.tex for a table, results/<name>.pdf (and .png) for a figure
    requires: str  # the experiment without which the config cannot build it
    experiments: tuple[str, ...]  # whose metrics (and comparisons) it reads, where configured
    blocks: bool = False  # reads Table 1's per-block records (main_blocks.csv)
    train: bool = False  # reads Table 1's training records (main_train_steps.csv, main_train_runs.csv)
    # Objectives whose reference drafter (``reference_drafter``) it draws.
    references: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return "table" if self.name.startswith("table_") else "figure"

    @property
    def file(self) -> str:
        return f"{self.name}.tex" if self.kind == "table" else f"{self.name}.pdf"


# In the paper's order (its LaTeX numbers the block-size table 4, the smoothing sweep 5).
ARTIFACTS: dict[str, Artifact] = {a.name: a for a in (
    Artifact("table_main", "main", ("main",)),
    Artifact("table_cross_model", "main", ("cross_model", "main")),
    Artifact("table_ablation", "ablation", ("ablation",)),
    Artifact("table_block_size", "block_size", ("block_size",)),
    Artifact("table_smoothing", "smoothing", ("smoothing",)),
    Artifact("table_target_prob", "target_prob", ("target_prob",)),
    Artifact("table_training_time", "main", ("main",), train=True),
    Artifact("table_correlation", "main", ("main",), blocks=True, references=("dflash",)),
    Artifact("table_objectives_extra", "extras", ("extras",)),
    Artifact("table_normalization", "normalization", ("normalization",)),
    Artifact("fig_motivation", "main", ("main", "cross_model"), blocks=True, references=("dflash",)),
    Artifact("fig_weight_dynamics", "main", ("main",), train=True, references=("dpace", "dflash")),
    Artifact("fig_tau_trajectory", "ablation", ("ablation",)),
)}
TABLES = [name for name, artifact in ARTIFACTS.items() if artifact.kind == "table"]
FIGURES = [name for name, artifact in ARTIFACTS.items() if artifact.kind == "figure"]
# The experiment whose drafters the reference drafters are.
REFERENCE_EXPERIMENT = "main"
# Where one evaluation's summary lies under results/: rule evaluate's output (its fields are the rule's
# wildcards), what an experiment's metrics ask for (common.smk), and what they parse back (eval_location).
EVAL_SUMMARY = "eval/{target}/{variant}/epoch-{epoch}/{suite}/summary.json"
_EVAL_SUMMARY_PATTERN = re.compile(
    r"(?:^|/)" + re.sub(r"\\\{(\w+)\\\}", lambda field: rf"(?P<{field.group(1)}>[^/]+)", re.escape(EVAL_SUMMARY)) + "$")


def eval_location(summary_path: str | Path) -> tuple[str, str, int, str]:
    """``results/<EVAL_SUMMARY>`` -> (target, variant, epoch, suite)."""
    match = _EVAL_SUMMARY_PATTERN.search(Path(summary_path).as_posix())
    if match is None:
        raise ValueError(f"{summary_path} is not an evaluation summary (results/{EVAL_SUMMARY})")
    return match["target"], match["variant"], int(match["epoch"]), match["suite"]


def _field(drafter: Any, key: str):
    return drafter[key] if isinstance(drafter, Mapping) else getattr(drafter, key)


def reference_drafter(drafters: Iterable[Any], objective: str):
    """The drafter of ``objective`` that the figures and the correlation table draw among Table 1's
    ``drafters``: the shallowest (depth, then block size). ``drafters`` are records with objective, depth
    and block_size (``dpace.config.Variant``s, or metrics rows as dicts); the one found is returned."""
    candidates = [d for d in drafters if _field(d, "objective") == objective]
    if not candidates:
        raise ValueError(f"no {objective!r} drafter in experiment {REFERENCE_EXPERIMENT!r}")
    return min(candidates, key=lambda d: (int(_field(d, "depth")), int(_field(d, "block_size"))))
