from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from dpace.evaluation.timing_split import write_experiment_rows  # noqa: E402

write_experiment_rows(snakemake.input.shared, snakemake.params.drafters, snakemake.output.times)
