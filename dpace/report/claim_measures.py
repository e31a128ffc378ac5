"""How each kind of claim is measured in ``results/``: one finding per run cell, in the claim's unit.

Measures (``measure.kind``): ``comparison`` (rows of ``metrics/<experiment>_comparisons.csv``),
``contrast`` (a weighted sum of drafters' tau or SR from their per-request records), ``correlation`` and
``correlation_gap`` (Table 8), ``step_time`` (Table 7's interleaved step timing, ``dpace.report.timing``), ``weight_shift``
(Figure 3); each is registered in ``MEASURES`` and raises ``NotRun`` naming what is missing. Only
comparisons carry a reference to divide by; step times are ratios already. ``measure_gradient`` measures
how a gain moves with scale (``dpace.report.scale``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from dpace.io import read_json
from dpace.paths import EVAL_SUMMARY, STEP_TIMING, TIMING
from dpace.report.intervals import _prompt_sums, over_seeds, paired_contrast
from dpace.report.scale import gain_slope
from dpace.report.timing import (
    AUTOREGRESSIVE,
    MAX_REPEAT_SPREAD,
    contrast_stability,
    stability_note,
    step_ratio,
    timed_contrast,
    window_means,
)
from dpace.report.verdicts import LEVEL, Finding, NotRun, in_unit, judged, scale_of

RESAMPLES, SEED = 2000, 0
# A comparison cell: which drafters a comparisons row pairs, and how the scorecard labels it.
CELL_COLUMNS = ("target", "depth", "block_size", "temperature", "epoch")


# --- reading results/ ---------------------------------------------------------------------------------------

def read_csv(results: Path, name: str) -> pd.DataFrame:
    """``results/metrics/<name>``, or ``NotRun`` when it was not built (or is empty)."""
    path = results / "metrics" / name
    if not path.exists() or path.stat().st_size == 0:
        raise NotRun(f"metrics/{name} not built")
    frame = pd.read_csv(path)
    if frame.empty:
        raise NotRun(f"metrics/{name} has no rows")
    return frame


def comparison_estimate(row: pd.Series, scale: str, reference_tau: float) -> tuple[float, float, float]:
    """One comparisons row as (estimate, 95% low, 95% high) in ``scale``: the one place that knows its columns.

    Relative estimates divide the difference and its interval by the reference's value (tau, or tau - 1); the
    reference's own spread is in the paired interval of the difference, not in the divisor. SR rows divide
    by DFlash's SR (``accepted`` applies to tau only)."""
    reference = float(row["reference_value"])
    if row.get("metric", "tau") != "tau" and scale != "absolute":
        return tuple(float(row[c]) / reference for c in ("difference", "ci_low", "ci_high"))
    return tuple(in_unit(float(row[c]), reference_tau if np.isfinite(reference_tau) else reference, scale)
                 for c in ("difference", "ci_low", "ci_high"))


def _cell_label(row: pd.Series, extra: Sequence[str] = ()) -> str:
    """``tiny d1 B4 T0 epoch 2`` (and ``alpha 0.5`` ...): the cell's columns that ``row`` holds."""
    formats = {"target": "{}", "depth": "d{:.0f}", "block_size": "B{:.0f}", "temperature": "T{:g}", "epoch": "epoch {:.0f}"}
    parts = [fmt.format(row[key]) for key, fmt in formats.items() if key in row and pd.notna(row[key])]
    parts += [f"{key} {row[key]}" for key in extra if key in row and pd.notna(row[key])]
    return " ".join(parts)


def _at_epoch(frame: pd.DataFrame, epoch: object) -> pd.DataFrame:
    """Rows at ``epoch``: ``final`` (each variant's last, the default), ``every``, or a number."""
    if epoch in (None, "final"):
        return frame[frame["epoch"] == frame.groupby("variant")["epoch"].transform("max")]
    if epoch == "every":
        return frame
    return frame[frame["epoch"] == int(epoch)]


def _with_variant_columns(frame: pd.DataFrame, results: Path, experiment: str, where: dict) -> pd.DataFrame:
    """``frame`` with the per-variant columns ``where`` filters on (alpha, k, normalization) from the metrics CSV."""
    wanted = [key for key in where if key not in frame.columns]
    if not wanted:
        return frame
    metrics = read_csv(results, f"{experiment}.csv")
    info = metrics[["variant", *wanted]].drop_duplicates("variant")
    return frame.merge(info, on="variant", how="left")


