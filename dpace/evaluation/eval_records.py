"""Evaluation records shared by both evaluation backends (in-process decoding and SGLang):
benchmark rows, the plan of requests, the per-prompt record key that resumes a run, the selection of
a run's records and their summary by DFlash's definitions. No torch here: response generation
reaches this module through the SGLang backend.
"""

from __future__ import annotations

import json
import statistics
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from dpace.data import check_turns
from dpace.evaluation.eval_config import DEFAULTS, GREEDY_TIE_MARGIN, TAU_COUNTS
from dpace.io import read_jsonl

BLOCK_COLUMNS = ["benchmark", "temperature", "prompt_index", "block_index", "tau_block", "sum_q", "surrogate", "turn"]
WARMUP_TOKENS = 16
# A step's length in tau and the histogram (TAU_COUNTS, the schema's eval.tau_counts):
# "accepted-plus-bonus": accepted + 1 for every step, also the one in which a stop token ends the
#   output (DFlash's benchmark, z-lab/dflash Jan-Apr 2026, which the paper's numbers come from);
# "emitted": the tokens the step added to the output (dflash 0.1.0 on PyPI).
# Greedy divergences in bf16 (GREEDY_TIE_MARGIN, the schema's eval.greedy_tie_margin): batched (verify)
# and one-token (autoregressive) forwards round differently, so the two greedy streams part where the
# target's top two logits nearly tie. A divergence whose top-2 margin is below this many logits is
# counted as such a numerical tie; any other is a failure of losslessness. bf16 keeps 8 significant
# bits: a logit between 16 and 32 is stored to 0.125, and a few such roundings through the layers move
# it by more than that.


def load_benchmark(path: str | Path, name: str) -> list[dict]:
    """Rows ``{"id", "benchmark", "turns"}`` of a benchmark jsonl, checked."""
    rows = list(read_jsonl(path))
    for line, row in enumerate(rows, start=1):
        if "id" not in row:
            raise ValueError(f"{path}:{line}: the row has no 'id'; fix that row")
        check_turns(row.get("turns"), f"{path}:{line}")
    ids = [str(row["id"]) for row in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate ids in benchmark {name!r}")
    return rows


def prompt_checksum(row: dict) -> int:
    """Identifies a benchmark row's prompt text, every turn of it: a record is only ever reused for the
    very prompt it was computed from (a reworded or edited row is a new request, decoded again)."""
    return zlib.crc32(json.dumps(row["turns"]).encode())


def record_key(benchmark: str, temperature: float, verification: str, prompt_id, checksum: int | None) -> tuple:
    return (benchmark, float(temperature), verification, str(prompt_id), checksum)


def request_key(benchmark: str, temperature: float, verification: str, row: dict) -> tuple:
    """The key of a planned request (``evaluation_plan``): what a record of it must have been made from."""
    return record_key(benchmark, temperature, verification, row["id"], prompt_checksum(row))


def keyed_by(verification: str) -> Callable[[Request], tuple]:
    """The record key of a planned request measured with ``verification`` (or the baseline's name)."""
    return lambda request: request_key(request.benchmark, request.temperature, verification, request.row)


def key_of(record: dict) -> tuple:
    """The key of a stored record; one of a row's former text (or older, without a checksum) matches no request."""
    return record_key(record["benchmark"], record["temperature"], record["verification"], record["id"],
                      record.get("prompt_checksum"))


TOO_LONG = "too_long"  # a skipped record's reason


def exceeds_context(tokenizer, row: dict, *, max_new_tokens: int, block_size: int, context: int) -> bool:
    """Whether a request of ``row`` could run past the target's context (``max_position_embeddings``):
    its longest prompt (the last turn's: every user turn, each earlier answer counted at its cap
    ``max_new_tokens``) + ``max_new_tokens`` + one verification block. Such a request is skipped and
    counted (``skipped_too_long``), never decoded past the positions the target was trained on."""
    from dpace.targets import chat_prompt_ids  # transformers: not for the SGLang records' readers

    # each turn's template counted on its own (a system prompt once per turn): a bound, exact for one turn
    prompt = sum(len(chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])) for text in row["turns"])
    return prompt + len(row["turns"]) * max_new_tokens + block_size > context


