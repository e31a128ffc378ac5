"""The paper's figures from tidy metrics, training-step and per-block records.

Each ``fig_*`` function draws one figure with matplotlib's object-oriented API (no pyplot state,
Agg rendering), writes a PDF and a PNG preview and returns ``(pdf_path, png_path)``.  The matching
``*_figure`` function returns the :class:`matplotlib.figure.Figure` itself (for tests / notebooks)
and the ``*_data`` helpers return the numbers drawn.

Columns used (see :mod:`dpace.report.tables` for the metrics contract):

* ``blocks``: ``variant``, ``benchmark``, ``temperature``, ``tau_block``, ``surrogate`` (``sum_q`` and
  ``prompt_index`` are not drawn);
* ``metrics``: ``target``, ``target_label``, ``variant``, ``experiment``, ``objective``, ``depth``,
  ``block_size``, ``alpha``, ``epoch``, ``benchmark``, ``temperature``, ``tau``, ``speedup``;
* ``train_steps``: ``variant``, ``objective``, ``epoch``, ``step``, ``epoch_progress`` and the
  per-position weights ``w_0 ... w_{B-1}`` (``w_0`` is the anchor and is not drawn).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps, rc_context
from matplotlib.figure import Figure

from dpace.experiments import ARTIFACTS, FIGURES, MATH500_AT_T0
from dpace.io import atomic_file
from dpace.objective_records import REGISTRY
from dpace.report import metrics_frame
from dpace.report.latex import BENCHMARK_LABELS

__all__ = [
    "STYLE",
    *FIGURES,  # one function per figure of the registry (dpace.experiments.ARTIFACTS)
    "motivation_data",
    "motivation_figure",
    "objective_color",
    "per_step_weights",
    "save_figure",
    "surrogate_bins",
    "tau_gain_bars",
    "tau_trajectory_figure",
    "weight_dynamics_figure",
    "weight_profiles",
]

STYLE: dict[str, object] = {
    "font.size": 10,
    "axes.labelsize": 11,
    "axes.titlesize": 11,
    "legend.fontsize": 8.5,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "pdf.fonttype": 42,  # embed TrueType so the PDF text stays editable / searchable
    "svg.fonttype": "none",
}
PNG_DPI = 150
# Each objective's colour is in its record (dpace.objective_records.REGISTRY).
DFLASH_COLOR = REGISTRY["dflash"].color
DPACE_COLOR = REGISTRY["dpace"].color
_WEIGHT_COL = re.compile(r"^w_(\d+)$")


def objective_color(objective: str) -> str:
    """The colour of an objective's lines, from its record; one without a colour is an error naming it."""
    record = metrics_frame.objective_record_of(objective)
    if not record.color:
        raise ValueError(f"objective {objective!r} has no colour in its record (dpace.objective_records.REGISTRY, field "
                         "color): no figure can draw it")
    return record.color


def save_figure(fig: Figure, out_pdf: str | Path, out_png: str | Path, *, dpi: int = PNG_DPI) -> tuple[Path, Path]:
    """Write ``fig`` as a (reproducible, no creation date) PDF and a PNG preview."""
    pdf, png = Path(out_pdf), Path(out_png)
    with rc_context(STYLE):
        with atomic_file(pdf) as tmp:
            fig.savefig(tmp, format="pdf", metadata={"CreationDate": None, "ModDate": None})
        with atomic_file(png) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None})
    return pdf, png


def _panel_tag(ax, tag: str) -> None:
    ax.set_title(f"({tag})", loc="left", fontweight="bold")


def _warn_of_skipped_requests(fig: Figure, metrics: pd.DataFrame) -> None:
    """The tables' and the scorecard's warning, on the figure: a red title when an evaluation it draws
    skipped requests past the target's context (``skipped_too_long``), as its points then rest on fewer
    requests than planned."""
    skipped = metrics_frame.skipped_evaluations(metrics)
    if not skipped.empty:
        fig.suptitle(f"WARNING: {int(skipped['skipped_too_long'].sum())} request(s) past the target's context were skipped\n"
                     "(skipped_too_long): these points rest on fewer requests than planned", color="red", fontsize=8)


def _at_temperature(metrics: pd.DataFrame, temperature: float) -> pd.DataFrame:
    return metrics[np.isclose(pd.to_numeric(metrics["temperature"]), temperature)]


# --------------------------------------------------------------------------------------------
# Figure 1: surrogate vs emitted length, and tau gains across configurations
# --------------------------------------------------------------------------------------------


