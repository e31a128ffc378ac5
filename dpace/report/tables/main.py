"""Table 1 (``tab:main``), experiment ``main``: SR and tau per benchmark, objective x depth x temperature."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpace.report import latex
from dpace.report.metrics_frame import (
    benchmark_averages,
    check_unique,
    experiment_rows,
    final_epoch_rows,
    k_of,
    prepared_metrics,
    present_benchmarks,
    sort_objectives,
    target_label_of,
)

SIGNIFICANT = r"$^{\dagger}$"


def significant_differences(comparisons: pd.DataFrame | None, experiment: str, epoch: int) -> set[tuple]:
    """(objective, depth, temperature, metric) whose average over benchmarks differs significantly
    from the experiment's DFlash drafter (95% paired bootstrap interval without 0; ``dpace.report.intervals``)."""
    if comparisons is None or comparisons.empty:
        return set()
    rows = comparisons[(comparisons["experiment"] == experiment) & (comparisons["benchmark"] == "avg")
                       & (comparisons["epoch"].astype(int) == int(epoch)) & comparisons["significant"].astype(bool)]
    return {(r.objective, int(r.depth), float(r.temperature), r.metric) for r in rows.itertuples()}


def _header(benches: list[str]) -> tuple[str, list[str]]:
    """The tabular spec and the header rows: categories (Math / Code / Chat, merged over consecutive
    benchmarks), benchmarks with the average, and SR / tau under each."""
    spec = "cl|" + "|".join(["cc"] * (len(benches) + 1))
    cats: list[tuple[str, int]] = []
    for b in benches:
        cat = latex.BENCHMARK_CATEGORIES.get(b, "Other")
        if cats and cats[-1][0] == cat:
            cats[-1] = (cat, cats[-1][1] + 1)
        else:
            cats.append((cat, 1))
    cat_cells, cmids, col = ["", ""], [], 3
    for cat, n in cats:
        cat_cells.append(f"\\multicolumn{{{2 * n}}}{{c|}}{{\\textsc{{{cat}}}}}")
        cmids.append(f"\\cmidrule(lr){{{col}-{col + 2 * n - 1}}}")
        col += 2 * n
    cat_cells.append(r"\multicolumn{2}{c}{}")
    bench_cells = ["", ""] + [f"\\multicolumn{{2}}{{c|}}{{{latex.benchmark_label(b)}}}" for b in benches]
    bench_cells.append(r"\multicolumn{2}{c}{Avg.}")
    metric_cells = ["Depth", "Method"] + ["SR", r"$\tau$"] * (len(benches) + 1)
    return spec, [r"\toprule", latex.row(cat_cells), "".join(cmids), latex.row(bench_cells), latex.row(metric_cells),
                  r"\midrule"]


def _depth_rows(sub: pd.DataFrame, benches: list[str], where: tuple[float, int], significant: set[tuple]) -> list[str]:
    """The rows of one (temperature, depth) = ``where`` block: SR and tau per benchmark and on average per
    objective, the best of each column in bold, a significant average marked."""
    t, d = where
    objs = sort_objectives(sub["objective"].unique())
    wide = sub.pivot(index="objective", columns="benchmark", values=["speedup", "tau"])
    avg = benchmark_averages(sub, ["objective"], benches).set_index("objective")
    values: list[list[float]] = []
    for o in objs:
        vals = []
        for b in benches:
            vals.append(wide.get(("speedup", b), pd.Series(dtype=float)).get(o, np.nan))
            vals.append(wide.get(("tau", b), pd.Series(dtype=float)).get(o, np.nan))
        vals += [avg.at[o, "speedup"], avg.at[o, "tau"]]
        values.append(vals)
    bold = [latex.best_flags([v[c] for v in values]) for c in range(len(values[0]))]
    columns = [f"{b} {m}" for b in [*benches, "average"] for m in ("SR", "tau")]
    rows = []
    for ri, o in enumerate(objs):
        first = f"\\multirow{{{len(objs)}}}{{*}}{{{d}L}}" if ri == 0 else ""
        name = latex.bold_if(latex.objective_label(o, k_of(sub, o)), o == "dpace")
        cells = [first, name] + [
            latex.cell(v, bold[c][ri], where=f"Table 1 (tab:main), T={t:g}, {d}L, {o}, {columns[c]}")
            for c, v in enumerate(values[ri])]
        for offset, metric in ((-2, "speedup"), (-1, "tau")):
            if (o, int(d), float(t), metric) in significant:
                cells[offset] += SIGNIFICANT
        rows.append(latex.row(cells))
    return rows


