import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from pathlib import Path  # noqa: E402 (after the log redirect)

import torch  # noqa: E402

from dpace.evaluation.evaluate import measure_baseline  # noqa: E402
from dpace.gpus import torch_device_slot  # noqa: E402
from dpace.locks import machine_lock  # noqa: E402

params = snakemake.params
torch.set_num_threads(snakemake.threads)
# One CUDA GPU when the machine has any (locked so that parallel jobs get different ones), else CPU.
# The timing lock: no other invocation's decoding runs while this one times its own (SR).
with torch_device_slot(snakemake.resources.get("gpu", 0)) as device, machine_lock("timing"):
    measure_baseline(
        snakemake.input.target,
        {Path(path).stem: path for path in snakemake.input.benchmarks},
        temperatures=params.temperatures,
        max_new_tokens=params.max_new_tokens,
        seed=params.seed,
        sampled_prompts=params.sampled_prompts,
        records_path=params.records,
        out_path=snakemake.output.baseline,
        device=device,
        dtype=params.dtype,
        overrun=params.overrun,
        features_path=snakemake.output.features,
        feature_layer_ids=params.target_layer_ids,
        num_target_features=params.num_target_features,
        feature_window=params.feature_window,
        timed_prompts=params.timed_prompts,
        batch_size=params.batch_size,
        share_features=params.share_features,
    )
