"""Cluster submission (issue 57): what each job asks SLURM for (dry runs through the SLURM executor
plugin's own sbatch builder), and real submissions to a one-node SLURM cluster with accounting
(workflow/cluster/slurm.sh): the smoke `all`, a cancelled and a timed-out training job, a killed Snakemake.

The real-cluster tests need root and apt-get (the script installs slurm-wlm, slurmdbd, munge and
mariadb-server); DPACE_SKIP_CLUSTER=1 skips them, except under CI=true, where they always run."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from test_profiles import GPU_RULES, planned_jobs
from workflow_runs import shared_smoke_all, write_config

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
    # Table 7's step timing runs the local training loop only; the paper trains with SpecForge (no such job)
    assert {rule for rule, _ in commands} >= set(GPU_RULES) - {"step_timing"}
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


# ---------------------------------------------------------------------------------------------------------
# A real one-node cluster (workflow/cluster/slurm.sh): submissions through workflow/profiles/slurm

TARGET = "all"  # the smoke config's every table, figure and the scorecard
TABLE = "results/table_main.tex"
# measured times: the only metrics, columns and tables two runs may differ in (SR, decode and training times)
TIMING = ["speedup", "ar_tpot_s", "spec_tpot_s", "time_per_epoch_s", "time_per_step_s", "step_time_s"]
TIMED_TABLES = {"table_main", "table_cross_model", "table_block_size", "table_target_prob", "table_training_time"}
TIMED_FILES = ("step-timing.csv",)  # the drafters folder's Table 7 step timing


@pytest.fixture(scope="module")
def slurm() -> dict[str, str]:
    """Brings the cluster up (idempotent; .ci/run already did under CI) and returns the environment of a
    submission: the README's (section "On a cluster") account, partition and node size."""
    if os.environ.get("CI") != "true":
        if os.environ.get("DPACE_SKIP_CLUSTER") == "1":
            pytest.skip("DPACE_SKIP_CLUSTER=1")
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip("a test cluster needs root and apt-get (bash workflow/cluster/slurm.sh up)")
    up = subprocess.run(["bash", str(SLURM_SCRIPT), "up"], capture_output=True, text=True, timeout=1200)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    cpus, mem_mb = subprocess.run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%c %m"], capture_output=True,
                                  text=True, check=True).stdout.split()[:2]
    return {**os.environ, "PYTHONPATH": str(REPO), "SLURM_ACCOUNT": ACCOUNT, "SLURM_PARTITION": PARTITION,
            "DPACE_SLURM_CPUS": cpus, "DPACE_SLURM_MEM_MB": mem_mb}


def readme_cluster_commands() -> list[list[str]]:
    """The `snakemake` command lines of README's "On a cluster" section, in order."""
    text = (REPO / "README.md").read_text()
    section = text.split("## On a cluster", 1)[1].split("\n## ", 1)[0]
    return [line.split("#")[0].split() for line in section.splitlines() if line.startswith("snakemake ")]


def cluster_run(workdir: Path, config: Path, args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """A README command line (its snakemake arguments) run on the test's workdir and config, in the
    background, in its own process group, its output in ``log``."""
    args = list(args)
    if "--configfile" in args:  # the README's config file -> the test's copy of it (absolute mirror)
        args[args.index("--configfile") + 1] = str(config)
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    if "--configfile" not in args:
        command[5:5] = ["--configfile", str(config), "--replace-workflow-config"]
    with log.open("a") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def finish(run: subprocess.Popen, log: Path, timeout: int = 1200) -> str:
    try:
        run.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=120)
    text = log.read_text(errors="replace")
    assert run.returncode == 0, text[-5000:]
    return text


def slurm_ids(text: str) -> list[str]:
    return re.findall(r"has been submitted with SLURM jobid (\d+)", text)


def sacct(ids: list[str]) -> list[dict[str, str]]:
    """One row per SLURM job (its allocation, -X): id, comment (rule_<rule>[_wildcards_...]), state, CPUs."""
    fields = ["JobID", "Comment", "State", "AllocCPUS", "ElapsedRaw"]
    for _ in range(30):  # slurmdbd records a job's end within seconds
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(ids), f"--format={','.join(fields)}"],
                             capture_output=True, text=True, check=True).stdout
        rows = [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines() if line]
        if len(rows) == len(ids) and not any(r["State"] in ("PENDING", "RUNNING") for r in rows):
            return rows
        time.sleep(2)
    raise AssertionError(f"sacct does not list jobs {ids} as ended: {rows}")


