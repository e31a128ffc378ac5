"""Cluster submission (issue 57): what each job asks SLURM for (dry runs through the SLURM executor
plugin's own sbatch builder), and real submissions to a one-node SLURM cluster with accounting
(workflow/cluster/slurm.sh): the smoke DAG, a cancelled and a timed-out training job, a killed Snakemake.

The real-cluster tests need root and apt-get (the script installs slurm-wlm, slurmdbd, munge and
mariadb-server); DPACE_SKIP_CLUSTER=1 skips them, except under CI=true, where they always run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_profiles import GPU_RULES, planned_jobs
from workflow_runs import write_config

from dpace import cluster

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "workflow" / "profiles" / "slurm"
PAPER = REPO / "workflow" / "configs" / "paper.yaml"
SMOKE = yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())
STAGES = yaml.safe_load((PROFILE / "stages.yaml").read_text())
SLURM_SCRIPT = REPO / "workflow" / "cluster" / "slurm.sh"
ACCOUNT, PARTITION = "dpace", "cpu"  # the script's defaults


def local_rules() -> set[str]:
    """Rules with `localrule: True`: Snakemake runs them on the submitting machine, never through sbatch."""
    rules = set()
    for path in [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]:
        for block in re.split(r"\n(?=rule \w+:)", path.read_text()):
            found = re.match(r"rule (\w+):", block)
            if found and re.search(r"^\s+localrule: True", block, re.M):
                rules.add(found.group(1))
    return rules


LOCAL_RULES = local_rules() | {"all"}


# ---------------------------------------------------------------------------------------------------------
# What a job asks for: dpace.cluster, and the sbatch command lines of dry runs


def test_gpus_only_where_a_stage_uses_them():
    smoke = {**SMOKE, "device": "cpu"}
    for stage in ("generate_responses", "features", "train_drafter", "autoregressive_baseline", "evaluate",
                  "prepare_target"):
        assert cluster.stage_gpus(stage, smoke) == 0, stage
    cuda = {**SMOKE, "device": "cuda"}
    assert [cluster.stage_gpus(s, cuda) for s in ("generate_responses", "features", "train_drafter", "evaluate")] \
        == [1, 1, 1, 1]
    paper = yaml.safe_load(PAPER.read_text())
    assert {s: cluster.stage_gpus(s, paper) for s in GPU_RULES} == GPU_RULES
    assert cluster.stage_gpus("features", paper) == 0  # online features only tokenise
    # the GPU backends use GPUs whatever the device says
    gpu_backends = {**SMOKE, "responses": {"backend": "sglang"}, "train": {"backend": "specforge"},
                    "eval": {"backend": "sglang"}}
    assert [cluster.stage_gpus(s, gpu_backends) for s in ("generate_responses", "train_drafter", "evaluate")] \
        == [1, 2, 1]


def test_stage_resources_from_the_environment_and_an_override_file(tmp_path):
    assert cluster.stage_resources("evaluate", 0, {}) == {"gpu": 0, "mem_mb": STAGES["evaluate"]["mem_mb"]}
    assert cluster.stage_resources("evaluate", 1, {})["gpu_model"] == STAGES["evaluate"]["gpu_model"]
    override = tmp_path / "stages.yaml"
    override.write_text("train_drafter: {partition: long, gpu_model: a100}\n")
    env = {"DPACE_SLURM_CPUS": "2", "DPACE_SLURM_MEM_MB": "8000", "DPACE_SLURM_STAGES": str(override)}
    assert cluster.stage_resources("train_drafter", 2, env) == {
        "gpu": 2, "gpu_model": "a100", "mem_mb": 8000, "slurm_partition": "long"}
    assert cluster.stage_cpus("train_drafter", env) == 2 and cluster.stage_cpus("train_drafter", {}) == 16
    assert cluster.stage_resources("evaluate", 1, {**env, "DPACE_SLURM_GPU_MODEL": "h100"})["gpu_model"] == "h100"
    override.write_text("train_drafter: {gpus: 3}\n")
    with pytest.raises(cluster.ClusterError, match="unknown keys"):
        cluster.stage_resources("train_drafter", 2, env)


def sbatch_command(rule: str, resources: dict) -> str:
    """The sbatch command line the SLURM executor plugin builds for a planned job (its own functions)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    values = {key: int(value) if re.fullmatch(r"\d+", value) else value for key, value in resources.items()}
    job = SimpleNamespace(resources=SimpleNamespace(**values, get=values.get), threads=1, name=rule)
    params = {"run_uuid": "run", "slurm_logfile": "log", "comment_str": f"rule_{rule}",
              "account": f"-A {values['slurm_account']}", "partition": f"-p {values['slurm_partition']}",
              "workdir": "."}
    return get_submit_command(job, params) + set_gres_string(job)


