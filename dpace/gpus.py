"""One GPU (or several) per job, never shared by accident.

Snakemake's ``gpu`` resource bounds how many GPU jobs run at once on a machine, but it does not
say *which* GPU a job gets: two jobs started together would both see every device and both pick
``cuda:0``. ``gpu_slot`` closes that gap with one advisory lock file per physical GPU
(``fcntl.flock``, released by the kernel when the process dies, so a killed job never leaves a
stale lock). The job takes the first ``count`` free GPUs, waits while none is free, and sets
``CUDA_VISIBLE_DEVICES`` to them before anything initialises CUDA; children (SGLang servers,
torchrun workers) inherit it.

Under a scheduler that already isolates devices (SLURM with ``--gpus``), the job's
``CUDA_VISIBLE_DEVICES`` is kept as it is and no lock is taken.

The locks are ``dpace.locks``' machine locks ``gpu-<id>``: in this user's own lock directory, so
every Snakemake run of this user on the machine shares them and no other user can hold or hijack them.

Environment:
    DPACE_GPUS           comma-separated physical GPU ids this machine may use (default: all,
                         found without touching CUDA: /proc/driver/nvidia/gpus, then nvidia-smi)
    DPACE_LOCK_DIR       where the lock files live (see ``dpace.locks``)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from dpace.locks import holder, lock_dir, release, try_lock


def _proc_gpu_count() -> int:
    path = Path("/proc/driver/nvidia/gpus")
    try:
        return len([p for p in path.iterdir() if p.is_dir()])
    except OSError:
        return 0


def _nvidia_smi_ids() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def machine_gpu_ids() -> list[str]:
    """Physical GPU ids this job may choose from, without initialising CUDA."""
    if os.environ.get("DPACE_GPUS"):
        return [g.strip() for g in os.environ["DPACE_GPUS"].split(",") if g.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # a user-level restriction: choose among these only
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    count = _proc_gpu_count()
    return [str(i) for i in range(count)] if count else _nvidia_smi_ids()


def scheduler_assigned() -> bool:
    """True when a batch scheduler already gave this job its own devices."""
    return bool(os.environ.get("SLURM_JOB_ID")) and os.environ.get("CUDA_VISIBLE_DEVICES") is not None


@contextlib.contextmanager
def gpu_slot(count: int = 1, *, timeout_s: float | None = None, poll_s: float = 5.0, log=print) -> Iterator[list[str]]:
    """Hold ``count`` GPUs for the duration of the block; yields their physical ids.

    ``count`` 0 (a CPU job) yields ``[]`` and changes nothing. Raises ``RuntimeError`` when the
    machine has fewer GPUs than asked, or when none frees up within ``timeout_s``.
    """
    if count <= 0:
        yield []
        return
    if scheduler_assigned():
        ids = [g.strip() for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
        if len(ids) < count:
            raise RuntimeError(f"the scheduler gave this job GPUs {ids}, fewer than the {count} it needs")
        log(f"gpu_slot: scheduler-assigned CUDA_VISIBLE_DEVICES={','.join(ids)}")
        yield ids
        return
    candidates = machine_gpu_ids()
    if len(candidates) < count:
        raise RuntimeError(
            f"this job needs {count} GPU(s) but the machine shows {len(candidates)} ({candidates}); "
            "set DPACE_GPUS or run the CPU backends"
        )
    directory = lock_dir()
    held: dict[str, int] = {}
    started = time.monotonic()
    try:
        while True:
            for gpu in candidates:
                if gpu not in held and (fd := try_lock(f"gpu-{gpu}")) is not None:
                    held[gpu] = fd
                    if len(held) == count:
                        break
            if len(held) == count:
                break
            # Never sit on a partial set while waiting: two jobs could each hold half forever.
            for fd in held.values():
                release(fd)
            held.clear()
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                holders = "; ".join(f"GPU {gpu}: {holder(f'gpu-{gpu}')}" for gpu in candidates)
                raise RuntimeError(f"no {count} free GPU(s) among {candidates} within {timeout_s:.0f} s ({holders})")
            time.sleep(poll_s)
        ids = sorted(held, key=candidates.index)
        previous = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        log(f"gpu_slot: holding GPU(s) {','.join(ids)} (locks in {directory})")
        try:
            yield ids
        finally:
            if previous is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous
    finally:
        for fd in held.values():
            release(fd)


@contextlib.contextmanager
def torch_device_slot(gpus: int | str, *, log=print) -> Iterator[str]:
    """The device of an in-process (torch) job, held for the block: one CUDA GPU (locked by ``gpu_slot``, so
    that parallel jobs get different ones) when its rule asked for any (``gpus``: its ``gpu`` resource) and
    the machine has one, else the CPU. Yields ``"cuda"`` or ``"cpu"``: a GPU machine's jobs ran on its CPU
    before (issue 43) when each script chose for itself."""
    with gpu_slot(1 if int(gpus) and machine_gpu_ids() else 0, log=log) as ids:
        import torch  # lazily, and only once CUDA_VISIBLE_DEVICES names the slot's GPU

        yield "cuda" if ids and torch.cuda.is_available() else "cpu"


__all__ = ["gpu_slot", "lock_dir", "machine_gpu_ids", "scheduler_assigned", "torch_device_slot"]


# SGLang serves both GPU stages (generation's offline engine, evaluation's server): the check that it is
# installed lives here, with the GPU machinery, so generation does not import the evaluation backend.
INSTALL_HINT = "SGLang is the GPU-only optional extra: pip install -e .[gpu] (on a CUDA machine)"


def require_sglang():
    """``import sglang``, or a clear error saying how to get it."""
    try:
        import sglang
    except ImportError as error:
        raise RuntimeError(f"this backend needs SGLang, which is not installed ({error}). {INSTALL_HINT}") from None
    return sglang


def device_clock(device) -> float:
    """Wall clock after ``device`` has finished its queued work (CUDA runs asynchronously, so a
    step or a decode ends when its kernels do). Used by every timed loop: training and decoding."""
    import torch  # lazily: the locks above must not pay for (or initialise) torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
