"""What each heavy stage asks a batch scheduler for: GPUs only where the stage uses them, the GPU type,
CPU cores and partition from the SLURM profile's stage table (workflow/profiles/slurm/stages.yaml),
adjustable from the environment without editing the profile (README, "On a cluster").

Environment:
    DPACE_SLURM_CPUS       the node size: no stage asks for more CPU cores than this
    DPACE_SLURM_MEM_MB     ... nor for more host memory (MB) than this
    DPACE_SLURM_GPU_MODEL  one GPU type (GRES type) for every stage that uses GPUs
    DPACE_SLURM_STAGES     a YAML file shaped like stages.yaml, merged over it per stage
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml

STAGES_FILE = Path(__file__).resolve().parents[1] / "workflow" / "profiles" / "slurm" / "stages.yaml"
KEYS = {"gpu_model", "cpus", "mem_mb", "partition"}


class ClusterError(ValueError):
    pass


def _read(path: Path) -> dict:
    try:
        table = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as error:
        raise ClusterError(f"cannot read the stage table {path} (DPACE_SLURM_STAGES): {error}") from None
    if not isinstance(table, dict):
        raise ClusterError(f"{path}: expected a mapping of stage -> {{gpu_model, cpus, mem_mb, partition}}")
    for stage, entry in table.items():
        unknown = set(entry or {}) - KEYS
        if unknown:
            raise ClusterError(f"{path}: stage {stage} has unknown keys {sorted(unknown)} (known: {sorted(KEYS)})")
    return table


def stage_table(environ: Mapping[str, str] = os.environ) -> dict:
    """stages.yaml, with the file DPACE_SLURM_STAGES names merged over it stage by stage."""
    table = _read(STAGES_FILE)
    if environ.get("DPACE_SLURM_STAGES"):
        for stage, entry in _read(Path(environ["DPACE_SLURM_STAGES"])).items():
            table[stage] = {**(table.get(stage) or {}), **(entry or {})}
    return table


def _positive_int(value, name: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise ClusterError(f"{name} must be a positive integer, not {value!r}")
    return number


def stage_cpus(stage: str, environ: Mapping[str, str] = os.environ) -> int:
    """CPU cores a job of ``stage`` asks for: its entry's (or default's) cpus, at most DPACE_SLURM_CPUS."""
    table = stage_table(environ)
    entry = {**(table.get("default") or {}), **(table.get(stage) or {})}
    cpus = _positive_int(entry.get("cpus", 1), f"stages.yaml {stage}.cpus")
    if environ.get("DPACE_SLURM_CPUS"):
        cpus = min(cpus, _positive_int(environ["DPACE_SLURM_CPUS"], "DPACE_SLURM_CPUS"))
    return cpus


def stage_resources(stage: str, gpus: int, environ: Mapping[str, str] = os.environ) -> dict:
    """The scheduler resources of a job of ``stage`` that uses ``gpus`` GPUs (0: a CPU job, no GPU asked).

    ``gpu`` is also the local profile's GPU token (dpace.gpus picks the device from it)."""
    table = stage_table(environ)
    entry = {**(table.get("default") or {}), **(table.get(stage) or {})}
    resources: dict = {"gpu": int(gpus)}
    if gpus:
        model = environ.get("DPACE_SLURM_GPU_MODEL") or entry.get("gpu_model")
        if model:
            resources["gpu_model"] = str(model)
    if entry.get("mem_mb"):
        mem_mb = _positive_int(entry["mem_mb"], f"stages.yaml {stage}.mem_mb")
        if environ.get("DPACE_SLURM_MEM_MB"):
            mem_mb = min(mem_mb, _positive_int(environ["DPACE_SLURM_MEM_MB"], "DPACE_SLURM_MEM_MB"))
        resources["mem_mb"] = mem_mb
    if entry.get("partition"):
        resources["slurm_partition"] = str(entry["partition"])
    return resources


def stage_gpus(stage: str, config: Mapping) -> int:
    """GPUs a job of ``stage`` uses under ``config``: those of its backend (SGLang 1, SpecForge 2: capture
    server + trainer), else 1 when the config runs on CUDA (``device: cuda``), else 0."""
    cuda = config.get("device", "cpu") == "cuda"
    if stage == "generate_responses":
        return 1 if config["responses"]["backend"] == "sglang" or cuda else 0
    if stage == "features":
        return 1 if config["features"]["mode"] == "cached" and cuda else 0
    if stage == "train_drafter":
        return 2 if config["train"]["backend"] == "specforge" else int(cuda)
    if stage == "step_timing":  # the training loop's steps on the training device
        return int(cuda)
    if stage in ("autoregressive_baseline", "evaluate", "speedup_timing"):
        return 1 if config["eval"]["backend"] == "sglang" or cuda else 0
    if stage == "prepare_target":  # writes the target's description: no GPU
        return 0
    raise ClusterError(f"unknown GPU stage {stage!r}")


__all__ = ["ClusterError", "STAGES_FILE", "stage_cpus", "stage_gpus", "stage_resources", "stage_table"]
