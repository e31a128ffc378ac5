"""The scorecard (dpace.report.findings): verdicts from intervals, claims data, "not run" for missing artifacts."""

from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from dpace.report import claim_measures, findings, scorecard_page, verdicts
from dpace.report.findings import CONTRADICTED, INCONCLUSIVE, NOT_RUN, REPRODUCED, Finding, Region
from dpace.report.intervals import (
    COMPARISON_COLUMNS,
    hierarchical_bootstrap,
    paired_bootstrap,
    paired_contrast,
)

REPO = Path(__file__).resolve().parents[1]
CLAIMS = REPO / "workflow" / "claims.yaml"
PAPER = REPO.parent / "shared" / "paper"

ABOVE_DFLASH = {
    "id": "dpace-above-dflash", "claim": "D-PACE above DFlash", "paper": "Table 1", "source": "paper.tex:1",
    "paper_value": "+0.42", "measure": {"kind": "comparison", "experiment": "main", "objective": "dpace"},
    "verdict": {"above": 0},
}


def comparison_row(depth: int, difference: float, low: float, high: float, **extra) -> dict:
    row = dict.fromkeys(COMPARISON_COLUMNS, math.nan)
    row.update({
        "target": "t", "experiment": "main", "epoch": 6, "suite": "full", "temperature": 0.0, "depth": depth,
        "block_size": 16, "variant": f"dpace-d{depth}", "objective": "dpace", "reference_variant": f"dflash-d{depth}",
        "metric": "tau", "benchmark": "avg", "value": 4.0 + difference, "reference_value": 4.0,
        "difference": difference, "relative_difference": difference / 4.0, "ci_low": low, "ci_high": high,
        "significant": low > 0 or high < 0, "num_prompts": 40, "resamples": 2000,
    })
    row.update(extra)
    return row


def write_comparisons(results: Path, rows: list[dict], experiment: str = "main") -> None:
    (results / "metrics").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=COMPARISON_COLUMNS).to_csv(results / "metrics" / f"{experiment}_comparisons.csv",
                                                          index=False)


def check_three_verdicts(results: Path) -> None:
    """Three Table 1 cells: the claim holds (interval above 0), fails (below 0), cannot tell (across 0).
    Each cell's point estimate is positive, so a rule that reads the point alone gets two of them wrong."""
    write_comparisons(results, [
        comparison_row(1, 0.20, 0.10, 0.30),    # holds
        comparison_row(2, -0.20, -0.30, -0.10),  # fails
        comparison_row(3, 0.05, -0.10, 0.20),   # the interval cannot tell
    ])
    found = findings.findings([ABOVE_DFLASH], results)
    assert [(f.cell, f.verdict) for f in found] == [
        ("t d1 B16 T0 epoch 6", REPRODUCED), ("t d2 B16 T0 epoch 6", CONTRADICTED),
        ("t d3 B16 T0 epoch 6", INCONCLUSIVE)]
    assert [(f.value, f.low, f.high) for f in found][0] == (0.20, 0.10, 0.30)


def test_a_claim_that_holds_fails_or_cannot_tell_gets_its_verdict(tmp_path):
    check_three_verdicts(tmp_path)


def ignores_the_interval(low, high, region):
    middle = (low + high) / 2
    return REPRODUCED if region.low <= middle <= region.high else CONTRADICTED


def needs_only_one_end_inside(low, high, region):
    inside = region.low <= low <= region.high or region.low <= high <= region.high
    return REPRODUCED if inside else CONTRADICTED


def needs_only_the_low_end(low, high, region):  # reads "the interval excludes 0" as "reproduced" either way
    return REPRODUCED if low > region.low or high < region.low else INCONCLUSIVE


@pytest.mark.parametrize("broken_rule", [ignores_the_interval, needs_only_one_end_inside, needs_only_the_low_end])
def test_a_broken_verdict_rule_fails_the_three_verdicts(tmp_path, monkeypatch, broken_rule):
    monkeypatch.setattr(verdicts, "verdict", broken_rule)
    with pytest.raises(AssertionError):
        check_three_verdicts(tmp_path)


def test_the_verdict_rule_on_bands_and_open_ends():
    band = Region.of({"between": [0.05, 0.15]})
    assert verdicts.verdict(0.06, 0.14, band) == REPRODUCED
    assert verdicts.verdict(0.16, 0.30, band) == CONTRADICTED
    assert verdicts.verdict(-0.2, 0.0, band) == CONTRADICTED
    assert verdicts.verdict(0.10, 0.20, band) == INCONCLUSIVE
    assert verdicts.verdict(-1.0, 1.0, band) == INCONCLUSIVE  # wider than the band: cannot tell
    assert verdicts.verdict(math.nan, math.nan, Region.of({"above": 0})) == INCONCLUSIVE  # no interval
    assert verdicts.verdict(-0.3, -0.1, Region.of({"below": 0})) == REPRODUCED


def test_above_and_below_are_strict_and_a_band_is_closed():
    """"above 0" is not reproduced by an interval that reaches 0: a smallest rise of binned tau of exactly 0 at
    every resample (Figure 1a's two lowest bins all at tau 1, in the a294b83 Table 1 run) was scored a rise. A band
    keeps its ends: an Accept-rate tau of exactly 1.0 is inside "collapses to [1, 1.1]"."""
    above, below = Region.of({"above": 0}), Region.of({"below": 0})
    assert verdicts.verdict(0.0, 0.0, above) == CONTRADICTED
    assert verdicts.verdict(0.0, 0.2, above) == INCONCLUSIVE
    assert verdicts.verdict(1e-9, 0.2, above) == REPRODUCED
    assert verdicts.verdict(0.0, 0.0, below) == CONTRADICTED
    assert verdicts.verdict(-0.2, 0.0, below) == INCONCLUSIVE
    assert verdicts.verdict(1.0, 1.0, Region.of({"between": [1.0, 1.1]})) == REPRODUCED
    assert verdicts.verdict(1.1, 1.1, Region.of({"between": [1.0, 1.1]})) == REPRODUCED
    # the claim follows its cell: a lone cell at exactly 0 contradicts "above 0" after Holm too
    assert verdicts.claim_verdict([cell(0.0, 0.0, 0.0, CONTRADICTED)]) == CONTRADICTED
    assert verdicts.claim_verdict([cell(0.0, 0.0, 0.0, CONTRADICTED), *ALL_HOLD]) == CONTRADICTED


def test_relative_claims_divide_the_interval_by_the_reference(tmp_path):
    claim = {**ABOVE_DFLASH, "verdict": {"between": [0.05, 0.15], "scale": "relative"}}
    write_comparisons(tmp_path, [comparison_row(1, 0.4, 0.24, 0.56), comparison_row(2, 0.4, 0.1, 0.7)])
    found = findings.findings([claim], tmp_path)
    assert [f.verdict for f in found] == [REPRODUCED, INCONCLUSIVE]  # [6%, 14%] inside; [2.5%, 17.5%] across
    assert found[0].value == pytest.approx(0.10) and found[0].low == pytest.approx(0.06)
    assert "+10.0% [+6.0%, +14.0%]" in findings.scorecard(found, config_name="c.yaml", commit="abc")


def test_a_claim_without_its_artifacts_is_not_run_and_still_listed(tmp_path):
    claims = findings.read_claims(CLAIMS)
    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3)])  # Table 1's comparisons only
    found = findings.findings(claims, tmp_path)
    # Every measurable claim appears, once or per cell; those whose metrics were never built say so.
    assert {f.claim["id"] for f in found} == {c["id"] for c in findings.real_claims(claims)}
    by_id = {f.claim["id"]: f for f in found}
    assert by_id["t1-dpace-above-dflash"].verdict == REPRODUCED
    assert by_id["t3-cumulative-only-10-12pct"].verdict == NOT_RUN
    assert "metrics/ablation_comparisons.csv not built" in by_id["t3-cumulative-only-10-12pct"].note
    assert by_id["t8-surrogate-rho-above-sum-q"].verdict == NOT_RUN  # no main.csv, no blocks
    assert by_id["t7-step-overhead-small"].verdict == NOT_RUN
    page = findings.scorecard(found, config_name="config.yaml", commit="abc1234",
                              unmeasurable=findings.not_measurable(claims))
    not_run = {f.claim["id"] for f in found if f.verdict == NOT_RUN}
    assert page.count("**not run**") == len(not_run) > 0  # once per claim, not per cell
    counted = {c for c in not_run if not by_id[c].claim.get("by_construction")}  # shown, never counted
    assert f"**{len(counted)}** not run" in findings.headline(page)
    assert "config.yaml @ abc1234" in page or "`config.yaml`, commit `abc1234`" in page
    for claim in findings.not_measurable(claims):  # each listed with its reason
        assert f"`{claim['id']}`" in page and claim["reason"] in page


def test_a_built_file_without_the_claims_rows_is_not_run(tmp_path):
    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3, objective="dpakl")])
    [found] = findings.findings([ABOVE_DFLASH], tmp_path)
    assert found.verdict == NOT_RUN and found.note == "no dpace drafter in metrics/main_comparisons.csv (it holds dpakl)"


