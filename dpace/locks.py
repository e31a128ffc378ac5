"""Machine-wide exclusive locks: the timing lock of each device, GPU slots, and each job's outputs.

A lock is an advisory ``flock``; the kernel releases it when its holder dies, so a killed job never leaves a
stale one. Every process of the machine finds them in one fixed folder, ``/tmp/dpace-locks`` (never
``$TMPDIR`` or ``$XDG_RUNTIME_DIR``, which differ between sessions: a job started from a shell without
``XDG_RUNTIME_DIR`` once timed while another held the timing lock, issue 56):

- ``/tmp/dpace-locks/`` (mode 1777, like /tmp: anyone may add a file, only its owner remove it) holds the
  locks every user of the machine shares: the timing locks ``timing-*`` (two users' timed decodings skew
  each other's speedups just as two runs of one user do). Their files are 0666, opened ``O_NOFOLLOW``,
  and hold nothing but the holder record.
- ``/tmp/dpace-locks/user-<uid>/`` (0700, owner checked) holds this user's own: GPU slots and the output
  locks of its jobs (``output_lock_name``). Another user can neither hold them (jobs waiting forever) nor
  plant a symlink that makes us write into one of their files (issue 50).

A lock file holds its holder's record, written in place at a fixed width (never truncated): its pid, and the
rule and output of the job it runs (``set_job``), never its command line, which may carry secrets.
``python -m dpace.locks status`` lists the live holders.

Environment:
    DPACE_LOCK_DIR   another folder instead of /tmp/dpace-locks (tests; every process that must exclude
                     the others has to be given the same one)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ROOT = Path("/tmp/dpace-locks")  # fixed: the same folder whatever the environment of the process
SHARED = "timing-"  # locks of this prefix are shared by every user of the machine
HOLDER_WIDTH = 1024  # the record padded: every holder overwrites the whole record, nothing is truncated

_JOB: dict = {"rule": None, "output": None}


class LockTimeout(RuntimeError):
    """A machine lock stayed held by another process for longer than the caller would wait."""


def set_job(rule: str | None, output: str | None) -> None:
    """Name the job this process runs (its rule and first output) in the records of the locks it takes."""
    _JOB.update(rule=rule, output=None if output is None else os.path.abspath(output))


def lock_root() -> Path:
    """The machine's lock folder (created 1777); refused when it is not a folder, or when others can write
    into it without the sticky bit (they could swap its lock files)."""
    path = Path(os.environ.get("DPACE_LOCK_DIR") or ROOT)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o1777)  # explicitly: the umask would take the others' write bit
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeError(f"lock directory {path} is not a directory (a symlink?); remove it or set DPACE_LOCK_DIR")
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise RuntimeError(f"lock directory {path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}) "
                           f"without the sticky bit; chmod 1777 {path} or set DPACE_LOCK_DIR")
    return path


def lock_dir() -> Path:
    """This user's lock directory, created 0700; refused when someone else could write into it."""
    path = lock_root() / f"user-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except PermissionError:
        raise RuntimeError(f"cannot make this user's lock folder in {path.parent} (mode "
                           f"{stat.S_IMODE(os.stat(path.parent).st_mode):o}, uid {os.stat(path.parent).st_uid}): "
                           f"its owner can chmod 1777 it, or set DPACE_LOCK_DIR") from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeError(f"lock directory {path} is not a directory (a symlink?); remove it or set DPACE_LOCK_DIR")
    if info.st_uid != os.getuid():
        raise RuntimeError(f"lock directory {path} belongs to uid {info.st_uid}, not to this user ({os.getuid()}); "
                           "set DPACE_LOCK_DIR to a directory of your own")
    if info.st_mode & 0o022:
        raise RuntimeError(f"lock directory {path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}); "
                           f"chmod 700 {path} or set DPACE_LOCK_DIR")
    return path


def lock_path(name: str) -> Path:
    """The file of lock ``name``: the machine's folder for the shared (timing) locks, else this user's."""
    if not NAME.match(name):
        raise ValueError(f"lock name {name!r} must match {NAME.pattern}")
    return (lock_root() if name.startswith(SHARED) else lock_dir()) / f"{name}.lock"


_lock_path = lock_path


def output_lock_name(outputs) -> str:
    """The lock of a job's outputs: keyed by their absolute paths, whatever the working directory."""
    paths = "\n".join(sorted(os.path.abspath(path) for path in outputs))
    return "output-" + hashlib.sha256(paths.encode()).hexdigest()[:24]


def _open(name: str) -> tuple[int, bool]:
    """The lock file's descriptor, and whether this process may write its record."""
    path = lock_path(name)
    shared = name.startswith(SHARED)
    flags = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:  # without O_CREAT first: fs.protected_regular refuses O_CREAT on another user's file in a sticky folder
            fd = os.open(path, os.O_RDWR | flags)
        except FileNotFoundError:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666 if shared else 0o600)
        writable = True
    except PermissionError:
        if not shared:
            raise
        fd, writable = os.open(path, os.O_RDONLY | flags), False  # another user's: a read-only flock is a flock
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (not shared and info.st_uid != os.getuid()):
            raise RuntimeError(f"lock file {path} is not a regular file of this user; remove it")
        if shared and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != 0o666:
            os.fchmod(fd, 0o666)  # every user of the machine takes the timing lock
    except BaseException:
        os.close(fd)
        raise
    return fd, writable


def read_record(fd: int) -> dict:
    """A lock file's holder record ({} when empty or unreadable)."""
    text = os.pread(fd, HOLDER_WIDTH, 0).decode(errors="replace").strip()
    try:
        record = json.loads(text)
    except ValueError:
        match = re.fullmatch(r"pid (\d+)", text)  # the records of the first version of these locks
        return {"pid": int(match[1])} if match else {}
    return record if isinstance(record, dict) else {}


