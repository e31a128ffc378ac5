from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from dpace.report.collect import remove_stale_reports, write_experiment_metrics

remove_stale_reports(snakemake.output)  # a failed job then leaves no table drawn from the old numbers
write_experiment_metrics(
    snakemake.params.variants,
    snakemake.input.summaries,
    metrics_csv=snakemake.output.metrics,
    blocks_csv=snakemake.output.blocks,
    comparisons_csv=snakemake.output.get("comparisons"),
    timing_paths=snakemake.input.get("timing", []),
    max_repeat_spread=snakemake.params.get("max_repeat_spread"),
)
