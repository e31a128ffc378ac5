"""Paired bootstrap confidence intervals for the difference between two drafters.

Every drafter of an experiment is evaluated on the same prompts, so a comparison resamples
prompts (within each benchmark, with replacement) and applies the same resample to both drafters:
the prompt-to-prompt spread, which both share, cancels out of the difference. The statistic is the
one the tables print: per benchmark, tau = mean over requests of the per-request mean emitted length
and SR = mean AR time per output token / mean speculative time per output token; "avg" is their mean
over the benchmarks. A difference is *significant* when its 95% percentile interval excludes 0. With few
prompts per benchmark the plain bootstrap is too narrow by sqrt((n-1)/n); each benchmark's resamples are
widened by the inverse, and a benchmark with a single prompt gives no interval (NaN, never significant).

With several training seeds of each drafter (``train.seeds``) the statistic is the mean over seeds, and
the bootstrap has two levels (``hierarchical_bootstrap``): each resample draws seeds with replacement and,
independently, prompts with replacement; every seed of both drafters is scored on the same resampled
prompts. Seed i of one objective and seed i of another start from the same initial weights and see the
same data order and anchors (the seed fixes all three; the objective changes none), so seeds are paired
by their value, like prompts: one seed draw serves both drafters. Drafters trained on different seed
sets are resampled independently. ``variance_components`` splits the estimate's variance into its
prompt and training-seed parts (two-way ANOVA on the prompts x seeds table).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from dpace.io import read_json

METRICS = ("tau", "speedup")
COMPARISON_COLUMNS = [
    "target", "experiment", "epoch", "suite", "temperature", "depth", "block_size", "variant", "objective",
    "reference_variant", "metric", "benchmark", "value", "reference_value", "difference",
    "relative_difference", "ci_low", "ci_high", "significant", "num_prompts", "resamples",
    "num_seeds", "reference_num_seeds", "seed_pairing", "var_prompts", "var_seeds",
    # SR rows of a timing job (dpace.report.timing.interleaved_comparisons): its repeats, and whether the
    # machine repeats the timing (False: the scorecard says "not measurable on this machine")
    "num_repeats", "timing_stable", "repeat_spread", "timing_note",
]


def _prompt_sums(requests: Sequence[dict], prompt_ids: Sequence[str]) -> np.ndarray:
    """Per prompt: [requests with a tau, sum of tau, sum of AR tpot, sum of speculative tpot].

    SR is a ratio of mean times over the same requests, so sums suffice; a request without emitted
    blocks (tau None) still counts in the times, as in ``dpace.evaluation.evaluate.summarize``.
    """
    index = {prompt_id: i for i, prompt_id in enumerate(prompt_ids)}
    sums = np.zeros((len(prompt_ids), 4))
    for request in requests:
        if str(request["id"]) not in index:
            continue
        has_tau = request["tau"] is not None
        sums[index[str(request["id"])]] += (
            float(has_tau), request["tau"] if has_tau else 0.0, request["ar_tpot_s"] or 0.0, request["spec_tpot_s"] or 0.0)
    return sums


# The (numerator, denominator) columns of ``_prompt_sums`` whose ratio of sums each metric is.
RATIOS = {"tau": (1, 0), "speedup": (2, 3)}


def _timed_prompts(requests: Sequence[dict]) -> set[str]:
    """Prompts whose every request was timed (replayed tau times only a subset: SR comes from it)."""
    prompts = {str(r["id"]) for r in requests}
    return prompts - {str(r["id"]) for r in requests if r.get("spec_tpot_s") is None or r.get("ar_tpot_s") is None}


def _statistics(sums: np.ndarray) -> dict[str, np.ndarray]:
    """tau and SR from summed prompt rows; ``sums`` is [..., prompts, 4], the result [...]."""
    total = sums.sum(axis=-2)
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample of prompts without any tau: NaN
        return {metric: total[..., num] / total[..., den] for metric, (num, den) in RATIOS.items()}


def _linearized(sums: np.ndarray, metric: str) -> np.ndarray:
    """Per-prompt values whose plain mean is the ratio statistic: [seeds, prompts, 4] -> [seeds, prompts].

    A ratio of sums R = sum(num) / sum(den) moves, to first order, with the mean of
    R + (num_p - R den_p) / mean(den): the linearization that lets a ratio take part in the variance
    decomposition of means. One request with a tau per prompt: each prompt's value is its tau.
    """
    num, den = sums[..., RATIOS[metric][0]], sums[..., RATIOS[metric][1]]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = num.sum(axis=-1, keepdims=True) / den.sum(axis=-1, keepdims=True)
        return ratio + (num - ratio * den) / den.mean(axis=-1, keepdims=True)


def _seed_widening(seeds: int, tail: float) -> float:
    """The factor on one drafter's seed deviations: sqrt(n/(n-1)) for the bootstrap's biased variance,
    times t_{n-1}/z at the interval's quantile, because n seeds estimate their own spread with n - 1
    degrees of freedom (unwidened, a bootstrap over 3 seeds covers about 80% of the time, not 95%).
    One seed has no spread: 0."""
    if seeds < 2:
        return 0.0
    from scipy import stats

    return math.sqrt(seeds / (seeds - 1)) * float(stats.t.ppf(1.0 - tail, seeds - 1) / stats.norm.ppf(1.0 - tail))


def _interaction_mean_square(table: np.ndarray) -> float:
    """The seeds x prompts interaction's mean square of a [seeds, prompts] table (two-way ANOVA without
    replication); 0 where it is not identified (one prompt), which counts it with the seeds."""
    seeds, prompts = table.shape
    if seeds < 2 or prompts < 2:
        return 0.0
    residual = table - table.mean(axis=1, keepdims=True) - table.mean(axis=0, keepdims=True) + table.mean()
    return float((residual**2).sum() / ((seeds - 1) * (prompts - 1)))


def _seed_variance(tables: Sequence[np.ndarray]) -> float:
    """sigma_seed^2 / n of one set of [seeds, prompts] tables (one per benchmark, averaged): the spread
    of the seeds' own estimates less the part of it that their prompt-level interaction explains."""
    seeds = tables[0].shape[0]
    if seeds < 2:
        return math.nan
    per_seed = np.mean([table.mean(axis=1) for table in tables], axis=0)
    interaction = sum(_interaction_mean_square(table) / table.shape[1] for table in tables) / len(tables) ** 2
    return max(0.0, float(per_seed.var(ddof=1)) - interaction) / seeds


