"""Table 4 (``tab:block-size``), experiment ``block_size``: SR and tau per block size."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpace.report import latex
from dpace.report.metrics_frame import (
    CONFIG,
    benchmark_averages,
    complete_rows,
    distinct_configs,
    final_epoch_rows,
    is_finite,
    prepared_metrics,
    present_benchmarks,
    rows_at_temperature,
    target_label_of,
)


def _delta(new: float, old: float) -> str:
    if not (is_finite(new) and is_finite(old)) or float(old) == 0.0:
        return latex.MISSING
    return f"${100.0 * (float(new) / float(old) - 1.0):+.1f}$"


def table_block_size(metrics: pd.DataFrame, *, epoch: int | None = None, temperature: float = 0.0) -> str:
    """Table 4 (``tab:block-size``): average SR and tau per block size B, DFlash vs D-PACE, and the
    relative change Delta(%) (experiment ``block_size``; the B of the main runs borrowed from ``main``)."""
    df = prepared_metrics(metrics)
    rows = complete_rows(df, "block_size", objectives=("dflash", "dpace"), borrow=("dflash", "dpace"),
                     config_cols=("target", "depth"), key_cols=("objective", "block_size"))
    what = "experiment 'block_size'"
    rows = rows_at_temperature(final_epoch_rows(rows, epoch, what), temperature, what)
    avg = benchmark_averages(rows, [*CONFIG, "objective"])
    configs = distinct_configs(avg, ("target", "depth"))
    body = [
        r"\toprule",
        latex.row(["", r"\multicolumn{2}{c}{DFlash}", r"\multicolumn{2}{c}{D-PACE}", r"\multicolumn{2}{c}{$\Delta$ (\%)}"]),
        r"\cmidrule(lr){2-3} \cmidrule(lr){4-5} \cmidrule(lr){6-7}",
        latex.row(["$B$", "SR", r"$\tau$", "SR", r"$\tau$", "SR", r"$\tau$"]),
        r"\midrule",
    ]
    for ci, (target, depth) in enumerate(configs):
        sub = avg[(avg["target"] == target) & (avg["depth"] == depth)]
        if len(configs) > 1:
            label = f"{latex.escape(target_label_of(rows, target))}, {int(depth)}L"
            body.append(f"\\multicolumn{{7}}{{l}}{{\\emph{{{label}}}}} \\\\")
        for bsize in sorted(sub["block_size"].astype(int).unique()):
            at_b = sub[sub["block_size"] == bsize].set_index("objective")
            val = {
                (o, c): (at_b.at[o, c] if o in at_b.index else np.nan)
                for o in ("dflash", "dpace")
                for c in ("speedup", "tau")
            }
            cells = [str(bsize)]
            bold = {c: latex.best_flags([val["dflash", c], val["dpace", c]]) for c in ("speedup", "tau")}
            for i, o in enumerate(("dflash", "dpace")):
                where = f"tab:block-size, {target}, {int(depth)}L, B={bsize}, {o}"
                cells += [latex.cell(val[o, "speedup"], bold["speedup"][i], where=f"{where} SR"),
                          latex.cell(val[o, "tau"], bold["tau"][i], where=f"{where} tau")]
            cells += [_delta(val["dpace", c], val["dflash", c]) for c in ("speedup", "tau")]
            body.append(latex.row(cells))
        body.append(r"\bottomrule" if ci == len(configs) - 1 else r"\midrule")
    targets = [latex.escape(target_label_of(rows, t)) for t in dict.fromkeys(c[0] for c in configs)]
    depths = sorted({int(c[1]) for c in configs})
    n_b = rows["block_size"].nunique()
    caption = (
        r"\textbf{Block size sensitivity.} Average SR and $\tau$ over the "
        f"{len(present_benchmarks(rows))} benchmarks on {latex.join_words(targets)} "
        f"({'/'.join(f'{d}L' for d in depths)}, $T{{=}}{latex.temperature_text(temperature)}$) at {latex.epoch_phrase(rows)}, "
        f"across {n_b} block size{'s' if n_b > 1 else ''}."
    )
    return latex.table(body, spec="lcccccc", caption=caption, label="tab:block-size", tabcolsep="3pt")
