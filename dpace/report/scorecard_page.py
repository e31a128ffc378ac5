"""The scorecard page: the claim-level count, one row per claim, each measured cell once, the gradients of
scale, the seed spread and the claims not measurable here, as Markdown."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from dpace.report.verdicts import (
    BEYOND,
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_RUN,
    REPRODUCED,
    VERDICTS,
    Finding,
    claim_verdict,
    is_fraction,
    paper_cell_label,
    paper_value,
    region_of,
    unit_text,
)

# Table 1's spread over training seeds (three-seed study of the a2f4e57 run, docs/measurements.md): the page
# cites it when the run trained one seed and so cannot measure its own.
SEED_SPREAD = ("Table 1's seed spread, measured in the three-seed study of the a2f4e57 run "
               "(docs/measurements.md, \"Three training seeds of Table 1\"): D-PACE - DFlash in average tau at T = 0 "
               "was +0.043 / +0.083 / +0.037 at seeds 0 / 1 / 2 (sd of one seed's difference about 0.024; the seeds "
               "carry 80% of its variance), Top-3 - DFlash +0.055 / +0.055 / +0.053, Accept-rate collapsed at every "
               "seed. An interval over prompts of one seed is about +-0.02 wide; over seeds too, about +-0.05.")


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


# --- independent findings ---------------------------------------------------------------------------------

def finding_groups(by_claim: dict[str, list[Finding]]) -> dict[str, list[str]]:
    """The claims grouped into independent findings: claims naming one ``finding`` in the claims file (one
    implied by another, or two readings of one measurement), and claims that read identical records (a cell
    ``digest`` in common: bit-identical drafters, whatever they are called), joined transitively. Each group is
    keyed by its first claim's id; a claim alone is its own group."""
    parent = {claim_id: claim_id for claim_id in by_claim}

    def root(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    def join(a: str, b: str) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            first, second = sorted((ra, rb), key=list(by_claim).index)
            parent[second] = first

    first_of: dict[tuple, str] = {}
    for claim_id, cells in by_claim.items():
        named = cells[0].claim.get("finding")
        marks = ([("finding", named)] if named else []) + [("digest", f.digest) for f in cells if f.digest]
        for mark in marks:
            join(first_of.setdefault(mark, claim_id), claim_id)
    groups: dict[str, list[str]] = {}
    for claim_id in by_claim:
        groups.setdefault(root(claim_id), []).append(claim_id)
    return groups


def group_verdict(words: Sequence[str]) -> str:
    """One independent finding's verdict from its claims': as a claim's from its cells (reproduced only if
    every measured claim is, contradicted if any is; not run if none was measured)."""
    measured = [w for w in words if w not in (NOT_RUN, BEYOND)]
    if not measured:
        return NOT_RUN if NOT_RUN in words else BEYOND
    if CONTRADICTED in measured:
        return CONTRADICTED
    return REPRODUCED if all(w == REPRODUCED for w in measured) else INCONCLUSIVE


# --- the page -----------------------------------------------------------------------------------------------

def _number(x: float, relative: bool) -> str:
    if not np.isfinite(x):
        return "--"
    return f"{100 * x:+.1f}%" if relative else f"{x:+.3f}"


def measured_text(finding: Finding) -> str:
    if finding.verdict == NOT_RUN:
        return "--"
    fraction = is_fraction(finding.claim)
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
    fraction = is_fraction(claim)
    return "; ".join(f"{paper_cell_label(c)}: {_number(paper_value(claim, c), fraction)}"
                     + (f" ({c['source']})" if "source" in c else "") for c in matched)


def _row(cells: Sequence) -> str:
    return "| " + " | ".join(str(x).replace("|", "/").replace("\n", " ") for x in cells) + " |"


def claims_table(by_claim: dict[str, list[Finding]], verdicts: dict[str, str], grads: dict[str, list[dict]]) -> list[str]:
    lines = ["| claim | paper, source | unit | paper's cell: number (in the unit) | run cells (beyond the paper; scaled) "
             "| seeds | scale | verdict |", "|---|---|---|---|---|---|---|---|"]
    for cells in by_claim.values():
        c = cells[0].claim
        measured = [f for f in cells if f.verdict != NOT_RUN]
        beyond = sum(f.paper_cell is None for f in measured)
        scaled = sum(bool(f.paper_cell and "scaled" in f.paper_cell) for f in measured)
        seeds = _seeds_text(cells)
        word = verdicts[c["id"]]
        shown = f"**{word}**" + (" (these drafters, one seed)" if seeds.startswith("these") and word in (
            REPRODUCED, CONTRADICTED) else "")
        if word == NOT_RUN:
            shown += f": {cells[0].note}"
        if c.get("by_construction"):
            shown += f" (by construction, not counted: {c['by_construction']})"
        lines.append(_row([
            f"`{c['id']}`: {c['claim']}", f"{c['paper']}, `{c['source']}`", unit_text(c),
            _paper_cells_text(c, cells), f"{len(measured) - beyond} ({beyond}" + (f"; {scaled} scaled" if scaled else "") + ")", seeds,
            scale_mark(c, grads.get(c["id"], [])), shown]))
    return lines


def findings_list(groups: dict[str, list[str]], by_claim: dict[str, list[Finding]]) -> list[str]:
    """The independent findings of several claims each, and why they are one."""
    shared = {g: members for g, members in groups.items() if len(members) > 1}
    if not shared:
        return []
    lines = ["Independent findings of several claims (counted once in the headline):", ""]
    for members in shared.values():
        named = sorted({by_claim[c][0].claim["finding"] for c in members if by_claim[c][0].claim.get("finding")})
        digests = [c for c in members if any(f.digest for f in by_claim[c])]
        same = {f.digest for f in by_claim[members[0]] if f.digest}
        identical = [c for c in digests if same & {f.digest for f in by_claim[c] if f.digest}]
        why = ([f"`finding: {n}` in the claims file" for n in named]
               + (["identical per-request records (bit-identical drafters): " + ", ".join(f"`{c}`" for c in identical)]
                  if len(identical) > 1 else []))
        lines.append(f"- {', '.join(f'`{c}`' for c in members)}: {'; '.join(why)}")
    return [*lines, ""]


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
            f"`{f.claim['id']}` {measured_text(f)}, {region_of(f).text(is_fraction(f.claim)) if f.paper_cell is not None else '--'}, "
            f"**{f.verdict}**" + (f" ({f.scope})" if f.scope else "") for f in cells)
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
            f"`{claim_id}`", g["cell"] + (f" ({g['num_seeds']} training seeds)" if g.get("num_seeds", 1) > 1 else " (one seed)"),
            f"{g['over']}: {', '.join(g['strata_names'])}",
            ", ".join(f"{x:.2f}" for x in g["reference_tau"]), ", ".join(f"{x:+.3f}" for x in g["gain"]),
            f"{g['slope']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}] ({g['stratifier']})",
            f"{g['naive_slope']:+.3f} [{g['naive_low']:+.3f}, {g['naive_high']:+.3f}]"]))
    return lines


