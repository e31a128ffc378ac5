"""Learning curve of a drafter: held-out teacher-forced tau proxy and accuracy after every epoch.

Trains with ``dpace.training.loop.train_drafter`` on all but the last ``--heldout`` sequences of a cached
feature set (a run's ``results/features/<target>/<set>/``), then scores each epoch's checkpoint on the
held-out sequences with the training wrapper in eval mode: per block, 1 + the number of leading
positions whose argmax is the target's token (the T=0 emitted length if the target's answer were the
context, which it is at T=0), the per-position accuracy, and the mean q of the target's token.

    python benchmarks/learning_curve.py --run-dir results --name dflash-e6 --epochs 6
    python benchmarks/learning_curve.py --plot docs/learning-curve.png --plot-only 'runA-*'  # one group of curves

``--benchmark-answers`` also scores every epoch on the target's own T=0 answers to the run's benchmark
prompts (an autoregressive-baseline jsonl): teacher-forced on those answers, the proxy is what speculative
decoding measures at T=0, so it predicts Table 1's tau, which the held-out ShareGPT answers do not.
``--extra-features DIR --extra-sequences N`` mixes N answers of a second feature set into training.
``--max-answer-tokens N`` trains on each answer's first N tokens only (what a smaller
``responses.max_new_tokens`` would have generated; the target is causal, so the features are the same).

Each run appends one JSON line to ``--record`` (default ``benchmarks/learning_curves.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def heldout_scores(checkpoint: Path, target, features, *, block_size: int, num_anchors: int = 64, seed: int = 123) -> dict:
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    from dpace.training.drafter import build_drafter, draft_output_head
    from dpace.training.loop import padded_micro_batches
    from dpace.training.online_model import ObjectiveDFlashModel
    from dpace.training.specforge_run import ObjectiveSpec

    config = Qwen3Config.from_pretrained(str(checkpoint))
    drafter = build_drafter(config)
    drafter.load_state_dict(load_file(str(checkpoint / "model.safetensors")))
    model = ObjectiveDFlashModel(
        # A drafter with a draft vocabulary is scored as it decodes: tokens outside it have q = 0.
        draft_model=drafter, target_lm_head=draft_output_head(config, target.lm_head), target_embed_tokens=target.get_input_embeddings(),
        mask_token_id=config.dflash_config["mask_token_id"], block_size=block_size, num_anchors=num_anchors,
        objective=ObjectiveSpec("dflash"),
    ).eval()
    torch.manual_seed(seed)  # the same anchors for every checkpoint
    sums: dict[str, list] = {}
    with torch.no_grad():
        for batch in padded_micro_batches(features, list(range(len(features))), 4):
            _, _, metrics = model(input_ids=batch["input_ids"], hidden_states=batch["hidden"], loss_mask=batch["loss_mask"])
            for name, (numerator, denominator) in metrics["ratio_metrics"].items():
                total = sums.setdefault(name, [0, 0])
                total[0], total[1] = total[0] + numerator, total[1] + denominator
    ratio = {name: numerator / denominator for name, (numerator, denominator) in sums.items()}
    return {
        "tau_proxy": float(ratio["expected_emitted_length"]),
        "accuracy": float(ratio["acc"]),
        "q_per_position": [round(float(q), 4) for q in ratio["q_per_position"][1:]],
    }


def first_answer_tokens(features, max_answer_tokens: int):
    """Each sequence cut after its first ``max_answer_tokens`` answer (loss) tokens. The target is causal,
    so the cut sequence's features are those of a shorter answer: a stand-in for generating at most
    that many tokens per training prompt."""
    spans = []
    for index in range(len(features)):
        start, end = int(features.offsets[index]), int(features.offsets[index + 1])
        answer_positions = features.loss_mask[start:end].nonzero().flatten()
        if len(answer_positions) > max_answer_tokens:
            end = start + int(answer_positions[max_answer_tokens - 1]) + 1
        spans.append((start, end))
    return features.slices(spans)


def benchmark_answers(run_dir: Path, tokenizer, records_path: Path) -> list[tuple[str, list[int], list[int]]]:
    """(benchmark, prompt ids, answer ids) of the target's T=0 answers to the first turn of each benchmark
    prompt (an autoregressive-baseline jsonl of the run whose ``results/`` is ``run_dir``), by benchmark."""
    from dpace.io import read_jsonl
    from dpace.targets import chat_prompt_ids

    rows = {(path.stem, str(row["id"])): row for path in sorted((run_dir / "data" / "benchmarks").glob("*.jsonl"))
            for row in read_jsonl(path)}
    answers = sorted((r for r in read_jsonl(records_path) if r["temperature"] == 0.0), key=lambda r: r["benchmark"])
    return [(record["benchmark"],
             chat_prompt_ids(tokenizer, [{"role": "user", "content": rows[record["benchmark"], record["id"]]["turns"][0]}]),
             record["turns"][0]["new_token_ids"])
            for record in answers]


def benchmark_answer_features(run_dir: Path, target, tokenizer, records_path: Path, layer_ids: list[int]):
    """Features of ``benchmark_answers``, as ``dpace.features`` computes them for training (float32 target,
    bf16 storage)."""
    from dpace.features import STORE_DTYPE, FeatureSet, target_hidden_states

    sequences = []
    for _, prompt, answer in benchmark_answers(run_dir, tokenizer, records_path):
        ids = torch.tensor([prompt + answer])
        with torch.no_grad():
            hidden, last = target_hidden_states(target, ids, torch.ones_like(ids), layer_ids, True)
        sequences.append(FeatureSet(
            input_ids=ids[0].int(), loss_mask=torch.tensor([0] * len(prompt) + [1] * len(answer), dtype=torch.uint8),
            offsets=torch.tensor([0, ids.shape[1]]), hidden=hidden[0].to(STORE_DTYPE), last_hidden=last[0].to(STORE_DTYPE),
            layer_ids=list(layer_ids)))
    if not sequences:
        raise ValueError(f"{records_path} has no T=0 answers")
    return FeatureSet.concatenate(sequences)


def ngram_first_position(train_set, heldout) -> dict:
    """What the drafter's first block position could learn from tokens alone: how often the most frequent
    successor of the anchor token in the training answers (bigram), or of the last two tokens backing off
    to the anchor token (trigram), is the held-out answer's next token. Anchors as in training: response
    tokens whose successor is a response token."""
    from collections import Counter, defaultdict

    def answers(features):
        for i in range(len(features)):
            item = features.sequence(i)
            yield item["input_ids"].tolist(), item["loss_mask"].tolist()

    bigram, trigram = defaultdict(Counter), defaultdict(Counter)
    for ids, _ in answers(train_set):
        for t in range(1, len(ids) - 1):
            bigram[ids[t]][ids[t + 1]] += 1
            trigram[ids[t - 1], ids[t]][ids[t + 1]] += 1

    def hit(table, key, token):
        return key in table and table[key].most_common(1)[0][0] == token

    anchors = bigram_hits = trigram_hits = 0
    for ids, mask in answers(heldout):
        for a in range(1, len(ids) - 1):
            if mask[a] and mask[a + 1]:
                anchors += 1
                bigram_hits += hit(bigram, ids[a], ids[a + 1])
                key = (ids[a - 1], ids[a])
                trigram_hits += hit(trigram, key, ids[a + 1]) if key in trigram else hit(bigram, ids[a], ids[a + 1])
    return {"anchors": anchors, "bigram_accuracy": bigram_hits / anchors, "trigram_backoff_accuracy": trigram_hits / anchors}


def run(args) -> dict:
    from dpace.features import FeatureSet, load_features
    from dpace.targets import load_target
    from dpace.training.loop import TrainConfig, train_drafter

    run_dir = Path(args.run_dir)
    target_json = run_dir / "targets" / args.target / "target.json"
    features = load_features(run_dir / "features" / args.target / args.dataset)
    split = len(features) - args.heldout
    train_set, heldout = features.select(range(split)), features.select(range(split, len(features)))
    if args.train_sequences:  # how tau grows with data: the first N training answers, same held-out set
        split = min(args.train_sequences, split)
        train_set = features.select(range(split))
    if args.fit_on:  # can the drafter fit a few answers at all? Train and score on the same ones.
        split = args.fit_on
        train_set = heldout = features.select(range(args.fit_on))
    if args.extra_features:  # a second data set mixed in (e.g. CodeAlpaca answers), shuffled together
        extra = load_features(args.extra_features)
        train_set = FeatureSet.concatenate([train_set, extra.select(range(min(args.extra_sequences or len(extra), len(extra))))])
        train_set = train_set.select(torch.randperm(len(train_set), generator=torch.Generator().manual_seed(0)).tolist())
        split = len(train_set)
    target, tokenizer = load_target(target_json, dtype=torch.float32)  # scores the checkpoints, computes benchmark features
    if args.max_answer_tokens:  # shorter training answers: as if generated with a smaller max_new_tokens
        train_set = first_answer_tokens(train_set, args.max_answer_tokens)
    benchmark_answers = None
    if args.benchmark_answers:
        benchmark_answers = benchmark_answer_features(run_dir, target, tokenizer, Path(args.benchmark_answers),
                                                      features.layer_ids)
    if args.without_target_features:  # an ablation: what the drafter learns from the tokens of its block alone
        for part in (train_set, heldout, benchmark_answers):
            if part is not None:
                part.hidden = torch.zeros_like(part.hidden)
    if args.ngram:
        print(json.dumps({"train_sequences": split, "heldout_sequences": len(heldout),
                          **ngram_first_position(train_set, heldout)}))
        return {}
    hparams = {"alpha": 0.5} if args.objective.startswith("dpace") else {}
    config = TrainConfig.from_config(
        {}, seed=0, objective=args.objective, objective_hparams=hparams, depth=args.depth, block_size=args.block_size,
        num_anchors=args.num_anchors, epochs=args.epochs, learning_rate=args.learning_rate,
        precision=args.precision, drafter_init=args.drafter_init, micro_batch_size=args.micro_batch_size,
        grad_accumulation=args.grad_accumulation, threads=args.threads, save_every_steps=10**9,
        draft_vocab_size=args.draft_vocab_size, sliding_window=args.sliding_window,
        feature_scaling=args.feature_scaling,
    )
    out = Path(args.work_dir) / args.name
    started = time.perf_counter()
    summary = train_drafter(config, target_json=target_json, features_dir=train_set, out_dir=out,
                            scratch_dir=out / "scratch")
    wall = time.perf_counter() - started
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    curve = []
    for epoch in range(1, args.epochs + 1):
        minutes = sum(s["step_time_s"] for s in steps if s["epoch"] <= epoch) / 60
        scores = heldout_scores(out / f"epoch-{epoch}", target, heldout, block_size=args.block_size)
        if benchmark_answers is not None:
            on_benchmarks = heldout_scores(out / f"epoch-{epoch}", target, benchmark_answers, block_size=args.block_size)
            scores |= {f"benchmark_{name}": value for name, value in on_benchmarks.items()}
        curve.append({"epoch": epoch, "train_minutes": round(minutes, 3), **scores})
        print(json.dumps(curve[-1]), flush=True)
    record = {
        "name": args.name, "config": {k: v for k, v in vars(args).items() if k not in ("plot", "record")},
        "train_sequences": split, "heldout_sequences": args.heldout, "steps": summary["steps"],
        "time_per_step_s": summary["time_per_step_s"], "wall_s": wall, "curve": curve,
    }
    with open(args.record, "a") as handle:
        handle.write(json.dumps(record) + "\n")
    return record


def default_dataset() -> str:
    import yaml

    from dpace.data import mixture_name

    config = yaml.safe_load(Path(__file__).resolve().parents[1].joinpath("config.yaml").read_text())
    return mixture_name(config["data"]["train_set"])


def plot(record_path: str, out: str, only: str = "*") -> None:
    """Every recorded curve whose name matches ``only`` (a shell pattern): held-out tau proxy on the left,
    the benchmark-answer proxy on the right (held-out accuracy when no selected run scored benchmark answers)."""
    import fnmatch

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in Path(record_path).read_text().splitlines() if line.strip()]
    records = [record for record in records if fnmatch.fnmatch(record["name"], only)]
    if not records:
        raise ValueError(f"no recorded curve in {record_path} is named like {only!r}")
    on_benchmark = any("benchmark_tau_proxy" in record["curve"][0] for record in records)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5 + 0.12 * len(records)), sharey=on_benchmark)
    tab20 = plt.get_cmap("tab20").colors
    palette = tab20[::2] + tab20[1::2]  # more curves than the default cycle's 10 colours
    for index, record in enumerate(records):
        minutes = [0.0] + [point["train_minutes"] for point in record["curve"]]
        style = {"marker": "o", "label": record["name"], "color": palette[index % len(palette)]}
        left.plot(minutes, [1.0] + [p["tau_proxy"] for p in record["curve"]], **style)
        if not on_benchmark:
            right.plot(minutes, [0.0] + [p["accuracy"] for p in record["curve"]], **style)
        elif "benchmark_tau_proxy" in record["curve"][0]:
            right.plot(minutes, [1.0] + [p["benchmark_tau_proxy"] for p in record["curve"]], **style)
    left.set(xlabel="training minutes (2 CPU cores)", ylabel="tau proxy (T=0, teacher-forced)",
             title="held-out training answers")
    if on_benchmark:
        right.set(xlabel="training minutes (2 CPU cores)", title="the target's answers to Table 1's prompts")
    else:
        right.set(xlabel="training minutes (2 CPU cores)", ylabel="held-out accuracy (positions 1..B-1)")
    for axis in (left, right):
        axis.grid(alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    rows = -(-len(records) // 3)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.045 * rows + 0.02, 1, 1))  # the legend (one entry per run) below the panels
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default="results")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dataset", default=default_dataset(),
                        help="the features' data set name (default: config.yaml's data.train_set)")
    parser.add_argument("--heldout", type=int, default=32)
    parser.add_argument("--ngram", action="store_true",
                        help="print n-gram tables' first-position accuracy on the same split, and exit")
    parser.add_argument("--train-sequences", type=int, default=0, help="train on the first N answers only (0: all)")
    parser.add_argument("--fit-on", type=int, help="train on the first N answers and score on the same N")
    parser.add_argument("--without-target-features", action="store_true",
                        help="zero the target's hidden states in training and scoring (the context then carries nothing)")
    parser.add_argument("--extra-features", help="a second cached feature set to mix into training")
    parser.add_argument("--extra-sequences", type=int, default=0, help="its first N answers (0: all)")
    parser.add_argument("--max-answer-tokens", type=int, default=0,
                        help="cut each training answer after its first N tokens (0: keep them whole)")
    parser.add_argument("--benchmark-answers",
                        help="an autoregressive-baseline jsonl of this run: also score on its T=0 benchmark answers")
    parser.add_argument("--name", default="dflash")
    parser.add_argument("--objective", default="dflash")
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--num-anchors", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=6e-4)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--grad-accumulation", type=int, default=2)
    parser.add_argument("--drafter-init", default="random")
    parser.add_argument("--draft-vocab-size", type=int, default=0, help="0: the whole vocabulary (the paper)")
    parser.add_argument("--feature-scaling", default="none", help="none (the paper) | rms")
    parser.add_argument("--sliding-window", type=int, default=0, help="0: full attention (the paper)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--note", help="a remark stored with the record (e.g. what else ran on the machine)")
    parser.add_argument("--work-dir", default="/tmp/dpace-learning-curve")
    parser.add_argument("--record", default=str(Path(__file__).with_name("learning_curves.jsonl")))
    parser.add_argument("--plot", help="write a figure of the curves in --record to this path, and exit")
    parser.add_argument("--plot-only", default="*", help="plot the curves whose name matches this shell pattern")
    arguments = parser.parse_args()
    if arguments.plot:
        plot(arguments.record, arguments.plot, arguments.plot_only)
    else:
        run(arguments)