def rule_of(comment: str) -> str:
    return re.match(r"rule_(\w+?)(?:_wildcards_|$)", comment).group(1)


def file_digests(results: Path, folder: str) -> dict[str, str]:
    root = results / folder
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def same_drafters(first: Path, second: Path) -> None:
    """Every drafter's weights and checksum sidecars byte for byte, and its per-step losses. ``first`` is the
    shared local run, to which tests/test_workflow.py may since have added a training seed's drafter (-s1)."""
    # steps.jsonl and summary.json hold wall times, and the drafter's checksums.json their checksums
    digests = [{k: v for k, v in file_digests(r / "results", "drafters").items()
                if not k.endswith(("steps.jsonl", "summary.json", "/checksums.json", *TIMED_FILES))}
               for r in (first, second)]
    added = sorted(k for k in digests[0].keys() - digests[1].keys() if not re.search(r"-s\d+/", k))
    assert digests[1] and not added and all(digests[0].get(k) == v for k, v in digests[1].items()), added
    for steps in sorted((second / "results" / "drafters").rglob("steps.jsonl")):
        other = first / steps.relative_to(second)
        losses = [[json.loads(line)["loss"] for line in path.read_text().splitlines()] for path in (steps, other)]
        assert losses[0] == losses[1], steps


@pytest.fixture(scope="module")
def smoke_all_runs(slurm, tmp_path_factory, mirror) -> dict:
    """README's cluster lines on `all` of the smoke config (only the environment changes: account,
    partition, node size), with the submitting Snakemake killed mid-way (SIGKILL: a closed login session)
    and README's recovery lines; and the local run of the same config that tests/test_workflow.py reads
    (``shared_smoke_all``: made once per session, by whichever module asks first)."""
    tmp_path = tmp_path_factory.mktemp("smoke_all")
    submit, unlock, again = readme_cluster_commands()
    assert submit == again and unlock == ["snakemake", "--unlock"], (submit, unlock, again)
    assert submit[-1] == TARGET and "--workflow-profile" in submit
    config = write_config(tmp_path)
    cluster_dir, cluster_log = tmp_path / "cluster", tmp_path / "cluster.log"
    run = cluster_run(cluster_dir, config, submit[1:], slurm, cluster_log)
    deadline = time.monotonic() + 900
    while "rule_train_drafter" not in cluster_log.read_text(errors="replace") and run.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(1)
    os.killpg(run.pid, signal.SIGKILL)  # Snakemake dies; its submitted SLURM jobs go on
    run.wait()
    killed = cluster_log.read_text(errors="replace")
    assert "rule_train_drafter" in killed, killed[-3000:]
    for step in (unlock, again):
        text = finish(cluster_run(cluster_dir, config, step[1:], slurm, cluster_log), cluster_log)
    assert "Nothing to be done" not in text.rsplit("Building DAG", 1)[-1]
    local_dir, _, local_text = shared_smoke_all(tmp_path_factory)
    return {"local": local_dir, "cluster": cluster_dir, "killed": killed, "local_text": local_text,
            "cluster_text": cluster_log.read_text(errors="replace")}


