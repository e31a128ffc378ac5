"""Emitted length tau and wall-clock speedup SR of a drafter on benchmark prompts, as DFlash measures them.

For every benchmark, temperature and prompt, the target decodes speculatively with the drafter and
autoregressively on its own (after one short warm-up). Every turn of a prompt is one request:

* SR  = mean autoregressive time per output token / mean speculative time per output token,
* tau = mean over requests of the request's mean emitted length per step (bonus included),
* acceptance histogram = fraction of all verification steps that emitted 0, 1, ..., B tokens.

Two choices follow DFlash's benchmark by default and are named settings (``TAU_COUNTS``,
``dpace.evaluation.decoding.DECODE_CLOCKS``) because dflash 0.1.0 on PyPI changed both: what a step's length is
when a stop token ends the output inside it, and whether the first draft call is decode time.

MT-Bench style rows have several turns: each turn is appended after the model's own (speculative)
answer to the previous one, as DFlash's benchmark does. At T = 0 the speculative output is compared
token for token with the greedy one. Generated text (HumanEval/MBPP code included) is only ever
decoded to text for the next turn's prompt, never executed.

The autoregressive half does not depend on the drafter. ``measure_baseline`` runs it once per target
and every drafter's evaluation reads it (``baseline_path``), so all drafters are compared against the
same baseline times: their SR differences then come from their own decoding only, not from the
baseline's run-to-run jitter, and each evaluation skips about a third of its work. Without a
baseline file each evaluation times the target itself, prompt by prompt, in the same process.

With ``tau="replay"`` (``eval.tau``, the default) tau comes from every prompt without decoding it:
the target's answers and features (``measure_baseline``, once per target) are replayed by each drafter
(``dpace.evaluation.replay``), and only the first ``decoded_prompts`` prompts of each benchmark are decoded for
real: SR comes from them, and their steps are compared with the replayed ones, a difference beyond a
near-tie failing the job (``ReplayMismatch``). At T > 0 hard-match samples the target keyed by
request and position, so the decoded and the replayed answer are the same sample.

The job is resumable: one record per finished prompt is appended to ``records_path`` and prompts
already recorded are skipped on a rerun; the summary (JSON) and per-block table (CSV) are written
atomically from all records at the end.
"""

from __future__ import annotations

import csv
import io
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from dpace.evaluation.decoding import (
    autoregressive_generate,
    compare_to_greedy,
    speculative_generate,
    surrogate,
)
from dpace.evaluation.eval_config import (  # noqa: F401 (re-exported: the evaluation's public names)
    GREEDY_TIE_MARGIN,
    TAU_COUNTS,
    TAU_SOURCES,
    EvalConfig,
    ReferenceSettings,
)
from dpace.evaluation.eval_records import (  # noqa: F401 (re-exported: the evaluation's public names)
    BLOCK_COLUMNS,
    TOO_LONG,
    WARMUP_TOKENS,
    divergence_verdict,
    evaluation_plan,
    exceeds_context,
    key_of,
    load_benchmark,
    prompt_checksum,
    record_key,
    request_key,
    select_records,
    summarize,
)
from dpace.evaluation.replay import (
    batched_answers,
    compare_replay,
    needed_context_start,
    reference_turn,
    replay_turn,
    target_features,
)
from dpace.io import (
    JsonlAppender,
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_text,
    current_records,
    input_checksum,
    read_partial_jsonl,
)
from dpace.targets import chat_prompt_ids, load_target, stop_token_ids, target_checksum
from dpace.training.drafter import check_drafter_matches_target, default_target_layer_ids, load_drafter


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


def _prompt_fingerprint(prompt_ids) -> int:
    """Identifies a turn's prompt tokens, so that a baseline turn is only compared with the same prompt."""
    return zlib.crc32(repr([int(t) for t in prompt_ids]).encode())


def _sampling_key(temperature, verification, request_seed) -> int | None:
    """Hard-match at T > 0 samples the target keyed by (request, position) (``dpace.evaluation.decoding.keyed_gumbel``):
    the speculative output then equals the autoregressive one token for token, which replay needs."""
    return request_seed if temperature > 0 and verification in ("hard-match", BASELINE) else None


