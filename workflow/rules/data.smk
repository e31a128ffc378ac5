# Stage 1: benchmark prompts (selected as DFlash's benchmark selects them) and training prompts (hub or local mirror, seeded).


rule benchmark_prompts:
    input:
        mirror=lambda wildcards: mirror_files("benchmarks", [wildcards.benchmark]),
    output:
        prompts=f"{RESULTS}/data/benchmarks/{{benchmark}}.jsonl",
    log:
        f"{RESULTS}/logs/data/benchmark_{{benchmark}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/data/benchmark_{{benchmark}}.tsv"
    params:
        mirror=config["data"]["mirror"],
        mirror_digest=lambda wildcards: digest(mirror_files("benchmarks", [wildcards.benchmark])),
        num_prompts=lambda wildcards: prompts_per_benchmark(wildcards.benchmark),
        seed=config["seed"],
        code=script_fingerprint("benchmark_prompts.py"),
    localrule: True
    script:
        "../scripts/benchmark_prompts.py"


rule training_prompts:
    input:
        mirror=lambda wildcards: mirror_files("train", training_prompt_counts(config)),
    output:
        prompts=f"{RESULTS}/data/train/{{dataset}}.jsonl",
    wildcard_constraints:
        dataset=re.escape(mixture_name(config["data"]["train_set"])),
    log:
        f"{RESULTS}/logs/data/train_{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/data/train_{{dataset}}.tsv"
    params:
        mirror=config["data"]["mirror"],
        mirror_digest=lambda wildcards: digest(mirror_files("train", training_prompt_counts(config))),
        counts=training_prompt_counts(config),
        max_chars=config["data"]["max_prompt_chars"],
        seed=config["seed"],
        code=script_fingerprint("training_prompts.py"),
    localrule: True
    script:
        "../scripts/training_prompts.py"
