"""Where the stages write under ``results/``: one home for the rules (workflow/rules/*.smk), the training and
evaluation code and the report. The patterns' fields are the rules' wildcards. Imports nothing: a job that writes
one of these paths is not rerun by an edit to the registries.
"""

from __future__ import annotations

import re
from pathlib import Path

EPOCH_DIR = "epoch-{epoch}"  # one checkpoint of a drafter, in its drafter folder
DRAFTER_DIR = "drafters/{target}/{variant}"
DRAFTER_SUMMARY = f"{DRAFTER_DIR}/summary.json"
BASELINE = "eval/{target}/autoregressive-baseline.jsonl"  # the target decoding alone, once per target
REFERENCE_FEATURES = "eval/{target}/reference-features.pt"  # its answers' context features, for replayed tau
# SR of an experiment's drafters on one target, timed together and interleaved (dpace.evaluation.timing_run)
TIMING = "eval/{target}/timing-{experiment}.csv"
# Table 7: DFlash's and D-PACE's training steps timed together, interleaved (dpace.step_timing)
STEP_TIMING = "drafters/{target}/step-timing.csv"
# One evaluation's summary: rule evaluate's output, what an experiment's metrics ask for (common.smk), and what
# they parse back (eval_location).
EVAL_DIR = f"eval/{{target}}/{{variant}}/{EPOCH_DIR}/{{suite}}"
EVAL_SUMMARY = f"{EVAL_DIR}/summary.json"
EVAL_BLOCKS = f"{EVAL_DIR}/blocks.csv"
_EVAL_SUMMARY_PATTERN = re.compile(
    r"(?:^|/)" + re.sub(r"\\\{(\w+)\\\}", lambda field: rf"(?P<{field.group(1)}>[^/]+)", re.escape(EVAL_SUMMARY)) + "$")


def eval_location(summary_path: str | Path) -> tuple[str, str, int, str]:
    """``results/<EVAL_SUMMARY>`` -> (target, variant, epoch, suite)."""
    match = _EVAL_SUMMARY_PATTERN.search(Path(summary_path).as_posix())
    if match is None:
        raise ValueError(f"{summary_path} is not an evaluation summary (results/{EVAL_SUMMARY})")
    return match["target"], match["variant"], int(match["epoch"]), match["suite"]