def seed_spread_lines(spread: pd.DataFrame | None) -> list[str]:
    """The Seeds section: this run's own per-seed gains (``dpace.report.findings.seed_spread``) where it
    trained several seeds, else the spread the three-seed study measured."""
    if spread is None or spread.empty:
        return [SEED_SPREAD]
    seeds = sorted({seed for gains in spread["gains"] for seed in gains})
    lines = [
        "Table 1's average tau gain over DFlash at each training seed of this run (each seed's drafter against "
        "DFlash's drafter of the same seed; benchmarks weighted equally, as the paper's Avg column), and the share "
        "of the comparison's variance that drawing other seeds adds (`var_seeds` over `var_seeds + var_prompts` "
        "in `metrics/main_comparisons.csv`). The intervals above resample seeds and prompts (docs/scorecard.md).",
        "",
        "| drafter - DFlash (tau) | cell | " + " | ".join(f"seed {s}" for s in seeds)
        + " | mean | sd over seeds | seeds' share of the variance |",
        "|---|---|" + "---|" * (len(seeds) + 3),
    ]
    for row in spread.itertuples():
        share = "--" if math.isnan(row.seed_share) else f"{row.seed_share:.0%}"
        lines.append(f"| {row.objective} | {row.cell} | "
                     + " | ".join(f"{row.gains[s]:+.3f}" if s in row.gains else "--" for s in seeds)
                     + f" | {np.mean(list(row.gains.values())):+.3f} | {np.std(list(row.gains.values()), ddof=1):.3f}"
                     + f" | {share} |")
    return lines


