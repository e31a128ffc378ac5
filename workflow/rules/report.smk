# Stage 7: tidy metrics CSVs and the paper's tables and figures (each its own target).

wildcard_constraints:
    experiment="|".join(EXPERIMENTS),
    table="|".join(TABLES),
    figure="|".join(FIGURES),


rule experiment_metrics:
    input:
        summaries=lambda wildcards: experiment_evaluations(wildcards.experiment),
        blocks=lambda wildcards: beside(experiment_evaluations(wildcards.experiment), EVAL_BLOCKS_FILE),
        # SR: the timing jobs' files where a claim reads the experiment's SR, else none (no SR measured)
        timing=lambda wildcards: timing_files(wildcards.experiment),
    output:
        metrics=f"{RESULTS}/metrics/{{experiment}}.csv",
        blocks=f"{RESULTS}/metrics/{{experiment}}_blocks.csv",
        comparisons=f"{RESULTS}/metrics/{{experiment}}_comparisons.csv",
    log:
        f"{RESULTS}/logs/report/metrics_{{experiment}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/metrics_{{experiment}}.tsv"
    params:
        variants=lambda wildcards: experiment_metadata(wildcards.experiment),
        max_repeat_spread=config["timing"]["max_repeat_spread"],  # dpace.report.timing.timing_stability
        code=script_fingerprint("experiment_metrics.py"),
    localrule: True
    script:
        "../scripts/experiment_metrics.py"


rule local_blocks:
    """With eval.backend sglang: per-block records of Table 1's shallowest DFlash drafter (the one
    table_correlation and fig_motivation (a) show) from an in-process run of the blocks suite
    (dpace.experiments.BLOCKS)."""
    input:
        summaries=lambda wildcards: local_blocks_summaries(),
        blocks=lambda wildcards: beside(local_blocks_summaries(), EVAL_BLOCKS_FILE),
    output:
        metrics=f"{RESULTS}/metrics/main_local.csv",
        blocks=f"{RESULTS}/metrics/main_local_blocks.csv",
    log:
        f"{RESULTS}/logs/report/metrics_main_local.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/metrics_main_local.tsv"
    params:
        variants=experiment_metadata("main"),
        code=script_fingerprint("experiment_metrics.py"),
    localrule: True
    script:
        "../scripts/experiment_metrics.py"


rule experiment_training:
    input:
        summaries=lambda wildcards: [drafter_summary(v) for v in EXPERIMENTS[wildcards.experiment].variants],
        steps=lambda wildcards: beside(
            [drafter_summary(v) for v in EXPERIMENTS[wildcards.experiment].variants], STEPS_FILE
        ),
    output:
        steps=f"{RESULTS}/metrics/{{experiment}}_train_steps.csv",
        runs=f"{RESULTS}/metrics/{{experiment}}_train_runs.csv",
    log:
        f"{RESULTS}/logs/report/training_{{experiment}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/training_{{experiment}}.tsv"
    params:
        variants=lambda wildcards: experiment_metadata(wildcards.experiment),
        code=script_fingerprint("experiment_training.py"),
    localrule: True
    script:
        "../scripts/experiment_training.py"


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
        code=script_fingerprint("render_artifact.py"),
    localrule: True
    script:
        "../scripts/render_artifact.py"


rule render_figure:
    input:
        unpack(lambda wildcards: artifact_inputs(wildcards.figure)),
    output:
        pdf=f"{RESULTS}/{{figure}}.pdf",
        png=report(f"{RESULTS}/{{figure}}.png", caption="../report/figure.rst", category="Figures"),
    log:
        f"{RESULTS}/logs/report/{{figure}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/{{figure}}.tsv"
    params:
        code=script_fingerprint("render_artifact.py"),
    localrule: True
    script:
        "../scripts/render_artifact.py"


rule findings:
    """The scorecard (dpace.report.findings): the claims of workflow/claims.yaml against what this results/ holds.

    It needs only Table 1's metrics (and the training CSVs of Table 1's drafters, which cost seconds), so
    `snakemake results/findings.md` never starts another experiment. Every other metrics file it reads is
    an input when it already exists, or when the run is `all` (``built_metrics``): built experiments are
    kept up to date and their changes rebuild the scorecard, and the claims of experiments never built
    are "not run"."""
    input:
        claims=CLAIMS,
        main=f"{RESULTS}/metrics/main_comparisons.csv",
        train_steps=f"{RESULTS}/metrics/main_train_steps.csv",
        step_timing=lambda wildcards: step_timing_file(),  # Table 7 (dpace.step_timing)
        others=built_metrics,
    output:
        findings=report(f"{RESULTS}/findings.md", caption="../report/findings.rst", category="Scorecard"),
    log:
        f"{RESULTS}/logs/report/findings.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/findings.tsv"
    params:
        results=lambda wildcards, output: os.path.dirname(output.findings),  # results/
        # The configured experiments: the claims of others are "not run", never read from an earlier run's files.
        experiments=sorted(EXPERIMENTS),
        code=script_fingerprint("findings.py"),
    # The run's name, for the page only: a resource, not a param, so that the same results under another
    # config file's name (or a new commit, which the script reads itself) do not rebuild the scorecard.
    resources:
        config_name=config_name(),
    localrule: True
    script:
        "../scripts/findings.py"


rule ablations:
    input:
        artifact_paths(["table_ablation", "fig_tau_trajectory"]),
    localrule: True


rule sweeps:
    input:
        artifact_paths(["table_block_size", "table_smoothing"]),
    localrule: True


rule figures:
    input:
        artifact_paths(FIGURES),
    localrule: True
