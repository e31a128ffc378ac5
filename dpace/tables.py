"""LaTeX renderings of the paper's tables (and two extension tables) from tidy metrics.

Every public ``table_*`` function is pure: it takes DataFrames and returns one LaTeX ``table``
environment as a string (booktabs rules; ``\\multirow`` and ``\\resizebox`` need the ``multirow`` and
``graphicx`` packages).  Nothing here reads files or knows about Snakemake.

Input contract (see the project brief; only these columns are used):

* ``metrics`` -- one row per (variant, epoch, benchmark, temperature) with ``target``,
  ``target_label``, ``variant``, ``experiment``, ``objective``, ``depth``, ``block_size``, ``alpha``,
  ``epoch``, ``benchmark``, ``temperature``, ``tau``, ``speedup``; ``normalization`` for
  :func:`table_normalization`; an optional ``k`` names the top-k of ``topk-prefix`` runs.
* ``train_runs`` -- per-run summary with ``variant``, ``objective``, ``block_size``, ``steps``,
  ``time_per_epoch_s``, ``time_per_step_s`` (``epochs`` unused).
* ``blocks`` -- per-block decoding records with ``variant``, ``benchmark``, ``temperature``,
  ``prompt_index``, ``tau_block``, ``sum_q``, ``surrogate``.

Conventions shared by all tables:

* "final epoch" means each variant's last evaluated epoch unless ``epoch=`` is given;
* averages are taken over the benchmarks present in the table; a run that lacks one of them
  gets ``--`` rather than an average over fewer benchmarks;
* a table for experiment G takes its rows from G; the reference runs a paper table shares with the
  main experiment (the DFlash / D-PACE rows of the same target, depth and block size) are
  borrowed from experiment ``main`` when G lacks them;
* the best value of each row group is bold (ties at the displayed precision all bold; a single
  candidate is not bold), and the D-PACE method label is bold as in the paper;
* a missing experiment raises ``ValueError`` naming it; duplicated runs raise too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from dpace.experiments import TABLES
from dpace.metrics_frame import (
    CONFIG,
    benchmark_averages,
    check_unique,
    config_mask,
    distinct_configs,
    final_epoch_rows,
    is_finite,
    prepared_metrics,
    present_benchmarks,
    require_columns,
    rows_at_temperature,
    target_label_of,
)
from dpace.objectives import DEFAULT_ALPHA, REGISTRY, Objective

BENCHMARK_LABELS: dict[str, str] = {
    "gsm8k": "GSM8K",
    "math500": "MATH-500",
    "humaneval": "HumanEval",
    "mbpp": "MBPP",
    "mt_bench": "MT-Bench",
    "alpaca": "Alpaca",
}
BENCHMARK_CATEGORIES: dict[str, str] = {
    "gsm8k": "Math",
    "math500": "Math",
    "humaneval": "Code",
    "mbpp": "Code",
    "mt_bench": "Chat",
    "alpaca": "Chat",
}
# Row order, labels and caption wording come from each objective's record (dpace.objectives.REGISTRY), read
# when a table is rendered; which objectives a table shows comes from its experiment's rows (its config).
# DFlash and D-PACE are the baseline and the method: captions name them in their own words.
NAMED_IN_CAPTIONS: tuple[str, ...] = ("dflash", "dpace")
NORMALIZATION_ORDER: tuple[str, ...] = ("batch", "anchor", "weight", "token", "default")
BLOCK_COLUMNS: tuple[str, ...] = ("variant", "benchmark", "temperature", "tau_block", "sum_q", "surrogate")
TRAIN_RUN_COLUMNS: tuple[str, ...] = (
    "variant",
    "objective",
    "block_size",
    "steps",
    "time_per_epoch_s",
    "time_per_step_s",
)

MISSING = "--"


# --------------------------------------------------------------------------------------------
# small formatting helpers
# --------------------------------------------------------------------------------------------


def fmt(x: object, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals, or ``--`` for missing / non-finite values."""
    return f"{float(x):.{digits}f}" if is_finite(x) else MISSING  # type: ignore[arg-type]


def _cell(x: object, bold: bool = False, *, math_mode: bool = False, digits: int = 2) -> str:
    s = fmt(x, digits)
    if s == MISSING:
        return s
    if math_mode:
        return f"$\\mathbf{{{s}}}$" if bold else f"${s}$"
    return f"\\textbf{{{s}}}" if bold else s


def _best(values: Sequence[object], digits: int = 2, *, higher: bool = True) -> list[bool]:
    """Which entries are best at the displayed precision (all ties); none if < 2 candidates."""
    rounded = [round(float(v), digits) if is_finite(v) else None for v in values]  # type: ignore[arg-type]
    finite = [v for v in rounded if v is not None]
    if len(finite) < 2:
        return [False] * len(values)
    target = max(finite) if higher else min(finite)
    return [v is not None and v == target for v in rounded]


