# Stage 2: materialise each target once as an HF folder (or a pointer to a hub id).


rule prepare_target:
    input:
        local=target_files,
    output:
        target=f"{RESULTS}/targets/{{target}}/target.json",
    log:
        f"{RESULTS}/logs/targets/{{target}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/targets/{{target}}.tsv"
    params:
        spec=lambda wildcards: config["targets"][wildcards.target],
        local_digest=lambda wildcards: digest(target_files(wildcards) + embedded_gguf(wildcards)),
        seed=config["seed"],
        code=script_fingerprint("prepare_target.py"),
    resources:
        **stage_resources("prepare_target"),  # no GPU; the SLURM profile's default cores and memory
    script:
        "../scripts/prepare_target.py"
