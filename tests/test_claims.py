"""The claims file cannot lie (issue 56): workflow/claims.yaml is checked by its schema
(workflow/schemas/claims.schema.yaml) and against the registries before anything is measured, on the scorecard's
code path (dpace.report.findings.read_claims) and when the Snakefile loads; a claim is *not run* only for a true
reason."""

from __future__ import annotations

import copy
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpace.claims import ClaimsError, check_claims, validate_claims
from dpace.report import findings
from dpace.report.findings import NOT_RUN, Region
from tests.test_findings import comparison_row, write_comparisons

REPO = Path(__file__).resolve().parents[1]
CLAIMS = REPO / "workflow" / "claims.yaml"
SHIPPED = yaml.safe_load(CLAIMS.read_text())


def edited(claim_id: str, edit) -> list[dict]:
    claims = copy.deepcopy(SHIPPED)
    edit(next(c for c in claims if c["id"] == claim_id))
    return claims


def _set(section: str, **values):
    return lambda claim: claim[section].update(values)


# (claim, edit, the message's end): each a mistake the scorecard used to score or call "not run".
BAD = [
    ("t1-dpace-above-dflash", lambda c: c.update(verdict={"abvoe": 100}),
     r"claim 't1-dpace-above-dflash': verdict: unknown key\(s\) \['abvoe'\]; allowed: \['above', 'below', "
     r"'between', 'paper_factor', 'scale'\]"),
    ("t1-dpace-above-dflash", lambda c: c.update(verdict={"bellow": -100}),
     r"claim 't1-dpace-above-dflash': verdict: unknown key\(s\) \['bellow'\]"),
    ("t1-dpace-tau-gain-about-10pct", lambda c: c["verdict"].update(scael="relative"),
     r"claim 't1-dpace-tau-gain-about-10pct': verdict: unknown key\(s\) \['scael'\]"),
    ("t1-dpace-above-dflash", _set("measure", experiment="mian"),
     r"claim 't1-dpace-above-dflash': measure\.experiment: 'mian' is not an experiment; valid: main, "),
    ("t1-dpace-above-dflash", _set("measure", objective="dpase"),
     r"claim 't1-dpace-above-dflash': measure\.objective: 'dpase' is not an objective; valid: dflash, dpace, "),
    ("t1-dpace-above-dflash", _set("measure", metric="tua"),
     r"claim 't1-dpace-above-dflash': measure\.metric: 'tua' is not one of \['tau', 'speedup'\]"),
    ("t1-dpace-above-dflash", _set("measure", benchmark="mtbench"),
     r"claim 't1-dpace-above-dflash': measure\.benchmark: 'mtbench' is not a benchmark; valid: avg, every, gsm8k"),
    ("t1-dpace-above-dflash", _set("measure", benchmrk="mt_bench"),
     r"claim 't1-dpace-above-dflash': measure: unknown key\(s\) \['benchmrk'\]"),
    ("t5-alpha-0-collapses", lambda c: c["measure"]["terms"][0].update(objective="dpace-cumulative-confidence-only"),
     r"claim 't5-alpha-0-collapses': measure\.terms\.0\.objective: 'dpace-cumulative-confidence-only' is not an objective \(write its canonical "
     r"name 'dpace-cumulative'\)"),
    ("t5-alpha-0-collapses", lambda c: c["measure"]["terms"][0].update(wieght=1),
     r"claim 't5-alpha-0-collapses': measure\.terms\.0: unknown key\(s\) \['wieght'\]"),
    ("t1-dpace-above-dflash", lambda c: c["paper_cells"][0].update(temprature=1),
     r"claim 't1-dpace-above-dflash': paper_cells\.0: unknown key\(s\) \['temprature'\]"),
    ("t1-dpace-above-dflash", lambda c: c["gradient"].update(stratifier="topk"),
     r"claim 't1-dpace-above-dflash': gradient\.stratifier: 'topk' is not an objective"),
    ("f3c-dpace-12pct-every-epoch", _set("gradient", benchmark="math-500"),
     r"claim 'f3c-dpace-12pct-every-epoch': gradient\.benchmark: 'math-500' is not a benchmark"),
    ("t8-surrogate-rho-above-sum-q", _set("measure", experiment="main"),
     r"claim 't8-surrogate-rho-above-sum-q': measure: unknown key\(s\) \['experiment'\]; allowed: \['kind'\]"),
    ("t5-alpha-0-collapses", lambda c: c.update(verdict={"between": [1.1, 1.0]}),
     r"claim 't5-alpha-0-collapses': verdict\.between: \[1\.1, 1\.0\] is empty"),
    ("t1-dpace-above-dflash", lambda c: c.update(verdict={"scale": "relative"}),
     r"claim 't1-dpace-above-dflash': verdict: \{'scale': 'relative'\} is no region"),
    ("nm-h200-compute", lambda c: c.update(verdict={"above": 0}),
     r"claim 'nm-h200-compute': a not_measurable claim takes no paper_value, paper_cells, verdict or gradient"),
    ("t1-dpace-above-dflash", lambda c: c.update(id="t1-dpace-above-dflash\n"),
     r"claim 't1-dpace-above-dflash\\n': id: does not match \^\[a-z0-9\]\[a-z0-9\.-\]\*\$ as a whole"),
    ("t1-dpace-above-dflash", lambda c: c.update(id="t1-dpace-tau-gain-about-10pct"),
     r"claim id 't1-dpace-tau-gain-about-10pct' appears twice"),
]


@pytest.mark.parametrize(("claim_id", "edit", "message"), BAD, ids=[m[:60] for _, _, m in BAD])
def test_a_mistake_in_the_claims_file_is_refused_naming_the_claim_and_key(tmp_path, claim_id, edit, message):
    """Through the scorecard's own reader (which the findings job calls first): the claim's id and the key."""
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(edited(claim_id, edit), sort_keys=False))
    with pytest.raises(ClaimsError, match=re.escape(str(path)) + ": " + message):
        findings.read_claims(path)


