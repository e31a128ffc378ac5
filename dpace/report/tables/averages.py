"""Table 6 (``tab:target``, experiment ``target_prob``) and the extension tables of experiments
``extras`` (``tab:objectives-extra``) and ``normalization`` (``tab:normalization``): one layout,
average SR / tau per method and temperature."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from dpace.objective_records import REGISTRY
from dpace.report import latex
from dpace.report.metrics_frame import (
    CONFIG,
    benchmark_averages,
    complete_rows,
    config_mask,
    distinct_configs,
    final_epoch_rows,
    k_of,
    objective_rank,
    objective_record_of,
    prepared_metrics,
    present_benchmarks,
    rows_at_temperature,
    target_label_of,
)

NORMALIZATION_ORDER: tuple[str, ...] = ("batch", "anchor", "weight", "token", "default")


def _avg_table(
    rows: pd.DataFrame,
    *,
    row_keys: Sequence[str],
    order: Callable[[tuple], tuple],
    label_of: Callable[[tuple], str],
    temperatures: Sequence[float],
    caption: str,
    label: str,
) -> str:
    """Rows = methods (per configuration), columns = (SR, tau) per temperature, best per column."""
    keys = [*CONFIG, *row_keys]
    # SR is timed only for experiments a claim reads it of (the speedup_timing jobs); the others' SR is "--",
    # said in the caption, while a missing tau, or a missing SR of a timed experiment, still fails naming the cell.
    timed = "speedup" in rows and bool(rows["speedup"].notna().any())
    if not timed:
        caption += r" SR: not timed for this table (no claim reads it; the timing jobs time only those that do)."
    avgs = {t: benchmark_averages(rows_at_temperature(rows, t, label), keys) for t in temperatures}
    configs = distinct_configs(rows)
    nt = len(temperatures)
    ncols = 1 + 2 * nt
    body = [r"\toprule"]
    if nt > 1:
        body.append(latex.row([""] + [f"\\multicolumn{{2}}{{c}}{{$T = {latex.temperature_text(t)}$}}" for t in temperatures]))
        body.append(" ".join(f"\\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(nt)))
    body += [latex.row(["Method"] + ["SR", r"$\tau$"] * nt), r"\midrule"]
    for ci, cfg in enumerate(configs):
        if len(configs) > 1:
            cl = latex.config_label(target_label_of(rows, cfg[0]), cfg[1], cfg[2])
            body.append(f"\\multicolumn{{{ncols}}}{{l}}{{\\emph{{{cl}}}}} \\\\")
        sub_rows = rows[config_mask(rows, cfg)]
        rkeys = sorted(set(map(tuple, sub_rows[list(row_keys)].itertuples(index=False))), key=order)
        values = []
        for rk in rkeys:
            vals = []
            for t in temperatures:
                a = avgs[t]
                hit = a[(a[keys] == pd.Series((*cfg, *rk), index=keys)).all(axis=1)]
                vals += [hit["speedup"].iloc[0], hit["tau"].iloc[0]] if len(hit) else [np.nan, np.nan]
            values.append(vals)
        bold = [latex.best_flags([v[c] for v in values]) for c in range(2 * nt)]
        for ri, rk in enumerate(rkeys):
            columns = [f"T={t:g} {m}" for t in temperatures for m in ("SR", "tau")]
            body.append(latex.row([label_of(rk)] + [
                latex.cell(v, bold[c][ri], where=(f"{label}, {', '.join(map(str, (*cfg, *rk)))}, {columns[c]}"
                                                   if timed or c % 2 else None))
                for c, v in enumerate(values[ri])]))
        body.append(r"\bottomrule" if ci == len(configs) - 1 else r"\midrule")
    return latex.table(body, spec="l" + "cc" * nt, caption=caption, label=label)


def _temperatures(rows: pd.DataFrame, experiment: str, temperatures: Sequence[float] | None) -> list[float]:
    """The requested temperatures, or (None) those the experiment's own runs were evaluated at."""
    if temperatures is not None:
        return list(temperatures)
    return sorted(rows.loc[rows["experiment"] == experiment, "temperature"].astype(float).unique())


TARGET_PROB_LABELS: dict[str, str] = {
    "dflash": REGISTRY["dflash"].comparison_label(),
    "dpace-target-prob": REGISTRY["dpace-target-prob"].display_label(),
    "dpace": r"\textbf{D-PACE (draft prob)}",  # Table 6's own contrast with the target-probability variant
}