def tex_escape(text: object) -> str:
    """Escape LaTeX specials in free text such as target labels."""
    out = str(text)
    for ch, rep in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"),
                    ("#", r"\#"), ("_", r"\_"), ("{", r"\{"), ("}", r"\}")):
        out = out.replace(ch, rep)
    return out


def _num_text(x: float) -> str:
    """Compact number for captions/headers: 0.0, 0.5, 0.25, 1."""
    return f"{x:.1f}" if round(x, 1) == x else f"{x:g}"


def _temp_text(t: float) -> str:
    return f"{t:g}"


def _row(cells: Iterable[str]) -> str:
    return " & ".join(cells) + r" \\"


def objective_record_of(objective: str) -> Objective:
    """The registry record of an objective a table or figure is about to show; one without a record is an
    error naming it (a table never drops its row)."""
    if objective not in REGISTRY:
        raise ValueError(f"objective {objective!r} has no record in dpace.objectives.REGISTRY: no table or figure "
                         f"can order, label or describe it (records: {', '.join(REGISTRY)})")
    return REGISTRY[objective]


def objective_label(objective: str, k: object = None) -> str:
    """Display name of an objective (``k`` names the top-k of the prefix-mask baseline)."""
    record = objective_record_of(objective)
    return record.display_label(k=int(float(k)) if is_finite(k) else None)  # type: ignore[arg-type]


def describe_objectives(objectives: Iterable[str]) -> str:
    """Caption sentences introducing each shown objective in row order, from its record:
    "``Top-$k$ prefix mask'' is the hard-mask baseline adapted from GRIFFIN; ...". DFlash and D-PACE
    are left to the caption; any other objective without caption wording is an error naming it."""
    parts = []
    for objective in sort_objectives(objectives):
        if objective in NAMED_IN_CAPTIONS:
            continue
        record = objective_record_of(objective)
        if not record.caption:
            raise ValueError(f"objective {objective!r} has no caption wording in its record "
                             "(dpace.objectives.REGISTRY, field caption): no caption can introduce it")
        parts.append(f"``{record.symbolic_label()}'' {record.caption}")
    return "; ".join(parts) + "." if parts else ""


def benchmark_label(benchmark: str) -> str:
    return BENCHMARK_LABELS.get(benchmark, tex_escape(benchmark))


def _bold_if(label: str, condition: bool) -> str:
    return f"\\textbf{{{label}}}" if condition else label


