"""Bad configuration is rejected before any job runs, with one line naming the key and what is allowed."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpace.config import (
    ConfigError,
    all_variants,
    experiments,
    training_data,
    training_prompt_counts,
    validate_config,
)

REPO = Path(__file__).resolve().parents[1]
SMOKE = yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())
PAPER = yaml.safe_load((REPO / "workflow" / "configs" / "paper.yaml").read_text())


def _set(config: dict, dotted: str, value) -> dict:
    config = copy.deepcopy(config)
    node, keys = config, dotted.split(".")
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return config


# (dotted key, bad value, regex the one-line message must match)
BAD = [
    ("colour", "blue", r"<top level>: unknown key\(s\) \['colour'\]; allowed: \[.*'train'"),
    ("train.lr", 0.1, r"train: unknown key\(s\) \['lr'\]; allowed: \[.*'learning_rate'"),
    ("train.learning_rate", "1e-4", r"train\.learning_rate: '1e-4' is not of type 'number' \(YAML reads 1e-4"),
    ("train.objective_hparams.dpace.alpha", 1.5, r"train\.objective_hparams\.dpace\.alpha: 1\.5 is greater than the maximum of 1"),
    ("train.block_size", 1, r"train\.block_size: 1 is less than the minimum of 2"),
    ("experiments.main.objectives", ["dflash", "dpcae"], r"experiments\.main\.objectives: unknown objective 'dpcae'.*dpace"),
    ("train.objective_hparams", {"dpace": {"alpha": 0.5}}, r"experiments\.main\.objectives: .*gamma.*block size 4|experiments.*B=4"),
    ("eval.temperatures", [0.0, -1.0], r"eval\.temperatures\.1: -1\.0 is less than the minimum of 0"),
    ("targets.tiny.target_layer_ids", [1, 99], r"targets\.tiny\.target_layer_ids: \[99\] outside the target's layers 0\.\.5"),
    ("data.benchmarks", ["gsm9k"], r"data\.benchmarks\.0: 'gsm9k' is not one of \['gsm8k'"),
    ("train.depth", 0, r"train\.depth: 0 is less than the minimum of 1"),
    ("experiments.main.depths", [0], r"experiments\.main\.depths\.0: 0 is less than the minimum of 1"),
    ("responses.backend", "vllm", r"responses\.backend: 'vllm' is not one of \['transformers', 'sglang'\]"),
    ("features.mode", "lazy", r"features\.mode: 'lazy' is not one of \['cached', 'online'\]"),
    ("eval.verification", "typical", r"eval\.verification: 'typical' is not one of \['hard-match', 'rejection'\]"),
    ("main_target", "nonexistent", r"main_target: 'nonexistent' is not one of targets \['tiny'\]"),
    ("train.objective_hparams.topk-prefix.k", 0, r"train\.objective_hparams\.topk-prefix\.k: 0 is less than the minimum of 1"),
    ("data.prompts_per_benchmark", 0, r"data\.prompts_per_benchmark: 0 is less than the minimum of 1"),
    ("experiments.normalization.modes", ["mean"], r"experiments\.normalization\.modes\.0: 'mean' is not one of \['batch'"),
    ("train.objective_hparams", {"dpace-x": {"alpha": 0.5}}, r"train\.objective_hparams: unknown objective 'dpace-x'"),
    ("data.prompts_per_benchmark", {"math500": 2}, r"data\.prompts_per_benchmark: no count for benchmark\(s\) \['mt_bench'\]"),
    ("train.precision", "fp16", r"train\.precision: 'fp16' is not one of \['fp32', 'bf16', 'auto'\]"),
    ("train.attention_backend", "flash", r"train\.attention_backend: 'flash' is not one of \['sdpa', 'flex_attention'\]"),
    ("targets.tiny.responses", "answers/sharegpt.jsonl", r"targets\.tiny\.responses: .* named like the generated set 'sharegpt'"),
    ("eval.sampled_prompts_per_benchmark", 0, r"eval\.sampled_prompts_per_benchmark: 0 is less than the minimum of 1"),
    ("train.drafter_init", "pretrained", r"train\.drafter_init: 'pretrained' is not one of \['random', 'target'\]"),
    ("train.feature_scaling", "std", r"train\.feature_scaling: 'std' is not one of \['none', 'rms'\]"),
    ("train.seed", -1, r"train\.seed: -1 is less than the minimum of 0"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=[f"{k}={v}" for k, v, _ in BAD])
def test_bad_config_is_rejected_with_the_key_named(key, value, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(_set(SMOKE, key, value))


# Through Snakemake, one case per kind of check (the test above covers every rule in-process, and the
# Snakefile hands the whole config to the same validate_config): an unknown key, a YAML type, a value
# the schema bounds, a name checked against a registry, a check that crosses keys.
SNAKEMAKE_BAD = [case for case in BAD if case[0] in (
    "colour", "train.learning_rate", "eval.temperatures", "experiments.main.objectives", "targets.tiny.target_layer_ids",
)]
assert len(SNAKEMAKE_BAD) == 5, "a renamed case in BAD dropped out of the Snakemake selection"


@pytest.mark.slow  # one Snakemake process per case
@pytest.mark.parametrize(("key", "value", "message"), SNAKEMAKE_BAD, ids=[f"{k}={v}" for k, v, _ in SNAKEMAKE_BAD])
def test_snakemake_refuses_bad_config_before_any_job(tmp_path, key, value, message):
    config = _set(SMOKE, key, value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--configfile",
         str(path), "--replace-workflow-config", "--cores", "1", "all"],
        capture_output=True, text=True, timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "invalid configuration:" in output
    line = next(line for line in output.splitlines() if "invalid configuration:" in line)
    import re

    assert re.search(message, line), line
    assert not (tmp_path / "results").exists()  # nothing ran


def test_shipped_configs_are_valid():
    defaults = yaml.safe_load((REPO / "config.yaml").read_text())
    for config in (SMOKE, PAPER, defaults):
        validate_config(config)


def test_paper_grid_expands_to_the_papers_variants():
    expanded = experiments(PAPER)
    main = {(v.objective, v.depth, v.block_size) for v in expanded["main"].variants}
    assert main == {(o, d, 16) for o in ("dflash", "topk-prefix", "accept-rate", "dpace") for d in (3, 5)}
    cross = {(v.target, v.objective, v.block_size) for v in expanded["cross_model"].variants}
    assert cross == {(t, o, b) for t, b in (("llama3.1-8b", 10), ("qwen3-8b", 16)) for o in ("dflash", "dpace")}
    assert {v.epochs for v in expanded["ablation"].variants} == {9}
    smoothing = {(v.target, v.block_size, dict(v.hparams).get("alpha")) for v in expanded["smoothing"].variants}
    assert {(t, b, a) for t, b, a in smoothing if a is not None} == {
        (t, b, a) for t, b in (("qwen3-4b", 16), ("qwen3-4b", 8), ("llama3.1-8b", 10)) for a in (0.0, 0.3, 0.5, 0.7, 0.9)
    }
    gammas = {v.block_size: dict(v.hparams)["gamma"] for v in expanded["block_size"].variants if v.objective == "dflash"}
    assert gammas == {8: 4.0, 12: 6.0, 16: 7.0}
    # Experiments share drafters. Table 1 reads epoch 6 of the 9-epoch runs (checkpoint: ablation-run),
    # so its 3L DFlash / D-PACE are the ablation's runs; the smoothing sweep's alpha=0.5 at B=16 is
    # the block-size table's B=16 D-PACE.
    assert expanded["main"].eval_epoch == 6 and {v.epochs for v in expanded["main"].variants} == {9}
    ids = {v.id for v in expanded["main"].variants} & {v.id for v in expanded["ablation"].variants}
    assert ids == {"dpace-alpha0.5-d3-b16-e9", f"dflash-gamma{gammas[16]:g}-d3-b16-e9"}
    ids = {v.id for v in expanded["block_size"].variants} & {v.id for v in expanded["smoothing"].variants}
    assert "dpace-alpha0.5-d3-b16-e6" in ids
    assert len(all_variants(PAPER)) < sum(len(g.variants) for g in expanded.values())


def test_a_training_seed_names_new_drafters_only_where_it_differs_from_the_run_seed():
    ids = {v.id for v in all_variants(SMOKE).values()}
    assert {v.id for v in all_variants(_set(SMOKE, "train.seed", SMOKE["seed"])).values()} == ids
    reseeded = all_variants(_set(SMOKE, "train.seed", SMOKE["seed"] + 2)).values()
    assert {v.id for v in reseeded} == {f"{i}-s{SMOKE['seed'] + 2}" for i in ids}
    assert {v.seed(SMOKE["seed"]) for v in reseeded} == {SMOKE["seed"] + 2}
    assert {v.seed(SMOKE["seed"]) for v in all_variants(SMOKE).values()} == {SMOKE["seed"]}


def test_training_seeds_add_drafters_named_by_their_seed_and_keep_the_first_seeds_names():
    one = experiments(SMOKE)
    three = experiments(_set(SMOKE, "train.seeds", 3))
    for name, experiment in three.items():
        firsts = [v.id for v in one[name].variants]
        assert [v.id for v in experiment.variants] == [f"{i}{s}" for i in firsts for s in ("", "-s1", "-s2")]
        assert [v.method_id for v in experiment.variants] == [i for i in firsts for _ in range(3)]
        assert [v.seed(SMOKE["seed"]) for v in experiment.variants] == [0, 1, 2] * len(firsts)
    assert experiments(_set(SMOKE, "train.seeds", 1))["main"].variants == one["main"].variants
    # After train.seed: 5, seeds 5 and 6; a later seed that is the run's own is named as the run's drafters are.
    reseeded = experiments(_set(_set(SMOKE, "train.seed", 5), "train.seeds", 2))["main"].variants
    assert [v.id.rsplit("-", 1)[1] for v in reseeded[:2]] == ["s5", "s6"] and reseeded[1].method_id == reseeded[0].id
    wrapped = experiments(_set(_set(_set(SMOKE, "seed", 1), "train.seed", 0), "train.seeds", 2))["main"].variants
    assert wrapped[0].id.endswith("-s0") and wrapped[1].id == wrapped[0].id.removesuffix("-s0")
    with pytest.raises(ConfigError, match=r"train\.seeds: 0 is less than the minimum of 1"):
        validate_config(_set(SMOKE, "train.seeds", 0))


def test_an_experiment_can_keep_fewer_seeds_than_the_run():
    """experiments.<name>.seeds: the beyond-the-paper experiments at their first seed while the paper's train at
    three; a drafter they share with Table 1 is Table 1's first seed (the same id, trained once)."""
    config = _set(_set(_set(SMOKE, "train.seeds", 3), "experiments.extras.seeds", 1), "experiments.normalization.seeds", 1)
    validate_config(config)
    found, plain = experiments(config), experiments(SMOKE)
    for name in ("extras", "normalization"):
        assert [v.id for v in found[name].variants] == [v.id for v in plain[name].variants]
    assert len(found["main"].variants) == 3 * len(plain["main"].variants)
    assert found["extras"].variants[0] in found["main"].variants  # DFlash, seed 0
    trained = all_variants(config)
    assert len(trained) == len(all_variants(_set(SMOKE, "train.seeds", 3))) - 2 * 3  # dpakl, pard2-cat, n-token
    # An experiment may also ask for more seeds than the run.
    assert len(experiments(_set(config, "experiments.extras.seeds", 2))["extras"].variants) == 8
    with pytest.raises(ConfigError, match=r"seeds: 0 is less than the minimum of 1"):
        validate_config(_set(config, "experiments.extras.seeds", 0))


