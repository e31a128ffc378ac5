"""The SR timing job in two precisions, on a finished run's drafters: its wall time and the SR it measures.

Runs ``dpace.evaluation.timing_run.time_interleaved`` (the ``speedup_timing`` job's code) once per precision of
``--dtypes``, in turn, ``--rounds`` times, over a finished run's target and drafters, with config.yaml's ``eval`` and
``timing`` settings unless overridden. Prints per run: the wall time, the time per decoder, each decoder's mean
time per output token and each drafter's SR (the mean over benchmarks of the pooled per-benchmark SR, at T = 0).
Run it alone on the machine (the SR of a loaded machine means little):

    PYTHONPATH=. python benchmarks/timing_precision.py --run-dir /work/wt/t1 --drafters dflash-gamma4-d2-b8-e6 \\
        dpace-alpha0.5-d2-b8-e6 --prompts 1 --repeats 1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from dpace.evaluation.eval_config import EvalConfig
from dpace.evaluation.timing_run import TimingSettings, time_interleaved
from dpace.report.timing import AUTOREGRESSIVE, interleaved_speedups

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a checkout whose results/ holds the drafters")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafters", nargs="+", required=True, help="variant ids under results/drafters/<target>/")
    parser.add_argument("--epoch", type=int, default=None, help="default: the drafter's last")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=1, help="the precisions in turn, this many times")
    parser.add_argument("--prompts", type=int, default=None, help="timing.prompts_per_benchmark")
    parser.add_argument("--sampled-prompts", type=int, default=None, help="timing.sampled_prompts_per_benchmark")
    parser.add_argument("--repeats", type=int, default=None, help="timing.repeats")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=None, help="keep each run's timing CSV here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    results = args.run_dir / "results"
    drafters = {}
    for name in args.drafters:
        folder = results / "drafters" / args.target / name
        epoch = args.epoch or max(int(p.name.split("-")[1]) for p in folder.glob("epoch-*"))
        drafters[name] = folder / f"epoch-{epoch}"
    benchmarks = {p.stem: p for p in sorted((results / "data" / "benchmarks").glob("*.jsonl"))}
    eval_config = EvalConfig.from_config(config["eval"], seed=config["seed"])
    timing = {k: v for k, v in config["timing"].items() if k in ("prompts_per_benchmark", "sampled_prompts_per_benchmark",
                                                                 "repeats")}
    for key, value in (("prompts_per_benchmark", args.prompts), ("sampled_prompts_per_benchmark", args.sampled_prompts),
                       ("repeats", args.repeats)):
        if value is not None:
            timing[key] = value
    rows = []
    for round_number in range(args.rounds):
        for dtype in args.dtypes:
            started = time.perf_counter()
            times = time_interleaved(results / "targets" / args.target / "target.json", drafters, benchmarks,
                                     eval_config, TimingSettings(**timing, dtype=dtype), log=lambda _: None)
            wall = time.perf_counter() - started
            if args.out_dir:
                args.out_dir.mkdir(parents=True, exist_ok=True)
                times.to_csv(args.out_dir / f"timing-{dtype}-{round_number}.csv", index=False)
            greedy = times[times["temperature"] == 0.0]
            speedups = pd.DataFrame(interleaved_speedups(greedy)).groupby("variant")["speedup"].mean()
            tpot = times.groupby("drafter")["time_per_output_token_s"].mean() * 1e3
            rows.append({"round": round_number, "dtype": dtype, "wall_s": round(wall, 1),
                         "s_per_decoder": round(wall / (len(drafters) + 1), 1),
                         f"{AUTOREGRESSIVE}_ms": round(tpot[AUTOREGRESSIVE], 1),
                         **{f"{d}_ms": round(tpot[d], 1) for d in drafters},
                         **{f"{d}_SR": round(speedups[d], 3) for d in drafters}})
            print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
