"""The paper config planned with the local and the SLURM profiles (dry runs, no cluster, no GPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "workflow" / "configs" / "paper.yaml"
# paper.yaml: sglang, specforge, local bf16 (the shared AR baseline times on the evaluation's GPU)
GPU_RULES = {"generate_responses": 1, "train_drafter": 2, "autoregressive_baseline": 1, "evaluate": 1,
             "speedup_timing": 1, "step_timing": 1}
# Table 1's Qwen3-4B trains on the DFlash authors' released answers: imported, not generated.
TABLE_1_JOBS = {"benchmark_prompts": 6, "prepare_target": 1, "import_responses": 1,
                "features": 1, "train_drafter": 8, "evaluate": 8, "experiment_metrics": 1,
                # replayed tau: the target's answers and features, once, shared by every evaluation
                "autoregressive_baseline": 1,
                # SR: Table 1's drafters timed together, interleaved (one job per target)
                "speedup_timing": 1}


def dry_run(tmp_path: Path, profile: str, target: str) -> str:
    env = {**os.environ, "SLURM_ACCOUNT": "fake_account", "SLURM_PARTITION": "fake_partition"}
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
               "--configfile", str(PAPER), "--workflow-profile", str(REPO / "workflow" / "profiles" / profile),
               "-n", target]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def planned_wildcards(text: str, rule: str) -> list[str]:
    return re.findall(rf"rule {rule}:\n(?:.*\n)*?\s+wildcards: (.*)", text)


def planned_jobs(text: str) -> list[tuple[str, dict]]:
    """Every planned job as (rule, resources)."""
    jobs = []
    for block in re.split(r"\n(?=\[[^\]]*\]\n(?:local)?rule )", text):
        match = re.search(r"^(?:local)?rule (\w+):", block, re.MULTILINE)
        if not match or "Job stats" in block.split("\n", 1)[0]:
            continue
        resources = {}
        found = re.search(r"^\s+resources: (.*)$", block, re.MULTILINE)
        if found:
            for item in found.group(1).split(", "):
                key, _, value = item.partition("=")
                resources[key] = value
        jobs.append((match.group(1), resources))
    return jobs


def job_counts(jobs) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rule, _ in jobs:
        counts[rule] = counts.get(rule, 0) + 1
    return counts


def check_gpu_resources(jobs, *, slurm: bool) -> None:
    for rule, resources in jobs:
        if rule in GPU_RULES:
            assert int(resources["gpu"]) >= 1, (rule, resources)
            if slurm:
                assert int(resources["gpu"]) == GPU_RULES[rule], (rule, resources)
                assert resources["gpu_model"] == {"generate_responses": "h200", "train_drafter": "h200",
                                                  "autoregressive_baseline": "l40s", "evaluate": "l40s",
                                                  "speedup_timing": "l40s", "step_timing": "h200"}[rule]
        else:  # data, target, features, metrics, tables and figures: no GPU
            assert int(resources.get("gpu", 0)) == 0 and "gpu_model" not in resources, (rule, resources)
        if slurm and rule not in ("all",):
            assert resources.get("slurm_account") == "fake_account", (rule, resources)
            assert resources.get("slurm_partition") == "fake_partition", (rule, resources)


@pytest.mark.slow  # Snakemake dry runs of the paper config
@pytest.mark.parametrize("profile", ["local", "slurm"])
def test_table_1_plan(tmp_path, profile):
    jobs = planned_jobs(dry_run(tmp_path, profile, "results/table_main.tex"))
    counts = job_counts(jobs)
    for rule, count in TABLE_1_JOBS.items():
        assert counts.get(rule) == count, (rule, counts)
    assert sum(counts.values()) == sum(TABLE_1_JOBS.values()) + 1  # + the table itself
    check_gpu_resources(jobs, slurm=profile == "slurm")
    if profile == "local":
        # One machine with the profile's single gpu token: GPU jobs run one at a time.
        assert all(int(r["gpu"]) == 1 for rule, r in jobs if rule in GPU_RULES)


@pytest.mark.slow  # Snakemake dry runs of the paper config
@pytest.mark.parametrize("profile", ["local", "slurm"])
def test_everything_plan(tmp_path, profile):
    text = dry_run(tmp_path, profile, "all")
    jobs = planned_jobs(text)
    counts = job_counts(jobs)
    # 'all' holds at least Table 1's jobs, with more drafters (every experiment) on three targets.
    for rule, count in TABLE_1_JOBS.items():
        assert counts.get(rule, 0) >= count, (rule, counts)
    assert counts["prepare_target"] == 3 and counts["features"] == 3
    # Qwen3-4B imports z-lab/qwen3-4b-instruct-100k; the other two answer ShareGPT themselves.
    assert sorted(planned_wildcards(text, "generate_responses")) == [
        "target=llama3.1-8b, dataset=sharegpt", "target=qwen3-8b, dataset=sharegpt"]
    assert planned_wildcards(text, "import_responses") == ["target=qwen3-4b, dataset=qwen3-4b-instruct-100k"]
    # The paper's protocol evaluates in-process (eval.backend local), which records per-block q with
    # every evaluation: no extra MATH-500 'blocks' run for Table 8 / Figure 1a (SGLang would need one).
    assert [w for w in planned_wildcards(text, "evaluate") if w.endswith("suite=blocks")] == []
    assert "local_blocks" not in counts
    assert sorted(planned_wildcards(text, "features")) == [
        "target=llama3.1-8b, dataset=sharegpt", "target=qwen3-4b, dataset=qwen3-4b-instruct-100k",
        "target=qwen3-8b, dataset=sharegpt"]
    assert counts["train_drafter"] >= 30 and counts["evaluate"] > counts["train_drafter"]  # + ablation epochs
    text_targets = [rule for rule in counts if rule not in GPU_RULES and rule not in TABLE_1_JOBS]
    assert text_targets, counts  # tables / figures / metrics rules exist
    check_gpu_resources(jobs, slurm=profile == "slurm")


def _keys_without_comment(path: Path) -> list[str]:
    missing, previous = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and ":" in stripped:
            if "#" not in stripped and not previous.startswith("#"):
                missing.append(stripped)
        previous = stripped
    return missing


@pytest.mark.parametrize("profile", ["local", "slurm"])
def test_every_profile_key_is_commented(profile):
    path = REPO / "workflow" / "profiles" / profile / "profile.yaml"
    assert _keys_without_comment(path) == []


def test_slurm_profile_settings():
    profile = yaml.safe_load((REPO / "workflow" / "profiles" / "slurm" / "profile.yaml").read_text())
    assert profile["executor"] == "slurm" and profile["slurm-logdir"] == "results/logs/slurm"
    assert profile["default-resources"]["slurm_account"] == "$SLURM_ACCOUNT"
    assert profile["default-resources"]["slurm_partition"] == "$SLURM_PARTITION"
    local = yaml.safe_load((REPO / "workflow" / "profiles" / "local" / "profile.yaml").read_text())
    assert local["resources"]["gpu"] >= 1 and "executor" not in local


def test_the_default_profile_reruns_incomplete_jobs():
    """README, "After a crash": `snakemake --unlock`, then the same command, which must rerun a job a kill
    left incomplete. Snakemake 9 reads profiles/default/ next to the Snakefile (not under workflow/)."""
    profile = yaml.safe_load((REPO / "profiles" / "default" / "profile.yaml").read_text())
    # and a source file copied again with the same content reruns nothing (test_tracking.py)
    assert profile == {"rerun-incomplete": True, "max-checksum-file-size": "64MB"}
    for name in ("local", "slurm"):  # an explicit profile replaces the default one: it sets the keys too
        explicit = yaml.safe_load((REPO / "workflow" / "profiles" / name / "profile.yaml").read_text())
        assert {key: explicit.get(key) for key in profile} == profile, name


@pytest.mark.parametrize("tau", ["replay", "decode"])
def test_a_local_cpu_run_gives_replayed_evaluations_one_thread_and_timed_jobs_every_core(tmp_path, tau):
    """Issue 55: a replayed evaluation times nothing and its batch-1 decodes gain little from a second thread, so
    --cores N runs N side by side; a job that times (an evaluation under tau: decode, the speedup timing) keeps
    every core, so that nothing runs beside it."""
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump({"eval": {"tau": tau}}))
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
               "--configfile", str(REPO / "config.yaml"), str(override), "--cores", "4", "-n", "--",
               "results/table_main.tex"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cores = {}
    for rule, resources in planned_jobs(result.stdout + result.stderr):
        if "cpus_per_task" in resources:
            cores.setdefault(rule, set()).add(int(resources["cpus_per_task"]))
    assert cores["evaluate"] == ({1} if tau == "replay" else {4})
    assert cores["train_drafter"] == {4} and cores["speedup_timing"] == {4}
