import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.data import write_benchmark

count = write_benchmark(
    snakemake.wildcards.benchmark,
    snakemake.output.prompts,
    num_prompts=snakemake.params.num_prompts,
    seed=snakemake.params.seed,
    mirror=snakemake.params.mirror,
)
print(f"wrote {count} prompts")
