from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from dataclasses import fields

import torch

from dpace.gpus import torch_device_slot
from dpace.responses.generation import ResponseSettings, generate_responses

torch.set_num_threads(snakemake.threads)
# transformers: one CUDA GPU when the machine has any (locked so that parallel jobs get different ones),
# else the CPU. SGLang's engine takes its own lock inside dpace.responses.generation (a second lock here
# would wait for the first forever on one GPU).
local = snakemake.params.backend != "sglang"
with torch_device_slot(snakemake.resources.get("gpu", 0) if local else 0) as device:
    counts = generate_responses(
        snakemake.input.target,
        snakemake.input.prompts,
        snakemake.output.conversations,
        # the rule's params are named as the schema's responses keys (and seed), as ResponseSettings' fields are
        ResponseSettings(**{field.name: getattr(snakemake.params, field.name) for field in fields(ResponseSettings)}),
        scratch_path=snakemake.params.scratch,
        device=device,
    )
print(counts)
