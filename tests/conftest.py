"""Shared fixtures: a tiny random target with SmolLM2's tokenizer, built once per test session."""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def mirror() -> Path:
    if not (MIRROR / "benchmarks").exists():
        pytest.skip(f"data mirror not found at {MIRROR}")
    return MIRROR


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
