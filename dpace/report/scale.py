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

from dpace.report.intervals import _statistics


def _slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slope of y on x along the last axis (strata): cov(x, y) / var(x)."""
    dx = x - x.mean(axis=-1, keepdims=True)
    dy = y - y.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (dx * dy).sum(axis=-1) / (dx * dx).sum(axis=-1)


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
    slope against the reference's own tau, each with a paired percentile interval over prompts.

    Each argument lists, per stratum (benchmark or epoch), the prompt sums of ``dpace.report.intervals``
    ([prompts, 4], the same prompts in the same order for the three drafters): every resample draws one set of
    prompts per stratum and scores all three drafters on it.
    """
    if not (len(ours) == len(reference) == len(stratifier)) or len(ours) < 3:
        raise ValueError(f"a slope needs the same 3 or more strata for each drafter: {len(ours)}, {len(reference)}, "
                         f"{len(stratifier)}")
    generator = np.random.default_rng(seed)
    point = {name: [] for name in ("ours", "reference", "stratifier")}
    boot = {name: [] for name in point}
    for sums in zip(ours, reference, stratifier, strict=True):
        count = len(sums[0])
        if any(len(s) != count for s in sums):
            raise ValueError("the three drafters were scored on different prompts")
        draws = generator.integers(0, count, size=(resamples, count))
        for name, s in zip(point, sums, strict=True):
            point[name].append(_statistics(s)["tau"])
            boot[name].append(_statistics(s[draws])["tau"])  # [resamples]
    p = {name: np.asarray(v) for name, v in point.items()}  # [strata]
    b = {name: np.stack(v, axis=-1) for name, v in boot.items()}  # [resamples, strata]
    tail = (1.0 - level) / 2.0

    def summary(x_point, x_boot) -> tuple[float, float, float]:
        value = float(_slope(x_point, p["ours"] - p["reference"]))
        low, high = np.nanquantile(_slope(x_boot, b["ours"] - b["reference"]), [tail, 1.0 - tail])
        return value, float(low), float(high)

    slope, low, high = summary(p["stratifier"], b["stratifier"])
    naive, naive_low, naive_high = summary(p["reference"], b["reference"])
    return {"slope": slope, "ci_low": low, "ci_high": high, "naive_slope": naive, "naive_low": naive_low,
            "naive_high": naive_high, "strata": len(ours), "reference_tau": p["reference"].tolist(),
            "gain": (p["ours"] - p["reference"]).tolist()}
