"""The paper's claims against what was measured: a scorecard with one verdict per claim.

The claims are data (``workflow/claims.yaml``): each names its source line in the paper's LaTeX, the
paper's numbers in the paper's own cells (``paper_cells``: temperature, block size, depth, epoch), how it is
measured (``measure``), the unit it is judged in and the region of the measured value that reproduces it
(``verdict``). This module measures each claim in every cell of the run (:func:`findings`), matches each run
cell to the paper cell nearest its setting, and combines the cells into one verdict per claim
(:func:`claim_verdict`):

* a cell is *reproduced* when its 95% interval lies inside the claimed region, *contradicted* when outside;
* a claim is *reproduced* only if every cell the paper reported is, *contradicted* if any such cell is
  (Holm-corrected over the claim's cells), else *inconclusive*; *not run* when its artifacts are missing;
* cells at a setting the paper never reported (T = 1 for Tables 3-6) are *beyond the paper*: shown, not
  counted.

Units (``verdict.scale``): ``absolute`` (tau or SR, or their difference), ``relative`` (a fraction of
DFlash's value) and ``accepted`` (a fraction of DFlash's accepted draft length tau - 1, the quantity the
paper's objective targets; ``docs/scorecard.md`` says why tau gains are judged in it). Only comparisons
carry a reference to divide by; step times are ratios already.

Measures (``measure.kind``): ``comparison`` (rows of ``metrics/<experiment>_comparisons.csv``),
``contrast`` (a weighted sum of drafters' tau or SR from their per-request records), ``correlation`` and
``correlation_gap`` (Table 8), ``step_time`` (Table 7, ``dpace.report.timing``), ``weight_shift``
(Figure 3). Claims the pipeline cannot decide are ``not_measurable`` with their reason. Pure Python and
pandas; ``workflow/scripts/findings.py`` hands over the paths.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from dpace.io import atomic_write_text, read_json
from dpace.paths import EVAL_SUMMARY
from dpace.report.intervals import _prompt_sums, paired_contrast
from dpace.report.scale import gain_slope
from dpace.report.timing import ratio_of_means, window_means

REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN = "reproduced", "contradicted", "inconclusive", "not run"
BEYOND = "beyond the paper"
VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN)
CLAIM_KEYS = ("id", "claim", "paper", "source", "paper_value", "measure", "verdict")
NOT_MEASURABLE = "not_measurable"
RESAMPLES, SEED, LEVEL = 2000, 0, 0.95
# A comparison cell: which drafters a comparisons row pairs, and how the scorecard labels it.
CELL_COLUMNS = ("target", "depth", "block_size", "temperature", "epoch")
# A run cell matches a paper cell at the same temperature, epoch and alpha; block size and depth: the nearest.
EXACT_KEYS, NEAREST_KEYS = ("temperature", "epoch", "alpha"), ("block_size", "depth")
SCALES = ("absolute", "relative", "accepted")
UNITS = {
    "absolute": "{metric} (absolute)",
    "relative": "{metric} gain as a fraction of DFlash's {metric}",
    "accepted": "accepted draft length (tau - 1) gain as a fraction of DFlash's",
}
# Table 1's spread over training seeds (three-seed study of the a2f4e57 run, docs/measurements.md).
SEED_SPREAD = ("Table 1's seed spread, measured in the three-seed study of the a2f4e57 run "
               "(docs/measurements.md, \"Three training seeds of Table 1\"): D-PACE - DFlash in average tau at T = 0 "
               "was +0.043 / +0.083 / +0.037 at seeds 0 / 1 / 2 (sd of one seed's difference about 0.024; the seeds "
               "carry 80% of its variance), Top-3 - DFlash +0.055 / +0.055 / +0.053, Accept-rate collapsed at every "
               "seed. An interval over prompts of one seed is about +-0.02 wide; over seeds too, about +-0.05.")


@dataclass(frozen=True)
class Region:
    """The values of the measured quantity that reproduce a claim: [low, high], either end open (inf)."""

    low: float = -math.inf
    high: float = math.inf

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
        return cls(float(rule.get("above", -math.inf)), float(rule.get("below", math.inf)))

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
    if low >= region.low and high <= region.high:
        return REPRODUCED
    if high < region.low or low > region.high:
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


def _scale(claim: dict) -> str:
    return claim["verdict"].get("scale", "absolute")


KIND_UNITS = {
    "step_time": "training time as a fraction of DFlash's (ratio - 1)",
    "correlation": "Spearman rho (per block)",
    "correlation_gap": "difference of two Spearman rho (per block)",
    "weight_shift": "block positions (mean weighted position, late minus early)",
    "contrast": "{metric} (absolute; a weighted sum of drafters)",
}


def unit_text(claim: dict) -> str:
    """The unit a claim is judged in, as the page states it."""
    kind, metric = claim["measure"]["kind"], claim["measure"].get("metric", "tau")
    return KIND_UNITS.get(kind, UNITS[_scale(claim)]).format(metric=metric)


def _is_fraction(claim: dict) -> bool:
    return _scale(claim) != "absolute" or claim["measure"]["kind"] == "step_time"


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


class NotRun(Exception):
    """A claim's artifacts are missing: the reason names the file or the rows."""


