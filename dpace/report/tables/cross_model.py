"""Table 2 (``tab:cross-model``), experiment ``cross_model``: DFlash vs D-PACE on other targets."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpace.report import latex
from dpace.report.metrics_frame import (
    CONFIG,
    check_unique,
    complete_rows,
    distinct_configs,
    final_epoch_rows,
    prepared_metrics,
    present_benchmarks,
    rows_at_temperature,
    sort_objectives,
    target_label_of,
)


def table_cross_model(metrics: pd.DataFrame, *, epoch: int | None = None, temperature: float = 0.0) -> str:
    """Table 2 (``tab:cross-model``): per-benchmark ``SR / tau`` of DFlash vs D-PACE per target.

    Uses experiment ``cross_model`` (borrowing missing DFlash / D-PACE runs of the same configuration
    from ``main``).  Without any ``cross_model`` rows, a study with a single target falls back to
    the main experiment's DFlash / D-PACE rows at its shallowest depth.
    """
    df = prepared_metrics(metrics)
    if (df["experiment"] == "cross_model").any():
        rows = complete_rows(df, "cross_model", objectives=("dflash", "dpace"), borrow=("dflash", "dpace"))
    else:
        main = df[df["experiment"] == "main"]
        if main.empty or main["target"].nunique() != 1:
            raise ValueError(
                "metrics has no rows for experiment 'cross_model' (and no single-target 'main' experiment to fall back on)"
            )
        rows = main[(main["depth"] == main["depth"].min()) & main["objective"].isin(["dflash", "dpace"])]
    what = "experiment 'cross_model'"
    rows = rows_at_temperature(final_epoch_rows(rows, epoch, what), temperature, what)
    if rows.empty:
        raise ValueError(f"{what}: no DFlash / D-PACE rows")
    check_unique(rows, [*CONFIG, "objective", "benchmark"], what)
    benches = present_benchmarks(rows)
    configs = distinct_configs(rows)
    label_counts = pd.Series([target_label_of(rows, c[0]) for c in configs]).value_counts()

    spec = "ll" + "c" * len(benches)
    body = [r"\toprule", latex.row(["Target", "Method"] + [latex.benchmark_label(b) for b in benches]), r"\midrule"]
    for ci, (target, depth, bsize) in enumerate(configs):
        sub = rows[(rows["target"] == target) & (rows["depth"] == depth) & (rows["block_size"] == bsize)]
        tl = target_label_of(rows, target)
        shown = latex.escape(tl) if label_counts[tl] == 1 else latex.config_label(tl, depth, bsize)
        objs = sort_objectives(sub["objective"].unique())
        sr = {o: sub[sub["objective"] == o].set_index("benchmark")["speedup"] for o in objs}
        tau = {o: sub[sub["objective"] == o].set_index("benchmark")["tau"] for o in objs}
        cells_by_obj: dict[str, list[str]] = {o: [] for o in objs}
        for b in benches:
            sr_vals = [sr[o].get(b, np.nan) for o in objs]
            tau_vals = [tau[o].get(b, np.nan) for o in objs]
            sr_bold, tau_bold = latex.best_flags(sr_vals), latex.best_flags(tau_vals)
            for i, o in enumerate(objs):
                where = f"tab:cross-model, {target}, {int(depth)}L, B={int(bsize)}, {o}, {b}"
                latex.require(sr_vals[i], f"{where} SR")
                latex.require(tau_vals[i], f"{where} tau")
                if sr_bold[i] and tau_bold[i]:
                    cell = f"\\textbf{{{latex.fmt(sr_vals[i])} / {latex.fmt(tau_vals[i])}}}"
                else:
                    cell = f"{latex.cell(sr_vals[i], sr_bold[i])} / {latex.cell(tau_vals[i], tau_bold[i])}"
                cells_by_obj[o].append(cell)
        for ri, o in enumerate(objs):
            first = f"\\multirow{{{len(objs)}}}{{*}}{{{shown}}}" if ri == 0 else ""
            body.append(latex.row([first, latex.bold_if(latex.objective_label(o), o == "dpace")] + cells_by_obj[o]))
        body.append(r"\bottomrule" if ci == len(configs) - 1 else r"\midrule")

    depths = sorted({int(c[1]) for c in configs})
    targets = [latex.escape(target_label_of(rows, t)) for t in dict.fromkeys(c[0] for c in configs)]
    caption = (
        r"\textbf{Generalization to other targets.} Per-benchmark SR / $\tau$ at "
        f"$T{{=}}{latex.temperature_text(temperature)}$ for {'/'.join(f'{d}L' for d in depths)} drafters of "
        f"{latex.join_words(targets)} ({latex.epoch_phrase(rows)})."
    )
    return latex.table(body, spec=spec, caption=caption, label="tab:cross-model", tabcolsep="4pt")
