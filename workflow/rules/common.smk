# Shared helpers: the variant registry (dpace.config) and paths. Imported by every stage file.
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)

from dpace.config import ConfigError, all_variants, experiments, validate_config
from dpace.fingerprint import stage_fingerprint

try:
    validate_config(config)
    EXPERIMENTS = experiments(config)
    VARIANTS = all_variants(config)
except ConfigError as error:
    raise WorkflowError(f"invalid configuration: {error}") from None

RESULTS = "results"
# Heavy jobs take every core unless the config says otherwise, so two timing jobs never share the
# CPU (and skew each other's speedup); the smoke config uses 1 to run jobs side by side.
JOB_THREADS = config.get("job_threads") or workflow.cores
SCRATCH = f"{RESULTS}/scratch"


def variant(wildcards):
    return VARIANTS[(wildcards.target, wildcards.variant)]


def final_epoch(target, variant_id):
    return VARIANTS[(target, variant_id)].epochs


def eval_summary(target, variant_id, epoch, suite):
    return f"{RESULTS}/eval/{target}/{variant_id}/epoch-{epoch}/{suite}/summary.json"


def group_evaluations(group):
    """Evaluation summaries a group's tables need: the full suite at the final epoch, and for the
    ablation trajectory MATH-500 at T=0 after every earlier epoch."""
    paths = []
    experiment = EXPERIMENTS[group]
    for v in experiment.variants:
        paths.append(eval_summary(v.target, v.id, v.epochs, "full"))
        if experiment.every_epoch:
            paths += [eval_summary(v.target, v.id, e, "trajectory") for e in range(1, v.epochs)]
    return paths

