"""Emitted length tau and wall-clock speedup SR of a drafter on benchmark prompts, as DFlash measures them.

For every benchmark, temperature and prompt, the target decodes autoregressively and then
speculatively in the same process (after one short warm-up). Every turn of a prompt is one request:

* SR  = mean autoregressive time per output token / mean speculative time per output token,
* tau = mean over requests of the request's mean emitted length per step (bonus included),
* acceptance histogram = fraction of all verification steps that emitted 0, 1, ..., B tokens.

Two choices follow DFlash's benchmark by default and are named settings (``TAU_COUNTS``,
``dpace.decoding.DECODE_CLOCKS``) because dflash 0.1.0 on PyPI changed both: what a step's length is
when a stop token ends the output inside it, and whether the first draft call is decode time.

MT-Bench style rows have several turns: each turn is appended after the model's own (speculative)
answer to the previous one, as DFlash's benchmark does. At T = 0 the speculative output is compared
token for token with the greedy one. Generated text (HumanEval/MBPP code included) is only ever
decoded to text for the next turn's prompt, never executed.

The job is resumable: one record per finished prompt is appended to ``records_path`` and prompts
already recorded are skipped on a rerun; the summary (JSON) and per-block table (CSV) are written
atomically from all records at the end.
"""

from __future__ import annotations

import csv
import io
import statistics
import zlib
from collections.abc import Iterable
from pathlib import Path

import torch
from tqdm import tqdm

from dpace.decoding import (
    DECODE_CLOCKS,
    autoregressive_generate,
    compare_to_greedy,
    speculative_generate,
    surrogate,
)
from dpace.drafter import check_drafter_matches_target, load_drafter
from dpace.io import JsonlAppender, atomic_write_json, atomic_write_text, read_jsonl, read_partial_jsonl
from dpace.targets import chat_prompt_ids, load_target, stop_token_ids

BLOCK_COLUMNS = ["benchmark", "temperature", "prompt_index", "block_index", "tau_block", "sum_q", "surrogate", "turn"]
WARMUP_TOKENS = 16
# A step's length in tau and the histogram:
# "accepted-plus-bonus": accepted + 1 for every step, also the one in which a stop token ends the
#   output (DFlash's benchmark, z-lab/dflash Jan-Apr 2026, which the paper's numbers come from);
# "emitted": the tokens the step added to the output (dflash 0.1.0 on PyPI).
TAU_COUNTS = ("accepted-plus-bonus", "emitted")
# Greedy divergences in bf16: batched (verify) and one-token (autoregressive) forwards round
# differently, so the two greedy streams part where the target's top two logits nearly tie. A
# divergence whose top-2 margin is below this many logits is counted as such a numerical tie; any
# other is a failure of losslessness. bf16 keeps 8 significant bits: a logit between 16 and 32 is
# stored to 0.125, and a few such roundings through the layers move it by more than that.
GREEDY_TIE_MARGIN = 0.5


