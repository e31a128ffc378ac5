from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from dpace.data import write_benchmark

count = write_benchmark(
    snakemake.wildcards.benchmark,
    snakemake.output.prompts,
    num_prompts=snakemake.params.num_prompts,
    seed=snakemake.params.seed,
    mirror=snakemake.params.mirror,
)
print(f"wrote {count} prompts")
