"""Time of one optimizer step of the real training loop, with and without the context no block sees.

A sliding-window drafter (``train.sliding_window`` > 0) trains on each sequence without its leading
positions that no block attends to (``FeatureSet.without_unseen_context``; the loss and gradients are
those of the whole sequence, ``tests/test_online_model.py``). This runs ``dpace.training.loop.train_drafter``
for one epoch on the first ``--sequences`` answers of a finished run's cached features, once as it
trains and once with the whole sequences (the loop before commit 0940ae1), alternating ``--repeats``
times, and prints the mean step time of each (``summary.json``'s ``time_per_step_s``).

    python benchmarks/bench_training_step.py --run-dir <run>   # a run of config.yaml, e.g. after Table 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from pathlib import Path
from unittest import mock

from dpace.features import FeatureSet, load_features
from dpace.training.loop import TrainConfig, train_drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default=".", help="folder holding the finished run's results/")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dataset", default="sharegpt+codealpaca")
    parser.add_argument("--sequences", type=int, default=240, help="answers trained on (micro-batch 2 x 2: N/4 steps)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sliding-window", type=int, default=16)
    parser.add_argument("--num-anchors", type=int, default=32)
    parser.add_argument("--draft-vocab-size", type=int, default=4096)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    results = Path(args.run_dir) / "results"
    features = load_features(results / "features" / args.target / args.dataset).select(range(args.sequences))
    config = TrainConfig.from_config(
        {}, objective="dflash", objective_hparams={"gamma": 4.0}, depth=1, block_size=8, num_anchors=args.num_anchors,
        epochs=1, micro_batch_size=2, grad_accumulation=2, seed=0,
        precision=args.precision, draft_vocab_size=args.draft_vocab_size, sliding_window=args.sliding_window,
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


if __name__ == "__main__":
    main()
