"""The target's answers an evaluation reads (``measure_baseline``'s outputs): the baseline file of times,
greedy tokens and reference answers, keyed by request and prompt text, and the shared context features.
An evaluation refuses a file made with other settings, for another target, or lacking one of its requests."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from dpace.evaluation.eval_config import EvalConfig
from dpace.evaluation.eval_records import Request, prompt_checksum
from dpace.io import atomic_file, read_partial_jsonl, verify_recorded

MADE_BY = "the autoregressive baseline"  # the job whose outputs these are (record_checksums)


def feature_key(record: dict, turn: int) -> str:
    return f"{record['benchmark']}|{float(record['temperature'])}|{record['id']}|{record['prompt_checksum']}|{turn}"


def atomic_save_torch(path, value) -> None:
    with atomic_file(path) as tmp:
        torch.save(value, tmp)


def _remake(path) -> str:
    return f"delete {path} and rerun (the autoregressive baseline job makes it again, and the evaluations rerun)"


def _check_made(records, records_path, **made) -> None:
    """Refuse an input file written with other decoding settings (its prompts would mix two runs)."""
    for record in records:
        theirs = {key: record.get(key) for key in made}
        if theirs != made:
            def listed(settings):
                return ", ".join(f"{key}={value}" for key, value in settings.items())
            raise ValueError(f"{records_path} holds records made with {listed(theirs)}; this run asks for "
                             f"{listed(made)}: use a new records file")


def load_baseline(path, *, max_new_tokens: int, seed: int, dtype: str | torch.dtype,
                  target: int) -> tuple[int, dict[tuple, dict]]:
    """A checksum of a ``measure_baseline`` file (evaluation records remember which baseline they were
    timed against) and its records by ``baseline_key``; ``target``: ``target_checksum``."""
    path = Path(path)
    verify_recorded(path, what=MADE_BY, fix=_remake(path))  # an edit or a flipped byte after the job wrote it
    records = read_partial_jsonl(path)
    _check_made(records, path, max_new_tokens=max_new_tokens, seed=seed, dtype=str(dtype).removeprefix("torch."),
                target=target)
    return zlib.crc32(path.read_bytes()), {
        (r["benchmark"], float(r["temperature"]), r["id"], r.get("prompt_checksum")): r for r in records}


def baseline_key(benchmark: str, temperature: float, row: dict) -> tuple:
    """The key of ``load_baseline``'s record of a planned request: only one of the very same prompt text."""
    return (benchmark, float(temperature), str(row["id"]), prompt_checksum(row))


def shared_answers(path, plan: list[Request], config: EvalConfig, target: int) -> tuple[int | None, dict | None]:
    """``load_baseline`` of ``path`` (None: none), refused unless it holds every request of ``plan``."""
    if path is None:
        return None, None
    checksum, answers = load_baseline(path, max_new_tokens=config.max_new_tokens, seed=config.seed,
                                      dtype=config.dtype, target=target)
    missing = [(name, t, row["id"]) for name, t, _, row in plan if baseline_key(name, t, row) not in answers]
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} request(s) of this evaluation, e.g. {missing[0]}")
    return checksum, answers


def load_features(path, drafter) -> dict:
    """Shared context features by ``feature_key``, if made for this drafter's layers (else recomputed)."""
    if path is None or not Path(path).exists():
        return {}
    verify_recorded(path, what=MADE_BY, fix=_remake(path))
    stored = torch.load(path, weights_only=True)
    if list(stored["layer_ids"]) != [int(i) for i in drafter.target_layer_ids]:
        return {}
    return stored["features"]


@dataclass(frozen=True)
class TargetAnswers:
    """``measure_baseline``'s outputs an evaluation reads: ``baseline``, its times and greedy tokens (the
    autoregressive half; None: decoded here); ``reference``, its answers replayed tau reads (the same file
    where both are shared); ``features``, their context features (None or other layers: recomputed)."""

    baseline: str | Path | None = None
    reference: str | Path | None = None
    features: str | Path | None = None
