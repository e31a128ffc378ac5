"""The paper's claims against what was measured: a scorecard with a verdict per claim.

The claims are data (``workflow/claims.yaml``): each names its source line in the paper's LaTeX, the
paper's number, how it is measured (``measure``) and the region of the measured value that reproduces it
(``verdict``). This module measures each claim from the metrics under ``results/`` and decides it from the
95% interval alone (:func:`verdict`):

* *reproduced* -- the whole interval lies inside the claimed region;
* *contradicted* -- the whole interval lies outside it;
* *inconclusive* -- the interval straddles an edge of the region, or there is no interval (one prompt);
* *not run* -- the artifacts the claim needs do not exist (or hold no matching rows).

Measures (``measure.kind``):

* ``comparison`` -- rows of ``metrics/<experiment>_comparisons.csv`` (a drafter against the experiment's
  DFlash drafter, paired bootstrap of ``dpace.report.intervals``), one finding per matching cell;
* ``contrast`` -- a weighted sum of several drafters' tau or SR from their evaluations' per-request
  records, with the same paired bootstrap (``dpace.report.intervals.paired_contrast``): orderings between two
  non-reference drafters, or a difference of differences;
* ``correlation_gap`` -- Table 8: Spearman rho of S~ minus rho of sum q with per-block tau, prompts resampled;
* ``step_time`` -- Table 7: D-PACE's time per optimizer step relative to DFlash's, steps resampled;
* ``weight_shift`` -- Figure 3: how far D-PACE's mean weighted block position moves from the start to
  the end of training, steps resampled.

Pure Python and pandas; ``workflow/scripts/findings.py`` hands over the paths.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from dpace.io import atomic_write_text, read_json
from dpace.report.intervals import paired_contrast

REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN = "reproduced", "contradicted", "inconclusive", "not run"
VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_RUN)
CLAIM_KEYS = ("id", "claim", "paper", "source", "paper_value", "measure", "verdict")
RESAMPLES, SEED, LEVEL = 2000, 0, 0.95
# A comparison cell: which drafters a comparisons row pairs, and how the scorecard labels it.
CELL_COLUMNS = ("target", "depth", "block_size", "temperature", "epoch")


@dataclass(frozen=True)
class Region:
    """The values of the measured quantity that reproduce a claim: [low, high], either end open (inf)."""

    low: float = -math.inf
    high: float = math.inf

    @classmethod
    def of(cls, rule: dict) -> Region:
        """``{above: a}``, ``{below: b}`` or ``{between: [a, b]}``, as a claim's ``verdict`` writes it."""
        if "between" in rule:
            low, high = (float(x) for x in rule["between"])
            return cls(low, high)
        return cls(float(rule.get("above", -math.inf)), float(rule.get("below", math.inf)))

    def text(self, relative: bool) -> str:
        def number(x: float) -> str:
            return f"{100 * x:+g}%" if relative else f"{x:+g}"
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


@dataclass
class Finding:
    claim: dict
    verdict: str
    cell: str = ""
    value: float = math.nan
    low: float = math.nan
    high: float = math.nan
    note: str = ""


class NotRun(Exception):
    """A claim's artifacts are missing: the reason names the file or the rows."""


def read_claims(path: str | Path) -> list[dict]:
    """The claims file, each entry checked for the keys the scorecard needs."""
    claims = yaml.safe_load(Path(path).read_text())
    if not isinstance(claims, list):
        raise ValueError(f"{path}: expected a list of claims")
    seen = set()
    for claim in claims:
        missing = [k for k in CLAIM_KEYS if k not in claim]
        if missing:
            raise ValueError(f"{path}: claim {claim.get('id', '?')!r} lacks {missing}")
        if claim["id"] in seen:
            raise ValueError(f"{path}: claim id {claim['id']!r} appears twice")
        seen.add(claim["id"])
        if claim["measure"].get("kind") not in MEASURES:
            raise ValueError(f"{path}: claim {claim['id']!r}: unknown measure kind {claim['measure'].get('kind')!r}")
        Region.of(claim["verdict"])
    return claims


def read_csv(results: Path, name: str) -> pd.DataFrame:
    """``results/metrics/<name>``, or ``NotRun`` when it was not built (or is empty)."""
    path = results / "metrics" / name
    if not path.exists() or path.stat().st_size == 0:
        raise NotRun(f"metrics/{name} not built")
    frame = pd.read_csv(path)
    if frame.empty:
        raise NotRun(f"metrics/{name} has no rows")
    return frame


def comparison_estimate(row: pd.Series, relative: bool) -> tuple[float, float, float]:
    """One comparisons row as (estimate, 95% low, 95% high): the one place that knows its columns.

    Relative estimates divide the difference and its interval by the reference's value (the reference's
    own spread is in the paired interval of the difference, not in the divisor)."""
    scale = float(row["reference_value"]) if relative else 1.0
    return float(row["difference"]) / scale, float(row["ci_low"]) / scale, float(row["ci_high"]) / scale


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


