"""GPU-hours of the paper's Table 1 evaluation: batch-1 speculative decoding against replayed tau.

A projection, not a measurement: it multiplies per-token costs measured on one H200 (Qwen3-4B shape,
bf16, B = 16, 3-layer drafter, batch 1) by the paper's Table 1 workload. docs/evaluation-cost.md
states every assumption and shows the table this prints:

    python benchmarks/evaluation_cost.py                    # answers at the 2048-token cap
    python benchmarks/evaluation_cost.py --answer-tokens 512

Decoding (the paper's protocol, DFlash's benchmark code): every drafter decodes every request at
both temperatures, L / tau speculative steps each (tau from the paper's Table 1, bonus token
included), and its job times the autoregressive baseline too (L AR tokens per request).

Replay: the target answers every request once per temperature (batch-1 AR, L tokens), one target
forward over prompt + answer gives the features, and each drafter scores a block at every answer
position; decoding's anchors are then walked on the CPU. Two estimates of the two forwards:
``bound``, from the decode step costs alone (a forward over 16 tokens, or 16 blocks, costs what it
costs inside a decode step: at those sizes both are launch-bound), and ``throughput`` (one full-length
forward each, at the FLOP rate that the measured Table 7 training iteration reaches on the H200).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

# Table 1's workload (paper, Sec. 4 and Table 1; workflow/configs/paper.yaml): prompts per benchmark,
# MT-Bench has two turns per prompt (each turn decodes its own answer).
PROMPTS = {"gsm8k": 128, "math500": 128, "humaneval": 164, "mbpp": 128, "mt_bench": 80, "alpaca": 128}
TURNS = {"mt_bench": 2}
MAX_NEW_TOKENS = 2048  # DFlash's benchmark and paper.yaml's eval.max_new_tokens
TEMPERATURES = (0.0, 1.0)
BLOCK_SIZE = 16

# The paper's Table 1 tau per (T, depth, objective): GSM8K, MATH-500, HumanEval, MBPP, MT-Bench, Alpaca.
PAPER_TAU = {
    (0.0, 3, "dflash"): (4.57, 5.44, 4.66, 4.31, 3.22, 2.41),
    (0.0, 3, "topk-prefix"): (4.44, 5.19, 4.43, 4.13, 3.11, 2.29),
    (0.0, 3, "accept-rate"): (1.01, 1.01, 1.03, 1.03, 1.04, 1.04),
    (0.0, 3, "dpace"): (5.09, 6.12, 5.12, 4.68, 3.54, 2.54),
    (0.0, 5, "dflash"): (4.98, 5.85, 4.98, 4.56, 3.43, 2.49),
    (0.0, 5, "topk-prefix"): (4.80, 5.56, 4.73, 4.31, 3.29, 2.34),
    (0.0, 5, "accept-rate"): (1.03, 1.03, 1.02, 1.02, 1.01, 1.01),
    (0.0, 5, "dpace"): (5.54, 6.61, 5.54, 4.99, 3.79, 2.61),
    (1.0, 3, "dflash"): (4.37, 4.91, 4.37, 4.11, 3.05, 2.32),
    (1.0, 3, "topk-prefix"): (4.23, 4.59, 4.19, 3.88, 2.94, 2.25),
    (1.0, 3, "accept-rate"): (1.01, 1.01, 1.04, 1.03, 1.04, 1.04),
    (1.0, 3, "dpace"): (4.79, 5.41, 4.83, 4.38, 3.30, 2.45),
    (1.0, 5, "dflash"): (4.71, 5.22, 4.71, 4.32, 3.23, 2.39),
    (1.0, 5, "topk-prefix"): (4.54, 4.91, 4.43, 4.01, 3.03, 2.23),
    (1.0, 5, "accept-rate"): (1.03, 1.03, 1.02, 1.02, 1.01, 1.01),
    (1.0, 5, "dpace"): (5.31, 5.73, 5.19, 4.73, 3.49, 2.56),
}


@dataclass(frozen=True)
class StepCosts:
    """Measured on one H200 at Qwen3-4B shape, bf16, B = 16, 3-layer drafter, batch 1 (seconds)."""

    name: str
    ar_token_s: float  # one autoregressive token: one target forward over one token
    spec_step_s: float  # one speculative step: a drafter forward over one block + the target's verify forward

    @property
    def drafter_block_s(self) -> float:
        """The drafter's share of a speculative step: the step less a target forward (whose verify over
        17 tokens is launch-bound, as the one-token forward is)."""
        return self.spec_step_s - self.ar_token_s


DECODERS = (StepCosts("dpace.evaluation.decoding", 0.0285, 0.0379), StepCosts("dflash_generate", 0.0279, 0.0374))

# Qwen3-4B's layers (hidden 2560, 32 query heads and 8 KV heads of 128, MLP 9728, vocabulary 151936);
# the drafter has 3 of them and shares the target's LM head.
HIDDEN, Q_DIM, KV_DIM, MLP, VOCAB, TARGET_LAYERS, DRAFT_LAYERS = 2560, 4096, 1024, 9728, 151936, 36, 3
LAYER_PARAMS = HIDDEN * Q_DIM * 2 + HIDDEN * KV_DIM * 2 + 3 * HIDDEN * MLP
# docs/gpu.md: the Table 7 training iteration at this drafter shape (2 sequences of 2048 tokens,
# 512 anchors each, bf16 autocast, flex_attention, forward + backward + AdamW) takes 208.5 ms on an H200.
TABLE7_ITERATION_S, TABLE7_BLOCKS, TABLE7_CONTEXT = 0.2085, 2 * 512, 2048


def attention_flops(queries: int, keys: float, layers: int) -> float:
    """QK^T and PV over ``keys`` keys for ``queries`` queries, every layer (2 FLOPs a multiply-add)."""
    return 2 * 2 * queries * keys * Q_DIM * layers


def drafter_block_flops(context: float) -> float:
    """One block's forward: B positions through the drafter's layers and the LM head, attending to the
    context (on average half the sequence) and the block."""
    return 2 * BLOCK_SIZE * (DRAFT_LAYERS * LAYER_PARAMS + HIDDEN * VOCAB) + attention_flops(
        BLOCK_SIZE, context / 2 + BLOCK_SIZE, DRAFT_LAYERS)


def achieved_flops_per_s() -> float:
    """The FLOP rate of the measured Table 7 iteration: forward + backward = 3 forwards."""
    return 3 * TABLE7_BLOCKS * drafter_block_flops(TABLE7_CONTEXT) / TABLE7_ITERATION_S


def requests() -> dict[str, int]:
    return {b: n * TURNS.get(b, 1) for b, n in PROMPTS.items()}


def decoding_hours(costs: StepCosts, answer_tokens: int, *, ar_per_drafter: bool = True) -> dict[str, float]:
    """Table 1 by batch-1 decoding: every (T, depth, objective) decodes every request speculatively; the
    autoregressive baseline once per drafter (DFlash's benchmark code) or once per temperature."""
    counts = list(requests().values())
    speculative = sum(n * answer_tokens / tau * costs.spec_step_s
                      for taus in PAPER_TAU.values() for n, tau in zip(counts, taus, strict=True))
    baselines = len(PAPER_TAU) if ar_per_drafter else len(TEMPERATURES)
    autoregressive = baselines * sum(counts) * answer_tokens * costs.ar_token_s
    return {"speculative": speculative / 3600, "autoregressive": autoregressive / 3600,
            "total": (speculative + autoregressive) / 3600}


def replay_hours(costs: StepCosts, answer_tokens: int, *, prompt_tokens: int = 150, estimate: str = "bound",
                 decoded_prompts_per_benchmark: int = 0) -> dict[str, float]:
    """Table 1 by replay: per temperature the target's answers (batch-1 AR) and one target forward over
    prompt + answer per request; per drafter one pass scoring a block at every answer position.
    ``decoded_prompts_per_benchmark``: the exactness check's subset that every drafter also decodes for real
    (``eval.decoded_prompts_per_benchmark``): N prompts a benchmark, each at one temperature (the temperatures
    in turn, ``EvalConfig.decodes``); speculative only, because the batch-1 AR answers are its reference."""
    total_requests = sum(requests().values())
    sequence = prompt_tokens + answer_tokens
    if estimate == "bound":
        target_forward = math.ceil(sequence / BLOCK_SIZE) * costs.ar_token_s
        drafter_pass = math.ceil(answer_tokens / BLOCK_SIZE) * costs.drafter_block_s
    elif estimate == "throughput":
        rate = achieved_flops_per_s()
        target_token = 2 * TARGET_LAYERS * LAYER_PARAMS + attention_flops(1, sequence / 2, TARGET_LAYERS)
        target_forward = max(costs.ar_token_s, sequence * target_token / rate)
        drafter_pass = max(costs.drafter_block_s, answer_tokens * drafter_block_flops(sequence) / rate)
    else:
        raise ValueError(f"estimate: {estimate!r}; valid: bound, throughput")
    temperatures, drafters = len(TEMPERATURES), len(PAPER_TAU)
    answers = temperatures * total_requests * answer_tokens * costs.ar_token_s
    features = temperatures * total_requests * target_forward
    drafter = drafters * total_requests * drafter_pass
    # the decoded share of the speculative decoding of every prompt at every temperature
    subset = prompt_share(decoded_prompts_per_benchmark) / temperatures
    decoded = subset * decoding_hours(costs, answer_tokens)["speculative"] * 3600
    return {"answers": answers / 3600, "features": features / 3600, "drafters": drafter / 3600,
            "decoded_subset": decoded / 3600, "total": (answers + features + drafter + decoded) / 3600,
            "target_forward_s": target_forward, "drafter_pass_s": drafter_pass}


def prompt_share(prompts_per_benchmark: int) -> float:
    """The share of Table 1's prompts that ``prompts_per_benchmark`` a benchmark are."""
    return prompts_per_benchmark * len(PROMPTS) / sum(PROMPTS.values())


def timing_hours(costs: StepCosts, answer_tokens: int, *, prompts_per_benchmark: int, repeats: int) -> float:
    """SR (the ``timing`` section): at every temperature, ``prompts_per_benchmark`` prompts a benchmark decoded
    batch-1 by the target alone and by every drafter, ``repeats`` times (``dpace.evaluation.timing_run``)."""
    hours = decoding_hours(costs, answer_tokens, ar_per_drafter=False)
    return repeats * prompt_share(prompts_per_benchmark) * (hours["speculative"] + hours["autoregressive"])


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answer-tokens", type=int, default=MAX_NEW_TOKENS, help="mean answer length")
    parser.add_argument("--prompt-tokens", type=int, default=150, help="mean prompt length (chat template included)")
    parser.add_argument("--decoded-prompts", type=int, default=1,
                        help="eval.decoded_prompts_per_benchmark: the exactness check's decodes (paper.yaml: 1)")
    parser.add_argument("--timed-prompts", type=int, default=8, help="timing.prompts_per_benchmark (paper.yaml: 8)")
    parser.add_argument("--repeats", type=int, default=4, help="timing.repeats (paper.yaml: 4)")
    args = parser.parse_args(argv)
    rows = []
    print(f"Table 1 evaluation, {sum(requests().values())} requests x {len(TEMPERATURES)} temperatures x "
          f"{len(PAPER_TAU) // len(TEMPERATURES)} drafters, answers of {args.answer_tokens} tokens; GPU-hours")
    print(f"achieved FLOP rate of the Table 7 iteration: {achieved_flops_per_s() / 1e12:.0f} TFLOP/s")
    print("| decoder | decoding (AR per drafter) | decoding (AR shared) | replay, bound | replay, throughput "
          f"| + exactness check ({args.decoded_prompts} decoded prompt(s)/benchmark) "
          f"| SR timing ({args.timed_prompts} prompts/benchmark x {args.repeats} repeats) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for costs in DECODERS:
        row = {
            "decoder": costs.name,
            "decoding": decoding_hours(costs, args.answer_tokens)["total"],
            "decoding_shared_ar": decoding_hours(costs, args.answer_tokens, ar_per_drafter=False)["total"],
            **{f"replay_{e}": replay_hours(costs, args.answer_tokens, prompt_tokens=args.prompt_tokens, estimate=e)
               for e in ("bound", "throughput")},
            "replay_with_subset": replay_hours(costs, args.answer_tokens, prompt_tokens=args.prompt_tokens,
                                               estimate="throughput",
                                               decoded_prompts_per_benchmark=args.decoded_prompts),
            "timing": timing_hours(costs, args.answer_tokens, prompts_per_benchmark=args.timed_prompts,
                                   repeats=args.repeats),
        }
        rows.append(row)
        print(f"| {costs.name} | {row['decoding']:.1f} | {row['decoding_shared_ar']:.1f} | "
              f"{row['replay_bound']['total']:.1f} | {row['replay_throughput']['total']:.1f} | "
              f"{row['replay_with_subset']['total']:.1f} | {row['timing']:.1f} |")
    for row in rows:
        for estimate in ("bound", "throughput"):
            parts = row[f"replay_{estimate}"]
            print(f"{row['decoder']} replay ({estimate}): answers {parts['answers']:.2f} h, features "
                  f"{parts['features']:.2f} h, drafters {parts['drafters']:.2f} h; per request: target forward "
                  f"{1000 * parts['target_forward_s']:.1f} ms, drafter pass {1000 * parts['drafter_pass_s']:.1f} ms")
        print(f"{row['decoder']} exactness check: {row['replay_with_subset']['decoded_subset']:.2f} h")
    return rows

if __name__ == "__main__":
    main()