def variance_components(
    ours: Sequence[np.ndarray], theirs: Sequence[np.ndarray] | None = None, *, paired_seeds: bool = True
) -> tuple[float, float]:
    """(prompts, training seeds): the two parts of the variance of the estimate
    mean over benchmarks b of mean over seeds and prompts of (``ours[b]`` - ``theirs[b]``).

    ``ours[b]`` is a [seeds, prompts] table of per-prompt values of benchmark b (``theirs`` None: one
    drafter alone). Within a benchmark, value[s, p] = mu + u_s + b_p + e_sp (seed effect, prompt effect,
    their interaction), and the estimate's variance is sigma_u^2 / n_seeds (seeds) plus
    sigma_b^2 / n_prompts + sigma_e^2 / (n_seeds n_prompts) (prompts: what drawing other prompts would
    change), each estimated without bias by the ANOVA mean squares. Seeds paired across the drafters
    enter as the per-seed difference; unpaired, each drafter's seed variance adds. The seed part is
    NaN with one seed, the prompt part NaN with one prompt in a benchmark.
    """
    if theirs is not None and paired_seeds:
        ours, theirs = [a - b for a, b in zip(ours, theirs, strict=True)], None
    columns = [a.mean(axis=0) - (0.0 if theirs is None else b.mean(axis=0))
               for a, b in zip(ours, theirs if theirs is not None else ours, strict=True)]
    prompts = sum(float(c.var(ddof=1)) / len(c) if len(c) > 1 else math.nan for c in columns) / len(columns) ** 2
    seeds = _seed_variance(ours) + (0.0 if theirs is None else _seed_variance(theirs))
    return prompts, seeds


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
    One training seed each: ``hierarchical_bootstrap`` with its seed level left out.
    """
    return hierarchical_bootstrap([requests], [reference_requests], resamples=resamples, seed=seed, level=level)


class _SeedDraws(NamedTuple):
    """The training seeds each resample draws, per drafter ([resamples, seeds]; the same array when seeds are
    paired), and the factor on each drafter's seed deviations (``_seed_widening``)."""

    ours: np.ndarray
    theirs: np.ndarray
    ours_widen: float
    theirs_widen: float


