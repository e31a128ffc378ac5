from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from pathlib import Path  # noqa: E402 (after begin_job)

import torch  # noqa: E402

from dpace.evaluation.eval_config import EvalConfig, ReferenceSettings  # noqa: E402
from dpace.evaluation.evaluate import measure_baseline  # noqa: E402
from dpace.gpus import torch_device_slot  # noqa: E402
from dpace.locks import machine_lock, timing_lock  # noqa: E402

params = snakemake.params
torch.set_num_threads(snakemake.threads)
# One CUDA GPU when the machine has any (locked so that parallel jobs get different ones), else CPU.
# The timing lock (one per device): no other job decodes on this device while this one times its own (SR).
with torch_device_slot(snakemake.resources.get("gpu", 0)) as device, machine_lock(timing_lock(device)):
    measure_baseline(
        snakemake.input.target,
        {Path(path).stem: path for path in snakemake.input.benchmarks},
        EvalConfig.from_config(params.eval),
        records_path=params.records,
        out_path=snakemake.output.baseline,
        device=device,
        features_path=snakemake.output.features,
        reference=ReferenceSettings(**params.reference),
    )