def read_claims(path: str | Path) -> list[dict]:
    """The claims file, each entry checked for the keys the scorecard needs and a unit that its measure has."""
    claims = yaml.safe_load(Path(path).read_text())
    if not isinstance(claims, list):
        raise ValueError(f"{path}: expected a list of claims")
    seen = set()
    for claim in claims:
        kind = claim.get("measure", {}).get("kind")
        required = ("id", "claim", "paper", "source", "measure", "reason") if kind == NOT_MEASURABLE else CLAIM_KEYS
        missing = [k for k in required if k not in claim]
        if missing:
            raise ValueError(f"{path}: claim {claim.get('id', '?')!r} lacks {missing}")
        if claim["id"] in seen:
            raise ValueError(f"{path}: claim id {claim['id']!r} appears twice")
        seen.add(claim["id"])
        if kind == NOT_MEASURABLE:
            continue
        if kind not in MEASURES:
            raise ValueError(f"{path}: claim {claim['id']!r}: unknown measure kind {kind!r}")
        _check_scale(claim, path)
        if "paper_factor" in claim["verdict"] and not claim.get("paper_cells"):
            raise ValueError(f"{path}: claim {claim['id']!r}: paper_factor needs paper_cells")
        Region.of(claim["verdict"], 1.0)
    return claims


def _check_scale(claim: dict, path) -> None:
    """Only comparisons have a reference to divide by; a step time is a ratio already. Anything else would be
    judged in a unit it is not in (a relative band against an absolute difference)."""
    scale, kind = claim["verdict"].get("scale"), claim["measure"]["kind"]
    allowed = {"comparison": SCALES, "step_time": ("relative",)}.get(kind, ("absolute",))
    if (scale or ("absolute" if kind != "step_time" else None)) not in allowed:
        raise ValueError(f"{path}: claim {claim['id']!r}: scale {scale!r} does not apply to a {kind} measure "
                         f"(allowed: {', '.join(allowed)})")


def real_claims(claims: Sequence[dict]) -> list[dict]:
    return [c for c in claims if c["measure"]["kind"] != NOT_MEASURABLE]


def not_measurable(claims: Sequence[dict]) -> list[dict]:
    return [c for c in claims if c["measure"]["kind"] == NOT_MEASURABLE]


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
    DFlash's ``dflash`` by :func:`in_unit` (the conversion the measurements get)."""
    if "value" in cell:
        return float(cell["value"])
    if "tau" in cell and "dflash" in cell:
        return in_unit(float(cell["tau"]) - float(cell["dflash"]), float(cell["dflash"]), _scale(claim))
    return math.nan


def paper_cell_label(cell: dict) -> str:
    parts = []
    if "depth" in cell:
        parts.append(f"{cell['depth']}L")
    if "block_size" in cell:
        parts.append(f"B{cell['block_size']}")
    if "temperature" in cell:
        parts.append(f"T{cell['temperature']:g}")
    parts += [f"{k} {cell[k]}" for k in ("epoch", "alpha") if k in cell]
    return " ".join(parts)