def _seed_draws(ours_seeds: int, theirs_seeds: int, paired: bool, seed: int, resamples: int, tail: float) -> _SeedDraws:
    seed_generator = np.random.default_rng([seed, 1])  # training seeds: shared by every benchmark
    ours = seed_generator.integers(0, ours_seeds, size=(resamples, ours_seeds))
    theirs = ours if paired else seed_generator.integers(0, theirs_seeds, size=(resamples, theirs_seeds))
    return _SeedDraws(ours, theirs, _seed_widening(ours_seeds, tail), _seed_widening(theirs_seeds, tail))


def over_seeds(points: Sequence[float], draws: Sequence[np.ndarray], *, level: float = 0.95,
               seed: int = 0) -> tuple[float, float, float]:
    """One estimate per training seed (``points``) with each seed's own resampled values (``draws``, [resamples]
    each), as one estimate over the seeds: their mean, with an interval whose seed part (seeds drawn, paired
    across whatever the estimates contrast) is widened by ``_seed_widening`` as the comparisons' is and whose
    prompt part is the drawn seeds' own resampling. One seed: its percentile interval."""
    points, draws = np.asarray(points, float), np.stack(draws)  # [seeds], [seeds, resamples]
    tail = (1.0 - level) / 2.0
    seeds = _seed_draws(len(points), len(points), True, seed, draws.shape[1], tail)
    value = float(points.mean())
    seeds_drawn = points[seeds.ours].mean(axis=1)  # [resamples]
    both = np.take_along_axis(draws.T, seeds.ours, axis=1).mean(axis=1)
    resampled = value + seeds.ours_widen * (seeds_drawn - value) + (both - seeds_drawn)
    if not np.isfinite(draws).any(axis=1).all():  # a seed without an interval of its own: none over the seeds
        return value, math.nan, math.nan
    low, high = np.nanquantile(resampled, [tail, 1.0 - tail])
    return value, float(low), float(high)


def _common_benchmarks(drafters: Sequence[Sequence[dict]], paired_seeds: bool) -> list[str]:
    """The benchmarks every seed of every drafter answered (``drafters[i]``: drafter i's requests by benchmark,
    one dict per training seed); drafters that cannot be compared are refused."""
    if any(not seeds for seeds in drafters):
        raise ValueError("each drafter needs at least one training seed")
    if paired_seeds and len({len(seeds) for seeds in drafters}) > 1:
        raise ValueError("paired seeds need as many seeds of each drafter: "
                         + " vs ".join(str(len(seeds)) for seeds in drafters))
    benchmarks = set(drafters[0][0])
    for by_benchmark in (b for seeds in drafters for b in seeds):
        if set(by_benchmark) != benchmarks:
            raise ValueError(f"benchmarks differ: {sorted(benchmarks)} vs {sorted(by_benchmark)}")
    return sorted(benchmarks)


def _prompt_draws(
    benchmark: str, drafters: Sequence[dict], generator: np.random.Generator, resamples: int
) -> dict[str, tuple[list[str], np.ndarray]]:
    """Per metric, the prompts of ``benchmark`` it is measured on and their resampled indices
    [resamples, prompts], shared by every seed of every drafter in ``drafters``."""
    prompt_ids = sorted({str(r["id"]) for r in drafters[0][benchmark]})
    for by_benchmark in drafters:
        if sorted({str(r["id"]) for r in by_benchmark[benchmark]}) != prompt_ids:
            raise ValueError(f"{benchmark}: the drafters were evaluated on different prompts")
    # tau comes from every prompt; SR only from the prompts whose every request was timed (replayed
    # tau decodes a subset for real), resampled among themselves, paired too.
    timed = sorted(set(prompt_ids).intersection(*(_timed_prompts(d[benchmark]) for d in drafters)))
    # One index matrix for both drafters and all their seeds: that is what makes the bootstrap paired.
    draws = generator.integers(0, len(prompt_ids), size=(resamples, len(prompt_ids)))
    prompts_of = {"tau": (prompt_ids, draws), "speedup": (prompt_ids, draws)}
    if timed != prompt_ids:
        timed_draws = generator.integers(0, max(len(timed), 1), size=(resamples, len(timed)))
        prompts_of["speedup"] = (timed, timed_draws)
    return prompts_of


