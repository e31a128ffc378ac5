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
    # the paper's Table 7 shape on one GPU (docs/gpu.md has the H200 numbers)
    python benchmarks/bench_objectives.py --preset paper-table7 --device cuda --precision bf16 --attention flex_attention

``--preset paper-table7`` is a Qwen3-4B-sized drafter (hidden 2560, 32 heads of 128, 8 KV heads,
intermediate 9728, vocabulary 151936) with 3 layers, B=16, 512 anchors, sequences of 2048 tokens,
micro-batch 2, and a step that includes AdamW (``--optimizer adamw``): the paper's per-iteration unit.
Target features are given (random hidden states), as in training from cached features. On CUDA
every timed step is synchronised, and the wall-time ratio is the one to read (process CPU time
only counts the launching thread). ``--precision bf16`` autocasts the forward (fp32 weights and
AdamW state, as dpace's local trainer).

The paper's goal is D-PACE at most ~+3% over the DFlash decayed CE (2.3% on an H200).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
from specforge.modeling.draft.dflash import DFlashDraftModel
from torch import nn
from transformers import Qwen3Config

from dpace.training.objectives import NEEDS_TARGET_LOGITS, OBJECTIVES, block_loss
from dpace.training.online_model import ObjectiveDFlashModel
from dpace.training.specforge_run import ObjectiveSpec

PRESETS = {
    "paper-table7": {
        "hidden": 2560, "heads": 32, "kv_heads": 8, "head_dim": 128, "intermediate": 9728, "vocab": 151936,
        "layers": 3, "block_size": 16, "anchors": 512, "seq_len": 2048, "batch": 2, "optimizer": "adamw",
    },
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named shape; explicit flags override it")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast forward")
    parser.add_argument("--attention", default="sdpa", choices=["sdpa", "flex_attention"])
    parser.add_argument("--optimizer", default="none", choices=["none", "adamw"],
                        help="adamw: the step includes an AdamW update (the paper's per-iteration cost)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per step (micro-batch)")
    parser.add_argument("--layers", type=int, default=1, help="drafter layers")
    parser.add_argument("--heads", type=int, default=None, help="default hidden / 64")
    parser.add_argument("--kv-heads", type=int, default=None, help="default heads / 3")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--intermediate", type=int, default=None, help="default hidden * 8 / 3")
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
    args = parser.parse_args(argv)
    if args.preset:  # the preset's values, except where a flag was given explicitly
        given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in (argv if argv is not None else sys.argv[1:])
                 if a.startswith("--")}
        for key, value in PRESETS[args.preset].items():
            if key not in given:
                setattr(args, key, value)
    return args


