"""Shared fixtures: a tiny random target with SmolLM2's tokenizer, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MIRROR = REPO.parent / "shared" / "data"

TINY_TARGET = {
    "source": "random",
    "num_layers": 6,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 4,
    "num_kv_heads": 2,
}


def pytest_configure(config):
    """Under pytest-xdist, share the cores between the workers: each worker's torch would otherwise
    start one thread per core, and oversubscribed OpenMP threads spin against each other."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config, items):
    """The smoke run's file first, then the other files with tests marked slow (Snakemake runs): xdist
    hands out files in this order (``--no-loadscope-reorder``), so the longest file starts at once
    instead of running alone at the end."""
    def weight(item):
        return 0 if "smoke_run" in getattr(item, "fixturenames", ()) else 1 if item.get_closest_marker("slow") else 2

    items.sort(key=weight)


def running_in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def require_mirror(path: Path) -> Path:
    """The data mirror; a developer without it skips the tests that need it, CI (CI=true) fails them,
    so a CI run can never go green without its end-to-end tests."""
    if not (path / "benchmarks").exists():
        message = f"data mirror not found at {path}"
        if running_in_ci():
            pytest.fail(f"{message}; CI must run the tests that need it", pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def mirror() -> Path:
    return require_mirror(MIRROR)


@pytest.fixture(scope="session")
def tiny_target_json(tmp_path_factory) -> Path:
    from dpace.targets import prepare_target

    return prepare_target(TINY_TARGET, tmp_path_factory.mktemp("tiny-target"), seed=0)


FIXTURE_DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def metrics():
    """Hand-written tidy metrics shared by the table and figure tests (tests/data/metrics.csv)."""
    import pandas as pd

    return pd.read_csv(FIXTURE_DATA / "metrics.csv")


@pytest.fixture(scope="module")
def blocks():
    import pandas as pd

    return pd.read_csv(FIXTURE_DATA / "blocks.csv")


@pytest.fixture(scope="module")
def train_runs():
    import pandas as pd

    return pd.read_csv(FIXTURE_DATA / "train_runs.csv")


@pytest.fixture(scope="module")
def train_steps():
    import pandas as pd

    return pd.read_csv(FIXTURE_DATA / "train_steps.csv")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module of tiny models: they gain nothing from threads, and on a shared
    2-core machine extra threads only add jitter (modules opt in with ``pytest.mark.usefixtures``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def lock_env(tmp_path, monkeypatch):
    """Two pretend GPUs and a private lock folder; no scheduler."""
    monkeypatch.setenv("DPACE_GPUS", "0,1")
    monkeypatch.setenv("DPACE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path / "locks"