def test_a_training_mixture_needs_a_count_per_set():
    mixed = _set(_set(SMOKE, "data.train_set", ["sharegpt", "codealpaca"]), "data.train_prompts", {"sharegpt": 4, "codealpaca": 2})
    validate_config(mixed)
    assert training_prompt_counts(mixed) == {"sharegpt": 4, "codealpaca": 2}
    assert training_data(mixed, "tiny") == "sharegpt+codealpaca"
    with pytest.raises(ConfigError, match=r"data\.train_prompts: a mixture of \['sharegpt', 'codealpaca'\] needs a count per set"):
        validate_config(_set(mixed, "data.train_prompts", 6))
    with pytest.raises(ConfigError, match=r"data\.train_prompts: counts for \['sharegpt'\], but data\.train_set is"):
        validate_config(_set(mixed, "data.train_prompts", {"sharegpt": 6}))
    single = _set(_set(SMOKE, "data.train_set", ["codealpaca"]), "data.train_prompts", 5)
    assert training_prompt_counts(single) == {"codealpaca": 5} and training_data(single, "tiny") == "codealpaca"


def test_a_named_drafter_init_needs_the_local_loop():
    local = _set(SMOKE, "train.drafter_init", "target")
    validate_config(local)
    with pytest.raises(ConfigError, match=r"train\.drafter_init: 'target' needs train\.backend local"):
        validate_config(_set(local, "train.backend", "specforge"))


