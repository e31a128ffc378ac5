"""Selecting rows of the tidy metrics frame: the helpers shared by ``dpace.tables`` and
``dpace.figures`` (required columns, final epoch, one temperature, configurations, averages over
benchmarks). Pure pandas; nothing here formats LaTeX or draws.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from dpace.data import BENCHMARKS as BENCHMARK_LOADERS

# The benchmarks in the paper's column order: dpace.data's, which loads each (the schema's enum names the same).
BENCHMARKS: tuple[str, ...] = tuple(BENCHMARK_LOADERS)
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
    known = [b for b in BENCHMARKS if b in present]
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
