import sys
from pathlib import Path

import torch

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.evaluation import evaluate_drafter

params = snakemake.params
if params.backend != "local":
    raise NotImplementedError(f"eval.backend={params.backend!r} is not available in this workflow yet; use 'local'")
torch.set_num_threads(snakemake.threads)
evaluate_drafter(
    snakemake.input.target,
    params.drafter,
    {Path(path).stem: path for path in snakemake.input.benchmarks},
    temperatures=params.temperatures,
    verification=params.verification,
    max_new_tokens=params.max_new_tokens,
    seed=params.seed,
    records_path=params.records,
    summary_path=snakemake.output.summary,
    blocks_path=snakemake.output.blocks,
)