def test_rms_feature_scaling_needs_the_local_loop_cached_features_and_a_random_fc():
    scaled = _set(_set(SMOKE, "train.feature_scaling", "rms"), "train.drafter_init", "random")
    validate_config(scaled)
    paper_like = _set(_set(scaled, "train.draft_vocab_size", 0), "train.sliding_window", 0)
    validate_config(_set(paper_like, "eval.backend", "sglang"))  # its checkpoint is an ordinary DFlash drafter
    with pytest.raises(ConfigError, match=r"train\.feature_scaling: 'rms' needs train\.backend local"):
        validate_config(_set(scaled, "train.backend", "specforge"))
    with pytest.raises(ConfigError, match=r"train\.feature_scaling: 'rms' .* needs features\.mode: cached"):
        validate_config(_set(scaled, "features.mode", "online"))
    with pytest.raises(ConfigError, match=r"train\.feature_scaling: 'rms' cannot start from drafter_init: target"):
        validate_config(_set(scaled, "train.drafter_init", "target"))


@pytest.mark.parametrize(("setting", "value"), [("draft_vocab_size", 64), ("sliding_window", 16)])
def test_settings_of_the_local_loop_are_refused_with_the_engines(setting, value):
    paper_like = _set(_set(SMOKE, "train.draft_vocab_size", 0), "train.sliding_window", 0)
    for key, engine in (("train.backend", "specforge"), ("eval.backend", "sglang")):
        validate_config(_set(paper_like, key, engine))
    changed = _set(paper_like, f"train.{setting}", value)
    validate_config(changed)
    for key, engine in (("train.backend", "specforge"), ("eval.backend", "sglang")):
        with pytest.raises(ConfigError, match=rf"train\.{setting}: {value} needs the local backends .*{key}: {engine}"):
            validate_config(_set(changed, key, engine))


