# Stage 3: the target answers every training prompt itself (the paper's target-regenerated data).


rule generate_responses:
    input:
        prompts=f"{RESULTS}/data/train/{{dataset}}.jsonl",
        target=f"{RESULTS}/targets/{{target}}/target.json",
    output:
        conversations=f"{RESULTS}/responses/{{target}}/{{dataset}}.jsonl",
    log:
        f"{RESULTS}/logs/responses/{{target}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/responses/{{target}}/{{dataset}}.tsv"
    params:
        backend=config["generate"]["backend"],
        max_new_tokens=config["generate"]["max_new_tokens"],
        max_prompt_tokens=config["generate"]["max_prompt_tokens"],
        temperature=config["generate"]["temperature"],
        batch_size=config["generate"]["batch_size"],
        seed=config["seed"],
        scratch=f"{SCRATCH}/responses/{{target}}/{{dataset}}.partial.jsonl",
        code=stage_fingerprint("generate"),
    threads: JOB_THREADS
    resources:
        gpu=1 if config["generate"]["backend"] == "sglang" else 0,
    script:
        "../scripts/generate_responses.py"