class Request(NamedTuple):
    """One planned request: a benchmark row (every turn of it) at one temperature."""

    benchmark: str
    temperature: float
    index: int  # the row's place in its benchmark
    row: dict


def evaluation_plan(
    benchmarks: dict[str, list[dict]], temperatures, sampled_prompts: int | None = None
) -> list[Request]:
    """(benchmark, temperature, prompt index, row) for every request to decode, benchmark by benchmark.

    Every prompt at T = 0; at T > 0 only the first ``sampled_prompts`` of each benchmark (None: all),
    because sampled decoding is the costlier and noisier half of a CPU evaluation. Every drafter gets
    the same plan, so comparisons between drafters stay paired.
    """
    return [
        Request(name, float(temperature), index, row)
        for name, rows in benchmarks.items()
        for temperature in temperatures
        for index, row in enumerate(rows)
        if float(temperature) == 0 or sampled_prompts is None or index < sampled_prompts
    ]


def divergence_verdict(greedy: dict, greedy_tie_margin: float) -> str | None:
    """``None`` when the speculative and greedy outputs agree; else ``"tie"`` when the target's top-2
    logit margin at the first divergence is below ``greedy_tie_margin``, ``"failure"`` when it is not, and
    ``"unknown"`` when no margin was measured (SGLang)."""
    if greedy["first_mismatch"] is None:
        return None
    if greedy.get("top2_margin") is None:
        return "unknown"
    return "tie" if greedy["top2_margin"] < greedy_tie_margin else "failure"


def _step_lengths(turn: dict, tau_counts: str) -> list[int]:
    if tau_counts == "accepted-plus-bonus" and turn.get("block_lengths") is not None:
        return turn["block_lengths"]
    return turn["acceptance_lengths"]  # SGLang reports only what the steps emitted


def select_records(records: Iterable[dict], plan: list[Request], key: Callable[[Request], tuple]) -> list[dict]:
    """The first record of every request of ``plan`` (see ``evaluation_plan``; ``key``: a request's record
    key), in the plan's order (benchmark, temperature, prompt); records of other runs are left out."""
    position = {key(request): i for i, request in enumerate(plan)}
    selected: dict[tuple, dict] = {}
    for r in records:  # first record per request wins
        if key_of(r) in position:
            selected.setdefault(key_of(r), r)
    return sorted(selected.values(), key=lambda r: position[key_of(r)])


def _mean_step_length(turn: dict, tau_counts: str) -> float | None:
    lengths = _step_lengths(turn, tau_counts)
    return statistics.fmean(lengths) if lengths else None


