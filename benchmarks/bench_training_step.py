"""One optimizer step of the real training loop, and its distance to this machine's matrix-product rate.

In one process: the default config's training step (``config.yaml``'s ``train`` section, DFlash
objective; ``dpace.training.loop``'s own set-up and ``_optimizer_step``) on synthetic features of the
default's shapes (SmolLM2-135M's width and vocabulary, 64-token answers after prompts of varied length;
``--run-dir`` trains on a finished run's cached features and target instead), and prints

- the matrix-product FLOP of one optimizer step, counted (``torch.utils.flop_counter.FlopCounterMode``:
  mm, addmm, bmm, attention);
- ms per step and the achieved GFLOP/s;
- this CPU's bf16 and fp32 matmul rate at the step's own product shapes (every product the step runs,
  recorded while it runs, replayed on its own with ``torch.mm``/``torch.bmm``), measured in the same
  process, interleaved with the steps, so that a loaded machine slows both alike;
- the ratio of the two, and the top self-time ops of a profiled step (``torch.profiler``).

    python benchmarks/bench_training_step.py                        # synthetic features, config.yaml's train
    python benchmarks/bench_training_step.py --run-dir <run>        # a finished run's features and target
    python benchmarks/bench_training_step.py --unseen-context-ab --run-dir <run>   # the commit-0940ae1 A/B

``--unseen-context-ab`` keeps this file's earlier benchmark: ``train_drafter`` for one epoch on the first
``--sequences`` answers, once as it trains and once with the whole sequences (the loop before commit
0940ae1, which drops the context no block of a sliding-window drafter sees), alternating ``--repeats``
times, printing each one's mean step time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from unittest import mock

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpace.features import FeatureSet, load_features  # noqa: E402
from dpace.training.loop import TrainConfig, train_drafter  # noqa: E402

# SmolLM2-135M-Instruct, the embedded default's target: what the drafter's shapes follow.
SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_heads": 9, "num_kv_heads": 3}
FEATURE_LAYERS = [1, 2, 3]  # three captured layers (the default's num_target_features), of a 4-layer stand-in


def synthetic_features(sequences: int, *, vocab_size: int, hidden_size: int, answer_tokens: int = 64,
                       seed: int = 0) -> FeatureSet:
    """Features of the default's shapes: prompts of 20-380 tokens, answers of ``answer_tokens`` (a fifth
    of them shorter, as answers that end early), token ids drawn Zipf-like (so a 4,096-token draft
    vocabulary covers most answer tokens, as on real answers), hidden states N(0, 1) in bf16."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(20, 380, (sequences,), generator=generator)
    answer = torch.where(torch.rand(sequences, generator=generator) < 0.2,
                         torch.randint(8, answer_tokens, (sequences,), generator=generator), answer_tokens)
    lengths = prompt + answer
    total = int(lengths.sum())
    ranks = torch.arange(1, vocab_size + 1, dtype=torch.float64)
    ids = torch.multinomial(1.0 / ranks, total, replacement=True, generator=generator)
    ids = torch.randperm(vocab_size, generator=generator)[ids]  # frequent tokens anywhere in the vocabulary
    loss_mask = torch.cat([torch.cat([torch.zeros(int(p)), torch.ones(int(a))]) for p, a in zip(prompt, answer, strict=True)])
    hidden = torch.randn(total, len(FEATURE_LAYERS) * hidden_size, generator=generator).to(torch.bfloat16)
    last_hidden = torch.randn(total, hidden_size, generator=generator).to(torch.bfloat16)
    return FeatureSet(input_ids=ids.int(), loss_mask=loss_mask.to(torch.uint8),
                      offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
                      hidden=hidden, last_hidden=last_hidden, layer_ids=list(FEATURE_LAYERS))


def synthetic_target(folder: Path) -> Path:
    """A random 4-layer target of SmolLM2's width, heads and vocabulary (its tokenizer): the drafter reads
    only its embeddings and LM head, which have the real shapes."""
    from dpace.targets import prepare_target

    return prepare_target({"source": "random", "num_layers": 4, **SMOLLM2}, folder, seed=0)


def default_train_config(args) -> TrainConfig:
    train = yaml.safe_load((ROOT / "config.yaml").read_text())["train"]
    train = {key: value for key, value in train.items() if key not in ("backend", "seed", "seeds", "objective_hparams")}
    overrides = {"objective": args.objective, "seed": 0, "threads": args.threads, "save_every_steps": 10**9,
                 "epochs": 1, "precision": args.precision or train["precision"]}
    if args.micro_batch_size:
        overrides["micro_batch_size"] = args.micro_batch_size
    if args.grad_accumulation:
        overrides["grad_accumulation"] = args.grad_accumulation
    return TrainConfig.from_config(train, **overrides)