def build_modules(args):
    """The drafter (SpecForge's ``DFlashDraftModel``), the frozen target LM head and embedding, built
    directly on ``args.device`` (a Qwen3-4B-sized head and embedding are 389M parameters each: built on
    the CPU first, their random initialisation alone took seconds). The drafter attends with
    ``args.attention``: the ``OnlineDFlashModel`` wrapping it builds a flex_attention ``BlockMask`` or a
    dense SDPA mask from the same setting, and the layers must consume the one it built (a hard-coded
    ``sdpa`` passed the BlockMask into SDPA on an H200, issue 43). Weights stay float32 whatever
    ``--precision`` says: bf16 autocasts the forward, as dpace's local trainer does."""
    torch.manual_seed(args.seed)
    heads = args.heads or max(1, args.hidden // 64)
    config = Qwen3Config(
        hidden_size=args.hidden,
        num_attention_heads=heads,
        num_key_value_heads=args.kv_heads or max(1, heads // 3),
        head_dim=args.head_dim,
        intermediate_size=args.intermediate or int(args.hidden * 8 / 3) // 64 * 64,
        num_hidden_layers=args.layers,
        vocab_size=args.vocab,
        layer_types=["full_attention"] * args.layers,
    )
    config.num_target_layers = 30
    config.block_size = args.block_size
    config.dflash_config = {"target_layer_ids": [1, 15, 28], "mask_token_id": args.vocab - 1}
    config._attn_implementation = args.attention
    with torch.device(args.device):
        draft = DFlashDraftModel(config)
        # The target's embedding and head are frozen in DFlash training.
        embed = nn.Embedding(args.vocab, args.hidden).requires_grad_(False)
        lm_head = nn.Linear(args.hidden, args.vocab, bias=False).requires_grad_(False)
    return draft, lm_head, embed


def objective_models(args, draft, lm_head, embed) -> dict[str, nn.Module]:
    """Every timed training wrapper around the one shared drafter: ours per objective, and SpecForge's
    own dflash and dpace, each building the attention mask of ``args.attention``."""
    common = dict(
        draft_model=draft,
        target_lm_head=lm_head,
        target_embed_tokens=embed,
        mask_token_id=args.vocab - 1,
        block_size=args.block_size,
        attention_backend=args.attention,
        num_anchors=args.anchors,
    )
    models: dict[str, nn.Module] = {
        name: ObjectiveDFlashModel(objective=ObjectiveSpec(name), **common) for name in ["dflash", *args.objectives] if name
    }
    models["specforge:dflash"] = OnlineDFlashModel(loss_type="dflash", loss_decay_gamma=4.0, **common)
    models["specforge:dpace"] = OnlineDFlashModel(loss_type="dpace", **common)
    return models


def build_batch(args):
    """Random tokens and target features, drawn on ``args.device`` (seeded there: CUDA draws other
    numbers than the CPU for the same seed, which does not matter for timing)."""
    generator = torch.Generator(args.device).manual_seed(args.seed + 1)
    shape = (args.batch, args.seq_len)
    with torch.device(args.device):
        input_ids = torch.randint(0, args.vocab - 1, shape, generator=generator)
        hidden_states = torch.randn(*shape, 3 * args.hidden, generator=generator)
        target_last_hidden_states = torch.randn(*shape, args.hidden, generator=generator)
        loss_mask = torch.ones(*shape)
    loss_mask[:, : args.seq_len // 8] = 0  # a prompt
    return input_ids, hidden_states, loss_mask, target_last_hidden_states


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run(args: argparse.Namespace) -> dict:
    """Time every objective's step (and its loss alone); print the table; return the medians in ms."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # Products of many small probabilities (accept-rate's S~, pard2-cat's weights at random
    # init) reach subnormal floats; x86 CPUs compute on those ~100x slower, GPUs do not.
    # Flushing them measures the objectives, not that CPU artefact.
    flush_denormal = not args.keep_denormals and torch.set_flush_denormal(True)
    draft, lm_head, embed = build_modules(args)
    input_ids, hidden_states, loss_mask, target_states = build_batch(args)
    models = objective_models(args, draft, lm_head, embed)

    optimizer = torch.optim.AdamW(draft.parameters(), lr=6e-4) if args.optimizer == "adamw" else None
    autocast = (torch.autocast(device_type=torch.device(args.device).type, dtype=torch.bfloat16)
                if args.precision == "bf16" else contextlib.nullcontext())

    def step(name: str) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) of one forward + backward (+ AdamW update)."""
        model = models[name]
        extra = {"target_last_hidden_states": target_states} if name in NEEDS_TARGET_LOGITS else {}
        torch.manual_seed(args.seed)  # same anchors for every objective
        sync(args.device)
        wall, cpu = time.perf_counter(), time.process_time()
        with autocast:
            loss, _, _ = model(input_ids, hidden_states, loss_mask, **extra)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        sync(args.device)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        draft.zero_grad(set_to_none=True)
        return wall, cpu

    names = list(models)
    step("dflash")  # warm-up: allocator, kernels, lazy inits (modules are shared)
    step("dpakl" if "dpakl" in models else "dflash")
    steps = interleaved(names, step, args.reps)

    # The objective alone (forward + backward of block_loss on fixed logits): the part of a
    # step that differs between objectives, without the shared model's noise.
    # Drawn on the device: the paper shape's two [2, 512, 16, 151936] logits tensors hold 2.5e9 floats each.
    generator = torch.Generator(args.device).manual_seed(args.seed + 2)
    shape = (args.batch, args.anchors, args.block_size)
    with torch.device(args.device):
        draft_logits = torch.randn(*shape, args.vocab, generator=generator).requires_grad_(True)
        target_logits = torch.randn(*shape, args.vocab, generator=generator)
        target_ids = torch.randint(0, args.vocab, shape, generator=generator)
        valid = torch.ones(shape, dtype=torch.bool)
    valid[..., 0] = False

    def loss_only(name: str) -> tuple[float, float]:
        sync(args.device)
        wall, cpu = time.perf_counter(), time.process_time()
        loss, _ = block_loss(
            name, draft_logits=draft_logits, target_ids=target_ids, valid=valid, target_logits=target_logits
        )
        loss.backward()
        sync(args.device)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        draft_logits.grad = None
        return wall, cpu

    objective_names = [name for name in names if name in OBJECTIVES]
    loss_only(objective_names[0])
    losses = interleaved(objective_names, loss_only, args.reps)

    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{os.cpu_count()} CPUs"
    print(
        f"# preset={args.preset} hidden={args.hidden} layers={args.layers} vocab={args.vocab} B={args.block_size} "
        f"anchors={args.anchors} seq={args.seq_len} micro-batch={args.batch} precision={args.precision} "
        f"attention={args.attention} optimizer={args.optimizer} reps={args.reps} threads={torch.get_num_threads()} "
        f"torch={torch.__version__} flush_denormal={flush_denormal} load average={os.getloadavg()[0]:.1f} on {device}"
    )
    print(
        "# step = ObjectiveDFlashModel forward+backward" + (" + AdamW" if optimizer else "")
        + "; ratio = median over repetitions of step / dflash step of the same repetition"
    )
    print("# loss only = block_loss forward+backward on fixed [micro-batch, anchors, B, V] logits; its extra")
    print("#   cost over dflash's is shown as a percentage of a median dflash step (CPU time)")
    print(
        "| objective | step wall (ms) | step CPU (ms) | step ratio (CPU) | step ratio (wall) "
        "| loss only CPU (ms) | loss-only extra vs dflash step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    dflash_step_cpu = median(steps["dflash"], 1)
    dflash_loss_cpu = median(losses["dflash"], 1)
    for name in names:
        row = f"| {name} | {1000 * median(steps[name], 0):.1f} | {1000 * median(steps[name], 1):.0f} "
        row += f"| {paired_ratio(steps[name], steps['dflash'], 1):.3f} "
        row += f"| {paired_ratio(steps[name], steps['dflash'], 0):.3f} "
        if name in losses:
            extra = (median(losses[name], 1) - dflash_loss_cpu) / dflash_step_cpu
            row += f"| {1000 * median(losses[name], 1):.1f} | {100 * extra:+.2f}% |"
        else:
            row += "| n/a | n/a |"
        print(row)
    return {name: {"step_ms": 1000 * median(steps[name], 0),
                   "ratio_wall": paired_ratio(steps[name], steps["dflash"], 0)} for name in names}


def main(argv=None) -> None:
    run(parse_args(argv))


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