def test_the_claims_file_is_complete_and_quotes_the_paper():
    claims = findings.read_claims(CLAIMS)
    covered = {c["paper"] for c in findings.real_claims(claims)}
    assert covered >= {f"Table {n}" for n in range(1, 9)} | {"Figure 3a", "Figure 3c"}
    # The claims the issue named as missing from the a2f4e57 scorecard (issue 49).
    assert {"t1-dpace-above-top3", "t6-target-prob-above-dflash", "t1-dpace-above-dflash-every-benchmark",
            "t1-dpace-speedup-every-benchmark", "t3-cumulative-above-continuation", "t5-alpha-09-below-05",
            "t8-surrogate-strongly-correlated"} <= {c["id"] for c in claims}
    for claim in claims:
        file, line = claim["source"].rsplit(":", 1)
        assert file == "d-pace-arxiv-2605.18810.tex" and int(line) > 0
    if not PAPER.exists():
        pytest.skip("the paper's LaTeX is not next to the checkout")
    lines = (PAPER / "d-pace-arxiv-2605.18810.tex").read_text().splitlines()
    for claim in claims:
        assert claim["quote"] in lines[int(claim["source"].rsplit(":", 1)[1]) - 1], claim["id"]


def test_a_claims_file_with_a_missing_key_is_refused(tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text(json.dumps([{k: v for k, v in ABOVE_DFLASH.items() if k != "source"}]))
    with pytest.raises(ValueError, match="lacks \\['source'\\]"):
        findings.read_claims(path)


def requests(taus: list[float]) -> list[dict]:
    return [{"id": str(i), "tau": tau, "ar_tpot_s": 1.0, "spec_tpot_s": 1.0 / tau} for i, tau in enumerate(taus)]


def test_paired_contrast_is_the_paired_bootstrap_for_two_drafters():
    generator = np.random.default_rng(1)
    ours = {b: requests(list(1.5 + generator.random(6))) for b in ("gsm8k", "math500")}
    theirs = {b: requests(list(1.2 + generator.random(6))) for b in ("gsm8k", "math500")}
    for metric in ("tau", "speedup"):
        expected = next(r for r in paired_bootstrap(ours, theirs) if r["benchmark"] == "avg" and r["metric"] == metric)
        result = paired_contrast([ours, theirs], [1, -1], metric=metric)
        assert result["value"] == pytest.approx(expected["difference"])
        assert (result["ci_low"], result["ci_high"]) == pytest.approx((expected["ci_low"], expected["ci_high"]))


def write_evaluation(results: Path, variant: str, objective: str, taus: list[float], block_size: int = 16) -> dict:
    folder = results / "eval" / "t" / variant / "epoch-6" / "full"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps([{"benchmark": "math500", "temperature": 0.0,
                                                     "requests": requests(taus)}]))
    return {"target": "t", "variant": variant, "experiment": "ablation", "objective": objective, "depth": 1,
            "block_size": block_size, "alpha": 0.5, "epoch": 6, "suite": "full", "benchmark": "math500",
            "temperature": 0.0, "tau": float(np.mean(taus)), "speedup": 1.0}


def test_a_contrast_of_two_drafters_from_their_requests(tmp_path):
    claim = {**ABOVE_DFLASH, "measure": {"kind": "contrast", "experiment": "ablation", "benchmark": "math500",
                                         "terms": [{"objective": "dpace", "weight": 1},
                                                   {"objective": "dpace-cumulative", "weight": -1}]}}
    taus = list(np.linspace(1.5, 2.5, 12))
    rows = [write_evaluation(tmp_path, "a", "dpace", [t + 0.2 for t in taus]),
            write_evaluation(tmp_path, "b", "dpace-cumulative", taus)]
    (tmp_path / "metrics").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "metrics" / "ablation.csv", index=False)
    [found] = findings.findings([claim], tmp_path)
    assert found.verdict == REPRODUCED and found.value == pytest.approx(0.2)
    # Reversed, the same claim is contradicted; without the evaluations it is not run.
    claim["measure"]["terms"] = [{"objective": "dpace-cumulative", "weight": 1}, {"objective": "dpace", "weight": -1}]
    assert findings.findings([claim], tmp_path)[0].verdict == CONTRADICTED
    (tmp_path / "eval" / "t" / "a" / "epoch-6" / "full" / "summary.json").unlink()
    assert findings.findings([claim], tmp_path)[0].verdict == NOT_RUN


def write_training(results: Path, dpace_weights: np.ndarray, step_times: tuple[float, float]) -> None:
    (results / "metrics").mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"target": "tiny", "variant": v, "objective": o, "depth": 1, "block_size": 4} for v, o in
                  (("dflash-x", "dflash"), ("dpace-x", "dpace"))]).to_csv(results / "metrics" / "main.csv")
    generator = np.random.default_rng(0)
    rows = []
    for variant, mean_time in zip(("dpace-x", "dflash-x"), step_times, strict=True):
        for step, w in enumerate(dpace_weights):
            rows.append({"variant": variant, "step": step, "step_time_s": mean_time + 0.01 * generator.random(),
                         **{f"w_{j}": x for j, x in enumerate(w)}})
    pd.DataFrame(rows).to_csv(results / "metrics" / "main_train_steps.csv", index=False)


@pytest.mark.parametrize("later", [True, False])
def test_weight_moving_to_later_positions(tmp_path, later):
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    progress = np.linspace(0, 1, 40)[:, None]
    shape = np.array([[1.0, 0.6, 0.3, 0.1]])
    weights = shape + (progress if later else 1 - progress) * np.array([[0.0, 0.2, 0.5, 0.8]])
    write_training(tmp_path, weights + 0.01 * np.random.default_rng(2).random(weights.shape), (0.30, 0.30))
    [found] = findings.findings([claims["f3-weight-moves-later"]], tmp_path)
    assert found.verdict == (REPRODUCED if later else CONTRADICTED)


def test_the_weight_shift_of_a_several_seed_run_reads_every_seed(tmp_path):
    """Figure 3's weights once came from one seed: here seed 0's move later and seed 1's as far earlier."""
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    progress = np.linspace(0, 1, 40)[:, None]
    moves = np.array([[0.0, 0.2, 0.5, 0.8]])
    noise = np.random.default_rng(2)
    (tmp_path / "metrics").mkdir()
    pd.DataFrame([{"variant": v, "method": m, "training_seed": seed, "objective": m[:-2], "depth": 1, "block_size": 4}
                  for v, m, seed in (("dpace-x", "dpace-x", 0), ("dpace-x-s1", "dpace-x", 1),
                                     ("dflash-x", "dflash-x", 0))]).to_csv(tmp_path / "metrics" / "main.csv")
    rows = []
    for variant, trend in (("dpace-x", progress), ("dpace-x-s1", 1 - progress)):
        weights = np.array([[1.0, 0.6, 0.3, 0.1]]) + trend * moves + 0.01 * noise.random((40, 4))
        rows += [{"variant": variant, "step": step, **{f"w_{j}": x for j, x in enumerate(w)}}
                 for step, w in enumerate(weights)]
    pd.DataFrame(rows).to_csv(tmp_path / "metrics" / "main_train_steps.csv", index=False)
    [found] = findings.findings([claims["f3-weight-moves-later"]], tmp_path)
    assert abs(found.value) < 0.05 and found.seeds == 2 and "2 training seeds" in found.note
    assert found.low < -0.2 and found.high > 0.2 and found.verdict == INCONCLUSIVE


def test_the_surrogate_predicts_block_tau_better_than_the_sum_of_q(tmp_path):
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    write_training(tmp_path, np.ones((4, 4)), (0.3, 0.3))
    generator = np.random.default_rng(3)
    surrogate = generator.random(200) * 3
    blocks = pd.DataFrame({"variant": "dflash-x", "benchmark": "math500", "temperature": 0.0, "epoch": 2,
                           "prompt_index": np.repeat(np.arange(20), 10), "surrogate": surrogate,
                           "tau_block": surrogate + 0.1 * generator.random(200),
                           "sum_q": surrogate + 2.0 * generator.random(200)})
    blocks.to_csv(tmp_path / "metrics" / "main_blocks.csv", index=False)
    [found] = findings.findings([claims["t8-surrogate-rho-above-sum-q"]], tmp_path)
    assert found.verdict == REPRODUCED and found.value > 0
    blocks.rename(columns={"surrogate": "sum_q", "sum_q": "surrogate"}).to_csv(
        tmp_path / "metrics" / "main_blocks.csv", index=False)
    assert findings.findings([claims["t8-surrogate-rho-above-sum-q"]], tmp_path)[0].verdict == CONTRADICTED