def table_target_prob(
    metrics: pd.DataFrame, *, epoch: int | None = None, temperatures: Sequence[float] | None = (0.0,)
) -> str:
    """Table 6 (``tab:target``): average SR / tau of DFlash, D-PACE (target prob) and D-PACE
    (experiment ``target_prob``; DFlash and D-PACE borrowed from ``main``).  ``temperatures=None``
    renders every temperature present."""
    df = prepared_metrics(metrics)
    rows = complete_rows(df, "target_prob", objectives=tuple(TARGET_PROB_LABELS), borrow=("dflash", "dpace"))
    what = "experiment 'target_prob'"
    rows = final_epoch_rows(rows, epoch, what)
    temps = _temperatures(rows, "target_prob", temperatures)
    depths = sorted(rows["depth"].astype(int).unique())
    caption = (
        r"\textbf{Target-probability surrogate.} Average SR and $\tau$ over the "
        f"{len(present_benchmarks(rows))} benchmarks on the {'/'.join(f'{d}L' for d in depths)} draft at "
        f"{latex.epoch_phrase(rows)} ($T{{=}}{', '.join(latex.temperature_text(t) for t in temps)}$). \\emph{{D-PACE (target prob)}} "
        "replaces the draft probability with the target probability on the same token in the D-PACE weight."
    )
    return _avg_table(
        rows,
        row_keys=("objective",),
        order=lambda k: (objective_rank(k[0]), k[0]),
        label_of=lambda k: TARGET_PROB_LABELS[k[0]],
        temperatures=temps,
        caption=caption,
        label="tab:target",
    )


def table_objectives_extra(
    metrics: pd.DataFrame, *, epoch: int | None = None, temperatures: Sequence[float] | None = None
) -> str:
    """Extension table (``tab:objectives-extra``): average SR / tau per temperature of the extra
    objectives (experiment ``extras``: D-PAKL, PARD-2 CAT, ...) next to the main DFlash / D-PACE runs of
    the same target, depth and block size."""
    df = prepared_metrics(metrics)
    rows = complete_rows(df, "extras", borrow=("dflash", "dpace"))
    what = "experiment 'extras'"
    rows = final_epoch_rows(rows, epoch, what)
    temps = _temperatures(rows, "extras", temperatures)
    caption = (
        r"\textbf{Further objectives.} Average SR and $\tau$ over the "
        f"{len(present_benchmarks(rows))} benchmarks at {latex.epoch_phrase(rows)} ($T{{=}}{', '.join(map(latex.temperature_text, temps))}$): "
        "the DFlash baseline and D-PACE"
    )
    described = latex.describe_objectives(rows["objective"].unique())
    caption += f" next to further objectives. {described}" if described else "."
    return _avg_table(
        rows,
        row_keys=("objective",),
        order=lambda k: (objective_rank(k[0]), k[0]),
        label_of=lambda k: latex.bold_if(latex.objective_label(k[0], k_of(rows, k[0])), k[0] == "dpace"),
        temperatures=temps,
        caption=caption,
        label="tab:objectives-extra",
    )


def _normalization_rank(value: str) -> int:
    return NORMALIZATION_ORDER.index(value) if value in NORMALIZATION_ORDER else len(NORMALIZATION_ORDER)


def table_normalization(
    metrics: pd.DataFrame, *, epoch: int | None = None, temperatures: Sequence[float] | None = None
) -> str:
    """Extension table (``tab:normalization``): average SR / tau per temperature of D-PACE under each
    loss normalization (experiment ``normalization``), with the main DFlash run as reference."""
    df = prepared_metrics(metrics, extra=("normalization",))
    rows = complete_rows(df, "normalization", borrow=("dflash",), key_cols=("objective", "normalization"))
    what = "experiment 'normalization'"
    rows = final_epoch_rows(rows, epoch, what)
    temps = _temperatures(rows, "normalization", temperatures)

    def label_of(k: tuple) -> str:
        obj, norm = k
        if obj == "dflash":
            return objective_record_of("dflash").comparison_label()
        return f"{latex.objective_label(obj)} ({latex.escape(norm)})"

    caption = (
        r"\textbf{Loss normalization.} Average SR and $\tau$ over the "
        f"{len(present_benchmarks(rows))} benchmarks at {latex.epoch_phrase(rows)} ($T{{=}}{', '.join(map(latex.temperature_text, temps))}$) "
        "for D-PACE normalized per batch, "
        "per anchor, by the weight sum or per token, with the DFlash baseline as reference."
    )
    return _avg_table(
        rows,
        row_keys=("objective", "normalization"),
        order=lambda k: (k[0] != "dflash", objective_rank(k[0]), _normalization_rank(k[1]), k[1]),
        label_of=label_of,
        temperatures=temps,
        caption=caption,
        label="tab:normalization",
    )
