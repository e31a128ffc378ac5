from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from dpace.report.render import render_artifact

name = snakemake.wildcards.get("table") or snakemake.wildcards.get("figure")
inputs = snakemake.input
render_artifact(
    name,
    metrics=list(inputs.metrics),
    comparisons=list(inputs.get("comparisons", [])),
    blocks=inputs.get("blocks"),
    train_steps=inputs.get("train_steps"),
    train_runs=inputs.get("train_runs"),
    out=snakemake.output[0],
    out_png=snakemake.output.get("png"),
)
