"""``timing.jobs: per-target``: one timing job per target times the drafters of every experiment that claims SR,
and each experiment's timing file holds that job's rows of the target alone and of the experiment's drafters.

The rows are copied, not re-timed: a drafter that two experiments share (Table 1's B = 8 drafters in the block
size sweep) is decoded once, and every experiment's SR compares timings interleaved in the same requests."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from dpace.io import atomic_write_text
from dpace.timing_records import AUTOREGRESSIVE, TIMING_COLUMNS


def experiment_rows(shared: pd.DataFrame, drafters: Iterable[str]) -> pd.DataFrame:
    """The rows of ``shared`` (a per-target timing job's) that time the target alone or one of ``drafters``."""
    wanted = {str(d) for d in drafters}
    missing = wanted - set(shared["drafter"].astype(str))
    if missing:
        raise ValueError(f"the per-target timing job did not time {sorted(missing)}")
    return shared[shared["drafter"].astype(str).isin(wanted | {AUTOREGRESSIVE})][TIMING_COLUMNS]


def write_experiment_rows(shared_csv: str | Path, drafters: Iterable[str], out_path: str | Path) -> pd.DataFrame:
    """Write ``experiment_rows`` of the per-target timing file ``shared_csv`` to ``out_path``."""
    rows = experiment_rows(pd.read_csv(shared_csv), drafters)
    atomic_write_text(out_path, rows.to_csv(index=False))
    return rows
