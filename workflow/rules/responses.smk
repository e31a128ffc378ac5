# Stage 3, responses (config section `responses`): the target answers every training prompt itself
# (rule generate_responses: the paper's target-regenerated data), or, for a target with
# targets.<t>.responses, its answers are imported (rule import_responses; Qwen3-4B: the DFlash
# authors' z-lab/qwen3-4b-instruct-100k).


rule generate_responses:
    input:
        prompts=f"{RESULTS}/data/train/{{dataset}}.jsonl",
        target=f"{RESULTS}/targets/{{target}}/target.json",
    output:
        conversations=f"{RESULTS}/responses/{{target}}/{{dataset}}.jsonl",
    wildcard_constraints:
        dataset=re.escape(mixture_name(config["data"]["train_set"])),
    log:
        f"{RESULTS}/logs/responses/{{target}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/responses/{{target}}/{{dataset}}.tsv"
    params:
        backend=config["responses"]["backend"],
        max_new_tokens=config["responses"]["max_new_tokens"],
        max_prompt_tokens=config["responses"]["max_prompt_tokens"],
        temperature=config["responses"]["temperature"],
        batch_size=config["responses"]["batch_size"],
        dtype=config["responses"]["dtype"],
        seed=config["seed"],
        scratch=f"{SCRATCH}/responses/{{target}}/{{dataset}}.partial.jsonl",
        code=script_fingerprint("generate_responses.py"),
    threads: job_threads("generate_responses")
    resources:
        # SGLang's engine, or transformers on a GPU with `device: cuda` (CPU otherwise)
        **stage_resources("generate_responses"),
    script:
        "../scripts/generate_responses.py"


rule import_responses:
    input:
        # a local answers file is an input (an edit reruns the import); a hub data set is read as published
        local=imported_answers_file,
    output:
        conversations=f"{RESULTS}/responses/{{target}}/{{dataset}}.jsonl",
    wildcard_constraints:
        dataset="|".join(map(re.escape, IMPORTED)) or "(?!)",  # (?!): no data set is imported
    log:
        f"{RESULTS}/logs/responses/{{target}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/responses/{{target}}/{{dataset}}.tsv"
    params:
        source=lambda wildcards: config["targets"][wildcards.target]["responses"],
        local_digest=lambda wildcards: digest(imported_answers_file(wildcards)),
        num_conversations=sum(training_prompt_counts(config).values()),
        seed=config["seed"],
        code=script_fingerprint("import_responses.py"),
    localrule: True
    script:
        "../scripts/import_responses.py"