def write_record(fd: int, **fields) -> None:
    """Overwrite the record in place at its fixed width: the pid, this process's job, and ``fields``."""
    record = {"pid": os.getpid(), "rule": _JOB["rule"], "output": _JOB["output"], **fields}
    text = json.dumps(record)
    if len(text) > HOLDER_WIDTH - 1:
        record["output"] = "..." + str(record["output"])[-(HOLDER_WIDTH // 2):]
        text = json.dumps(record)[:HOLDER_WIDTH - 1]
    os.pwrite(fd, text.ljust(HOLDER_WIDTH - 1).encode() + b"\n", 0)


def _acquire(name: str) -> tuple[int, bool] | None:
    fd, writable = _open(name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd, writable


def try_lock(name: str) -> int | None:
    """The open, locked file descriptor of lock ``name``, or None when another process holds it.
    Close the descriptor (``release``) to let go."""
    acquired = _acquire(name)
    if acquired is None:
        return None
    fd, writable = acquired
    if writable:
        write_record(fd)
    return fd


def release(fd: int) -> None:
    os.close(fd)  # closing the only descriptor drops the flock


def describe(record: dict) -> str:
    """A holder record in words: "pid N (rule R, output O)"; never a command line."""
    if not record.get("pid"):
        return "an unknown process"
    if record.get("rule") or record.get("output"):
        return f"pid {record['pid']} (rule {record.get('rule')}, output {record.get('output')})"
    return f"pid {record['pid']} (not a pipeline job)"


def read_lock_record(name: str) -> dict:
    """The holder record in lock ``name``'s file ({} when there is none)."""
    try:
        fd = os.open(lock_path(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        return read_record(fd)
    finally:
        os.close(fd)


def holder(name: str) -> str:
    """Who holds lock ``name``, as its file says: the pid, and the rule and output of its job."""
    return describe(read_lock_record(name))


@contextlib.contextmanager
def machine_lock(name: str, *, timeout_s: float | None = None, poll_s: float = 1.0, log=print) -> Iterator[None]:
    """Hold the machine-wide lock ``name`` for the block, waiting while another process holds it.

    Raises ``LockTimeout`` naming the holder when it is still held after ``timeout_s`` seconds.
    """
    started = time.monotonic()
    announced = False
    while (fd := try_lock(name)) is None:
        if timeout_s is not None and time.monotonic() - started >= timeout_s:
            raise LockTimeout(f"lock {name!r} ({_lock_path(name)}) still held by {holder(name)} "
                              f"after {timeout_s:g} s")
        if not announced:
            log(f"machine_lock: waiting for {name!r}, held by {holder(name)}")
            announced = True
        time.sleep(poll_s)
    try:
        yield
    finally:
        release(fd)


def timing_lock(device: str) -> str:
    """The name of the timing lock of ``device`` ("cpu", or "cuda" inside a ``dpace.gpus`` slot): every job that
    times decoding on the CPU shares one; each physical GPU has its own (the slot's ``CUDA_VISIBLE_DEVICES``),
    since jobs on the other GPUs of a node barely move its timings and serialising them would leave those GPUs
    idle."""
    if device.startswith("cuda"):
        device = "cuda-" + os.environ.get("CUDA_VISIBLE_DEVICES", device).replace(",", "-")
    return "timing-" + re.sub(r"[^A-Za-z0-9-]", "", device)


def _flock_holders() -> set[tuple[int, int]] | None:
    """(device, inode) of every file someone holds a flock on, from /proc/locks (None when unreadable)."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    held = set()
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK":
            major, minor, inode = fields[5].split(":")
            held.add((os.makedev(int(major, 16), int(minor, 16)), int(inode)))
    return held


def live_holders() -> list[tuple[str, dict]]:
    """The locks held now, this user's and the machine's shared ones, each with its holder's record."""
    held = _flock_holders()
    found = []
    for folder in (lock_root(), lock_dir()):
        for path in sorted(folder.glob("*.lock")):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                info = os.fstat(fd)
                if held is not None:
                    busy = (info.st_dev, info.st_ino) in held
                else:  # no /proc/locks: try a shared lock, let go at once
                    try:
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                        busy = False
                    except BlockingIOError:
                        busy = True
                if busy:
                    found.append((path.name.removesuffix(".lock"), read_record(fd)))
            finally:
                os.close(fd)
    return found


def status() -> str:
    """What ``python -m dpace.locks status`` prints: each live holder, or that there is none."""
    holders = live_holders()
    if not holders:
        return (f"no pipeline job is running on this machine (no lock held in {lock_root()}): "
                "a run that stopped is over, and `snakemake --unlock` is safe")
    lines = [f"{len(holders)} lock(s) held in {lock_root()}: these jobs are running; "
             "wait for them or stop their run before `snakemake --unlock`"]
    for name, record in holders:
        kind = "output" if name.startswith("output-") else name
        lines.append(f"  pid {record.get('pid', '?')}  rule {record.get('rule')}  output {record.get('output')}  "
                     f"({kind} lock)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["status"]:
        print("usage: python -m dpace.locks status   (the pipeline jobs running on this machine)", file=sys.stderr)
        return 2
    print(status())
    return 0


__all__ = ["LockTimeout", "describe", "holder", "live_holders", "lock_dir", "lock_path", "lock_root", "machine_lock",
           "output_lock_name", "read_lock_record", "read_record", "release", "set_job", "status", "timing_lock", "try_lock",
           "write_record"]


if __name__ == "__main__":
    sys.exit(main())