def dry_run_commands(tmp_path: Path, configfile: Path, target: str, env: dict | None = None) -> list[tuple[str, str]]:
    """(rule, sbatch command) of every job a dry run of ``target`` plans through the SLURM profile."""
    env = {**os.environ, "SLURM_ACCOUNT": "fake_account", "SLURM_PARTITION": "fake_partition",
           "PYTHONPATH": str(REPO), **(env or {})}
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
               "--configfile", str(configfile), "--replace-workflow-config", "--workflow-profile", str(PROFILE),
               # --cores: a dry run caps each job's threads at its cores (1 unless given); a submission does not
               "-n", "--cores", "64", "--", target]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [(rule, sbatch_command(rule, resources)) for rule, resources in planned_jobs(result.stdout + result.stderr)
            if rule not in LOCAL_RULES]


def argument(command: str, flag: str) -> str | None:
    found = re.search(rf"(?:^| ){re.escape(flag)}[= ](\S+)", command)
    return found.group(1).strip("'") if found else None


@pytest.mark.slow  # a Snakemake dry run of the paper config
def test_paper_asks_each_stage_for_the_gpus_the_profile_names(tmp_path):
    commands = dry_run_commands(tmp_path, PAPER, "all")
    assert {rule for rule, _ in commands} >= set(GPU_RULES)
    for rule, command in commands:
        assert argument(command, "-p") == "fake_partition" and argument(command, "-A") == "fake_account", command
        if rule in GPU_RULES:
            assert argument(command, "--gpus") == f"{STAGES[rule]['gpu_model']}:{GPU_RULES[rule]}", command
            assert argument(command, "--cpus-per-task") == str(STAGES[rule]["cpus"]), command
            assert argument(command, "--mem") == str(STAGES[rule]["mem_mb"]), command
        else:
            assert "--gpus" not in command and "--gres" not in command, command


@pytest.mark.slow  # Snakemake dry runs
def test_cpu_configs_ask_no_gpu_and_fit_the_node_the_environment_names(tmp_path):
    override = tmp_path / "stages.yaml"
    override.write_text("train_drafter: {partition: long}\n")
    env = {"DPACE_SLURM_CPUS": "2", "DPACE_SLURM_MEM_MB": "8000", "DPACE_SLURM_STAGES": str(override),
           "DPACE_SLURM_GPU_MODEL": "h100"}
    smoke = write_config(tmp_path, job_threads=None)  # threads from the stage table, at most the node's 2 cores
    for config in (smoke, REPO / "config.yaml"):
        commands = dry_run_commands(tmp_path, config, "results/table_main.tex", env)
        for rule, command in commands:
            assert "--gpus" not in command and "--gres" not in command, command
            assert int(argument(command, "--cpus-per-task")) <= 2, command
            assert int(argument(command, "--mem") or 0) <= 8000, command
            assert argument(command, "-p") == ("long" if rule == "train_drafter" else "fake_partition"), command
        assert [argument(c, "--cpus-per-task") for r, c in commands if r == "train_drafter"] == ["2"] * 4
    paper = dry_run_commands(tmp_path, PAPER, "results/table_main.tex", env)
    assert {argument(c, "--gpus") for r, c in paper if r == "train_drafter"} == {"h100:2"}

