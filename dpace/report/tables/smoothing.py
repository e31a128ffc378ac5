"""Table 5 (``tab:smoothing-sweep``), experiment ``smoothing``: average tau per alpha."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpace.objective_records import DEFAULT_ALPHA
from dpace.report import latex
from dpace.report.metrics_frame import (
    CONFIG,
    benchmark_averages,
    complete_rows,
    distinct_configs,
    final_epoch_rows,
    prepared_metrics,
    present_benchmarks,
    rows_at_temperature,
    target_label_of,
)


def table_smoothing(
    metrics: pd.DataFrame, *, epoch: int | None = None, temperature: float = 0.0, default_alpha: float = DEFAULT_ALPHA
) -> str:
    """Table 5 (``tab:smoothing-sweep``): average tau per alpha (D-PACE) plus DFlash, one row per
    (target, depth, B) of experiment ``smoothing``; best per row bold.

    Runs the sweep shares with other experiments (DFlash, D-PACE at the default alpha) are borrowed
    from experiments ``main`` then ``block_size`` when the smoothing experiment lacks them.
    """
    df = prepared_metrics(metrics)
    rows = complete_rows(df, "smoothing", objectives=("dpace", "dflash"), borrow=("dpace", "dflash"),
                     key_cols=("objective", "_alpha"), sources=("main", "block_size"))
    what = "experiment 'smoothing'"
    rows = rows_at_temperature(final_epoch_rows(rows, epoch, what), temperature, what)
    avg = benchmark_averages(rows, [*CONFIG, "objective", "_alpha"])
    dp = avg[(avg["objective"] == "dpace") & (avg["_alpha"] >= 0)]
    alphas = sorted(dp["_alpha"].unique())
    if not alphas:
        raise ValueError(f"{what}: no D-PACE runs")
    configs = distinct_configs(avg)
    depths = {int(c[1]) for c in configs}

    n = len(alphas)
    spec = "l" + "c" * (n + 1)
    alpha_cells = [
        f"$\\mathbf{{{latex.num_text(a)}}}$" if math.isclose(a, default_alpha) else f"${latex.num_text(a)}$" for a in alphas
    ]
    body = [
        r"\toprule",
        latex.row(["", f"\\multicolumn{{{n}}}{{c}}{{D-PACE ($\\alpha$)}}", "DFlash"]),
        f"\\cmidrule(lr){{2-{n + 1}}} \\cmidrule(lr){{{n + 2}-{n + 2}}}",
        latex.row(["", *alpha_cells, "decayed-CE"]),
        r"\midrule",
    ]
    for target, depth, bsize in configs:
        sub = avg[(avg["target"] == target) & (avg["depth"] == depth) & (avg["block_size"] == bsize)]
        vals = []
        for a in alphas:
            hit = sub[(sub["objective"] == "dpace") & np.isclose(sub["_alpha"], a)]
            vals.append(hit["tau"].iloc[0] if len(hit) else np.nan)
        ref = sub[sub["objective"] == "dflash"]
        vals.append(ref["tau"].iloc[0] if len(ref) else np.nan)
        bold = latex.best_flags(vals)
        tl = latex.escape(target_label_of(rows, target))
        label = f"{tl} ({int(depth)}L, $B{{=}}{int(bsize)}$)" if len(depths) > 1 else f"{tl} ($B{{=}}{int(bsize)}$)"
        columns = [f"D-PACE alpha={a:g}" for a in alphas] + ["DFlash"]
        body.append(latex.row([label] + [
            latex.cell(v, b, math_mode=True, where=f"tab:smoothing-sweep, {target}, {int(depth)}L, B={int(bsize)}, {column}")
            for v, b, column in zip(vals, bold, columns, strict=True)]))
    body.append(r"\bottomrule")
    caption = (
        r"\textbf{Weight smoothing hyperparameter $\alpha$.} Average $\tau$ over the "
        f"{len(present_benchmarks(rows))} benchmarks ($T{{=}}{latex.temperature_text(temperature)}$) at "
        f"{latex.epoch_phrase(rows)} across {len(configs)} draft configuration{'s' if len(configs) > 1 else ''}."
    )
    return latex.table(body, spec=spec, caption=caption, label="tab:smoothing-sweep", tabcolsep="5pt")
