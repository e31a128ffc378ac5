from dpace.jobs import begin_job

begin_job(snakemake)  # fds 1 and 2 to the log; the outputs' lock, held until the job exits (dpace.jobs)

from pathlib import Path

from dpace.targets import prepare_target

prepare_target(snakemake.params.spec, Path(snakemake.output.target).parent, seed=snakemake.params.seed)
