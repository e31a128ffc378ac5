import sys
from pathlib import Path

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from dpace.targets import prepare_target

prepare_target(snakemake.params.spec, Path(snakemake.output.target).parent, seed=snakemake.params.seed)
