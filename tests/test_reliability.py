"""Issue 50's probes, one test each: bad input, damaged files and concurrent runs as a user meets them.

Every probe here was first seen giving a wrong number, a crash that names no file, or a security
hole on the old code (docs/guarantees.md lists them with what they guard).
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def lock_env(tmp_path, monkeypatch):
    """Two pretend GPUs and a private lock folder; no scheduler."""
    monkeypatch.setenv("DPACE_GPUS", "0,1")
    monkeypatch.setenv("DPACE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path / "locks"


def hold_lock_in_another_process(name: str) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys,time; from dpace.locks import machine_lock\n"
         f"with machine_lock({name!r}):\n print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


# ---------------------------------------------------------------------------------------------
# Item 6: locks


def test_a_planted_symlink_in_the_lock_folder_is_never_written_through(lock_env, tmp_path):
    from dpace.gpus import gpu_slot
    from dpace.locks import lock_dir

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (lock_dir() / "gpu-0.lock").symlink_to(victim)
    with pytest.raises(OSError, match="gpu-0.lock"), gpu_slot(1, log=lambda *_: None):
        pass
    assert victim.read_text() == "precious\n"


def test_a_lock_folder_others_can_write_or_own_is_refused(lock_env):
    from dpace.locks import lock_dir, machine_lock

    folder = lock_dir()
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    folder.chmod(0o777)
    with pytest.raises(RuntimeError, match="writable by others"), machine_lock("timing"):
        pass
    folder.chmod(0o700)
    if os.getuid() == 0:  # only root can hand a folder to another user
        os.chown(folder, 65534, -1)
        with pytest.raises(RuntimeError, match="belongs to uid 65534"), machine_lock("timing"):
            pass


def test_a_lock_held_elsewhere_times_out_naming_its_holder_then_is_freed(lock_env):
    from dpace.locks import LockTimeout, machine_lock

    holder = hold_lock_in_another_process("timing")
    try:
        with pytest.raises(LockTimeout, match=f"held by pid {holder.pid} "), machine_lock(
                "timing", timeout_s=0.3, poll_s=0.05, log=lambda *_: None):
            pass
    finally:
        holder.kill()
        holder.wait()
    with machine_lock("timing", timeout_s=5, poll_s=0.05):  # the kernel dropped the dead holder's lock
        pass


def test_a_longer_holder_record_is_overwritten_in_place_not_truncated(lock_env):
    from dpace.locks import HOLDER_WIDTH, holder, lock_dir, machine_lock

    path = lock_dir() / "timing.lock"
    path.write_text("pid 1".ljust(HOLDER_WIDTH - 1) + "\n")
    with machine_lock("timing"):
        assert holder("timing").startswith(f"pid {os.getpid()} ")
        assert path.stat().st_size == HOLDER_WIDTH


def baseline_adapter_snakemake(tmp_path) -> SimpleNamespace:
    params = SimpleNamespace(
        temperatures=[0.0], max_new_tokens=4, seed=0, sampled_prompts=1, records=str(tmp_path / "r.jsonl"),
        dtype="float32", overrun=0, target_layer_ids=None, num_target_features=1, feature_window=0,
        timed_prompts=1, batch_size=1, share_features=False)
    return SimpleNamespace(
        params=params, threads=1, resources={}, log=[str(tmp_path / "job.log")],
        input=SimpleNamespace(target="t", benchmarks=["b.jsonl"]),
        output=SimpleNamespace(baseline=str(tmp_path / "b.json"), features=str(tmp_path / "f")),
    )


def test_the_baseline_job_times_its_decoding_under_the_machine_timing_lock(lock_env, tmp_path, monkeypatch):
    """Item 5: SR timing never overlaps another invocation's (the baseline adapter; evaluate.py wraps
    evaluate_drafter the same way)."""
    import dpace.evaluation.evaluate
    from dpace.locks import release, try_lock

    seen = {}

    def measure(*args, **kwargs):
        fd = try_lock("timing")
        seen["timing lock free while measuring"] = fd is not None
        if fd is not None:
            release(fd)

    monkeypatch.setattr(dpace.evaluation.evaluate, "measure_baseline", measure)
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    runpy.run_path(str(REPO / "workflow/scripts/autoregressive_baseline.py"),
                   init_globals={"snakemake": baseline_adapter_snakemake(tmp_path)})
    assert seen == {"timing lock free while measuring": False}



# ---------------------------------------------------------------------------------------------
# Item 6: names, shapes, pickles


def smoke_config() -> dict:
    import yaml

    return yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())


def test_a_target_named_like_a_path_is_refused_naming_the_key():
    from dpace.config import ConfigError, validate_config

    config = smoke_config()
    config["targets"] = {"../../escape": config["targets"]["tiny"]}
    config["main_target"] = "../../escape"
    with pytest.raises(ConfigError, match=r"targets: '\.\./\.\./escape' does not match"):
        validate_config(config)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("hidden_size", 66, r"targets\.tiny\.hidden_size: 66 does not divide into num_heads 4"),
    ("num_kv_heads", 3, r"targets\.tiny\.num_heads: 4 does not divide into num_kv_heads 3"),
])
def test_attention_shapes_that_do_not_split_evenly_are_refused(key, value, message):
    from dpace.config import ConfigError, validate_config

    config = smoke_config()
    config["targets"]["tiny"][key] = value
    with pytest.raises(ConfigError, match=message):
        validate_config(config)


class _RunsCode:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["DPACE_TEST_MARKER"]),))


def test_a_training_state_with_pickled_code_is_refused_without_running_it(tmp_path, monkeypatch):
    import torch

    from dpace.training.loop import _load_state

    marker = tmp_path / "code-ran"
    monkeypatch.setenv("DPACE_TEST_MARKER", str(marker))
    torch.save({"fingerprint": "x", "payload": _RunsCode()}, tmp_path / "state.pt")
    with pytest.raises(ValueError, match=r"state\.pt: damaged or not a training state .*delete it and rerun"):
        _load_state(tmp_path / "state.pt")
    assert not marker.exists()
    torch.save({"rng": torch.get_rng_state(), "step": 3}, tmp_path / "state.pt")
    (tmp_path / "state.pt").write_bytes((tmp_path / "state.pt").read_bytes()[:100])  # truncated by a full disk
    with pytest.raises(ValueError, match=r"state\.pt: damaged"):
        _load_state(tmp_path / "state.pt")
