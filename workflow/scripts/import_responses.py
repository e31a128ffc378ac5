from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from dpace.responses.conversations import import_conversations

counts = import_conversations(
    snakemake.params.source,
    snakemake.output.conversations,
    num_conversations=snakemake.params.num_conversations,
    seed=snakemake.params.seed,
)
print(counts)
