"""The Snakemake DAG without the smoke run: plans of other configs, and runs of single targets.

A file of its own so that pytest-xdist runs it beside ``test_workflow.py``'s smoke run.
"""

from __future__ import annotations

import json
import re
import subprocess

import pandas as pd
import pytest
import yaml
from workflow_runs import MIRROR, planned_jobs, snakemake, write_config

# Every test here runs Snakemake: `-m "not slow"` leaves them out.
pytestmark = pytest.mark.slow


def test_default_dry_run_shares_one_features_job(tmp_path, mirror):
    result = snakemake(tmp_path, write_config(tmp_path, "config.yaml"), "-n", "results/table_main.tex")
    jobs = planned_jobs(result)
    assert jobs["features"] == 1 and jobs["generate_responses"] == 1 and jobs["training_prompts"] == 1
    # the default's chat + code mixture is one data set, answered and captured once
    assert "results/features/smollm2-135m/sharegpt+codealpaca" in result.stdout
    assert jobs["train_drafter"] == 4 and jobs["evaluate"] == 4  # Table 1's four objectives at one depth
    assert jobs["benchmark_prompts"] == 6
    # The default workflow profile (rerun-incomplete, for the README's way back after a crash) is found
    # next to the Snakefile, whatever the working directory.
    assert re.search(r"Using workflow specific profile (\S*/)?profiles/default ", result.stderr), result.stderr


def test_rerunning_one_ablation_target_builds_only_ablation_drafters(tmp_path, mirror):
    jobs = planned_jobs(snakemake(tmp_path, write_config(tmp_path), "-n", "results/table_ablation.tex"))
    assert jobs["train_drafter"] == 4  # dflash, continuation-only, cumulative-only, dpace
    assert jobs["evaluate"] == 4 + 4  # final full suite + MATH-500 after epoch 1 for each


def test_training_seeds_plan_every_drafter_at_each_seed_on_the_same_answers(tmp_path, mirror):
    result = snakemake(tmp_path, write_config(tmp_path, **{"train.seeds": 2}), "-n", "results/table_main.tex")
    jobs = planned_jobs(result)
    assert jobs["train_drafter"] == 8 and jobs["evaluate"] == 8  # Table 1's four objectives, two seeds each
    assert jobs["features"] == 1 and jobs["generate_responses"] == 1  # one set of answers for both seeds
    drafters = set(re.findall(r"results/drafters/tiny/([\w.-]+)/summary\.json", result.stdout))
    firsts = {d for d in drafters if not d.endswith("-s1")}
    assert len(firsts) == 4 and drafters == firsts | {f"{d}-s1" for d in firsts}


def evaluation_inputs(result: subprocess.CompletedProcess) -> dict[str, list[str]]:
    """Each planned evaluate job's output summary -> its input files, from a dry run's job listing."""
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = {}
    for block in (result.stdout + result.stderr).split("rule evaluate:")[1:]:
        inputs = re.search(r"^\s+input: (.*)$", block, re.MULTILINE).group(1).split(", ")
        output = re.search(r"^\s+output: (.*)$", block, re.MULTILINE).group(1).split(", ")[0]
        jobs[output] = inputs
    return jobs


