from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from pathlib import Path

from dpace.report.collect import remove_stale_reports, write_experiment_training

remove_stale_reports(snakemake.output)  # a failed job then leaves no table drawn from the old numbers
write_experiment_training(
    snakemake.params.variants,
    [str(Path(path).parent) for path in snakemake.input.summaries],
    steps_csv=snakemake.output.steps,
    runs_csv=snakemake.output.runs,
)
