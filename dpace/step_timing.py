"""Table 7's step time, measured so that a second measurement agrees: DFlash's and D-PACE's training steps
interleaved in one process, repeated (the step-timing job).

Before, Table 7 compared the step times that two separate training jobs logged, and its claims flipped between
runs: a load that slowed one job and not the other moved the ratio, and no interval over one run's own steps could
see it. Here one process sets both runs up (``dpace.training.loop``'s own set-up, the same drafter, optimiser and
batches as a training job) and alternates their optimizer steps on the same micro-batches, in an order that swaps
every step, ``repeats`` times ``steps`` steps after ``warmup`` untimed ones. A change of the machine's speed then
reaches both alike; what is left shows up as spread between repeats, which ``dpace.report.timing.step_ratio``
resamples and checks.

Output: one row per (repeat, step, drafter): ``STEP_COLUMNS``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import torch

from dpace.gpus import device_clock
from dpace.training.loop import (  # the training job's own set-up and step: what is timed is what trains
    _checked_settings,
    _optimizer_step,
    _set_up,
    padded_micro_batches,
)
from dpace.training.train_config import TrainConfig

STEP_COLUMNS = ["repeat", "step", "position", "drafter", "objective", "step_time_s"]


def interleaved_steps(configs: dict[str, TrainConfig], *, target_json, features_dir, steps: int, repeats: int,
                      warmup: int = 2, log=print) -> pd.DataFrame:
    """Time an optimizer step of every run of ``configs`` (name -> its training config), interleaved step by step,
    ``repeats`` x ``steps`` times after ``warmup`` untimed steps each; the runs see the same micro-batches."""
    with tempfile.TemporaryDirectory(prefix="dpace-step-timing-") as scratch:
        runs = {}
        for name, config in configs.items():
            config, objective, hparams = _checked_settings(config)
            runs[name] = _set_up(config, objective, hparams, target_json=target_json, features_dir=features_dir,
                                 out_dir=Path(scratch) / name, scratch_dir=Path(scratch) / name / "state")
            runs[name].drafter.train()
        first = next(iter(runs.values()))
        config = first.config
        order = torch.randperm(len(first.features), generator=torch.Generator().manual_seed(config.seed * 1000))
        batches = list(padded_micro_batches(first.features, order.tolist(), config.micro_batch_size))
        per_step = config.grad_accumulation
        count = max(1, len(batches) // per_step)
        names = list(runs)
        rows = []
        for index in range(warmup + repeats * steps):
            repeat, step = divmod(index - warmup, steps)
            start = (index % count) * per_step
            for position, name in enumerate(names[index % len(names):] + names[:index % len(names)]):
                run = runs[name]
                started = device_clock(run.device)
                _optimizer_step(run, batches[start : start + per_step])
                elapsed = device_clock(run.device) - started
                if index >= warmup:
                    rows.append({"repeat": repeat, "step": step, "position": position, "drafter": name,
                                 "objective": run.objective, "step_time_s": elapsed})
            if index >= warmup and step == steps - 1:
                log(f"step timing: repeat {repeat + 1} of {repeats} done")
    return pd.DataFrame(rows, columns=STEP_COLUMNS)
