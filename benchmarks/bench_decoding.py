"""Cost per decoding step: autoregressive step vs DFlash verify + draft step, ours vs dflash_generate.

SR = tau * (AR step time / speculative step time), so SR/tau is the ratio of step costs and does
not depend on how good the drafter is: a randomly initialised drafter is enough to measure it.

    python benchmarks/bench_decoding.py                       # SmolLM2-135M, 1-layer drafter, B=8
    python benchmarks/bench_decoding.py --target-json results/targets/smollm2/target.json
    # the H200 comparison in docs/gpu.md: Qwen3-4B-shaped bf16 target (random weights), 3L B=16 drafter
    python benchmarks/bench_decoding.py --preset qwen3-4b --device cuda --dtype bfloat16 --e2e-only

With ``--preset`` the target is a randomly initialised Qwen3 of that shape (no download, no tokenizer:
the prompt is random token ids), so ``dpace.evaluation.decoding`` and dflash's ``dflash_generate`` run on the
same weights; ``qwen3-tiny`` is the same code path at a size a CPU runs in seconds. The end-to-end
part also reports where the speculative and autoregressive greedy streams part, with the target's
top-2 logit margin there (bf16 near-ties, see ``dpace.evaluation.evaluate.GREEDY_TIE_MARGIN``).

Without ``--target-json`` the embedded SmolLM2 is materialised once into ``--cache-dir`` (~25 s).
The machine may be shared: the script prints the load average before and after, and reports the
median (and the minimum) over interleaved repetitions.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from dpace.evaluation.decoding import (
    autoregressive_generate,
    new_kv_cache,
    optimize_for_cpu,
    speculative_generate,
)
from dpace.features import default_target_layer_ids
from dpace.targets import chat_prompt_ids, load_target, prepare_target
from dpace.training.drafter import drafter_config

PROMPT = (
    "Write a short story about a robot who learns to paint. Make it vivid and detailed, "
    "about three paragraphs, and end it with a twist."
)


PRESETS = {  # Qwen3 shapes; the drafter takes depth and block size from the flags
    "qwen3-4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936},
    "qwen3-tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 4096},
}


def preset_models(args):
    """A random Qwen3 target of the preset's shape and a random DFlash drafter, built directly on
    ``args.device`` in ``args.dtype`` (a Qwen3-4B-sized target is 4B parameters: initialised in float32
    first, then cast, it needed twice the memory and time). Both attend with SDPA, the only attention
    the decoders (``dpace.evaluation.decoding``, ``dflash_generate``) run."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dtype = getattr(torch, args.dtype)
    config = Qwen3Config(**PRESETS[args.preset], max_position_embeddings=4096, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(args.device):
        target = Qwen3ForCausalLM._from_config(config, dtype=dtype).eval()
    n = config.num_hidden_layers
    draft_config = drafter_config(
        config, depth=args.draft_layers, block_size=args.block_size,
        target_layer_ids=default_target_layer_ids(n, args.features), mask_token_id=config.vocab_size - 1,
    )
    draft_config._attn_implementation = "sdpa"
    with torch.device(args.device):
        drafter = DFlashDraftModel._from_config(draft_config, dtype=dtype).eval()
    generator = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(0, config.vocab_size - 1, (args.prompt_tokens,), generator=generator).tolist()
    return target, drafter, prompt_ids


def load_models(args):
    from dflash.model import DFlashDraftModel

    target_json = args.target_json
    if target_json is None:
        target_json = Path(args.cache_dir) / "target.json"
        if not target_json.exists():
            prepare_target({"source": "embedded"}, args.cache_dir)
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_target(target_json, dtype=dtype)
    n = target.config.num_hidden_layers
    config = drafter_config(
        target.config, depth=args.draft_layers, block_size=args.block_size,
        target_layer_ids=default_target_layer_ids(n, args.features), mask_token_id=tokenizer.unk_token_id or 0,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    drafter = DFlashDraftModel(config).to(dtype).eval()
    return target, drafter, tokenizer


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


@torch.inference_mode()
def step_costs(target, drafter, prompt_ids, context, repeats):
    """ms per AR step (1 token), verify step (B tokens) and draft step, at ``context`` cached tokens."""
    block = drafter.block_size
    cache = new_kv_cache(target.config)
    ids = torch.tensor([prompt_ids * (context // len(prompt_ids) + 1)])[:, :context]
    out = target(ids, past_key_values=cache, use_cache=True, logits_to_keep=1, output_hidden_states=True)
    layer_ids = drafter.target_layer_ids
    hidden = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    draft_cache = new_kv_cache(drafter.config)
    positions = torch.arange(context + block)[None]
    noise = F.embedding(torch.full((1, block), drafter.mask_token_id), target.get_input_embeddings().weight)
    drafter(target_hidden=hidden, noise_embedding=noise, position_ids=positions,
            past_key_values=draft_cache, use_cache=True)
    draft_cache.crop(-block)

    def ar():
        target(ids[:, :1], position_ids=positions[:, context : context + 1], past_key_values=cache, use_cache=True)
        cache.crop(-1)

    def verify():
        out = target(ids[:, :block], position_ids=positions[:, context : context + block], past_key_values=cache,
                     use_cache=True, output_hidden_states=True)
        torch.argmax(out.logits, dim=-1)
        cache.crop(-block)

    def draft():
        # one newly accepted token of context, as after a rejected block
        h = drafter(target_hidden=hidden[0, -1:][None], noise_embedding=noise,
                    position_ids=positions[:, context - 1 : context + block], past_key_values=draft_cache,
                    use_cache=True)[0, 1 - block :]  # 2-D rows, as speculative_generate does
        draft_cache.crop(-(block + 1))
        torch.argmax(drafter.compute_logits(h, target.lm_head), dim=-1)

    draft_cache.crop(-1)  # the draft step re-adds the last context token
    results = {"ar": [], "verify": [], "draft": []}
    for fn in (ar, verify, draft):  # warm-up
        fn()
    for _ in range(repeats):  # interleaved, so load changes hit all three alike
        for name, fn in (("ar", ar), ("verify", verify), ("draft", draft)):
            results[name] += timed(fn, 1)
    return {name: (1e3 * statistics.median(t), 1e3 * min(t)) for name, t in results.items()}


def end_to_end(target, drafter, prompt_ids, max_new_tokens, repeats, device="cpu", warmup_tokens=None):
    """Generation of ``max_new_tokens`` (no stop token) with our code and with dflash_generate.

    Both use their own clocks (dflash 0.1.0's starts after the prefill, ours after the first draft
    call, as DFlash's paper-era benchmark): ms per step is the comparable number. The warm-up run of
    each generates ``warmup_tokens`` (default: all ``max_new_tokens``); a few compile every kernel.
    """
    import dflash.model as dm

    if device == "cpu":
        dm._cuda_time = time.perf_counter  # dflash's timer synchronises CUDA; we are on the CPU
    ids = torch.tensor([prompt_ids], device=device)

    def generators(tokens):
        return {
            "ours AR": lambda: autoregressive_generate(target, ids, max_new_tokens=tokens, stop_token_ids=None),
            "ours spec": lambda: speculative_generate(drafter, target, ids, max_new_tokens=tokens,
                                                      stop_token_ids=None),
            "dflash AR": lambda: dm.dflash_generate(drafter, target, ids, tokens, None, block_size=1,
                                                    return_stats=True),
            "dflash spec": lambda: dm.dflash_generate(drafter, target, ids, tokens, None, return_stats=True),
        }

    for run in generators(warmup_tokens or max_new_tokens).values():  # warm-up
        run()
    runs = generators(max_new_tokens)
    stats = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            result = run()
            tpot = getattr(result, "time_per_output_token_s", None) or result.time_per_output_token
            steps = len(result.acceptance_lengths)
            stats[name].append((tpot, steps, result.num_output_tokens))
    summary = {}
    for name, values in stats.items():
        tpot = statistics.median(v[0] for v in values)
        steps, tokens = values[0][1], values[0][2]
        summary[name] = {"tpot_ms": 1e3 * tpot, "ms_per_step": 1e3 * tpot * tokens / steps,
                         "tau": (tokens - 1) / steps}
    return summary


def greedy_agreement(target, drafter, prompt_ids, max_new_tokens, device="cpu") -> dict:
    """Where ``speculative_generate`` and ``autoregressive_generate`` part at T = 0, with the verdict
    the evaluation would give (a numerical tie below the tie margin, else a failure)."""
    from dpace.evaluation.decoding import compare_to_greedy
    from dpace.evaluation.evaluate import GREEDY_TIE_MARGIN, divergence_verdict

    ids = torch.tensor([prompt_ids], device=device)
    spec = speculative_generate(drafter, target, ids, max_new_tokens=max_new_tokens, stop_token_ids=None)
    ar = autoregressive_generate(target, ids, max_new_tokens=max_new_tokens, stop_token_ids=None)
    report = compare_to_greedy(spec.new_token_ids, ar.new_token_ids, target, ids)
    return {**report, "verdict": divergence_verdict(report, GREEDY_TIE_MARGIN), "tie_margin": GREEDY_TIE_MARGIN}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-json")
    parser.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/dpace/smollm2-embedded"))
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--draft-layers", type=int, default=1)
    parser.add_argument("--features", type=int, default=3, help="target layers feeding the drafter")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--context", type=int, default=160, help="cached tokens for the per-step costs")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--e2e-repeats", type=int, default=3, help="0 skips the end-to-end runs")
    parser.add_argument("--layout", default="both", choices=["both", "row-major", "optimize_for_cpu"])
    parser.add_argument("--preset", choices=sorted(PRESETS), help="random Qwen3 target of this shape")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (presets only)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="random prompt length (presets only)")
    parser.add_argument("--e2e-only", action="store_true", help="skip the per-step costs")
    parser.add_argument("--warmup-tokens", type=int, default=None,
                        help="tokens of each end-to-end warm-up run (default: --max-new-tokens)")
    args = parser.parse_args(argv)
    if args.device != "cpu" and not args.preset:
        parser.error("--device applies to --preset targets")
    return args


def run(args: argparse.Namespace) -> dict:
    """Build the models, print the per-step and end-to-end costs; return the end-to-end summary and the
    greedy check of the last layout."""
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.preset:
        target, drafter, prompt_ids = preset_models(args)
    else:
        target, drafter, tokenizer = load_models(args)
        prompt_ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": PROMPT}])
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else (platform.processor() or platform.machine())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {device_name}, "
          f"dtype {args.dtype}, B={args.block_size}, drafter {args.draft_layers} layer(s), "
          f"prompt {len(prompt_ids)} tokens, target {args.preset or 'from --target-json / embedded'}")
    print(f"load average before: {os.getloadavg()}")
    result = {}
    layouts = ["row-major", "optimize_for_cpu"] if args.layout == "both" else [args.layout]
    if args.dtype != "float32" or args.device != "cpu":
        layouts = ["row-major"]  # optimize_for_cpu only re-lays out float32 CPU weights
    for layout in layouts:
        if layout == "optimize_for_cpu":
            optimize_for_cpu(target, drafter)
        print(f"[{layout} weights]")
        if not args.e2e_only:
            costs = step_costs(target, drafter, prompt_ids, args.context, args.repeats)
            for name, (median, minimum) in costs.items():
                print(f"  {name:7s} step: {median:7.1f} ms (min {minimum:6.1f})  [context {args.context}]")
            spec = costs["verify"][0] + costs["draft"][0]
            print(f"  verify / AR = {costs['verify'][0] / costs['ar'][0]:.2f}; (verify + draft) / AR = "
                  f"{spec / costs['ar'][0]:.2f}; predicted SR/tau = {costs['ar'][0] / spec:.2f}")
        if args.e2e_repeats:
            e2e = end_to_end(target, drafter, prompt_ids, args.max_new_tokens, args.e2e_repeats, args.device,
                             warmup_tokens=args.warmup_tokens)
            for name, row in e2e.items():
                print(f"  {name:12s} TPOT {row['tpot_ms']:6.1f} ms, {row['ms_per_step']:6.1f} ms/step, "
                      f"tau {row['tau']:.2f}")
            for who in ("ours", "dflash"):
                speedup = e2e[f"{who} AR"]["tpot_ms"] / e2e[f"{who} spec"]["tpot_ms"]
                print(f"  {who:6s}: SR {speedup:.2f} at tau {e2e[f'{who} spec']['tau']:.2f} -> SR/tau = "
                      f"{speedup / e2e[f'{who} spec']['tau']:.2f}")
            agreement = greedy_agreement(target, drafter, prompt_ids, args.max_new_tokens, args.device)
            result = {"end_to_end": e2e, "greedy": agreement}
            if agreement["verdict"] is None:
                print(f"  greedy: speculative == autoregressive over {agreement['compared']} tokens")
            else:
                print(f"  greedy: streams part at token {agreement['first_mismatch']} of {agreement['compared']}, "
                      f"target top-2 margin {agreement['top2_margin']:.4g} -> {agreement['verdict']} "
                      f"(tie below {agreement['tie_margin']:g})")
    print(f"load average after: {os.getloadavg()}")
    return result


def main(argv=None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