def _autoregressive(target, prompt_ids, temperature, request_seed, *, stops, max_new_tokens, device):
    return autoregressive_generate(
        target, prompt_ids, max_new_tokens=max_new_tokens, stop_token_ids=stops,
        temperature=temperature, generator=_generator(device, request_seed),
        sampling_key=_sampling_key(temperature, BASELINE, request_seed),
    )


def _evaluate_prompt(
    row, prompt_index, benchmark, temperature, verification, *, target, drafter, tokenizer, stops,
    max_new_tokens, seed, check_greedy, device, decode_clock, baseline: dict | None = None,
) -> dict:
    """Decode every turn of ``row`` speculatively; the autoregressive times and greedy tokens come from
    ``baseline`` (that row's ``measure_baseline`` record) when given, else from decoding here."""
    messages, turns = [], []
    for turn_index, text in enumerate(row["turns"]):
        messages.append({"role": "user", "content": text})
        prompt_ids = chat_prompt_ids(tokenizer, messages)
        request_seed = _seed_for(seed, benchmark, str(row["id"]), turn_index, float(temperature))
        run_ar = partial(_autoregressive, target, prompt_ids, temperature, request_seed, stops=stops,
                         max_new_tokens=max_new_tokens, device=device)
        greedy_ids = None
        if baseline is None:
            ar = run_ar()
            ar_timing, greedy_ids = _timing(ar), ar.new_token_ids
        else:
            base_turn = baseline["turns"][turn_index]
            ar_timing = base_turn["ar"]
            if ar_timing is None:
                raise ValueError(f"the shared baseline did not time {benchmark} {row['id']} (its timed_prompts)")
            # A later turn's prompt holds the speculative answer to the one before; it is the baseline's
            # own answer unless the two parted (a near-tie in bf16), and only then the tokens differ.
            if base_turn["prompt_fingerprint"] == _prompt_fingerprint(prompt_ids):
                greedy_ids = base_turn["new_token_ids"]
        key = _sampling_key(temperature, verification, request_seed)
        spec = speculative_generate(
            drafter, target, prompt_ids, max_new_tokens=max_new_tokens, stop_token_ids=stops,
            temperature=temperature, verification=verification,
            generator=_generator(device, request_seed + 1), decode_clock=decode_clock, sampling_key=key,
        )
        turn = {
            "turn": turn_index,
            "ar": ar_timing,
            "spec": _timing(spec),
            "acceptance_lengths": spec.acceptance_lengths,
            "block_lengths": spec.block_lengths,
            "blocks": [{"accepted": b.accepted, "emitted": b.emitted, "q": b.q} for b in spec.blocks],
            "greedy": None,
            "new_token_ids": spec.new_token_ids,
            "prompt_fingerprint": _prompt_fingerprint(prompt_ids),
        }
        if temperature == 0 and check_greedy:
            if greedy_ids is None:  # this prompt is not the baseline's: its greedy answer is decoded here
                greedy_ids = run_ar().new_token_ids
            turn["greedy"] = compare_to_greedy(spec.new_token_ids, greedy_ids, target, prompt_ids)
        turns.append(turn)
        messages.append({"role": "assistant", "content": tokenizer.decode(spec.new_token_ids, skip_special_tokens=True)})
    return {
        "benchmark": benchmark,
        "id": str(row["id"]),
        "prompt_checksum": prompt_checksum(row),
        "prompt_index": prompt_index,
        "temperature": float(temperature),
        "verification": verification,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "decode_clock": decode_clock,
        "block_size": drafter.block_size,
        "turns": turns,
    }


def _warm_up(target, drafter, tokenizer, stops, text, temperatures, verification, device, *, autoregressive=True) -> None:
    """One short untimed run per temperature, so first-call costs stay out of the measurements."""
    prompt_ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])
    for temperature in sorted(set(temperatures)):
        generator = _generator(device, 0)
        if autoregressive:
            autoregressive_generate(target, prompt_ids, max_new_tokens=WARMUP_TOKENS, stop_token_ids=stops,
                                    temperature=temperature, generator=generator)
        if drafter is not None:
            speculative_generate(drafter, target, prompt_ids, max_new_tokens=WARMUP_TOKENS, stop_token_ids=stops,
                                 temperature=temperature, verification=verification, generator=generator)


