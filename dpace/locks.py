"""Machine-wide exclusive locks between this user's processes (GPU slots, the timing lock).

A lock is an advisory ``flock`` on a file in a directory only this user may write: another user on a
shared machine can neither hold our locks (jobs waiting forever) nor plant a symlink that makes us
write into one of their files (issue 50). The kernel releases a lock when its holder dies, so a
killed job never leaves a stale one. The file holds the holder's pid, written in place at a fixed
width (never truncated), so that a waiter that gives up can say who holds it.

Environment:
    DPACE_LOCK_DIR   where the lock files live (default: $XDG_RUNTIME_DIR/dpace-locks, else
                     <tmp>/dpace-locks-<uid>); it must be this user's and not group/world-writable
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
HOLDER_WIDTH = 32  # "pid N" padded: every holder overwrites the whole record, nothing is truncated


class LockTimeout(RuntimeError):
    """A machine lock stayed held by another process for longer than the caller would wait."""


def lock_dir() -> Path:
    """This user's lock directory, created 0700; refused when someone else could write into it."""
    if os.environ.get("DPACE_LOCK_DIR"):
        path = Path(os.environ["DPACE_LOCK_DIR"])
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "dpace-locks"
    else:
        path = Path(tempfile.gettempdir()) / f"dpace-locks-{os.getuid()}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
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


def _lock_path(name: str) -> Path:
    if not NAME.match(name):
        raise ValueError(f"lock name {name!r} must match {NAME.pattern}")
    return lock_dir() / f"{name}.lock"


def try_lock(name: str) -> int | None:
    """The open, locked file descriptor of lock ``name``, or None when another process holds it.
    Close the descriptor (``release``) to let go."""
    path = _lock_path(name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise RuntimeError(f"lock file {path} is not a regular file of this user; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        os.pwrite(fd, f"pid {os.getpid()}".ljust(HOLDER_WIDTH - 1).encode() + b"\n", 0)
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def release(fd: int) -> None:
    os.close(fd)  # closing the only descriptor drops the flock


def holder(name: str) -> str:
    """Who holds lock ``name``, as its file says ("pid N" and that process's command line when known)."""
    path = _lock_path(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return "an unknown process"
    try:
        text = os.pread(fd, HOLDER_WIDTH, 0).decode(errors="replace").strip()
    finally:
        os.close(fd)
    match = re.fullmatch(r"pid (\d+)", text)
    if not match:
        return "an unknown process"
    try:
        command = Path(f"/proc/{match[1]}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return text
    return f"{text} ({command.strip()[:200]})"


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


__all__ = ["LockTimeout", "holder", "lock_dir", "machine_lock", "release", "timing_lock", "try_lock"]
