"""Table 7: one objective's training time against another's, with intervals that respect how steps are timed.

Step times of one run are not independent draws: a machine that slows down (another job, thermal limits, a
noisy neighbour on a virtual machine) slows a stretch of contiguous steps. Resampling single steps treats
that stretch as many independent observations and gives an interval far too narrow (the a2f4e57 scorecard:
"D-PACE 1.0% faster [-1.6%, -0.4%]" for the objective that does more work per step). Here each run is cut
into contiguous windows (or its epochs) and whole windows are resampled: a moving-speed machine shows up as
spread between windows. Either way the interval is about *these two runs* on *this machine*; a second
training run of the same pair (another seed, another hour) is outside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpace.report.intervals import over_seeds
from dpace.timing_records import AUTOREGRESSIVE, TIMING_COLUMNS  # noqa: F401 (re-exported)


def window_means(times: np.ndarray, windows: int) -> np.ndarray:
    """The mean step time of each of ``windows`` contiguous, (nearly) equal stretches of one run's steps."""
    times = np.asarray(times, dtype=float)
    windows = max(1, min(windows, len(times)))
    return np.array([chunk.mean() for chunk in np.array_split(times, windows)])


def ratio_of_means(
    ours: Sequence[float], theirs: Sequence[float], *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """mean(ours) / mean(theirs) - 1 with a percentile interval that resamples the given units (windows,
    epochs) of each run independently; fewer than two units in either run: no interval."""
    ours, theirs = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    point = float(ours.mean() / theirs.mean() - 1.0)
    if min(len(ours), len(theirs)) < 2:
        return point, math.nan, math.nan
    generator = np.random.default_rng(seed)
    ours_boot = ours[generator.integers(0, len(ours), size=(resamples, len(ours)))].mean(axis=1)
    theirs_boot = theirs[generator.integers(0, len(theirs), size=(resamples, len(theirs)))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(ours_boot / theirs_boot - 1.0, [tail, 1.0 - tail])
    return point, float(low), float(high)


# --- SR from an interleaved timing job (dpace.evaluation.timing_run) -------------------------------------------
#
# A timing job decodes each prompt with the target alone and with every compared drafter, one after another, and
# repeats the whole pass several times. Within a repeat the drafters share the machine's state prompt by prompt;
# between repeats the machine may change. The SR interval therefore resamples prompts (within each benchmark) *and*
# repeats: a second timing job, which sees other repeats, should land inside it. Whether it would is checked too
# (``timing_stability``): where the two halves of the repeats differ by more than the whole interval's width, or one drafter's
# SR moves between repeats by more than ``max_spread``, the machine does not give a timing that repeats, and the
# comparison is "not measurable on this machine" rather than judged.

MAX_REPEAT_SPREAD = 0.10  # the largest relative std of a drafter's per-repeat SR that still counts as repeatable


def _tpot_tables(times, drafters: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
    """Per benchmark: (AR [repeats, prompts], speculative [drafters, repeats, prompts], prompt ids) of summed
    time per output token over each prompt's turns (SR is a ratio of mean TPOTs over the same requests)."""
    repeats = sorted(times["repeat"].unique())
    out = {}
    for benchmark, rows in times.groupby("benchmark", sort=True):
        rows = rows.assign(id=rows["id"].astype(str))
        prompts = sorted(rows["id"].unique())
        sums = rows.pivot_table(index=["drafter", "repeat"], columns="id", values="time_per_output_token_s",
                                aggfunc="sum")

        missing = {AUTOREGRESSIVE, *drafters} - set(sums.index.get_level_values(0))
        if missing:
            raise ValueError(f"no times of {sorted(missing)} on {benchmark}")
        tables = [sums.loc[d].reindex(index=repeats, columns=prompts).to_numpy(float) for d in (AUTOREGRESSIVE, *drafters)]
        out[benchmark] = (tables[0], np.stack(tables[1:]), prompts)
    return out


def _sr(ar: np.ndarray, spec: np.ndarray) -> np.ndarray:
    """SR = sum AR TPOT / sum speculative TPOT over the last two axes (repeats, prompts)."""
    return ar.sum(axis=(-2, -1)) / spec.sum(axis=(-2, -1))


def _draws(tables: dict, repeats: int, resamples: int, generator) -> tuple[np.ndarray, list[np.ndarray]]:
    """One repeat draw shared by every benchmark (a slow machine state slows all of them) and one prompt draw per
    benchmark, [1 + resamples, n] each; row 0 is the data itself (the point estimate)."""
    def draw(n: int) -> np.ndarray:
        return np.vstack([np.arange(n)[None, :], generator.integers(0, n, (resamples, n))])
    return draw(repeats), [draw(len(prompts)) for _, _, prompts in tables.values()]


def _resampled_sr(tables: dict, resamples: int, seed: int) -> dict[str, np.ndarray]:
    """Per benchmark and "avg": SR of every drafter, [1 + resamples, drafters]; row 0 is the point estimate."""
    generator = np.random.default_rng(seed)
    repeats = next(iter(tables.values()))[0].shape[0]
    repeat_draws, prompt_draws = _draws(tables, repeats, resamples, generator)
    out = {}
    for (benchmark, (ar, spec, _)), prompts in zip(tables.items(), prompt_draws, strict=True):
        r, p = repeat_draws[:, :, None], prompts[:, None, :]
        ar_sum = ar[r, p].sum(axis=(1, 2))  # [draws]
        spec_sum = spec[:, r, p].sum(axis=(2, 3))  # [drafters, draws]
        out[benchmark] = (ar_sum[None, :] / spec_sum).T
    out["avg"] = np.mean([out[b] for b in tables], axis=0)
    return out


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0
    if not np.isfinite(values).all():
        return math.nan, math.nan
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def halves_agree(halves: Sequence[tuple[float, float, float]], whole_width: float) -> bool:
    """Whether the two halves of the repeats agree: their estimates differ by no more than the whole timing's
    interval width. Two halves' means differ with twice the whole mean's sd, so 95% of repeatable timings keep
    |half 1 - half 2| within 2 x 1.96 sd: the whole interval's width. The halves' own intervals are not the yardstick:
    each is a bootstrap of 2 repeats (at T = 1 of one prompt a benchmark), far too narrow; overlap of those flagged
    T = 1 cells of the 3-seed run whose halves differed by 0.016 SR inside a +-0.05 interval."""
    return len(halves) == 2 and bool(np.isfinite(whole_width)) and abs(halves[0][0] - halves[1][0]) <= whole_width


def halves_reason(halves: Sequence[tuple[float, float, float]], whole_width: float) -> str:
    gap = abs(halves[0][0] - halves[1][0]) if len(halves) == 2 else math.nan
    return f"the two halves of the repeats differ by {gap:.3f}, more than the whole interval's width ({whole_width:.3f})"


def timing_stability(times, drafter: str, reference: str, *, resamples: int = 2000, seed: int = 0,
                     level: float = 0.95, max_spread: float = MAX_REPEAT_SPREAD) -> dict:
    """Whether the average SR difference ``drafter`` - ``reference`` repeats on this machine: the first and the
    second half of the repeats each give it (with an interval over prompts and that half's repeats, shown), and
    each drafter's per-repeat SR has a relative spread (std / mean over repeats). Stable: the halves differ by no
    more than the width of the whole timing's interval (prompts and every repeat resampled) and neither spread
    exceeds ``max_spread``; fewer than 2 repeats: not stable (nothing to check)."""
    return contrast_stability(times, [drafter, reference], [1.0, -1.0], resamples=resamples, seed=seed, level=level,
                              max_spread=max_spread)


Terms = Sequence["str | Sequence[str]"]


def _seed_terms(drafters: Terms) -> list[list[str]]:
    """Each term as the list of its training seeds' drafters (a single drafter: one seed); every term needs as
    many seeds, paired seed by seed (seed s of each term trained with the same training seed)."""
    terms = [[drafter] if isinstance(drafter, str) else [str(d) for d in drafter] for drafter in drafters]
    if len({len(term) for term in terms}) != 1 or not terms[0]:
        raise ValueError("paired seeds need as many seeds of each drafter: " + " vs ".join(str(len(t)) for t in terms))
    return terms


def seed_contrasts(times, drafters: Terms, weights: Sequence[float], *, resamples: int = 2000,
                   seed: int = 0) -> tuple[dict[str, np.ndarray], dict]:
    """Per benchmark and "avg": sum_i weights[i] x SR of term i's seed s, [1 + resamples, seeds] (row 0 the point
    estimate); one draw of prompts and repeats is shared by every drafter, as they were timed side by side."""
    terms = _seed_terms(drafters)
    seeds = len(terms[0])
    flat = [drafter for term in terms for drafter in term]
    tables = _tpot_tables(times, flat)
    by_seed = np.zeros((len(flat), seeds))  # SR of flat drafter j -> its term's weight at its seed's column
    for i, weight in enumerate(weights):
        by_seed[i * seeds + np.arange(seeds), np.arange(seeds)] = float(weight)
    return {benchmark: values @ by_seed for benchmark, values in _resampled_sr(tables, resamples, seed).items()}, tables


def timed_contrast(times, drafters: Terms, weights: Sequence[float], *, benchmark: str = "avg",
                   resamples: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float, int]:
    """sum_i weights[i] x SR of ``drafters[i]`` (on ``benchmark``, or averaged over benchmarks) with its interval
    over prompts and repeats: (value, low, high, prompts). A term given as its training seeds' drafters is their
    mean, and the interval covers the seeds too (``dpace.report.intervals.over_seeds``)."""
    per_seed, tables = seed_contrasts(times, drafters, weights, resamples=resamples, seed=seed)
    values = per_seed[benchmark]
    prompts = sum(len(t[2]) for t in tables.values()) if benchmark == "avg" else len(tables[benchmark][2])
    return (*over_seeds(values[0], values[1:].T, level=level, seed=seed), prompts)


def contrast_stability(times, drafters: Terms, weights: Sequence[float], *, resamples: int = 2000,
                       seed: int = 0, level: float = 0.95, max_spread: float = MAX_REPEAT_SPREAD) -> dict:
    """``timing_stability`` of a weighted sum of drafters' average SR (two drafters, +1 and -1: a difference); a
    term given as its training seeds' drafters enters as their mean."""
    terms = _seed_terms(drafters)
    drafters = [drafter for term in terms for drafter in term]
    weights = np.repeat(np.asarray(weights, dtype=float) / len(terms[0]), len(terms[0]))
    repeats = np.array(sorted(times["repeat"].unique()))
    tables = _tpot_tables(times, list(drafters))
    per_repeat = np.array([[np.mean([_sr(ar[[i]], spec[d][[i]]) for ar, spec, _ in tables.values()])
                            for i in range(len(repeats))] for d in range(len(drafters))])
    spread = float(np.max(per_repeat.std(axis=1, ddof=1) / per_repeat.mean(axis=1))) if len(repeats) > 1 else math.nan
    halves, whole_width = [], math.nan
    if len(repeats) > 1:
        half = len(repeats) // 2
        for indices in (np.arange(half), np.arange(half, len(repeats))):
            sub = {b: (ar[indices], spec[:, indices], prompts) for b, (ar, spec, prompts) in tables.items()}
            values = _resampled_sr(sub, resamples, seed)["avg"] @ weights
            halves.append((float(values[0]), *_interval(values[1:], level)))
        low, high = _interval((_resampled_sr(tables, resamples, seed)["avg"] @ weights)[1:], level)
        whole_width = high - low
    agree = halves_agree(halves, whole_width)
    stable = bool(agree and np.isfinite(spread) and spread <= max_spread)
    if len(repeats) < 2:
        reason = "fewer than 2 repeats: no second measurement to agree with"
    elif not agree:
        reason = halves_reason(halves, whole_width)
    elif not spread <= max_spread:
        reason = f"a drafter's SR moves by {100 * spread:.1f}% between repeats (more than {100 * max_spread:.0f}%)"
    else:
        reason = ""
    return {"stable": stable, "repeat_spread": spread, "halves": halves, "reason": reason,
            "num_repeats": int(len(repeats))}


def stability_note(check: dict) -> str:
    """The stability check in words: the halves' differences with their intervals, and the repeat spread."""
    halves = "; ".join(f"{v:+.3f} [{lo:+.3f}, {hi:+.3f}]" for v, lo, hi in check["halves"]) or "none"
    spread = f"{100 * check['repeat_spread']:.1f}%" if np.isfinite(check["repeat_spread"]) else "--"
    text = f"{check['num_repeats']} repeats; halves {halves}; repeat spread {spread}"
    return f"{check['reason']} ({text})" if check["reason"] else text


def interleaved_comparisons(times, reference: str | Sequence[str], *, methods: dict[str, Sequence[str]] | None = None,
                            resamples: int = 2000, seed: int = 0, level: float = 0.95,
                            max_spread: float = MAX_REPEAT_SPREAD) -> list[dict]:
    """Every drafter of one (target, temperature) timing cell against ``reference``: per benchmark and "avg", SR,
    the reference's SR, the difference and its interval over prompts and repeats (``_resampled_sr``), with the
    stability check of the average (``contrast_stability``) on every row of the drafter.

    ``methods`` ({name: its training seeds' drafters}, ``reference`` then the reference's seeds): one row set per
    method, SR the mean over its seeds, paired seed by seed with the reference's, the interval covering the seeds
    too; its ``variant`` is the method's name (the id of its first seed, as the tau comparisons name it). Left
    out: every other timed drafter, one seed each."""
    references = [reference] if isinstance(reference, str) else list(reference)
    if methods is None:
        methods = {d: [d] for d in sorted(times["drafter"].unique()) if d not in (AUTOREGRESSIVE, *references)}
    rows = []
    for method, seeds in sorted(methods.items()):
        terms, weights = [list(seeds), references], [1.0, -1.0]
        check = contrast_stability(times, terms, weights, resamples=resamples, seed=seed, level=level,
                                   max_spread=max_spread)
        differences, tables = seed_contrasts(times, terms, weights, resamples=resamples, seed=seed)
        points = [seed_contrasts(times, [term], [1.0], resamples=0, seed=seed)[0] for term in terms]
        for benchmark, per_seed in differences.items():
            difference, low, high = over_seeds(per_seed[0], per_seed[1:].T, level=level, seed=seed)
            value, ref = (float(point[benchmark][0].mean()) for point in points)
            prompts = sum(len(t[2]) for t in tables.values()) if benchmark == "avg" else len(tables[benchmark][2])
            rows.append({"variant": method, "reference_variant": references[0], "metric": "speedup",
                         "benchmark": benchmark, "value": value, "reference_value": ref, "difference": difference,
                         "relative_difference": (value - ref) / ref, "ci_low": low, "ci_high": high,
                         # a timing the machine does not repeat marks nothing significant in the tables
                         "significant": bool((low > 0 or high < 0) and check["stable"]), "num_prompts": int(prompts),
                         "resamples": int(resamples), "num_seeds": len(seeds), "reference_num_seeds": len(references),
                         "seed_pairing": "paired", "num_repeats": check["num_repeats"],
                         "timing_stable": check["stable"], "repeat_spread": check["repeat_spread"],
                         "timing_note": stability_note(check)})
    return rows


def interleaved_speedups(times) -> list[dict]:
    """Per (drafter, benchmark): SR pooled over every repeat and prompt, and the mean TPOTs it divides."""
    rows = []
    for benchmark, group in times.groupby("benchmark", sort=True):
        ar = group[group["drafter"] == AUTOREGRESSIVE]["time_per_output_token_s"]
        for drafter, spec in group[group["drafter"] != AUTOREGRESSIVE].groupby("drafter", sort=True):
            tpot = spec["time_per_output_token_s"]
            rows.append({"variant": drafter, "benchmark": benchmark, "speedup": float(ar.mean() / tpot.mean()),
                         "ar_tpot_s": float(ar.mean()), "spec_tpot_s": float(tpot.mean())})
    return rows


# --- Table 7: a training step, interleaved (dpace.step_timing) ----------------------------------------------


def _ratio_draws(ours: np.ndarray, theirs: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """mean(ours) / mean(theirs) - 1 of [repeats, steps] tables, resampling repeats and, within them, step indices
    (paired: step j of both drafters ran next to each other); element 0 is the point estimate."""
    generator = np.random.default_rng(seed)
    repeats, steps = ours.shape
    r = np.vstack([np.arange(repeats)[None, :], generator.integers(0, repeats, (resamples, repeats))])[:, :, None]
    s = np.vstack([np.arange(steps)[None, :], generator.integers(0, steps, (resamples, steps))])[:, None, :]
    return ours[r, s].sum(axis=(1, 2)) / theirs[r, s].sum(axis=(1, 2)) - 1.0


def step_ratio(times, ours: str, theirs: str, *, resamples: int = 2000, seed: int = 0, level: float = 0.95,
               max_spread: float = MAX_REPEAT_SPREAD) -> dict:
    """D-PACE's step time over DFlash's, minus 1, from an interleaved step benchmark (``dpace.step_timing``): the
    estimate with an interval over repeats and steps, and the stability check of ``timing_stability`` (the
    halves of the repeats may differ by no more than the whole interval's width; the per-repeat ratio's spread,
    std over repeats, must stay within ``max_spread``)."""
    tables = [times[times["drafter"] == name].pivot_table(index="repeat", columns="step", values="step_time_s")
              .to_numpy(float) for name in (ours, theirs)]
    draws = _ratio_draws(*tables, resamples, seed)
    low, high = _interval(draws[1:], level)
    repeats = tables[0].shape[0]
    per_repeat = tables[0].sum(axis=1) / tables[1].sum(axis=1) - 1.0
    spread = float(per_repeat.std(ddof=1)) if repeats > 1 else math.nan
    halves = []
    if repeats > 1:
        for rows in (slice(0, repeats // 2), slice(repeats // 2, repeats)):
            half = _ratio_draws(tables[0][rows], tables[1][rows], resamples, seed)
            halves.append((float(half[0]), *_interval(half[1:], level)))
    agree = halves_agree(halves, high - low)
    stable = bool(agree and np.isfinite(spread) and spread <= max_spread)
    if repeats < 2:
        reason = "fewer than 2 repeats: no second measurement to agree with"
    elif not agree:
        reason = halves_reason(halves, high - low)
    elif not spread <= max_spread:
        reason = f"the ratio moves by {100 * spread:.1f}% between repeats (more than {100 * max_spread:.0f}%)"
    else:
        reason = ""
    check = {"stable": stable, "repeat_spread": spread, "halves": halves, "reason": reason, "num_repeats": repeats}
    return {"value": float(draws[0]), "ci_low": low, "ci_high": high, "num_repeats": repeats,
            "num_steps": int(tables[0].shape[1]), "stable": stable, "note": stability_note(check)}