def test_the_shipped_claims_file_is_valid():
    assert validate_claims() == SHIPPED
    assert findings.read_claims(CLAIMS) == SHIPPED


def test_a_misspelt_verdict_was_scored_reproduced_and_is_refused(tmp_path):
    """The observed bug: ``{abvoe: 100}`` made the region "< +inf", so any interval reproduced the claim."""
    claim = next(c for c in SHIPPED if c["id"] == "t1-dpace-above-dflash")
    broken = {**claim, "verdict": {"abvoe": 100}}
    with pytest.raises(ClaimsError, match="unknown key"):
        check_claims([broken])
    with pytest.raises(ValueError, match="no region"):  # and the rule itself never opens to everything
        Region.of({"abvoe": 100})
    write_comparisons(tmp_path, [comparison_row(1, -0.5, -0.6, -0.4)])  # far below 0: not the claimed +100
    [finding] = findings.findings([{**claim, "verdict": {"above": 100}}], tmp_path)
    assert finding.verdict == findings.CONTRADICTED
    assert Region.of({"below": -100}) == Region(-math.inf, -100, strict=True)


def test_not_run_says_what_the_run_lacks(tmp_path):
    """A claim on a benchmark the run did not evaluate is *not run*, and says so; it used to blame a file that
    holds the drafter's rows ("no dpace rows in metrics/main_comparisons.csv")."""
    shipped = next(c for c in SHIPPED if c["id"] == "t1-dpace-above-dflash")
    claim = {key: value for key, value in shipped.items() if key != "gradient"}
    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3, benchmark=b) for b in ("avg", "gsm8k")])
    on_mt_bench = {**claim, "measure": {**claim["measure"], "benchmark": "mt_bench"}}
    [found] = findings.findings([on_mt_bench], tmp_path)
    assert found.verdict == NOT_RUN
    assert found.note == "no benchmark mt_bench of dpace in metrics/main_comparisons.csv (it holds avg, gsm8k)"
    sr = {**claim, "measure": {**claim["measure"], "metric": "speedup"}}
    [found] = findings.findings([sr], tmp_path)
    assert found.note == "no speedup rows of dpace in metrics/main_comparisons.csv (it holds tau)"
    [found] = findings.findings([claim], tmp_path)  # what the run holds is measured
    assert found.verdict == findings.REPRODUCED


@pytest.mark.slow  # one Snakemake process
def test_snakemake_refuses_a_bad_claims_file_before_any_job(tmp_path):
    """The Snakefile validates the claims when it loads, as it does the config: nothing runs."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("Snakefile", "config.yaml"):
        shutil.copy(REPO / name, checkout / name)
    for folder in ("workflow", "dpace", "profiles"):
        shutil.copytree(REPO / folder, checkout / folder, ignore=shutil.ignore_patterns("__pycache__"))
    bad = edited("t1-dpace-above-dflash", lambda c: c.update(verdict={"abvoe": 100}))
    (checkout / "workflow" / "claims.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    config = REPO / "workflow" / "configs" / "smoke.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(checkout / "Snakefile"), "-d", str(tmp_path), "--configfile",
         str(config), "--replace-workflow-config", "--cores", "1", "-n", "all"],
        capture_output=True, text=True, timeout=300, cwd=checkout,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-2000:]
    line = next(line for line in output.splitlines() if "invalid claims:" in line)
    assert "claim 't1-dpace-above-dflash': verdict: unknown key(s) ['abvoe']" in line
    assert not (tmp_path / "results").exists()


def test_the_comment_atop_the_claims_file_names_every_key_of_the_schema():
    """The comment block is the claims file's own documentation: every key the schema allows is named in it."""
    from dpace.claims import load_schema

    lines = CLAIMS.read_text().splitlines()
    header = "\n".join(lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))])
    schema = load_schema()["$defs"]
    keys = set(schema["claim"]["properties"]) | set(schema["verdict"]["properties"])
    keys |= set(schema["measure"]["properties"]["kind"]["enum"])
    for kind in ("comparison", "contrast", "step_time", "weight_shift", "gradient"):
        keys |= set(schema[kind]["properties"])
    missing = sorted(k for k in keys if not re.search(rf"(#\s+|`|\b){re.escape(k)}\b", header))
    assert not missing, missing


def test_a_claim_of_an_experiment_the_run_does_not_configure_is_not_run_for_that_reason(tmp_path):
    """Not run only where the claim's experiment is not in the run's config (or its artifacts are not built), and
    then never scored from a metrics file an earlier run with another config left behind."""
    claims = {c["id"]: c for c in SHIPPED}
    main, ablation = claims["t1-dpace-above-dflash"], claims["t3-cumulative-only-10-12pct"]
    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3)])
    write_comparisons(tmp_path, [comparison_row(1, 0.2, 0.1, 0.3, experiment="ablation", benchmark="math500")],
                      experiment="ablation")  # a stale file of another config's run
    found = {f.claim["id"]: f for f in findings.findings([main, ablation], tmp_path, experiments=["main"])}
    assert found[main["id"]].verdict == findings.REPRODUCED
    assert found[ablation["id"]].verdict == NOT_RUN
    assert found[ablation["id"]].note == "experiment 'ablation' is not in this run's config (experiments: main)"
    out = tmp_path / "findings.md"
    findings.write_findings(CLAIMS, tmp_path, out, config_name="smoke.yaml", commit="abc", experiments=["main"])
    page = out.read_text()
    assert "experiment 'ablation' is not in this run's config" in page
    assert "experiment 'main' is not" not in page