def _judged(claim: dict, cell: str, estimate: tuple, raw: tuple, attrs: dict, **extra) -> Finding:
    """A measured cell in the claim's unit, matched to its paper cell and judged against its region."""
    paper = match_paper_cell(claim, attrs)
    region = Region.of(claim["verdict"], paper_value(claim, paper) if paper else math.nan)
    cell_verdict = verdict(estimate[1], estimate[2], region) if paper is not None else BEYOND
    return Finding(claim, cell_verdict, cell, *estimate, attrs=attrs, raw=raw, paper_cell=paper, **extra)


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
    if any is (Holm over those cells), else inconclusive. Not run: no cell measured; beyond the paper: no
    measured cell at a setting the paper reported."""
    measured = [f for f in cells if f.verdict != NOT_RUN]
    if not measured:
        return NOT_RUN
    scoped = [f for f in measured if f.paper_cell is not None]
    if not scoped:
        return BEYOND
    if any(holm_contradicted([p_outside(f.value, f.low, f.high, region_of(f)) for f in scoped])):
        return CONTRADICTED
    if all(f.verdict == REPRODUCED for f in scoped):
        return REPRODUCED
    return INCONCLUSIVE


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


def _main_variant(results: Path, objective: str) -> str:
    """Table 1's shallowest ``objective`` drafter: the one Tables 7, 8 and Figure 3 show."""
    main = read_csv(results, "main.csv")
    rows = main[main["objective"] == objective].sort_values(["depth", "block_size"])
    if rows.empty:
        raise NotRun(f"no {objective} drafter in metrics/main.csv")
    return str(rows.iloc[0]["variant"])


def _bootstrap(samples: Sequence[np.ndarray], statistic: Callable[..., float]) -> tuple[float, float, float]:
    """``statistic`` of independent samples, with a percentile interval resampling each one separately."""
    generator = np.random.default_rng(SEED)
    point = statistic(*samples)
    if min(len(s) for s in samples) < 2:
        return point, math.nan, math.nan
    draws = [generator.integers(0, len(s), size=(RESAMPLES, len(s))) for s in samples]
    values = np.array([statistic(*(s[d[r]] for s, d in zip(samples, draws, strict=True))) for r in range(RESAMPLES)])
    tail = (1.0 - LEVEL) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return point, float(low), float(high)


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
    candidates = _filtered(_at_epoch(frame[frame["objective"] == m["objective"]], m.get("epoch")), where)
    rows = _benchmark_rows(candidates[candidates["metric"] == metric], benchmark)
    if rows.empty:
        raise NotRun(f"no {m['objective']} rows in metrics/{m['experiment']}_comparisons.csv")
    # DFlash's tau in each cell (the tau rows' reference), whatever metric the claim reads.
    cell_of = ["reference_variant", "temperature", "epoch", "suite", "benchmark"]
    dflash_tau = {tuple(r[cell_of]): float(r["reference_value"]) for _, r in frame[frame["metric"] == "tau"].iterrows()}
    label_extra = list(where) + (["benchmark"] if benchmark == "every" else [])
    out = []
    for _, row in rows.sort_values([*CELL_COLUMNS, "benchmark", "variant"]).iterrows():
        reference_tau = dflash_tau.get(tuple(row[cell_of]), math.nan)
        seeds = int(row["num_seeds"]) if "num_seeds" in row and pd.notna(row["num_seeds"]) else 1
        out.append(_judged(
            claim, _cell_label(row, label_extra), comparison_estimate(row, _scale(claim), reference_tau),
            (float(row["difference"]), float(row["ci_low"]), float(row["ci_high"])),
            _row_attrs(row, (*CELL_COLUMNS, "benchmark", *where)),
            key=("comparison", *(row[c] for c in ("target", "variant", "reference_variant", "metric", "benchmark",
                                                   "temperature", "epoch", "suite"))),
            reference_tau=reference_tau, seeds=seeds, note=f"n={int(row['num_prompts'])} prompts",
            drafters=f"{row['objective']} - dflash ({row['metric']})"))
    return out


