"""The start of every job (``workflow/scripts/*.py``): its log, and the lock of its outputs.

``begin_job(snakemake)`` is each script's first line. It

- sends everything the job prints to its log: file descriptors 1 and 2 themselves, so that native code,
  child processes and ``print`` all land there (issue 56), with progress bars refreshed at most every
  ``PROGRESS_INTERVAL_S`` seconds (``TQDM_MININTERVAL``, inherited by child processes);
- holds, for the job process's lifetime, the lock of its outputs (``dpace.locks.output_lock_name``). A second
  run of the same outputs (after a ``snakemake --unlock`` while the first run is still alive) does not write
  them too: its job waits for the holder, names it in its log, and copies the holder's log into its own
  (Snakemake removed the holder's log file when it started the second job). When the holder finished these
  outputs for the same inputs, parameters and code, the waiting job keeps them and exits 0; when it finished
  them for other inputs, the waiting job runs. When the holder failed (or was killed), the waiting job fails
  too, without writing anything: the holder's Snakemake removes a failed job's outputs and their emptied
  folders right after the job ends, and would race the waiting job's writes; the next run writes them. So
  two processes never write one output at once, and Snakemake's removal of a failed job's outputs never
  meets outputs another process finished.

``dpace`` never imports Snakemake: ``begin_job`` reads only ``rule``, ``log``, ``input``, ``output`` and
``params`` of the object it is given.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import stat
import sys
import time
from pathlib import Path

from dpace import locks

PROGRESS_INTERVAL_S = 5  # tqdm's refresh in a log file: a line per update, so a few seconds apart
_STATE: dict = {}


def redirect_output(log: str | os.PathLike) -> None:
    """Point file descriptors 1 and 2 at ``log`` (created anew), and ``sys.stdout``/``sys.stderr`` at them."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    # tqdm reads TQDM_* when it is first imported (every job imports it after this); child processes inherit it.
    os.environ.setdefault("TQDM_MININTERVAL", str(PROGRESS_INTERVAL_S))


def _files(path: str) -> list[Path]:
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return [path] if path.exists() else []


def job_key(rule: str, inputs, params) -> str:
    """A hash of what a job computes from: its rule, every input file (path, size, mtime) and its parameters
    (the code fingerprint among them)."""
    digest = hashlib.sha256(rule.encode())
    for path in sorted(str(p) for p in inputs):
        for file in _files(path):
            info = file.stat()
            digest.update(f"{os.path.abspath(file)}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    digest.update(json.dumps(params, sort_keys=True, default=repr).encode())
    return digest.hexdigest()


def _params(params) -> dict:
    items = getattr(params, "items", None)
    if callable(items):
        return {str(name): value for name, value in items()}
    return dict(vars(params)) if params is not None else {}


class OutputsLeftUnfinished(RuntimeError):
    """The job this one waited for ended without finishing the outputs they share."""


def _open_log_of(pid):
    """The holder's log, which it writes through its fd 1 (Snakemake removed the file's name when it started
    this job): a regular file only, never a pipe or a terminal."""
    try:
        fd = os.open(f"/proc/{int(pid)}/fd/1", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, TypeError, ValueError):
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return open(fd, "rb")


def _append_log_of(holder_log, pid) -> None:
    if holder_log is None:
        return
    with holder_log:
        text = holder_log.read().decode(errors="replace")
    if text:
        print(f"---- the log of pid {pid}, which held these outputs (Snakemake removed its file when it started "
              f"this job) ----\n{text.rstrip()}\n---- end of the log of pid {pid} ----")


def hold_outputs(rule: str, outputs: list[str], key: str, *, poll_s: float = 1.0) -> bool:
    """Take the lock of ``outputs`` for this process's lifetime, waiting while another process holds it.
    True when that process finished them for the same ``key`` meanwhile (this job then has nothing to do)."""
    name = locks.output_lock_name(outputs)
    acquired = locks._acquire(name)
    waited_for = None
    if acquired is None:
        record = locks.read_lock_record(name)
        waited_for = record.get("pid")
        print(f"{rule}: these outputs are being written by {locks.describe(record)}, another run's job "
              f"(`python -m dpace.locks status` lists them): this job waits for it instead of writing them too",
              flush=True)
        holder_log = _open_log_of(waited_for)
        while (acquired := locks._acquire(name)) is None:
            time.sleep(poll_s)
        _append_log_of(holder_log, waited_for)
    fd, _ = acquired
    previous = locks.read_record(fd)
    locks.write_record(fd, state="running", key=key)
    _STATE.update(fd=fd, outputs=list(outputs), key=key, failed=False)
    if (waited_for is not None and previous.get("pid") == waited_for and previous.get("state") == "done"
            and previous.get("key") == key and all(os.path.exists(path) for path in outputs)):
        print(f"{rule}: pid {waited_for} finished these outputs from the same inputs, parameters and code; "
              "keeping them", flush=True)
        return True
    if waited_for is not None and previous.get("state") != "done":
        # Its run's Snakemake is about to remove a failed job's outputs (and their emptied folders): writing them
        # now would race that removal. Stop without writing anything; the next run writes them.
        raise OutputsLeftUnfinished(
            f"{rule}: pid {waited_for} ended without finishing these outputs; this job stops without writing "
            "them, as its run removes a failed job's outputs: run the same command again")
    return False


def _mark_done() -> None:
    """At exit: record that this process finished its outputs, unless it failed or left one missing."""
    if _STATE.get("failed") or "fd" not in _STATE or not all(os.path.exists(p) for p in _STATE["outputs"]):
        return
    locks.write_record(_STATE["fd"], state="done", key=_STATE["key"])


def _excepthook(kind, value, traceback, previous=sys.excepthook):
    _STATE["failed"] = True
    previous(kind, value, traceback)


def begin_job(snakemake) -> None:
    """Redirect the job's output to its log and hold its outputs' lock (see the module's docstring); exits 0
    at once when another run's job finished the same outputs from the same inputs while this one waited."""
    redirect_output(snakemake.log[0])
    outputs = [str(path) for path in snakemake.output]
    rule = str(getattr(snakemake, "rule", None) or "job")
    locks.set_job(rule, outputs[0] if outputs else None)
    if not outputs:
        return
    sys.excepthook = _excepthook
    atexit.register(_mark_done)
    if hold_outputs(rule, outputs, job_key(rule, snakemake.input, _params(getattr(snakemake, "params", None)))):
        _STATE["failed"] = True  # nothing of its own to record
        sys.exit(0)


__all__ = ["PROGRESS_INTERVAL_S", "OutputsLeftUnfinished", "begin_job", "hold_outputs", "job_key", "redirect_output"]