def measure_comparison(claim: dict, results: Path) -> list[Finding]:
    m = claim["measure"]
    frame = read_csv(results, f"{m['experiment']}_comparisons.csv")
    where = dict(m.get("where", {}))
    frame = _with_variant_columns(frame, results, m["experiment"], where)
    rows = frame[(frame["objective"] == m["objective"]) & (frame["metric"] == m.get("metric", "tau"))
                 & (frame["benchmark"] == m.get("benchmark", "avg"))]
    rows = _filtered(_at_epoch(rows, m.get("epoch")), where)
    if rows.empty:
        raise NotRun(f"no {m['objective']} rows in metrics/{m['experiment']}_comparisons.csv")
    relative = claim["verdict"].get("scale") == "relative"
    region = Region.of(claim["verdict"])
    findings = []
    for _, row in rows.sort_values([*CELL_COLUMNS, "variant"]).iterrows():
        value, low, high = comparison_estimate(row, relative)
        findings.append(Finding(claim, verdict(low, high, region), _cell_label(row, list(where)), value, low, high,
                                note=f"n={int(row['num_prompts'])} prompts"))
    return findings


def _requests(results: Path, row: pd.Series, benchmarks: Sequence[str] | None) -> dict[str, list]:
    """One evaluation's per-request records by benchmark at the row's temperature (its ``summary.json``)."""
    path = results / "eval" / str(row["target"]) / str(row["variant"]) / f"epoch-{int(row['epoch'])}" / str(
        row["suite"]) / "summary.json"
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


def measure_contrast(claim: dict, results: Path) -> list[Finding]:
    m = claim["measure"]
    metrics = read_csv(results, f"{m['experiment']}.csv")
    benchmark = m.get("benchmark", "avg")
    rows = metrics if benchmark == "avg" else metrics[metrics["benchmark"] == benchmark]
    rows = _filtered(_at_epoch(rows, m.get("epoch")), dict(m.get("where", {})))
    terms = m["terms"]
    # Cells: every cell column that no term picks itself (Table 4's terms pick their block sizes).
    chosen = {key for term in terms for key in term if key != "weight"}
    cell_keys = [c for c in CELL_COLUMNS if c not in chosen]
    findings = []
    region = Region.of(claim["verdict"])
    for _, cell in rows.groupby(cell_keys, sort=True):
        picked = [_pick(cell, term) for term in terms]
        if any(p["variant"].nunique() != 1 for p in picked):
            continue  # this cell lacks one of the drafters (or holds several): it cannot be contrasted
        benchmarks = None if benchmark == "avg" else [benchmark]
        drafters = [_requests(results, p.iloc[0], benchmarks) for p in picked]
        common = sorted(set.intersection(*(set(d) for d in drafters)))
        result = paired_contrast([{b: d[b] for b in common} for d in drafters],
                                 [float(t.get("weight", 1.0)) for t in terms],
                                 metric=m.get("metric", "tau"), resamples=RESAMPLES, seed=SEED, level=LEVEL)
        label = _cell_label(cell.iloc[0][cell_keys])
        if len(terms) > 1:  # which drafters, with the values that largest/smallest picked
            label += "".join(f", {float(term.get('weight', 1.0)):+g} x " + " ".join(
                f"{k} {p.iloc[0][k]}" if v in ("largest", "smallest") else str(v)
                for k, v in term.items() if k != "weight") for term, p in zip(terms, picked, strict=True))
        findings.append(Finding(claim, verdict(result["ci_low"], result["ci_high"], region), label,
                                result["value"], result["ci_low"], result["ci_high"],
                                note=f"n={result['num_prompts']} prompts"))
    if not findings:
        raise NotRun(f"no cell of metrics/{m['experiment']}.csv holds every drafter of the contrast")
    return findings


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


def measure_correlation_gap(claim: dict, results: Path) -> list[Finding]:
    """rho(S~, tau_b) - rho(sum q, tau_b) over the blocks of Table 1's shallowest DFlash drafter on MATH-500
    at T=0; the interval resamples prompts (a prompt's blocks stay together)."""
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
    prompts = rows["prompt_index"].to_numpy()
    columns = rows[["surrogate", "sum_q", "tau_block"]].to_numpy(float)
    by_prompt = [np.flatnonzero(prompts == p) for p in np.unique(prompts)]

    def gap(indices: np.ndarray) -> float:
        picked = columns[np.concatenate([by_prompt[i] for i in indices])]
        with np.errstate(invalid="ignore", divide="ignore"):  # a resample of constant blocks: NaN
            rho = stats.spearmanr(picked).statistic  # 3 x 3: surrogate, sum_q, tau
        return float(rho[0, 2] - rho[1, 2])

    prompt_ids = np.arange(len(by_prompt))
    value, low, high = _bootstrap([prompt_ids], gap)
    return [Finding(claim, verdict(low, high, Region.of(claim["verdict"])), f"{variant} MATH-500 T0",
                    value, low, high, note=f"{len(rows)} blocks, {len(by_prompt)} prompts")]