@pytest.mark.slow  # a SLURM run and a local run of the smoke `all` (about 8 minutes)
def test_smoke_all_through_slurm_equals_a_local_run_after_a_killed_snakemake(smoke_all_runs):
    """Every job but the local rules ran as one SLURM job (sacct, by its rule), the killed run recovered
    with README's lines, and drafters, every metrics CSV and every table equal the local run's (but for
    what is timed: SR, decode and training times)."""
    local_dir, cluster_dir = smoke_all_runs["local"], smoke_all_runs["cluster"]
    # sacct: every non-local job of the run's plan completed as a SLURM job named by its rule; a job runs
    # twice only when it was running as Snakemake died (its rerun is the recovery's)
    rows = sacct(slurm_ids(smoke_all_runs["cluster_text"]))
    stats = smoke_all_runs["local_text"].split("Job stats:")[1]
    planned = {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", stats, re.M)
               if rule not in LOCAL_RULES and rule != "total"}
    completed: dict[str, set[str]] = {}
    for row in rows:
        if row["State"] == "COMPLETED":
            completed.setdefault(rule_of(row["Comment"]), set()).add(row["Comment"])
    assert {rule: len(c) for rule, c in completed.items()} == planned, rows
    killed_ids = set(slurm_ids(smoke_all_runs["killed"]))
    repeated = {r["Comment"] for r in rows if sum(o["Comment"] == r["Comment"] for o in rows) > 1}
    for comment in repeated:
        assert any(r["JobID"] in killed_ids and r["Comment"] == comment for r in rows), (comment, rows)
    assert not LOCAL_RULES & {rule_of(r["Comment"]) for r in rows}

    same_drafters(local_dir, cluster_dir)
    names = [sorted(p.name for p in (d / "results" / "metrics").glob("*.csv")) for d in (local_dir, cluster_dir)]
    assert "main_comparisons.csv" in names[0] and names[0] == names[1]
    for name in names[0]:
        frames = [pd.read_csv(d / "results" / "metrics" / name) for d in (local_dir, cluster_dir)]
        if "metric" in frames[0].columns:  # the comparisons: a row per metric; speedup is timed
            frames = [f[~f["metric"].isin(TIMING)].reset_index(drop=True) for f in frames]
            assert len(frames[0]) and "tau" in set(frames[0]["metric"]), name
        columns = [c for c in frames[0].columns if c not in TIMING]
        pd.testing.assert_frame_equal(frames[0][columns], frames[1][columns], obj=name)
    tables = [sorted(p.stem for p in (d / "results").glob("table_*.tex")) for d in (local_dir, cluster_dir)]
    assert TIMED_TABLES < set(tables[0]) and tables[0] == tables[1]
    for name in set(tables[0]) - TIMED_TABLES:  # tables of tau, weights and correlations: byte for byte
        assert (local_dir / "results" / f"{name}.tex").read_text() == (cluster_dir / "results" / f"{name}.tex").read_text(), name
    from test_workflow import tau_cells
    main = [(d / TABLE).read_text() for d in (local_dir, cluster_dir)]
    assert tau_cells(main[0]) and tau_cells(main[0]) == tau_cells(main[1])

# A drafter that trains long enough (200 steps, tens of seconds on 2 cores) to be cancelled after its first
# saved state, and its resubmission frozen after its own (the freeze, not the length, outlives the limit),
# from the smoke data (the runs above made its target, answers and features); threads from the stage
# table (job_threads unset: the fallback a cluster executor needs, which leaves Snakemake's cores unset).
FAULT_EPOCHS = 100
FAULT = {"job_threads": None, "train.epochs": FAULT_EPOCHS, "train.num_anchors": 64, "train.save_every_steps": 4}
FAULT_DRAFTER = f"dpace-alpha0.5-d1-b4-e{FAULT_EPOCHS}"


