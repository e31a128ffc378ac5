# Stage 5: one drafter per variant (objective x hyperparameters x depth x block size).


rule train_drafter:
    input:
        features=lambda wildcards: features_dir(wildcards.target),
        target=f"{RESULTS}/targets/{{target}}/target.json",
    output:
        summary=f"{RESULTS}/{DRAFTER_SUMMARY}",
        steps=f"{RESULTS}/drafters/{{target}}/{{variant}}/steps.jsonl",
    log:
        f"{RESULTS}/logs/train/{{target}}/{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{target}}/{{variant}}.tsv"
    params:
        settings=lambda wildcards: variant(wildcards).train_settings(),
        mask_token_id=lambda wildcards: config["targets"][wildcards.target].get("mask_token_id"),
        max_seq_length=config["features"]["max_seq_length"],
        # Every knob of the train section that all drafters share (dpace.training.train_config.train_knobs): a new knob in
        # the schema and TrainConfig reaches the job, and its cache key, with no line here.
        train=train_knobs(config["train"]),
        seed=lambda wildcards: variant(wildcards).seed(config["seed"]),
        backend=config["train"]["backend"],
        scratch=f"{SCRATCH}/train/{{target}}/{{variant}}",
        code=lambda wildcards: script_fingerprint("train_drafter.py", variant(wildcards).objective),
    threads: job_threads("train_drafter")
    resources:
        # GPUs this job holds (dpace.gpus locks them): SpecForge's capture server and trainer need two,
        # the local loop one with `device: cuda`, none on a CPU config (dpace.cluster.stage_gpus).
        **stage_resources("train_drafter"),
    script:
        "../scripts/train_drafter.py"


rule step_timing:
    """Table 7's step time: Table 1's shallowest DFlash and D-PACE drafters' optimizer steps, interleaved in one
    process and repeated (dpace.step_timing; config section timing), under the device's timing lock."""
    input:
        features=lambda wildcards: features_dir(wildcards.target),
        target=f"{RESULTS}/targets/{{target}}/target.json",
    output:
        times=f"{RESULTS}/{STEP_TIMING}",
    log:
        f"{RESULTS}/logs/train/{{target}}/step-timing.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{target}}/step-timing.tsv"
    params:
        settings=lambda wildcards: {o: step_timing_variant(o).train_settings() for o in ("dflash", "dpace")},
        seed=config["seed"],
        mask_token_id=lambda wildcards: config["targets"][wildcards.target].get("mask_token_id"),
        train=train_knobs(config["train"]),
        timing={key: config["timing"][key] for key in ("steps", "warmup_steps", "repeats")},
        # only the two timed objectives' own code (a new objective elsewhere leaves it as it is)
        code=script_fingerprint("step_timing.py", "dflash", "dpace"),
    threads: job_threads("step_timing")
    resources:
        **stage_resources("step_timing"),  # a GPU only where the config runs on one (dpace.cluster)
    script:
        "../scripts/step_timing.py"