def surrogate_bins(blocks: pd.DataFrame, n_bins: int = 12) -> pd.DataFrame:
    """Equal-width bins of ``surrogate``: mean S~ (``x``), mean / std (ddof 0) of ``tau_block`` and
    the block count of every non-empty bin."""
    s = blocks["surrogate"].astype(float).to_numpy()
    tau = blocks["tau_block"].astype(float).to_numpy()
    lo, hi = float(np.min(s)), float(np.max(s))
    edges = np.linspace(lo, hi, n_bins + 1) if hi > lo else np.array([lo - 0.5, hi + 0.5])
    idx = np.clip(np.digitize(s, edges[1:-1], right=False), 0, len(edges) - 2)
    frame = pd.DataFrame({"bin": idx, "s": s, "tau": tau})
    out = frame.groupby("bin").agg(x=("s", "mean"), tau_mean=("tau", "mean"), count=("tau", "size"))
    out["tau_std"] = frame.groupby("bin")["tau"].std(ddof=0)
    return out.reset_index()[["bin", "x", "tau_mean", "tau_std", "count"]]


def tau_gain_bars(
    metrics: pd.DataFrame,
    *,
    experiments: Sequence[str] = ARTIFACTS["fig_motivation"].experiments,
    temperature: float = MATH500_AT_T0.temperature,
    epoch: int | None = None,
) -> pd.DataFrame:
    """Average tau (over benchmarks) of DFlash and D-PACE per configuration (target, depth, B) of
    ``experiments`` (earlier experiments win a configuration present in several), with the relative gain (%)."""
    df = metrics_frame.prepared_metrics(metrics)
    df = df[df["experiment"].isin(list(experiments)) & df["objective"].isin(["dflash", "dpace"])]
    if df.empty:
        raise ValueError(f"metrics has no DFlash / D-PACE rows for experiments {list(experiments)}")
    what = f"experiments {list(experiments)}"
    df = metrics_frame.rows_at_temperature(metrics_frame.final_epoch_rows(df, epoch, what), temperature, what)
    records = []
    rank = {g: i for i, g in enumerate(experiments)}

    def first_experiment(cfg: tuple) -> int:
        mask = metrics_frame.config_mask(df, cfg)
        return min(rank[g] for g in df.loc[mask, "experiment"].unique())

    for cfg in sorted(metrics_frame.distinct_configs(df), key=first_experiment):  # stable: experiment order, then config
        sub = df[metrics_frame.config_mask(df, cfg)]
        rec = dict(zip(metrics_frame.CONFIG, cfg, strict=True))
        rec["target_label"] = metrics_frame.target_label_of(sub, cfg[0])
        benches = metrics_frame.present_benchmarks(sub)
        for obj in ("dflash", "dpace"):
            runs = sub[sub["objective"] == obj]
            chosen = next((g for g in experiments if (runs["experiment"] == g).any()), None)
            runs = runs[runs["experiment"] == chosen] if chosen is not None else runs
            if runs["variant"].nunique() > 1:
                raise ValueError(f"several {obj} runs for configuration {cfg}: {sorted(runs['variant'].unique())}")
            avg = metrics_frame.benchmark_averages(runs, ["objective"], benches) if len(runs) else None
            rec[obj] = float(avg["tau"].iloc[0]) if avg is not None else np.nan
        records.append(rec)
    out = pd.DataFrame.from_records(records)
    out = out.dropna(subset=["dflash", "dpace"]).reset_index(drop=True)
    if out.empty:
        raise ValueError(f"no configuration of experiments {list(experiments)} has both DFlash and D-PACE at T={temperature:g}")
    out["gain_pct"] = 100.0 * (out["dpace"] / out["dflash"] - 1.0)
    out["label"] = [
        f"{r.target_label}\n{int(r.depth)}L, B={int(r.block_size)}" for r in out.itertuples(index=False)
    ]
    return out


def motivation_data(
    blocks: pd.DataFrame,
    metrics: pd.DataFrame,
    *,
    variant: str | None = None,
    benchmark: str | None = MATH500_AT_T0.benchmark,
    temperature: float = MATH500_AT_T0.temperature,
    n_bins: int = 12,
    experiments: Sequence[str] = ARTIFACTS["fig_motivation"].experiments,
    epoch: int | None = None,
) -> dict[str, object]:
    """Everything Figure 1 draws: the selected blocks, their bins, Spearman rho and the bars
    (``epoch`` selects both the blocks' epoch, when recorded, and the bars' epoch)."""
    sel = metrics_frame.select_blocks(blocks, variant=variant, benchmark=benchmark, temperature=temperature, epoch=epoch)
    rho = metrics_frame.block_correlations(sel)["surrogate"][0]
    return {
        "blocks": sel,
        "bins": surrogate_bins(sel, n_bins),
        "rho": rho,
        "bars": tau_gain_bars(metrics, experiments=experiments, temperature=temperature, epoch=epoch),
        "metrics": _at_temperature(metrics[metrics["experiment"].isin(list(experiments))], temperature),
    }