def recipe_claim() -> dict:
    """The claim that docs/objectives.md's "Adding a claim to the scorecard" appends, read from that page."""
    page = (REPO / "docs" / "objectives.md").read_text()
    section = page.split("## Adding a claim to the scorecard", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    [claim] = yaml.safe_load(textwrap.dedent(block))
    return claim


def test_the_recipe_for_adding_a_claim_works_as_written(tmp_path):
    claim = recipe_claim()
    # Followed as written: the entry is the one in the claims file, it passes the file's checks, and its quote
    # stands on its source line of the paper.
    assert claim in findings.read_claims(CLAIMS)
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump([claim]))
    assert findings.read_claims(path) == [claim]
    if PAPER.exists():
        line = int(claim["source"].rsplit(":", 1)[1])
        assert claim["quote"] in (PAPER / "d-pace-arxiv-2605.18810.tex").read_text().splitlines()[line - 1]

    results = tmp_path / "results"
    [not_run] = findings.findings([claim], results)
    assert not_run.verdict == NOT_RUN and "ablation_comparisons.csv" in not_run.note

    def ablation_epochs(relative_gains: list[tuple[float, float, float]]) -> list[Finding]:
        # MATH-500 rows of D-PACE against DFlash (tau 5.0, accepted length 4.0) at each epoch (gain in accepted
        # length, interval), plus rows the
        # claim must not read: the average, and another objective.
        rows = [comparison_row(2, 4.0 * gain, 4.0 * low, 4.0 * high, experiment="ablation", benchmark="math500",
                               epoch=epoch, reference_value=5.0) for epoch, (gain, low, high)
                in enumerate(relative_gains, start=1)]
        rows.append(comparison_row(2, -1.0, -1.2, -0.8, experiment="ablation", benchmark="avg", reference_value=5.0))
        rows.append(comparison_row(2, -1.0, -1.2, -0.8, experiment="ablation", benchmark="math500",
                                   objective="dpace-cumulative", reference_value=5.0))
        write_comparisons(results, rows, experiment="ablation")
        return findings.findings([claim], results)

    holds = ablation_epochs([(0.12, 0.10, 0.14), (0.11, 0.095, 0.13), (0.13, 0.11, 0.145)])
    assert [(f.cell, f.verdict) for f in holds] == [
        (f"t d2 B16 T0 epoch {epoch}", REPRODUCED) for epoch in (1, 2, 3)]
    assert holds[0].value == pytest.approx(0.12)
    broken = ablation_epochs([(0.12, 0.10, 0.14), (0.04, 0.02, 0.06), (0.12, 0.05, 0.20)])
    assert [f.verdict for f in broken] == [REPRODUCED, CONTRADICTED, INCONCLUSIVE]
    page = findings.scorecard(broken, config_name="config.yaml", commit="abc1234")
    assert f"`{claim['id']}`: {claim['claim']}" in page and "**1** contradicted" in page


# --- issue 49: units, one verdict per claim, scope, seeds, scale, latent defects ---------------------------

def test_tau_gains_convert_to_accepted_draft_length():
    # The paper's Table 4: +0.42 over DFlash's 4.10 at B=16 is +10.2% in tau and +13.5% in tau - 1; +0.20 over
    # 3.88 at B=8 is +5.2% and +6.9%. The a2f4e57 run's +0.042 over 1.392: +3.0% in tau, +10.7% in tau - 1.
    assert verdicts.in_unit(0.42, 4.10, "relative") == pytest.approx(0.1024, abs=1e-4)
    assert verdicts.in_unit(0.42, 4.10, "accepted") == pytest.approx(0.1355, abs=1e-4)
    assert verdicts.in_unit(0.20, 3.88, "accepted") == pytest.approx(0.0694, abs=1e-4)
    assert verdicts.in_unit(0.042, 1.392, "accepted") == pytest.approx(0.1071, abs=1e-4)
    assert verdicts.in_unit(0.042, 1.392, "absolute") == 0.042
    with pytest.raises(ValueError, match="unknown scale"):
        verdicts.in_unit(0.1, 2.0, "percent")
    # The paper's number in a cell goes through the same conversion as the run's measurement.
    claim = {**ABOVE_DFLASH, "verdict": {"paper_factor": 2, "scale": "accepted"}}
    assert verdicts.paper_value(claim, {"tau": 4.08, "dflash": 3.88}) == pytest.approx(0.20 / 2.88)


def test_an_accepted_length_claim_is_judged_in_tau_minus_one(tmp_path):
    """DFlash at tau 1.3: a +0.03 gain is +2.3% of tau but +10% of tau - 1. Against the paper's B=8 cell (+0.20
    over 3.88: +6.9% of tau - 1, region [3.5%, 13.9%]; +5.2% of tau, region [2.6%, 10.3%]) it reproduces in
    tau - 1 and is contradicted in tau: the unit, not the drafters, decides."""
    claim = {**ABOVE_DFLASH, "verdict": {"paper_factor": 2, "scale": "accepted"},
             "paper_cells": [{"depth": 3, "block_size": 8, "temperature": 0, "tau": 4.08, "dflash": 3.88}]}
    write_comparisons(tmp_path, [comparison_row(2, 0.03, 0.027, 0.033, block_size=8, reference_value=1.3,
                                                value=1.33)])
    [found] = findings.findings([claim], tmp_path)
    assert found.value == pytest.approx(0.10) and (found.low, found.high) == pytest.approx((0.09, 0.11))
    assert found.verdict == REPRODUCED and found.paper_cell["block_size"] == 8
    as_tau = {**claim, "verdict": {"paper_factor": 2, "scale": "relative"}}
    assert findings.findings([as_tau], tmp_path)[0].verdict == CONTRADICTED


def test_each_run_cell_meets_the_paper_cell_nearest_its_setting():
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    gain = claims["t1-dpace-tau-gain-about-10pct"]
    at = verdicts.match_paper_cell
    assert at(gain, {"temperature": 0.0, "block_size": 8, "depth": 2}) == {
        "depth": 3, "block_size": 8, "temperature": 0, "tau": 4.08, "dflash": 3.88, "source": "tex:375"}
    # T=1 has only B=16 cells: the nearest block size at the same temperature, and the shallower depth.
    assert at(gain, {"temperature": 1.0, "block_size": 8, "depth": 2})["source"] == "tex:295"
    assert at(gain, {"temperature": 0.0, "block_size": 16, "depth": 6})["source"] == "tex:287"
    epochs = claims["t3-cumulative-only-10-12pct"]
    assert at(epochs, {"temperature": 0.0, "epoch": 4, "block_size": 8})["tau"] == 5.83
    assert at(epochs, {"temperature": 0.0, "epoch": 12}) is None  # the paper trained 9 epochs
    assert at(epochs, {"temperature": 1.0, "epoch": 6}) is None  # Table 3 is T=0 only


def cell(value: float, low: float, high: float, verdict: str, paper: dict | None = None) -> Finding:
    return Finding(ABOVE_DFLASH, verdict, "c", value, low, high, paper_cell={} if paper is None else paper)


ALL_HOLD = [cell(0.2, 0.1, 0.3, REPRODUCED), cell(0.1, 0.05, 0.15, REPRODUCED), cell(0.3, 0.2, 0.4, REPRODUCED)]
ONE_FAILS = [cell(0.2, 0.1, 0.3, REPRODUCED), cell(-0.3, -0.4, -0.2, CONTRADICTED), cell(0.3, 0.2, 0.4, REPRODUCED)]
MIXED = [cell(0.2, 0.1, 0.3, REPRODUCED), cell(0.05, -0.05, 0.15, INCONCLUSIVE), cell(0.3, 0.2, 0.4, REPRODUCED)]
# One cell barely outside at 95% among four: 95% alone says contradicted, Holm over 4 cells does not.
BARELY = [cell(0.2, 0.1, 0.3, REPRODUCED), cell(-0.011, -0.021, -0.001, CONTRADICTED),
          cell(0.3, 0.2, 0.4, REPRODUCED), cell(0.3, 0.2, 0.4, REPRODUCED)]


def check_claim_verdicts() -> None:
    assert verdicts.claim_verdict(ALL_HOLD) == REPRODUCED
    assert verdicts.claim_verdict(ONE_FAILS) == CONTRADICTED
    assert verdicts.claim_verdict(MIXED) == INCONCLUSIVE
    assert verdicts.claim_verdict(BARELY) == INCONCLUSIVE
    assert verdicts.claim_verdict([Finding(ABOVE_DFLASH, NOT_RUN)]) == NOT_RUN


def test_one_verdict_per_claim_from_its_cells():
    check_claim_verdicts()
    assert verdicts.holm_contradicted([0.001, 0.02, 0.5]) == [True, False, False]  # 0.02 >= 0.025 / 2
    assert verdicts.p_outside(-0.011, -0.021, -0.001, Region.of({"above": 0})) < 0.025  # contradicted alone


def majority_of_cells(cells):
    votes = [f.verdict for f in cells]
    return max(set(votes), key=votes.count)


def any_cell_reproduced(cells):
    return REPRODUCED if any(f.verdict == REPRODUCED for f in cells) else INCONCLUSIVE


def without_holm(pvalues, alpha=0.025):
    return [p < alpha for p in pvalues]


@pytest.mark.parametrize("broken", ["majority", "any", "no_holm"])
def test_a_broken_claim_rule_fails_the_constructed_cells(monkeypatch, broken):
    if broken == "no_holm":
        monkeypatch.setattr(verdicts, "holm_contradicted", without_holm)
    else:
        monkeypatch.setattr(verdicts, "claim_verdict", majority_of_cells if broken == "majority" else any_cell_reproduced)
    with pytest.raises(AssertionError):
        check_claim_verdicts()


def check_beyond_the_paper(results: Path) -> None:
    """A T=0-only claim (Tables 3-6): its T=1 cell is shown as beyond the paper and decides nothing."""
    claim = {**ABOVE_DFLASH, "paper_cells": [{"depth": 3, "block_size": 16, "temperature": 0, "value": 0.2}]}
    write_comparisons(results, [comparison_row(1, 0.2, 0.1, 0.3),
                                comparison_row(1, -0.2, -0.3, -0.1, temperature=1.0)])
    found = findings.findings([claim], results)
    assert [f.verdict for f in found] == [REPRODUCED, findings.BEYOND]
    assert verdicts.claim_verdict(found) == REPRODUCED
    page = findings.scorecard(found, config_name="c.yaml", commit="abc")
    assert "**1** reproduced" in findings.headline(page) and "**0** contradicted" in findings.headline(page)
    assert "1 measured in settings the paper reported, 1 beyond the paper" in page