def _table(
    body: Sequence[str],
    *,
    spec: str,
    caption: str,
    label: str,
    size: str = r"\small",
    tabcolsep: str | None = None,
    resize: bool = False,
    placement: str = "t",
) -> str:
    lines = [f"\\begin{{table}}[{placement}]", r"\centering", f"\\caption{{{caption}}}", f"\\label{{{label}}}"]
    lines.append(size)
    if tabcolsep:
        lines.append(f"\\setlength{{\\tabcolsep}}{{{tabcolsep}}}")
    if resize:
        lines.append(r"\resizebox{\linewidth}{!}{%")
    lines.append(f"\\begin{{tabular}}{{{spec}}}")
    lines.extend(body)
    lines.append(r"\end{tabular}")
    if resize:
        lines.append("}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# data selection helpers
# --------------------------------------------------------------------------------------------


def _experiment_rows(df: pd.DataFrame, experiment: str) -> pd.DataFrame:
    rows = df[df["experiment"] == experiment]
    if rows.empty:
        experiments = sorted(map(str, df["experiment"].dropna().unique()))
        raise ValueError(f"metrics has no rows for experiment {experiment!r} (experiments present: {experiments})")
    return rows


def _complete(
    df: pd.DataFrame,
    experiment: str,
    *,
    objectives: Iterable[str] | None = None,
    borrow: Iterable[str] = (),
    config_cols: Sequence[str] = CONFIG,
    key_cols: Sequence[str] = ("objective",),
    sources: Sequence[str] = ("main",),
) -> pd.DataFrame:
    """Rows of ``experiment`` (restricted to ``objectives``), plus runs of the ``borrow`` objectives that
    the experiment lacks for one of its configurations, taken from the ``sources`` experiments in order.

    A run is identified by ``config_cols + key_cols``; the experiment's own runs always win.
    """
    own = _experiment_rows(df, experiment)
    configs = own[list(config_cols)].drop_duplicates()
    if objectives is not None:
        own = own[own["objective"].isin(list(objectives))]
    ident = [*config_cols, *key_cols]
    have = set(map(tuple, own[ident].drop_duplicates().itertuples(index=False)))
    parts = [own]
    borrow = list(borrow)
    for src in sources:
        if src == experiment or not borrow:
            continue
        cand = df[(df["experiment"] == src) & df["objective"].isin(borrow)]
        if cand.empty:
            continue
        cand = cand.merge(configs, on=list(config_cols), how="inner")
        keys = list(map(tuple, cand[ident].itertuples(index=False)))
        cand = cand[[k not in have for k in keys]]
        if cand.empty:
            continue
        n_variants = cand.groupby(ident, dropna=False)["variant"].nunique()
        if (n_variants > 1).any():
            bad = n_variants[n_variants > 1].index.tolist()
            raise ValueError(f"cannot borrow runs from experiment {src!r} for {experiment!r}: ambiguous {ident}={bad}")
        have |= set(map(tuple, cand[ident].drop_duplicates().itertuples(index=False)))
        parts.append(cand)
    return pd.concat(parts, ignore_index=True)


def _objective_rank(objective: str) -> int:
    return objective_record_of(objective).table_rank


def sort_objectives(objectives: Iterable[str]) -> list[str]:
    """Distinct objectives in row order: their records' ``table_rank`` (an objective without a record raises)."""
    return sorted(dict.fromkeys(objectives), key=lambda o: (_objective_rank(o), o))


def _k_of(df: pd.DataFrame, objective: str) -> object:
    if "k" not in df.columns:
        return None
    ks = df.loc[df["objective"] == objective, "k"].dropna().unique()
    return ks[0] if len(ks) == 1 else None


def _config_label(target_label: object, depth: object, block_size: object) -> str:
    return f"{tex_escape(target_label)}, {int(depth)}L, $B{{=}}{int(block_size)}$"


def _epoch_phrase(df: pd.DataFrame) -> str:
    epochs = sorted(df["epoch"].dropna().unique())
    return f"epoch~{int(epochs[0])}" if len(epochs) == 1 else "the final epoch"


def _join_words(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# --------------------------------------------------------------------------------------------
# Table 1: main result
# --------------------------------------------------------------------------------------------


SIGNIFICANT = r"$^{\dagger}$"


def significant_differences(comparisons: pd.DataFrame | None, experiment: str, epoch: int) -> set[tuple]:
    """(objective, depth, temperature, metric) whose average over benchmarks differs significantly
    from the experiment's DFlash drafter (95% paired bootstrap interval without 0; ``dpace.intervals``)."""
    if comparisons is None or comparisons.empty:
        return set()
    rows = comparisons[(comparisons["experiment"] == experiment) & (comparisons["benchmark"] == "avg")
                       & (comparisons["epoch"].astype(int) == int(epoch)) & comparisons["significant"].astype(bool)]
    return {(r.objective, int(r.depth), float(r.temperature), r.metric) for r in rows.itertuples()}


def table_main(metrics: pd.DataFrame, *, epoch: int | None = None, comparisons: pd.DataFrame | None = None) -> str:
    """Table 1 (``tab:main``): SR and tau per benchmark and their average, rows objective x depth x
    temperature, from the final epoch of experiment ``main``; best per column within each (T, depth).
    With ``comparisons`` (``dpace.intervals.experiment_comparisons``), an average that differs significantly
    from DFlash's is marked with a dagger."""
    df = final_epoch_rows(_experiment_rows(prepared_metrics(metrics), "main"), epoch, "experiment 'main'")
    significant = significant_differences(comparisons, "main", int(df["epoch"].iloc[0]))
    check_unique(df, ["objective", "depth", "temperature", "benchmark"], "experiment 'main'")
    benches = present_benchmarks(df)
    temps = sorted(df["temperature"].astype(float).unique())
    depths = sorted(df["depth"].astype(int).unique())
    ncols = 2 + 2 * (len(benches) + 1)

    spec = "cl|" + "|".join(["cc"] * (len(benches) + 1))
    # category row (Math / Code / Chat), merged over consecutive benchmarks
    cats: list[tuple[str, int]] = []
    for b in benches:
        cat = BENCHMARK_CATEGORIES.get(b, "Other")
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
    bench_cells = ["", ""] + [f"\\multicolumn{{2}}{{c|}}{{{benchmark_label(b)}}}" for b in benches]
    bench_cells.append(r"\multicolumn{2}{c}{Avg.}")
    metric_cells = ["Depth", "Method"] + ["SR", r"$\tau$"] * (len(benches) + 1)
    body = [r"\toprule", _row(cat_cells), "".join(cmids), _row(bench_cells), _row(metric_cells), r"\midrule"]

    for ti, t in enumerate(temps):
        at_t = df[np.isclose(df["temperature"].astype(float), t)]
        body.append(f"\\multicolumn{{{ncols}}}{{c}}{{\\emph{{Temperature}} $T = {_temp_text(t)}$}} \\\\")
        body.append(r"\midrule")
        t_depths = [d for d in depths if (at_t["depth"].astype(int) == d).any()]
        for di, d in enumerate(t_depths):
            sub = at_t[at_t["depth"].astype(int) == d]
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
            bold = [_best([v[c] for v in values]) for c in range(len(values[0]))]
            for ri, o in enumerate(objs):
                first = f"\\multirow{{{len(objs)}}}{{*}}{{{d}L}}" if ri == 0 else ""
                name = _bold_if(objective_label(o, _k_of(sub, o)), o == "dpace")
                cells = [first, name] + [_cell(v, bold[c][ri]) for c, v in enumerate(values[ri])]
                for offset, metric in ((-2, "speedup"), (-1, "tau")):
                    if (o, int(d), float(t), metric) in significant:
                        cells[offset] += SIGNIFICANT
                body.append(_row(cells))
            last = ti == len(temps) - 1 and di == len(t_depths) - 1
            body.append(r"\bottomrule" if last else r"\midrule")

    labels = [tex_escape(target_label_of(df, t)) for t in sorted(df["target"].unique())]
    depth_text = ", ".join(f"{d}L" for d in depths)
    temp_text = ", ".join(_temp_text(t) for t in temps)
    caption = (
        r"\textbf{Main result.} Decoding speedup (SR) and average emitted length ($\tau$) on "
        f"{len(benches)} benchmarks at draft depth{'s' if len(depths) > 1 else ''} ({depth_text}) and "
        f"temperature{'s' if len(temps) > 1 else ''} ($T{{=}}{temp_text}$) for DFlash drafts of "
        f"{_join_words(labels)} at {_epoch_phrase(df)}."
    )
    described = describe_objectives(df["objective"].unique())
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
    return _table(body, spec=spec, caption=caption, label="tab:main", size=r"\footnotesize",
                  tabcolsep="3.2pt", resize=True)


# --------------------------------------------------------------------------------------------
# Table 2: cross-model generalisation
# --------------------------------------------------------------------------------------------


def table_cross_model(metrics: pd.DataFrame, *, epoch: int | None = None, temperature: float = 0.0) -> str:
    """Table 2 (``tab:cross-model``): per-benchmark ``SR / tau`` of DFlash vs D-PACE per target.

    Uses experiment ``cross_model`` (borrowing missing DFlash / D-PACE runs of the same configuration
    from ``main``).  Without any ``cross_model`` rows, a study with a single target falls back to
    the main experiment's DFlash / D-PACE rows at its shallowest depth.
    """
    df = prepared_metrics(metrics)
    if (df["experiment"] == "cross_model").any():
        rows = _complete(df, "cross_model", objectives=("dflash", "dpace"), borrow=("dflash", "dpace"))
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
    body = [r"\toprule", _row(["Target", "Method"] + [benchmark_label(b) for b in benches]), r"\midrule"]
    for ci, (target, depth, bsize) in enumerate(configs):
        sub = rows[(rows["target"] == target) & (rows["depth"] == depth) & (rows["block_size"] == bsize)]
        tl = target_label_of(rows, target)
        shown = tex_escape(tl) if label_counts[tl] == 1 else _config_label(tl, depth, bsize)
        objs = sort_objectives(sub["objective"].unique())
        sr = {o: sub[sub["objective"] == o].set_index("benchmark")["speedup"] for o in objs}
        tau = {o: sub[sub["objective"] == o].set_index("benchmark")["tau"] for o in objs}
        cells_by_obj: dict[str, list[str]] = {o: [] for o in objs}
        for b in benches:
            sr_vals = [sr[o].get(b, np.nan) for o in objs]
            tau_vals = [tau[o].get(b, np.nan) for o in objs]
            sr_bold, tau_bold = _best(sr_vals), _best(tau_vals)
            for i, o in enumerate(objs):
                if sr_bold[i] and tau_bold[i]:
                    cell = f"\\textbf{{{fmt(sr_vals[i])} / {fmt(tau_vals[i])}}}"
                else:
                    cell = f"{_cell(sr_vals[i], sr_bold[i])} / {_cell(tau_vals[i], tau_bold[i])}"
                cells_by_obj[o].append(cell)
        for ri, o in enumerate(objs):
            first = f"\\multirow{{{len(objs)}}}{{*}}{{{shown}}}" if ri == 0 else ""
            body.append(_row([first, _bold_if(objective_label(o), o == "dpace")] + cells_by_obj[o]))
        body.append(r"\bottomrule" if ci == len(configs) - 1 else r"\midrule")

    depths = sorted({int(c[1]) for c in configs})
    targets = [tex_escape(target_label_of(rows, t)) for t in dict.fromkeys(c[0] for c in configs)]
    caption = (
        r"\textbf{Generalization to other targets.} Per-benchmark SR / $\tau$ at "
        f"$T{{=}}{_temp_text(temperature)}$ for {'/'.join(f'{d}L' for d in depths)} drafters of "
        f"{_join_words(targets)} ({_epoch_phrase(rows)})."
    )
    return _table(body, spec=spec, caption=caption, label="tab:cross-model", tabcolsep="4pt")


# --------------------------------------------------------------------------------------------
# Table 3: component ablation over epochs
# --------------------------------------------------------------------------------------------

def ablation_trajectories(
    metrics: pd.DataFrame, *, benchmark: str = "math500", temperature: float = 0.0
) -> pd.DataFrame:
    """Long frame (config, objective, epoch, tau) of the ablation runs on ``benchmark`` at
    ``temperature`` (experiment ``ablation``, every objective it trained; DFlash / D-PACE borrowed from
    ``main`` if absent)."""
    df = prepared_metrics(metrics)
    rows = _complete(df, "ablation", borrow=("dflash", "dpace"))
    what = "experiment 'ablation'"
    rows = rows[rows["benchmark"] == benchmark]
    if rows.empty:
        raise ValueError(f"{what}: no rows for benchmark {benchmark!r}")
    rows = rows_at_temperature(rows, temperature, what)
    check_unique(rows, [*CONFIG, "objective", "epoch"], what)
    return rows[[*CONFIG, "target_label", "objective", "epoch", "tau"]].sort_values(
        [*CONFIG, "objective", "epoch"], ignore_index=True
    )


def table_ablation(metrics: pd.DataFrame, *, benchmark: str = "math500", temperature: float = 0.0) -> str:
    """Table 3 (``tab:ablation-trajectory``): MATH-500 tau at T=0 per epoch for each objective of experiment
    ``ablation`` (the paper: DFlash, continuation-only, cumulative-only, D-PACE); best per epoch column bold."""
    traj = ablation_trajectories(metrics, benchmark=benchmark, temperature=temperature)
    epochs = sorted(traj["epoch"].astype(int).unique())
    configs = distinct_configs(traj)
    ncols = 1 + len(epochs)
    body = [r"\toprule", _row(["Epoch"] + [str(e) for e in epochs]), r"\midrule"]
    for ci, cfg in enumerate(configs):
        sub = traj[config_mask(traj, cfg)]
        if len(configs) > 1:
            label = _config_label(target_label_of(sub, cfg[0]), cfg[1], cfg[2])
            body.append(f"\\multicolumn{{{ncols}}}{{l}}{{\\emph{{{label}}}}} \\\\")
        wide = sub.pivot(index="objective", columns="epoch", values="tau")
        objs = sort_objectives(wide.index)
        values = [[wide.at[o, e] if e in wide.columns else np.nan for e in epochs] for o in objs]
        bold = [_best([v[c] for v in values]) for c in range(len(epochs))]
        for ri, o in enumerate(objs):
            label = _bold_if(objective_record_of(o).comparison_label(), o == "dpace")
            body.append(_row([label] + [_cell(v, bold[c][ri]) for c, v in enumerate(values[ri])]))
        body.append(r"\bottomrule" if ci == len(configs) - 1 else r"\midrule")
    depths = sorted({int(c[1]) for c in configs})
    bname = BENCHMARK_LABELS.get(benchmark, tex_escape(benchmark))
    caption = (
        f"\\textbf{{Component ablation on {bname} ({'/'.join(f'{d}L' for d in depths)}).}} {bname} $\\tau$ "
        f"($T{{=}}{_temp_text(temperature)}$) over training epochs for the DFlash baseline and D-PACE"
    )
    described = describe_objectives(traj["objective"].unique())
    caption += f" next to: {described}" if described else "."
    return _table(body, spec="l" + "c" * len(epochs), caption=caption, label="tab:ablation-trajectory")


# --------------------------------------------------------------------------------------------
# Table 5: smoothing sweep
# --------------------------------------------------------------------------------------------


def table_smoothing(
    metrics: pd.DataFrame, *, epoch: int | None = None, temperature: float = 0.0, default_alpha: float = DEFAULT_ALPHA
) -> str:
    """Table 5 (``tab:smoothing-sweep``): average tau per alpha (D-PACE) plus DFlash, one row per
    (target, depth, B) of experiment ``smoothing``; best per row bold.

    Runs the sweep shares with other experiments (DFlash, D-PACE at the default alpha) are borrowed
    from experiments ``main`` then ``block_size`` when the smoothing experiment lacks them.
    """
    df = prepared_metrics(metrics)
    rows = _complete(df, "smoothing", objectives=("dpace", "dflash"), borrow=("dpace", "dflash"),
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
        f"$\\mathbf{{{_num_text(a)}}}$" if math.isclose(a, default_alpha) else f"${_num_text(a)}$" for a in alphas
    ]
    body = [
        r"\toprule",
        _row(["", f"\\multicolumn{{{n}}}{{c}}{{D-PACE ($\\alpha$)}}", "DFlash"]),
        f"\\cmidrule(lr){{2-{n + 1}}} \\cmidrule(lr){{{n + 2}-{n + 2}}}",
        _row(["", *alpha_cells, "decayed-CE"]),
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
        bold = _best(vals)
        tl = tex_escape(target_label_of(rows, target))
        label = f"{tl} ({int(depth)}L, $B{{=}}{int(bsize)}$)" if len(depths) > 1 else f"{tl} ($B{{=}}{int(bsize)}$)"
        body.append(_row([label] + [_cell(v, b, math_mode=True) for v, b in zip(vals, bold, strict=True)]))
    body.append(r"\bottomrule")
    caption = (
        r"\textbf{Weight smoothing hyperparameter $\alpha$.} Average $\tau$ over the "
        f"{len(present_benchmarks(rows))} benchmarks ($T{{=}}{_temp_text(temperature)}$) at "
        f"{_epoch_phrase(rows)} across {len(configs)} draft configuration{'s' if len(configs) > 1 else ''}."
    )
    return _table(body, spec=spec, caption=caption, label="tab:smoothing-sweep", tabcolsep="5pt")


# --------------------------------------------------------------------------------------------
# Table 4: block size
# --------------------------------------------------------------------------------------------


def _delta(new: float, old: float) -> str:
    if not (is_finite(new) and is_finite(old)) or float(old) == 0.0:
        return MISSING
    return f"${100.0 * (float(new) / float(old) - 1.0):+.1f}$"


def table_block_size(metrics: pd.DataFrame, *, epoch: int | None = None, temperature: float = 0.0) -> str:
    """Table 4 (``tab:block-size``): average SR and tau per block size B, DFlash vs D-PACE, and the
    relative change Delta(%) (experiment ``block_size``; the B of the main runs borrowed from ``main``)."""
    df = prepared_metrics(metrics)
    rows = _complete(df, "block_size", objectives=("dflash", "dpace"), borrow=("dflash", "dpace"),
                     config_cols=("target", "depth"), key_cols=("objective", "block_size"))
    what = "experiment 'block_size'"
    rows = rows_at_temperature(final_epoch_rows(rows, epoch, what), temperature, what)
    avg = benchmark_averages(rows, [*CONFIG, "objective"])
    configs = distinct_configs(avg, ("target", "depth"))
    body = [
        r"\toprule",
        _row(["", r"\multicolumn{2}{c}{DFlash}", r"\multicolumn{2}{c}{D-PACE}", r"\multicolumn{2}{c}{$\Delta$ (\%)}"]),
        r"\cmidrule(lr){2-3} \cmidrule(lr){4-5} \cmidrule(lr){6-7}",
        _row(["$B$", "SR", r"$\tau$", "SR", r"$\tau$", "SR", r"$\tau$"]),
        r"\midrule",
    ]
    for ci, (target, depth) in enumerate(configs):
        sub = avg[(avg["target"] == target) & (avg["depth"] == depth)]
        if len(configs) > 1:
            label = f"{tex_escape(target_label_of(rows, target))}, {int(depth)}L"
            body.append(f"\\multicolumn{{7}}{{l}}{{\\emph{{{label}}}}} \\\\")
        for bsize in sorted(sub["block_size"].astype(int).unique()):
            at_b = sub[sub["block_size"] == bsize].set_index("objective")
            val = {
                (o, c): (at_b.at[o, c] if o in at_b.index else np.nan)
                for o in ("dflash", "dpace")
                for c in ("speedup", "tau")
            }
            cells = [str(bsize)]
            bold = {c: _best([val["dflash", c], val["dpace", c]]) for c in ("speedup", "tau")}
            for i, o in enumerate(("dflash", "dpace")):
                cells += [_cell(val[o, "speedup"], bold["speedup"][i]), _cell(val[o, "tau"], bold["tau"][i])]
            cells += [_delta(val["dpace", c], val["dflash", c]) for c in ("speedup", "tau")]
            body.append(_row(cells))
        body.append(r"\bottomrule" if ci == len(configs) - 1 else r"\midrule")
    targets = [tex_escape(target_label_of(rows, t)) for t in dict.fromkeys(c[0] for c in configs)]
    depths = sorted({int(c[1]) for c in configs})
    n_b = rows["block_size"].nunique()
    caption = (
        r"\textbf{Block size sensitivity.} Average SR and $\tau$ over the "
        f"{len(present_benchmarks(rows))} benchmarks on {_join_words(targets)} "
        f"({'/'.join(f'{d}L' for d in depths)}, $T{{=}}{_temp_text(temperature)}$) at {_epoch_phrase(rows)}, "
        f"across {n_b} block size{'s' if n_b > 1 else ''}."
    )
    return _table(body, spec="lcccccc", caption=caption, label="tab:block-size", tabcolsep="3pt")


# --------------------------------------------------------------------------------------------
# Tables 6, extras, normalization: average SR / tau per method
# --------------------------------------------------------------------------------------------


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
    avgs = {t: benchmark_averages(rows_at_temperature(rows, t, label), keys) for t in temperatures}
    configs = distinct_configs(rows)
    nt = len(temperatures)
    ncols = 1 + 2 * nt
    body = [r"\toprule"]
    if nt > 1:
        body.append(_row([""] + [f"\\multicolumn{{2}}{{c}}{{$T = {_temp_text(t)}$}}" for t in temperatures]))
        body.append(" ".join(f"\\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(nt)))
    body += [_row(["Method"] + ["SR", r"$\tau$"] * nt), r"\midrule"]
    for ci, cfg in enumerate(configs):
        if len(configs) > 1:
            cl = _config_label(target_label_of(rows, cfg[0]), cfg[1], cfg[2])
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
        bold = [_best([v[c] for v in values]) for c in range(2 * nt)]
        for ri, rk in enumerate(rkeys):
            body.append(_row([label_of(rk)] + [_cell(v, bold[c][ri]) for c, v in enumerate(values[ri])]))
        body.append(r"\bottomrule" if ci == len(configs) - 1 else r"\midrule")
    return _table(body, spec="l" + "cc" * nt, caption=caption, label=label)


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
    rows = _complete(df, "target_prob", objectives=tuple(TARGET_PROB_LABELS), borrow=("dflash", "dpace"))
    what = "experiment 'target_prob'"
    rows = final_epoch_rows(rows, epoch, what)
    temps = _temperatures(rows, "target_prob", temperatures)
    depths = sorted(rows["depth"].astype(int).unique())
    caption = (
        r"\textbf{Target-probability surrogate.} Average SR and $\tau$ over the "
        f"{len(present_benchmarks(rows))} benchmarks on the {'/'.join(f'{d}L' for d in depths)} draft at "
        f"{_epoch_phrase(rows)} ($T{{=}}{', '.join(_temp_text(t) for t in temps)}$). \\emph{{D-PACE (target prob)}} "
        "replaces the draft probability with the target probability on the same token in the D-PACE weight."
    )
    return _avg_table(
        rows,
        row_keys=("objective",),
        order=lambda k: (_objective_rank(k[0]), k[0]),
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
    rows = _complete(df, "extras", borrow=("dflash", "dpace"))
    what = "experiment 'extras'"
    rows = final_epoch_rows(rows, epoch, what)
    temps = _temperatures(rows, "extras", temperatures)
    caption = (
        r"\textbf{Further objectives.} Average SR and $\tau$ over the "
        f"{len(present_benchmarks(rows))} benchmarks at {_epoch_phrase(rows)} ($T{{=}}{', '.join(map(_temp_text, temps))}$): "
        "the DFlash baseline and D-PACE"
    )
    described = describe_objectives(rows["objective"].unique())
    caption += f" next to further objectives. {described}" if described else "."
    return _avg_table(
        rows,
        row_keys=("objective",),
        order=lambda k: (_objective_rank(k[0]), k[0]),
        label_of=lambda k: _bold_if(objective_label(k[0], _k_of(rows, k[0])), k[0] == "dpace"),
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
    rows = _complete(df, "normalization", borrow=("dflash",), key_cols=("objective", "normalization"))
    what = "experiment 'normalization'"
    rows = final_epoch_rows(rows, epoch, what)
    temps = _temperatures(rows, "normalization", temperatures)

    def label_of(k: tuple) -> str:
        obj, norm = k
        if obj == "dflash":
            return objective_record_of("dflash").comparison_label()
        return f"{objective_label(obj)} ({tex_escape(norm)})"

    caption = (
        r"\textbf{Loss normalization.} Average SR and $\tau$ over the "
        f"{len(present_benchmarks(rows))} benchmarks at {_epoch_phrase(rows)} ($T{{=}}{', '.join(map(_temp_text, temps))}$) "
        "for D-PACE normalized per batch, "
        "per anchor, by the weight sum or per token, with the DFlash baseline as reference."
    )
    return _avg_table(
        rows,
        row_keys=("objective", "normalization"),
        order=lambda k: (k[0] != "dflash", _objective_rank(k[0]), _normalization_rank(k[1]), k[1]),
        label_of=label_of,
        temperatures=temps,
        caption=caption,
        label="tab:normalization",
    )


# --------------------------------------------------------------------------------------------
# Table 7: training time
# --------------------------------------------------------------------------------------------


def _mmss(seconds: object) -> str:
    if not is_finite(seconds):
        return MISSING
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
    body = [r"\toprule", _row(header), r"\midrule"]

    def ms(seconds) -> str:
        return f"{float(seconds) * 1000:.0f}~ms" if is_finite(seconds) else MISSING

    def per_iteration(r):
        accumulation = r.get("grad_accumulation", math.nan)
        return float(r["time_per_step_s"]) / float(accumulation) if is_finite(accumulation) else math.nan

    for o, r in by_obj.items():
        body.append(_row([labels[o], _mmss(r["time_per_epoch_s"]), ms(per_iteration(r)), ms(r["time_per_step_s"])]))
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
    return _table(body, spec="lccc", caption=caption, label="tab:training-time")


# --------------------------------------------------------------------------------------------
# Table 8: confidence--acceptance correlation
# --------------------------------------------------------------------------------------------


def select_blocks(
    blocks: pd.DataFrame,
    *,
    variant: str | None = None,
    benchmark: str | None = "math500",
    temperature: float | None = 0.0,
    epoch: int | None = None,
) -> pd.DataFrame:
    """Per-block records of one variant on ``benchmark`` at ``temperature`` (None: no filter).

    When ``blocks`` has an ``epoch`` column, only ``epoch`` (default: the latest one) is kept.
    """
    require_columns(blocks, BLOCK_COLUMNS, "blocks")
    rows = blocks
    if benchmark is not None:
        rows = rows[rows["benchmark"] == benchmark]
    if temperature is not None:
        rows = rows[np.isclose(rows["temperature"].astype(float), float(temperature))]
    if variant is not None:
        rows = rows[rows["variant"] == variant]
    elif rows["variant"].nunique() > 1:
        raise ValueError(f"blocks holds several variants {sorted(rows['variant'].unique())}; pass variant=")
    if "epoch" in rows.columns and len(rows):
        rows = rows[rows["epoch"] == (rows["epoch"].max() if epoch is None else epoch)]
    rows = rows.dropna(subset=["tau_block", "sum_q", "surrogate"])
    if len(rows) < 3:
        raise ValueError(
            f"blocks: {len(rows)} usable block(s) for variant={variant!r}, benchmark={benchmark!r}, "
            f"temperature={temperature!r}; need at least 3"
        )
    return rows


def block_correlations(blocks: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Spearman (rho, p) of ``sum_q`` and of ``surrogate`` with ``tau_block``."""
    out = {}
    for col in ("sum_q", "surrogate"):
        res = stats.spearmanr(blocks[col].astype(float), blocks["tau_block"].astype(float))
        out[col] = (float(res.statistic), float(res.pvalue))
    return out


def _pvalue_text(p: float) -> str:
    if not is_finite(p):
        return MISSING
    if p < 1e-10:
        return r"$<10^{-10}$"
    if p < 1e-3:
        mant, exp = f"{p:.1e}".split("e")
        return f"${mant}\\times 10^{{{int(exp)}}}$"
    return f"${p:.3f}$"


def table_correlation(
    blocks: pd.DataFrame,
    *,
    variant: str | None = None,
    benchmark: str | None = "math500",
    temperature: float | None = 0.0,
    epoch: int | None = None,
) -> str:
    """Table 8 (``tab:correlation``): Spearman rho (and p) of ``sum_q`` and of the surrogate
    ``S~`` with the per-block emitted length; the larger rho bold."""
    rows = select_blocks(blocks, variant=variant, benchmark=benchmark, temperature=temperature, epoch=epoch)
    corr = block_correlations(rows)
    rhos = [corr["sum_q"][0], corr["surrogate"][0]]
    bold = _best(rhos)
    names = [r"$\sum_i q_i$", r"$\tilde S = \sum_{k}\prod_{i\le k} q_i$"]
    body = [r"\toprule", _row(["Per-block statistic", r"Spearman $\rho$", "$p$"]), r"\midrule"]
    for name, col, b in zip(names, ("sum_q", "surrogate"), bold, strict=True):
        rho, p = corr[col]
        body.append(_row([name, _cell(rho, b, math_mode=True), _pvalue_text(p)]))
    body.append(r"\bottomrule")
    n_prompts = rows["prompt_index"].nunique() if "prompt_index" in rows.columns else None
    where = f" on {n_prompts} {BENCHMARK_LABELS.get(benchmark, tex_escape(benchmark))} prompts" if (
        n_prompts and benchmark) else ""
    caption = (
        r"Per-block Spearman rank correlation between reported $\tau_b$ and two block-level confidence "
        f"statistics over {len(rows)} blocks{where} (variant {tex_escape(rows['variant'].iloc[0])}). "
        r"$\sum_i q_i$ sums per-position draft confidence, while $\tilde S=\sum_{k=1}^{B}\prod_{i\le k}q_i$ "
        r"sums cumulative prefix-confidence terms."
    )
    return _table(body, spec="lcc", caption=caption, label="tab:correlation", placement="h")


__all__ = [
    "BENCHMARK_LABELS",
    "NAMED_IN_CAPTIONS",
    "ablation_trajectories",
    "block_correlations",
    "fmt",
    "describe_objectives",
    "objective_label",
    "objective_record_of",
    "select_blocks",
    "sort_objectives",
    *TABLES,  # one function per table of the registry (dpace.experiments.ARTIFACTS)
]