def summarize(
    records: Iterable[dict], *, tau_counts: str = DEFAULTS["tau_counts"], greedy_tie_margin: float = GREEDY_TIE_MARGIN,
    request_tau: Callable[[dict], float | None] | None = None,
) -> list[dict]:
    """One summary row per (benchmark, temperature, verification), DFlash's definitions.

    A row's tau is the mean over requests of each request's tau: its mean step length (``tau_counts``),
    or ``request_tau(turn)`` where the engine reports it itself (SGLang's accept length). The paired
    intervals resample the same per-request taus.
    """
    request_tau = request_tau or (lambda turn: _mean_step_length(turn, tau_counts))
    if tau_counts not in TAU_COUNTS:
        raise ValueError(f"tau_counts must be one of {TAU_COUNTS}, got {tau_counts!r}")
    cells: dict[tuple, list[dict]] = {}
    for record in records:
        cells.setdefault((record["benchmark"], record["temperature"], record["verification"]), []).append(record)
    rows = []
    for (benchmark, temperature, verification), all_records in cells.items():
        cell = sorted((r for r in all_records if not r.get("skipped")), key=lambda r: r["prompt_index"])
        requests = [turn for record in cell for turn in record["turns"]]
        block_size = all_records[0]["block_size"]
        # Replayed tau: only the requests decoded for real were timed; SR comes from them alone.
        timed = [t for t in requests if t.get("spec") is not None and t.get("ar") is not None]
        ar_tpot = statistics.fmean(t["ar"]["time_per_output_token_s"] for t in timed) if timed else None
        spec_tpot = statistics.fmean(t["spec"]["time_per_output_token_s"] for t in timed) if timed else None
        steps = [_step_lengths(t, tau_counts) for t in requests]
        per_request = [tau for t in requests if (tau := request_tau(t)) is not None]
        lengths = [n for s in steps for n in s]
        histogram = [lengths.count(b) / len(lengths) if lengths else 0.0 for b in range(block_size + 1)]
        mismatches, diverged, first, divergences = None, None, None, None
        if temperature == 0 and any(t["greedy"] is not None for t in requests):
            mismatches, divergences = _greedy_divergences(cell, greedy_tie_margin)
            diverged, first = len(divergences), divergences[0] if divergences else None
        rows.append({
            "benchmark": benchmark,
            "temperature": temperature,
            "verification": verification,
            "block_size": block_size,
            "tau": statistics.fmean(per_request) if per_request else None,
            "speedup": ar_tpot / spec_tpot if timed else None,
            "ar_tpot_s": ar_tpot,
            "spec_tpot_s": spec_tpot,
            "num_prompts": len(cell),
            # requests that could run past the target's context (exceeds_context): skipped, not scored
            "skipped_too_long": sum(r.get("skipped") == TOO_LONG for r in all_records),
            "num_requests": len(requests),
            "num_timed_requests": len(timed),
            "num_output_tokens": sum(t["spec"]["num_output_tokens"] for t in timed),
            "tau_source": all_records[0].get("tau", "decode"),
            "replay_check": _replay_check(cell),
            "greedy_mismatches": mismatches,  # token positions that differ, over all requests
            "greedy_diverged_requests": diverged,
            "first_mismatch": first,  # {id, turn, first_mismatch (position), top2_margin, verdict, ...}
            # every diverging request, each with the target's top-2 margin where the streams part
            "greedy_divergences": divergences,
            "greedy_tie_margin": greedy_tie_margin,
            "greedy_ties": None if divergences is None else sum(d["verdict"] == "tie" for d in divergences),
            "greedy_failures": None if divergences is None else sum(d["verdict"] == "failure" for d in divergences),
            "tau_counts": tau_counts,
            "acceptance_histogram": histogram,
            # Per request, for paired bootstrap intervals between drafters (dpace.report.intervals).
            "requests": _per_request(cell, request_tau),
        })
    return rows


def _greedy_divergences(cell: list[dict], greedy_tie_margin: float) -> tuple[int, list[dict]]:
    """Token positions that differ from greedy decoding over a cell's decoded requests, and every diverging
    request with its verdict (``divergence_verdict``), in the cell's order."""
    mismatches, divergences = 0, []
    for record in cell:
        for turn in record["turns"]:
            if turn["greedy"] is None:  # replayed, not decoded
                continue
            mismatches += turn["greedy"]["mismatches"]
            verdict = divergence_verdict(turn["greedy"], greedy_tie_margin)
            if verdict is not None:
                divergences.append({"id": record["id"], "turn": turn["turn"], **turn["greedy"], "verdict": verdict})
    return mismatches, divergences


def _per_request(cell: list[dict], request_tau) -> list[dict]:
    return [
        {"id": record["id"], "turn": turn["turn"],
         "tau": request_tau(turn),
         "ar_tpot_s": turn["ar"]["time_per_output_token_s"] if turn.get("ar") else None,
         "spec_tpot_s": turn["spec"]["time_per_output_token_s"] if turn.get("spec") else None}
        for record in cell for turn in record["turns"]
    ]


def _replay_check(cell: list[dict]) -> dict | None:
    """Counts of the exactness check of replayed tau (``dpace.evaluation.replay.compare_replay``) over a cell's
    decoded requests, with every failure named; None when no request was replayed and decoded."""
    checks = [(record, turn) for record in cell for turn in record["turns"] if turn.get("replay_check")]
    if not checks:
        return None
    verdicts = [turn["replay_check"]["verdict"] for _, turn in checks]
    return {
        "requests_compared": len(checks),
        "equal": verdicts.count("equal"),
        "ties": verdicts.count("tie"),
        "failures": verdicts.count("failure"),
        "failed": [{"benchmark": record["benchmark"], "temperature": record["temperature"], "id": record["id"],
                    "turn": turn["turn"], **turn["replay_check"]}
                   for record, turn in checks if turn["replay_check"]["verdict"] == "failure"],
    }
