import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

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