def load_benchmark(path: str | Path, name: str) -> list[dict]:
    """Rows ``{"id", "benchmark", "turns"}`` of a benchmark jsonl, checked."""
    rows = list(read_jsonl(path))
    for line, row in enumerate(rows, start=1):
        turns = row.get("turns")
        if "id" not in row or not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"{path}: row {line} needs an 'id' and a non-empty list of string 'turns'")
    ids = [str(row["id"]) for row in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate ids in benchmark {name!r}")
    return rows


def _record_key(benchmark: str, temperature: float, verification: str, prompt_id) -> tuple:
    return (benchmark, float(temperature), verification, str(prompt_id))


def _seed_for(seed: int, *parts) -> int:
    """A per-request seed, the same whether a run is fresh or resumed."""
    return zlib.crc32(repr((seed, *parts)).encode()) & 0x7FFFFFFF


def _generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _timing(result) -> dict:
    return {
        "num_input_tokens": result.num_input_tokens,
        "num_output_tokens": result.num_output_tokens,
        "time_to_first_token_s": result.time_to_first_token_s,
        "decode_time_s": result.decode_time_s,
        "time_per_output_token_s": result.time_per_output_token_s,
    }


def _evaluate_prompt(
    row, prompt_index, benchmark, temperature, verification, *, target, drafter, tokenizer, stops,
    max_new_tokens, seed, check_greedy, device, decode_clock,
) -> dict:
    messages, turns = [], []
    for turn_index, text in enumerate(row["turns"]):
        messages.append({"role": "user", "content": text})
        prompt_ids = chat_prompt_ids(tokenizer, messages)
        request_seed = _seed_for(seed, benchmark, str(row["id"]), turn_index, float(temperature))
        ar = autoregressive_generate(
            target, prompt_ids, max_new_tokens=max_new_tokens, stop_token_ids=stops,
            temperature=temperature, generator=_generator(device, request_seed),
        )
        spec = speculative_generate(
            drafter, target, prompt_ids, max_new_tokens=max_new_tokens, stop_token_ids=stops,
            temperature=temperature, verification=verification,
            generator=_generator(device, request_seed + 1), decode_clock=decode_clock,
        )
        turn = {
            "turn": turn_index,
            "ar": _timing(ar),
            "spec": _timing(spec),
            "acceptance_lengths": spec.acceptance_lengths,
            "block_lengths": spec.block_lengths,
            "blocks": [{"accepted": b.accepted, "emitted": b.emitted, "q": b.q} for b in spec.blocks],
            "greedy": None,
        }
        if temperature == 0 and check_greedy:
            turn["greedy"] = compare_to_greedy(spec.new_token_ids, ar.new_token_ids, target, prompt_ids)
        turns.append(turn)
        messages.append({"role": "assistant", "content": tokenizer.decode(spec.new_token_ids, skip_special_tokens=True)})
    return {
        "benchmark": benchmark,
        "id": str(row["id"]),
        "prompt_index": prompt_index,
        "temperature": float(temperature),
        "verification": verification,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "decode_clock": decode_clock,
        "block_size": drafter.block_size,
        "turns": turns,
    }


def _warm_up(target, drafter, tokenizer, stops, text, temperatures, verification, device) -> None:
    """One short untimed run per temperature, so first-call costs stay out of the measurements."""
    prompt_ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])
    for temperature in sorted(set(temperatures)):
        generator = _generator(device, 0)
        autoregressive_generate(target, prompt_ids, max_new_tokens=WARMUP_TOKENS, stop_token_ids=stops,
                                temperature=temperature, generator=generator)
        speculative_generate(drafter, target, prompt_ids, max_new_tokens=WARMUP_TOKENS, stop_token_ids=stops,
                             temperature=temperature, verification=verification, generator=generator)


def evaluation_plan(
    benchmarks: dict[str, list[dict]], temperatures, sampled_prompts: int | None = None
) -> list[tuple[str, float, int, dict]]:
    """(benchmark, temperature, prompt index, row) for every request to decode, benchmark by benchmark.

    Every prompt at T = 0; at T > 0 only the first ``sampled_prompts`` of each benchmark (None: all),
    because sampled decoding is the costlier and noisier half of a CPU evaluation. Every drafter gets
    the same plan, so comparisons between drafters stay paired.
    """
    return [
        (name, float(temperature), index, row)
        for name, rows in benchmarks.items()
        for temperature in temperatures
        for index, row in enumerate(rows)
        if float(temperature) == 0 or sampled_prompts is None or index < sampled_prompts
    ]


def divergence_verdict(greedy: dict, tie_margin: float) -> str | None:
    """``None`` when the speculative and greedy outputs agree; else ``"tie"`` when the target's top-2
    logit margin at the first divergence is below ``tie_margin``, ``"failure"`` when it is not, and
    ``"unknown"`` when no margin was measured (SGLang)."""
    if greedy["first_mismatch"] is None:
        return None
    if greedy.get("top2_margin") is None:
        return "unknown"
    return "tie" if greedy["top2_margin"] < tie_margin else "failure"


def _step_lengths(turn: dict, tau_counts: str) -> list[int]:
    if tau_counts == "accepted-plus-bonus" and turn.get("block_lengths") is not None:
        return turn["block_lengths"]
    return turn["acceptance_lengths"]  # SGLang reports only what the steps emitted