def _train_steps(results: Path) -> pd.DataFrame:
    return read_csv(results, "main_train_steps.csv")


def measure_step_time(claim: dict, results: Path) -> list[Finding]:
    """D-PACE's mean time per optimizer step over DFlash's, minus 1 (each run's steps resampled)."""
    steps = _train_steps(results)
    times = []
    for objective in ("dpace", "dflash"):
        variant = _main_variant(results, objective)
        times.append(steps.loc[steps["variant"] == variant, "step_time_s"].dropna().to_numpy(float))
        if not len(times[-1]):
            raise NotRun(f"no step times of {variant} in metrics/main_train_steps.csv")
    value, low, high = _bootstrap(times, lambda dpace, dflash: float(dpace.mean() / dflash.mean() - 1.0))
    return [Finding(claim, verdict(low, high, Region.of(claim["verdict"])), "Table 1's shallowest pair",
                    value, low, high, note=f"{len(times[0])} / {len(times[1])} steps")]


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
    early, late = centre[:count], centre[-count:]
    value, low, high = _bootstrap([late, early], lambda late, early: float(late.mean() - early.mean()))
    return [Finding(claim, verdict(low, high, Region.of(claim["verdict"])), variant, value, low, high,
                    note=f"first and last {count} of {len(centre)} steps")]


MEASURES: dict[str, Callable[[dict, Path], list[Finding]]] = {
    "comparison": measure_comparison,
    "contrast": measure_contrast,
    "correlation_gap": measure_correlation_gap,
    "step_time": measure_step_time,
    "weight_shift": measure_weight_shift,
}


def findings(claims: Sequence[dict], results: str | Path) -> list[Finding]:
    """Every claim measured: one finding per cell it covers, or one *not run* finding naming what is missing."""
    out = []
    for claim in claims:
        try:
            out += MEASURES[claim["measure"]["kind"]](claim, Path(results))
        except NotRun as missing:
            out.append(Finding(claim, NOT_RUN, note=str(missing)))
    return out


def _number(x: float, relative: bool) -> str:
    if not np.isfinite(x):
        return "--"
    return f"{100 * x:+.1f}%" if relative else f"{x:+.3f}"


def measured_text(finding: Finding) -> str:
    if finding.verdict == NOT_RUN:
        return "--"
    relative = finding.claim["verdict"].get("scale") == "relative"
    interval = f"[{_number(finding.low, relative)}, {_number(finding.high, relative)}]" if np.isfinite(finding.low) \
        else "(no interval)"
    return f"{_number(finding.value, relative)} {interval}"


def scorecard(found: Sequence[Finding], *, config_name: str, commit: str) -> str:
    """The scorecard as Markdown: a count of verdicts, then one row per finding."""
    counts = {v: sum(f.verdict == v for f in found) for v in VERDICTS}
    lines = [
        "# Findings: the paper's claims against this run",
        "",
        f"Run: config `{config_name}`, commit `{commit}`. Claims: `workflow/claims.yaml`; verdicts from the 95%",
        "interval alone (reproduced: inside the claimed region; contradicted: outside it; inconclusive: across",
        "an edge or no interval; not run: the artifacts were not built).",
        "",
        " | ".join(f"**{counts[v]}** {v}" for v in VERDICTS),
        "",
        "| claim | paper | source | paper's number | cell | measured [95% CI] | reproduced if | verdict | run | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    shown = set()
    for f in found:
        c = f.claim
        relative = c["verdict"].get("scale") == "relative"
        # A claim's first cell carries its text; its other cells only its id.
        first = c["id"] not in shown
        shown.add(c["id"])
        cells = [
            f"`{c['id']}`: {c['claim']}" if first else f"`{c['id']}`", c["paper"] if first else "",
            f"`{c['source']}`" if first else "", str(c["paper_value"]) if first else "", f.cell,
            measured_text(f), Region.of(c["verdict"]).text(relative), f"**{f.verdict}**",
            f"{config_name} @ {commit}", f.note,
        ]
        lines.append("| " + " | ".join(str(x).replace("|", "/") for x in cells) + " |")
    return "\n".join(lines) + "\n"


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
    found = findings(read_claims(claims_path), results)
    atomic_write_text(out, scorecard(found, config_name=config_name, commit=commit))
    return found
