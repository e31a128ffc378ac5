# Stage 6: speculative decoding on the benchmarks; tau, speedup and per-block records.
# Timing jobs take every core so that two of them never share the CPU and skew each other's SR.

from dpace.evaluation.eval_config import BASELINE_SETTINGS

rule autoregressive_baseline:
    input:
        target=f"{RESULTS}/targets/{{target}}/target.json",
        benchmarks=expand(f"{RESULTS}/data/benchmarks/{{benchmark}}.jsonl", benchmark=BASELINE_BENCHMARKS),
    output:
        # the target's answers (greedy at T=0, keyed samples at T>0), their times, and the context
        # features replayed tau reads: computed once per target for every drafter's evaluation
        baseline=f"{RESULTS}/{BASELINE}",
        features=f"{RESULTS}/{REFERENCE_FEATURES}",
    log:
        f"{RESULTS}/logs/eval/{{target}}/autoregressive-baseline.log",
    benchmark:
        f"{RESULTS}/benchmarks/eval/{{target}}/autoregressive-baseline.tsv"
    params:
        # dpace.evaluation.eval_config.EvalConfig: the eval settings the target's answers depend on
        eval={
            **{key: config["eval"][key] for key in BASELINE_SETTINGS},
            "temperatures": BASELINE_TEMPERATURES,
            "seed": config["seed"],
        },
        # ReferenceSettings; replayed tau: batch-1 (timed) answers for the prompts evaluations decode,
        # batched ones for the rest
        reference={
            "overrun": REPLAY_OVERRUN,
            "timed_prompts": BASELINE_TIMED_PROMPTS,
            "batch_size": config["responses"]["batch_size"],
            "num_target_features": config["features"]["num_target_features"],
            "feature_layer_ids": config["features"]["target_layer_ids"],
            "feature_window": config["train"]["sliding_window"],
        },
        records=f"{SCRATCH}/eval/{{target}}/autoregressive-baseline.records.jsonl",
        code=script_fingerprint("autoregressive_baseline.py"),
    threads: job_threads("autoregressive_baseline")
    resources:
        **stage_resources("autoregressive_baseline"),  # a GPU with eval.backend sglang or `device: cuda`
    script:
        "../scripts/autoregressive_baseline.py"


rule evaluate:
    input:
        unpack(shared_baseline),
        unpack(reference_answers),
        train_summary=f"{RESULTS}/{DRAFTER_SUMMARY}",
        target=f"{RESULTS}/targets/{{target}}/target.json",
        benchmarks=lambda wildcards: expand(
            f"{RESULTS}/data/benchmarks/{{benchmark}}.jsonl", benchmark=SUITES[wildcards.suite]["benchmarks"]
        ),
    output:
        summary=f"{RESULTS}/{EVAL_SUMMARY}",  # dpace.experiments: the metrics parse it back
        blocks=f"{RESULTS}/{EVAL_BLOCKS}",
    log:
        f"{RESULTS}/logs/eval/{{target}}/{{variant}}/epoch-{{epoch}}-{{suite}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/eval/{{target}}/{{variant}}/epoch-{{epoch}}-{{suite}}.tsv"
    wildcard_constraints:
        epoch=r"\d+",
        suite="|".join(SUITES),
    params:
        drafter=lambda wildcards: f"{RESULTS}/{DRAFTER_DIR}/{EPOCH_DIR}".format(
            target=wildcards.target, variant=wildcards.variant, epoch=wildcards.epoch
        ),
        # dpace.evaluation.eval_config.EvalConfig: the eval section, the suite's temperatures and backend,
        # the seed, and tau as the suite can have it (replay only where the shared reference answers cover it)
        eval=lambda wildcards: {
            **config["eval"],
            "temperatures": SUITES[wildcards.suite]["temperatures"],
            "backend": eval_backend(wildcards),
            "seed": config["seed"],
            "tau": "replay" if replay_covered(wildcards) else "decode",
            "decoded_prompts_per_benchmark": decoded_prompts(wildcards),
        },
        records=f"{SCRATCH}/eval/{{target}}/{{variant}}/epoch-{{epoch}}-{{suite}}.records.jsonl",
        code=script_fingerprint("evaluate.py"),
    threads: job_threads("evaluate")
    resources:
        **stage_resources("evaluate"),  # one GPU with eval.backend sglang or `device: cuda`; CPU otherwise
    script:
        "../scripts/evaluate.py"


rule speedup_timing:
    """SR of one experiment's drafters on one target: the target alone and every drafter, interleaved prompt
    by prompt, repeated (dpace.evaluation.timing_run; config section timing). Only for experiments a claim
    reads SR of (dpace.experiments.ExperimentSpec.times_speedup); with timing.jobs per-target, one job
    ({experiment} = SHARED_TIMING) for all of them, which experiment_timing splits."""
    input:
        summaries=lambda wildcards: [drafter_summary(v) for v, _ in timing_variants(wildcards.experiment,
                                                                                     wildcards.target)],
        target=f"{RESULTS}/targets/{{target}}/target.json",
        benchmarks=expand(f"{RESULTS}/data/benchmarks/{{benchmark}}.jsonl", benchmark=BASELINE_BENCHMARKS),
    output:
        times=f"{RESULTS}/{TIMING}",
    log:
        f"{RESULTS}/logs/eval/{{target}}/timing-{{experiment}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/eval/{{target}}/timing-{{experiment}}.tsv"
    wildcard_constraints:
        experiment=SHARED_TIMING if timing_per_target() else (
            "|".join(name for name in EXPERIMENTS if EXPERIMENT_SPECS[name].times_speedup) or "^$"),
    params:
        drafters=lambda wildcards: timing_drafters(wildcards.experiment, wildcards.target),
        # dpace.evaluation.eval_config.EvalConfig: the full suite's settings (temperatures, max_new_tokens, seed, ...)
        eval={**config["eval"], "temperatures": SUITES["full"]["temperatures"], "seed": config["seed"]},
        # dpace.evaluation.timing_run.TimingSettings
        # (timing.dtype only when set: a run made before the setting existed keeps its timings)
        timing={key: config["timing"][key] for key in ("prompts_per_benchmark", "sampled_prompts_per_benchmark",
                                                      "repeats", "dtype") if key != "dtype" or config["timing"][key]},
        code=script_fingerprint("speedup_timing.py"),
    threads: job_threads("speedup_timing")
    resources:
        **stage_resources("speedup_timing"),  # a GPU only where the config runs on one (dpace.cluster)
    script:
        "../scripts/speedup_timing.py"


rule experiment_timing:
    """timing.jobs per-target: an experiment's timing file, the rows of the target alone and of the experiment's
    drafters from the per-target timing job (dpace.evaluation.timing_split), as its own job would write
    them but timed beside every other timed experiment's drafters."""
    input:
        shared=f"{RESULTS}/{TIMING}".replace("{experiment}", SHARED_TIMING),
    output:
        times=f"{RESULTS}/{TIMING}",
    log:
        f"{RESULTS}/logs/eval/{{target}}/timing-{{experiment}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/eval/{{target}}/timing-{{experiment}}.tsv"
    wildcard_constraints:
        experiment="|".join(name for name in EXPERIMENTS if timed_experiment(name))
        if timing_per_target() else "^$",
    params:
        drafters=lambda wildcards: sorted(timing_drafters(wildcards.experiment, wildcards.target)),
        code=script_fingerprint("experiment_timing.py"),
    localrule: True
    script:
        "../scripts/experiment_timing.py"
