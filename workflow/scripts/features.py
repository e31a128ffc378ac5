import sys

import torch

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.features import compute_features
from dpace.gpus import gpu_slot, machine_gpu_ids

torch.set_num_threads(snakemake.threads)
# The target runs on one CUDA GPU when the machine has any (locked), else on the CPU (issue 43: it ran on
# the CPU of a GPU machine before).
with gpu_slot(1 if int(snakemake.resources.get("gpu", 0)) and machine_gpu_ids() else 0) as ids:
    index = compute_features(
        snakemake.input.target,
        snakemake.input.conversations,
        snakemake.output.features,
        layer_ids=snakemake.params.target_layer_ids,
        num_target_features=snakemake.params.num_target_features,
        max_seq_length=snakemake.params.max_seq_length,
        mode=snakemake.params.mode,
        batch_size=snakemake.params.batch_size,
        dtype=snakemake.params.dtype,
        device="cuda" if ids and torch.cuda.is_available() else "cpu",
    )
print({key: value for key, value in index.items() if key != "shards"})
print(
    f"truncated {index['truncated']} of {index['num_sequences']} kept sequences to max_seq_length="
    f"{snakemake.params.max_seq_length}; dropped {index['skipped_too_few_loss_tokens']} with fewer than 2 response tokens left"
)