def _pending(plan, records, verification) -> dict[tuple[str, float], list[tuple[int, dict]]]:
    """The plan's requests not yet in ``records``, grouped by (benchmark, temperature)."""
    done = {key_of(r) for r in records}
    todo: dict[tuple[str, float], list[tuple[int, dict]]] = {}
    for name, temperature, index, row in plan:
        pending = todo.setdefault((name, temperature), [])
        if request_key(name, temperature, verification, row) not in done:
            pending.append((index, row))
    return todo


def _progress(plan, name, temperature, pending):
    total = sum(1 for b, t, _, _ in plan if (b, t) == (name, temperature))
    return tqdm(pending, total=total, initial=total - len(pending), desc=f"{name} T={temperature:g}", unit="prompt")


def _check_made(records, records_path, **made) -> None:
    """Refuse an input file written with other decoding settings (its prompts would mix two runs)."""
    for record in records:
        theirs = {key: record.get(key) for key in made}
        if theirs != made:
            def listed(settings):
                return ", ".join(f"{key}={value}" for key, value in settings.items())
            raise ValueError(f"{records_path} holds records made with {listed(theirs)}; this run asks for "
                             f"{listed(made)}: use a new records file")


# The baseline's records are keyed like an evaluation's, with this in place of a verification rule.
BASELINE = "autoregressive"


def skipped_record(row, prompt_index, benchmark, temperature, made: dict) -> dict:
    """The record of a request skipped for the target's context (``exceeds_context``): counted, never scored.
    ``made``: the job's cache key, its verification rule included."""
    return {**made, "benchmark": benchmark, "id": str(row["id"]), "prompt_checksum": prompt_checksum(row),
            "prompt_index": prompt_index, "temperature": float(temperature), "skipped": TOO_LONG, "turns": []}


def _fitting(pending, benchmark, temperature, verification, *, tokenizer, target, block_size, max_new_tokens, made,
             appender, records) -> list[tuple[int, dict]]:
    """``pending`` without the requests that could run past the target's context, recorded as skipped."""
    context = int(target.config.max_position_embeddings)
    fitting = []
    for index, row in pending:
        if exceeds_context(tokenizer, row, max_new_tokens=max_new_tokens, block_size=block_size, context=context):
            record = skipped_record(row, index, benchmark, temperature, made)
            print(f"{benchmark} {row['id']}: prompt + {max_new_tokens} new tokens + a block of {block_size} may pass "
                  f"the target's context of {context} positions: skipped (skipped_too_long)", flush=True)
            appender.write(record)
            records.append(record)
        else:
            fitting.append((index, row))
    return fitting


