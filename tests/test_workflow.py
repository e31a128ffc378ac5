"""The Snakemake DAG: planning, caching, and one real end-to-end run of the smoke config."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
MIRROR = REPO.parent / "shared" / "data"


def write_config(path: Path, name: str = "smoke.yaml", **overrides) -> Path:
    """The repo's config ``name`` with an absolute mirror path and nested overrides applied."""
    config = yaml.safe_load((REPO / "workflow" / "configs" / name).read_text()) if name != "config.yaml" \
        else yaml.safe_load((REPO / "config.yaml").read_text())
    config["data"]["mirror"] = str(MIRROR)
    for dotted, value in overrides.items():
        node = config
        keys = dotted.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    out = path / f"config-{abs(hash(json.dumps(overrides, sort_keys=True)))}.yaml"
    out.write_text(yaml.safe_dump(config))
    return out


def snakemake(workdir: Path, configfile: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
        "--configfile", str(configfile), "--cores", "2", *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run as {rule: count}."""
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout + result.stderr
    if "Nothing to be done" in text:
        return {}
    stats = text.split("Job stats:")[1]
    jobs = {}
    for line in stats.splitlines()[3:]:
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not match:
            break
        jobs[match.group(1)] = int(match.group(2))
    jobs.pop("total", None)
    return jobs


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One real run of the smoke DAG up to Table 1 (tiny random target, a few training steps)."""
    if not (MIRROR / "benchmarks").exists():
        pytest.skip("data mirror missing")
    workdir = tmp_path_factory.mktemp("smoke")
    config = write_config(workdir)
    result = snakemake(workdir, config, "results/table_main.tex")
    assert result.returncode == 0, result.stderr[-4000:]
    return workdir, config


def test_default_dry_run_shares_one_features_job(tmp_path):
    jobs = planned_jobs(snakemake(tmp_path, write_config(tmp_path, "config.yaml"), "-n", "results/table_main.tex"))
    assert jobs["features"] == 1 and jobs["generate_responses"] == 1
    assert jobs["train_drafter"] == 4 and jobs["evaluate"] == 4  # Table 1's four objectives at one depth
    assert jobs["benchmark_prompts"] == 6


def test_smoke_table_holds_every_measured_cell(smoke_run):
    workdir, _ = smoke_run
    table = (workdir / "results" / "table_main.tex").read_text()
    metrics = pd.read_csv(workdir / "results" / "metrics" / "main.csv")
    assert set(metrics["objective"]) == {"dflash", "topk-prefix", "accept-rate", "dpace"}
    assert len(metrics) == 4 * 6 * 2  # objectives x benchmarks x temperatures
    # Every measured tau appears in the table, rounded as printed.
    for tau in metrics["tau"]:
        assert f"{tau:.2f}" in table
    rows = [line for line in table.splitlines() if "&" in line and ("DFlash" in line or "D-PACE" in line
            or "Top-" in line or "Accept-rate" in line)]
    assert len(rows) == 8  # 4 methods x 2 temperatures
    assert all(row.count("&") == 15 for row in rows)


def test_smoke_decoding_is_lossless_at_t0(smoke_run):
    workdir, _ = smoke_run
    metrics = pd.read_csv(workdir / "results" / "metrics" / "main.csv")
    greedy = metrics[metrics["temperature"] == 0.0]
    assert len(greedy) == 24 and (greedy["greedy_mismatches"] == 0).all()
    assert (metrics["tau"] >= 1.0).all() and (metrics["speedup"] > 0).all()


def test_smoke_checkpoints_load_into_dflash(smoke_run):
    from dpace.drafter import load_drafter

    workdir, _ = smoke_run
    drafters = sorted((workdir / "results" / "drafters" / "tiny").iterdir())
    assert len(drafters) == 4
    for drafter in drafters:
        model = load_drafter(drafter / "epoch-1")
        assert model.block_size == 4
        steps = [json.loads(line) for line in (drafter / "steps.jsonl").read_text().splitlines()]
        assert steps and all(len(row["weight_per_position"]) == 4 for row in steps)
        assert steps[0]["weight_per_position"][0] == 0.0  # the anchor is never supervised


def test_second_run_does_nothing(smoke_run):
    workdir, config = smoke_run
    assert planned_jobs(snakemake(workdir, config, "-n", "results/table_main.tex")) == {}


def test_changing_one_hyperparameter_plans_only_that_variant(smoke_run):
    workdir, _ = smoke_run
    changed = write_config(workdir, **{"train.objective_hparams": {"dflash": {"gamma": 2.0}, "dpace": {"alpha": 0.3}}})
    result = snakemake(workdir, changed, "-n", "results/table_main.tex")
    jobs = planned_jobs(result)
    assert jobs == {"train_drafter": 1, "evaluate": 1, "group_metrics": 1, "table_main": 1}
    assert "dpace-alpha0.3" in result.stdout
