from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from dpace.data import write_training_prompts

counts = write_training_prompts(
    snakemake.params.counts,
    snakemake.output.prompts,
    seed=snakemake.params.seed,
    mirror=snakemake.params.mirror,
    max_chars=snakemake.params.max_chars,
)
print(counts)
