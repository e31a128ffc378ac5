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
