import sys

import torch

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.generation import generate_responses

torch.set_num_threads(snakemake.threads)
counts = generate_responses(
    snakemake.input.target,
    snakemake.input.prompts,
    snakemake.output.conversations,
    backend=snakemake.params.backend,
    max_new_tokens=snakemake.params.max_new_tokens,
    max_prompt_tokens=snakemake.params.max_prompt_tokens,
    temperature=snakemake.params.temperature,
    batch_size=snakemake.params.batch_size,
    dtype=snakemake.params.dtype,
    seed=snakemake.params.seed,
    scratch_path=snakemake.params.scratch,
)
print(counts)
