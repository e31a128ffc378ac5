"""Response-generation throughput: batch 1 vs batch 16, float32 vs bfloat16, on the embedded target.

The same ``model.generate`` call that ``dpace.responses.generation`` makes (left padding, KV cache, greedy),
with every answer forced to ``--new-tokens`` tokens so that all settings decode the same amount.
``--compare-plain-sdpa`` also times the target as transformers loads it (plain SDPA, which copies the
keys and values once per query head under a mask, and no contiguous LM-head rows): the A/B of
``load_target``'s CPU attention, with a check that both give the same greedy tokens.

    python benchmarks/bench_generation.py
    python benchmarks/bench_generation.py --prompts results/data/train/sharegpt.jsonl --threads 2
    python benchmarks/bench_generation.py --threads 2 --batch-size 64 --num-prompts 64 --new-tokens 64 \
        --max-prompt-tokens 384 --dtypes bfloat16 --skip-batch-1 --compare-plain-sdpa

Without ``--target-json`` the embedded SmolLM2 is materialised once into ``--cache-dir`` (~25 s).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from dpace.data import training_prompts
from dpace.io import read_jsonl
from dpace.targets import chat_prompt_ids, load_target, model_location, prepare_target, stop_token_ids

REPO = Path(__file__).resolve().parents[1]


def tokens_per_second(model, prompt_ids, *, batch_size, new_tokens, pad_id, answers=None) -> float:
    """Generated tokens per second; the generated ids are appended to ``answers`` if given."""
    started, produced = time.perf_counter(), 0
    for start in range(0, len(prompt_ids), batch_size):
        batch = prompt_ids[start : start + batch_size]
        width = max(map(len, batch))
        input_ids = torch.full((len(batch), width), pad_id)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        with torch.inference_mode():
            output = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=new_tokens,
                                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id, use_cache=True)
        produced += (output.shape[1] - width) * len(batch)
        if answers is not None:
            answers.extend(output[:, width:].tolist())
    return produced / (time.perf_counter() - started)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-json")
    parser.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/dpace/smollm2-embedded"))
    parser.add_argument("--prompts", help="training prompts jsonl (default: ShareGPT from ../shared/data)")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-prompt-tokens", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--skip-batch-1", action="store_true", help="time the batched generation only")
    parser.add_argument("--compare-plain-sdpa", action="store_true",
                        help="also time transformers' plain SDPA target and compare the greedy tokens")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    target_json = args.target_json
    if target_json is None:
        target_json = Path(args.cache_dir) / "target.json"
        if not target_json.exists():
            prepare_target({"source": "embedded"}, args.cache_dir)
    if args.prompts:
        texts = [row["prompt"] for row in read_jsonl(args.prompts)]
    else:
        rows, _ = training_prompts("sharegpt", 200, seed=0, mirror=str(REPO.parent / "shared" / "data"))
        texts = [row["prompt"] for row in rows]
    print(f"threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    for dtype in (getattr(torch, name) for name in args.dtypes.split(",")):
        model, tokenizer = load_target(target_json, dtype=dtype)
        ids = [chat_prompt_ids(tokenizer, [{"role": "user", "content": text}]) for text in texts]
        ids = [i for i in ids if len(i) <= args.max_prompt_tokens][: args.num_prompts]
        pad_id = stop_token_ids(tokenizer)[0]
        timing = dict(new_tokens=args.new_tokens, pad_id=pad_id)
        variants = {"load_target": model}
        if args.compare_plain_sdpa:
            path, trust = model_location(target_json)
            variants["plain SDPA"] = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation="sdpa", trust_remote_code=trust).eval()
        answers = {}
        for name, variant in variants.items():
            one = 0.0 if args.skip_batch_1 else tokens_per_second(variant, ids, batch_size=1, **timing)
            answers[name] = []
            many = tokens_per_second(variant, ids, batch_size=args.batch_size, answers=answers[name], **timing)
            single = "" if args.skip_batch_1 else f"batch 1: {one:6.1f} tok/s   "
            ratio = "" if args.skip_batch_1 else f"   ({many / one:.1f}x)"
            print(f"{str(dtype):15s} {name:12s} {single}batch {args.batch_size}: {many:6.1f} tok/s{ratio}")
        if args.compare_plain_sdpa:
            same = sum(a == b for a, b in zip(answers["load_target"], answers["plain SDPA"], strict=True))
            print(f"{str(dtype):15s} identical greedy answers: {same} of {len(ids)}")
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