def measure_baseline(
    target_json,
    benchmark_files: dict[str, str | Path],
    config: EvalConfig,
    *,
    records_path,
    out_path,
    device: str = "cpu",
    features_path=None,
    reference: ReferenceSettings | None = None,
) -> list[dict]:
    """Time the target decoding alone on every request of the evaluation plan; write ``out_path``.

    One record per (benchmark, temperature, prompt), as ``evaluate_drafter`` plans them, each turn
    after the target's own answer to the one before. Per turn: its prompt's tokens and fingerprint,
    the timing and the new tokens (the greedy reference of the lossless check at T = 0; at T > 0 the
    target's sample keyed by request and position, ``_sampling_key``), and the ``overrun`` tokens the
    target picks after a stop token (``dpace.evaluation.replay.reference_turn``): the reference answers replayed
    tau reads. Request seeds are the ones ``evaluate_drafter`` gives its in-process baseline, so both
    sample the same answers. Resumable through ``records_path`` like ``evaluate_drafter``.

    ``config``: the evaluation's settings (its temperatures, max_new_tokens, seed, dtype,
    sampled_prompts_per_benchmark and shared_features are read); ``reference``: how the answers are made.

    ``features_path``: also write the target's context features (``reference.feature_layer_ids``) of every
    turn's prompt + answer, once for every drafter's replay: a dict by ``feature_key`` of (first
    position, [positions, features] tensor in ``dtype``); with ``feature_window`` W > 0 only from W
    positions before the answer (what a sliding-window drafter can see), else from position 0.

    ``reference.timed_prompts``: only the first N prompts of each benchmark and temperature are decoded batch-1
    and timed (the ones an evaluation decodes for real, whose answers its exactness check compares
    with); the others' answers come from ``dpace.evaluation.replay.batched_answers`` in batches of
    ``batch_size``, with ``"ar": None`` (None: every prompt timed). ``shared_features=False`` writes
    ``features_path`` empty: each evaluation then computes the features itself (one target forward per
    request), for long answers of wide targets whose features would not fit on disk.
    """
    reference = reference or ReferenceSettings()
    dtype_name, temperatures = config.dtype, list(config.temperatures)
    max_new_tokens, seed, overrun, timed_prompts = config.max_new_tokens, config.seed, reference.overrun, \
        reference.timed_prompts
    benchmarks = {name: load_benchmark(path, name) for name, path in benchmark_files.items()}
    plan = evaluation_plan(benchmarks, temperatures, config.sampled_prompts_per_benchmark)
    # Records of another target or other settings are stale: answered again.
    made = {**config.key(), **reference.key(), "verification": BASELINE, "target": target_checksum(target_json),
            "sampling": "keyed"}
    records = current_records(records_path, **made)
    todo = _pending(plan, records, BASELINE)
    target = tokenizer = None
    if any(todo.values()):
        target, tokenizer = load_target(target_json, device=device, dtype=getattr(torch, dtype_name))
        stops = stop_token_ids(tokenizer)
        first_row = next(row for pending in todo.values() for _, row in pending)
        _warm_up(target, None, tokenizer, stops, first_row["turns"][0], temperatures, BASELINE, device)
        with JsonlAppender(records_path) as appender:
            for (name, temperature), pending in todo.items():
                pending = _fitting(pending, name, temperature, BASELINE, tokenizer=tokenizer, target=target,
                                   block_size=0, max_new_tokens=max_new_tokens, made=made, appender=appender,
                                   records=records)
                untimed = [(i, row) for i, row in pending if timed_prompts is not None and i >= timed_prompts]
                for start in range(0, len(untimed), reference.batch_size):
                    chunk = untimed[start : start + reference.batch_size]
                    for record in _batched_answer_records(chunk, name, temperature, target=target, tokenizer=tokenizer,
                                                          stops=stops, seed=seed, max_new_tokens=max_new_tokens,
                                                          overrun=overrun):
                        record.update(made)
                        appender.write(record)
                        records.append(record)
                    print(f"{name} T={temperature:g}: {start + len(chunk)} of {len(untimed)} untimed prompts answered",
                          flush=True)
                pending = [(i, row) for i, row in pending if timed_prompts is None or i < timed_prompts]
                for index, row in _progress(plan, name, temperature, pending):
                    messages, turns = [], []
                    for turn_index, text in enumerate(row["turns"]):
                        messages.append({"role": "user", "content": text})
                        prompt_ids = chat_prompt_ids(tokenizer, messages)
                        request_seed = _seed_for(seed, name, str(row["id"]), turn_index, temperature)
                        ar, continuation = reference_turn(
                            target, prompt_ids, temperature=temperature, stop_token_ids=stops,
                            sampling_key=_sampling_key(temperature, BASELINE, request_seed),
                            max_new_tokens=max_new_tokens, overrun=overrun, generator=_generator(device, request_seed))
                        turns.append({"turn": turn_index, "prompt_fingerprint": _prompt_fingerprint(prompt_ids),
                                      "ar": _timing(ar), "new_token_ids": ar.new_token_ids,
                                      "prompt_ids": [int(t) for t in prompt_ids], "continuation_ids": continuation})
                        messages.append({"role": "assistant",
                                         "content": tokenizer.decode(ar.new_token_ids, skip_special_tokens=True)})
                    record = {"benchmark": name, "id": str(row["id"]), "prompt_checksum": prompt_checksum(row),
                              "prompt_index": index, "temperature": temperature, "verification": BASELINE, **made,
                              "turns": turns}
                    appender.write(record)
                    records.append(record)
    selected = select_records(records, plan, BASELINE)
    if features_path is not None and not config.shared_features:  # an empty file: evaluations compute their own
        atomic_save_torch(features_path, {"layer_ids": [], "dtype": dtype_name, "features": {}})
    elif features_path is not None:
        if target is None:
            target, _ = load_target(target_json, device=device, dtype=getattr(torch, dtype_name))
        feature_layer_ids, feature_window = reference.feature_layer_ids, reference.feature_window
        if feature_layer_ids is None:  # the drafters' default (SpecForge's build_target_layer_ids)
            if reference.num_target_features is None:
                raise ValueError("shared features need feature_layer_ids or num_target_features")
            feature_layer_ids = default_target_layer_ids(target.config.num_hidden_layers, reference.num_target_features)
        features = {}
        for record in tqdm(selected, desc="features", unit="prompt"):
            for turn in record["turns"]:
                prompt_ids = turn["prompt_ids"]
                start = 0 if not feature_window else max(0, len(prompt_ids) - int(feature_window) + 1)
                features[feature_key(record, turn["turn"])] = (
                    start, target_features(target, prompt_ids + turn["new_token_ids"], feature_layer_ids, start).cpu())
        atomic_save_torch(features_path, {"layer_ids": list(feature_layer_ids), "dtype": dtype_name,
                                          "features": features})
    atomic_write_jsonl(out_path, selected)
    return selected


