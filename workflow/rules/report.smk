# Stage 7: tidy metrics CSVs and the paper's tables and figures (each its own target).

# Each artifact: the experiment group it exists for, and the groups whose rows it reads
# (tables borrow the main DFlash / D-PACE rows when their own group lacks them).
ARTIFACTS = {
    "table_main": {"requires": "main", "groups": ["main"]},
    "table_cross_model": {"requires": "main", "groups": ["cross_model", "main"]},
    "table_ablation": {"requires": "ablation", "groups": ["ablation", "main"]},
    "table_smoothing": {"requires": "smoothing", "groups": ["smoothing", "main", "block_size"]},
    "table_block_size": {"requires": "block_size", "groups": ["block_size", "main"]},
    "table_target_prob": {"requires": "target_prob", "groups": ["target_prob", "main"]},
    "table_training_time": {"requires": "main", "groups": ["main"], "train": True},
    "table_correlation": {"requires": "main", "groups": ["main"], "blocks": True},
    "table_objectives_extra": {"requires": "extras", "groups": ["extras", "main"]},
    "table_normalization": {"requires": "normalization", "groups": ["normalization", "main"]},
    "fig_motivation": {"requires": "main", "groups": ["main", "cross_model"], "blocks": True},
    "fig_weight_dynamics": {"requires": "main", "groups": ["main"], "train": True},
    "fig_tau_trajectory": {"requires": "ablation", "groups": ["ablation"]},
}
TABLES = [name for name in ARTIFACTS if name.startswith("table_")]
FIGURES = [name for name in ARTIFACTS if name.startswith("fig_")]


def configured(names):
    return [name for name in names if ARTIFACTS[name]["requires"] in EXPERIMENTS]


def artifact_paths(names):
    return [f"{RESULTS}/{name}.tex" if name in TABLES else f"{RESULTS}/{name}.pdf" for name in configured(names)]


def report_targets():
    return artifact_paths(TABLES + FIGURES)


def artifact_inputs(name):
    spec = ARTIFACTS[name]
    inputs = {"metrics": [f"{RESULTS}/metrics/{g}.csv" for g in spec["groups"] if g in EXPERIMENTS]}
    if spec.get("blocks"):
        inputs["blocks"] = f"{RESULTS}/metrics/main_blocks.csv"
    if spec.get("train"):
        inputs["train_steps"] = f"{RESULTS}/metrics/main_train_steps.csv"
        inputs["train_runs"] = f"{RESULTS}/metrics/main_train_runs.csv"
    return inputs


def group_metadata(group):
    """What the metrics CSV needs to know about each evaluated drafter of a group."""
    rows = []
    for v in EXPERIMENTS[group].variants:
        target = config["targets"][v.target]
        rows.append({
            "target": v.target,
            "target_label": target.get("label", v.target),
            "variant": v.id,
            "group": group,
            "objective": v.objective,
            "depth": v.depth,
            "block_size": v.block_size,
            "hparams": dict(v.hparams),
            "normalize": v.normalize or "default",
            "epochs": v.epochs,
        })
    return rows


wildcard_constraints:
    group="|".join(EXPERIMENTS),
    table="|".join(TABLES),
    figure="|".join(FIGURES),


rule group_metrics:
    input:
        summaries=lambda wildcards: group_evaluations(wildcards.group),
    output:
        metrics=f"{RESULTS}/metrics/{{group}}.csv",
        blocks=f"{RESULTS}/metrics/{{group}}_blocks.csv",
    log:
        f"{RESULTS}/logs/report/metrics_{{group}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/metrics_{{group}}.tsv"
    params:
        variants=lambda wildcards: group_metadata(wildcards.group),
        code=stage_fingerprint("report"),
    localrule: True
    script:
        "../scripts/group_metrics.py"


rule group_training:
    input:
        summaries=lambda wildcards: [
            f"{RESULTS}/drafters/{v.target}/{v.id}/summary.json" for v in EXPERIMENTS[wildcards.group].variants
        ],
    output:
        steps=f"{RESULTS}/metrics/{{group}}_train_steps.csv",
        runs=f"{RESULTS}/metrics/{{group}}_train_runs.csv",
    log:
        f"{RESULTS}/logs/report/training_{{group}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/training_{{group}}.tsv"
    params:
        variants=lambda wildcards: group_metadata(wildcards.group),
        code=stage_fingerprint("report"),
    localrule: True
    script:
        "../scripts/group_training.py"


rule render_table:
    input:
        unpack(lambda wildcards: artifact_inputs(wildcards.table)),
    output:
        table=report(f"{RESULTS}/{{table}}.tex", caption="../report/table.rst", category="Tables"),
    log:
        f"{RESULTS}/logs/report/{{table}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/{{table}}.tsv"
    params:
        code=stage_fingerprint("report"),
    localrule: True
    script:
        "../scripts/render_artifact.py"


rule render_figure:
    input:
        unpack(lambda wildcards: artifact_inputs(wildcards.figure)),
    output:
        pdf=f"{RESULTS}/{{figure}}.pdf",
        png=report(f"{RESULTS}/{{figure}}.png", caption="../report/{figure}.rst", category="Figures"),
    log:
        f"{RESULTS}/logs/report/{{figure}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/{{figure}}.tsv"
    params:
        code=stage_fingerprint("report"),
    localrule: True
    script:
        "../scripts/render_artifact.py"


rule ablations:
    input:
        artifact_paths(["table_ablation", "fig_tau_trajectory"]),
    localrule: True


rule sweeps:
    input:
        artifact_paths(["table_smoothing", "table_block_size"]),
    localrule: True


rule figures:
    input:
        artifact_paths(FIGURES),
    localrule: True