def _caption(df: pd.DataFrame, benches: list[str], comparisons: pd.DataFrame | None) -> str:
    temps = sorted(df["temperature"].astype(float).unique())
    depths = sorted(df["depth"].astype(int).unique())
    labels = [latex.escape(target_label_of(df, t)) for t in sorted(df["target"].unique())]
    depth_text = ", ".join(f"{d}L" for d in depths)
    temp_text = ", ".join(latex.temperature_text(t) for t in temps)
    caption = (
        r"\textbf{Main result.} Decoding speedup (SR) and average emitted length ($\tau$) on "
        f"{len(benches)} benchmarks at draft depth{'s' if len(depths) > 1 else ''} ({depth_text}) and "
        f"temperature{'s' if len(temps) > 1 else ''} ($T{{=}}{temp_text}$) for DFlash drafts of "
        f"{latex.join_words(labels)} at {latex.epoch_phrase(df)}."
    )
    described = latex.describe_objectives(df["objective"].unique())
    if described:
        caption += " " + described
    seeds = int(df["num_seeds"].max()) if "num_seeds" in df.columns else 1
    if seeds > 1:
        caption += f" Each value is the mean over {seeds} training seeds of the drafter."
    if comparisons is not None:
        over = "training seeds and prompts" if seeds > 1 else "prompts"
        caption += (
            f" {SIGNIFICANT}: the average differs from DFlash's at the same depth and temperature (95\\% paired "
            f"bootstrap interval over {over} excludes 0)."
        )
    return caption


def table_main(metrics: pd.DataFrame, *, epoch: int | None = None, comparisons: pd.DataFrame | None = None) -> str:
    """Table 1 (``tab:main``): SR and tau per benchmark and their average, rows objective x depth x
    temperature, from the final epoch of experiment ``main``; best per column within each (T, depth).
    With ``comparisons`` (``dpace.report.intervals.experiment_comparisons``), an average that differs significantly
    from DFlash's is marked with a dagger."""
    df = final_epoch_rows(experiment_rows(prepared_metrics(metrics), "main"), epoch, "experiment 'main'")
    significant = significant_differences(comparisons, "main", int(df["epoch"].iloc[0]))
    check_unique(df, ["objective", "depth", "temperature", "benchmark"], "experiment 'main'")
    benches = present_benchmarks(df)
    temps = sorted(df["temperature"].astype(float).unique())
    depths = sorted(df["depth"].astype(int).unique())
    ncols = 2 + 2 * (len(benches) + 1)
    spec, body = _header(benches)
    for ti, t in enumerate(temps):
        at_t = df[np.isclose(df["temperature"].astype(float), t)]
        body.append(f"\\multicolumn{{{ncols}}}{{c}}{{\\emph{{Temperature}} $T = {latex.temperature_text(t)}$}} \\\\")
        body.append(r"\midrule")
        t_depths = [d for d in depths if (at_t["depth"].astype(int) == d).any()]
        for di, d in enumerate(t_depths):
            body += _depth_rows(at_t[at_t["depth"].astype(int) == d], benches, (t, d), significant)
            last = ti == len(temps) - 1 and di == len(t_depths) - 1
            body.append(r"\bottomrule" if last else r"\midrule")
    return latex.table(body, spec=spec, caption=_caption(df, benches, comparisons), label="tab:main",
                       size=r"\footnotesize", tabcolsep="3.2pt", resize=True)