def summarize(
    records: Iterable[dict], *, tau_counts: str = "accepted-plus-bonus", tie_margin: float = GREEDY_TIE_MARGIN
) -> list[dict]:
    """One summary row per (benchmark, temperature, verification), DFlash's definitions."""
    if tau_counts not in TAU_COUNTS:
        raise ValueError(f"tau_counts must be one of {TAU_COUNTS}, got {tau_counts!r}")
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["benchmark"], record["temperature"], record["verification"]), []).append(record)
    rows = []
    for (benchmark, temperature, verification), group in groups.items():
        group.sort(key=lambda r: r["prompt_index"])
        requests = [turn for record in group for turn in record["turns"]]
        block_size = group[0]["block_size"]
        ar_tpot = statistics.fmean(t["ar"]["time_per_output_token_s"] for t in requests)
        spec_tpot = statistics.fmean(t["spec"]["time_per_output_token_s"] for t in requests)
        steps = [_step_lengths(t, tau_counts) for t in requests]
        per_request = [statistics.fmean(s) for s in steps if s]
        lengths = [n for s in steps for n in s]
        histogram = [lengths.count(b) / len(lengths) if lengths else 0.0 for b in range(block_size + 1)]
        mismatches, diverged, first, divergences = None, None, None, None
        if temperature == 0 and all(t["greedy"] is not None for t in requests):
            mismatches, diverged, divergences = 0, 0, []
            for record in group:
                for turn in record["turns"]:
                    mismatches += turn["greedy"]["mismatches"]
                    verdict = divergence_verdict(turn["greedy"], tie_margin)
                    if verdict is not None:
                        diverged += 1
                        report = {"id": record["id"], "turn": turn["turn"], **turn["greedy"], "verdict": verdict}
                        divergences.append(report)
                        if first is None:
                            first = report
        rows.append({
            "benchmark": benchmark,
            "temperature": temperature,
            "verification": verification,
            "block_size": block_size,
            "tau": statistics.fmean(per_request) if per_request else None,
            "speedup": ar_tpot / spec_tpot,
            "ar_tpot_s": ar_tpot,
            "spec_tpot_s": spec_tpot,
            "num_prompts": len(group),
            "num_requests": len(requests),
            "num_output_tokens": sum(t["spec"]["num_output_tokens"] for t in requests),
            "greedy_mismatches": mismatches,  # token positions that differ, over all requests
            "greedy_diverged_requests": diverged,
            "first_mismatch": first,  # {id, turn, first_mismatch (position), top2_margin, verdict, ...}
            # every diverging request, each with the target's top-2 margin where the streams part
            "greedy_divergences": divergences,
            "greedy_tie_margin": tie_margin,
            "greedy_ties": None if divergences is None else sum(d["verdict"] == "tie" for d in divergences),
            "greedy_failures": None if divergences is None else sum(d["verdict"] == "failure" for d in divergences),
            "tau_counts": tau_counts,
            "acceptance_histogram": histogram,
            # Per request, for paired bootstrap intervals between drafters (dpace.intervals).
            "requests": [
                {"id": record["id"], "turn": turn["turn"],
                 "tau": statistics.fmean(lengths) if (lengths := _step_lengths(turn, tau_counts)) else None,
                 "ar_tpot_s": turn["ar"]["time_per_output_token_s"],
                 "spec_tpot_s": turn["spec"]["time_per_output_token_s"]}
                for record in group for turn in record["turns"]
            ],
        })
    return rows


