from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

import contextlib  # noqa: E402
from pathlib import Path  # noqa: E402

from dpace.evaluation.eval_config import EvalConfig  # noqa: E402 (after begin_job)
from dpace.gpus import gpu_slot, torch_device_slot  # noqa: E402
from dpace.locks import machine_lock, timing_lock  # noqa: E402

params = snakemake.params
config = EvalConfig.from_config(params.eval)  # the eval section with the suite's overrides (evaluate.smk)
benchmarks = {Path(path).stem: path for path in snakemake.input.benchmarks}
outputs = dict(records_path=params.records, summary_path=snakemake.output.summary, blocks_path=snakemake.output.blocks)

if config.backend == "sglang":
    from dpace.evaluation.sglang_backend import evaluate_sglang

    log = Path(snakemake.log[0])
    # The timing lock of the slot's GPU(s): no other job decodes there while this one times its own (SR).
    with gpu_slot(max(1, int(snakemake.resources.get("gpu", 1)))), machine_lock(timing_lock("cuda")):
        evaluate_sglang(snakemake.input.target, params.drafter, benchmarks, config, log_dir=log.with_suffix(".sglang"),
                        **outputs)
else:
    import torch

    from dpace.evaluation.evaluate import TargetAnswers, evaluate_drafter

    torch.set_num_threads(snakemake.threads)
    answers = TargetAnswers(baseline=snakemake.input.get("baseline"), reference=snakemake.input.get("reference"),
                            features=snakemake.input.get("features"))
    # One CUDA GPU when the machine has any (locked so that parallel jobs get different ones), else CPU.
    # The timing lock (one per device) while this job times its own SR (tau: decode): no other job decodes on this
    # device meanwhile. Replayed tau times nothing (SR is the timing jobs'), so it takes no lock.
    with torch_device_slot(snakemake.resources.get("gpu", 0)) as device, \
            (machine_lock(timing_lock(device)) if config.tau == "decode" else contextlib.nullcontext()):
        evaluate_drafter(snakemake.input.target, params.drafter, benchmarks, config, device=device, answers=answers,
                         **outputs)