def motivation_figure(blocks: pd.DataFrame, metrics: pd.DataFrame, **kwargs) -> Figure:
    """Figure 1: (a) per-block S~ vs tau with bin means, +-1 sigma band and Spearman rho;
    (b) average tau, DFlash vs D-PACE, per configuration with the relative gain above each pair."""
    data = motivation_data(blocks, metrics, **kwargs)
    sel, bins, rho, bars = data["blocks"], data["bins"], data["rho"], data["bars"]
    with rc_context(STYLE):
        fig = Figure(figsize=(10.0, 3.8), layout="constrained")
        ax_a, ax_b = fig.subplots(1, 2, width_ratios=[1.0, 1.25])

        ax_a.scatter(sel["surrogate"], sel["tau_block"], s=8, color="0.6", alpha=0.35, linewidths=0,
                     rasterized=True, label=f"blocks (n={len(sel)})")
        ax_a.fill_between(bins["x"], bins["tau_mean"] - bins["tau_std"], bins["tau_mean"] + bins["tau_std"],
                          color=DFLASH_COLOR, alpha=0.2, linewidth=0, label=r"$\pm 1\sigma$")
        ax_a.plot(bins["x"], bins["tau_mean"], color=DFLASH_COLOR, marker="o", ms=3.5, lw=1.8,
                  label=f"bin mean (Spearman $\\rho$ = {rho:.2f})")
        grid = np.linspace(0.0, float(sel["surrogate"].max()), 50)
        ax_a.plot(grid, grid + 1.0, ls="--", color="0.3", lw=1.0, label=r"$\tau = \tilde S + 1$")
        ax_a.set_xlabel(r"Surrogate $\tilde S=\sum_k\prod_{i\leq k} q_i$ (tokens)")
        ax_a.set_ylabel(r"Emitted length $\tau_b$ (tokens / block)")
        ax_a.legend(loc="upper left", frameon=False)
        _panel_tag(ax_a, "a")

        x = np.arange(len(bars))
        w = 0.38
        ax_b.bar(x - w / 2, bars["dflash"], w, color=DFLASH_COLOR, label="DFlash")
        ax_b.bar(x + w / 2, bars["dpace"], w, color=DPACE_COLOR, label="D-PACE")
        top = float(np.nanmax(bars[["dflash", "dpace"]].to_numpy()))
        for xi, r in zip(x, bars.itertuples(index=False), strict=True):
            ax_b.annotate(f"{r.gain_pct:+.1f}%", (xi, max(r.dflash, r.dpace) + 0.02 * top), ha="center",
                          va="bottom", fontsize=9, fontweight="bold")
        ax_b.set_xticks(x, bars["label"])
        ax_b.set_ylim(0, top * 1.3)
        ax_b.set_ylabel(r"Average $\tau$ (tokens / step)")
        ax_b.grid(axis="x", visible=False)
        ax_b.legend(loc="upper left", frameon=False, ncols=2)
        _panel_tag(ax_b, "b")
        _warn_of_skipped_requests(fig, data["metrics"])
    return fig


def fig_motivation(
    blocks: pd.DataFrame, metrics: pd.DataFrame, out_pdf: str | Path, out_png: str | Path, **kwargs
) -> tuple[Path, Path]:
    """Figure 1 (``fig:motivation``); keyword arguments as :func:`motivation_data`."""
    return save_figure(motivation_figure(blocks, metrics, **kwargs), out_pdf, out_png)


# --------------------------------------------------------------------------------------------
# Figure 3 (a, b): position-weight dynamics
# --------------------------------------------------------------------------------------------


def _weight_columns(df: pd.DataFrame) -> list[str]:
    cols = [c for c in df.columns if _WEIGHT_COL.match(str(c))]
    if not cols:
        raise ValueError("train_steps has no per-position weight columns w_0 ... w_{B-1}")
    cols = sorted(cols, key=lambda c: int(_WEIGHT_COL.match(c).group(1)))
    return [c for c in cols if int(_WEIGHT_COL.match(c).group(1)) > 0 and df[c].notna().any()]