def blocks_csv(records: Iterable[dict]) -> str:
    """Per verification block: emitted length, sum of q and D-PACE's surrogate (paper's Fig. 1a)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(BLOCK_COLUMNS)
    for record in records:
        block_index = 0
        for turn in record["turns"]:
            for block in turn["blocks"]:
                writer.writerow([
                    record["benchmark"], record["temperature"], record["prompt_index"], block_index,
                    block["emitted"], repr(float(sum(block["q"]))), repr(surrogate(block["q"])), turn["turn"],
                ])
                block_index += 1
    return out.getvalue()


def evaluate_drafter(
    target_json,
    drafter_dir,
    benchmark_files: dict[str, str | Path],
    *,
    temperatures,
    verification: str,
    max_new_tokens: int,
    seed: int,
    records_path,
    summary_path,
    blocks_path,
    check_greedy: bool = True,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    sampled_prompts: int | None = None,
    decode_clock: str = "after-first-draft",
    tau_counts: str = "accepted-plus-bonus",
    tie_margin: float = GREEDY_TIE_MARGIN,
) -> list[dict]:
    """Evaluate a drafter on every benchmark and temperature; return (and write) the summary rows.

    Target and drafter run in ``dtype`` ("float32" or "bfloat16"; in bf16, batched and one-token
    forwards round differently, so greedy outputs can part at near-ties: divergences below
    ``tie_margin`` are counted as ties, others as failures, see ``divergence_verdict``).
    """
    if tau_counts not in TAU_COUNTS:
        raise ValueError(f"tau_counts must be one of {TAU_COUNTS}, got {tau_counts!r}")
    if decode_clock not in DECODE_CLOCKS:
        raise ValueError(f"decode_clock must be one of {DECODE_CLOCKS}, got {decode_clock!r}")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    benchmarks = {name: load_benchmark(path, name) for name, path in benchmark_files.items()}
    temperatures = [float(t) for t in temperatures]
    records = read_partial_jsonl(records_path)
    done = {_record_key(r["benchmark"], r["temperature"], r["verification"], r["id"]) for r in records}
    for record in records:
        made = (record["max_new_tokens"], record["seed"], record.get("decode_clock", "after-prefill"))
        if made != (max_new_tokens, seed, decode_clock):
            raise ValueError(
                f"{records_path} holds records made with max_new_tokens={made[0]}, seed={made[1]}, "
                f"decode_clock={made[2]}; this run asks for {max_new_tokens}, {seed}, {decode_clock}: "
                "use a new records file"
            )
    plan = evaluation_plan(benchmarks, temperatures, sampled_prompts)
    todo: dict[tuple[str, float], list[tuple[int, dict]]] = {}
    for name, temperature, index, row in plan:
        pending = todo.setdefault((name, temperature), [])
        if _record_key(name, temperature, verification, row["id"]) not in done:
            pending.append((index, row))

    if any(todo.values()):
        target, tokenizer = load_target(target_json, device=device, dtype=dtype)
        drafter = load_drafter(drafter_dir, dtype=dtype).to(device)
        check_drafter_matches_target(drafter.config, target.config)
        stops = stop_token_ids(tokenizer)
        first_row = next(row for pending in todo.values() for _, row in pending)
        _warm_up(target, drafter, tokenizer, stops, first_row["turns"][0], temperatures, verification, device)
        with JsonlAppender(records_path) as appender:
            for (name, temperature), pending in todo.items():
                total = sum(1 for b, t, _, _ in plan if (b, t) == (name, temperature))
                bar = tqdm(pending, total=total, initial=total - len(pending), desc=f"{name} T={temperature:g}",
                           unit="prompt")
                for index, row in bar:
                    record = _evaluate_prompt(
                        row, index, name, temperature, verification, target=target, drafter=drafter,
                        tokenizer=tokenizer, stops=stops, max_new_tokens=max_new_tokens, seed=seed,
                        check_greedy=check_greedy, device=device, decode_clock=decode_clock,
                    )
                    appender.write(record)
                    records.append(record)
                bar.close()

    wanted = {_record_key(name, t, verification, row["id"]) for name, t, _, row in plan}
    selected = {}
    for r in records:  # first record per prompt wins; other runs' records in the file are left out
        key = _record_key(r["benchmark"], r["temperature"], r["verification"], r["id"])
        if key in wanted:
            selected.setdefault(key, r)
    selected = list(selected.values())
    order = {name: i for i, name in enumerate(benchmarks)}
    selected.sort(key=lambda r: (order[r["benchmark"]], temperatures.index(r["temperature"]), r["prompt_index"]))
    summary = summarize(selected, tau_counts=tau_counts, tie_margin=tie_margin)
    for row in summary:
        for divergence in row["greedy_divergences"] or []:
            margin = divergence["top2_margin"]
            print(
                f"greedy divergence ({divergence['verdict']}): {row['benchmark']} {divergence['id']} turn "
                f"{divergence['turn']} at token {divergence['first_mismatch']}, target top-2 margin "
                f"{'unmeasured' if margin is None else format(margin, '.4g')} (tie below {tie_margin:g})"
            )
        if row["greedy_failures"]:
            print(f"LOSSLESS CHECK FAILED: {row['greedy_failures']} divergence(s) in {row['benchmark']} at margins "
                  f">= {tie_margin:g} logits; speculative decoding changed the greedy output")
    atomic_write_json(summary_path, summary)
    atomic_write_text(blocks_path, blocks_csv(selected))
    return summary
