"""SR of several drafters timed in one process, interleaved prompt by prompt and repeated (the timing job).

An evaluation job no longer times anything under replayed tau: SR is measured here, once per experiment that
claims it (``dpace.experiments.ExperimentSpec.times_speedup``). The job loads the target and every compared
drafter, then, ``repeats`` times over the first prompts of each benchmark and temperature, decodes each request
with the target alone and with every drafter, one right after another, in an order that rotates from request to
request (so no drafter always runs first, or always after the same one). A change of the machine's speed then
reaches every drafter of a request alike, and a change between repeats shows up as repeat-to-repeat spread, which
the SR interval resamples (``dpace.report.timing``).

Output: one CSV row per (request turn, repeat, decoder): ``dpace.timing_records.TIMING_COLUMNS``. Each turn's
prompt follows the target's own answer to the turn before (at T = 0 the greedy answer, which every drafter's
speculative decoding also produces; at T > 0 the keyed sample, the same for every drafter under hard-match).
The job holds the machine's timing lock of its device throughout (``dpace.locks``); a killed job starts over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from dpace.evaluation.decoding import autoregressive_generate, speculative_generate
from dpace.evaluation.eval_config import EvalConfig
from dpace.evaluation.eval_records import WARMUP_TOKENS, evaluation_plan, exceeds_context, load_benchmark
from dpace.evaluation.evaluate import BASELINE, _generator, _request_seed, _sampling_key
from dpace.evaluation.requests import Conversation
from dpace.io import atomic_write_text
from dpace.targets import chat_prompt_ids, load_target, resolve_dtype, stop_token_ids
from dpace.timing_records import AUTOREGRESSIVE, TIMING_COLUMNS
from dpace.training.drafter import check_drafter_matches_target, load_drafter


@dataclass(frozen=True, kw_only=True)
class TimingSettings:
    """The config's ``timing`` section: how many prompts of each benchmark are timed (at T = 0, and at T > 0),
    how many times every drafter decodes each of them, and in which precision."""

    prompts_per_benchmark: int = 2
    sampled_prompts_per_benchmark: int | None = None  # None: prompts_per_benchmark
    repeats: int = 4
    dtype: str | None = None  # None: the evaluation's (eval.dtype); "auto": bfloat16 where native (resolve_dtype)

    def prompts(self, temperature: float) -> int:
        if temperature > 0 and self.sampled_prompts_per_benchmark is not None:
            return self.sampled_prompts_per_benchmark
        return self.prompts_per_benchmark


def _rotated(items: list, shift: int) -> list:
    shift %= len(items)
    return items[shift:] + items[:shift]


def time_interleaved(
    target_json,
    drafters: dict[str, str | Path],
    benchmark_files: dict[str, str | Path],
    config: EvalConfig,
    settings: TimingSettings,
    *,
    out_path=None,
    device: str = "cpu",
    log: Callable[[str], None] = print,
) -> pd.DataFrame:
    """Time the target alone and every drafter of ``drafters`` (id -> checkpoint folder) on the first
    ``settings.prompts(T)`` prompts of every benchmark at every temperature of ``config``, ``settings.repeats``
    times, interleaved per request turn; return (and write to ``out_path``) the rows of TIMING_COLUMNS."""
    if config.verification != "hard-match":
        raise ValueError("the timing job decodes with hard-match verification (eval.verification)")
    dtype = getattr(torch, resolve_dtype(settings.dtype or config.dtype, device))
    log(f"timing: target and drafters in {dtype}")
    target, tokenizer = load_target(target_json, device=device, dtype=dtype)
    loaded = {}
    for name, folder in drafters.items():
        loaded[name] = load_drafter(folder, dtype=dtype).to(device)
        check_drafter_matches_target(loaded[name].config, target.config)
    stops = stop_token_ids(tokenizer)
    block = max(int(d.block_size) for d in loaded.values())
    benchmarks = {name: load_benchmark(path, name) for name, path in benchmark_files.items()}
    plan = [r for r in evaluation_plan(benchmarks, config.temperatures, config.sampled_prompts_per_benchmark)
            if r.index < settings.prompts(r.temperature)
            and not exceeds_context(tokenizer, r.row, max_new_tokens=config.max_new_tokens, block_size=block,
                                    context=int(target.config.max_position_embeddings))]
    target_name = Path(target_json).parent.name

    def decode(decoder: str, prompt_ids, temperature: float, request_seed: int, max_new_tokens: int):
        if decoder == AUTOREGRESSIVE:
            return autoregressive_generate(
                target, prompt_ids, max_new_tokens=max_new_tokens, stop_token_ids=stops, temperature=temperature,
                generator=_generator(device, request_seed),
                sampling_key=_sampling_key(temperature, BASELINE, request_seed))
        return speculative_generate(
            loaded[decoder], target, prompt_ids, max_new_tokens=max_new_tokens, stop_token_ids=stops,
            temperature=temperature, verification="hard-match", generator=_generator(device, request_seed + 1),
            decode_clock=config.decode_clock, sampling_key=_sampling_key(temperature, "hard-match", request_seed))

    decoders = [AUTOREGRESSIVE, *drafters]
    if plan:  # one short untimed run of every decoder per temperature: first-call costs stay out
        warm = chat_prompt_ids(tokenizer, [{"role": "user", "content": plan[0].row["turns"][0]}])
        for temperature in sorted({r.temperature for r in plan}):
            for decoder in decoders:
                decode(decoder, warm, temperature, 0, WARMUP_TOKENS)
    rows = []
    for repeat in range(settings.repeats):
        log(f"timing: repeat {repeat + 1} of {settings.repeats}, {len(plan)} requests x {len(decoders)} decoders")
        for number, request in enumerate(plan):
            conversation = Conversation(tokenizer, chat_prompt_ids)
            for turn, text in enumerate(request.row["turns"]):
                prompt_ids = conversation.ask(text)
                request_seed = _request_seed(config.seed, request, turn)
                answers = {}
                for position, decoder in enumerate(_rotated(decoders, repeat + number + turn)):
                    result = decode(decoder, prompt_ids, request.temperature, request_seed, config.max_new_tokens)
                    answers[decoder] = result.new_token_ids
                    rows.append({
                        "target": target_name, "temperature": request.temperature, "benchmark": request.benchmark,
                        "prompt_index": request.index, "id": str(request.row["id"]), "turn": turn, "repeat": repeat,
                        "position": position, "drafter": decoder, "num_output_tokens": result.num_output_tokens,
                        "decode_time_s": result.decode_time_s,
                        "time_per_output_token_s": result.time_per_output_token_s})
                conversation.answered(token_ids=answers[AUTOREGRESSIVE])
    frame = pd.DataFrame(rows, columns=TIMING_COLUMNS)
    if out_path is not None:
        atomic_write_text(out_path, frame.to_csv(index=False))
    return frame