def _normalized_weights(df: pd.DataFrame) -> pd.DataFrame:
    """Per-step weights of positions 1..B-1 divided by their sum, indexed by step."""
    cols = _weight_columns(df)
    w = df.set_index("step")[cols].astype(float)
    total = w.sum(axis=1, min_count=1)
    w = w[total > 0].div(total[total > 0], axis=0)
    w.columns = [int(_WEIGHT_COL.match(c).group(1)) for c in cols]
    return w


def _pick_variant(train_steps: pd.DataFrame, objective: str, variant: str | None, *, required: bool) -> str | None:
    if variant is not None:
        if not (train_steps["variant"] == variant).any():
            raise ValueError(f"train_steps has no rows for variant {variant!r}")
        return variant
    cands = sorted(train_steps.loc[train_steps["objective"] == objective, "variant"].unique())
    if len(cands) > 1:
        raise ValueError(f"train_steps holds several {objective} runs {cands}; pass the variant explicitly")
    if not cands:
        if required:
            raise ValueError(f"train_steps has no {objective} run")
        return None
    return cands[0]


def _near(df: pd.DataFrame, fraction: float, n: int) -> pd.DataFrame:
    """The ``n`` rows whose ``epoch_progress`` is closest to ``fraction`` (ties: earlier step)."""
    dist = (df["epoch_progress"].astype(float) - fraction).abs()
    order = df.assign(_d=dist).sort_values(["_d", "step"], kind="stable")
    return order.head(n).drop(columns="_d").sort_values("step")


def weight_profiles(
    train_steps: pd.DataFrame,
    *,
    dpace_variant: str | None = None,
    dflash_variant: str | None = None,
    fractions: Sequence[float] = (0.1, 0.5, 0.9),
    window: int = 100,
) -> pd.DataFrame:
    """Mean per-step-normalized weight per position (rows) for D-PACE at ``fractions`` of its first
    epoch and over its last ``window`` steps, plus DFlash's fixed decay (column ``"DFlash"``,
    mean over all its steps; omitted when no DFlash run is present)."""
    metrics_frame.require_columns(train_steps, ("variant", "objective", "epoch", "step", "epoch_progress"),
                            "train_steps")
    dv = _pick_variant(train_steps, "dpace", dpace_variant, required=True)
    run = train_steps[train_steps["variant"] == dv].sort_values("step")
    first = run[run["epoch"] == run["epoch"].min()]
    cols: dict[str, pd.Series] = {}
    for f in fractions:
        rows = _near(first, f, window)
        cols[f"D-PACE, {100 * f:.0f}% of epoch 1"] = _normalized_weights(rows).mean()
    cols["D-PACE, end of training"] = _normalized_weights(run.tail(window)).mean()
    fv = _pick_variant(train_steps, "dflash", dflash_variant, required=False)
    if fv is not None:
        cols["DFlash"] = _normalized_weights(train_steps[train_steps["variant"] == fv]).mean()
    out = pd.DataFrame(cols)
    out.index.name = "position"
    return out


def per_step_weights(
    train_steps: pd.DataFrame, *, dpace_variant: str | None = None, fraction: float = 0.5, n_steps: int = 10
) -> pd.DataFrame:
    """Normalized weights (rows: step, columns: position) of ``n_steps`` consecutive D-PACE steps
    starting at the step closest to ``fraction`` of its first epoch."""
    dv = _pick_variant(train_steps, "dpace", dpace_variant, required=True)
    run = train_steps[train_steps["variant"] == dv].sort_values("step")
    first = run[run["epoch"] == run["epoch"].min()]
    start = _near(first, fraction, 1)["step"].iloc[0]
    rows = run[run["step"] >= start].head(n_steps)
    return _normalized_weights(rows)


