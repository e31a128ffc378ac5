"""The scorecard's rules: a claim's unit, the paper cell a run cell is judged against, and the verdicts.

A cell is *reproduced* when its 95% interval lies inside the claimed region, *contradicted* when outside; a
claim is *reproduced* only if every cell the paper reported is, *contradicted* if any such cell is
(Holm-corrected over the claim's cells), else *inconclusive*; *not run* when its artifacts are missing; *not
measurable on this machine* when a cell is a timing that a second measurement on this machine would not repeat. Cells
at a setting the paper never reported are *beyond the paper*: shown, not counted. ``dpace.report.findings``
says how the claims file writes these; ``dpace.report.claim_measures`` measures the cells.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN = "reproduced", "contradicted", "inconclusive", "not run"
BEYOND = "beyond the paper"
# A timing this machine cannot repeat (``dpace.report.timing.timing_stability``): measured, never judged.
NOT_MEASURABLE = "not measurable on this machine"
VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_MEASURABLE, NOT_RUN)
LEVEL = 0.95
# A run cell matches a paper cell at the same temperature, epoch and alpha; block size and depth: the nearest.
EXACT_KEYS, NEAREST_KEYS = ("temperature", "epoch", "alpha"), ("block_size", "depth")
SCALES = ("absolute", "relative", "accepted")
UNITS = {
    "absolute": "{metric} (absolute)",
    "relative": "{metric} gain as a fraction of DFlash's {metric}",
    "accepted": "accepted draft length (tau - 1) gain as a fraction of DFlash's",
}


@dataclass(frozen=True)
class Region:
    """The values of the measured quantity that reproduce a claim: [low, high], either end unbounded (inf).
    ``strict``: the finite ends belong to the region's outside, as "above 0" and "below 0" say (a claim that
    tau's bin means *rise* is not reproduced by a smallest rise of exactly 0; measured: Figure 1a's lowest bins
    all at tau 1); ``between`` and ``paper_factor`` regions are closed (an Accept-rate tau of exactly 1.0 is
    inside "collapses to [1, 1.1]")."""

    low: float = -math.inf
    high: float = math.inf
    strict: bool = False

    @classmethod
    def of(cls, rule: dict, paper: float = math.nan) -> Region:
        """``{above: a}``, ``{below: b}``, ``{between: [a, b]}``, or ``{paper_factor: f}`` (the paper's number
        in the matched cell, divided or multiplied by f), as a claim's ``verdict`` writes it."""
        if "paper_factor" in rule:
            factor = float(rule["paper_factor"])
            low, high = sorted((paper / factor, paper * factor))
            return cls(low, high)
        if "between" in rule:
            low, high = (float(x) for x in rule["between"])
            return cls(low, high)
        if "above" not in rule and "below" not in rule:  # never "< +inf": a misspelt rule would hold for anything
            raise ValueError(f"verdict {rule}: no region (above, below, between or paper_factor)")
        return cls(float(rule.get("above", -math.inf)), float(rule.get("below", math.inf)), strict=True)

    def text(self, relative: bool) -> str:
        def number(x: float) -> str:
            return f"{100 * x:+.3g}%" if relative else f"{x:+.3g}"
        if math.isinf(self.low):
            return f"< {number(self.high)}"
        if math.isinf(self.high):
            return f"> {number(self.low)}"
        return f"in [{number(self.low)}, {number(self.high)}]"