class _ProductShapes(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the (op, operand shapes) of every matrix product that runs under it."""

    PRODUCTS = {torch.ops.aten.mm.default: "mm", torch.ops.aten.addmm.default: "addmm",
                torch.ops.aten.bmm.default: "bmm"}

    def __init__(self):
        super().__init__()
        self.shapes: Counter = Counter()
        self.ops: Counter = Counter()  # every aten op that ran: a count the machine's load cannot change

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.__name__.split(".")[0]] += 1
        kind = self.PRODUCTS.get(func)
        if kind == "addmm":
            self.shapes["mm", tuple(args[1].shape), tuple(args[2].shape)] += 1
        elif kind is not None:
            self.shapes[kind, tuple(args[0].shape), tuple(args[1].shape)] += 1
        return func(*args, **(kwargs or {}))


def product_flop(shapes: Counter) -> float:
    flop = 0.0
    for (kind, left, right), count in shapes.items():
        if kind == "mm":
            flop += 2 * left[0] * left[1] * right[1] * count
        else:
            flop += 2 * left[0] * left[1] * left[2] * right[2] * count
    return flop


def time_products(shapes: Counter, dtype: torch.dtype, repeats: int = 3) -> float:
    """Seconds to run every recorded product once per occurrence, in ``dtype`` (the best of ``repeats``)."""
    operands = []
    for (kind, left, right), count in shapes.items():
        a, b = torch.randn(left).to(dtype), torch.randn(right).to(dtype)
        operands.append((torch.mm if kind == "mm" else torch.bmm, a, b, count))
    for function, a, b, _ in operands:  # warm: first calls pick kernels
        function(a, b)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for function, a, b, count in operands:
            for _ in range(count):
                function(a, b)
        best = min(best, time.perf_counter() - started)
    return best


def top_self_ops(run, batches, steps: int, top: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from dpace.training.loop import _optimizer_step

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(steps):
            _optimizer_step(run, batches[step % len(batches)])
    events = sorted(prof.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True)
    total = sum(event.self_cpu_time_total for event in events)
    return [{"op": event.key, "ms_per_step": round(event.self_cpu_time_total / 1000 / steps, 1),
             "share": round(event.self_cpu_time_total / total, 3), "calls_per_step": event.count // steps}
            for event in events[:top]]


def step_benchmark(args) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from dpace.training import loop
    from dpace.training.loop import _checked_settings, _optimizer_step, _set_up

    config = default_train_config(args)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        started = time.perf_counter()
        if args.run_dir:
            results = Path(args.run_dir) / "results"
            target_json = results / "targets" / args.target / "target.json"
            features = load_features(results / "features" / args.target / args.dataset)
        else:
            target_json = synthetic_target(scratch / "target")
            features = synthetic_features(args.sequences, vocab_size=49152, hidden_size=SMOLLM2["hidden_size"])
        inputs_s = time.perf_counter() - started
        config, objective, hparams = _checked_settings(config)
        started = time.perf_counter()
        run = _set_up(config, objective, hparams, target_json=target_json, features_dir=features,
                      out_dir=scratch / "out", scratch_dir=scratch / "scratch")
        set_up_s = time.perf_counter() - started
        order = torch.randperm(len(run.features), generator=torch.Generator().manual_seed(0)).tolist()
        micro = list(loop.padded_micro_batches(run.features, order, config.micro_batch_size, loop._feature_dtype(run),
                                               with_last_hidden=run.needs_target))
        batches = [micro[i : i + config.grad_accumulation] for i in range(0, len(micro), config.grad_accumulation)]
        batches = [group for group in batches if len(group) == config.grad_accumulation]

        step_index = 0

        def steps(count: int) -> list[float]:
            nonlocal step_index
            times = []
            for _ in range(count):
                started = time.perf_counter()
                _optimizer_step(run, batches[step_index % len(batches)])
                times.append(time.perf_counter() - started)
                step_index += 1
            return times

        started = time.perf_counter()
        steps(args.warmup)
        warmup_s = time.perf_counter() - started
        # FLOP and product shapes over the same steps (anchors and widths vary from step to step).
        shapes = _ProductShapes()
        counter = FlopCounterMode(display=False)
        with counter, shapes:
            steps(args.counted_steps)
        flop_per_step = counter.get_total_flops() / args.counted_steps
        product_shapes = Counter({key: count for key, count in shapes.shapes.items()})
        replayed_flop = product_flop(product_shapes) / args.counted_steps
        rounds = {"step_s": [], "bf16_products_s": [], "fp32_products_s": []}
        for _ in range(args.rounds):  # interleaved: a load change slows the step and the peak alike
            rounds["step_s"].append(statistics.median(steps(args.steps)))
            rounds["bf16_products_s"].append(time_products(product_shapes, torch.bfloat16) / args.counted_steps)
            rounds["fp32_products_s"].append(time_products(product_shapes, torch.float32) / args.counted_steps)
        ops = top_self_ops(run, batches, args.profile_steps, args.top)

    def summary(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    step = summary(rounds["step_s"])
    bf16 = summary(rounds["bf16_products_s"])
    fp32 = summary(rounds["fp32_products_s"])
    achieved = flop_per_step / step["median"] / 1e9
    peak_bf16 = replayed_flop / bf16["median"] / 1e9
    peak_fp32 = replayed_flop / fp32["median"] / 1e9
    ratios = [flop_per_step / s / (replayed_flop / b) for s, b in zip(rounds["step_s"], rounds["bf16_products_s"], strict=True)]
    return {
        "cpu": cpu_model(), "threads": args.threads, "load_average": [round(x, 2) for x in _load_average()],
        "features": args.run_dir or f"synthetic ({args.sequences} sequences)",
        "config": {"objective": config.objective, "precision": config.precision, "depth": config.depth,
                   "block_size": config.block_size, "num_anchors": config.num_anchors,
                   "micro_batch_size": config.micro_batch_size, "grad_accumulation": config.grad_accumulation,
                   "draft_vocab_size": config.draft_vocab_size, "sliding_window": config.sliding_window},
        "gflop_per_step": round(flop_per_step / 1e9, 2),
        "product_gflop_per_step": round(replayed_flop / 1e9, 2),
        "aten_ops_per_step": sum(shapes.ops.values()) / args.counted_steps,
        "most_frequent_ops_per_step": {op: n / args.counted_steps for op, n in shapes.ops.most_common(8)},
        "ms_per_step": {k: round(1000 * v, 1) for k, v in step.items()},
        "achieved_gflops": round(achieved, 1),
        "bf16_product_gflops_at_step_shapes": round(peak_bf16, 1),
        "fp32_product_gflops_at_step_shapes": round(peak_fp32, 1),
        "ratio_to_bf16_peak": {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3),
                               "max": round(max(ratios), 3)},
        "ratio_to_fp32_peak": round(achieved / peak_fp32, 3),
        "rounds": {k: [round(1000 * v, 1) for v in values] for k, values in rounds.items()},
        "set_up_s": {"inputs": round(inputs_s, 2), "set_up": round(set_up_s, 2), "warmup_steps": round(warmup_s, 2)},
        "top_self_ops": ops,
        "largest_products": [{"op": kind, "shapes": [list(left), list(right)], "per_step": count / args.counted_steps}
                             for (kind, left, right), count in sorted(
                                 product_shapes.items(), key=lambda item: -product_flop(Counter({item[0]: item[1]})))[:8]],
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _load_average() -> tuple[float, float, float]:
    import os

    return os.getloadavg()


def unseen_context_ab(args) -> None:
    results = Path(args.run_dir) / "results"
    features = load_features(results / "features" / args.target / args.dataset).select(range(args.sequences))
    config = TrainConfig.from_config(
        {}, objective="dflash", objective_hparams={"gamma": 4.0}, depth=1, block_size=8, num_anchors=args.num_anchors,
        epochs=1, micro_batch_size=2, grad_accumulation=2, seed=0,
        precision=args.precision or "auto", draft_vocab_size=4096, sliding_window=16,
        threads=args.threads, save_every_steps=10**9,
    )
    step_times = {"without unseen context (trains)": [], "whole sequences": []}
    for _ in range(args.repeats):
        for mode, times in step_times.items():
            whole_sequences = (mock.patch.object(FeatureSet, "without_unseen_context", lambda self, window: self)
                               if mode == "whole sequences" else contextlib.nullcontext())
            with tempfile.TemporaryDirectory() as scratch, whole_sequences:
                summary = train_drafter(config, target_json=results / "targets" / args.target / "target.json",
                                        features_dir=features, out_dir=Path(scratch) / "out",
                                        scratch_dir=Path(scratch) / "scratch")
            times.append(summary["time_per_step_s"])
    report = {mode: round(1000 * statistics.mean(times), 1) for mode, times in step_times.items()}
    print(json.dumps({"ms_per_step": report, "runs": step_times}, indent=1))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="a finished run's folder holding results/ (default: synthetic features)")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dataset", default="sharegpt+codealpaca")
    parser.add_argument("--objective", default="dflash")
    parser.add_argument("--precision", help="default: config.yaml's train.precision")
    parser.add_argument("--micro-batch-size", type=int, default=0, help="0: config.yaml's")
    parser.add_argument("--grad-accumulation", type=int, default=0, help="0: config.yaml's")
    parser.add_argument("--sequences", type=int, default=240, help="synthetic answers (micro-batch 2 x 2: N/4 steps)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--counted-steps", type=int, default=4, help="steps whose FLOP and product shapes are counted")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round (their median is the round's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--unseen-context-ab", action="store_true", help="the earlier benchmark (needs --run-dir)")
    parser.add_argument("--num-anchors", type=int, default=32, help="--unseen-context-ab only")
    parser.add_argument("--repeats", type=int, default=2, help="--unseen-context-ab only")
    parser.add_argument("--json", help="also write the report here")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.unseen_context_ab:
        if not args.run_dir:
            raise SystemExit("--unseen-context-ab needs --run-dir")
        unseen_context_ab(args)
        return
    report = step_benchmark(args)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
