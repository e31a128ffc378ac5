"""The paper's claims against what was measured: a scorecard with one verdict per claim.

The claims are data (``workflow/claims.yaml``): each names its source line in the paper's LaTeX, the
paper's numbers in the paper's own cells (``paper_cells``: temperature, block size, depth, epoch), how it is
measured (``measure``), the unit it is judged in and the region of the measured value that reproduces it
(``verdict``). This module reads and checks the claims file (:func:`read_claims`), measures each claim in
every cell of the run (:func:`findings`, by ``dpace.report.claim_measures``) and writes the page
(:func:`write_findings`, by ``dpace.report.scorecard_page``). ``dpace.report.verdicts`` holds the rules:
each run cell is matched to the paper cell nearest its setting, judged by its 95% interval, and a claim's
cells combine into one verdict (:func:`claim_verdict`); cells at a setting the paper never reported (T = 1
for Tables 3-6) are *beyond the paper*: shown, not counted.

Units (``verdict.scale``): ``absolute`` (tau or SR, or their difference), ``relative`` (a fraction of
DFlash's value) and ``accepted`` (a fraction of DFlash's accepted draft length tau - 1, the quantity the
paper's objective targets; ``docs/scorecard.md`` says why tau gains are judged in it). Only comparisons
carry a reference to divide by; step times are ratios already. Claims the pipeline cannot decide are
``not_measurable`` with their reason. Pure Python and pandas; ``workflow/scripts/findings.py`` hands over
the paths.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dpace.claims import NOT_MEASURABLE, ClaimsError, validate_claims
from dpace.io import atomic_write_text
from dpace.report.claim_measures import MEASURES, measure_gradient, read_csv
from dpace.report.metrics_frame import skipped_requests_text
from dpace.report.scorecard_page import headline, scorecard
from dpace.report.verdicts import (
    BEYOND,
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_RUN,
    REPRODUCED,
    VERDICTS,
    Finding,
    NotRun,
    Region,
    claim_verdict,
)

# The scorecard's public names, wherever they live: the workflow's script and the tests import them from here.
__all__ = ["BEYOND", "CONTRADICTED", "INCONCLUSIVE", "NOT_RUN", "REPRODUCED", "VERDICTS", "Finding", "NotRun",
           "Region", "checkout_commit", "claim_verdict", "findings", "gradients", "headline", "not_measurable",
           "read_claims", "real_claims", "scorecard", "write_findings"]


def read_claims(path: str | Path) -> list[dict]:
    """The claims file, checked before anything is measured (``dpace.claims.validate_claims``: the schema
    ``workflow/schemas/claims.schema.yaml``, which refuses unknown keys, the registries' names, unique ids, a
    unit that the claim's measure has); a ``ClaimsError`` (a ``ValueError``) names the claim and the key."""
    claims = validate_claims(path)
    for claim in real_claims(claims):
        if claim["measure"]["kind"] not in MEASURES:  # in the schema's enum, but no code measures it
            raise ClaimsError(f"{path}: claim {claim['id']!r}: measure.kind {claim['measure']['kind']!r} has no "
                              f"measure in dpace.report.claim_measures.MEASURES")
    return claims


def real_claims(claims: Sequence[dict]) -> list[dict]:
    return [c for c in claims if c["measure"]["kind"] != NOT_MEASURABLE]


def not_measurable(claims: Sequence[dict]) -> list[dict]:
    return [c for c in claims if c["measure"]["kind"] == NOT_MEASURABLE]


# The experiment whose artifacts a measure reads when the claim names none: Table 1's drafters.
MAIN_EXPERIMENT = "main"
# The objective every Table 1 gain is taken over.
REFERENCE_OBJECTIVE = "dflash"


def claim_experiment(claim: dict) -> str:
    """The experiment a claim's measure reads (``measure.experiment``, else Table 1's)."""
    return claim["measure"].get("experiment", MAIN_EXPERIMENT)


def findings(claims: Sequence[dict], results: str | Path, experiments: Sequence[str] | None = None) -> list[Finding]:
    """Every measurable claim measured: one finding per cell it covers, or one *not run* finding naming what
    is missing. ``experiments``: the run's configured experiments (None: any); a claim of another experiment is
    *not run* for that reason, and never read from files an earlier run with another config left in ``results``."""
    out = []
    for claim in real_claims(claims):
        if experiments is not None and claim_experiment(claim) not in experiments:
            out.append(Finding(claim, NOT_RUN, note=f"experiment {claim_experiment(claim)!r} is not in this run's "
                                                    f"config (experiments: {', '.join(experiments)})"))
            continue
        try:
            out += MEASURES[claim["measure"]["kind"]](claim, Path(results))
        except NotRun as missing:
            out.append(Finding(claim, NOT_RUN, note=str(missing)))
    return out


def gradients(claims: Sequence[dict], results: str | Path,
              experiments: Sequence[str] | None = None) -> dict[str, list[dict]]:
    return {c["id"]: measure_gradient(c, results) for c in real_claims(claims) if "gradient" in c
            and (experiments is None or c["gradient"]["experiment"] in experiments)}


def skipped_requests(claims: Sequence[dict], results: str | Path, experiments: Sequence[str] | None = None) -> str:
    """The evaluations the claims read that skipped requests past the target's context, as one line
    (``skipped_requests_text``); empty when none did."""
    measured = real_claims(claims)
    read = {MAIN_EXPERIMENT} | {claim_experiment(c) for c in measured} | {
        c["gradient"]["experiment"] for c in measured if "gradient" in c}
    frames = []
    for experiment in sorted(read):
        if experiments is not None and experiment not in experiments:
            continue
        try:
            frames.append(read_csv(Path(results), f"{experiment}.csv"))
        except NotRun:  # the claims reading it are "not run"
            continue
    return skipped_requests_text(pd.concat(frames, ignore_index=True)) if frames else ""


def seed_spread(results: str | Path) -> pd.DataFrame | None:
    """Table 1's average tau gain over DFlash at each training seed, where the run trained several: one row per
    non-reference objective and cell (target, depth, block size, temperature, epoch) with ``gains`` {seed: this
    seed's benchmark-mean tau minus DFlash's at the same seed} and ``seed_share`` (the seeds' share of the
    average comparison's variance). None for a one-seed run or one without Table 1's metrics."""
    try:
        runs = read_csv(Path(results), f"{MAIN_EXPERIMENT}.csv")
    except NotRun:
        return None
    if "suite" in runs:  # the trajectory's per-epoch subsets are not Table 1's cells
        runs = runs[runs["suite"] == "full"]
    if not {"training_seed", "objective", "tau"} <= set(runs) or runs["training_seed"].nunique() < 2:
        return None
    cell_keys = ["target", "depth", "block_size", "temperature", "epoch"]
    mean_tau = runs.groupby([*cell_keys, "objective", "training_seed"])["tau"].mean()  # benchmarks weighted equally
    try:
        comparisons = read_csv(Path(results), f"{MAIN_EXPERIMENT}_comparisons.csv")
        comparisons = comparisons[(comparisons["metric"] == "tau") & (comparisons["benchmark"] == "avg")]
    except NotRun:
        comparisons = pd.DataFrame(columns=[*cell_keys, "objective", "var_prompts", "var_seeds"])
    rows = []
    for cell, taus in mean_tau.groupby(level=cell_keys):
        taus = taus.droplevel(cell_keys)
        if REFERENCE_OBJECTIVE not in taus.index.get_level_values("objective"):
            continue
        reference = taus.loc[REFERENCE_OBJECTIVE]
        for objective in sorted(set(taus.index.get_level_values("objective")) - {REFERENCE_OBJECTIVE}):
            ours = taus.loc[objective]
            gains = {int(seed): float(ours[seed] - reference[seed]) for seed in ours.index if seed in reference.index}
            split = comparisons[(comparisons[cell_keys] == pd.Series(dict(zip(cell_keys, cell, strict=True)))).all(axis=1)
                                & (comparisons["objective"] == objective)]
            total = float(split["var_prompts"].sum() + split["var_seeds"].sum()) if len(split) == 1 else math.nan
            target, depth, block_size, temperature, epoch = cell
            rows.append({"objective": objective, "gains": gains,
                         "cell": f"{target} d{depth} B{block_size} T{temperature:g} epoch {epoch}",
                         "seed_share": float(split["var_seeds"].iloc[0]) / total if total > 0 else math.nan})
    return pd.DataFrame(rows) if rows else None


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


def write_findings(claims_path, results, out, *, config_name: str, commit: str,
                   experiments: Sequence[str] | None = None) -> list[Finding]:
    """The scorecard page of ``results``; ``experiments``: the run's configured experiments (see :func:`findings`)."""
    claims = read_claims(claims_path)
    found = findings(claims, results, experiments)
    spread = seed_spread(results) if experiments is None or MAIN_EXPERIMENT in experiments else None
    page = scorecard(found, config_name=config_name, commit=commit, grads=gradients(claims, results, experiments),
                     unmeasurable=not_measurable(claims), skipped=skipped_requests(claims, results, experiments),
                     spread=spread)
    atomic_write_text(out, page)
    return found
