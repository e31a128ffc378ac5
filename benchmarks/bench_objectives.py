"""Per-step cost of every objective inside SpecForge's DFlash wrapper, relative to dflash.

One SpecForge ``DFlashDraftModel`` (SmolLM2-135M-like width and vocabulary, one layer), one
batch, one process: each objective's training step (forward + backward) is timed in interleaved
repetitions (the order rotates every repetition, so drift in machine load hits all rows
alike) and reported as the median wall time and median process CPU time, each as a ratio to
our ``dflash`` row. On a shared machine the CPU time of a single-threaded run is the steadier
number: other processes stretch wall time but not the CPU time this process uses. SpecForge's own
``OnlineDFlashModel`` dflash / dpace rows are included as references.

    python benchmarks/bench_objectives.py            # defaults below, ~1.5-2 min on one core
    python benchmarks/bench_objectives.py --reps 9 --seq-len 1024

The paper's goal is D-PACE at most ~+3% over the DFlash decayed CE (2.3% on an H200).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
from specforge.modeling.draft.dflash import DFlashDraftModel
from torch import nn
from transformers import Qwen3Config

from dpace.objectives import NEEDS_TARGET_LOGITS, OBJECTIVES, block_loss
from dpace.online_model import ObjectiveDFlashModel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per objective")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: steadiest on a shared machine; 0: torch default)",
    )
    parser.add_argument(
        "--keep-denormals",
        action="store_true",
        help="do not flush subnormal floats to zero (CPU arithmetic on them is ~100x slower)",
    )
    parser.add_argument("--objectives", nargs="*", default=list(OBJECTIVES))
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def build_modules(args):
    torch.manual_seed(args.seed)
    heads = max(1, args.hidden // 64)
    config = Qwen3Config(
        hidden_size=args.hidden,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 3),
        head_dim=64,
        intermediate_size=int(args.hidden * 8 / 3) // 64 * 64,
        num_hidden_layers=1,
        vocab_size=args.vocab,
        layer_types=["full_attention"],
    )
    config.num_target_layers = 30
    config.block_size = args.block_size
    config.dflash_config = {"target_layer_ids": [1, 15, 28], "mask_token_id": args.vocab - 1}
    config._attn_implementation = "sdpa"
    draft = DFlashDraftModel(config)
    # The target's embedding and head are frozen in DFlash training.
    embed = nn.Embedding(args.vocab, args.hidden).requires_grad_(False)
    lm_head = nn.Linear(args.hidden, args.vocab, bias=False).requires_grad_(False)
    return draft, lm_head, embed


def build_batch(args):
    generator = torch.Generator().manual_seed(args.seed + 1)
    input_ids = torch.randint(0, args.vocab - 1, (1, args.seq_len), generator=generator)
    hidden_states = torch.randn(1, args.seq_len, 3 * args.hidden, generator=generator)
    target_last_hidden_states = torch.randn(1, args.seq_len, args.hidden, generator=generator)
    loss_mask = torch.ones(1, args.seq_len)
    loss_mask[:, : args.seq_len // 8] = 0  # a prompt
    return input_ids, hidden_states, loss_mask, target_last_hidden_states


def main() -> None:
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # Products of many small probabilities (accept-rate's S~, pard2-cat's weights at random
    # init) reach subnormal floats; x86 CPUs compute on those ~100x slower, GPUs do not.
    # Flushing them measures the objectives, not that CPU artefact.
    flush_denormal = not args.keep_denormals and torch.set_flush_denormal(True)
    draft, lm_head, embed = build_modules(args)
    input_ids, hidden_states, loss_mask, target_states = build_batch(args)
    common = dict(
        draft_model=draft,
        target_lm_head=lm_head,
        target_embed_tokens=embed,
        mask_token_id=args.vocab - 1,
        block_size=args.block_size,
        attention_backend="sdpa",
        num_anchors=args.anchors,
    )
    models: dict[str, nn.Module] = {
        name: ObjectiveDFlashModel(objective=name, **common) for name in ["dflash", *args.objectives] if name
    }
    models["specforge:dflash"] = OnlineDFlashModel(loss_type="dflash", loss_decay_gamma=4.0, **common)
    models["specforge:dpace"] = OnlineDFlashModel(loss_type="dpace", **common)

    def step(name: str) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) of one forward + backward."""
        model = models[name]
        extra = {"target_last_hidden_states": target_states} if name in NEEDS_TARGET_LOGITS else {}
        torch.manual_seed(args.seed)  # same anchors for every objective
        wall, cpu = time.perf_counter(), time.process_time()
        loss, _, _ = model(input_ids, hidden_states, loss_mask, **extra)
        loss.backward()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        draft.zero_grad(set_to_none=True)
        return wall, cpu

    names = list(models)
    step("dflash")  # warm-up: allocator, kernels, lazy inits (modules are shared)
    step("dpakl" if "dpakl" in models else "dflash")
    steps = interleaved(names, step, args.reps)

    # The objective alone (forward + backward of block_loss on fixed logits): the part of a
    # step that differs between objectives, without the shared model's noise.
    generator = torch.Generator().manual_seed(args.seed + 2)
    shape = (1, args.anchors, args.block_size)
    draft_logits = torch.randn(*shape, args.vocab, generator=generator).requires_grad_(True)
    target_logits = torch.randn(*shape, args.vocab, generator=generator)
    target_ids = torch.randint(0, args.vocab, shape, generator=generator)
    valid = torch.ones(shape, dtype=torch.bool)
    valid[..., 0] = False

    def loss_only(name: str) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        loss, _ = block_loss(
            name, draft_logits=draft_logits, target_ids=target_ids, valid=valid, target_logits=target_logits
        )
        loss.backward()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        draft_logits.grad = None
        return wall, cpu

    objective_names = [name for name in names if name in OBJECTIVES]
    loss_only(objective_names[0])
    losses = interleaved(objective_names, loss_only, args.reps)

    print(
        f"# hidden={args.hidden} vocab={args.vocab} B={args.block_size} anchors={args.anchors} "
        f"seq={args.seq_len} reps={args.reps} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"flush_denormal={flush_denormal} load average={os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        "# step = ObjectiveDFlashModel forward+backward; ratio = median over repetitions of "
        "step / dflash step of the same repetition"
    )
    print("# loss only = block_loss forward+backward on fixed [1, anchors, B, V] logits; its extra")
    print("#   cost over dflash's is shown as a percentage of a median dflash step (CPU time)")
    print(
        "| objective | step CPU (ms) | step ratio (CPU) | step ratio (wall) "
        "| loss only CPU (ms) | loss-only extra vs dflash step |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    dflash_step_cpu = median(steps["dflash"], 1)
    dflash_loss_cpu = median(losses["dflash"], 1)
    for name in names:
        row = f"| {name} | {1000 * median(steps[name], 1):.0f} "
        row += f"| {paired_ratio(steps[name], steps['dflash'], 1):.3f} "
        row += f"| {paired_ratio(steps[name], steps['dflash'], 0):.3f} "
        if name in losses:
            extra = (median(losses[name], 1) - dflash_loss_cpu) / dflash_step_cpu
            row += f"| {1000 * median(losses[name], 1):.1f} | {100 * extra:+.2f}% |"
        else:
            row += "| n/a | n/a |"
        print(row)


def interleaved(names, measure, reps):
    """reps samples of measure(name) per name; the order rotates each repetition so slow
    drift in machine load is shared by all names."""
    samples = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            samples[name].append(measure(name))
    return samples


def median(samples, which):
    return statistics.median(sample[which] for sample in samples)


def paired_ratio(samples, baseline, which):
    """Median over repetitions of sample / baseline sample of the same repetition."""
    return statistics.median(s[which] / b[which] for s, b in zip(samples, baseline, strict=True))


if __name__ == "__main__":
    main()
