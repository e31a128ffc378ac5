"""Scale, measured: does a drafter's gain over DFlash grow with how far DFlash itself gets?

The run's DFlash reaches tau about 1.4 where the paper's reaches 4.1, so a gain of the paper's size may need
the paper's scale. Inside one run, tau varies across benchmarks and training epochs; the slope of the gain
over those strata against their tau is the run's own evidence of that dependence.

Regressing the gain (ours - DFlash) on DFlash's own tau is biased: DFlash's measurement error (its prompts'
noise, its training seed's per-benchmark quirks) enters the gain with a minus sign and the regressor with a
plus sign, so a stratum where DFlash happened to do well shows a small gain and the slope comes out negative
even when the gain does not depend on tau at all (regression to the mean). :func:`gain_slope` instead takes
the strata's level from a third drafter (its own errors are independent of DFlash's), and reports the naive
slope beside it so the difference is visible.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpace.report.intervals import _seed_draws, _statistics


def _slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slope of y on x along the last axis (strata): cov(x, y) / var(x)."""
    dx = x - x.mean(axis=-1, keepdims=True)
    dy = y - y.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (dx * dy).sum(axis=-1) / (dx * dx).sum(axis=-1)


def _by_seed(sums) -> np.ndarray:
    """One drafter's prompt sums in one stratum as [seeds, prompts, 4]: a [prompts, 4] array is one seed."""
    sums = np.asarray(sums, dtype=float)
    return sums[None] if sums.ndim == 2 else sums


def gain_slope(
    ours: Sequence[np.ndarray],
    reference: Sequence[np.ndarray],
    stratifier: Sequence[np.ndarray],
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """Slope of the tau gain (ours - reference) across strata against the stratifier's tau, and the naive
    slope against the reference's own tau, each with a paired interval over prompts and training seeds.

    Each argument lists, per stratum (benchmark or epoch), the prompt sums of ``dpace.report.intervals``
    ([prompts, 4], one training seed, or [seeds, prompts, 4]: the same prompts in the same order for the three
    drafters, seed i of each trained on the same seed value): a drafter's tau in a stratum is the mean over
    its seeds. Every resample draws one set of seeds (shared by all strata and drafters, as
    ``hierarchical_bootstrap`` pairs seeds) and one set of prompts per stratum, and scores all three drafters on
    them. The resampled slope's deviation splits into a seed part (seeds drawn, every prompt kept), widened by
    ``_seed_widening`` (t with n_seeds - 1 degrees of freedom: a percentile bootstrap over 3 seeds is too
    narrow), and a prompt part; with one seed the seed part is 0 and the interval is the prompts' alone.
    """
    if not (len(ours) == len(reference) == len(stratifier)) or len(ours) < 3:
        raise ValueError(f"a slope needs the same 3 or more strata for each drafter: {len(ours)}, {len(reference)}, "
                         f"{len(stratifier)}")
    roles = ("ours", "reference", "stratifier")
    strata = [[_by_seed(s) for s in sums] for sums in zip(ours, reference, stratifier, strict=True)]
    seeds = strata[0][0].shape[0]
    if any(s.shape[0] != seeds for stratum in strata for s in stratum):
        raise ValueError("the three drafters need the same training seeds in every stratum")
    generator = np.random.default_rng(seed)
    tail = (1.0 - level) / 2.0
    seed_draws = _seed_draws(seeds, seeds, True, seed, resamples, tail)
    point = {name: [] for name in roles}  # per stratum: [seeds]
    boot = {name: [] for name in roles}  # per stratum: [seeds, resamples]
    for sums in strata:
        count = sums[0].shape[1]
        if any(s.shape[1] != count for s in sums):
            raise ValueError("the three drafters were scored on different prompts")
        draws = generator.integers(0, count, size=(resamples, count))
        for name, s in zip(roles, sums, strict=True):
            point[name].append(_statistics(s)["tau"])
            boot[name].append(_statistics(s[:, draws])["tau"])
    picks = seed_draws.ours  # [resamples, seeds]
    p = {name: np.stack(v).mean(axis=1) for name, v in point.items()}  # [strata]
    # Seeds drawn, every prompt kept: [resamples, strata]; then the drawn seeds scored on the drawn prompts.
    s = {name: np.stack([x[picks].mean(axis=1) for x in v], axis=-1) for name, v in point.items()}
    b = {name: np.stack([np.take_along_axis(x.T, picks, axis=1).mean(axis=1) for x in v], axis=-1)
         for name, v in boot.items()}

    def summary(x: str) -> tuple[float, float, float]:
        value = float(_slope(p[x], p["ours"] - p["reference"]))
        seeds_only = _slope(s[x], s["ours"] - s["reference"])
        both = _slope(b[x], b["ours"] - b["reference"])
        resampled = value + seed_draws.ours_widen * (seeds_only - value) + (both - seeds_only)
        low, high = np.nanquantile(resampled, [tail, 1.0 - tail])
        return value, float(low), float(high)

    slope, low, high = summary("stratifier")
    naive, naive_low, naive_high = summary("reference")
    return {"slope": slope, "ci_low": low, "ci_high": high, "naive_slope": naive, "naive_low": naive_low,
            "naive_high": naive_high, "strata": len(ours), "num_seeds": seeds, "reference_tau": p["reference"].tolist(),
            "gain": (p["ours"] - p["reference"]).tolist()}
