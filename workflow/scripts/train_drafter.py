import sys
from pathlib import Path

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.training import TrainConfig, train_drafter

params = snakemake.params
if params.backend != "local":
    raise NotImplementedError(f"train.backend={params.backend!r} is not available in this workflow yet; use 'local'")
config = TrainConfig(
    **params.settings,
    mask_token=params.mask_token,
    num_anchors=params.num_anchors,
    learning_rate=params.learning_rate,
    warmup_ratio=params.warmup_ratio,
    max_grad_norm=params.max_grad_norm,
    micro_batch_size=params.micro_batch_size,
    grad_accumulation=params.grad_accumulation,
    weight_decay=params.weight_decay,
    objective_chunk_blocks=params.objective_chunk_blocks,
    save_every_steps=params.save_every_steps,
    seed=params.seed,
    threads=snakemake.threads,
)
summary = train_drafter(
    config,
    target_json=snakemake.input.target,
    features_dir=snakemake.input.features,
    out_dir=Path(snakemake.output.summary).parent,
    scratch_dir=params.scratch,
)
print(summary)