def _filtered(frame: pd.DataFrame, where: dict) -> pd.DataFrame:
    for key, value in where.items():
        column = frame[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            keep = np.isclose(pd.to_numeric(column, errors="coerce").astype(float), float(value))
        elif key == "alpha" and value == "positive":
            keep = pd.to_numeric(column, errors="coerce") > 0
        else:
            keep = column.astype(str) == str(value)
        frame = frame[keep]
    return frame


def _requests(results: Path, row: pd.Series, benchmarks: Sequence[str] | None) -> dict[str, list]:
    """One evaluation's per-request records by benchmark at the row's temperature (its ``summary.json``)."""
    path = results / EVAL_SUMMARY.format(target=row["target"], variant=row["variant"], epoch=int(row["epoch"]),
                                         suite=row["suite"])
    if not path.exists():
        raise NotRun(f"{path.relative_to(results)} not built")
    out = {}
    for entry in read_json(path):
        if np.isclose(float(entry["temperature"]), float(row["temperature"])) and (
            benchmarks is None or entry["benchmark"] in benchmarks
        ):
            out[entry["benchmark"]] = entry["requests"]
    return out


def _pick(rows: pd.DataFrame, term: dict) -> pd.DataFrame:
    """The rows of one contrast term: its filters, where ``largest``/``smallest`` pick a column's extreme."""
    for key, value in term.items():
        if key == "weight":
            continue
        if value in ("largest", "smallest"):
            column = pd.to_numeric(rows[key])
            rows = rows[column == (column.max() if value == "largest" else column.min())]
        else:
            rows = _filtered(rows, {key: value})
    return rows


def _main_variants(results: Path, objective: str) -> list[str]:
    """Table 1's shallowest ``objective`` drafter, one variant per training seed (seed order): the drafters
    Tables 7, 8 and Figure 3 show."""
    main = read_csv(results, "main.csv")
    rows = main[main["objective"] == objective].sort_values(["depth", "block_size"])
    if rows.empty:
        raise NotRun(f"no {objective} drafter in metrics/main.csv")
    first = rows.iloc[0]
    same = rows[(rows["depth"] == first["depth"]) & (rows["block_size"] == first["block_size"])]
    by_method = "method" in same and pd.notna(first["method"])
    same = same[same["method"] == first["method"]] if by_method else same[same["variant"] == first["variant"]]
    if "training_seed" in same:
        same = same.assign(seed_key=same["training_seed"].fillna(0)).sort_values("seed_key", kind="stable")
    return list(dict.fromkeys(same["variant"].astype(str)))


def _main_variant(results: Path, objective: str) -> str:
    """The first training seed of :func:`_main_variants` (Table 7's step times compare one run of each)."""
    return _main_variants(results, objective)[0]


def _over_seeds(points: Sequence[float], draws: Sequence[np.ndarray]) -> tuple[float, float, float]:
    """``dpace.report.intervals.over_seeds`` at the scorecard's level and seed."""
    return over_seeds(points, draws, level=LEVEL, seed=SEED)


def _bootstrap_draws(samples: Sequence[np.ndarray], statistic: Callable[..., float]) -> tuple[float, np.ndarray]:
    """``statistic`` of independent samples and its resampled values, each sample resampled separately (NaN
    draws when a sample has fewer than 2 members)."""
    generator = np.random.default_rng(SEED)
    point = statistic(*samples)
    if min(len(s) for s in samples) < 2:
        return point, np.full(RESAMPLES, math.nan)
    draws = [generator.integers(0, len(s), size=(RESAMPLES, len(s))) for s in samples]
    return point, np.array([statistic(*(s[d[r]] for s, d in zip(samples, draws, strict=True))) for r in range(RESAMPLES)])


def _bootstrap(samples: Sequence[np.ndarray], statistic: Callable[..., float]) -> tuple[float, float, float]:
    """``statistic`` of independent samples, with a percentile interval resampling each one separately."""
    point, values = _bootstrap_draws(samples, statistic)
    if not np.isfinite(values).any():
        return point, math.nan, math.nan
    tail = (1.0 - LEVEL) / 2.0
    low, high = np.nanquantile(values, [tail, 1.0 - tail])
    return point, float(low), float(high)


def _selected(frame: pd.DataFrame, name: str, steps: Sequence[tuple]) -> pd.DataFrame:
    """``frame`` through each (what, column, filter) of ``steps``; ``NotRun`` naming the first that keeps no row
    and what the file holds in that column, so a claim is *not run* for a true reason (the run did not evaluate
    it), never for a filter the run could not meet."""
    for what, column, keep in steps:
        kept = keep(frame)
        if kept.empty:
            held = f" (it holds {', '.join(map(str, sorted(frame[column].astype(str).unique())))})" if column else ""
            raise NotRun(f"no {what} in {name}{held}")
        frame = kept
    return frame


def _benchmark_rows(frame: pd.DataFrame, benchmark: str) -> pd.DataFrame:
    """``every``: each benchmark's own rows (not the average); else the rows of ``benchmark`` (``avg`` default)."""
    if benchmark == "every":
        return frame[frame["benchmark"] != "avg"]
    return frame[frame["benchmark"] == benchmark]


def _row_attrs(row: pd.Series, keys: Sequence[str]) -> dict:
    return {k: row[k] for k in keys if k in row and pd.notna(row[k])}


def measure_comparison(claim: dict, results: Path) -> list[Finding]:
    m = claim["measure"]
    frame = read_csv(results, f"{m['experiment']}_comparisons.csv")
    where = dict(m.get("where", {}))
    frame = _with_variant_columns(frame, results, m["experiment"], where)
    benchmark, metric = m.get("benchmark", "avg"), m.get("metric", "tau")
    rows = _selected(frame, f"metrics/{m['experiment']}_comparisons.csv", [
        (f"{m['objective']} drafter", "objective", lambda f: f[f["objective"] == m["objective"]]),
        (f"epoch {m.get('epoch', 'final')} of {m['objective']}", "epoch", lambda f: _at_epoch(f, m.get("epoch"))),
        (f"{m['objective']} drafter with {where}", None, lambda f: _filtered(f, where)),
        (f"{metric} rows of {m['objective']}", "metric", lambda f: f[f["metric"] == metric]),
        (f"benchmark {benchmark} of {m['objective']}", "benchmark", lambda f: _benchmark_rows(f, benchmark)),
    ])
    # DFlash's tau in each cell (the tau rows' reference), whatever metric the claim reads.
    cell_of = ["reference_variant", "temperature", "epoch", "suite", "benchmark"]
    dflash_tau = {tuple(r[cell_of]): float(r["reference_value"]) for _, r in frame[frame["metric"] == "tau"].iterrows()}
    label_extra = list(where) + (["benchmark"] if benchmark == "every" else [])
    out = []
    for _, row in rows.sort_values([*CELL_COLUMNS, "benchmark", "variant"]).iterrows():
        reference_tau = dflash_tau.get(tuple(row[cell_of]), math.nan)
        seeds = int(row["num_seeds"]) if "num_seeds" in row and pd.notna(row["num_seeds"]) else 1
        note = f"n={int(row['num_prompts'])} prompts"
        # SR of an interleaved timing job (dpace.report.timing): repeats too, and whether a second one agrees
        repeats = row.get("num_repeats")
        if repeats is not None and pd.notna(repeats):
            note += f" x {int(repeats)} repeats; " + str(row.get("timing_note", ""))
        measurable = not _unstable(row.get("timing_stable"))
        out.append(judged(
            claim, _cell_label(row, label_extra), comparison_estimate(row, scale_of(claim), reference_tau),
            (float(row["difference"]), float(row["ci_low"]), float(row["ci_high"])),
            _row_attrs(row, (*CELL_COLUMNS, "benchmark", *where)),
            key=("comparison", *(row[c] for c in ("target", "variant", "reference_variant", "metric", "benchmark",
                                                   "temperature", "epoch", "suite"))),
            reference_tau=reference_tau, seeds=seeds, num_prompts=int(row["num_prompts"]), measurable=measurable,
            note=note,
            drafters=f"{row['objective']} - dflash ({row['metric']})"))
    return out


def _unstable(flag) -> bool:
    """A comparisons row's ``timing_stable`` as read back from CSV: True/False, "True"/"False", 1.0/0.0 (a column
    that also holds the tau rows' empty cells is read as floats), or empty (not a timing: never unstable)."""
    if flag is None or isinstance(flag, str) and not flag.strip():
        return False
    if isinstance(flag, (bool, np.bool_, int, float, np.number)):
        return not math.isnan(float(flag)) and float(flag) == 0.0
    return str(flag).strip().lower() in ("false", "0", "0.0")


def _seed_rows(rows: pd.DataFrame) -> dict | None:
    """One method's rows by training seed ({seed: rows}, in seed order); None when the rows are empty or hold
    two variants of one seed (not one method)."""
    if rows.empty:
        return None
    seed_of = rows["training_seed"].fillna(0) if "training_seed" in rows else pd.Series(0, index=rows.index)
    by_seed = {key: part for key, part in rows.groupby(seed_of, sort=True)}
    if any(part["variant"].nunique() != 1 for part in by_seed.values()):
        return None
    return by_seed


def _dflash_tau(cell: pd.DataFrame) -> float:
    """DFlash's average tau over the benchmarks of a metrics cell; NaN when the cell has no single DFlash."""
    dflash = cell[cell["objective"] == "dflash"]
    return float(dflash["tau"].mean()) if dflash["variant"].nunique() == 1 else math.nan


def _by_seed(rows: pd.DataFrame) -> pd.DataFrame | None:
    """One contrast term's drafters, one row per training seed in seed order (``seed_key``: the row's seed);
    None when the term picks no drafter or several drafters share a seed (a term that is not one method)."""
    if rows.empty:
        return None
    seed_of = rows["training_seed"] if "training_seed" in rows else pd.Series(0, index=rows.index)
    rows = rows.assign(seed_key=seed_of.fillna(0)).drop_duplicates("variant")
    if rows["seed_key"].duplicated().any():
        return None
    return rows.sort_values("seed_key")


def records_digest(weights: Sequence[float], drafters: Sequence[Sequence[dict]], metric: str) -> str:
    """A digest of what a contrast reads: its weights and each drafter's per-request records (prompt id and
    tau, or its times for SR) by seed and benchmark. Two claims reading bit-identical drafters (Accept-rate and
    D-PACE at alpha = 0 share their gradient) get the same digest whatever the drafters are called."""
    fields = ("tau",) if metric == "tau" else ("ar_tpot_s", "spec_tpot_s")
    content = [[float(w), [sorted([b, str(r["id"]), *(repr(r.get(f)) for f in fields)] for b in seed for r in seed[b])
                           for seed in seeds]] for w, seeds in zip(weights, drafters, strict=True)]
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def measure_contrast(claim: dict, results: Path) -> list[Finding]:
    m = claim["measure"]
    metrics = read_csv(results, f"{m['experiment']}.csv")
    benchmark, metric = m.get("benchmark", "avg"), m.get("metric", "tau")
    where = dict(m.get("where", {}))
    rows = _selected(metrics, f"metrics/{m['experiment']}.csv", [
        (f"benchmark {benchmark}", "benchmark", lambda f: f if benchmark == "avg" else f[f["benchmark"] == benchmark]),
        (f"epoch {m.get('epoch', 'final')}", "epoch", lambda f: _at_epoch(f, m.get("epoch"))),
        (f"drafter with {where}", None, lambda f: _filtered(f, where)),
    ])
    ratio = m["kind"] == "ratio"
    terms = [*m["numerator"], *m["denominator"]] if ratio else m["terms"]
    # Cells: every cell column that no term picks itself (Table 4's terms pick their block sizes).
    chosen = {key for term in terms for key in term if key != "weight"}
    cell_keys = [c for c in CELL_COLUMNS if c not in chosen]
    out = []
    for _, cell in rows.groupby(cell_keys, sort=True):
        picked = [_by_seed(_pick(cell, term)) for term in terms]
        if any(p is None for p in picked) or len({tuple(p["seed_key"]) for p in picked}) != 1:
            continue  # this cell lacks one of the drafters (or their seeds differ): it cannot be contrasted
        if metric == "speedup":  # SR is the timing job's (dpace.evaluation.timing_run), not the evaluations'
            out.append(_timed_contrast(claim, results, cell, cell_keys, picked, benchmark))
            continue
        benchmarks = None if benchmark == "avg" else [benchmark]
        drafters = [[_requests(results, row, benchmarks) for _, row in p.iterrows()] for p in picked]
        common = sorted(set.intersection(*(set(b) for d in drafters for b in d)))
        weights = [float(t.get("weight", 1.0)) for t in terms]
        records = [[{b: by_benchmark[b] for b in common} for by_benchmark in d] for d in drafters]
        if ratio:  # one contrast over the other, both on the same seed and prompt draws (the same drafters)
            split = len(m["numerator"])
            parts = [paired_contrast(records, [w if (i < split) == numerator else 0.0 for i, w in enumerate(weights)],
                                     metric=metric, resamples=RESAMPLES, seed=SEED, level=LEVEL)
                     for numerator in (True, False)]
            offset = float(m.get("denominator_offset", 0.0))
            result = _ratio(parts[0], parts[1], offset)
        else:
            result = paired_contrast(records, weights, metric=metric, resamples=RESAMPLES, seed=SEED, level=LEVEL)
        seeds = result["num_seeds"]
        label = _cell_label(cell.iloc[0][cell_keys])
        if len(terms) > 1:  # which drafters, with the values that largest/smallest picked
            texts = [f"{w:+g} x " + " ".join(f"{k} {p.iloc[0][k]}" if v in ("largest", "smallest") else str(v)
                                              for k, v in term.items() if k != "weight")
                     for term, p, w in zip(terms, picked, weights, strict=True)]
            if ratio:
                label += f", ({' '.join(texts[:split])}) / ({' '.join(texts[split:])}" + (
                    f" {offset:+g}" if offset else "") + ")"
            else:
                label += "".join(f", {t}" for t in texts)
        estimate = (result["value"], result["ci_low"], result["ci_high"])
        digest = "" if ratio else records_digest(weights, records, metric)
        key = (m["kind"], tuple((p.iloc[0]["variant"], w) for p, w in zip(picked, weights, strict=True)), metric,
               benchmark, *(cell.iloc[0][k] for k in ("temperature", "epoch") if k in cell_keys))
        out.append(judged(claim, label, estimate, estimate, _row_attrs(cell.iloc[0], cell_keys), key=key,
                           reference_tau=_dflash_tau(cell), num_prompts=int(result["num_prompts"]), seeds=seeds,
                           note=f"n={result['num_prompts']} prompts" + (f", {seeds} training seeds" if seeds > 1 else ""),
                           drafters=f"{'ratio' if ratio else 'contrast'} ({metric})", digest=digest))
    if not out:
        raise NotRun(f"no cell of metrics/{m['experiment']}.csv holds every drafter of the contrast")
    return out


def _timed_contrast(claim: dict, results: Path, cell: pd.DataFrame, cell_keys: list, picked: list,
                    benchmark: str) -> Finding:
    """A contrast of SR from the experiment's timing job: the weighted sum of the picked drafters' SR (each term the
    mean over its training seeds, seed s of every term paired), its interval over prompts, repeats and seeds, and
    whether the machine repeats it (``dpace.report.timing.contrast_stability``; not: "not measurable on this
    machine")."""
    m, first = claim["measure"], cell.iloc[0]
    path = results / TIMING.format(target=first["target"], experiment=m["experiment"])
    if not path.exists() or path.stat().st_size == 0:
        raise NotRun(f"{path.relative_to(results)} not built (SR is measured by the timing job)")
    times = pd.read_csv(path)
    times = times[np.isclose(times["temperature"].astype(float), float(first["temperature"]))]
    variants = [str(p.iloc[0]["variant"]) for p in picked]  # each term named by its first seed
    terms = [[str(v) for v in p["variant"]] for p in picked]
    weights = [float(t.get("weight", 1.0)) for t in m["terms"]]
    timed = {v for term in terms for v in term}
    times = times[times["drafter"].isin({*timed, AUTOREGRESSIVE})]
    if not timed <= set(times["drafter"]):
        raise NotRun(f"{path.relative_to(results)} does not time {sorted(timed - set(times['drafter']))}")
    value, low, high, prompts = timed_contrast(times, terms, weights, benchmark=benchmark, resamples=RESAMPLES,
                                               seed=SEED, level=LEVEL)
    check = contrast_stability(times, terms, weights, resamples=RESAMPLES, seed=SEED, level=LEVEL,
                               max_spread=float(m.get("max_spread", MAX_REPEAT_SPREAD)))
    seeds = len(terms[0])
    estimate = (value, low, high)
    return judged(claim, _cell_label(first[cell_keys]) + ", " + " ".join(f"{w:+g} x {v}" for v, w in zip(
        variants, weights, strict=True)), estimate, estimate, _row_attrs(first, cell_keys),
        key=("contrast", tuple(zip(variants, weights, strict=True)), "speedup", benchmark, first["temperature"]),
        reference_tau=_dflash_tau(cell), num_prompts=prompts, measurable=check["stable"], seeds=seeds,
        note=f"n={prompts} prompts x {check['num_repeats']} repeats (timing job)"
             + (f", {seeds} training seeds" if seeds > 1 else "") + f"; {stability_note(check)}",
        drafters="contrast (speedup)")


def _ratio(numerator: dict, denominator: dict, offset: float = 0.0) -> dict:
    """numerator / (denominator + offset) of two ``paired_contrast`` results on the same draws: the ratio of each
    resample's pair, its percentile interval. A denominator whose 95% interval reaches 0 leaves the ratio
    unbounded: no interval (NaN), nothing decided."""
    tail = (1.0 - LEVEL) / 2.0
    below = denominator["resampled"] + offset
    value = numerator["value"] / (denominator["value"] + offset) if denominator["value"] + offset else math.nan
    low = high = math.nan
    ends = (denominator["ci_low"] + offset, denominator["ci_high"] + offset)
    if np.isfinite(below).all() and (min(ends) > 0 or max(ends) < 0):
        low, high = (float(x) for x in np.quantile(numerator["resampled"] / below, [tail, 1.0 - tail]))
    return {**numerator, "value": value, "ci_low": low, "ci_high": high}


def _blocks_of(results: Path, variant: str) -> pd.DataFrame:
    """The per-block records (S~, sum q, tau_b) of ``variant`` on MATH-500 at T=0, its last epoch."""
    blocks = None
    for name in ("main_local_blocks.csv", "main_blocks.csv"):  # SGLang evaluation: the local blocks run
        try:
            blocks = read_csv(results, name)
            break
        except NotRun:
            continue
    if blocks is None:
        raise NotRun("metrics/main_blocks.csv not built")
    rows = blocks[(blocks["variant"] == variant) & (blocks["benchmark"] == "math500")
                  & np.isclose(blocks["temperature"].astype(float), 0.0)]
    rows = rows[rows["epoch"] == rows["epoch"].max()].dropna(subset=["tau_block", "sum_q", "surrogate"])
    if len(rows) < 3:
        raise NotRun(f"{len(rows)} MATH-500 block(s) of {variant} at T=0")
    return rows


BLOCK_COLUMNS = ("surrogate", "sum_q", "tau_block")


def _block_statistic(claim: dict, results: Path, statistic: Callable[[np.ndarray], float]) -> list[Finding]:
    """``statistic`` of the blocks ([blocks, 3]: ``BLOCK_COLUMNS``) of Table 1's shallowest DFlash drafter (every
    training seed's, averaged over the seeds by :func:`_over_seeds`); prompts resampled (a prompt's blocks stay
    together)."""
    variants = _main_variants(results, "dflash")
    points, draws, counts = [], [], []
    for variant in variants:
        rows = _blocks_of(results, variant)
        prompts = rows["prompt_index"].to_numpy()
        columns = rows[list(BLOCK_COLUMNS)].to_numpy(float)
        by_prompt = [np.flatnonzero(prompts == p) for p in np.unique(prompts)]

        def of(indices: np.ndarray, columns=columns, by_prompt=by_prompt) -> float:
            with np.errstate(invalid="ignore", divide="ignore"):  # a resample of constant blocks: NaN
                return statistic(columns[np.concatenate([by_prompt[i] for i in indices])])

        point, values = _bootstrap_draws([np.arange(len(by_prompt))], of)
        points.append(point)
        draws.append(values)
        counts.append((len(rows), len(by_prompt)))
    estimate = _over_seeds(points, draws)
    seeds = len(variants)
    note = f"{counts[0][0]} blocks, {counts[0][1]} prompts" + (f" (seed 1 of {seeds})" if seeds > 1 else "")
    return [judged(claim, f"{variants[0]} MATH-500 T0", estimate, estimate, {"temperature": 0.0},
                   key=("blocks", variants[0], *sorted((k, str(v)) for k, v in claim["measure"].items())),
                   seeds=seeds, note=note + (f", {seeds} training seeds" if seeds > 1 else ""))]


def _rho(blocks: np.ndarray) -> np.ndarray:
    """The 3 x 3 Spearman matrix of ``BLOCK_COLUMNS``."""
    return stats.spearmanr(blocks).statistic


def _rho_gap(blocks: np.ndarray) -> float:
    """rho(S~, tau_b) - rho(sum q, tau_b)."""
    rho = _rho(blocks)
    return float(rho[0, 2] - rho[1, 2])


def measure_correlation(claim: dict, results: Path) -> list[Finding]:
    """Spearman rho(S~, tau_b) over the blocks of Table 1's shallowest DFlash drafter (Table 8, Figure 1a); ``of:
    sum_q``: rho(sum q, tau_b) instead."""
    column = BLOCK_COLUMNS.index(claim["measure"].get("of", "surrogate"))
    return _block_statistic(claim, results, lambda blocks: float(_rho(blocks)[column, 2]))


def smallest_bin_rise(blocks: np.ndarray, bins: int) -> float:
    """The blocks cut into ``bins`` equal-count bins of S~ (the first column), the mean tau_b (the last) of each:
    the smallest rise from one bin to the next. Above 0: binned tau rises with S~ at every bin (Figure 1a's line
    of bin means)."""
    if len(blocks) < 2 * bins:  # bins of fewer than two blocks: no mean to speak of
        return math.nan
    order = np.argsort(blocks[:, 0], kind="stable")
    means = np.array([chunk.mean() for chunk in np.array_split(blocks[order, -1], bins)])
    return float(np.diff(means).min())


def measure_bin_rise(claim: dict, results: Path) -> list[Finding]:
    """Figure 1a: tau_b's bin means against S~ over the blocks of Table 1's shallowest DFlash drafter, the smallest
    rise between neighbouring bins (``bins``, default 5); prompts resampled."""
    bins = int(claim["measure"].get("bins", 5))
    return _block_statistic(claim, results, lambda blocks: smallest_bin_rise(blocks, bins))


def measure_correlation_gap(claim: dict, results: Path) -> list[Finding]:
    """rho(S~, tau_b) - rho(sum q, tau_b) over the same blocks (Table 8)."""
    return _block_statistic(claim, results, _rho_gap)


def _train_steps(results: Path) -> pd.DataFrame:
    return read_csv(results, "main_train_steps.csv")


def measure_step_time(claim: dict, results: Path) -> list[Finding]:
    """D-PACE's training step time over DFlash's, minus 1, from Table 7's step timing job (``dpace.step_timing``:
    Table 1's shallowest pair's optimizer steps interleaved in one process, repeated), with an interval over
    repeats and steps (``dpace.report.timing.step_ratio``). Where the machine does not repeat the timing (the
    halves of the repeats disagree, or the ratio moves between repeats by more than ``max_spread``), the cell is
    "not measurable on this machine", never judged."""
    m = claim["measure"]
    main = read_csv(results, "main.csv")
    dflash = main[main["variant"] == _main_variant(results, "dflash")]
    path = results / STEP_TIMING.format(target=dflash["target"].iloc[0])
    if not path.exists() or path.stat().st_size == 0:
        raise NotRun(f"{path.relative_to(results)} not built")
    times = pd.read_csv(path)
    if times.empty:
        raise NotRun(f"{path.relative_to(results)} has no rows")
    result = step_ratio(times, "dpace", "dflash", resamples=RESAMPLES, seed=SEED, level=LEVEL,
                        max_spread=float(m.get("max_spread", MAX_REPEAT_SPREAD)))
    estimate = (result["value"], result["ci_low"], result["ci_high"])
    return [judged(claim, "Table 1's shallowest pair, interleaved", estimate, estimate, {}, key=("timing", "step"),
                    measurable=result["stable"],
                    note=f"{result['num_repeats']} repeats x {result['num_steps']} steps of each, interleaved in one "
                         f"process; {result['note']}")]


def _logged_weights(results: Path, variant: str) -> np.ndarray:
    """The per-step batch-mean position weights of ``variant`` ([steps, positions]) from its training log."""
    steps = _train_steps(results)
    rows = steps[steps["variant"] == variant].sort_values("step")
    weights = rows.filter(regex=r"^w_\d+$")
    if rows.empty or weights.empty:
        raise NotRun(f"no logged weights of {variant} in metrics/main_train_steps.csv")
    return weights.to_numpy(float)


def _weighted_position(w: np.ndarray) -> np.ndarray:
    """The mean weighted block position sum_j j w_j / sum_j w_j of each step's weights."""
    positions = np.arange(w.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nansum(w * positions, axis=1) / np.nansum(w, axis=1)


def measure_weight_shift(claim: dict, results: Path) -> list[Finding]:
    """The mean weighted block position sum_j j w_j / sum_j w_j of D-PACE's logged weights: its average over
    the last ``window`` of training minus that over the first (in steps, fraction of all); every training seed,
    averaged over the seeds (:func:`_over_seeds`)."""
    variants = _main_variants(results, "dpace")
    points, draws = [], []
    for variant in variants:
        centre = _weighted_position(_logged_weights(results, variant))
        count = max(1, math.ceil(float(claim["measure"].get("window", 0.1)) * len(centre)))
        # Contiguous windows of each stretch are resampled, not steps: neighbouring steps' weights move together.
        early, late = window_means(centre[:count], 10), window_means(centre[-count:], 10)
        point, values = _bootstrap_draws([late, early], lambda late, early: float(late.mean() - early.mean()))
        points.append(point)
        draws.append(values)
    estimate = _over_seeds(points, draws)
    seeds = len(variants)
    return [judged(claim, variants[0], estimate, estimate, {}, key=("weights", variants[0]), seeds=seeds,
                   note=f"first and last {count} of {len(centre)} steps, {len(early)} windows each"
                        + (f", {seeds} training seeds" if seeds > 1 else ""))]


def _shares(w: np.ndarray) -> np.ndarray:
    """Each step's weights as shares of the step's total weight ([steps, positions])."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return w / np.nansum(w, axis=1, keepdims=True)


def update_variation(w: np.ndarray, trend_steps: int) -> np.ndarray:
    """Per step, the mean over positions of the squared deviation of the weight shares from their trend (a
    centred moving average over ``trend_steps`` steps): how far one update's weights move off the course the
    training takes (Figure 3b's variation across updates, not Figure 3a's drift)."""
    shares = _shares(w)
    kernel = np.ones(trend_steps) / trend_steps
    trend = np.stack([np.convolve(column, kernel, mode="same") for column in shares.T], axis=1)
    half = trend_steps // 2
    inner = slice(half, len(shares) - half)  # the moving average is whole only away from the ends
    return np.nanmean((shares[inner] - trend[inner]) ** 2, axis=1)


def measure_weight_variation(claim: dict, results: Path) -> list[Finding]:
    """Figure 3b: the root-mean-square deviation of D-PACE's logged per-position weight shares from their
    moving-average trend across updates (``trend_steps``, default 10), in shares of a step's weight; contiguous
    windows of steps resampled; every training seed (:func:`_over_seeds`). DFlash's fixed decay gives 0."""
    trend_steps = int(claim["measure"].get("trend_steps", 10))
    variants = _main_variants(results, "dpace")
    points, draws = [], []
    for variant in variants:
        weights = _logged_weights(results, variant)
        if len(weights) < trend_steps + 2:
            raise NotRun(f"{variant} logged {len(weights)} steps: too few for a trend over {trend_steps}")
        per_step = update_variation(weights, trend_steps)
        windows = window_means(per_step, 10)
        point, values = _bootstrap_draws([windows], lambda x: float(np.sqrt(x.mean())))
        points.append(point)
        draws.append(values)
    estimate = _over_seeds(points, draws)
    seeds = len(variants)
    return [judged(claim, variants[0], estimate, estimate, {}, key=("weight_variation", variants[0]), seeds=seeds,
                   note=f"{len(per_step)} steps, {len(windows)} windows" + (f", {seeds} training seeds" if seeds > 1 else ""))]


def _smoothing_variants(results: Path, alpha: float, experiment: str = "smoothing") -> list[str]:
    """The sweep's D-PACE drafter at ``alpha`` (the shallowest, smallest block size), one per seed."""
    metrics = read_csv(results, f"{experiment}.csv")
    rows = metrics[(metrics["objective"] == "dpace") & np.isclose(pd.to_numeric(metrics["alpha"]), alpha)]
    if rows.empty:
        raise NotRun(f"no D-PACE drafter at alpha {alpha:g} in metrics/{experiment}.csv")
    rows = rows.sort_values(["depth", "block_size"])
    first = rows.iloc[0]
    rows = rows[(rows["depth"] == first["depth"]) & (rows["block_size"] == first["block_size"])]
    if "training_seed" in rows:
        rows = rows.assign(seed_key=rows["training_seed"].fillna(0)).sort_values("seed_key", kind="stable")
    return list(dict.fromkeys(rows["variant"].astype(str)))


def measure_late_weight(claim: dict, results: Path) -> list[Finding]:
    """Smoothing keeps later positions' weights alive: the later half's share of D-PACE's weight at the end of
    training (``window``) at ``alpha`` minus that at ``reference_alpha`` (0: no smoothing, the cumulative product
    free to vanish), from the smoothing sweep's training logs; steps resampled in contiguous windows, seeds paired
    by order."""
    m = claim["measure"]
    window = float(m.get("window", 0.1))
    experiment = m.get("experiment", "smoothing")
    steps = read_csv(results, f"{experiment}_train_steps.csv")
    pairs = list(zip(_smoothing_variants(results, float(m["alpha"]), experiment),
                     _smoothing_variants(results, float(m.get("reference_alpha", 0.0)), experiment), strict=False))
    points, draws = [], []
    for ours, theirs in pairs:
        parts = []
        for variant in (ours, theirs):
            rows = steps[steps["variant"] == variant].sort_values("step")
            w = rows.filter(regex=r"^w_\d+$").to_numpy(float)
            if not len(w):
                raise NotRun(f"no logged weights of {variant} in metrics/{experiment}_train_steps.csv")
            count = max(1, math.ceil(window * len(w)))
            tail = _shares(w[-count:])
            parts.append(window_means(tail[:, tail.shape[1] // 2:].sum(axis=1), 10))
        point, values = _bootstrap_draws(parts, lambda a, b: float(np.nanmean(a) - np.nanmean(b)))
        points.append(point)
        draws.append(values)
    estimate = _over_seeds(points, draws)
    return [judged(claim, f"{pairs[0][0]} - {pairs[0][1]}", estimate, estimate, {}, key=("late_weight", *pairs[0]),
                   seeds=len(pairs), note=f"later half's share of the weight, last {window:.0%} of the steps"
                   + (f", {len(pairs)} training seeds" if len(pairs) > 1 else ""))]


MEASURES: dict[str, Callable[[dict, Path], list[Finding]]] = {
    "comparison": measure_comparison,
    "contrast": measure_contrast,
    "ratio": measure_contrast,
    "correlation": measure_correlation,
    "correlation_gap": measure_correlation_gap,
    "step_time": measure_step_time,
    "weight_shift": measure_weight_shift,
    "weight_variation": measure_weight_variation,
    "late_weight": measure_late_weight,
    "bin_rise": measure_bin_rise,
}

# --- scale: gradients of a gain ------------------------------------------------------------------------------

def measure_gradient(claim: dict, results: str | Path) -> list[dict]:
    """The claim's ``gradient``: the slope of D-PACE's tau gain over DFlash across strata (``over``:
    benchmark or epoch) against a third drafter's tau (``stratifier``), per run cell (``dpace.report.scale``).
    Empty when the artifacts or the third drafter are missing."""
    g, results = claim["gradient"], Path(results)
    over = g["over"]
    try:
        metrics = read_csv(results, f"{g['experiment']}.csv")
    except NotRun:
        return []
    rows = metrics[metrics["benchmark"] == g["benchmark"]] if over == "epoch" else _at_epoch(metrics, "final")
    rows = _filtered(rows, dict(g.get("where", {})))
    roles = {"ours": g.get("objective", "dpace"), "reference": "dflash", "stratifier": g["stratifier"]}
    out = []
    for _, cell in rows.groupby([c for c in CELL_COLUMNS if c != over], sort=True):
        # Each role: one method, its training seeds (every seed read; seed i of each role paired).
        drafters = {role: _seed_rows(cell[cell["objective"] == objective]) for role, objective in roles.items()}
        if any(d is None for d in drafters.values()) or len({tuple(d) for d in drafters.values()}) != 1:
            continue
        strata = sorted(set.intersection(*(set(rows[over]) for d in drafters.values() for rows in d.values())))
        if len(strata) < 3:
            continue
        sums = {role: [] for role in roles}
        try:
            for stratum in strata:
                requests = {role: [next(iter(_requests(results, r[r[over] == stratum].iloc[0], [
                    r[r[over] == stratum].iloc[0]["benchmark"]]).values())) for r in d.values()]
                    for role, d in drafters.items()}
                prompt_ids = sorted({str(r["id"]) for r in requests["ours"][0]})
                for role in roles:
                    sums[role].append(np.stack([_prompt_sums(seed_requests, prompt_ids)
                                                for seed_requests in requests[role]]))
        except (NotRun, StopIteration):
            continue
        result = gain_slope(sums["ours"], sums["reference"], sums["stratifier"], resamples=RESAMPLES, seed=SEED,
                            level=LEVEL)
        out.append({**result, "cell": _cell_label(cell.iloc[0][[c for c in CELL_COLUMNS if c != over]]),
                    "over": over, "stratifier": g["stratifier"], "strata_names": [str(s) for s in strata]})
    return out


