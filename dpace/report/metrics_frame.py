"""Selecting rows of the tidy metrics frame: the helpers shared by ``dpace.report.tables`` and
``dpace.report.figures`` (required columns, final epoch, one temperature, configurations, averages over
benchmarks, objectives in their records' row order, runs borrowed from another experiment, the ablation's
tau trajectories, one drafter's per-block records and their rank correlations, the evaluations that skipped
requests too long for the target). Nothing here formats LaTeX (``dpace.report.latex``) or draws.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from dpace.data import BENCHMARKS
from dpace.experiments import MATH500_AT_T0
from dpace.objective_records import REGISTRY, Objective

CONFIG: tuple[str, ...] = ("target", "depth", "block_size")
METRIC_COLUMNS: tuple[str, ...] = (
    "target",
    "target_label",
    "variant",
    "experiment",
    "objective",
    "depth",
    "block_size",
    "alpha",
    "epoch",
    "benchmark",
    "temperature",
    "tau",
    "speedup",
)
# What the per-block figures and Table 8 read of an experiment's blocks CSV (collect adds ``variant`` to the
# columns an evaluation writes, dpace.evaluation.eval_records.BLOCK_COLUMNS).
BLOCKS_READ: tuple[str, ...] = ("variant", "benchmark", "temperature", "tau_block", "sum_q", "surrogate")


def is_finite(x: object) -> bool:
    """Whether ``x`` is a finite number (None, NaN, inf and non-numbers are not)."""
    try:
        return x is not None and math.isfinite(float(x))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def require_columns(df: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """Raise ``ValueError`` naming ``what`` and the columns of ``columns`` that ``df`` lacks."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} lacks column(s) {missing}")


def prepared_metrics(metrics: pd.DataFrame, extra: Iterable[str] = ()) -> pd.DataFrame:
    """A copy of ``metrics`` with the required columns (``METRIC_COLUMNS`` + ``extra``) checked and
    ``_alpha``, alpha rounded for matching (-1 where a run has none)."""
    require_columns(metrics, (*METRIC_COLUMNS, *extra), "metrics")
    df = metrics.copy()
    df["_alpha"] = pd.to_numeric(df["alpha"], errors="coerce").round(6).fillna(-1.0)
    return df


def final_epoch_rows(df: pd.DataFrame, epoch: int | None, what: str) -> pd.DataFrame:
    """Rows at ``epoch``, or (None) each variant's last evaluated epoch."""
    if epoch is None:
        last = df.groupby("variant")["epoch"].transform("max")
        return df[df["epoch"] == last]
    out = df[df["epoch"] == epoch]
    if out.empty:
        raise ValueError(f"{what}: no rows at epoch {epoch}")
    return out


def rows_at_temperature(df: pd.DataFrame, temperature: float, what: str) -> pd.DataFrame:
    """Rows evaluated at ``temperature``; none raises ``ValueError`` naming ``what``."""
    out = df[np.isclose(df["temperature"].astype(float), float(temperature))]
    if out.empty:
        raise ValueError(f"{what}: no rows at temperature {temperature:g}")
    return out


def check_unique(df: pd.DataFrame, cols: Sequence[str], what: str) -> None:
    """Raise ``ValueError`` if several rows of ``df`` share the same ``cols``."""
    dup = df.duplicated(list(cols), keep=False)
    if dup.any():
        example = df.loc[dup, list(cols)].drop_duplicates().head(3).to_dict("records")
        raise ValueError(f"{what}: several rows for the same {list(cols)}, e.g. {example}")


def present_benchmarks(df: pd.DataFrame) -> list[str]:
    """Benchmarks of ``df`` in the paper's order (unknown ones after, sorted)."""
    present = set(map(str, df["benchmark"].dropna().unique()))
    known = [b for b in BENCHMARKS if b in present]  # dpace.data's order: the paper's columns
    return known + sorted(present - set(BENCHMARKS))