def weight_dynamics_figure(
    train_steps: pd.DataFrame,
    *,
    dpace_variant: str | None = None,
    dflash_variant: str | None = None,
    fractions: Sequence[float] = (0.1, 0.5, 0.9),
    window: int = 100,
    n_steps: int = 10,
) -> Figure:
    """Figure 3 (a, b): mean weight per position at training checkpoints, and per-step weights."""
    prof = weight_profiles(train_steps, dpace_variant=dpace_variant, dflash_variant=dflash_variant,
                           fractions=fractions, window=window)
    steps = per_step_weights(train_steps, dpace_variant=dpace_variant, fraction=0.5, n_steps=n_steps)
    ylabel = "Weight (normalized to sum 1 per step)"
    dpace_cols = [c for c in prof.columns if c != "DFlash"]
    blues = colormaps["Blues"](np.linspace(0.4, 0.95, len(dpace_cols)))
    with rc_context(STYLE):
        fig = Figure(figsize=(10.0, 3.8), layout="constrained")
        ax_a, ax_b = fig.subplots(1, 2, sharey=True)
        for col, color in zip(dpace_cols, blues, strict=True):
            ax_a.plot(prof.index, prof[col], marker="o", ms=3, lw=1.6, color=color, label=col)
        if "DFlash" in prof.columns:
            ax_a.plot(prof.index, prof["DFlash"], ls="--", lw=1.8, color=DFLASH_COLOR, label="DFlash (fixed decay)")
        ax_a.set_xlabel("Draft position $j$ in block")
        ax_a.set_ylabel(f"Mean {ylabel[0].lower()}{ylabel[1:]}")
        ax_a.legend(frameon=False)
        _panel_tag(ax_a, "a")

        shades = colormaps["Blues"](np.linspace(0.35, 0.95, len(steps)))
        for (step, row), color in zip(steps.iterrows(), shades, strict=True):
            ax_b.plot(row.index, row.to_numpy(), lw=1.1, color=color, alpha=0.9, label=f"step {int(step)}")
        if "DFlash" in prof.columns:
            ax_b.plot(prof.index, prof["DFlash"], ls="--", lw=1.8, color=DFLASH_COLOR, label="DFlash")
        ax_b.set_xlabel("Draft position $j$ in block")
        ax_b.set_ylabel(ylabel)
        ax_b.yaxis.set_tick_params(labelleft=True)
        ax_b.set_title(f"{len(steps)} consecutive D-PACE steps at 50% of epoch 1", fontsize=9.5, loc="right")
        ax_b.legend(frameon=False, ncols=2, fontsize=7.5)
        _panel_tag(ax_b, "b")
        for ax in (ax_a, ax_b):
            ax.set_xticks(list(prof.index))
    return fig


def fig_weight_dynamics(
    train_steps: pd.DataFrame, out_pdf: str | Path, out_png: str | Path, **kwargs
) -> tuple[Path, Path]:
    """Figure 3 (a, b) (``fig:teaser-results``); keyword arguments as :func:`weight_dynamics_figure`."""
    return save_figure(weight_dynamics_figure(train_steps, **kwargs), out_pdf, out_png)


# --------------------------------------------------------------------------------------------
# Figure 3 (c): tau trajectory of the ablation variants
# --------------------------------------------------------------------------------------------


def tau_trajectory_figure(
    metrics: pd.DataFrame, *, benchmark: str = MATH500_AT_T0.benchmark, temperature: float = MATH500_AT_T0.temperature
) -> Figure:
    """Figure 3 (c): ``benchmark`` tau at ``temperature`` over epochs for the ablation variants."""
    traj = metrics_frame.ablation_trajectories(metrics, benchmark=benchmark, temperature=temperature)
    configs = metrics_frame.distinct_configs(traj)
    styles = ["-", "--", ":", "-."]
    bname = BENCHMARK_LABELS.get(benchmark, benchmark)
    with rc_context(STYLE):
        fig = Figure(figsize=(5.0, 3.8), layout="constrained")
        ax = fig.subplots()
        for ci, cfg in enumerate(configs):
            sub = traj[metrics_frame.config_mask(traj, cfg)]
            suffix = "" if len(configs) == 1 else f" [{cfg[0]}, {int(cfg[1])}L, B={int(cfg[2])}]"
            for obj in metrics_frame.sort_objectives(sub["objective"].unique()):
                line = sub[sub["objective"] == obj].sort_values("epoch")
                ax.plot(line["epoch"], line["tau"], marker="o", ms=4, lw=1.8, ls=styles[ci % len(styles)],
                        color=objective_color(obj), label=metrics_frame.objective_record_of(obj).comparison_label() + suffix)
        ax.set_xlabel("Training epoch")
        ax.set_ylabel(f"{bname} $\\tau$ (tokens / step), $T={temperature:g}$")
        ax.set_xticks(sorted(traj["epoch"].astype(int).unique()))
        ax.legend(frameon=False)
        _panel_tag(ax, "c")
        _warn_of_skipped_requests(fig, _at_temperature(metrics[metrics["benchmark"] == benchmark], temperature))
    return fig


def fig_tau_trajectory(metrics: pd.DataFrame, out_pdf: str | Path, out_png: str | Path, **kwargs) -> tuple[Path, Path]:
    """Figure 3 (c); keyword arguments as :func:`tau_trajectory_figure`."""
    return save_figure(tau_trajectory_figure(metrics, **kwargs), out_pdf, out_png)
