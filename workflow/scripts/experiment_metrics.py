import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.report.collect import write_experiment_metrics

write_experiment_metrics(
    snakemake.params.variants,
    snakemake.input.summaries,
    metrics_csv=snakemake.output.metrics,
    blocks_csv=snakemake.output.blocks,
    comparisons_csv=snakemake.output.get("comparisons"),
)