def test_the_paper_config_merged_into_the_default_undoes_its_cpu_deviations():
    """`--configfile workflow/configs/paper.yaml` merges into config.yaml, whose draft vocabulary, sliding
    window and data mixture are CPU deviations: the paper config must turn each off itself."""
    from snakemake.utils import update_config

    merged = yaml.safe_load((REPO / "config.yaml").read_text())
    deviations = {"draft_vocab_size": 0, "sliding_window": 0}
    assert all(merged["train"][key] != paper for key, paper in deviations.items())
    assert merged["data"]["train_set"] != "sharegpt"
    update_config(merged, copy.deepcopy(PAPER))
    assert {key: merged["train"][key] for key in deviations} == deviations
    assert training_prompt_counts(merged) == {"sharegpt": 100000}
    validate_config(merged)


def test_table_1_checkpoint_readings():
    final = experiments(_set(PAPER, "experiments.main.checkpoint", "final"))["main"]
    assert final.eval_epoch is None and {v.epochs for v in final.variants} == {6}
    # The default reading is "final" (the schema's; SMOKE itself may hold it, filled in by another test's validation).
    assert "checkpoint" not in yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())["experiments"]["main"]
    assert experiments(SMOKE)["main"].eval_epoch is None
    no_ablation = _set(PAPER, "experiments", {"main": PAPER["experiments"]["main"]})
    with pytest.raises(ConfigError, match="experiments.main.checkpoint: 'ablation-run' needs experiments.ablation"):
        experiments(no_ablation)


def _dry_run_with_override(tmp_path, override: str) -> subprocess.CompletedProcess:
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(SMOKE))
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--configfile",
         str(path), "--replace-workflow-config", "--config", override, "--cores", "1", "-n",
         "results/table_main.tex"],
        capture_output=True, text=True, timeout=300,
    )


@pytest.mark.parametrize("override,planned", [
    ("train={epochs: 3}", "-e3"),
    ("train={learning_rate: 2.0e-3, weight_decay: 0}", "-e2"),
    ("train={objective_hparams: {topk-prefix: {k: 2}}}", "topk-prefix-k2-"),
    ("eval={temperatures: [0, 0.5]}", "-e2"),
])
def test_nested_command_line_overrides_have_their_yaml_types(tmp_path, override, planned):
    """Snakemake hands nested --config values over as strings ('3'); they are read as YAML reads them."""
    result = _dry_run_with_override(tmp_path, override)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert planned in result.stdout


def test_a_bad_command_line_override_names_the_key(tmp_path):
    result = _dry_run_with_override(tmp_path, "train={epochs: eight}")
    assert result.returncode != 0
    line = next(line for line in (result.stdout + result.stderr).splitlines() if "invalid configuration:" in line)
    assert "train.epochs: 'eight' is not of type 'integer'" in line


def test_command_line_types_leave_top_level_values_and_configfile_values_alone():
    from dpace.config import apply_command_line_types

    config = {"seed": 3, "main_target": "007", "train": {"epochs": "8", "mask_token": "<|MASK|>", "lr": "x"}}
    apply_command_line_types(config, {"seed": 3, "main_target": "007", "train": {"epochs": "8", "mask_token": "<|MASK|>"}})
    assert config == {"seed": 3, "main_target": "007", "train": {"epochs": 8, "mask_token": "<|MASK|>", "lr": "x"}}


def test_schema_defaults_are_filled_in_once_and_rules_carry_none():
    config = copy.deepcopy(SMOKE)
    for key in ("weight_decay", "save_every_steps", "precision", "attention_backend", "objective_chunk_blocks"):
        config["train"].pop(key, None)
    config["responses"].pop("dtype", None)
    validate_config(config)
    assert (config["train"]["weight_decay"], config["train"]["save_every_steps"], config["train"]["precision"],
            config["train"]["attention_backend"], config["responses"]["dtype"]) == (0.0, 50, "fp32", "sdpa", "float32")
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        import re

        assert not re.search(r'config\["\w+"\]\.get\("\w+", ', smk.read_text()), smk.name
    for script in (REPO / "workflow" / "scripts").glob("*.py"):
        assert "snakemake.config" not in script.read_text(), script.name
