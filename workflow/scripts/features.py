from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from dataclasses import fields

import torch

from dpace.features import FeatureSettings, compute_features
from dpace.gpus import torch_device_slot

torch.set_num_threads(snakemake.threads)
# The target runs on one CUDA GPU when the machine has any (locked), else on the CPU.
with torch_device_slot(snakemake.resources.get("gpu", 0)) as device:
    index = compute_features(
        snakemake.input.target,
        snakemake.input.conversations,
        snakemake.output.features,
        # the rule's params are named as the schema's features keys, as FeatureSettings' fields are
        FeatureSettings(**{field.name: getattr(snakemake.params, field.name) for field in fields(FeatureSettings)}),
        device=device,
    )
print({key: value for key, value in index.items() if key != "shards"})
print(
    f"truncated {index['truncated']} of {index['num_sequences']} kept sequences to max_seq_length="
    f"{snakemake.params.max_seq_length}; dropped {index['skipped_too_few_loss_tokens']} with fewer than 2 response tokens left"
)