def _first_seed(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows of the lowest training seed, and how many seeds the frame holds (``train.seeds`` > 1 gives
    each method one variant per seed). Contrasts read one drafter per method: the first seed's, and say so."""
    if "training_seed" not in frame or frame["training_seed"].nunique() < 2:
        return frame, 1
    seeds = frame["training_seed"]
    return frame[seeds == seeds.min()], int(seeds.nunique())


def _dflash_tau(cell: pd.DataFrame) -> float:
    """DFlash's average tau over the benchmarks of a metrics cell; NaN when the cell has no single DFlash."""
    dflash = cell[cell["objective"] == "dflash"]
    return float(dflash["tau"].mean()) if dflash["variant"].nunique() == 1 else math.nan


def measure_contrast(claim: dict, results: Path) -> list[Finding]:
    m = claim["measure"]
    metrics = read_csv(results, f"{m['experiment']}.csv")
    benchmark, metric = m.get("benchmark", "avg"), m.get("metric", "tau")
    rows = metrics if benchmark == "avg" else metrics[metrics["benchmark"] == benchmark]
    rows, seeds = _first_seed(_filtered(_at_epoch(rows, m.get("epoch")), dict(m.get("where", {}))))
    seed_note = f"; training seed {rows['training_seed'].iloc[0]:g} of {seeds}" if seeds > 1 else ""
    terms = m["terms"]
    # Cells: every cell column that no term picks itself (Table 4's terms pick their block sizes).
    chosen = {key for term in terms for key in term if key != "weight"}
    cell_keys = [c for c in CELL_COLUMNS if c not in chosen]
    out = []
    for _, cell in rows.groupby(cell_keys, sort=True):
        picked = [_pick(cell, term) for term in terms]
        if any(p["variant"].nunique() != 1 for p in picked):
            continue  # this cell lacks one of the drafters (or holds several): it cannot be contrasted
        benchmarks = None if benchmark == "avg" else [benchmark]
        drafters = [_requests(results, p.iloc[0], benchmarks) for p in picked]
        common = sorted(set.intersection(*(set(d) for d in drafters)))
        weights = [float(t.get("weight", 1.0)) for t in terms]
        result = paired_contrast([{b: d[b] for b in common} for d in drafters], weights,
                                 metric=metric, resamples=RESAMPLES, seed=SEED, level=LEVEL)
        label = _cell_label(cell.iloc[0][cell_keys])
        if len(terms) > 1:  # which drafters, with the values that largest/smallest picked
            label += "".join(f", {w:+g} x " + " ".join(
                f"{k} {p.iloc[0][k]}" if v in ("largest", "smallest") else str(v)
                for k, v in term.items() if k != "weight") for term, p, w in zip(terms, picked, weights, strict=True))
        estimate = (result["value"], result["ci_low"], result["ci_high"])
        key = ("contrast", tuple((p.iloc[0]["variant"], w) for p, w in zip(picked, weights, strict=True)), metric,
               benchmark, *(cell.iloc[0][k] for k in ("temperature", "epoch") if k in cell_keys))
        out.append(_judged(claim, label, estimate, estimate, _row_attrs(cell.iloc[0], cell_keys), key=key,
                           reference_tau=_dflash_tau(cell), note=f"n={result['num_prompts']} prompts{seed_note}",
                           drafters=f"contrast ({metric})"))
    if not out:
        raise NotRun(f"no cell of metrics/{m['experiment']}.csv holds every drafter of the contrast")
    return out


def _dflash_blocks(results: Path) -> tuple[str, pd.DataFrame]:
    """The per-block records (S~, sum q, tau_b) of Table 1's shallowest DFlash drafter on MATH-500 at T=0."""
    variant = _main_variant(results, "dflash")
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
    return variant, rows


def _block_correlation(claim: dict, results: Path, statistic: Callable[[np.ndarray], float]) -> list[Finding]:
    """``statistic`` of the 3 x 3 Spearman matrix (S~, sum q, tau_b) over the blocks; prompts resampled
    (a prompt's blocks stay together)."""
    variant, rows = _dflash_blocks(results)
    prompts = rows["prompt_index"].to_numpy()
    columns = rows[["surrogate", "sum_q", "tau_block"]].to_numpy(float)
    by_prompt = [np.flatnonzero(prompts == p) for p in np.unique(prompts)]

    def of(indices: np.ndarray) -> float:
        picked = columns[np.concatenate([by_prompt[i] for i in indices])]
        with np.errstate(invalid="ignore", divide="ignore"):  # a resample of constant blocks: NaN
            return statistic(stats.spearmanr(picked).statistic)

    estimate = _bootstrap([np.arange(len(by_prompt))], of)
    return [_judged(claim, f"{variant} MATH-500 T0", estimate, estimate, {"temperature": 0.0},
                    key=("blocks", variant, claim["measure"]["kind"]),
                    note=f"{len(rows)} blocks, {len(by_prompt)} prompts")]


def measure_correlation(claim: dict, results: Path) -> list[Finding]:
    """Spearman rho(S~, tau_b) over the blocks of Table 1's shallowest DFlash drafter (Table 8, Figure 1a)."""
    return _block_correlation(claim, results, lambda rho: float(rho[0, 2]))


def measure_correlation_gap(claim: dict, results: Path) -> list[Finding]:
    """rho(S~, tau_b) - rho(sum q, tau_b) over the same blocks (Table 8)."""
    return _block_correlation(claim, results, lambda rho: float(rho[0, 2] - rho[1, 2]))


def _train_steps(results: Path) -> pd.DataFrame:
    return read_csv(results, "main_train_steps.csv")


def measure_step_time(claim: dict, results: Path) -> list[Finding]:
    """D-PACE's training time over DFlash's, minus 1, in units that respect how steps are timed
    (``dpace.report.timing``): ``per: window`` (default) resamples contiguous windows of each run's steps,
    ``per: epoch`` each run's epochs (an epoch's time: the sum of its step times)."""
    m = claim["measure"]
    steps = _train_steps(results)
    units = []
    for objective in ("dpace", "dflash"):
        variant = _main_variant(results, objective)
        rows = steps[steps["variant"] == variant].dropna(subset=["step_time_s"]).sort_values("step")
        if rows.empty:
            raise NotRun(f"no step times of {variant} in metrics/main_train_steps.csv")
        if m.get("per", "window") == "epoch":
            units.append(rows.groupby("epoch")["step_time_s"].sum().to_numpy(float))
        else:
            units.append(window_means(rows["step_time_s"].to_numpy(float), int(m.get("windows", 10))))
    estimate = ratio_of_means(*units, resamples=RESAMPLES, seed=SEED, level=LEVEL)
    unit = "epochs" if m.get("per", "window") == "epoch" else "contiguous windows"
    return [_judged(claim, "Table 1's shallowest pair", estimate, estimate, {}, key=("timing", m.get("per", "window")),
                    note=f"{len(units[0])} / {len(units[1])} {unit} of one run each: the interval is within these "
                         "two runs on this machine")]


def measure_weight_shift(claim: dict, results: Path) -> list[Finding]:
    """The mean weighted block position sum_j j w_j / sum_j w_j of D-PACE's logged weights: its average over
    the last ``window`` of training minus that over the first (in steps, fraction of all)."""
    steps = _train_steps(results)
    variant = _main_variant(results, "dpace")
    rows = steps[steps["variant"] == variant].sort_values("step")
    weights = rows.filter(regex=r"^w_\d+$")
    if rows.empty or weights.empty:
        raise NotRun(f"no logged weights of {variant} in metrics/main_train_steps.csv")
    w = weights.to_numpy(float)
    positions = np.arange(w.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):
        centre = np.nansum(w * positions, axis=1) / np.nansum(w, axis=1)
    count = max(1, math.ceil(float(claim["measure"].get("window", 0.1)) * len(centre)))
    # Contiguous windows of each stretch are resampled, not steps: neighbouring steps' weights move together.
    early, late = window_means(centre[:count], 10), window_means(centre[-count:], 10)
    value, low, high = _bootstrap([late, early], lambda late, early: float(late.mean() - early.mean()))
    return [_judged(claim, variant, (value, low, high), (value, low, high), {}, key=("weights", variant),
                    note=f"first and last {count} of {len(centre)} steps, {len(early)} windows each")]



MEASURES: dict[str, Callable[[dict, Path], list[Finding]]] = {
    "comparison": measure_comparison,
    "contrast": measure_contrast,
    "correlation": measure_correlation,
    "correlation_gap": measure_correlation_gap,
    "step_time": measure_step_time,
    "weight_shift": measure_weight_shift,
}


def findings(claims: Sequence[dict], results: str | Path) -> list[Finding]:
    """Every measurable claim measured: one finding per cell it covers, or one *not run* finding naming what
    is missing."""
    out = []
    for claim in real_claims(claims):
        try:
            out += MEASURES[claim["measure"]["kind"]](claim, Path(results))
        except NotRun as missing:
            out.append(Finding(claim, NOT_RUN, note=str(missing)))
    return out


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
    rows, _ = _first_seed(_filtered(rows, dict(g.get("where", {}))))
    roles = {"ours": g.get("objective", "dpace"), "reference": "dflash", "stratifier": g["stratifier"]}
    out = []
    for _, cell in rows.groupby([c for c in CELL_COLUMNS if c != over], sort=True):
        drafters = {role: cell[cell["objective"] == objective] for role, objective in roles.items()}
        if any(d["variant"].nunique() != 1 for d in drafters.values()):
            continue
        strata = sorted(set.intersection(*(set(d[over]) for d in drafters.values())))
        if len(strata) < 3:
            continue
        sums = {role: [] for role in roles}
        try:
            for stratum in strata:
                requests = {role: next(iter(_requests(results, d[d[over] == stratum].iloc[0], [
                    d[d[over] == stratum].iloc[0]["benchmark"]]).values())) for role, d in drafters.items()}
                prompt_ids = sorted({str(r["id"]) for r in requests["ours"]})
                for role in roles:
                    sums[role].append(_prompt_sums(requests[role], prompt_ids))
        except (NotRun, StopIteration):
            continue
        result = gain_slope(sums["ours"], sums["reference"], sums["stratifier"], resamples=RESAMPLES, seed=SEED,
                            level=LEVEL)
        out.append({**result, "cell": _cell_label(cell.iloc[0][[c for c in CELL_COLUMNS if c != over]]),
                    "over": over, "stratifier": g["stratifier"], "strata_names": [str(s) for s in strata]})
    return out


def gradients(claims: Sequence[dict], results: str | Path) -> dict[str, list[dict]]:
    return {c["id"]: measure_gradient(c, results) for c in real_claims(claims) if "gradient" in c}


def scale_mark(claim: dict, measured: Sequence[dict]) -> str:
    """"scale-sensitive" only where a gradient backs it; otherwise what was (not) measured, and the claim's
    conjecture, labelled as one."""
    conjecture = f" Conjecture (not measured): {claim['conjecture']}" if claim.get("conjecture") else ""
    if not measured:
        return ("no gradient measured." if "gradient" in claim else "no gradient in this run.") + conjecture
    backed = [g for g in measured if g["ci_low"] > 0 or g["ci_high"] < 0]
    if backed:
        return "**scale-sensitive (measured)**: " + "; ".join(
            f"{g['cell']}: {g['slope']:+.2f} [{g['ci_low']:+.2f}, {g['ci_high']:+.2f}] per unit of "
            f"{g['stratifier']}'s tau across {g['over']}s" for g in backed) + "." + conjecture
    return "no gradient detected across " + ", ".join(f"{g['over']}s ({g['cell']})" for g in measured) + "." + conjecture


# --- the page -----------------------------------------------------------------------------------------------

def _number(x: float, relative: bool) -> str:
    if not np.isfinite(x):
        return "--"
    return f"{100 * x:+.1f}%" if relative else f"{x:+.3f}"


def measured_text(finding: Finding) -> str:
    if finding.verdict == NOT_RUN:
        return "--"
    fraction = _is_fraction(finding.claim)
    interval = f"[{_number(finding.low, fraction)}, {_number(finding.high, fraction)}]" if np.isfinite(finding.low) \
        else "(no interval)"
    return f"{_number(finding.value, fraction)} {interval}"


def _raw_text(finding: Finding) -> str:
    value, low, high = finding.raw
    if not np.isfinite(value):
        return "--"
    if finding.key and finding.key[0] == "timing":
        return measured_text(finding)
    interval = f"[{low:+.3f}, {high:+.3f}]" if np.isfinite(low) else "(no interval)"
    return f"{value:+.3f} {interval}"


def _seeds_text(cells: Sequence[Finding]) -> str:
    seeds = min((f.seeds for f in cells if f.verdict != NOT_RUN), default=0)
    if not seeds:
        return "--"
    return f"covers training seeds ({seeds})" if seeds > 1 else "these drafters (one seed)"


def _paper_cells_text(claim: dict, cells: Sequence[Finding]) -> str:
    """The paper cells the run's cells matched, each with the paper's number in the claim's unit."""
    matched = []
    for f in cells:
        if f.paper_cell and f.paper_cell not in matched:
            matched.append(f.paper_cell)
    if not matched:
        return str(claim["paper_value"])
    fraction = _is_fraction(claim)
    return "; ".join(f"{paper_cell_label(c)}: {_number(paper_value(claim, c), fraction)}"
                     + (f" ({c['source']})" if "source" in c else "") for c in matched)


def _row(cells: Sequence) -> str:
    return "| " + " | ".join(str(x).replace("|", "/").replace("\n", " ") for x in cells) + " |"


def claims_table(by_claim: dict[str, list[Finding]], verdicts: dict[str, str], grads: dict[str, list[dict]]) -> list[str]:
    lines = ["| claim | paper, source | unit | paper's cell: number (in the unit) | run cells (beyond the paper) "
             "| seeds | scale | verdict |", "|---|---|---|---|---|---|---|---|"]
    for cells in by_claim.values():
        c = cells[0].claim
        measured = [f for f in cells if f.verdict != NOT_RUN]
        beyond = sum(f.paper_cell is None for f in measured)
        seeds = _seeds_text(cells)
        word = verdicts[c["id"]]
        shown = f"**{word}**" + (" (these drafters, one seed)" if seeds.startswith("these") and word in (
            REPRODUCED, CONTRADICTED) else "")
        if word == NOT_RUN:
            shown += f": {cells[0].note}"
        lines.append(_row([
            f"`{c['id']}`: {c['claim']}", f"{c['paper']}, `{c['source']}`", unit_text(c),
            _paper_cells_text(c, cells), f"{len(measured) - beyond} ({beyond})", seeds,
            scale_mark(c, grads.get(c["id"], [])), shown]))
    return lines


def cells_table(found: Sequence[Finding]) -> list[str]:
    """One row per measurement (drafters, metric, cell), however many claims read it."""
    lines = ["| run cell | measured (absolute) [95% CI] | DFlash tau: run / paper | claims reading it: in the claim's "
             "unit, reproduced if, cell verdict |", "|---|---|---|---|"]
    groups: dict[tuple, list[Finding]] = {}
    for f in found:
        if f.verdict != NOT_RUN:
            groups.setdefault(f.key or (f.claim["id"], f.cell), []).append(f)
    for cells in groups.values():
        first = cells[0]
        papers = {f.paper_cell.get("dflash") for f in cells if f.paper_cell and "dflash" in f.paper_cell}
        paper_tau = " or ".join(f"{x:.2f}" for x in sorted(papers)) or "--"
        run_tau = f"{first.reference_tau:.3f}" if np.isfinite(first.reference_tau) else "--"
        readers = "; ".join(
            f"`{f.claim['id']}` {measured_text(f)}, {region_of(f).text(_is_fraction(f.claim)) if f.paper_cell is not None else '--'}, "
            f"**{f.verdict}**" for f in cells)
        lines.append(_row([(f"{first.drafters}: " if first.drafters else "") + first.cell, _raw_text(first) + (f" ({first.note})" if first.note else ""),
                           f"{run_tau} / {paper_tau}", readers]))
    return lines


def gradients_table(grads: dict[str, list[dict]]) -> list[str]:
    rows = [(claim_id, g) for claim_id, measured in grads.items() for g in measured]
    if not rows:
        return ["No gradient could be measured (the experiments, or their third drafter, are missing)."]
    lines = ["| claim | run cell | strata | DFlash tau per stratum | gain per stratum | slope on the third drafter's tau "
             "[95% CI] | naive slope on DFlash's own tau [95% CI] |", "|---|---|---|---|---|---|---|"]
    for claim_id, g in rows:
        lines.append(_row([
            f"`{claim_id}`", g["cell"], f"{g['over']}: {', '.join(g['strata_names'])}",
            ", ".join(f"{x:.2f}" for x in g["reference_tau"]), ", ".join(f"{x:+.3f}" for x in g["gain"]),
            f"{g['slope']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] ({g['stratifier']})",
            f"{g['naive_slope']:+.3f} [{g['naive_low']:+.3f}, {g['naive_high']:+.3f}]"]))
    return lines


def scorecard(found: Sequence[Finding], *, config_name: str, commit: str, grads: dict | None = None,
              unmeasurable: Sequence[dict] = ()) -> str:
    """The scorecard as Markdown: the claim-level count, one row per claim, then each measured cell once."""
    grads = grads or {}
    by_claim: dict[str, list[Finding]] = {}
    for f in found:
        by_claim.setdefault(f.claim["id"], []).append(f)
    verdicts = {claim_id: claim_verdict(cells) for claim_id, cells in by_claim.items()}
    counts = {v: sum(x == v for x in verdicts.values()) for v in VERDICTS}
    beyond_claims = sum(x == BEYOND for x in verdicts.values())
    measured = [f for f in found if f.verdict != NOT_RUN]
    beyond_cells = sum(f.paper_cell is None for f in measured)
    lines = [
        "# Findings: the paper's claims against this run",
        "",
        f"Run: config `{config_name}`, commit `{commit}`. Claims: `workflow/claims.yaml`.",
        "",
        f"**{sum(counts.values())} claims:** " + " | ".join(f"**{counts[v]}** {v}" for v in VERDICTS)
        + (f" ({beyond_claims} more measured only beyond the paper, not counted)" if beyond_claims else "")
        + f". {len(unmeasurable)} more claims are not measurable here.",
        "",
        f"Cells: {len(measured) - beyond_cells} measured in settings the paper reported, {beyond_cells} beyond the "
        "paper (shown, not counted).",
        "",
        "A claim is *reproduced* only if every cell the paper reported is (its 95% interval inside the claimed "
        "region), *contradicted* if any such cell lies outside it after Holm's correction over the claim's cells, "
        "else *inconclusive*. Each run cell is judged against the paper cell nearest its setting (same "
        "temperature, epoch and alpha; nearest block size, then depth), in the unit the claim states; tau gains "
        "in accepted draft length (tau - 1) as a fraction of DFlash's (docs/scorecard.md says why). \"These "
        "drafters (one seed)\": the interval covers the prompts, not training seeds (see Seeds).",
        "",
        "## Claims",
        "",
        *claims_table(by_claim, verdicts, grads),
        "",
        "## Cells",
        "",
        "Each measured drafter pair once, with every claim that reads it. DFlash's tau in the run's cell against "
        "the paper's matched cell: the run's scale against the paper's.",
        "",
        *cells_table(found),
        "",
        "## Scale",
        "",
        "Where the run has a gradient, the slope of D-PACE's tau gain over DFlash against the strata's tau. The "
        "slope is taken against a third drafter's tau: against DFlash's own tau, DFlash's measurement error "
        "enters both sides and fakes a negative slope (regression to the mean; the naive column shows it). "
        "B = 8 against B = 12 is `t4-gain-grows-with-block-size` above.",
        "",
        *gradients_table(grads),
        "",
        "## Seeds",
        "",
        SEED_SPREAD,
        "",
        "## Not measurable here",
        "",
        *[f"- `{c['id']}` ({c['paper']}, `{c['source']}`): {c['claim']} -- {c['reason']}" for c in unmeasurable],
    ]
    return "\n".join(lines) + "\n"


def headline(markdown: str) -> str:
    """The claim-level count line of a scorecard page (the report's front page shows it)."""
    return next(line for line in markdown.splitlines() if line.startswith("**") and " claims:**" in line)


def checkout_commit(folder: str | Path) -> str:
    """The commit checked out at ``folder`` (short, "-dirty" with uncommitted changes), or "unknown"."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except OSError:  # no git
        return "unknown"
    return (commit + ("-dirty" if dirty else "")) if commit else "unknown"


def write_findings(claims_path, results, out, *, config_name: str, commit: str) -> list[Finding]:
    claims = read_claims(claims_path)
    found = findings(claims, results)
    page = scorecard(found, config_name=config_name, commit=commit, grads=gradients(claims, results),
                     unmeasurable=not_measurable(claims))
    atomic_write_text(out, page)
    return found
