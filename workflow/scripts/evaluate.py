import sys
from pathlib import Path

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.gpus import gpu_slot, torch_device_slot  # noqa: E402 (after the log redirect)
from dpace.locks import machine_lock  # noqa: E402

params = snakemake.params
benchmarks = {Path(path).stem: path for path in snakemake.input.benchmarks}
common = dict(
    temperatures=params.temperatures,
    verification=params.verification,
    max_new_tokens=params.max_new_tokens,
    sampled_prompts=params.sampled_prompts,
    seed=params.seed,
    records_path=params.records,
    summary_path=snakemake.output.summary,
    blocks_path=snakemake.output.blocks,
)

if params.backend == "sglang":
    from dpace.evaluation.sglang_backend import evaluate_sglang

    log = Path(snakemake.log[0])
    # The timing lock: no other invocation's decoding runs while this one times its own (SR).
    with gpu_slot(max(1, int(snakemake.resources.get("gpu", 1)))), machine_lock("timing"):
        evaluate_sglang(snakemake.input.target, params.drafter, benchmarks, log_dir=log.with_suffix(".sglang"), **common)
elif params.backend == "local":
    import torch

    from dpace.evaluation.evaluate import evaluate_drafter

    torch.set_num_threads(snakemake.threads)
    # One CUDA GPU when the machine has any (locked so that parallel jobs get different ones), else CPU.
    # The timing lock: no other invocation's decoding runs while this one times its own (SR).
    with torch_device_slot(snakemake.resources.get("gpu", 0)) as device, machine_lock("timing"):
        evaluate_drafter(snakemake.input.target, params.drafter, benchmarks, device=device,
                         dtype=params.dtype, decode_clock=params.decode_clock, tau_counts=params.tau_counts,
                         tie_margin=params.greedy_tie_margin, baseline_path=snakemake.input.get("baseline"),
                         tau=params.tau, reference_path=snakemake.input.get("reference"),
                         features_path=snakemake.input.get("features"), decoded_prompts=params.decoded_prompts,
                         sampled_decoded_prompts=params.sampled_decoded_prompts, **common)
else:
    from dpace.schema import schema_enum

    raise ValueError(f"eval.backend={params.backend!r}; valid: {', '.join(schema_enum('eval', 'backend'))}")
