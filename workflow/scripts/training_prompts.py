import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.data import write_training_prompts

counts = write_training_prompts(
    snakemake.params.counts,
    snakemake.output.prompts,
    seed=snakemake.params.seed,
    mirror=snakemake.params.mirror,
    max_chars=snakemake.params.max_chars,
)
print(counts)
