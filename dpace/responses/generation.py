"""Stage 3, responses (config section ``responses``): the target answers every training prompt
itself (``dpace.responses.conversations`` imports released answers instead).

The output is SpecForge-style conversations jsonl, ``{"id", "conversations": [user, assistant]}``.
Backends share one interface, ``generate_responses(..., ResponseSettings(...))``:

- ``transformers`` (CPU or one GPU): left-padded batched ``generate`` with a KV cache, prompts
  sorted by length so a batch wastes little padding.
- ``sglang`` (GPUs): SGLang's offline ``Engine``; imported only when chosen.

Generation is resumable: each finished prompt is appended (and flushed) to a scratch file outside
the job's declared outputs (Snakemake deletes those when a job fails), a rerun skips the prompts (id and
text) already answered there, and the final file is written atomically in the prompts' order. A sidecar next to the scratch
file records the settings and the target that made it; a rerun with other ones starts over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from dpace.io import JsonlAppender, atomic_write_json, atomic_write_jsonl, read_jsonl, read_partial_jsonl
from dpace.schema import schema_defaults, schema_enum
from dpace.targets import (
    chat_prompt_ids,
    load_target,
    load_tokenizer,
    resolve_dtype,
    stop_token_ids,
    target_checksum,
)


def _conversation(row: dict, response: str, truncated: bool) -> dict:
    conversation = {
        "id": row["id"],
        "conversations": [
            {"role": "user", "content": row["prompt"]},
            {"role": "assistant", "content": response},
        ],
    }
    if truncated:
        # max_new_tokens cut the answer: the target never ended its turn here, so the features
        # must not teach the drafter an end token at this point (dpace.features.tokenize_conversation)
        conversation["truncated"] = True
    return conversation


def _asked(row: dict) -> tuple:
    """A prompt's key: its id and its text. An answer is only ever reused for the very text it answered."""
    return row["id"], row["prompt"]


def _answered(conversation: dict) -> tuple:
    """The key (``_asked``) of the prompt a stored conversation answers."""
    return conversation["id"], conversation["conversations"][0]["content"]


def _tokenized_prompts(tokenizer, rows: list[dict], max_prompt_tokens: int) -> tuple[list, int]:
    kept, too_long = [], 0
    for row in rows:
        ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": row["prompt"]}])
        if len(ids) > max_prompt_tokens:
            too_long += 1  # skipped and counted, never silently truncated
            continue
        kept.append((row, ids))
    return kept, too_long


def _generate_transformers(target_json, todo, out, *, max_new_tokens, temperature, batch_size, seed, device, dtype):
    model, tokenizer = load_target(target_json, device=device, dtype=getattr(torch, dtype))
    stops = stop_token_ids(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    generator_seed = torch.Generator().manual_seed(seed)
    # Longest first: the slowest batches start early and padding stays small within a batch.
    todo = sorted(todo, key=lambda item: -len(item[1]))
    with tqdm(total=len(todo), desc="responses", unit="prompt") as progress:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            width = max(len(ids) for _, ids in batch)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            attention = torch.zeros((len(batch), width), dtype=torch.long)
            for i, (_, ids) in enumerate(batch):
                input_ids[i, width - len(ids) :] = torch.tensor(ids)
                attention[i, width - len(ids) :] = 1
            sampling = {"do_sample": False}
            if temperature > 0:
                torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator_seed)))
                sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
            with torch.inference_mode():
                output = model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention.to(device),
                    max_new_tokens=max_new_tokens,
                    eos_token_id=stops,
                    pad_token_id=pad_id,
                    use_cache=True,
                    **sampling,
                )
            for (row, _), new_tokens in zip(batch, output[:, width:].tolist(), strict=True):
                cut = next((i for i, t in enumerate(new_tokens) if t in stops), len(new_tokens))
                text = tokenizer.decode(new_tokens[:cut], skip_special_tokens=True)
                out.write(_conversation(row, text, truncated=cut == len(new_tokens)))  # no stop token: cut
            progress.update(len(batch))


def _generate_sglang(target_json, todo, out, *, max_new_tokens, temperature, batch_size, seed, device, dtype):
    """SGLang's offline ``Engine`` on this job's GPU: one batch of token-id prompts at a time,
    greedy at T = 0, sampled (top-p 1, top-k off) otherwise; each batch's answers are appended
    to the scratch file as soon as it finishes, so a rerun resumes after the last batch."""
    from dpace.gpus import gpu_slot, require_sglang
    from dpace.targets import model_location

    sglang = require_sglang()  # GPU-only extra: pip install -e .[gpu]
    path, trust = model_location(target_json)
    stops = stop_token_ids(load_tokenizer(target_json))
    sampling = {
        "temperature": float(temperature),
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": int(max_new_tokens),
        "stop_token_ids": stops,
        "skip_special_tokens": True,
    }
    # Longest first, as the transformers backend: the slowest batches start early.
    todo = sorted(todo, key=lambda item: -len(item[1]))
    with gpu_slot(1):
        engine = sglang.Engine(model_path=path, trust_remote_code=trust, random_seed=seed, dtype=dtype,
                               log_level="error")
        try:
            with tqdm(total=len(todo), desc="responses (sglang)", unit="prompt") as progress:
                for start in range(0, len(todo), batch_size):
                    batch = todo[start : start + batch_size]
                    results = engine.generate(input_ids=[ids for _, ids in batch], sampling_params=sampling)
                    for (row, _), result in zip(batch, results, strict=True):
                        finish = (result.get("meta_info") or {}).get("finish_reason") or {}
                        out.write(_conversation(row, result["text"], finish.get("type") == "length"))
                    progress.update(len(batch))
        finally:
            engine.shutdown()