def running_jobs(rule: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %k"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if len(line.split()) > 1 and rule_of(line.split()[1]) == rule]


def job_processes(job_id: str) -> set[int]:
    """The processes of a SLURM job on this one-node cluster: those whose environment names it (but SLURM's
    own step daemons, which enforce the time limit)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() not in ("slurmstepd", "slurmd") \
                    and f"SLURM_JOB_ID={job_id}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                pids.add(int(proc.name))
        except OSError:  # ended meanwhile
            pass
    return pids


def freeze_job(job_id: str) -> set[int]:
    """SIGSTOP every process of the job, until a scan finds no new one (a child forked before its parent
    stopped): the job then stays RUNNING, without progress, until its time limit, however fast this CPU."""
    frozen: set[int] = set()
    while new := job_processes(job_id) - frozen:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= new
    return frozen


def wait_for(condition, what: str, run: subprocess.Popen, log: Path, timeout: float = 900):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        assert run.poll() is None, f"the run ended before {what}: " + log.read_text(errors="replace")[-3000:]
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow  # a SLURM run and a local run of one training (minutes: a frozen job waits out its limit)
def test_a_cancelled_and_a_timed_out_training_job_resume_to_the_same_drafter(slurm, smoke_all_runs, tmp_path):
    """scancel of the running training job, then its resubmission hitting a 1-minute runtime limit: each
    time Snakemake resubmits it (README's command, the profile's retries raised to 2 for the two faults)
    and it resumes from its last saved state; the drafter equals a local uninterrupted run's. The resubmission is
    frozen (SIGSTOP) once it has saved a state, so it reaches the limit on any CPU."""
    # the local reference trains in a copy of the shared local run (test_workflow.py runs Snakemake in it);
    # Snakemake's lock and incomplete markers of a run in progress there stay behind
    local_dir, cluster_dir = tmp_path / "local", smoke_all_runs["cluster"]
    shutil.copytree(smoke_all_runs["local"], local_dir, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    submit = readme_cluster_commands()[0]
    config = write_config(tmp_path, **FAULT)
    target = f"results/drafters/tiny/{FAULT_DRAFTER}/summary.json"
    cpus = slurm["DPACE_SLURM_CPUS"]
    local_log, cluster_log = tmp_path / "local.log", tmp_path / "cluster.log"
    local = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(local_dir), "--configfile",
         str(config), "--replace-workflow-config", "--cores", cpus, target],  # threads = the node's cores
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=local_log.open("w"), stderr=subprocess.STDOUT)
    options = [a for a in submit[1:-1] if a != "--"]  # README's options, its target replaced
    args = [*options, "--retries", "2", "--set-resources", "train_drafter:runtime=[60, 1, 60][attempt - 1]", "--",
            target]
    run = cluster_run(cluster_dir, config, args, slurm, cluster_log)
    state = cluster_dir / "results" / "scratch" / "train" / "tiny" / FAULT_DRAFTER / "state.pt"
    first = wait_for(lambda: state.exists() and running_jobs("train_drafter"), "a saved training state", run, cluster_log)
    subprocess.run(["scancel", first[0]], check=True)
    second = wait_for(lambda: [j for j in running_jobs("train_drafter") if j != first[0]], "the resubmission", run,
                      cluster_log)
    # the resubmission resumes and saves a state of its own; then it is frozen, so that it reaches its 1-minute
    # limit mid-training on any CPU (a fast one had finished the remaining steps inside the minute)
    saved = state.stat().st_mtime_ns
    wait_for(lambda: state.stat().st_mtime_ns != saved or not running_jobs("train_drafter"),
             "a state saved by the resubmission", run, cluster_log)
    assert running_jobs("train_drafter") == second, "the resubmission ended before it could be frozen"
    assert freeze_job(second[0])
    text = finish(run, cluster_log)
    finish(local, local_log)

    rows = [r for r in sacct(slurm_ids(text)) if rule_of(r["Comment"]) == "train_drafter"]
    assert [r["State"].split()[0] for r in rows] == ["CANCELLED", "TIMEOUT", "COMPLETED"], rows
    assert rows[1]["JobID"] == second[0] and int(rows[1]["ElapsedRaw"]) >= 60, rows
    # threads: the stage table's 16 cores at most the node's, asked for and used
    assert {r["AllocCPUS"] for r in rows} == {cpus}, rows
    summary = json.loads((cluster_dir / target).read_text())
    assert summary["config"]["threads"] == int(cpus)
    log = (cluster_dir / "results" / "logs" / "train" / "tiny" / f"{FAULT_DRAFTER}.log").read_text(errors="replace")
    resumed_at = int(re.search(r"train dpace[^|\n]*\|[^|\n]*\| *(\d+)/\d+ \[", log).group(1))  # the last attempt's progress bar starts there
    assert 0 < resumed_at < summary["steps"], resumed_at
    digests = [file_digests(d / "results" / "drafters" / "tiny", FAULT_DRAFTER) for d in (local_dir, cluster_dir)]
    digests = [{k: v for k, v in d.items() if not k.endswith(("steps.jsonl", "summary.json")) and k != "checksums.json"
                and not k.endswith("/checksums.json")} for d in digests]
    assert len([k for k in digests[0] if k.endswith("model.safetensors")]) == FAULT_EPOCHS, sorted(digests[0])
    assert digests[0] == digests[1]
    losses = [[json.loads(line)["loss"] for line in (d / "results" / "drafters" / "tiny" / FAULT_DRAFTER /
                                                    "steps.jsonl").read_text().splitlines()] for d in (local_dir, cluster_dir)]
    assert losses[0] == losses[1]