def _batched_answer_records(chunk, benchmark, temperature, *, target, tokenizer, stops, seed, max_new_tokens,
                            overrun) -> list[dict]:
    """``measure_baseline`` records of ``chunk``'s prompts, answered in batches turn by turn (untimed)."""
    messages = {index: [] for index, _ in chunk}
    turns = {index: [] for index, _ in chunk}
    for turn_index in range(max(len(row["turns"]) for _, row in chunk)):
        rows = [(index, row) for index, row in chunk if turn_index < len(row["turns"])]
        prompts = []
        for index, row in rows:
            messages[index].append({"role": "user", "content": row["turns"][turn_index]})
            prompts.append(chat_prompt_ids(tokenizer, messages[index]))
        keys = [_sampling_key(temperature, BASELINE, _seed_for(seed, benchmark, str(row["id"]), turn_index, temperature))
                for _, row in rows]
        answers = batched_answers(target, prompts, temperature=temperature, sampling_keys=keys, stop_token_ids=stops,
                                  max_new_tokens=max_new_tokens, overrun=overrun)
        for (index, _), prompt_ids, (answer, continuation) in zip(rows, prompts, answers, strict=True):
            turns[index].append({"turn": turn_index, "prompt_fingerprint": _prompt_fingerprint(prompt_ids), "ar": None,
                                 "new_token_ids": answer, "prompt_ids": [int(t) for t in prompt_ids],
                                 "continuation_ids": continuation})
            messages[index].append({"role": "assistant", "content": tokenizer.decode(answer, skip_special_tokens=True)})
    return [{"benchmark": benchmark, "id": str(row["id"]), "prompt_checksum": prompt_checksum(row), "prompt_index": index,
             "temperature": temperature, "verification": BASELINE, "turns": turns[index]} for index, row in chunk]


def feature_key(record: dict, turn: int) -> str:
    return f"{record['benchmark']}|{float(record['temperature'])}|{record['id']}|{record['prompt_checksum']}|{turn}"


def atomic_save_torch(path, value) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(value, tmp)
    tmp.replace(path)


def load_baseline(path, *, max_new_tokens: int, seed: int, dtype: str | torch.dtype,
                  target: int) -> tuple[int, dict[tuple, dict]]:
    """A checksum of a ``measure_baseline`` file (evaluation records remember which baseline they were
    timed against) and its records by (benchmark, temperature, id); ``target``: ``target_checksum``."""
    path = Path(path)
    records = read_partial_jsonl(path)
    _check_made(records, path, max_new_tokens=max_new_tokens, seed=seed, dtype=str(dtype).removeprefix("torch."),
                target=target)
    return zlib.crc32(path.read_bytes()), {
        (r["benchmark"], float(r["temperature"]), r["id"], r.get("prompt_checksum")): r for r in records}