def _resampled_differences(
    ours: np.ndarray, theirs: np.ndarray, metric: str, draws: np.ndarray, seeds: _SeedDraws
) -> tuple[float, float, np.ndarray]:
    """(ours, theirs, differences [resamples]): one metric of one benchmark, its mean over seeds per drafter
    and the resampled difference; ``ours`` and ``theirs`` are [seeds, prompts, 4] prompt sums."""
    ours_point, theirs_point = _statistics(ours)[metric], _statistics(theirs)[metric]  # [seeds]
    # [seeds, resamples]
    ours_boot, theirs_boot = _statistics(ours[:, draws])[metric], _statistics(theirs[:, draws])[metric]
    # Resampling n prompts spreads a mean by (n-1)/n of its true variance; widen each benchmark's
    # resamples by sqrt(n/(n-1)) around its point estimate (the unbiased variance). One prompt
    # carries no spread at all: its benchmark, and the average over benchmarks, get no interval.
    count = ours.shape[1]
    widen = math.sqrt(count / (count - 1)) if count > 1 else math.nan
    ours_mean, theirs_mean = ours_point.mean(), theirs_point.mean()
    # Seeds drawn, every prompt kept; then each drawn seed scored on the resample's prompts.
    ours_seeds, theirs_seeds = ours_point[seeds.ours].mean(axis=1), theirs_point[seeds.theirs].mean(axis=1)
    ours_both = np.take_along_axis(ours_boot.T, seeds.ours, axis=1).mean(axis=1)
    theirs_both = np.take_along_axis(theirs_boot.T, seeds.theirs, axis=1).mean(axis=1)
    seed_part = seeds.ours_widen * (ours_seeds - ours_mean) - seeds.theirs_widen * (theirs_seeds - theirs_mean)
    prompt_part = (ours_both - theirs_both) - (ours_seeds - theirs_seeds)
    return ours_mean, theirs_mean, (ours_mean - theirs_mean) + seed_part + widen * prompt_part


