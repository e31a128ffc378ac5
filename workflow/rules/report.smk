# Stage 7: tidy metrics CSVs and the paper's tables and figures.


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


rule table_main:
    input:
        metrics=[f"{RESULTS}/metrics/main.csv"],
    output:
        table=f"{RESULTS}/table_main.tex",
    log:
        f"{RESULTS}/logs/report/table_main.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/table_main.tsv"
    params:
        table="table_main",
        code=stage_fingerprint("report"),
    localrule: True
    script:
        "../scripts/render_table.py"