def test_cells_the_paper_did_not_report_are_beyond_it_and_not_counted(tmp_path):
    check_beyond_the_paper(tmp_path)


def test_ignoring_the_temperature_fails_the_scope_check(tmp_path, monkeypatch):
    original = verdicts.match_paper_cell
    monkeypatch.setattr(verdicts, "match_paper_cell",
                        lambda claim, attrs: original(claim, {k: v for k, v in attrs.items() if k != "temperature"}))
    with pytest.raises(AssertionError):
        check_beyond_the_paper(tmp_path)


def test_a_drafter_pair_read_by_several_claims_is_measured_once_and_shown_once(tmp_path):
    other = {**ABOVE_DFLASH, "id": "same-pair-other-claim", "verdict": {"between": [0.05, 0.15], "scale": "relative"}}
    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3)])
    found = findings.findings([ABOVE_DFLASH, other], tmp_path)
    assert found[0].key == found[1].key
    page = findings.scorecard(found, config_name="c.yaml", commit="abc")
    assert findings.headline(page).startswith("**2 claims:** **1** reproduced | **0** contradicted | **1** inconclusive")
    cells = page.split("## Cells", 1)[1].split("## Scale", 1)[0]
    rows = [line for line in cells.splitlines() if "t d1 B16 T0 epoch 6" in line]
    assert len(rows) == 1 and "`dpace-above-dflash`" in rows[0] and "`same-pair-other-claim`" in rows[0]
    assert "4.000 / --" in rows[0]  # DFlash's tau in the run's cell (no paper cell given)


def test_the_page_says_whether_an_interval_covers_training_seeds(tmp_path):
    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3, num_seeds=1)])
    page = findings.scorecard(findings.findings([ABOVE_DFLASH], tmp_path), config_name="c.yaml", commit="abc")
    assert "these drafters (one seed)" in page and "**reproduced** (these drafters, one seed)" in page
    assert "+0.043 / +0.083 / +0.037" in page  # Table 1's measured seed spread, cited
    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3, num_seeds=3)])
    page = findings.scorecard(findings.findings([ABOVE_DFLASH], tmp_path), config_name="c.yaml", commit="abc")
    assert "covers training seeds (3)" in page and "(these drafters, one seed)" not in page


def test_a_several_seed_run_reports_its_own_per_seed_gains_over_dflash_of_the_same_seed(tmp_path):
    """The Seeds section once cited an older study whatever the run trained. A three-seed run now shows each
    seed's benchmark-mean gain over DFlash's drafter of that same seed, and the seeds' share of the variance.
    DFlash's tau moves with the seed (by 0.05 a seed), so a gain taken over another seed's DFlash is off; the
    per-benchmark gains differ (+-0.02), so a gain read from one benchmark is off; the trajectory's subset rows
    (suite ``trajectory``) hold wild values, so reading them is off."""
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump([ABOVE_DFLASH]))
    gains = {0: 0.04, 1: 0.08, 2: 0.03}
    rows = []
    for seed, gain in gains.items():
        for benchmark, tilt in (("gsm8k", 0.02), ("math500", -0.02)):
            dflash = 1.40 + 0.05 * seed + 0.1 * tilt
            for objective, tau in (("dflash", dflash), ("dpace", dflash + gain + tilt)):
                for suite, value in (("full", tau), ("trajectory", tau + (1.0 if objective == "dpace" else 0.0))):
                    rows.append({"target": "t", "variant": f"{objective}-d1" + (f"-s{seed}" if seed else ""),
                                 "objective": objective, "depth": 1, "block_size": 16, "epoch": 6, "suite": suite,
                                 "benchmark": benchmark, "temperature": 0.0, "tau": value, "training_seed": seed,
                                 "skipped_too_long": 0})
    write_comparisons(tmp_path, [comparison_row(1, 0.05, 0.0, 0.1, num_seeds=3, var_prompts=0.001, var_seeds=0.003),
                                 comparison_row(1, 0.05, 0.0, 0.1, num_seeds=3, benchmark="gsm8k",
                                                var_prompts=0.009, var_seeds=0.001)])
    pd.DataFrame(rows).to_csv(tmp_path / "metrics" / "main.csv", index=False)
    findings.write_findings(claims, tmp_path, tmp_path / "findings.md", config_name="c.yaml", commit="abc")
    seeds = (tmp_path / "findings.md").read_text().split("## Seeds", 1)[1].split("## ", 1)[0]
    row = next(line for line in seeds.splitlines() if line.startswith("| dpace |"))
    assert row == "| dpace | t d1 B16 T0 epoch 6 | +0.040 | +0.080 | +0.030 | +0.050 | 0.026 | 75% |"
    assert "| seed 0 | seed 1 | seed 2 |" in seeds and "+0.043 / +0.083 / +0.037" not in seeds
    # One seed: the run cannot measure its spread; the page cites the three-seed study instead.
    pd.DataFrame([r for r in rows if r["training_seed"] == 0]).to_csv(tmp_path / "metrics" / "main.csv", index=False)
    findings.write_findings(claims, tmp_path, tmp_path / "findings.md", config_name="c.yaml", commit="abc")
    assert "+0.043 / +0.083 / +0.037" in (tmp_path / "findings.md").read_text().split("## Seeds", 1)[1]


def test_the_page_warns_of_requests_skipped_past_the_context(tmp_path):
    """One evaluation of Table 1 skipped 2 requests too long for the target's context (``skipped_too_long``
    in metrics/main.csv): the page says so under the count, naming the evaluation; none skipped, no warning."""
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump([ABOVE_DFLASH]))
    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3)])
    rows = [{"target": "t", "variant": variant, "epoch": 6, "suite": "full", "benchmark": benchmark,
             "temperature": 0.0, "tau": 1.4, "skipped_too_long": 0}
            for variant in ("dflash-d1", "dpace-d1") for benchmark in ("gsm8k", "math500")]

    def page() -> str:
        pd.DataFrame(rows).to_csv(tmp_path / "metrics" / "main.csv", index=False)
        findings.write_findings(claims, tmp_path, tmp_path / "findings.md", config_name="c.yaml", commit="abc")
        return (tmp_path / "findings.md").read_text()

    assert "Warning" not in page() and "skipped" not in page()
    rows[3]["skipped_too_long"] = 2
    warned = page()
    assert "**Warning:** 2 request(s) past the target's context were skipped" in warned
    assert "dpace-d1 epoch 6 math500 T=0: 2" in warned
    assert findings.headline(warned).startswith("**1 claims:** **1** reproduced")


@pytest.mark.parametrize("kind", ["contrast", "correlation_gap", "weight_shift", "correlation"])
@pytest.mark.parametrize("scale", ["relative", "accepted"])
def test_a_relative_scale_on_a_measure_without_a_reference_is_refused(tmp_path, kind, scale):
    measure = {"kind": kind, **({"experiment": "main", "terms": [{"objective": "dpace"}]} if kind == "contrast" else {})}
    claim = {**ABOVE_DFLASH, "measure": measure, "verdict": {"above": 0, "scale": scale}}
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump([claim]))
    with pytest.raises(ValueError, match="does not apply"):
        findings.read_claims(path)
    claim["verdict"] = {"above": 0}  # absolute: accepted
    path.write_text(yaml.safe_dump([claim]))
    findings.read_claims(path)


def plateau_steps(levels: list[float], steps_per_level: int, seed: int) -> np.ndarray:
    """A run whose machine speed moves in contiguous stretches: each level holds for a block of steps."""
    generator = np.random.default_rng(seed)
    return np.concatenate([level + 0.002 * generator.standard_normal(steps_per_level) for level in levels])


def write_step_timing(results: Path, overhead: float, *, slowed_half: float = 1.0, repeats: int = 4,
                      steps: int = 10) -> None:
    """drafters/tiny/step-timing.csv of an interleaved step benchmark (dpace.step_timing): D-PACE's step costs
    ``overhead`` more than DFlash's; ``slowed_half`` slows DFlash's steps in the second half of the repeats (a
    load that reaches one drafter only, as two separate training jobs see it)."""
    generator = np.random.default_rng(5)
    rows = []
    for repeat in range(repeats):
        machine = 1.0 + 0.1 * repeat  # the machine's speed moves between repeats: both drafters alike
        for step in range(steps):
            for position, (name, cost) in enumerate((("dflash", 0.300), ("dpace", 0.300 * (1 + overhead)))):
                factor = slowed_half if name == "dflash" and repeat >= repeats // 2 else 1.0
                rows.append({"repeat": repeat, "step": step, "position": position, "drafter": name, "objective": name,
                             "step_time_s": cost * machine * factor * (1 + 0.01 * generator.standard_normal())})
    (results / "drafters" / "tiny").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(results / "drafters" / "tiny" / "step-timing.csv", index=False)