def hierarchical_bootstrap(
    requests: Sequence[dict[str, Sequence[dict]]],
    reference_requests: Sequence[dict[str, Sequence[dict]]],
    *,
    paired_seeds: bool = True,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> list[dict]:
    """Differences (drafter - reference) of the means over training seeds, with intervals that resample
    seeds and prompts; per benchmark and averaged over benchmarks.

    ``requests[i][benchmark]``: the requests of the drafter's i-th training seed (as in
    ``paired_bootstrap``); every seed of both drafters answered the same prompts. ``paired_seeds``: seed i
    of both drafters is one draw of the training randomness (same seed value), so one seed draw serves
    both; otherwise each drafter's seeds are drawn on their own (their counts may differ).

    Each resample's deviation from the point difference splits into a seed part (seeds drawn, all
    prompts kept), widened per drafter by ``_seed_widening``, and a prompt part (the same seeds, prompts
    drawn too), widened by sqrt(n/(n-1)) per benchmark as with one seed. The prompt draws are
    ``paired_bootstrap``'s, so a drafter whose seeds all decode alike gets exactly its interval. Counting
    the interaction once in each part makes the interval a little conservative (``variance_components``
    gives the split without that).
    """
    benchmarks = _common_benchmarks([requests, reference_requests], paired_seeds)
    generator = np.random.default_rng(seed)  # prompts, one benchmark after another
    tail = (1.0 - level) / 2.0
    seeds = _seed_draws(len(requests), len(reference_requests), paired_seeds, seed, resamples, tail)
    seed_counts = {"num_seeds": len(requests), "reference_num_seeds": len(reference_requests),
                   "seed_pairing": "paired" if paired_seeds else "independent"}
    rows, resampled_differences, point_values = [], {m: [] for m in METRICS}, {m: [] for m in METRICS}
    tables = {m: ([], []) for m in METRICS}
    for benchmark in benchmarks:
        prompts_of = _prompt_draws(benchmark, (*requests, *reference_requests), generator, resamples)
        for metric in METRICS:
            metric_prompts, metric_draws = prompts_of[metric]
            ours = np.stack([_prompt_sums(by_benchmark[benchmark], metric_prompts) for by_benchmark in requests])
            theirs = np.stack([_prompt_sums(by_benchmark[benchmark], metric_prompts)
                               for by_benchmark in reference_requests])
            ours_mean, theirs_mean, differences = _resampled_differences(ours, theirs, metric, metric_draws, seeds)
            resampled_differences[metric].append(differences)
            point_values[metric].append((ours_mean, theirs_mean))
            split = (math.nan, math.nan)  # no timed prompt here: no SR, nothing to split
            if metric_prompts:
                tables[metric][0].append(_linearized(ours, metric))
                tables[metric][1].append(_linearized(theirs, metric))
                split = variance_components(tables[metric][0][-1:], tables[metric][1][-1:], paired_seeds=paired_seeds)
            rows.append(_row(benchmark, metric, ours_mean, theirs_mean, differences, tail, len(metric_prompts),
                             resamples, split, seed_counts))
    for metric in METRICS:
        ours_avg, theirs_avg = np.mean(point_values[metric], axis=0)
        differences = np.mean(resampled_differences[metric], axis=0)
        prompts = sum(row["num_prompts"] for row in rows if row["metric"] == metric)
        split = variance_components(*tables[metric], paired_seeds=paired_seeds) if tables[metric][0] else (math.nan, math.nan)
        rows.append(_row("avg", metric, ours_avg, theirs_avg, differences, tail, prompts, resamples, split, seed_counts))
    return rows


def paired_contrast(
    drafters: Sequence[dict[str, Sequence[dict]] | Sequence[dict[str, Sequence[dict]]]],
    weights: Sequence[float],
    *,
    metric: str = "tau",
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """A weighted sum of drafters' statistics, averaged over benchmarks, with a paired percentile interval.

    ``drafters[i][benchmark]`` lists drafter i's requests as in :func:`paired_bootstrap`, or ``drafters[i]`` is
    a list of such dicts, one per training seed, as in :func:`hierarchical_bootstrap` with paired seeds (seed j
    of every drafter shares its training randomness; every drafter has the same number). The contrast is
    sum_i ``weights[i]`` * (drafter i's statistic, averaged over its seeds): one drafter with weight 1, its own
    value; weights 1, -1: the difference :func:`hierarchical_bootstrap` gives, draw for draw; 1, -1, -1, 1: a
    difference of two differences. Every drafter is resampled with the same seed and prompt draws and widened
    as there.
    """
    if len(drafters) != len(weights) or not drafters:
        raise ValueError(f"{len(drafters)} drafter(s) for {len(weights)} weight(s)")
    seeded = [list(d) if isinstance(d, (list, tuple)) else [d] for d in drafters]
    benchmarks = _common_benchmarks(seeded, paired_seeds=True)
    generator = np.random.default_rng(seed)
    tail = (1.0 - level) / 2.0
    w = np.asarray(weights, dtype=float)
    count = len(seeded[0])
    seed_draws = _seed_draws(count, count, True, seed, resamples, tail)
    seeds = seed_draws.ours  # [resamples, seeds], the same draws for every drafter (paired)
    points, resampled, prompts = [], [], 0
    for benchmark in benchmarks:
        # The same draws as hierarchical_bootstrap's for this benchmark, shared by every seed of every drafter;
        # SR from the prompts every one of them timed (replayed tau decodes a subset for real), as there.
        prompt_ids, draws = _prompt_draws(benchmark, [b for d in seeded for b in d], generator, resamples)[metric]
        sums = np.stack([np.stack([_prompt_sums(b[benchmark], prompt_ids) for b in d]) for d in seeded])
        point = _statistics(sums)[metric]  # [drafters, seeds]
        boot = _statistics(sums[:, :, draws])[metric]  # [drafters, seeds, resamples]
        # Seeds drawn, every prompt kept; then each drawn seed scored on the resample's prompts.
        seeds_drawn = point[:, seeds].mean(axis=2)  # [drafters, resamples]
        both_drawn = np.stack([np.take_along_axis(b.T, seeds, axis=1).mean(axis=1) for b in boot])
        value = w @ point.mean(axis=1)
        seed_part = seed_draws.ours_widen * (w @ (seeds_drawn - point.mean(axis=1, keepdims=True)))  # 0: one seed
        prompt_part = w @ (both_drawn - seeds_drawn)
        widen = math.sqrt(len(prompt_ids) / (len(prompt_ids) - 1)) if len(prompt_ids) > 1 else math.nan
        points.append(value)
        resampled.append(value + seed_part + widen * prompt_part)
        prompts += len(prompt_ids)
    value = float(np.mean(points))
    contrasts = np.mean(resampled, axis=0)
    low, high = np.quantile(contrasts, [tail, 1.0 - tail]) if np.isfinite(contrasts).all() else (math.nan, math.nan)
    return {"value": value, "ci_low": float(low), "ci_high": float(high), "num_prompts": prompts,
            "resamples": resamples, "num_seeds": count, "resampled": contrasts}


def _row(benchmark, metric, value, reference, differences, tail, prompts, resamples, split, seed_counts) -> dict:
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
        **seed_counts,
        # The variance of the difference that drawing other prompts, and other training seeds, would add.
        "var_prompts": float(split[0]),
        "var_seeds": float(split[1]),
    }


def _requests_by_seed(evaluations: pd.DataFrame) -> tuple[tuple, list[dict[str, Sequence[dict]]]]:
    """One drafter's rows of a cell -> (its training seeds, per seed {benchmark: requests})."""
    seeds, by_seed = [], []
    for training_seed, rows in evaluations.groupby("training_seed", sort=True):
        seeds.append(training_seed)
        by_seed.append(dict(zip(rows["benchmark"], rows["requests"], strict=True)))
    return tuple(seeds), by_seed


def experiment_comparisons(
    evaluations: pd.DataFrame, *, reference_objective: str = "dflash", resamples: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """Every drafter against the experiment's reference drafter of the same target, depth, block size, epoch,
    suite and temperature (Table 1's DFlash row for each D-PACE row, and so on).

    ``evaluations`` has one row per (variant, epoch, suite, benchmark, temperature) with the metrics
    columns and ``requests`` (the per-request list of that evaluation's summary row). With ``method`` and
    ``training_seed`` columns (``train.seeds`` > 1), the variants of one method are its training seeds:
    a comparison is between methods, averaged over seeds, with ``hierarchical_bootstrap``'s intervals;
    its ``variant`` names the method (the id of its first seed). Two methods trained on the same seeds
    are paired seed by seed.
    """
    keys = ["target", "experiment", "epoch", "suite", "temperature", "depth", "block_size"]
    evaluations = evaluations.assign(
        method=evaluations["method"] if "method" in evaluations else evaluations["variant"],
        # Evaluations that do not name their seed (NaN) are one unnamed seed each.
        training_seed=evaluations["training_seed"].fillna(-1) if "training_seed" in evaluations else 0,
    )
    rows = []
    for key, cell in evaluations.groupby(keys, sort=True, dropna=False):
        reference = cell[cell["objective"] == reference_objective]
        if reference["method"].nunique() != 1:
            continue  # no single reference in this cell: nothing to compare against
        reference_method = reference["method"].iloc[0]
        reference_seeds, reference_requests = _requests_by_seed(reference)
        for method, drafter in cell[cell["method"] != reference_method].groupby("method", sort=True):
            seeds, drafter_requests = _requests_by_seed(drafter)
            common = sorted(set.intersection(*(set(by_benchmark) for by_benchmark in (*drafter_requests, *reference_requests))))
            for result in hierarchical_bootstrap(
                [{b: by_benchmark[b] for b in common} for by_benchmark in drafter_requests],
                [{b: by_benchmark[b] for b in common} for by_benchmark in reference_requests],
                paired_seeds=seeds == reference_seeds, resamples=resamples, seed=seed,
            ):
                rows.append({
                    **dict(zip(keys, key, strict=True)), "variant": method,
                    "objective": drafter["objective"].iloc[0], "reference_variant": reference_method, **result,
                })
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def compare_summaries(summary_path, reference_path, *, resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One drafter's evaluation (an ``evaluate`` job's ``summary.json``) against another's, per temperature.

    For drafters that no experiment pairs: two runs, two training seeds, two configs. Both must have
    decoded the same prompts (the same ``data`` settings and seed), as the tables' comparisons require.
    """
    def requests_by_temperature(path) -> dict[float, dict[str, list]]:
        cells: dict[float, dict[str, list]] = {}
        for row in read_json(path):
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
        prog="python -m dpace.report.intervals",
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