BACKENDS = {"transformers": _generate_transformers, "sglang": _generate_sglang}
# bfloat16 is the paper's GPU precision; on a CPU with AMX it makes batched decoding ~1.5x faster
# than float32 (README, "Measured budgets"), at the price of answers that differ from float32 greedy;
# on an AVX2-only CPU it is 4x slower. "auto" picks bfloat16 where it is native (targets.resolve_dtype).
DTYPES = schema_enum("responses", "dtype")  # float32, bfloat16, auto


def _require_responses(by_id: dict, rows: list, too_long: int, max_prompt_tokens: int, prompts_path) -> None:
    """A stage that would write no conversation fails here, naming the setting that left none (the
    features job would otherwise blame its own max_seq_length)."""
    if by_id:
        return
    if too_long:
        raise ValueError(f"no responses: {too_long} of {len(rows)} prompts of {prompts_path} are longer than "
                         f"responses.max_prompt_tokens={max_prompt_tokens} tokens and were skipped; raise it")
    raise ValueError(f"no responses: {prompts_path} holds {len(rows)} prompts; check data.train_prompts")


@dataclass(frozen=True, kw_only=True)
class ResponseSettings:
    """How the target answers the training prompts: the config's ``responses`` section, each field named as
    the schema (workflow/schemas/config.schema.yaml) names its key, and the config's ``seed``."""

    backend: str = "transformers"
    max_new_tokens: int = 256
    max_prompt_tokens: int = 512  # longer prompts are skipped and counted, never truncated
    temperature: float = 0.0
    batch_size: int = 16
    dtype: str = schema_defaults("responses")["dtype"]
    seed: int = 0


def generate_responses(
    target_json: str | Path,
    prompts_path: str | Path,
    out_path: str | Path,
    settings: ResponseSettings,
    *,
    device: str = "cpu",
    scratch_path: str | Path | None = None,
) -> dict:
    """Generate the target's response to every prompt; returns counts (written, skipped)."""
    backend, max_prompt_tokens, seed = settings.backend, settings.max_prompt_tokens, settings.seed
    if backend not in BACKENDS:
        raise ValueError(f"unknown generation backend {backend!r}; valid: {sorted(BACKENDS)}")
    if settings.dtype not in DTYPES:
        raise ValueError(f"unknown generation dtype {settings.dtype!r}; valid: {', '.join(DTYPES)}")
    dtype = resolve_dtype(settings.dtype, "cuda" if backend == "sglang" else device)  # SGLang serves on a GPU
    rows = list(read_jsonl(prompts_path))
    scratch_path = Path(scratch_path) if scratch_path else Path(str(out_path) + ".partial")
    made_path = Path(f"{scratch_path}.made.json")
    # The scratch file's key: the settings an answer depends on (not batch_size), with the dtype as resolved.
    made = {"backend": backend, "max_new_tokens": settings.max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
            "temperature": settings.temperature, "seed": seed, "dtype": dtype, "target": target_checksum(target_json)}
    if scratch_path.exists() and (not made_path.exists() or json.loads(made_path.read_text()) != made):
        print(f"{scratch_path} holds answers of other settings or another target: generating them again")
        scratch_path.unlink()
    atomic_write_json(made_path, made)
    done = {_answered(answer) for answer in read_partial_jsonl(scratch_path)}
    tokenizer = load_tokenizer(target_json)
    todo, too_long = _tokenized_prompts(tokenizer, [r for r in rows if _asked(r) not in done], max_prompt_tokens)
    torch.manual_seed(seed)
    with JsonlAppender(scratch_path) as out:
        if todo:
            BACKENDS[backend](
                target_json, todo, out, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                batch_size=settings.batch_size, seed=seed, device=device, dtype=dtype,
            )
    answers = {_answered(answer): answer for answer in read_partial_jsonl(scratch_path)}
    _require_responses(answers, rows, too_long, max_prompt_tokens, prompts_path)
    atomic_write_jsonl(out_path, [answers[_asked(row)] for row in rows if _asked(row) in answers])
    scratch_path.unlink()
    made_path.unlink()
    return {"prompts": len(rows), "resumed": sum(_asked(row) in done for row in rows), "generated": len(todo), "skipped_too_long": too_long,
            "dtype": dtype}
