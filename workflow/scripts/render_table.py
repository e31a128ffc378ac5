import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.report import render_table

render_table(snakemake.params.table, snakemake.input.metrics, snakemake.output.table)
