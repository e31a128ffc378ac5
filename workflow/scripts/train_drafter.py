from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from pathlib import Path

from dpace.gpus import gpu_slot, torch_device_slot  # noqa: E402 (after begin_job)

params = snakemake.params
out_dir = Path(snakemake.output.summary).parent
gpus = int(snakemake.resources.get("gpu", 0))
mask_token_id = None if params.mask_token_id is None else int(params.mask_token_id)

if params.backend == "specforge":
    from dpace.training.specforge_backend import train_with_specforge

    with gpu_slot(gpus) as ids:
        summary = train_with_specforge(
            {**params.train, **params.settings, "seed": params.seed},  # precision, attention_backend among them
            target_json=snakemake.input.target,
            features_dir=snakemake.input.features,
            out_dir=out_dir,
            scratch_dir=params.scratch,
            gpus=ids,
            mask_token=params.train["mask_token"],
            mask_token_id=mask_token_id,
            max_length=params.max_seq_length,
        )
elif params.backend == "local":
    from dpace.training.loop import TrainConfig, train_drafter

    # One CUDA GPU when the machine has any (locked so that parallel jobs get different ones), else CPU.
    with torch_device_slot(gpus) as device:
        config = TrainConfig.from_config(
            params.train,
            **params.settings,
            seed=params.seed,
            mask_token_id=mask_token_id,
            threads=snakemake.threads,
            device=device,
        )
        summary = train_drafter(
            config,
            target_json=snakemake.input.target,
            features_dir=snakemake.input.features,
            out_dir=out_dir,
            scratch_dir=params.scratch,
        )
else:
    from dpace.schema import schema_enum

    raise ValueError(f"train.backend={params.backend!r}; valid: {', '.join(schema_enum('train', 'backend'))}")
print(summary)
