"""Replayed tau against speculative decoding: seconds per request, per target and per drafter.

On the embedded default (SmolLM2-135M target, a randomly initialised drafter of config.yaml's shape:
an untrained drafter costs what a trained one does, and a decoded step what it costs whatever is
accepted; replay costs the same whatever is accepted, decoding less when more is accepted). Per
request and temperature (T = 0 greedy, T = 1 keyed samples):

* shared, once per target: the target's answer (autoregressive, timed) and its context features;
* per drafter: replay (one batched drafter pass over all answer positions + the anchor walk)
  against batch-1 speculative decoding of the same prompt, and whether their steps agree.

    python benchmarks/bench_evaluation.py [--prompts 3] [--threads 1] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import yaml

from dpace.data import benchmark_prompts
from dpace.evaluation.decoding import speculative_generate
from dpace.evaluation.replay import needed_context_start, reference_turn, replay_turn, target_features
from dpace.features import default_target_layer_ids
from dpace.targets import chat_prompt_ids, load_target, prepare_target, stop_token_ids
from dpace.training.drafter import (
    build_drafter,
    drafter_config,
    load_drafter,
    save_drafter,
)

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=3, help="prompts per benchmark")
    parser.add_argument("--benchmarks", nargs="+", default=["gsm8k", "mt_bench"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--cache-dir", default="/tmp/dpace-bench-evaluation")
    parser.add_argument("--mirror", default=str(REPO.parent / "shared" / "data"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    cache = Path(args.cache_dir)
    if not (cache / "target" / "target.json").exists():
        prepare_target({"source": "embedded"}, cache / "target")
    target, tokenizer = load_target(cache / "target" / "target.json")
    stops = stop_token_ids(tokenizer)
    train = config["train"]
    layer_ids = default_target_layer_ids(target.config.num_hidden_layers, config["features"]["num_target_features"])
    drafter_dir = cache / "drafter"
    if not drafter_dir.exists():
        dconfig = drafter_config(target.config, depth=train["depth"], block_size=train["block_size"],
                                 target_layer_ids=layer_ids, mask_token_id=0,
                                 draft_vocab=list(range(train["draft_vocab_size"])) or None,
                                 sliding_window=train["sliding_window"])
        save_drafter(build_drafter(dconfig), drafter_dir)
    drafter = load_drafter(drafter_dir)
    rows = []
    for benchmark in args.benchmarks:
        for row in benchmark_prompts(benchmark, args.prompts, config["seed"], mirror=args.mirror):
            prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": row["turns"][0]}])
            for temperature in (0.0, 1.0):
                key = 7 if temperature > 0 else None
                start = time.perf_counter()
                answer, continuation = reference_turn(target, prompt, temperature=temperature, sampling_key=key,
                                                      stop_token_ids=stops, max_new_tokens=args.max_new_tokens,
                                                      overrun=train["block_size"] - 1)
                answer_s = time.perf_counter() - start
                start = time.perf_counter()
                first = needed_context_start(drafter, len(prompt))
                features = target_features(target, prompt + answer.new_token_ids, drafter.target_layer_ids, first)
                features_s = time.perf_counter() - start
                start = time.perf_counter()
                replayed = replay_turn(drafter, target, features, first, prompt, answer.new_token_ids, continuation,
                                       max_new_tokens=args.max_new_tokens, stop_token_ids=stops)
                replay_s = time.perf_counter() - start
                start = time.perf_counter()
                decoded = speculative_generate(drafter, target, prompt, max_new_tokens=args.max_new_tokens,
                                               stop_token_ids=stops, temperature=temperature, sampling_key=key)
                decode_s = time.perf_counter() - start
                rows.append({"T": temperature, "tokens": len(answer.new_token_ids), "prompt": len(prompt),
                             "answer_s": answer_s, "features_s": features_s, "replay_s": replay_s,
                             "decode_s": decode_s, "equal": replayed.block_lengths == decoded.block_lengths})
                print(f"{benchmark} {row['id']} T={temperature:g}: prompt {len(prompt)} + {len(answer.new_token_ids)} "
                      f"tokens; answer {answer_s:.2f} s, features {features_s:.2f} s (once per target); replay "
                      f"{replay_s:.3f} s, decode {decode_s:.2f} s (per drafter); steps equal: {rows[-1]['equal']}",
                      flush=True)
    print(f"\n{len(rows)} requests, {args.threads} thread(s), load average {os.getloadavg()[0]:.1f}")
    for temperature in (0.0, 1.0):
        cell = [r for r in rows if r["T"] == temperature]
        means = {k: statistics.fmean(r[k] for r in cell) for k in ("answer_s", "features_s", "replay_s", "decode_s")}
        print(f"T={temperature:g} mean s/request: per target answer {means['answer_s']:.2f} + features "
              f"{means['features_s']:.2f}; per drafter replay {means['replay_s']:.3f} vs decode {means['decode_s']:.2f} "
              f"({means['decode_s'] / means['replay_s']:.0f}x); equal {sum(r['equal'] for r in cell)}/{len(cell)}")


if __name__ == "__main__":
    main()
