"""A drafter folder's training records, written alike by both training backends (``dpace.training.loop``,
the local loop, and ``dpace.training.specforge_backend``) and read by ``dpace.report.collect``:

* ``steps.jsonl`` -- one row per optimizer step (0-based ``global_step``, 1-based ``epoch``,
  0-based ``step`` within the epoch, ``progress`` and ``epoch_progress`` in (0, 1], ``loss``,
  ``accuracy``, ``grad_norm``, ``lr``, ``step_time_s`` and the per-position mean weights
  ``weight_per_position``); a backend may put its own fields first (SpecForge: ``specforge/<key>``);
* ``summary.json`` -- the run: objective, hyperparameters, normalization, epochs, steps, time per
  step and per epoch, final loss and accuracy, number of training sequences and the settings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from dpace.io import atomic_write_json, atomic_write_jsonl, read_json, read_jsonl, record_checksums

STEPS_FILE = "steps.jsonl"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class RunSchedule:
    """How a run's optimizer steps divide into epochs: ``steps`` in all, ``steps_per_epoch`` in each."""

    epochs: int
    steps: int
    steps_per_epoch: int


@dataclass(frozen=True)
class StepMetrics:
    """What one optimizer step measured (``weight_per_position``: the mean weight of each block position)."""

    loss: float | None
    accuracy: float | None
    grad_norm: float | None
    lr: float | None
    step_time_s: float | None
    weight_per_position: list


@dataclass(frozen=True)
class RunTiming:
    """A run's time per optimizer step and per epoch; ``wall_time_s`` where the backend clocks the whole run."""

    time_per_step_s: float
    time_per_epoch_s: float
    wall_time_s: float | None = None


@dataclass(frozen=True)
class BackendRun:
    """What a trainer other than the local loop records about its run (the SpecForge backend's): its name,
    the optimizer step each epoch ended at, its split of GPUs and its run file."""

    backend: str
    epoch_end_steps: dict | None = None
    topology: dict | None = None
    specforge_run: str | None = None


def step_row(schedule: RunSchedule, *, global_step: int, epoch: int, step: int, metrics: StepMetrics,
             extra: dict | None = None) -> dict:
    """One ``steps.jsonl`` row: optimizer step ``global_step`` (0-based), step ``step`` (0-based) of
    epoch ``epoch`` (1-based); ``extra`` fields (a backend's own metrics) come first."""
    return {
        **(extra or {}),
        "global_step": global_step,
        "epoch": epoch,
        "step": step,
        "progress": (global_step + 1) / schedule.steps,
        "epoch_progress": (step + 1) / schedule.steps_per_epoch,
        **asdict(metrics),
    }


def run_summary(
    rows: list[dict],
    *,
    objective: str,
    hparams: dict,
    normalization,
    schedule: RunSchedule,
    timing: RunTiming,
    num_sequences: int,
    config: dict,
    backend_run: BackendRun | None = None,
) -> dict:
    """The ``summary.json`` of a run whose ``steps.jsonl`` holds ``rows``; the fields of ``backend_run`` and the
    wall time are written only when given (the SpecForge backend's)."""
    extra = asdict(backend_run) if backend_run is not None else {}
    optional = {*(field.name for field in fields(BackendRun)), "wall_time_s"}
    summary = {
        "backend": extra.get("backend"),
        "objective": objective,
        "hparams": hparams,
        "normalization": normalization,
        "epochs": schedule.epochs,
        "steps": schedule.steps,
        "steps_per_epoch": schedule.steps_per_epoch,
        "epoch_end_steps": extra.get("epoch_end_steps"),
        "time_per_step_s": timing.time_per_step_s,
        "time_per_epoch_s": timing.time_per_epoch_s,
        "wall_time_s": timing.wall_time_s,
        "final_loss": rows[-1]["loss"] if rows else None,
        "final_accuracy": rows[-1]["accuracy"] if rows else None,
        "num_sequences": num_sequences,
        "topology": extra.get("topology"),
        "specforge_run": extra.get("specforge_run"),
        "config": config,
    }
    return {key: value for key, value in summary.items() if key not in optional or value is not None}


def write_records(out_dir: str | Path, rows: list[dict], summary: dict) -> None:
    """``out_dir/steps.jsonl`` and ``out_dir/summary.json``, each written atomically, and their checksums (the
    training tables' job verifies them: ``dpace.report.collect.training_frames``)."""
    atomic_write_jsonl(Path(out_dir) / STEPS_FILE, rows)
    atomic_write_json(Path(out_dir) / SUMMARY_FILE, summary)
    record_checksums(Path(out_dir) / STEPS_FILE, Path(out_dir) / SUMMARY_FILE)


def read_steps(drafter_dir: str | Path) -> list[dict]:
    """The rows of ``drafter_dir/steps.jsonl``."""
    return list(read_jsonl(Path(drafter_dir) / STEPS_FILE))


def read_summary(drafter_dir: str | Path) -> dict:
    """``drafter_dir/summary.json``."""
    return read_json(Path(drafter_dir) / SUMMARY_FILE)
