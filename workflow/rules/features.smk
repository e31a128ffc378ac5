# Stage 4: target hidden states, computed once per (target, dataset) and shared by every drafter.


rule features:
    input:
        conversations=f"{RESULTS}/responses/{{target}}/{{dataset}}.jsonl",
        target=f"{RESULTS}/targets/{{target}}/target.json",
    output:
        features=directory(f"{RESULTS}/features/{{target}}/{{dataset}}"),
    log:
        f"{RESULTS}/logs/features/{{target}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/features/{{target}}/{{dataset}}.tsv"
    params:
        mode=config["features"]["mode"],
        num_target_features=config["features"]["num_target_features"],
        target_layer_ids=lambda wildcards: config["targets"][wildcards.target].get("target_layer_ids")
        or config["features"]["target_layer_ids"],
        max_seq_length=config["features"]["max_seq_length"],
        batch_size=config["features"]["batch_size"],
        dtype=config["features"]["dtype"],
        code=script_fingerprint("features.py"),
    threads: job_threads("features")
    resources:
        # cached features run the target: on a GPU with `device: cuda` (online mode only tokenises)
        **stage_resources("features"),
    script:
        "../scripts/features.py"