def benchmark_averages(
    df: pd.DataFrame, keys: Sequence[str], benchmarks: Sequence[str] | None = None
) -> pd.DataFrame:
    """Mean ``speedup`` and ``tau`` over ``benchmarks`` (default: all present) per ``keys``.

    A key lacking one of the benchmarks, or with a NaN value, averages to NaN.
    """
    benches = list(benchmarks) if benchmarks is not None else present_benchmarks(df)
    check_unique(df, [*keys, "benchmark"], "benchmark averages")
    records = []
    for key, sub in df.groupby(list(keys), sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        sub = sub.set_index("benchmark")
        rec = dict(zip(keys, key, strict=True))
        for col in ("speedup", "tau"):
            rec[col] = float(sub[col].astype(float).reindex(benches).mean(skipna=False))
        records.append(rec)
    return pd.DataFrame.from_records(records, columns=[*keys, "speedup", "tau"])


def _sort_key(value: object) -> tuple:
    return (0, float(value), "") if is_finite(value) else (1, 0.0, str(value))


def distinct_configs(df: pd.DataFrame, cols: Sequence[str] = CONFIG) -> list[tuple]:
    """Distinct configurations, numbers sorted numerically."""
    rows = set(map(tuple, df[list(cols)].itertuples(index=False)))
    return sorted(rows, key=lambda c: tuple(_sort_key(v) for v in c))


def target_label_of(df: pd.DataFrame, target: object) -> str:
    """The display label of ``target`` in ``df`` (its name if it has none)."""
    labels = df.loc[df["target"] == target, "target_label"].dropna().unique()
    return str(labels[0]) if len(labels) else str(target)


def config_mask(df: pd.DataFrame, config: tuple) -> pd.Series:
    """Which rows of ``df`` belong to ``config`` (a ``CONFIG`` tuple: target, depth, block size)."""
    return (df[list(CONFIG)] == pd.Series(config, index=list(CONFIG))).all(axis=1)


# What names one evaluation apart from the training seed it was trained with (``mean_over_seeds``).
EVALUATION_KEYS: tuple[str, ...] = (
    "target", "target_label", "method", "experiment", "objective", "depth", "block_size", "alpha", "k", "gamma",
    "normalization", "epoch", "suite", "benchmark", "temperature", "verification",
)
# Counts that add up over seeds (every seed's evaluation decoded them); other numbers are averaged.
SUMMED_OVER_SEEDS: tuple[str, ...] = ("num_output_tokens", "greedy_mismatches", "greedy_ties", "greedy_failures")


def mean_over_seeds(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per method and evaluation: the mean over its training seeds (``train.seeds``) of tau, SR
    and every other measured number, with ``num_seeds``; ``variant`` names the method (its first seed's
    id, the drafter's id with one seed). A frame without a ``method`` column is returned as it is."""
    if "method" not in metrics.columns:
        return metrics
    keys = [c for c in EVALUATION_KEYS if c in metrics.columns]
    measured = [c for c in metrics.columns if c not in (*keys, "variant", "training_seed")]
    numeric = [c for c in measured if pd.api.types.is_numeric_dtype(metrics[c]) and not pd.api.types.is_bool_dtype(metrics[c])]
    aggregations = {c: ("sum" if c in SUMMED_OVER_SEEDS else "mean") if c in numeric else "first" for c in measured}
    grouped = metrics.groupby(keys, sort=False, dropna=False)
    out = grouped.agg(aggregations) if aggregations else pd.DataFrame(index=grouped.size().index)
    out["num_seeds"] = grouped.size()
    out = out.reset_index()
    out.insert(out.columns.get_loc("method"), "variant", out["method"])
    return out[[c for c in metrics.columns if c != "training_seed"] + ["num_seeds"]]


# One evaluation's cell in a metrics CSV (listed once per experiment that shows it).
EVALUATION_CELL: tuple[str, ...] = ("target", "variant", "epoch", "suite", "benchmark", "temperature")


def skipped_evaluations(metrics: pd.DataFrame) -> pd.DataFrame:
    """The evaluations (one row each) that skipped requests past the target's context (``skipped_too_long``,
    counted by ``dpace.evaluation``); none when the metrics predate the count."""
    if "skipped_too_long" not in metrics.columns:
        return metrics.iloc[0:0]
    counts = pd.to_numeric(metrics["skipped_too_long"], errors="coerce").fillna(0)
    return metrics[counts > 0].drop_duplicates([k for k in EVALUATION_CELL if k in metrics.columns])


def skipped_requests_text(metrics: pd.DataFrame) -> str:
    """One line naming the evaluations that skipped requests past the target's context: their tau and SR
    come from fewer requests than planned. Empty when none did, or when the metrics predate the count."""
    skipped = skipped_evaluations(metrics)
    if skipped.empty:
        return ""
    cells = "; ".join(f"{r.variant} epoch {r.epoch} {r.benchmark} T={float(r.temperature):g}: {int(r.skipped_too_long)}"
                      for r in skipped.itertuples())
    return (f"{int(skipped['skipped_too_long'].sum())} request(s) past the target's context were skipped "
            f"(skipped_too_long); these evaluations' tau and SR come from fewer requests than planned: {cells}")


def objective_record_of(objective: str) -> Objective:
    """The registry record of an objective a table or figure is about to show; one without a record is an
    error naming it (a table never drops its row)."""
    if objective not in REGISTRY:
        raise ValueError(f"objective {objective!r} has no record in dpace.objective_records.REGISTRY: no table or figure "
                         f"can order, label or describe it (records: {', '.join(REGISTRY)})")
    return REGISTRY[objective]


def experiment_rows(df: pd.DataFrame, experiment: str) -> pd.DataFrame:
    rows = df[df["experiment"] == experiment]
    if rows.empty:
        experiments = sorted(map(str, df["experiment"].dropna().unique()))
        raise ValueError(f"metrics has no rows for experiment {experiment!r} (experiments present: {experiments})")
    return rows


def complete_rows(
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
    own = experiment_rows(df, experiment)
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


def objective_rank(objective: str) -> int:
    return objective_record_of(objective).table_rank


def sort_objectives(objectives: Iterable[str]) -> list[str]:
    """Distinct objectives in row order: their records' ``table_rank`` (an objective without a record raises)."""
    return sorted(dict.fromkeys(objectives), key=lambda o: (objective_rank(o), o))


def k_of(df: pd.DataFrame, objective: str) -> object:
    if "k" not in df.columns:
        return None
    ks = df.loc[df["objective"] == objective, "k"].dropna().unique()
    return ks[0] if len(ks) == 1 else None


def ablation_trajectories(
    metrics: pd.DataFrame, *, benchmark: str = MATH500_AT_T0.benchmark, temperature: float = MATH500_AT_T0.temperature
) -> pd.DataFrame:
    """Long frame (config, objective, epoch, tau) of the ablation runs on ``benchmark`` at
    ``temperature`` (experiment ``ablation``, every objective it trained; DFlash / D-PACE borrowed from
    ``main`` if absent)."""
    df = prepared_metrics(metrics)
    rows = complete_rows(df, "ablation", borrow=("dflash", "dpace"))
    what = "experiment 'ablation'"
    rows = rows[rows["benchmark"] == benchmark]
    if rows.empty:
        raise ValueError(f"{what}: no rows for benchmark {benchmark!r}")
    rows = rows_at_temperature(rows, temperature, what)
    check_unique(rows, [*CONFIG, "objective", "epoch"], what)
    return rows[[*CONFIG, "target_label", "objective", "epoch", "tau"]].sort_values(
        [*CONFIG, "objective", "epoch"], ignore_index=True
    )


def select_blocks(
    blocks: pd.DataFrame,
    *,
    variant: str | None = None,
    benchmark: str | None = MATH500_AT_T0.benchmark,
    temperature: float | None = MATH500_AT_T0.temperature,
    epoch: int | None = None,
) -> pd.DataFrame:
    """Per-block records of one variant on ``benchmark`` at ``temperature`` (None: no filter).

    When ``blocks`` has an ``epoch`` column, only ``epoch`` (default: the latest one) is kept.
    """
    require_columns(blocks, BLOCKS_READ, "blocks")
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
