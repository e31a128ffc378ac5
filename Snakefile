# dpace: reproduce D-PACE (arXiv 2605.18810) as a cacheable DAG.
#   snakemake --cores all results/table_main.tex        the paper's Table 1 on the configured target
#   snakemake --cores all all                           every configured table and figure
# Config: config.yaml (embedded CPU default); --configfile workflow/configs/paper.yaml for the paper.

import os

from snakemake.utils import min_version

min_version("9.0")


# Snakemake 9 does not hand --replace-workflow-config to the jobs a cluster executor submits: each SLURM job
# would merge config.yaml under the run's config files and compute other params than the run planned. The
# run's choice travels in the environment (sbatch --export=ALL) instead.
if workflow.config_settings.replace_workflow_config:
    os.environ["DPACE_REPLACE_WORKFLOW_CONFIG"] = "1"
elif workflow.remote_exec and os.environ.get("DPACE_REPLACE_WORKFLOW_CONFIG") == "1":
    workflow.config_settings.replace_workflow_config = True


configfile: os.path.join(workflow.basedir, "config.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/target.smk"
include: "workflow/rules/responses.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


report: "workflow/report/workflow.rst"


rule all:
    input:
        report_targets(),
    default_target: True