def baseline_key(benchmark: str, temperature: float, row: dict) -> tuple:
    """The key of ``load_baseline``'s record of a planned request: only one of the very same prompt text."""
    return (benchmark, float(temperature), str(row["id"]), prompt_checksum(row))


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




class ReplayMismatch(RuntimeError):
    """Replayed step lengths differ from real speculative decoding beyond a near-tie."""


def _load_features(path, drafter) -> dict:
    """Shared context features by ``feature_key``, if made for this drafter's layers (else recomputed)."""
    if path is None or not Path(path).exists():
        return {}
    stored = torch.load(path, weights_only=True)
    if list(stored["layer_ids"]) != [int(i) for i in drafter.target_layer_ids]:
        return {}
    return stored["features"]


def _replay_prompt(row, prompt_index, benchmark, temperature, verification, *, target, drafter, tokenizer, stops,
                   max_new_tokens, seed, device, decode_clock, reference, features, decode, tie_margin, baseline,
                   compare_steps) -> dict:
    """One prompt's record with replayed steps; decoded for real too when ``decode`` (timed, and checked)."""
    turns, replays = [], []
    if reference["turns"][0]["prompt_ids"] != chat_prompt_ids(tokenizer, [{"role": "user", "content": row["turns"][0]}]):
        raise ValueError(f"the reference answers were made for another prompt of {benchmark} {row['id']}")
    for ref_turn in reference["turns"]:
        prompt_ids = ref_turn["prompt_ids"]
        stored = features.get(feature_key(reference, ref_turn["turn"]))
        needed = needed_context_start(drafter, len(prompt_ids))
        if stored is not None and stored[0] <= needed:
            start, feats = stored[0], stored[1].to(device=device, dtype=target.dtype)
        else:
            start = needed
            feats = target_features(target, prompt_ids + ref_turn["new_token_ids"], drafter.target_layer_ids, start)
        replayed = replay_turn(drafter, target, feats, start, prompt_ids, ref_turn["new_token_ids"],
                               ref_turn.get("continuation_ids", []), max_new_tokens=max_new_tokens,
                               stop_token_ids=stops)
        replays.append(replayed)
        turns.append({
            "turn": ref_turn["turn"], "ar": None, "spec": None,
            "acceptance_lengths": replayed.acceptance_lengths, "block_lengths": replayed.block_lengths,
            "blocks": [{"accepted": b.accepted, "emitted": b.emitted, "q": b.q} for b in replayed.blocks],
            "greedy": None, "replay_check": None,
        })
    if decode:
        decoded = _evaluate_prompt(
            row, prompt_index, benchmark, temperature, verification, target=target, drafter=drafter,
            tokenizer=tokenizer, stops=stops, max_new_tokens=max_new_tokens, seed=seed, check_greedy=True,
            device=device, decode_clock=decode_clock, baseline=baseline)
        previous = None
        for turn, replayed, ref_turn, real in zip(turns, replays, reference["turns"], decoded["turns"], strict=True):
            turn.update(ar=real["ar"], spec=real["spec"], greedy=real["greedy"])
            if real["prompt_fingerprint"] != ref_turn["prompt_fingerprint"]:
                # the previous turn's answer parted from the reference: this turn's prompt is another one
                check = {**previous, "cause": "previous turn"}
            else:
                request_seed = _seed_for(seed, benchmark, str(row["id"]), ref_turn["turn"], float(temperature))
                divergence = compare_to_greedy(real["new_token_ids"], ref_turn["new_token_ids"], target,
                                               ref_turn["prompt_ids"], temperature=temperature,
                                               sampling_key=_sampling_key(temperature, verification, request_seed))
                check = compare_steps(turn, real, greedy_tie_margin=tie_margin, target_divergence=divergence,
                                      drafter_margins=replayed.margins)
            turn["replay_check"] = previous = check
    return {
        "benchmark": benchmark, "id": str(row["id"]), "prompt_checksum": prompt_checksum(row),
        "prompt_index": prompt_index, "temperature": float(temperature), "verification": verification, "max_new_tokens": max_new_tokens, "seed": seed, "decode_clock": decode_clock,
        "block_size": drafter.block_size, "turns": turns,
    }


