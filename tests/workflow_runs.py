"""Snakemake runs for the workflow tests: a config with overrides, a run with a canary secret, a plan."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

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


SECRET = "hf_dpace_canary_do_not_log"


def snakemake_command(workdir: Path, configfile: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a Snakemake run of ``configfile`` in ``workdir``."""
    command = [
        sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
        "--configfile", str(configfile), "--replace-workflow-config", "--cores", "2", *args,
    ]
    # A hub token in the environment, as on a real cluster: it must never reach params, logs or results.
    return command, {**os.environ, "HF_TOKEN": SECRET}


def snakemake(workdir: Path, configfile: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    command, env = snakemake_command(workdir, configfile, *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def shared_smoke_all(tmp_path_factory) -> tuple[Path, Path, str]:
    """A local run of the smoke config's `all`, made once per test session and shared by the modules that read
    one (test_workflow's tests; test_cluster's reference for the same DAG through SLURM), across xdist workers
    too: the first to ask runs it under a file lock in the session's shared temporary folder, the others wait
    for it. Returns (workdir, config file, Snakemake's output). Tests may add to it (a training seed's drafter,
    dry runs) but never change what the run built."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    workdir, done = root / "smoke-all", root / "smoke-all.json"
    with (root / "smoke-all.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            workdir.mkdir(exist_ok=True)
            config = write_config(workdir)
            result = snakemake(workdir, config, "all")
            assert result.returncode == 0, result.stderr[-4000:]
            done.write_text(json.dumps({"config": str(config), "output": result.stdout + result.stderr}))
    record = json.loads(done.read_text())
    return workdir, Path(record["config"]), record["output"]


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


LINDECAY_FUNCTION = '''
# A linear position decay, w_j = 1 - (j-1)/B.
def _lindecay_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits) -> Tensor:
    positions = torch.arange(valid.shape[-1], device=valid.device, dtype=confidence.dtype)
    return (1 - (positions - 1).clamp(min=0) / valid.shape[-1]) * valid.to(confidence.dtype)
'''
LINDECAY_WEIGHTS = '''
    "lindecay": _lindecay_weights,
}'''
LINDECAY_RECORD = '''
    Objective("lindecay", "Linear decay", {}, "weight", table_rank=2, color="#bcbd22",
              caption="weights position $j$ by $1-(j-1)/B$"),
)}'''


def with_lindecay(records: str, objectives: str) -> tuple[str, str]:
    """dpace/objective_records.py's ``records`` and dpace/training/objectives.py's ``objectives`` with
    docs/objectives.md's recipe applied for ``lindecay``: one record at the registry's end, one weight function
    above ``WEIGHTS`` and its entry at the end of ``WEIGHTS``."""
    end = records.index("\n)}", records.index("REGISTRY: dict[str, Objective]"))
    records = records[:end] + LINDECAY_RECORD + records[end + len("\n)}"):]
    weights = objectives.index("# Each objective's weight function")
    objectives = objectives[:weights] + LINDECAY_FUNCTION.lstrip("\n") + "\n\n" + objectives[weights:]
    end = objectives.index("\n}", objectives.index("WEIGHTS: dict["))
    return records, objectives[:end] + LINDECAY_WEIGHTS + objectives[end + len("\n}"):]


SMOKE = yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())
BENCHMARKS = SMOKE["data"]["benchmarks"]
TEMPERATURES = SMOKE["eval"]["temperatures"]
