"""Issue 56's recovery probes (items 3, 4, 7), with real processes: a second run of the same outputs after
`snakemake --unlock`, the timing lock from sessions with other environments, and what a job's log holds.

Each test was seen failing on the code before its fix (docs/guarantees.md lists them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECRET = "hf_SECRET_TOKEN_123"


def session_env(**changes) -> dict[str, str]:
    """This process's environment as another login session might have it: no DPACE_LOCK_DIR (the machine's
    own lock folder), and ``changes`` (None removes a variable)."""
    env = {key: value for key, value in os.environ.items() if key != "DPACE_LOCK_DIR"}
    env["PYTHONPATH"] = str(REPO)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def hold(name: str, env: dict, rule: str, output: str) -> subprocess.Popen:
    """A process that names its job (rule, output) and holds lock ``name``, with a secret on its command line."""
    code = ("import time; import dpace.locks as locks\n"
            f"locks.set_job({rule!r}, {output!r})\n"
            f"with locks.machine_lock({name!r}):\n print('held', flush=True); time.sleep(120)")
    process = subprocess.Popen([sys.executable, "-c", code, f"--hf-token={SECRET}"], stdout=subprocess.PIPE,
                               text=True, env=env)
    assert process.stdout.readline().strip() == "held"
    return process


# ---------------------------------------------------------------------------------------------
# Item 4: one timing lock per machine and device, whatever the session; no command line in its record


def test_a_session_without_xdg_runtime_dir_waits_for_the_timing_lock_of_another_and_sees_no_secret(tmp_path):
    """The holder runs from a login session (XDG_RUNTIME_DIR, one TMPDIR), the second process from a cron-like
    one (no XDG_RUNTIME_DIR, another TMPDIR): the second must find the lock held, and its messages name the
    holder's pid, rule and output, never its command line."""
    from dpace.locks import _lock_path

    for name in ("xdg", "tmp1", "tmp2"):
        (tmp_path / name).mkdir()
    login = session_env(XDG_RUNTIME_DIR=str(tmp_path / "xdg"), TMPDIR=str(tmp_path / "tmp1"))
    cron = session_env(XDG_RUNTIME_DIR=None, TMPDIR=str(tmp_path / "tmp2"))
    where = "from dpace.locks import _lock_path, timing_lock; print(_lock_path(timing_lock('cpu')))"
    paths = [subprocess.run([sys.executable, "-c", where], env=env, capture_output=True, text=True, check=True).stdout
             for env in (login, cron)]
    assert paths[0] == paths[1], paths  # the same file, whatever the session

    name = f"timing-probe{os.getpid()}"  # a timing lock of its own: other runs on this machine keep theirs
    output = str(tmp_path / "results" / "eval" / "summary.json")
    holder = hold(name, login, "evaluate", output)
    try:
        code = ("from dpace.locks import LockTimeout, machine_lock\n"
                f"try:\n with machine_lock({name!r}, timeout_s=1, poll_s=0.05):\n  print('timing while held')\n"
                "except LockTimeout as error:\n print(error)")
        waiter = subprocess.run([sys.executable, "-c", code], env=cron, capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        holder.wait()
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv("DPACE_LOCK_DIR", raising=False)
            _lock_path(name).unlink(missing_ok=True)
    said = waiter.stdout + waiter.stderr
    assert "timing while held" not in said, said
    assert f"held by pid {holder.pid} (rule evaluate, output {output})" in said, said
    assert f"waiting for {name!r}, held by pid {holder.pid} (rule evaluate" in said, said
    assert SECRET not in said and "--hf-token" not in said, said


def test_the_timing_lock_folder_is_shared_by_users_and_the_gpu_and_output_locks_are_each_users(lock_env):
    import stat

    from dpace.locks import lock_dir, lock_path, lock_root, output_lock_name, timing_lock, try_lock

    fd = try_lock(timing_lock("cpu"))
    try:
        assert lock_path(timing_lock("cpu")).parent == lock_root()
        assert stat.S_IMODE(lock_root().stat().st_mode) == 0o1777  # like /tmp: others add files, remove only theirs
        assert stat.S_IMODE(lock_path(timing_lock("cpu")).stat().st_mode) == 0o666  # another user's job takes it too
    finally:
        os.close(fd)
    assert lock_path("gpu-0").parent == lock_path(output_lock_name(["results/x.json"])).parent == lock_dir()
    assert lock_dir().parent == lock_root() and stat.S_IMODE(lock_dir().stat().st_mode) == 0o700


# ---------------------------------------------------------------------------------------------
# Item 7: a job's log holds everything the job printed


LOG_DRIVER = '''
import os, runpy, subprocess, sys, time, ctypes
from types import SimpleNamespace

import dpace.data


class Paths(list):
    def __init__(self, **paths):
        super().__init__(paths.values())
        self.__dict__.update(paths)


def write_benchmark(name, out, **settings):  # stands in for the job's work: every way a job prints
    print("python print")
    os.write(1, b"fd 1 write\\n")
    os.write(2, b"fd 2 write\\n")
    libc = ctypes.CDLL(None)
    libc.puts(b"native puts")
    libc.fflush(None)
    subprocess.run(["echo", "child echo"], check=True)
    subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('child stderr\\\\n')"], check=True)
    from tqdm import tqdm
    for _ in tqdm(range(40), desc="progress"):
        time.sleep(0.05)
    open(out, "w").close()
    return 0


dpace.data.write_benchmark = write_benchmark
out, log = sys.argv[1], sys.argv[2]
job = SimpleNamespace(rule="benchmark_prompts", log=[log], output=Paths(prompts=out), input=Paths(),
                      params=SimpleNamespace(num_prompts=1, seed=0, mirror=None), wildcards=SimpleNamespace(benchmark="b"))
runpy.run_path(sys.argv[3], init_globals={"snakemake": job})
'''


def test_a_jobs_log_holds_native_and_child_output_and_progress_bars_update_seldom(tmp_path, lock_env):
    """The real benchmark_prompts script, its work replaced by one that prints in every way a job can: the
    log holds all of it (before: the child processes' and native output escaped it), and a 2-second
    progress bar is redrawn a few times, not 40."""
    log = tmp_path / "job.log"
    env = {key: value for key, value in os.environ.items() if not key.startswith("TQDM_")}
    run = subprocess.run([sys.executable, "-c", LOG_DRIVER, str(tmp_path / "out.jsonl"), str(log),
                          str(REPO / "workflow" / "scripts" / "benchmark_prompts.py")],
                         capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr
    text = log.read_text()
    printed = ["python print", "fd 1 write", "fd 2 write", "native puts", "child echo", "child stderr", "wrote 0 prompts"]
    assert [line for line in printed if line not in text] == [], text
    assert [line for line in printed if line in run.stdout + run.stderr] == []  # nothing escaped the log
    draws = text.count("progress:")
    assert 1 <= draws <= 3, text  # the first draw, the last, at most one between (every 5 s)
    assert "40/40" in text


# ---------------------------------------------------------------------------------------------
# Item 3: a second run after `snakemake --unlock` while the first is alive destroys nothing


JOB_SCRIPT = '''from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

import json, os, time
from pathlib import Path

control = Path({control!r})
try:  # the first job to get here is run A's, any later one run B's
    os.close(os.open(control / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    me = "A"
except FileExistsError:
    me = "B"
print(f"{{me}}: training, pid {{os.getpid()}}", flush=True)
if me == "A":
    (control / "A-pid").write_text(str(os.getpid()))
    while not (control / "release").exists() and not (control / "fail").exists():
        time.sleep(0.05)
Path(snakemake.output.steps).write_text(json.dumps({{"by": me}}) + "\\n")
Path(snakemake.output.summary).write_text(json.dumps({{"by": me}}))
if me == "A" and (control / "fail").exists():
    raise ZeroDivisionError("float division by zero (as in loop.py _save_records)")
(control / f"{{me}}-done").touch()
'''

SNAKEFILE = '''
rule train_drafter:
    input: "features.txt"
    output: summary="results/drafters/d/summary.json", steps="results/drafters/d/steps.jsonl"
    log: "results/logs/train/d.log"
    script: "job.py"
'''


def wait_for(condition, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def readme_status_command() -> list[str]:
    """The first command of the README's "After a crash" section: whether a run is still alive."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## After a crash", 1)[1].split("\n## ", 1)[0]
    first = section.split("```bash\n", 1)[1].split("\n", 1)[0].split("#", 1)[0].split()
    assert first[:3] == ["python", "-m", "dpace.locks"], first
    return [sys.executable, *first[1:]]


@pytest.mark.slow
@pytest.mark.parametrize("first_run", ["fails", "finishes"])
def test_a_second_run_after_unlock_waits_for_the_live_one_and_nothing_it_finished_is_removed(tmp_path, first_run):
    """Run A's job trains; the README's status command names it; `snakemake --unlock` anyway; run B asks for the
    same drafter. B's job waits for A's (naming it) instead of training too. When A finishes, B keeps A's
    outputs and exits 0. When A fails (the ZeroDivisionError of issue 56), its Snakemake removes A's own
    outputs, B stops without writing (it would race that removal) and the same command again trains them.
    Either way B's log holds A's log too (Snakemake removed A's log file when it started B's job). Before: B
    trained alongside A, finished, and A's failure removed B's summary.json and steps.jsonl."""
    workdir, control = tmp_path / "work", tmp_path / "control"
    workdir.mkdir()
    control.mkdir()
    (workdir / "Snakefile").write_text(SNAKEFILE)
    (workdir / "job.py").write_text(JOB_SCRIPT.format(control=str(control)))
    (workdir / "features.txt").write_text("features\n")
    env = session_env(DPACE_LOCK_DIR=str(tmp_path / "locks"))
    command = [sys.executable, "-m", "snakemake", "-d", str(workdir), "-s", str(workdir / "Snakefile"), "--cores", "1"]
    target = "results/drafters/d/summary.json"
    run_a = subprocess.Popen([*command, target], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_b = None
    try:
        wait_for(lambda: (control / "A-pid").exists() or run_a.poll() is not None, "run A's job")
        job_a = int((control / "A-pid").read_text())
        summary, steps = workdir / target, workdir / "results/drafters/d/steps.jsonl"
        status = subprocess.run(readme_status_command(), env=env, capture_output=True, text=True, timeout=60)
        assert f"pid {job_a}  rule train_drafter  output {summary}" in status.stdout, status.stdout
        unlock = subprocess.run([*command, "--unlock"], env=env, capture_output=True, text=True, timeout=300)
        assert unlock.returncode == 0, unlock.stderr
        run_b = subprocess.Popen([*command, target], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        log = workdir / "results/logs/train/d.log"
        wait_for(lambda: run_b.poll() is not None or "waits for it" in (log.read_text() if log.exists() else ""),
                 "run B's job to wait or to end")
        assert not (control / "B-done").exists(), "run B trained the drafter while run A's job was alive"
        (control / ("fail" if first_run == "fails" else "release")).touch()
        out_a, _ = run_a.communicate(timeout=300)
        out_b, _ = run_b.communicate(timeout=300)
    finally:
        for run in (run_a, run_b):
            if run is not None and run.poll() is None:
                run.kill()
                run.wait()
    assert (run_a.returncode != 0) == (first_run == "fails"), out_a
    text = log.read_text()
    assert (f"train_drafter: these outputs are being written by pid {job_a} (rule train_drafter, output {summary})"
            in text), text
    assert f"A: training, pid {job_a}" in text, text  # A's log, kept in B's
    assert "B: training" not in text, text  # B never wrote while A's job was alive, nor raced its removal
    if first_run == "finishes":
        assert run_b.returncode == 0, out_b
        assert "keeping them" in text, text
        assert json.loads(summary.read_text()) == json.loads(steps.read_text()) == {"by": "A"}
    else:
        # A's failure removed A's own outputs, nothing of B's; B stopped without writing, saying why.
        assert run_b.returncode != 0 and "ZeroDivisionError" in text, out_b
        assert f"pid {job_a} ended without finishing these outputs; this job stops without writing them" in text, text
        assert not summary.exists() and not steps.exists()
        again = subprocess.run([*command, target], env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        assert json.loads(summary.read_text()) == json.loads(steps.read_text()) == {"by": "B"}
    after = subprocess.run(readme_status_command(), env=env, capture_output=True, text=True, timeout=60)
    assert after.stdout.startswith("no pipeline job is running on this machine"), after.stdout


def test_every_workflow_script_begins_with_begin_job():
    """The log redirect and the outputs' lock of every job: each script's first statement (the test above
    runs that line under Snakemake)."""
    first = JOB_SCRIPT.split("\n\nimport json", 1)[0]
    for script in sorted((REPO / "workflow" / "scripts").glob("*.py")):
        assert script.read_text().startswith(first + "\n"), script.name


def test_no_progress_bar_of_the_package_forces_a_redraw_per_step():
    """tqdm's ``set_postfix`` redraws at every call unless told not to, whatever ``mininterval`` says: the
    training loop drew a line per step into its log (seen in a smoke run's training log)."""
    import re

    calls = [(path.relative_to(REPO), line) for path in sorted((REPO / "dpace").rglob("*.py"))
             for line in path.read_text().splitlines() if re.search(r"\.set_postfix(_str)?\(|\.refresh\(\)", line)]
    assert calls and all("refresh=False" in line for _, line in calls), calls
