"""Issue 56's recovery probes (items 3, 4, 7), with real processes: a second run of the same outputs after
`snakemake --unlock`, the timing lock from sessions with other environments, and what a job's log holds.

Each test was seen failing on the code before its fix (docs/guarantees.md lists them)."""

from __future__ import annotations

import os
import subprocess
import sys
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