def test_evaluations_share_one_autoregressive_baseline_where_it_covers_their_requests(tmp_path, mirror):
    baseline = "results/eval/tiny/autoregressive-baseline.jsonl"
    # Smoke benchmarks hold MATH-500: the ablation's per-epoch MATH-500 (T=0) evaluations read it too.
    result = snakemake(tmp_path, write_config(tmp_path, **{"eval.baseline": "shared"}), "-n", "results/table_ablation.tex")
    assert planned_jobs(result)["autoregressive_baseline"] == 1
    evaluations = evaluation_inputs(result)
    assert len(evaluations) == 8 and all(baseline in inputs for inputs in evaluations.values())
    # Without MATH-500 among the benchmarks the baseline does not time it: those evaluations decode their own.
    result = snakemake(tmp_path, write_config(tmp_path, **{"data.benchmarks": ["mt_bench"], "eval.baseline": "shared"}),
                       "-n", "results/table_ablation.tex")
    evaluations = evaluation_inputs(result)
    assert {"/trajectory/" in out for out in evaluations} == {True, False}
    for output, inputs in evaluations.items():
        assert (baseline in inputs) == ("/full/" in output), (output, inputs)
    # eval.baseline per-drafter (the default) with tau decoded: no shared job, every evaluation times its own
    # autoregressive pass.
    result = snakemake(tmp_path, write_config(tmp_path, **{"eval.tau": "decode"}), "-n", "results/table_ablation.tex")
    assert "autoregressive_baseline" not in planned_jobs(result)
    assert not any(baseline in inputs for inputs in evaluation_inputs(result).values())
    # Replayed tau (the default): the baseline job computes the answers and features every evaluation replays.
    result = snakemake(tmp_path, write_config(tmp_path), "-n", "results/table_ablation.tex")
    assert planned_jobs(result)["autoregressive_baseline"] == 1
    features = "results/eval/tiny/reference-features.pt"
    assert all(baseline in inputs and features in inputs for inputs in evaluation_inputs(result).values())


def test_a_target_with_released_answers_imports_them_instead_of_generating(tmp_path, mirror):
    """targets.<t>.responses (the paper's Qwen3-4B: z-lab/qwen3-4b-instruct-100k), here a local file."""
    answers = tmp_path / "released-answers.jsonl"
    rows = [json.loads(line) for line in (MIRROR / "train" / "sharegpt.jsonl").read_text().splitlines()[:40]]
    answers.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = write_config(tmp_path, **{"targets.tiny.responses": str(answers), "data.train_prompts": {"sharegpt": 8, "codealpaca": 4}})
    jobs = planned_jobs(snakemake(tmp_path, config, "-n", "results/table_main.tex"))
    assert jobs["import_responses"] == 1 and "generate_responses" not in jobs and "training_prompts" not in jobs
    result = snakemake(tmp_path, config, "results/features/tiny/released-answers")
    assert result.returncode == 0, result.stderr[-3000:]
    imported = [json.loads(line) for line in (tmp_path / "results/responses/tiny/released-answers.jsonl").open()]
    assert len(imported) == 12
    by_id = {row["id"]: row for row in rows}
    for row in imported:  # the released answer, not a regenerated one
        source = by_id[row["id"]]["conversations"]
        assert row["conversations"][1]["content"] == next(t["value"] for t in source if t["from"] == "gpt")
    from dpace.features import load_features

    features = load_features(tmp_path / "results/features/tiny/released-answers")
    assert 0 < len(features) <= 12  # long ones truncated; only those left with < 2 response tokens are dropped


def test_block_records_come_from_the_local_decoder_when_sglang_serves(tmp_path, mirror):
    """eval.backend sglang: the 'blocks' suite (Table 8, Figure 1a) still decodes in-process, so it
    runs here without SGLang and records per-block q."""
    from dpace.config import experiments

    config_path = write_config(tmp_path, **{"eval.backend": "sglang", "train.sliding_window": 0})
    config = yaml.safe_load(config_path.read_text())
    dflash = next(v for v in experiments(config)["main"].variants if v.objective == "dflash")
    summary = f"results/eval/tiny/{dflash.id}/epoch-{dflash.epochs}/blocks/summary.json"
    result = snakemake(tmp_path, config_path, summary)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / summary).read_text())
    assert [(r["benchmark"], r["temperature"]) for r in rows] == [("math500", 0.0)]
    assert rows[0].get("engine", "local") == "local"
    blocks = pd.read_csv(tmp_path / summary.replace("summary.json", "blocks.csv"))
    assert len(blocks) > 0 and {"tau_block", "benchmark"} <= set(blocks.columns)
    assert blocks["tau_block"].between(1, dflash.block_size).all()
