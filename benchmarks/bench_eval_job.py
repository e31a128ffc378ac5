"""One evaluation job of the embedded default, timed: replayed tau over Table 1's plan plus the decoded prompts.

The embedded SmolLM2-135M target, a randomly initialised drafter of config.yaml's shape (it accepts nothing, so a
decoded request takes the most steps: an upper bound on the decoded part), config.yaml's six benchmarks and
prompt counts. The target's reference answers and features (the ``autoregressive_baseline`` job) are made once and
cached; then ``evaluate_drafter`` runs with the ``eval`` settings of config.yaml, or the ones given, and its wall
time is printed. Run it with two checkouts' PYTHONPATH to compare their evaluation jobs on the same inputs:

    PYTHONPATH=. python benchmarks/bench_eval_job.py --threads 2 [--decoded 2]
    PYTHONPATH=. python benchmarks/bench_eval_job.py --threads 1 --decoded 0 --drafter <run>/results/drafters/<target>/<variant>/epoch-6
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import yaml

from dpace.data import benchmark_prompts
from dpace.evaluation.eval_config import EvalConfig, ReferenceSettings
from dpace.evaluation.evaluate import TargetAnswers, evaluate_drafter, measure_baseline
from dpace.features import default_target_layer_ids
from dpace.io import atomic_write_jsonl
from dpace.targets import load_target, prepare_target
from dpace.training.drafter import build_drafter, drafter_config, save_drafter

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decoded", type=int, default=None, help="eval.decoded_prompts_per_benchmark")
    parser.add_argument("--timed-prompts", type=int, default=2, help="reference answers decoded batch-1")
    parser.add_argument("--benchmarks", nargs="+", default=None, help="default: config.yaml's")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per benchmark (default: config.yaml's)")
    parser.add_argument("--cache-dir", default="/tmp/dpace-bench-eval-job")
    parser.add_argument("--drafter", type=Path, help="a trained checkpoint (a run's drafters/<target>/<variant>/epoch-N)"
                        " instead of the random one")
    parser.add_argument("--mirror", default=str(REPO.parent / "shared" / "data"))
    args = parser.parse_args()
    if args.drafter and not (args.drafter / "config.json").exists():
        parser.error(f"--drafter {args.drafter}: no checkpoint there (config.json)")
    torch.set_num_threads(args.threads)
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    cache = Path(args.cache_dir)
    if not (cache / "target" / "target.json").exists():
        prepare_target({"source": "embedded"}, cache / "target")
    target_json = cache / "target" / "target.json"
    files = {}
    prompts = args.prompts or config["data"]["prompts_per_benchmark"]
    for name in args.benchmarks or config["data"]["benchmarks"]:
        files[name] = cache / "benchmarks" / f"{name}.jsonl"
        if not files[name].exists():
            atomic_write_jsonl(files[name], benchmark_prompts(name, prompts, config["seed"], mirror=args.mirror))
    train, section = config["train"], config["eval"]
    drafter_dir = args.drafter or cache / "drafter"
    if not drafter_dir.exists():
        target, _ = load_target(target_json)
        layer_ids = default_target_layer_ids(target.config.num_hidden_layers, config["features"]["num_target_features"])
        save_drafter(build_drafter(drafter_config(
            target.config, depth=train["depth"], block_size=train["block_size"], target_layer_ids=layer_ids,
            mask_token_id=0, draft_vocab=list(range(train["draft_vocab_size"])), sliding_window=train["sliding_window"])),
            drafter_dir)
    keys = ("max_new_tokens", "sampled_prompts_per_benchmark", "temperatures", "dtype")
    section = {**section, "sampled_prompts_per_benchmark": min(section["sampled_prompts_per_benchmark"], prompts)}
    base = EvalConfig.from_config({k: section[k] for k in keys if k in section}, seed=config["seed"])
    if not (cache / "baseline.jsonl").exists():
        started = time.perf_counter()
        measure_baseline(target_json, files, base, records_path=cache / "baseline.records.jsonl",
                         out_path=cache / "baseline.jsonl", features_path=cache / "features.pt",
                         reference=ReferenceSettings(overrun=train["block_size"] - 1, timed_prompts=args.timed_prompts,
                                                     batch_size=config["responses"]["batch_size"],
                                                     num_target_features=config["features"]["num_target_features"],
                                                     feature_window=train["sliding_window"]))
        print(f"baseline job (once per target): {time.perf_counter() - started:.1f} s")
    overrides = {} if args.decoded is None else {"decoded_prompts_per_benchmark": args.decoded}
    eval_config = EvalConfig.from_config({**section, **overrides}, seed=config["seed"], tau="replay")
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        summary = evaluate_drafter(target_json, drafter_dir, files, eval_config, records_path=Path(out) / "r.jsonl",
                                   summary_path=Path(out) / "summary.json", blocks_path=Path(out) / "blocks.csv",
                                   answers=TargetAnswers(reference=cache / "baseline.jsonl",
                                                         features=cache / "features.pt"))
        elapsed = time.perf_counter() - started
    decoded = sum((row.get("replay_check") or {}).get("requests_compared", 0) for row in summary)
    timed = sum(row.get("num_timed_requests") or 0 for row in summary)
    taus = {f"{row['benchmark']} T{row['temperature']:g}": round(row["tau"], 6) for row in summary}
    print(f"evaluation job: {elapsed:.1f} s; {sum(row['num_requests'] for row in summary)} requests replayed, "
          f"{decoded} decoded, {timed} timed against the target; tau {taus}")


if __name__ == "__main__":
    main()