@pytest.mark.parametrize(("overhead", "slowed_half", "verdict"), [
    (0.02, 1.0, REPRODUCED),  # +2%, a machine whose speed moves alike for both: judged, inside [0, +5%]
    (0.10, 1.0, CONTRADICTED),  # +10%: outside
    (0.02, 1.3, "not measurable on this machine"),  # a load on one drafter in half the repeats: never judged
])
def test_the_step_time_claim_reads_the_interleaved_step_timing(tmp_path, overhead, slowed_half, verdict):
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    write_training(tmp_path, np.ones((4, 4)), (0.3, 0.3))
    [found] = findings.findings([claims["t7-step-overhead-small"]], tmp_path)
    assert found.verdict == NOT_RUN and "step-timing.csv not built" in found.note
    write_step_timing(tmp_path, overhead, slowed_half=slowed_half)
    [found] = findings.findings([claims["t7-step-overhead-small"]], tmp_path)
    assert found.verdict == verdict, found.note
    assert "4 repeats x 10 steps" in found.note and "repeat spread" in found.note
    if verdict == REPRODUCED:
        assert found.low <= overhead <= found.high


def prompt_sums(taus: np.ndarray) -> np.ndarray:
    """[prompts, 4] prompt sums of one request per prompt with tau ``taus`` (dpace.report.intervals' layout)."""
    return np.stack([np.ones_like(taus), taus, np.ones_like(taus), 1.0 / taus], axis=1)


def test_the_gain_slope_avoids_regression_to_the_mean():
    """Benchmarks whose true tau spans 1.5-3.5 and a constant true gain of +0.2: no gradient. DFlash's own
    measurement of each benchmark is off by +-0.5 (its training seed's quirks), uncorrelated with the true tau;
    the gain inherits the same error with the opposite sign. Regressed on DFlash's tau the gain shows a steep
    negative slope; regressed on a third drafter's tau it shows none."""
    from dpace.report.scale import gain_slope

    true = np.repeat(np.linspace(1.5, 3.5, 10), 2)
    dflash_error = np.tile([0.5, -0.5], 10)  # cov with the true tau: exactly 0
    generator = np.random.default_rng(0)
    difficulty = [0.3 * generator.standard_normal(40) for _ in true]  # each prompt's, shared by the drafters
    noise = lambda: [0.02 * generator.standard_normal(40) for _ in true]  # noqa: E731
    ours = [prompt_sums(t + 0.2 + d + n) for t, d, n in zip(true, difficulty, noise(), strict=True)]
    dflash = [prompt_sums(t + e + d + n) for t, e, d, n in zip(true, dflash_error, difficulty, noise(), strict=True)]
    third = [prompt_sums(t - 0.1 + d + n) for t, d, n in zip(true, difficulty, noise(), strict=True)]
    result = gain_slope(ours, dflash, third, resamples=500)
    assert result["naive_slope"] < -0.2 and result["naive_high"] < 0  # the spurious slope
    assert abs(result["slope"]) < 0.05 and result["ci_low"] < 0 < result["ci_high"]
    # A real gradient (the gain grows by 0.1 per unit of tau) is found by the same method.
    growing = [prompt_sums(t + 0.2 + 0.1 * (t - 2.5) + d) for t, d in zip(true, difficulty, strict=True)]
    real = gain_slope(growing, dflash, third, resamples=500)
    assert real["ci_low"] > 0 and real["slope"] == pytest.approx(0.1, abs=0.03)


def test_a_scale_mark_needs_a_measured_gradient():
    claim = {**ABOVE_DFLASH, "gradient": {"over": "benchmark"}, "conjecture": "gains grow with tau"}
    flat = {"slope": 0.01, "ci_low": -0.05, "ci_high": 0.07, "cell": "t d1", "over": "benchmark",
            "stratifier": "topk-prefix"}
    steep = {**flat, "slope": 0.3, "ci_low": 0.1, "ci_high": 0.5}
    assert "scale-sensitive" not in scorecard_page.scale_mark(claim, [])
    assert "scale-sensitive" not in scorecard_page.scale_mark(claim, [flat])
    assert scorecard_page.scale_mark(claim, [steep]).startswith("**scale-sensitive (measured)**")
    assert "Conjecture (not measured): gains grow with tau" in scorecard_page.scale_mark(claim, [flat])