def verdict(low: float, high: float, region: Region) -> str:
    """The verdict of a 95% interval [low, high] against the claimed ``region``."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return INCONCLUSIVE  # no interval (one prompt, one step): nothing can be told
    within = operator.lt if region.strict else operator.le  # an open end lies outside the region
    if within(region.low, low) and within(high, region.high):
        return REPRODUCED
    if not within(region.low, high) or not within(low, region.high):
        return CONTRADICTED
    return INCONCLUSIVE


def in_unit(difference: float, reference_tau: float, scale: str) -> float:
    """A tau difference (ours - DFlash) in a claim's unit; ``reference_tau`` is DFlash's tau.

    tau counts the bonus token the verifier always emits, tau = E[X] + 1 with X the accepted draft length
    (the paper's Eq. 1); ``accepted`` divides by E[X] = tau - 1, so a gain means the same at tau 1.4 as at 4.1.
    """
    if scale == "absolute":
        return difference
    if scale == "relative":
        return difference / reference_tau
    if scale == "accepted":  # DFlash accepting nothing (tau 1): no accepted length to be a fraction of
        return difference / (reference_tau - 1.0) if reference_tau > 1.0 else math.nan
    raise ValueError(f"unknown scale {scale!r}: one of {SCALES}")


def scale_of(claim: dict) -> str:
    """The unit a claim's verdict names: ``absolute`` unless its ``scale`` says otherwise."""
    return claim["verdict"].get("scale", "absolute")


KIND_UNITS = {
    "step_time": "training time as a fraction of DFlash's (ratio - 1)",
    "correlation": "Spearman rho (per block)",
    "correlation_gap": "difference of two Spearman rho (per block)",
    "weight_shift": "block positions (mean weighted position, late minus early)",
    "contrast": "{metric} (absolute; a weighted sum of drafters)",
    "ratio": "ratio of two weighted sums of drafters' {metric}",
    "bin_rise": "tau_b (smallest rise between neighbouring bins of S~)",
    "weight_variation": "share of a step's weight (rms deviation from the trend across updates)",
    "late_weight": "share of the weight on the later half of the block (difference of two alphas)",
}


def unit_text(claim: dict) -> str:
    """The unit a claim is judged in, as the page states it."""
    kind, metric = claim["measure"]["kind"], claim["measure"].get("metric", "tau")
    return KIND_UNITS.get(kind, UNITS[scale_of(claim)]).format(metric=metric)


def is_fraction(claim: dict) -> bool:
    """Whether the claim's numbers are fractions of DFlash's (the page shows them in percent)."""
    return scale_of(claim) != "absolute" or claim["measure"]["kind"] == "step_time"


@dataclass
class Finding:
    """One cell of one claim: the measured value in the claim's unit and the cell's verdict."""

    claim: dict
    verdict: str
    cell: str = ""
    value: float = math.nan
    low: float = math.nan
    high: float = math.nan
    note: str = ""
    key: tuple = ()  # what was measured (drafters, metric, benchmark, cell): several claims may read one
    attrs: dict = field(default_factory=dict)  # the run cell's settings: temperature, block_size, depth, ...
    reference_tau: float = math.nan  # DFlash's tau in the run's cell
    raw: tuple = (math.nan, math.nan, math.nan)  # the measurement in absolute units (estimate, low, high)
    seeds: int = 1
    paper_cell: dict | None = None  # the matched paper cell; None: beyond the paper
    drafters: str = ""  # which drafters the measurement reads, for the cells table
    digest: str = ""  # the per-request records it reads (contrasts): equal for bit-identical drafters
    scope: str = ""  # how the paper cell relates to the run cell's own setting (another block size), for the page


class NotRun(Exception):
    """A claim's artifacts are missing: the reason names the file or the rows."""


# --- the paper's cells --------------------------------------------------------------------------------------

def match_paper_cell(claim: dict, attrs: dict) -> dict | None:
    """The paper cell of ``claim`` nearest the run cell ``attrs``: the same temperature, epoch and alpha
    (where both name one), then the nearest block size, then the nearest depth. None: the paper reported no
    cell at this setting (beyond the paper). A claim without paper cells covers every run cell."""
    cells = claim.get("paper_cells")
    if not cells:
        return {}
    candidates = [c for c in cells if all(
        np.isclose(float(c[k]), float(attrs[k])) for k in EXACT_KEYS if k in c and k in attrs and pd.notna(attrs[k]))]
    if not candidates:
        return None

    def distance(cell: dict) -> tuple:
        return tuple(abs(float(cell[k]) - float(attrs[k])) if k in cell and k in attrs and pd.notna(attrs[k]) else 0.0
                     for k in NEAREST_KEYS)
    return min(candidates, key=distance)


def paper_value(claim: dict, cell: dict) -> float:
    """The paper's number in ``cell``, in the claim's unit: ``value`` as written, or from its ``tau`` and
    DFlash's ``dflash`` by :func:`in_unit` (the conversion the measurements get); times the paper's own block
    size ratio where the cell was scaled to the run's block size (:func:`own_setting`)."""
    factor = float(cell["scaled"]["ratio"]) if "scaled" in cell else 1.0
    if "value" in cell:
        return factor * float(cell["value"])
    if "tau" in cell and "dflash" in cell:
        return factor * in_unit(float(cell["tau"]) - float(cell["dflash"]), float(cell["dflash"]), scale_of(claim))
    return math.nan


def _same(a, b) -> bool:
    return a is None or b is None or pd.isna(a) or pd.isna(b) or np.isclose(float(a), float(b))


def own_setting(claim: dict, attrs: dict, paper: dict | None) -> tuple[dict | None, str]:
    """The matched paper cell held to the run cell's own block size, and what the page says about it.

    A region built from the paper's number (``paper_factor``) is only meaningful at the block size the number
    was measured at: D-PACE's gain at B = 8 is half its gain at B = 16 (Table 4). A run cell at a block size the
    paper has no cell for (the run's B = 8 against the paper's B = 16 at T = 1, or in Table 3) is scaled by the
    paper's own ratio between the two block sizes where the claim gives one (``block_scaling``: from, to, ratio,
    source), else it is beyond the paper. A region that does not depend on the paper's number (an ordering, a
    collapse) is judged as it is, and the page says which block size the paper's cell is at."""
    if not paper or _same(attrs.get("block_size"), paper.get("block_size")):
        return paper, ""
    run_b, paper_b = int(attrs["block_size"]), int(paper["block_size"])
    if "paper_factor" not in claim["verdict"]:
        return paper, f"the paper's cell is at B = {paper_b} (none at B = {run_b}); the region does not depend on it"
    for rule in claim.get("block_scaling", []):
        if int(rule["from"]) == paper_b and int(rule["to"]) == run_b:
            return {**paper, "scaled": rule}, (
                f"scaled: the paper's B = {paper_b} number x{float(rule['ratio']):.3f}, its own B = {run_b} / "
                f"B = {paper_b} ratio ({rule['source']})")
    return None, f"beyond the paper: no B = {run_b} cell, and no B = {run_b} / B = {paper_b} ratio for this claim"


def paper_cell_label(cell: dict) -> str:
    parts = []
    if "depth" in cell:
        parts.append(f"{cell['depth']}L")
    if "block_size" in cell:
        parts.append(f"B{cell['block_size']}")
    if "temperature" in cell:
        parts.append(f"T{cell['temperature']:g}")
    parts += [f"{k} {cell[k]}" for k in ("epoch", "alpha") if k in cell]
    if "scaled" in cell:
        parts.append(f"x{float(cell['scaled']['ratio']):.3f} (B{cell['scaled']['to']} / B{cell['scaled']['from']})")
    return " ".join(parts)


# A percentile bootstrap over n prompts has at most C(2n - 1, n) distinct means: below this many prompts its
# 95% interval is little more than the range of the prompts' own values (n = 2: their minimum and maximum),
# far narrower than a 95% interval should be, so such a cell gets no interval and decides nothing.
MIN_INTERVAL_PROMPTS = 5


def judged(claim: dict, cell: str, estimate: tuple, raw: tuple, attrs: dict, *, num_prompts: int | None = None,
           measurable: bool = True, **extra) -> Finding:
    """A measured cell in the claim's unit, matched to its paper cell and judged against its region (without an
    interval when it rests on fewer than ``MIN_INTERVAL_PROMPTS`` prompts). ``measurable`` False: a timing that
    does not repeat on this machine, shown with its value and never judged (``NOT_MEASURABLE``)."""
    if num_prompts is not None and num_prompts < MIN_INTERVAL_PROMPTS:
        estimate, raw = (estimate[0], math.nan, math.nan), (raw[0], math.nan, math.nan)
    paper, scope = own_setting(claim, attrs, match_paper_cell(claim, attrs))
    region = Region.of(claim["verdict"], paper_value(claim, paper) if paper else math.nan)
    cell_verdict = verdict(estimate[1], estimate[2], region) if paper is not None else BEYOND
    if not measurable and paper is not None:
        cell_verdict = NOT_MEASURABLE
    return Finding(claim, cell_verdict, cell, *estimate, attrs=attrs, raw=raw, paper_cell=paper, scope=scope, **extra)


def region_of(finding: Finding) -> Region:
    paper = finding.paper_cell or {}
    return Region.of(finding.claim["verdict"], paper_value(finding.claim, paper) if paper else math.nan)


# --- one verdict per claim ----------------------------------------------------------------------------------

def p_outside(value: float, low: float, high: float, region: Region) -> float:
    """One-sided p-value that the cell's true value lies outside ``region`` (small: contradicted), from a
    normal reading of its 95% interval (the half facing the region's edge). Equals 0.025 exactly when the
    interval's end touches the edge, so p < 0.025 is the cell's own *contradicted*."""
    if not (np.isfinite(low) and np.isfinite(high) and np.isfinite(value)):
        return 1.0
    if region.strict and low == high and (high <= region.low or low >= region.high):
        return 0.0  # no spread at all, on an open end or beyond it: outside for sure (the normal reading says 0.5)
    z = stats.norm.ppf(1.0 - (1.0 - LEVEL) / 2.0)
    p = 1.0
    if np.isfinite(region.low) and value < region.low:
        p = min(p, stats.norm.cdf(-(region.low - value) / max((high - value) / z, 1e-12)))
    if np.isfinite(region.high) and value > region.high:
        p = min(p, stats.norm.cdf(-(value - region.high) / max((value - low) / z, 1e-12)))
    return float(p)


def holm_contradicted(pvalues: Sequence[float], alpha: float = (1.0 - LEVEL) / 2.0) -> list[bool]:
    """Holm's step-down over a claim's cells: the i-th smallest p is rejected while p_(i) < alpha / (m - i)."""
    order = np.argsort(pvalues)
    rejected = [False] * len(pvalues)
    for rank, index in enumerate(order):
        if pvalues[index] >= alpha / (len(pvalues) - rank):
            break
        rejected[index] = True
    return rejected


def claim_verdict(cells: Sequence[Finding]) -> str:
    """One claim's verdict from its cells: reproduced only if every cell the paper reported is, contradicted
    if any is (Holm over those cells), else inconclusive; not measurable on this machine if any cell is. Not run: no cell measured; beyond the paper: no
    measured cell at a setting the paper reported."""
    measured = [f for f in cells if f.verdict != NOT_RUN]
    if not measured:
        return NOT_RUN
    scoped = [f for f in measured if f.paper_cell is not None]
    if not scoped:
        return BEYOND
    if any(f.verdict == NOT_MEASURABLE for f in scoped):
        return NOT_MEASURABLE  # a timing this machine cannot repeat decides nothing, whatever the other cells say
    if any(holm_contradicted([p_outside(f.value, f.low, f.high, region_of(f)) for f in scoped])):
        return CONTRADICTED
    if all(f.verdict == REPRODUCED for f in scoped):
        return REPRODUCED
    return INCONCLUSIVE

