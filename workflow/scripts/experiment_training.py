import sys
from pathlib import Path

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.report.collect import remove_stale_reports, write_experiment_training

remove_stale_reports(snakemake.output)  # a failed job then leaves no table drawn from the old numbers
write_experiment_training(
    snakemake.params.variants,
    [str(Path(path).parent) for path in snakemake.input.summaries],
    steps_csv=snakemake.output.steps,
    runs_csv=snakemake.output.runs,
)