def test_the_not_measurable_list_in_docs_matches_the_claims_file():
    claims = findings.not_measurable(findings.read_claims(CLAIMS))
    page = (REPO / "docs" / "scorecard.md").read_text()
    section = page.split("## Not measurable here", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `([^`]+)`", section, re.M)
    assert sorted(listed) == sorted(c["id"] for c in claims)
    for claim in claims:
        line = next(x for x in section.splitlines() if x.startswith(f"- `{claim['id']}`"))
        assert claim["reason"] in line


def render_front_page(files: list) -> str:
    """workflow/report/workflow.rst as `snakemake --report` renders it: Jinja with the report's result files,
    the link targets Snakemake appends, then docutils to HTML."""
    from docutils.core import publish_parts
    from jinja2 import Environment

    links = "".join(f"\n.. _{f.target}: javascript:app.showResultInfo('{f.target}')\n" for f in files)
    text = (REPO / "workflow" / "report" / "workflow.rst").read_text() + links
    rst = Environment().from_string(text).render(snakemake=None, categories={}, files=files)
    return publish_parts(rst, writer="html", settings_overrides={"report_level": 2})["html_body"]


def test_the_report_front_page_shows_the_scorecard_headline_and_links_it(tmp_path):
    from types import SimpleNamespace

    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3)])
    page = findings.scorecard(findings.findings([ABOVE_DFLASH], tmp_path), config_name="c.yaml", commit="abc")
    (tmp_path / "findings.md").write_text(page)
    html = render_front_page([SimpleNamespace(target="findings.md", path=tmp_path / "findings.md")])
    assert "1 claims:" in html and "reproduced" in html and "showResultInfo('findings.md')" in html
    assert "system-message" not in html  # docutils found nothing to complain about
    without = render_front_page([])
    assert "results/findings.md" in without and "system-message" not in without


def test_the_gradient_is_read_from_each_benchmarks_evaluations(tmp_path):
    """measure_gradient on a results/ folder: three drafters on four benchmarks, D-PACE's gain growing with the
    benchmark's tau (0.1 per unit of Top-3's tau), read from their summary.json files."""
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    levels = {"gsm8k": 1.2, "math500": 1.6, "humaneval": 2.0, "mt_bench": 2.4}
    spread = np.linspace(-0.2, 0.2, 12)
    shift = {"dflash": lambda t: t, "topk-prefix": lambda t: t + 0.05, "dpace": lambda t: t + 0.1 + 0.1 * (t - 1.2)}
    rows = []
    for objective, move in shift.items():
        variant = f"{objective}-x"
        folder = tmp_path / "eval" / "t" / variant / "epoch-6" / "full"
        folder.mkdir(parents=True)
        entries = [{"benchmark": b, "temperature": 0.0, "requests": requests(list(move(level) + spread))}
                   for b, level in levels.items()]
        (folder / "summary.json").write_text(json.dumps(entries))
        rows += [{"target": "t", "variant": variant, "experiment": "main", "objective": objective, "depth": 2,
                  "block_size": 8, "epoch": 6, "suite": "full", "benchmark": b, "temperature": 0.0,
                  "tau": move(level), "speedup": 1.0} for b, level in levels.items()]
    (tmp_path / "metrics").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "metrics" / "main.csv", index=False)
    [gradient] = claim_measures.measure_gradient(claims["t1-dpace-above-dflash"], tmp_path)
    assert gradient["strata"] == 4 and gradient["cell"] == "t d2 B8 T0 epoch 6"
    assert gradient["gain"] == pytest.approx([0.1 + 0.1 * (levels[b] - 1.2) for b in sorted(levels)])
    assert gradient["slope"] == pytest.approx(0.1) and gradient["ci_low"] > 0
    mark = scorecard_page.scale_mark(claims["t1-dpace-above-dflash"], [gradient])
    assert mark.startswith("**scale-sensitive (measured)**") and "across benchmarks" in mark
    page = findings.scorecard([], config_name="c", commit="x", grads={"t1-dpace-above-dflash": [gradient]})
    assert "+0.100 [" in page.split("## Scale", 1)[1] and "epoch 6 (one seed)" in page.split("## Scale", 1)[1]


def write_gradient_run(results: Path, gain_slopes: dict[int, float]) -> None:
    """Table 1's DFlash, Top-3 and D-PACE on four benchmarks, one variant per training seed; D-PACE's gain over
    DFlash grows by ``gain_slopes[seed]`` per unit of the benchmark's tau at that seed."""
    levels = {"gsm8k": 1.2, "math500": 1.6, "humaneval": 2.0, "mt_bench": 2.4}
    spread = np.linspace(-0.2, 0.2, 12)
    rows = []
    for seed, slope in gain_slopes.items():
        shift = {"dflash": lambda t: t, "topk-prefix": lambda t: t + 0.05,
                 "dpace": lambda t, slope=slope: t + 0.1 + slope * (t - 1.8)}
        for objective, move in shift.items():
            variant = f"{objective}-x" + (f"-s{seed}" if seed else "")
            folder = results / "eval" / "t" / variant / "epoch-6" / "full"
            folder.mkdir(parents=True)
            entries = [{"benchmark": b, "temperature": 0.0, "requests": requests(list(move(level) + spread))}
                       for b, level in levels.items()]
            (folder / "summary.json").write_text(json.dumps(entries))
            rows += [{"target": "t", "variant": variant, "method": f"{objective}-x", "training_seed": seed,
                      "experiment": "main", "objective": objective, "depth": 2, "block_size": 8, "epoch": 6,
                      "suite": "full", "benchmark": b, "temperature": 0.0, "tau": move(level), "speedup": 1.0}
                     for b, level in levels.items()]
    (results / "metrics").mkdir()
    pd.DataFrame(rows).to_csv(results / "metrics" / "main.csv", index=False)


def test_a_gradient_of_a_several_seed_run_reads_every_seed(tmp_path):
    """The gradients once read the first training seed only: here seed 0's gain grows by +0.2 per unit of tau,
    seed 1's falls by 0.2 and seed 2's is flat, so over the seeds there is no gradient to claim."""
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    write_gradient_run(tmp_path, {0: 0.2, 1: -0.2, 2: 0.0})
    [gradient] = claim_measures.measure_gradient(claims["t1-dpace-above-dflash"], tmp_path)
    assert gradient["slope"] == pytest.approx(0.0, abs=1e-9)  # the first seed alone: +0.2
    assert gradient["num_seeds"] == 3 and gradient["ci_low"] < -0.1 and gradient["ci_high"] > 0.1  # the seeds disagree by 0.4
    assert "scale-sensitive" not in scorecard_page.scale_mark(claims["t1-dpace-above-dflash"], [gradient])
    assert "t d2 B8 T0 epoch 6 (3 training seeds)" in "\n".join(scorecard_page.gradients_table({"c": [gradient]}))


def test_a_one_seed_gradient_is_unchanged_by_the_seed_level():
    from dpace.report.scale import gain_slope

    generator = np.random.default_rng(4)
    strata = [[prompt_sums(1.5 + 0.3 * k + generator.random(10)) for k in range(4)] for _ in range(3)]
    one = gain_slope(*strata, resamples=300)
    stacked = gain_slope(*[[s[None] for s in role] for role in strata], resamples=300)
    assert one["num_seeds"] == stacked["num_seeds"] == 1
    assert (one["slope"], one["ci_low"], one["ci_high"]) == pytest.approx(
        (stacked["slope"], stacked["ci_low"], stacked["ci_high"]))


def test_paired_contrast_over_seeds_is_the_hierarchical_bootstrap_for_two_drafters():
    """With training seeds, a contrast of two drafters is hierarchical_bootstrap's difference of their seed
    means, draw for draw: the seeds' spread is in the interval."""
    generator = np.random.default_rng(2)
    ours = [{b: requests(list(1.5 + shift + generator.random(8))) for b in ("gsm8k", "math500")} for shift in (0, 0.3, -0.1)]
    theirs = [{b: requests(list(1.4 + generator.random(8))) for b in ("gsm8k", "math500")} for _ in range(3)]
    for metric in ("tau", "speedup"):
        expected = next(r for r in hierarchical_bootstrap(ours, theirs)
                        if r["benchmark"] == "avg" and r["metric"] == metric)
        result = paired_contrast([ours, theirs], [1, -1], metric=metric)
        assert result["num_seeds"] == 3
        assert result["value"] == pytest.approx(expected["difference"])
        assert (result["ci_low"], result["ci_high"]) == pytest.approx((expected["ci_low"], expected["ci_high"]))
    first_seed = paired_contrast([ours[:1], theirs[:1]], [1, -1])
    assert first_seed["ci_high"] - first_seed["ci_low"] < result["ci_high"] - result["ci_low"]


def test_a_contrast_of_a_several_seed_run_reads_every_seed(tmp_path):
    """A contrast once read the first training seed's drafters only: here seed 0 puts D-PACE 0.2 above
    cumulative-only and seed 1 0.2 below, so the claim is inconclusive over both seeds, not reproduced."""
    claim = {**ABOVE_DFLASH, "measure": {"kind": "contrast", "experiment": "ablation", "benchmark": "math500",
                                         "terms": [{"objective": "dpace", "weight": 1},
                                                   {"objective": "dpace-cumulative", "weight": -1}]}}
    taus = list(np.linspace(1.5, 2.5, 12))
    rows = [{**write_evaluation(tmp_path, f"a{seed}", "dpace", [t + 0.2 - 0.4 * seed for t in taus]), "training_seed": seed}
            for seed in (0, 1)]
    rows += [{**write_evaluation(tmp_path, f"b{seed}", "dpace-cumulative", taus), "training_seed": seed} for seed in (0, 1)]
    (tmp_path / "metrics").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "metrics" / "ablation.csv", index=False)
    [found] = findings.findings([claim], tmp_path)
    assert found.seeds == 2 and "2 training seeds" in found.note
    assert found.value == pytest.approx(0.0, abs=1e-12) and found.verdict == INCONCLUSIVE
    assert found.low < -0.1 and found.high > 0.1  # the seeds disagree by 0.4


def test_a_cell_of_too_few_prompts_gets_no_interval_and_decides_nothing(tmp_path):
    """A bootstrap over 2 prompts gives their own range as a "95%" interval: such a cell must not contradict
    (or reproduce) a claim, while the same interval over enough prompts does."""
    from dpace.report.verdicts import MIN_INTERVAL_PROMPTS, claim_verdict

    write_comparisons(tmp_path, [
        comparison_row(1, -0.20, -0.30, -0.10, num_prompts=2),
        comparison_row(2, -0.20, -0.30, -0.10, num_prompts=MIN_INTERVAL_PROMPTS),
    ])
    few, enough = findings.findings([ABOVE_DFLASH], tmp_path)
    assert (few.verdict, enough.verdict) == (INCONCLUSIVE, CONTRADICTED)
    assert few.value == -0.20 and math.isnan(few.low) and math.isnan(few.high)
    assert claim_verdict([few]) == INCONCLUSIVE and claim_verdict([few, enough]) == CONTRADICTED


def check_finding_groups(results: Path) -> None:
    """Four claims, two independent findings: Accept-rate's collapse and D-PACE at alpha = 0's read
    bit-identical drafters (different names, identical records), and Top-3 above Accept-rate names the
    collapse's finding in the claims file; D-PACE above DFlash stands alone."""
    taus = list(np.linspace(1.0, 1.05, 12))
    rows = [write_evaluation(results, "ar-x", "accept-rate", taus), write_evaluation(results, "a0-x", "dpace-alpha0", taus),
            write_evaluation(results, "top3-x", "topk-prefix", [t + 0.4 for t in taus])]
    (results / "metrics").mkdir(exist_ok=True)
    pd.DataFrame(rows).to_csv(results / "metrics" / "ablation.csv", index=False)
    collapse = {**ABOVE_DFLASH, "verdict": {"between": [1.0, 1.1]},
                "measure": {"kind": "contrast", "experiment": "ablation", "terms": [{"objective": "accept-rate"}]}}
    claims = [
        {**collapse, "id": "accept-rate-collapses"},
        {**collapse, "id": "alpha-0-collapses", "measure": {**collapse["measure"], "terms": [{"objective": "dpace-alpha0"}]}},
        {**ABOVE_DFLASH, "id": "top3-above-accept-rate", "finding": "collapse",
         "measure": {"kind": "contrast", "experiment": "ablation",
                     "terms": [{"objective": "topk-prefix"}, {"objective": "accept-rate", "weight": -1}]}},
        {**ABOVE_DFLASH, "id": "dpace-above-dflash"},
    ]
    claims[0]["finding"] = "collapse"
    write_comparisons(results, [comparison_row(1, 0.2, 0.1, 0.3)])
    found = findings.findings(claims, results)
    page = findings.scorecard(found, config_name="c.yaml", commit="abc")
    line = findings.headline(page)
    assert line.startswith("**4 claims:** **4** reproduced")
    assert "**2 independent findings:** **2** reproduced" in line
    listed = page.split("Independent findings of several claims", 1)[1].split("\n\n", 2)[1]
    assert "`accept-rate-collapses`, `alpha-0-collapses`, `top3-above-accept-rate`" in listed
    assert "identical per-request records (bit-identical drafters)" in listed and "`finding: collapse`" in listed


def test_claims_of_one_finding_are_counted_once(tmp_path):
    check_finding_groups(tmp_path)


@pytest.mark.parametrize("broken", ["ignore_finding_key", "ignore_identical_records", "every_claim_alone"])
def test_a_broken_grouping_fails_the_finding_count(tmp_path, monkeypatch, broken):
    if broken == "every_claim_alone":
        monkeypatch.setattr(scorecard_page, "finding_groups", lambda by_claim: {c: [c] for c in by_claim})
    elif broken == "ignore_identical_records":
        monkeypatch.setattr(claim_measures, "records_digest", lambda weights, drafters, metric: "")
    else:
        original = scorecard_page.finding_groups

        def without_key(by_claim):
            for cells in by_claim.values():
                for f in cells:
                    f.claim = {k: v for k, v in f.claim.items() if k != "finding"}
            return original(by_claim)
        monkeypatch.setattr(scorecard_page, "finding_groups", without_key)
    with pytest.raises(AssertionError):
        check_finding_groups(tmp_path)


def test_the_digest_tells_identical_drafters_from_different_ones():
    records = {"math500": requests([1.0, 1.02, 1.04])}
    same = claim_measures.records_digest([1.0], [[records]], "tau")
    assert same == claim_measures.records_digest([1.0], [[{"math500": requests([1.0, 1.02, 1.04])}]], "tau")
    assert same != claim_measures.records_digest([1.0], [[{"math500": requests([1.0, 1.02, 1.05])}]], "tau")
    assert same != claim_measures.records_digest([-1.0], [[records]], "tau")


MAGNITUDE = {**ABOVE_DFLASH, "id": "gain-size", "verdict": {"paper_factor": 2},
             "paper_cells": [{"depth": 3, "block_size": 8, "temperature": 0, "value": 0.2, "source": "tex:375"},
                             {"depth": 3, "block_size": 16, "temperature": 1, "value": 0.4, "source": "tex:295"}]}


def check_own_setting(results: Path) -> None:
    """A magnitude claim with a B = 8 paper cell at T = 0 and only a B = 16 one at T = 1; the run is B = 8 at both,
    with a gain of +0.15 [+0.12, +0.18] at T = 1: inside the B = 16 band [+0.2, +0.8]? no; inside the band of the
    paper's number scaled to B = 8 (x0.5: [+0.1, +0.4]) yes. Unscaled the cell would be contradicted against a
    number from another block size; without a ratio it is beyond the paper."""
    write_comparisons(results, [comparison_row(1, 0.15, 0.12, 0.18, block_size=8),
                                comparison_row(1, 0.15, 0.12, 0.18, block_size=8, temperature=1.0)])
    t0, t1 = findings.findings([MAGNITUDE], results)
    assert (t0.verdict, t0.scope) == (REPRODUCED, "")
    assert t1.verdict == findings.BEYOND and t1.paper_cell is None and t1.scope.startswith("beyond the paper: no B = 8")
    scaled = {**MAGNITUDE, "block_scaling": [{"from": 16, "to": 8, "ratio": 0.5, "source": "tex:375,377"}]}
    t0, t1 = findings.findings([scaled], results)
    assert t1.verdict == REPRODUCED and t1.scope.startswith("scaled: the paper's B = 16 number x0.500")
    assert verdicts.region_of(t1) == Region(0.1, 0.4)
    page = findings.scorecard([t0, t1], config_name="c.yaml", commit="abc")
    assert "1 judged against a paper number of another block size, scaled" in page
    assert "B16 T1 x0.500 (B8 / B16)" in page and "(scaled: the paper's B = 16 number x0.500" in page
    # An ordering does not depend on the paper's number: judged, and the page names the paper cell's block size.
    ordering = {**MAGNITUDE, "verdict": {"above": 0}}
    assert [f.verdict for f in findings.findings([ordering], results)] == [REPRODUCED, REPRODUCED]
    assert findings.findings([ordering], results)[1].scope.startswith("the paper's cell is at B = 16 (none at B = 8)")


def test_each_cell_is_judged_against_its_own_block_size(tmp_path):
    check_own_setting(tmp_path)


def test_judging_a_cell_against_another_block_size_fails_the_scope_check(tmp_path, monkeypatch):
    monkeypatch.setattr(verdicts, "own_setting", lambda claim, attrs, paper: (paper, ""))
    with pytest.raises(AssertionError):
        check_own_setting(tmp_path)


def test_the_claims_cells_at_another_block_size_are_scaled_or_beyond():
    """The run's B = 8 cells whose paper cells are B = 16 only (issue 58): T = 1 of Table 1's gain, and every
    epoch of Table 3 and Figure 3c."""
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}

    def judged_at(claim_id, **attrs):
        claim = claims[claim_id]
        return verdicts.own_setting(claim, attrs, verdicts.match_paper_cell(claim, attrs))

    paper, scope = judged_at("t1-dpace-tau-gain-about-10pct", temperature=1.0, block_size=8, depth=2)
    assert scope.startswith("scaled") and verdicts.paper_value(claims["t1-dpace-tau-gain-about-10pct"], paper) == \
        pytest.approx(0.513 * 0.33 / 2.86)
    assert judged_at("t1-dpace-tau-gain-about-10pct", temperature=0.0, block_size=8, depth=2)[1] == ""
    assert judged_at("f3c-dpace-12pct-every-epoch", temperature=0.0, block_size=8, epoch=3)[1].startswith("scaled")
    for claim_id in ("t3-cumulative-only-10-12pct", "t3-continuation-only-about-2pct"):
        assert judged_at(claim_id, temperature=0.0, block_size=8, epoch=4) == (
            None, "beyond the paper: no B = 8 cell, and no B = 8 / B = 16 ratio for this claim")


# --- issue 58: the missing claims ----------------------------------------------------------------------------

def write_ablation(results: Path, cumulative_share: float) -> None:
    """MATH-500 at epoch 6, B = 16: DFlash, D-PACE 0.2 above it, cumulative-only ``cumulative_share`` of that gain."""
    base = list(np.linspace(1.5, 2.5, 12))
    noise = np.random.default_rng(8).normal(0, 0.01, 12)
    noise -= noise.mean()  # the gains are exactly 0.2 and 0.2 x share on average
    rows = [write_evaluation(results, "dflash-x", "dflash", base),
            write_evaluation(results, "dpace-x", "dpace", [t + 0.2 + n for t, n in zip(base, noise, strict=True)]),
            write_evaluation(results, "cum-x", "dpace-cumulative",
                             [t + 0.2 * cumulative_share - n for t, n in zip(base, noise, strict=True)])]
    (results / "metrics").mkdir(exist_ok=True)
    pd.DataFrame(rows).to_csv(results / "metrics" / "ablation.csv", index=False)


@pytest.mark.parametrize(("share", "expected"), [(0.9, REPRODUCED), (0.2, CONTRADICTED)])
def test_a_ratio_of_two_contrasts_says_how_much_of_the_gain_one_part_carries(tmp_path, share, expected):
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    write_ablation(tmp_path, share)
    [found] = findings.findings([claims["t3-cumulative-carries-most-of-the-gain"]], tmp_path)
    assert found.value == pytest.approx(share) and found.verdict == expected
    assert found.low < found.value < found.high and "/ (" in found.cell


def test_a_ratio_whose_denominator_may_be_zero_has_no_interval(tmp_path):
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    base = list(np.linspace(1.5, 2.5, 12))
    wobble = np.random.default_rng(9).normal(0, 0.05, 12)
    rows = [write_evaluation(tmp_path, "dflash-x", "dflash", base),
            write_evaluation(tmp_path, "dpace-x", "dpace", [t + w for t, w in zip(base, wobble, strict=True)]),
            write_evaluation(tmp_path, "cum-x", "dpace-cumulative", [t + 0.1 for t in base])]
    (tmp_path / "metrics").mkdir()
    pd.DataFrame(rows).to_csv(tmp_path / "metrics" / "ablation.csv", index=False)
    [found] = findings.findings([claims["t3-cumulative-carries-most-of-the-gain"]], tmp_path)
    assert math.isnan(found.low) and found.verdict == INCONCLUSIVE


def write_blocks(results: Path, sum_q_noise: float, bins_rise: bool = True) -> None:
    write_training(results, np.ones((4, 4)), (0.3, 0.3))
    generator = np.random.default_rng(3)
    surrogate = generator.random(200) * 3
    tau = surrogate + 0.1 * generator.random(200) if bins_rise else 2.0 + 0.1 * generator.random(200)
    pd.DataFrame({"variant": "dflash-x", "benchmark": "math500", "temperature": 0.0, "epoch": 2,
                  "prompt_index": np.repeat(np.arange(20), 10), "surrogate": surrogate, "tau_block": tau,
                  "sum_q": surrogate + sum_q_noise * generator.random(200)}).to_csv(
        results / "metrics" / "main_blocks.csv", index=False)


def test_the_sum_of_q_correlation_and_the_binned_rise(tmp_path):
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    write_blocks(tmp_path, sum_q_noise=1.6)
    [rho] = findings.findings([claims["t8-sum-q-rho-about-079"]], tmp_path)
    [surrogate] = findings.findings([claims["t8-surrogate-strongly-correlated"]], tmp_path)
    assert rho.value < surrogate.value and rho.key != surrogate.key  # of: sum_q reads the other column
    [rise] = findings.findings([claims["f1a-binned-tau-rises-with-surrogate"]], tmp_path)
    assert rise.verdict == REPRODUCED and rise.value > 0
    write_blocks(tmp_path, sum_q_noise=1.6, bins_rise=False)
    [flat] = findings.findings([claims["f1a-binned-tau-rises-with-surrogate"]], tmp_path)
    assert flat.verdict != REPRODUCED
    blocks = np.array([[1, 1.0], [2, 1.0], [3, 2.0], [4, 2.0], [5, 1.5], [6, 1.5], [7, 4.0], [8, 4.0]])
    assert claim_measures.smallest_bin_rise(blocks, 4) == -0.5


@pytest.mark.parametrize(("noise", "expected"), [(0.05, REPRODUCED), (0.0, CONTRADICTED)])
def test_weights_varying_across_updates_are_told_from_a_smooth_course(tmp_path, noise, expected):
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    progress = np.linspace(0, 1, 60)[:, None]
    weights = np.array([[1.0, 0.6, 0.3, 0.1]]) + progress * np.array([[0.0, 0.2, 0.5, 0.8]])
    weights = weights * (1 + noise * np.random.default_rng(5).standard_normal(weights.shape))
    write_training(tmp_path, weights, (0.3, 0.3))
    [found] = findings.findings([claims["f3b-weights-vary-across-updates"]], tmp_path)
    assert found.verdict == expected


def write_smoothing(results: Path, alive_at: float) -> None:
    """The smoothing sweep's training logs: the drafter at alpha ``alive_at`` keeps weight on later positions,
    the other's later weights vanish."""
    (results / "metrics").mkdir(exist_ok=True)
    pd.DataFrame([{"variant": f"dpace-a{a}", "objective": "dpace", "alpha": a, "depth": 1, "block_size": 4}
                  for a in (0.0, 0.5)] + [{"variant": "dflash-x", "objective": "dflash", "alpha": math.nan,
                                           "depth": 1, "block_size": 4}]).to_csv(results / "metrics" / "smoothing.csv")
    noise = np.random.default_rng(6)
    rows = []
    for alpha in (0.0, 0.5):
        shape = [1.0, 0.8, 0.6, 0.5] if alpha == alive_at else [1.0, 0.1, 0.001, 0.0]
        rows += [{"variant": f"dpace-a{alpha}", "step": step, **{f"w_{j}": x * (1 + 0.02 * noise.random())
                                                                 for j, x in enumerate(shape)}} for step in range(50)]
    pd.DataFrame(rows).to_csv(results / "metrics" / "smoothing_train_steps.csv", index=False)


@pytest.mark.parametrize(("alive_at", "expected"), [(0.5, REPRODUCED), (0.0, CONTRADICTED)])
def test_smoothing_keeping_later_weights_alive_is_read_from_the_alpha_0_weights(tmp_path, alive_at, expected):
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    write_smoothing(tmp_path, alive_at)
    [found] = findings.findings([claims["t5-smoothing-keeps-later-weights"]], tmp_path)
    assert found.verdict == expected and "dpace-a0.5 - dpace-a0.0" in found.cell


def test_a_claim_that_holds_by_construction_is_shown_and_not_counted(tmp_path):
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    progress = np.linspace(0, 1, 40)[:, None]
    write_training(tmp_path, np.array([[1.0, 0.6, 0.3, 0.1]]) + progress * np.array([[0.0, 0.2, 0.5, 0.8]]), (0.3, 0.3))
    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3)])
    found = findings.findings([claims["f3-weight-moves-later"], ABOVE_DFLASH], tmp_path)
    page = findings.scorecard(found, config_name="c.yaml", commit="abc")
    assert findings.headline(page).startswith("**1 claims:** **1** reproduced")
    assert "(1 more hold by construction: shown, not counted)" in findings.headline(page)
    assert "(by construction, not counted:" in page and "`f3-weight-moves-later`" in page


def test_the_new_claims_of_issue_58_are_in_the_claims_file():
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    assert {"t1-top3-sr-below-dflash", "t1-dpace-sr-above-top3", "t1-accept-rate-sr-below-dflash",
            "t1-dpace-speedup-about-9pct", "t4-sr-gain-at-every-block-size", "t6-target-prob-sr-closer-to-dflash",
            "t3-continuation-7-9pct-below-dpace", "t3-cumulative-carries-most-of-the-gain",
            "t5-alpha-09-removes-most-of-the-gain", "t5-alpha-03-comparable-to-05", "t5-alpha-07-stable",
            "t8-sum-q-rho-about-079", "f1a-binned-tau-rises-with-surrogate", "f3b-weights-vary-across-updates",
            "t5-smoothing-keeps-later-weights", "nm-up-to-447x"} <= set(claims)
    assert "nm-alpha-stable-03-07" not in claims  # alpha 0.3 and 0.7 are swept (config.yaml)
    assert {0.3, 0.7} <= set(yaml.safe_load((REPO / "config.yaml").read_text())["experiments"]["smoothing"]["alphas"])
    assert claims["f3-weight-moves-later"]["by_construction"]


def _over_seeds_coverage(seeds: int, simulations: int = 400) -> float:
    """How often _over_seeds' interval (Table 8's correlations, Figure 3's weights over seeds) holds the truth:
    each seed's estimate is off by a seed effect (sd 0.1) and its own sampling error (sd 0.02), and its bootstrap
    draws spread by that sampling error around it."""
    generator = np.random.default_rng(13)
    covered = []
    for _ in range(simulations):
        points = 1.0 + generator.normal(0, 0.1, seeds) + generator.normal(0, 0.02, seeds)
        draws = [p + generator.normal(0, 0.02, 400) for p in points]
        _, low, high = claim_measures._over_seeds(points, draws)
        covered.append(low <= 1.0 <= high)
    return float(np.mean(covered))


def test_estimates_combined_over_three_seeds_cover_at_least_90_percent(monkeypatch):
    assert _over_seeds_coverage(3) >= 0.90
    from dpace.report import intervals

    monkeypatch.setattr(intervals, "_seed_widening", lambda seeds, tail: 1.0 if seeds > 1 else 0.0)
    assert _over_seeds_coverage(3) < 0.90  # a percentile bootstrap over the 3 seeds


def _gradient_coverage(seeds: int, simulations: int = 200) -> float:
    """How often gain_slope's interval over seeds holds the true slope (+0.1 per unit of tau): each training seed's
    own slope is off by sd 0.1, prompts differ by sd 0.3 (shared by the drafters) and each request by 0.02."""
    from dpace.report.scale import gain_slope

    generator = np.random.default_rng(3)
    levels = np.array([1.2, 1.6, 2.0, 2.4])
    covered = []
    for _ in range(simulations):
        slopes = 0.1 + generator.normal(0, 0.1, seeds)
        difficulty = [generator.normal(0, 0.3, 20) for _ in levels]

        def drafter(k: int, shifts: np.ndarray, difficulty=difficulty) -> np.ndarray:  # shifts: per seed
            return np.stack([prompt_sums(levels[k] + shift + difficulty[k] + generator.normal(0, 0.02, 20))
                             for shift in shifts])
        ours = [drafter(k, 0.1 + slopes * (lv - 1.8)) for k, lv in enumerate(levels)]
        reference = [drafter(k, np.zeros(seeds)) for k in range(len(levels))]
        third = [drafter(k, np.full(seeds, 0.05)) for k in range(len(levels))]
        result = gain_slope(ours, reference, third, resamples=300)
        covered.append(result["ci_low"] <= 0.1 <= result["ci_high"])
    return float(np.mean(covered))


def test_a_gradient_over_three_seeds_covers_its_slope_at_least_90_percent(monkeypatch):
    assert _gradient_coverage(3) >= 0.90
    from dpace.report import intervals

    monkeypatch.setattr(intervals, "_seed_widening", lambda seeds, tail: 1.0 if seeds > 1 else 0.0)
    assert _gradient_coverage(3) < 0.90  # a percentile bootstrap over the 3 seeds


def test_the_new_measures_say_not_run_or_no_interval_on_a_tiny_run(tmp_path):
    """A smoke run logs a few steps and blocks: the new measures must not fail the scorecard job."""
    claims = {c["id"]: c for c in findings.read_claims(CLAIMS)}
    write_training(tmp_path, np.ones((4, 4)), (0.3, 0.3))
    [variation] = findings.findings([claims["f3b-weights-vary-across-updates"]], tmp_path)
    assert variation.verdict == NOT_RUN and "too few for a trend" in variation.note
    assert math.isnan(claim_measures.smallest_bin_rise(np.ones((6, 3)), 5))


def test_two_pages_of_the_same_run_are_compared_claim_by_claim(tmp_path):
    """A second measurement of the same drafters: the claim whose cell moved across the region's edge is the one
    row that differs, with both verdicts as the pages state them; the claim that did not move, and the claim
    that is not run on either page, count as the same."""
    below = {**ABOVE_DFLASH, "id": "dpace-below-dflash-4", "claim": "D-PACE's tau below DFlash's + 4",
             "verdict": {"below": 4}}
    unbuilt = {**ABOVE_DFLASH, "id": "extras-claim", "measure": {**ABOVE_DFLASH["measure"], "experiment": "extras"}}
    claims = [ABOVE_DFLASH, below, unbuilt]

    def page(low: float, high: float) -> str:
        results = tmp_path / f"run{low}"
        write_comparisons(results, [comparison_row(1, (low + high) / 2, low, high)])
        return findings.scorecard(findings.findings(claims, results), config_name="c.yaml", commit="abc")

    first, second = page(0.10, 0.30), page(-0.05, 0.15)
    assert scorecard_page.claim_verdicts(first) == {
        "dpace-above-dflash": REPRODUCED, "dpace-below-dflash-4": REPRODUCED, "extras-claim": NOT_RUN}
    assert scorecard_page.stability_table(first, second) == [
        "| claim | first | second |", "|---|---|---|",
        f"| `dpace-above-dflash` | {REPRODUCED} | {INCONCLUSIVE} |",
        "| 2 other claims | same | same |"]
    assert scorecard_page.stability_table(first, first)[2:] == ["| 3 other claims | same | same |"]


def test_an_archived_page_reads_its_verdicts_past_the_bold_scale_marks():
    """docs/scorecard-650f9ba.md as published: rows whose scale column is bold still give their verdict column."""
    archived = scorecard_page.claim_verdicts((REPO / "docs" / "scorecard-650f9ba.md").read_text())
    assert archived["t1-dpace-above-dflash"] == REPRODUCED  # its row: "**scale-sensitive (measured)**" first
    assert archived["t1-dpace-tau-gain-about-10pct"] == INCONCLUSIVE
    assert archived["t2-dpace-speedup-per-target"] == NOT_RUN
    assert len(archived) == 29 and sum(v == REPRODUCED for v in archived.values()) == 14
