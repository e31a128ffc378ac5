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
