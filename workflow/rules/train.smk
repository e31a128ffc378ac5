# Stage 5: one drafter per variant (objective x hyperparameters x depth x block size).


rule train_drafter:
    input:
        features=lambda wildcards: features_dir(wildcards.target),
        target=f"{RESULTS}/targets/{{target}}/target.json",
    output:
        summary=f"{RESULTS}/drafters/{{target}}/{{variant}}/summary.json",
        steps=f"{RESULTS}/drafters/{{target}}/{{variant}}/steps.jsonl",
    log:
        f"{RESULTS}/logs/train/{{target}}/{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{target}}/{{variant}}.tsv"
    params:
        settings=lambda wildcards: variant(wildcards).train_settings(),
        mask_token=config["train"]["mask_token"],
        mask_token_id=lambda wildcards: config["targets"][wildcards.target].get("mask_token_id"),
        max_seq_length=config["features"]["max_seq_length"],
        num_anchors=config["train"]["num_anchors"],
        learning_rate=config["train"]["learning_rate"],
        warmup_ratio=config["train"]["warmup_ratio"],
        max_grad_norm=config["train"]["max_grad_norm"],
        micro_batch_size=config["train"]["micro_batch_size"],
        grad_accumulation=config["train"]["grad_accumulation"],
        weight_decay=config["train"]["weight_decay"],
        objective_chunk_blocks=config["train"]["objective_chunk_blocks"],
        save_every_steps=config["train"]["save_every_steps"],
        precision=config["train"]["precision"],
        attention_backend=config["train"]["attention_backend"],
        drafter_init=config["train"]["drafter_init"],
        feature_scaling=config["train"]["feature_scaling"],
        draft_vocab_size=config["train"]["draft_vocab_size"],
        sliding_window=config["train"]["sliding_window"],
        seed=lambda wildcards: variant(wildcards).seed(config["seed"]),
        backend=config["train"]["backend"],
        scratch=f"{SCRATCH}/train/{{target}}/{{variant}}",
        code=lambda wildcards: script_fingerprint("train_drafter.py", variant(wildcards).objective),
    threads: JOB_THREADS
    resources:
        # GPUs this job holds (dpace.gpus locks them): SpecForge's capture server and trainer need two.
        gpu=2 if config["train"]["backend"] == "specforge" else 1,
    script:
        "../scripts/train_drafter.py"
