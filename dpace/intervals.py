"""Paired bootstrap confidence intervals for the difference between two drafters.

Every drafter of an experiment is evaluated on the same prompts, so a comparison resamples
prompts (within each benchmark, with replacement) and applies the same resample to both drafters:
the prompt-to-prompt spread, which both share, cancels out of the difference. The statistic is the
one the tables print: per benchmark, tau = mean over requests of the per-request mean emitted length
and SR = mean AR time per output token / mean speculative time per output token; "avg" is their mean
over the benchmarks. A difference is *significant* when its 95% percentile interval excludes 0. With few
prompts per benchmark the plain bootstrap is too narrow by sqrt((n-1)/n); each benchmark's resamples are
widened by the inverse, and a benchmark with a single prompt gives no interval (NaN, never significant).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

METRICS = ("tau", "speedup")
COMPARISON_COLUMNS = [
    "target", "experiment", "epoch", "suite", "temperature", "depth", "block_size", "variant", "objective",
    "reference_variant", "metric", "benchmark", "value", "reference_value", "difference",
    "relative_difference", "ci_low", "ci_high", "significant", "num_prompts", "resamples",
]


def _prompt_sums(requests: Sequence[dict], prompt_ids: Sequence[str]) -> np.ndarray:
    """Per prompt: [requests with a tau, sum of tau, sum of AR tpot, sum of speculative tpot].

    SR is a ratio of mean times over the same requests, so sums suffice; a request without emitted
    blocks (tau None) still counts in the times, as in ``dpace.evaluation.summarize``.
    """
    index = {prompt_id: i for i, prompt_id in enumerate(prompt_ids)}
    sums = np.zeros((len(prompt_ids), 4))
    for request in requests:
        has_tau = request["tau"] is not None
        sums[index[str(request["id"])]] += (
            float(has_tau), request["tau"] if has_tau else 0.0, request["ar_tpot_s"], request["spec_tpot_s"])
    return sums


def _statistics(sums: np.ndarray) -> dict[str, np.ndarray]:
    """tau and SR from summed prompt rows; ``sums`` is [..., prompts, 4], the result [...]."""
    total = sums.sum(axis=-2)
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample of prompts without any tau: NaN
        return {"tau": total[..., 1] / total[..., 0], "speedup": total[..., 2] / total[..., 3]}


def paired_bootstrap(
    requests: dict[str, Sequence[dict]],
    reference_requests: dict[str, Sequence[dict]],
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> list[dict]:
    """Differences (drafter - reference) with percentile intervals, per benchmark and averaged.

    ``requests[benchmark]`` lists one dict per request (``id`` of its prompt, ``tau``, ``ar_tpot_s``,
    ``spec_tpot_s``); both drafters must have answered exactly the same prompts of each benchmark.
    """
    if set(requests) != set(reference_requests):
        raise ValueError(f"benchmarks differ: {sorted(requests)} vs {sorted(reference_requests)}")
    generator = np.random.default_rng(seed)
    tail = (1.0 - level) / 2.0
    rows, resampled_differences, point_values = [], {m: [] for m in METRICS}, {m: [] for m in METRICS}
    for benchmark in sorted(requests):
        prompt_ids = sorted({str(r["id"]) for r in requests[benchmark]})
        reference_ids = sorted({str(r["id"]) for r in reference_requests[benchmark]})
        if prompt_ids != reference_ids:
            raise ValueError(f"{benchmark}: the two drafters were evaluated on different prompts")
        ours = _prompt_sums(requests[benchmark], prompt_ids)
        theirs = _prompt_sums(reference_requests[benchmark], prompt_ids)
        # One index matrix for both drafters: that is what makes the bootstrap paired.
        draws = generator.integers(0, len(prompt_ids), size=(resamples, len(prompt_ids)))
        ours_point, theirs_point = _statistics(ours), _statistics(theirs)
        ours_boot, theirs_boot = _statistics(ours[draws]), _statistics(theirs[draws])
        # Resampling n prompts spreads a mean by (n-1)/n of its true variance; widen each benchmark's
        # resamples by sqrt(n/(n-1)) around its point estimate (the unbiased variance). One prompt
        # carries no spread at all: its benchmark, and the average over benchmarks, get no interval.
        widen = math.sqrt(len(prompt_ids) / (len(prompt_ids) - 1)) if len(prompt_ids) > 1 else math.nan
        for metric in METRICS:
            point_difference = ours_point[metric] - theirs_point[metric]
            differences = point_difference + widen * (ours_boot[metric] - theirs_boot[metric] - point_difference)
            resampled_differences[metric].append(differences)
            point_values[metric].append((ours_point[metric], theirs_point[metric]))
            rows.append(_row(benchmark, metric, ours_point[metric], theirs_point[metric], differences, tail,
                             len(prompt_ids), resamples))
    for metric in METRICS:
        ours_avg, theirs_avg = np.mean(point_values[metric], axis=0)
        differences = np.mean(resampled_differences[metric], axis=0)
        prompts = sum(row["num_prompts"] for row in rows if row["metric"] == metric)
        rows.append(_row("avg", metric, ours_avg, theirs_avg, differences, tail, prompts, resamples))
    return rows


def paired_contrast(
    drafters: Sequence[dict[str, Sequence[dict]]],
    weights: Sequence[float],
    *,
    metric: str = "tau",
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """A weighted sum of drafters' statistics, averaged over benchmarks, with a paired percentile interval.

    ``drafters[i][benchmark]`` lists drafter i's requests as in :func:`paired_bootstrap`; the contrast is
    sum_i ``weights[i]`` * statistic_i (one drafter with weight 1: its own value; weights 1, -1: the
    difference :func:`paired_bootstrap` gives, draw for draw; 1, -1, -1, 1: a difference of two
    differences). Every drafter is resampled with the same prompt draws and widened as there.
    """
    if len(drafters) != len(weights) or not drafters:
        raise ValueError(f"{len(drafters)} drafter(s) for {len(weights)} weight(s)")
    benchmarks = sorted(drafters[0])
    if any(sorted(d) != benchmarks for d in drafters):
        raise ValueError(f"benchmarks differ between drafters: {[sorted(d) for d in drafters]}")
    generator = np.random.default_rng(seed)
    tail = (1.0 - level) / 2.0
    w = np.asarray(weights, dtype=float)
    points, resampled, prompts = [], [], 0
    for benchmark in benchmarks:
        prompt_ids = sorted({str(r["id"]) for r in drafters[0][benchmark]})
        if any(sorted({str(r["id"]) for r in d[benchmark]}) != prompt_ids for d in drafters):
            raise ValueError(f"{benchmark}: the drafters were evaluated on different prompts")
        sums = np.stack([_prompt_sums(d[benchmark], prompt_ids) for d in drafters])  # [drafters, prompts, 4]
        # The same draws as paired_bootstrap's for this benchmark, shared by every drafter.
        draws = generator.integers(0, len(prompt_ids), size=(resamples, len(prompt_ids)))
        point = w @ _statistics(sums)[metric]
        boot = w @ _statistics(sums[:, draws])[metric]  # [drafters, resamples] -> [resamples]
        widen = math.sqrt(len(prompt_ids) / (len(prompt_ids) - 1)) if len(prompt_ids) > 1 else math.nan
        points.append(point)
        resampled.append(point + widen * (boot - point))
        prompts += len(prompt_ids)
    value = float(np.mean(points))
    contrasts = np.mean(resampled, axis=0)
    low, high = np.quantile(contrasts, [tail, 1.0 - tail]) if np.isfinite(contrasts).all() else (math.nan, math.nan)
    return {"value": value, "ci_low": float(low), "ci_high": float(high), "num_prompts": prompts,
            "resamples": resamples}


def _row(benchmark, metric, value, reference, differences, tail, prompts, resamples) -> dict:
    low, high = np.quantile(differences, [tail, 1.0 - tail]) if np.isfinite(differences).all() else (math.nan, math.nan)
    return {
        "metric": metric,
        "benchmark": benchmark,
        "value": float(value),
        "reference_value": float(reference),
        "difference": float(value - reference),
        "relative_difference": float((value - reference) / reference),
        "ci_low": float(low),
        "ci_high": float(high),
        "significant": bool(low > 0 or high < 0),
        "num_prompts": int(prompts),
        "resamples": int(resamples),
    }


def experiment_comparisons(
    evaluations: pd.DataFrame, *, reference_objective: str = "dflash", resamples: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """Every drafter against the experiment's reference drafter of the same target, depth, block size, epoch,
    suite and temperature (Table 1's DFlash row for each D-PACE row, and so on).

    ``evaluations`` has one row per (variant, epoch, suite, benchmark, temperature) with the metrics
    columns and ``requests`` (the per-request list of that evaluation's summary row).
    """
    keys = ["target", "experiment", "epoch", "suite", "temperature", "depth", "block_size"]
    rows = []
    for key, cell in evaluations.groupby(keys, sort=True, dropna=False):
        reference = cell[cell["objective"] == reference_objective]
        if reference["variant"].nunique() != 1:
            continue  # no single reference in this cell: nothing to compare against
        reference_variant = reference["variant"].iloc[0]
        reference_requests = dict(zip(reference["benchmark"], reference["requests"], strict=True))
        for variant, drafter in cell[cell["variant"] != reference_variant].groupby("variant", sort=True):
            drafter_requests = dict(zip(drafter["benchmark"], drafter["requests"], strict=True))
            common = sorted(set(drafter_requests) & set(reference_requests))
            for result in paired_bootstrap(
                {b: drafter_requests[b] for b in common}, {b: reference_requests[b] for b in common},
                resamples=resamples, seed=seed,
            ):
                rows.append({
                    **dict(zip(keys, key, strict=True)), "variant": variant,
                    "objective": drafter["objective"].iloc[0], "reference_variant": reference_variant, **result,
                })
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def compare_summaries(summary_path, reference_path, *, resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One drafter's evaluation (an ``evaluate`` job's ``summary.json``) against another's, per temperature.

    For drafters that no experiment pairs: two runs, two training seeds, two configs. Both must have
    decoded the same prompts (the same ``data`` settings and seed), as the tables' comparisons require.
    """
    def requests_by_temperature(path) -> dict[float, dict[str, list]]:
        cells: dict[float, dict[str, list]] = {}
        for row in json.loads(Path(path).read_text()):
            cells.setdefault(float(row["temperature"]), {})[row["benchmark"]] = row["requests"]
        return cells

    ours, theirs = requests_by_temperature(summary_path), requests_by_temperature(reference_path)
    if set(ours) != set(theirs):
        raise ValueError(f"temperatures differ: {sorted(ours)} in {summary_path}, {sorted(theirs)} in {reference_path}")
    rows = [
        {"temperature": temperature, **result}
        for temperature in sorted(ours)
        for result in paired_bootstrap(ours[temperature], theirs[temperature], resamples=resamples, seed=seed)
    ]
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(
        prog="python -m dpace.intervals",
        description="Paired bootstrap of tau and SR: drafter A's evaluation summary.json against drafter B's.",
    )
    parser.add_argument("summary", help="drafter A: results/eval/<target>/<variant>/epoch-<e>/<suite>/summary.json")
    parser.add_argument("reference", help="drafter B (the reference), evaluated on the same prompts")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    table = compare_summaries(args.summary, args.reference, resamples=args.resamples, seed=args.seed)
    columns = ["temperature", "metric", "benchmark", "value", "reference_value", "difference", "ci_low", "ci_high",
               "significant", "num_prompts"]
    print(table[columns].to_string(index=False, float_format=lambda value: f"{value:.3f}"))
    return table


if __name__ == "__main__":
    main()
