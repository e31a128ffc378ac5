from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from dpace.gpus import torch_device_slot  # noqa: E402 (after the log redirect)
from dpace.io import atomic_write_text  # noqa: E402
from dpace.locks import machine_lock, timing_lock  # noqa: E402
from dpace.step_timing import interleaved_steps  # noqa: E402
from dpace.training.train_config import TrainConfig  # noqa: E402

params = snakemake.params
mask_token_id = None if params.mask_token_id is None else int(params.mask_token_id)
# The timing lock (one per device) for the whole job: no other timing job runs on this device meanwhile.
with torch_device_slot(snakemake.resources.get("gpu", 0)) as device, machine_lock(timing_lock(device)):
    configs = {name: TrainConfig.from_config(params.train, **settings, seed=params.seed, mask_token_id=mask_token_id,
                                             threads=snakemake.threads, device=device)
               for name, settings in params.settings.items()}
    times = interleaved_steps(configs, target_json=snakemake.input.target, features_dir=snakemake.input.features,
                              steps=params.timing["steps"], repeats=params.timing["repeats"],
                              warmup=params.timing["warmup_steps"])
atomic_write_text(snakemake.output.times, times.to_csv(index=False))