@dataclass(frozen=True)
class TargetAnswers:
    """``measure_baseline``'s outputs an evaluation reads: ``baseline``, its times and greedy tokens (the
    autoregressive half; None: decoded here); ``reference``, its answers replayed tau reads (the same file
    where both are shared); ``features``, their context features (None or other layers: recomputed)."""

    baseline: str | Path | None = None
    reference: str | Path | None = None
    features: str | Path | None = None


def evaluate_drafter(
    target_json,
    drafter_dir,
    benchmark_files: dict[str, str | Path],
    config: EvalConfig,
    *,
    records_path,
    summary_path,
    blocks_path,
    device: str = "cpu",
    answers: TargetAnswers | None = None,
    compare_steps=compare_replay,
) -> list[dict]:
    """Evaluate a drafter on every benchmark and temperature of ``config``; return (and write) the summary rows.

    ``config.tau``: "decode" (every request decoded speculatively, as DFlash's benchmark) or "replay":
    every request's steps are replayed over the target's answer (``dpace.evaluation.replay``) from
    ``answers.reference`` (a ``measure_baseline`` file made with an overrun; ``answers.features`` its
    features, recomputed here when absent or made for other layers), and only the first
    ``decoded_prompts_per_benchmark`` prompts of each benchmark and temperature
    (``sampled_decoded_prompts_per_benchmark`` at T > 0, None: the same) are decoded for real: their times
    give SR, and their step lengths are compared with the replayed ones (``compare_steps``,
    ``dpace.evaluation.replay.compare_replay``). A difference that is not a near-tie fails the evaluation
    (``ReplayMismatch``, naming the request and answer position) after the records are written.

    ``answers.baseline``: a ``measure_baseline`` file with the same plan, ``max_new_tokens``, seed and
    dtype, whose times and greedy tokens stand for the autoregressive half (None: decode it here).

    Target and drafter run in ``config.dtype`` ("float32" or "bfloat16"; in bf16, batched and one-token
    forwards round differently, so greedy outputs can part at near-ties: divergences below
    ``greedy_tie_margin`` are counted as ties, others as failures, see ``divergence_verdict``).
    """
    config.check()
    answers = answers or TargetAnswers()
    tau, verification, max_new_tokens, seed = config.tau, config.verification, config.max_new_tokens, config.seed
    decode_clock, tie_margin, check_greedy = config.decode_clock, config.greedy_tie_margin, True
    baseline_path, reference_path, features_path = answers.baseline, answers.reference, answers.features
    if tau == "replay" and (reference_path is None or verification != "hard-match"):
        raise ValueError("tau='replay' needs reference answers (reference_path) and hard-match verification")
    dtype = getattr(torch, config.dtype)
    benchmarks = {name: load_benchmark(path, name) for name, path in benchmark_files.items()}
    temperatures = list(config.temperatures)
    plan = evaluation_plan(benchmarks, temperatures, config.sampled_prompts_per_benchmark)
    target = target_checksum(target_json)
    baseline_id, baseline = None, None
    if baseline_path is not None:
        baseline_id, baseline = load_baseline(baseline_path, max_new_tokens=max_new_tokens, seed=seed, dtype=dtype,
                                              target=target)
        missing = [(name, t, row["id"]) for name, t, _, row in plan if baseline_key(name, t, row) not in baseline]
        if missing:
            raise ValueError(f"{baseline_path} lacks {len(missing)} request(s) of this evaluation, e.g. {missing[0]}")
    # Records of another drafter, target, dtype or baseline (or none) are stale: decoded again.
    made = {**config.key(), "drafter": input_checksum(drafter_dir), "target": target, "ar_baseline": baseline_id,
            "references": None, "sampling": "keyed"}
    references = None
    if tau == "replay":
        references_id, references = load_baseline(reference_path, max_new_tokens=max_new_tokens, seed=seed,
                                                  dtype=dtype, target=target)
        missing = [(name, t, row["id"]) for name, t, _, row in plan if baseline_key(name, t, row) not in references]
        if missing:
            raise ValueError(f"{reference_path} lacks {len(missing)} request(s) of this evaluation, e.g. {missing[0]}")
        made.update(references=references_id)
    decoded_count = config.decoded_prompts

    records = current_records(records_path, **made)
    todo = _pending(plan, records, verification)

    if any(todo.values()):
        target, tokenizer = load_target(target_json, device=device, dtype=dtype)
        drafter = load_drafter(drafter_dir, dtype=dtype).to(device)
        check_drafter_matches_target(drafter.config, target.config)
        stops = stop_token_ids(tokenizer)
        first_row = next(row for pending in todo.values() for _, row in pending)
        decodes = tau == "decode" or any(index < decoded_count(t) for (_, t), p in todo.items() for index, _ in p)
        if decodes:
            _warm_up(target, drafter, tokenizer, stops, first_row["turns"][0], temperatures, verification, device,
                     autoregressive=baseline is None)
        features = _load_features(features_path, drafter) if tau == "replay" else {}
        with JsonlAppender(records_path) as appender:
            for (name, temperature), pending in todo.items():
                pending = _fitting(pending, name, temperature, verification, tokenizer=tokenizer, target=target,
                                   block_size=drafter.block_size, max_new_tokens=max_new_tokens,
                                   made={**made, "block_size": drafter.block_size}, appender=appender, records=records)
                for index, row in _progress(plan, name, temperature, pending):
                    if tau == "replay":
                        record = _replay_prompt(
                            row, index, name, temperature, verification, target=target, drafter=drafter,
                            tokenizer=tokenizer, stops=stops, max_new_tokens=max_new_tokens, seed=seed,
                            device=device, decode_clock=decode_clock, reference=references[baseline_key(name, temperature, row)],
                            features=features, decode=index < decoded_count(temperature), tie_margin=tie_margin,
                            baseline=None if baseline is None else baseline[baseline_key(name, temperature, row)],
                            compare_steps=compare_steps)
                        record.update(made)
                        appender.write(record)
                        records.append(record)
                        continue
                    base = None if baseline is None else baseline[baseline_key(name, temperature, row)]
                    if base is not None and base["turns"][0]["prompt_fingerprint"] != _prompt_fingerprint(
                            chat_prompt_ids(tokenizer, [{"role": "user", "content": row["turns"][0]}])):
                        raise ValueError(f"{baseline_path} timed another prompt for {name} {row['id']}")
                    record = _evaluate_prompt(
                        row, index, name, temperature, verification, target=target, drafter=drafter,
                        tokenizer=tokenizer, stops=stops, max_new_tokens=max_new_tokens, seed=seed,
                        check_greedy=check_greedy, device=device, decode_clock=decode_clock, baseline=base,
                    )
                    record.update(made)
                    appender.write(record)
                    records.append(record)

    selected = select_records(records, plan, verification)
    summary = summarize(selected, tau_counts=config.tau_counts, greedy_tie_margin=tie_margin)
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
        check = row.get("replay_check")
        if check:
            print(f"replay check {row['benchmark']} T={row['temperature']:g}: {check['requests_compared']} request(s) "
                  f"compared, {check['equal']} equal, {check['ties']} near-tie(s), {check['failures']} failure(s)")
    failures = [f for row in summary for f in (row.get("replay_check") or {}).get("failed", [])]
    if failures:
        first = failures[0]
        raise ReplayMismatch(
            f"replayed tau differs from speculative decoding in {len(failures)} request(s) beyond a near-tie "
            f"(margin >= {tie_margin:g}); first: {first['benchmark']} T={first['temperature']:g} {first['id']} turn "
            f"{first['turn']}, step {first['step']} at answer position {first['position']} ({first['cause']}, margin "
            f"{first['margin']})")
    atomic_write_json(summary_path, summary)
    atomic_write_text(blocks_path, blocks_csv(selected))
    return summary
