"""Table 7 (``tab:training-time``), experiment ``main``'s training records: time per epoch,
iteration and optimizer step."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from dpace.report import latex
from dpace.report.metrics_frame import is_finite, objective_record_of, require_columns

TRAIN_RUN_COLUMNS: tuple[str, ...] = (
    "variant",
    "objective",
    "block_size",
    "steps",
    "time_per_epoch_s",
    "time_per_step_s",
)


def _mmss(seconds: object) -> str:
    if not is_finite(seconds):
        return latex.MISSING
    total = int(round(float(seconds)))  # type: ignore[arg-type]
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _select_timing_runs(
    train_runs: pd.DataFrame, variants: Sequence[str] | None, metrics: pd.DataFrame | None
) -> pd.DataFrame:
    runs = train_runs[train_runs["objective"].isin(["dflash", "dpace"])]
    if variants is not None:
        runs = runs[runs["variant"].isin(list(variants))]
    elif runs.groupby("objective")["variant"].nunique().max() > 1:
        info = None
        if metrics is not None:
            require_columns(metrics, ("variant", "experiment", "depth"), "metrics")
            info = metrics[["variant", "experiment", "depth"]].drop_duplicates("variant")
        elif {"experiment", "depth"} <= set(runs.columns):
            info = runs[["variant", "experiment", "depth"]]
        if info is None:
            raise ValueError(
                "train_runs has several DFlash / D-PACE runs "
                f"({sorted(runs['variant'])}); pass variants= or metrics= to pick the main pair"
            )
        runs = runs.drop(columns=[c for c in ("experiment", "depth") if c in runs.columns])
        runs = runs.merge(info, on="variant", how="inner")
        runs = runs[runs["experiment"] == "main"]
        runs = runs[runs["depth"] == runs["depth"].min()]
    if runs.empty:
        raise ValueError("train_runs has no DFlash / D-PACE run to compare")
    if runs.groupby("objective")["variant"].nunique().max() > 1:
        raise ValueError(f"train_runs: several runs per objective remain: {sorted(runs['variant'])}")
    return runs


def table_training_time(
    train_runs: pd.DataFrame,
    *,
    variants: Sequence[str] | None = None,
    metrics: pd.DataFrame | None = None,
) -> str:
    """Table 7 (``tab:training-time``): time per epoch ([h:]m:ss), per iteration and per optimizer
    step (ms), DFlash vs D-PACE.

    The paper's "per step" is one iteration = one micro-batch (99,987 samples / micro-batch 2 =
    49,993 iterations per epoch); an optimizer step here is ``grad_accumulation`` micro-batches.
    Both are shown, labelled; per iteration needs the ``grad_accumulation`` column.
    With several DFlash / D-PACE runs, pick them with ``variants=`` or let ``metrics`` (its
    ``variant``, ``experiment``, ``depth``) select the shallowest runs of experiment ``main``.
    """
    require_columns(train_runs, TRAIN_RUN_COLUMNS, "train_runs")
    runs = _select_timing_runs(train_runs, variants, metrics)
    by_obj = {o: runs[runs["objective"] == o].iloc[0] for o in ("dflash", "dpace") if (runs["objective"] == o).any()}
    labels = {"dflash": objective_record_of("dflash").comparison_label(), "dpace": r"\textbf{D-PACE}"}
    header = ["Method", "per epoch", "per iteration", "per optimizer step"]
    body = [r"\toprule", latex.row(header), r"\midrule"]

    def ms(seconds) -> str:
        return f"{float(seconds) * 1000:.0f}~ms" if is_finite(seconds) else latex.MISSING

    def per_iteration(r):
        accumulation = r.get("grad_accumulation", math.nan)
        return float(r["time_per_step_s"]) / float(accumulation) if is_finite(accumulation) else math.nan

    for o, r in by_obj.items():
        body.append(latex.row([labels[o], _mmss(r["time_per_epoch_s"]), ms(per_iteration(r)), ms(r["time_per_step_s"])]))
    body.append(r"\bottomrule")

    bsizes = sorted({int(r["block_size"]) for r in by_obj.values()})
    depth = ""
    if "depth" in runs.columns and runs["depth"].nunique() == 1:
        depth = f"{int(runs['depth'].iloc[0])}L "
    caption = f"Training wall-clock for the {depth}draft ($B{{=}}{'/'.join(map(str, bsizes))}$)."
    iterations = {int(r["iterations_per_epoch"]) for r in by_obj.values() if is_finite(r.get("iterations_per_epoch"))}
    accumulation = {int(r["grad_accumulation"]) for r in by_obj.values() if is_finite(r.get("grad_accumulation"))}
    unit = " An iteration is one micro-batch (the paper's per-step unit)"
    if len(accumulation) == 1:
        unit += f"; an optimizer step is {next(iter(accumulation))} iterations"
    caption += unit + "."
    if len(iterations) == 1:
        caption += f" {next(iter(iterations)):,} iterations per epoch.".replace(",", "{,}")
    if len(by_obj) == 2:
        a, b = (float(by_obj[o]["time_per_step_s"]) for o in ("dflash", "dpace"))
        if is_finite(a) and is_finite(b) and a > 0:
            caption += f" D-PACE changes the time per iteration by ${100 * (b / a - 1):+.1f}\\%$."
    return latex.table(body, spec="lccc", caption=caption, label="tab:training-time")
