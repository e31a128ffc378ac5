from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from pathlib import Path  # noqa: E402

import torch  # noqa: E402 (after the log redirect)

from dpace.evaluation.eval_config import EvalConfig  # noqa: E402
from dpace.evaluation.timing_run import TimingSettings, time_interleaved  # noqa: E402
from dpace.gpus import torch_device_slot  # noqa: E402
from dpace.locks import machine_lock, timing_lock  # noqa: E402

params = snakemake.params
torch.set_num_threads(snakemake.threads)
settings = TimingSettings(**params.timing)
benchmarks = {Path(path).stem: path for path in snakemake.input.benchmarks}
# The timing lock (one per device) for the whole job: no other timing job decodes on this device meanwhile.
with torch_device_slot(snakemake.resources.get("gpu", 0)) as device, machine_lock(timing_lock(device)):
    time_interleaved(snakemake.input.target, dict(params.drafters), benchmarks, EvalConfig.from_config(params.eval),
                     settings, out_path=snakemake.output.times, device=device)