def scorecard(found: Sequence[Finding], *, config_name: str, commit: str, grads: dict | None = None,
              unmeasurable: Sequence[dict] = (), skipped: str = "", spread: pd.DataFrame | None = None) -> str:
    """The scorecard as Markdown: the claim-level count, one row per claim, then each measured cell once.
    ``skipped``: the evaluations that skipped requests past the target's context, warned of under the count;
    ``spread``: Table 1's per-seed gains of a several-seed run (``dpace.report.findings.seed_spread``)."""
    grads = grads or {}
    by_claim: dict[str, list[Finding]] = {}
    for f in found:
        by_claim.setdefault(f.claim["id"], []).append(f)
    verdicts = {claim_id: claim_verdict(cells) for claim_id, cells in by_claim.items()}
    # A claim that holds by construction is measured and shown, never counted (nor its finding).
    constructed = [c for c, cells in by_claim.items() if cells[0].claim.get("by_construction")]
    counted = {c: cells for c, cells in by_claim.items() if c not in constructed}
    counts = {v: sum(verdicts[c] == v for c in counted) for v in VERDICTS}
    groups = finding_groups(counted)
    group_verdicts = {g: group_verdict([verdicts[c] for c in members]) for g, members in groups.items()}
    group_counts = {v: sum(x == v for x in group_verdicts.values()) for v in VERDICTS}
    counted_groups = sum(group_counts.values())
    beyond_claims = sum(verdicts[c] == BEYOND for c in counted)
    measured = [f for f in found if f.verdict != NOT_RUN]
    beyond_cells = sum(f.paper_cell is None for f in measured)
    scaled_cells = sum(bool(f.paper_cell and "scaled" in f.paper_cell) for f in measured)
    lines = [
        "# Findings: the paper's claims against this run",
        "",
        f"Run: config `{config_name}`, commit `{commit}`. Claims: `workflow/claims.yaml`.",
        "",
        f"**{sum(counts.values())} claims:** " + " | ".join(f"**{counts[v]}** {v}" for v in VERDICTS)
        + (f" ({beyond_claims} more measured only beyond the paper, not counted)" if beyond_claims else "")
        + (f" ({len(constructed)} more hold by construction: shown, not counted)" if constructed else "")
        + f". **{counted_groups} independent findings:** " + " | ".join(f"**{group_counts[v]}** {v}" for v in VERDICTS)
        + " (claims implied by another or reading the same measurement counted once)"
        + f". {len(unmeasurable)} more claims are not measurable here.",
        "",
        f"Cells: {len(measured) - beyond_cells} measured in settings the paper reported, {beyond_cells} beyond the "
        "paper (shown, not counted)" + (f"; {scaled_cells} judged against a paper number of another block size, "
                                        "scaled by the paper's own ratio between the two (Table 4)" if scaled_cells else "")
        + ".",
        "",
        *([f"**Warning:** {skipped}", ""] if skipped else []),
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
        *findings_list(groups, by_claim),
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
        *seed_spread_lines(spread),
        "",
        "## Not measurable here",
        "",
        *[f"- `{c['id']}` ({c['paper']}, `{c['source']}`): {c['claim']} -- {c['reason']}" for c in unmeasurable],
    ]
    return "\n".join(lines) + "\n"


def claim_verdicts(markdown: str) -> dict[str, str]:
    """Each claim's verdict word on a scorecard page (its Claims table), by claim id: what a second
    measurement of the same run is compared with (``benchmarks/compare_findings.py``)."""
    section = markdown.split("\n## Claims\n", 1)[1].split("\n## ", 1)[0]
    verdicts = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        claim_id = line.split("`")[1]
        last_cell = line.rstrip(" |").rsplit(" | ", 1)[1]
        word = last_cell.split("**")[1]
        if word not in (*VERDICTS, BEYOND):
            raise ValueError(f"claim {claim_id}: {word!r} is not a verdict")
        verdicts[claim_id] = word + (" (by construction)" if "(by construction" in last_cell else "")
    return verdicts


def stability_table(first: str, second: str) -> list[str]:
    """claim | verdict, first page | verdict, second page, for every claim on either page: the rows that
    differ first, then the count of the same."""
    a, b = claim_verdicts(first), claim_verdicts(second)
    ids = list(a) + [c for c in b if c not in a]
    differ = [c for c in ids if a.get(c) != b.get(c)]
    lines = ["| claim | first | second |", "|---|---|---|"]
    lines += [f"| `{c}` | {a.get(c, '(absent)')} | {b.get(c, '(absent)')} |" for c in differ]
    lines += [f"| {len(ids) - len(differ)} other claims | same | same |"]
    return lines


def headline(markdown: str) -> str:
    """The claim-level count line of a scorecard page (the report's front page shows it)."""
    return next(line for line in markdown.splitlines() if line.startswith("**") and " claims:**" in line)

