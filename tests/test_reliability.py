"""Issue 50's probes, one test each: bad input, damaged files and concurrent runs as a user meets them.

Every probe here was first seen giving a wrong number, a crash that names no file, or a security
hole on the old code (docs/guarantees.md lists them with what they guard).
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]



def hold_lock_in_another_process(name: str) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys,time; from dpace.locks import machine_lock\n"
         f"with machine_lock({name!r}):\n print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


# ---------------------------------------------------------------------------------------------
# Item 6: locks


def test_a_planted_symlink_in_the_lock_folder_is_never_written_through(lock_env, tmp_path):
    from dpace.gpus import gpu_slot
    from dpace.locks import lock_dir

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (lock_dir() / "gpu-0.lock").symlink_to(victim)
    with pytest.raises(OSError, match="gpu-0.lock"), gpu_slot(1, log=lambda *_: None):
        pass
    assert victim.read_text() == "precious\n"


def test_a_lock_folder_others_can_write_or_own_is_refused(lock_env):
    from dpace.locks import lock_dir, machine_lock

    folder = lock_dir()
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    folder.chmod(0o777)
    with pytest.raises(RuntimeError, match="writable by others"), machine_lock("timing"):
        pass
    folder.chmod(0o700)
    if os.getuid() == 0:  # only root can hand a folder to another user
        os.chown(folder, 65534, -1)
        with pytest.raises(RuntimeError, match="belongs to uid 65534"), machine_lock("timing"):
            pass


def test_a_lock_held_elsewhere_times_out_naming_its_holder_then_is_freed(lock_env):
    from dpace.locks import LockTimeout, machine_lock

    holder = hold_lock_in_another_process("timing")
    try:
        with pytest.raises(LockTimeout, match=f"held by pid {holder.pid} "), machine_lock(
                "timing", timeout_s=0.3, poll_s=0.05, log=lambda *_: None):
            pass
    finally:
        holder.kill()
        holder.wait()
    with machine_lock("timing", timeout_s=5, poll_s=0.05):  # the kernel dropped the dead holder's lock
        pass


def test_a_longer_holder_record_is_overwritten_in_place_not_truncated(lock_env):
    from dpace.locks import HOLDER_WIDTH, holder, lock_path, machine_lock

    path = lock_path("timing")
    path.write_text("pid 1".ljust(HOLDER_WIDTH - 1) + "\n")
    with machine_lock("timing"):
        assert holder("timing").startswith(f"pid {os.getpid()} ")
        assert path.stat().st_size == HOLDER_WIDTH


class NamedPaths(list):
    """Like Snakemake's input/output lists: the paths in order, and each by its name."""

    def __init__(self, **paths):
        super().__init__(paths.values())
        self.__dict__.update(paths)

    def get(self, key, default=None):
        return self.__dict__.get(key, default)


def baseline_adapter_snakemake(tmp_path) -> SimpleNamespace:
    params = SimpleNamespace(
        eval={"temperatures": [0.0], "max_new_tokens": 4, "seed": 0, "sampled_prompts_per_benchmark": 1, "dtype": "float32"},
        reference={"overrun": 0, "timed_prompts": 1, "batch_size": 1, "num_target_features": 1},
        records=str(tmp_path / "r.jsonl"))
    return SimpleNamespace(
        params=params, threads=1, resources={}, log=[str(tmp_path / "job.log")],
        input=SimpleNamespace(target="t", benchmarks=["b.jsonl"]),
        output=SimpleNamespace(baseline=str(tmp_path / "b.json"), features=str(tmp_path / "f")),
    )


def test_the_baseline_job_times_its_decoding_under_the_machine_timing_lock(lock_env, tmp_path, monkeypatch):
    """Item 5: SR timing never overlaps another invocation's (the baseline adapter; evaluate.py wraps
    evaluate_drafter the same way)."""
    import dpace.evaluation.evaluate
    from dpace.locks import release, timing_lock, try_lock

    seen = {}

    def measure(*args, **kwargs):
        fd = try_lock(timing_lock("cpu"))
        seen["timing lock free while measuring"] = fd is not None
        if fd is not None:
            release(fd)

    monkeypatch.setattr(dpace.evaluation.evaluate, "measure_baseline", measure)
    monkeypatch.setattr("dpace.jobs.begin_job", lambda snakemake: None)  # keeps pytest's fds 1 and 2 and no lock
    runpy.run_path(str(REPO / "workflow/scripts/autoregressive_baseline.py"),
                   init_globals={"snakemake": baseline_adapter_snakemake(tmp_path)})
    assert seen == {"timing lock free while measuring": False}



# ---------------------------------------------------------------------------------------------
# Item 6: names, shapes, pickles


def smoke_config() -> dict:
    import yaml

    return yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())


def test_a_target_named_like_a_path_is_refused_naming_the_key():
    from dpace.config import ConfigError, validate_config

    config = smoke_config()
    config["targets"] = {"../../escape": config["targets"]["tiny"]}
    config["main_target"] = "../../escape"
    with pytest.raises(ConfigError, match=r"targets: '\.\./\.\./escape' does not match"):
        validate_config(config)


@pytest.mark.parametrize(("name", "message"), [
    ("tiny\n", r"targets: 'tiny\\n' does not match \^\[A-Za-z0-9\]\[A-Za-z0-9\._-\]\*\$ as a whole"),
    ("t" * 260, r"targets: 't{40}'\.\.\. \(260 characters\) is longer than 64 characters"),
])
def test_a_target_name_with_a_trailing_newline_or_too_long_is_refused_at_config_time(name, message):
    """``$`` matches before a trailing newline, so the schema's pattern alone let ``tiny\\n`` through; a 260-character
    name failed only at job time (``File name too long``)."""
    from dpace.config import ConfigError, validate_config

    config = smoke_config()
    config["targets"] = {name: config["targets"]["tiny"]}
    config["main_target"] = name
    with pytest.raises(ConfigError, match=message):
        validate_config(config)
    config = smoke_config()
    config["targets"] = {"t" * 64: config["targets"]["tiny"]}  # the longest name allowed
    config["main_target"] = "t" * 64
    validate_config(config)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("hidden_size", 66, r"targets\.tiny\.hidden_size: 66 does not divide into num_heads 4"),
    ("num_kv_heads", 3, r"targets\.tiny\.num_heads: 4 does not divide into num_kv_heads 3"),
])
def test_attention_shapes_that_do_not_split_evenly_are_refused(key, value, message):
    from dpace.config import ConfigError, validate_config

    config = smoke_config()
    config["targets"]["tiny"][key] = value
    with pytest.raises(ConfigError, match=message):
        validate_config(config)


class _RunsCode:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["DPACE_TEST_MARKER"]),))


def test_a_training_state_with_pickled_code_is_refused_without_running_it(tmp_path, monkeypatch):
    import torch

    from dpace.training.loop import _load_state

    marker = tmp_path / "code-ran"
    monkeypatch.setenv("DPACE_TEST_MARKER", str(marker))
    torch.save({"fingerprint": "x", "payload": _RunsCode()}, tmp_path / "state.pt")
    with pytest.raises(ValueError, match=r"state\.pt: damaged or not a training state .*delete it and rerun"):
        _load_state(tmp_path / "state.pt")
    assert not marker.exists()
    torch.save({"rng": torch.get_rng_state(), "step": 3}, tmp_path / "state.pt")
    (tmp_path / "state.pt").write_bytes((tmp_path / "state.pt").read_bytes()[:100])  # truncated by a full disk
    with pytest.raises(ValueError, match=r"state\.pt: damaged"):
        _load_state(tmp_path / "state.pt")


# ---------------------------------------------------------------------------------------------
# Item 4: a damaged or malformed file fails naming its path and what to do, before it is used


def test_a_damaged_evaluation_summary_fails_naming_it(tmp_path):
    from dpace.report.collect import experiment_metrics

    path = tmp_path / "eval" / "tiny" / "dflash-d1-b4-e2" / "epoch-2" / "full" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text('[{"benchmark": "math500", "tau": ')  # a disk that filled up mid-write
    variants = [{"target": "tiny", "variant": "dflash-d1-b4-e2", "experiment": "main", "objective": "dflash",
                 "depth": 1, "block_size": 4}]
    with pytest.raises(ValueError, match=rf"{path}:1: malformed JSON .*; delete it and rerun"):
        experiment_metrics(variants, [str(path)])


def test_a_data_row_that_is_not_utf8_fails_naming_file_and_line(tmp_path):
    from dpace.data import benchmark_prompts

    path = tmp_path / "benchmarks" / "mt_bench.jsonl"
    path.parent.mkdir()
    path.write_bytes(b'{"prompt": ["fine"]}\n{"prompt": ["caf\xe9"]}\n')  # latin-1, not UTF-8
    with pytest.raises(ValueError, match=rf"{path}:2: not UTF-8 .*fix that row"):
        benchmark_prompts("mt_bench", 2, seed=0, mirror=str(tmp_path))


def test_a_truncated_feature_shard_fails_naming_it(tmp_path):
    import torch
    from safetensors.torch import save_file

    from dpace.features import load_features
    from dpace.io import atomic_write_json

    shard = tmp_path / "shard-00000.safetensors"
    save_file({"input_ids": torch.arange(100), "loss_mask": torch.ones(100), "offsets": torch.tensor([0, 100])}, shard)
    atomic_write_json(tmp_path / "index.json", {"shards": [shard.name], "layer_ids": [1]})
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"{shard}: damaged safetensors file .*delete {tmp_path} and rerun"):
        load_features(tmp_path)


def test_a_drafter_checkpoint_truncated_to_half_is_refused_naming_the_file(tmp_path):
    from transformers import LlamaConfig

    from dpace.training.drafter import build_drafter, drafter_config, load_drafter, save_drafter

    target = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2)
    folder = tmp_path / "drafter" / "epoch-1"
    save_drafter(build_drafter(drafter_config(target, depth=1, block_size=4, target_layer_ids=[1],
                                              mask_token_id=95)), folder)
    load_drafter(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"{weights}: changed since the checkpoint was written.*delete "
                                         rf"{folder.parent} and rerun"):
        load_drafter(folder)


def test_imported_conversations_given_as_a_string_fail_naming_the_row(tmp_path):
    import json

    from dpace.responses.conversations import import_conversations

    source = tmp_path / "answers.jsonl"
    source.write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"},
                                                    {"from": "gpt", "value": "hello"}]}) + "\n"
                      + json.dumps({"conversations": "human: hi\ngpt: hello"}) + "\n")
    with pytest.raises(ValueError, match=rf"{source} row 1: 'conversations' is a str, not a list of turns"):
        import_conversations(str(source), tmp_path / "out.jsonl", num_conversations=2, seed=0)


def test_a_failed_metrics_job_leaves_no_table_drawn_from_the_old_numbers(tmp_path, monkeypatch):
    results = tmp_path / "results"
    (results / "metrics").mkdir(parents=True)
    for name in ("table_main.tex", "table_training_time.tex", "fig_motivation.pdf", "fig_motivation.png",
                 "findings.md", "table_ablation.tex"):
        (results / name).write_text("the previous run's\n")
    summary = results / "eval" / "tiny" / "dflash-d1-b4-e2" / "epoch-2" / "full" / "summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text("[{")
    metrics = results / "metrics"
    job = SimpleNamespace(
        params=NamedPaths(variants=[{"target": "tiny", "variant": "dflash-d1-b4-e2", "experiment": "main",
                                          "objective": "dflash", "depth": 1, "block_size": 4}]),
        input=NamedPaths(summaries=[str(summary)]), log=[str(tmp_path / "metrics.log")],
        output=NamedPaths(metrics=str(metrics / "main.csv"), blocks=str(metrics / "main_blocks.csv"),
                          comparisons=str(metrics / "main_comparisons.csv")),
    )
    monkeypatch.setattr("dpace.jobs.begin_job", lambda snakemake: None)  # keeps pytest's fds 1 and 2 and no lock
    with pytest.raises(ValueError, match="summary.json:1: malformed JSON"):
        runpy.run_path(str(REPO / "workflow/scripts/experiment_metrics.py"), init_globals={"snakemake": job})
    assert sorted(p.name for p in results.iterdir() if p.is_file()) == ["table_ablation.tex"]  # not drawn from main


# ---------------------------------------------------------------------------------------------
# Item 3: degenerate data is refused by name


@pytest.mark.parametrize(("prompt", "message"), [
    ("Compose an engaging travel blog post", r"mt_bench\.jsonl:2: turns must be a non-empty list of strings, not str"),
    (["Hello", ""], r"mt_bench\.jsonl:2: turn\(s\) \[1\] empty or not strings"),
    ([], r"mt_bench\.jsonl:2: turns must be a non-empty list"),
])
def test_a_benchmark_prompt_that_is_not_a_list_of_turns_is_refused_naming_the_row(tmp_path, prompt, message):
    import json

    from dpace.data import benchmark_prompts

    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "mt_bench.jsonl").write_text(
        json.dumps({"prompt": ["fine"]}) + "\n" + json.dumps({"prompt": prompt}) + "\n")
    with pytest.raises(ValueError, match=message):
        benchmark_prompts("mt_bench", 2, seed=0, mirror=str(tmp_path))


def test_an_evaluation_refuses_a_benchmark_file_with_an_empty_turn_naming_file_and_row(tmp_path):
    """The benchmark files an evaluation reads (``dpace.evaluation``'s ``load_benchmark``) are checked as the data
    stage checks its rows (``dpace.data.check_turns``): an empty turn would be decoded from the chat template alone."""
    import json

    from dpace.evaluation.eval_records import load_benchmark

    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps({"id": "a", "benchmark": "gsm8k", "turns": ["fine"]}) + "\n"
                    + json.dumps({"id": "b", "benchmark": "gsm8k", "turns": ["Hello", ""]}) + "\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:2: turn\(s\) \[1\] empty or not strings"):
        load_benchmark(path, "gsm8k")


def test_a_training_row_whose_conversations_is_a_string_is_refused_naming_it(tmp_path):
    import json

    from dpace.data import training_prompts

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "sharegpt.jsonl").write_text(json.dumps({"conversations": "human: hi"}) + "\n")
    with pytest.raises(ValueError, match=r"sharegpt\.jsonl:1: 'conversations' is a str, not a list of turns"):
        training_prompts("sharegpt", 1, seed=0, mirror=str(tmp_path))


def test_a_responses_stage_that_keeps_no_prompt_fails_naming_the_setting(tmp_path, tiny_target_json):
    from dpace.io import atomic_write_jsonl
    from dpace.responses.generation import ResponseSettings, generate_responses

    atomic_write_jsonl(tmp_path / "prompts.jsonl", [{"id": "a", "prompt": "Say hello."}])
    with pytest.raises(ValueError, match=r"1 of 1 prompts .* longer than responses\.max_prompt_tokens=1 tokens"):
        generate_responses(tiny_target_json, tmp_path / "prompts.jsonl", tmp_path / "out.jsonl",
                           ResponseSettings(max_prompt_tokens=1))
    assert not (tmp_path / "out.jsonl").exists()


# ---------------------------------------------------------------------------------------------
# Item 7: a target the pipeline cannot serve exactly is refused at prepare_target, before slow work


@pytest.fixture(scope="module")
def smollm_tokenizer():
    from dpace.targets import embedded_tokenizer

    return embedded_tokenizer()


def test_a_target_without_a_chat_template_is_refused_before_its_model_is_built(tmp_path, smollm_tokenizer,
                                                                                monkeypatch):
    import json

    import dpace.targets

    smollm_tokenizer.save_pretrained(tmp_path / "tokenizer")
    config = tmp_path / "tokenizer" / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings.pop("chat_template", None)
    config.write_text(json.dumps(settings))
    (tmp_path / "tokenizer" / "chat_template.jinja").unlink(missing_ok=True)
    monkeypatch.setattr(dpace.targets, "_random_model", lambda *a: pytest.fail("the model was built first"))
    with pytest.raises(ValueError, match="has no chat template"):
        dpace.targets.prepare_target({"source": "random", "tokenizer": str(tmp_path / "tokenizer")}, tmp_path / "out")
    assert not (tmp_path / "out" / "model").exists()


def test_a_gguf_target_without_a_chat_template_is_refused_before_it_is_dequantised(tmp_path, smollm_tokenizer,
                                                                                    monkeypatch):
    """Gemma-3-270M's GGUF was refused only after 12 minutes of dequantising: the template is checked first."""
    import dpace.targets

    smollm_tokenizer.save_pretrained(tmp_path / "tokenizer")
    templateless = dpace.targets.AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    templateless.chat_template = None
    gguf = tmp_path / "model-q4.gguf"
    gguf.write_bytes(b"GGUF")  # never read: the tokenizer comes from the stand-in below
    monkeypatch.setattr(dpace.targets.AutoTokenizer, "from_pretrained", lambda *a, **k: templateless)
    monkeypatch.setattr(dpace.targets, "_gguf_model", lambda *a: pytest.fail("dequantised before the check"))
    with pytest.raises(ValueError, match="has no chat template"):
        dpace.targets.prepare_target({"source": str(gguf)}, tmp_path / "out")
    assert not (tmp_path / "out" / "model").exists()


def test_a_target_whose_end_of_turn_is_no_stop_token_is_refused(tmp_path, smollm_tokenizer):
    from transformers import AutoTokenizer

    from dpace.targets import prepare_target

    smollm_tokenizer.save_pretrained(tmp_path / "tokenizer")
    other = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    other.add_special_tokens({"additional_special_tokens": ["<end_of_turn>"]})
    other.chat_template = other.chat_template.replace("<|im_end|>", "<end_of_turn>")
    other.save_pretrained(tmp_path / "gemma-like")
    with pytest.raises(ValueError, match=r"ends a turn with '<end_of_turn>' .* not one of its stop tokens"):
        prepare_target({"source": "random", "tokenizer": str(tmp_path / "gemma-like")}, tmp_path / "out")


def test_a_target_whose_embedding_module_scales_its_lookup_is_refused(tmp_path, smollm_tokenizer):
    """Gemma multiplies its embeddings by sqrt(hidden) inside the module; decoding looks them up raw."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from dpace.targets import prepare_target

    config = Gemma3TextConfig(vocab_size=len(smollm_tokenizer), hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    Gemma3ForCausalLM(config).save_pretrained(tmp_path / "scaled")
    smollm_tokenizer.save_pretrained(tmp_path / "scaled")
    with pytest.raises(ValueError, match=r"Gemma3TextScaledWordEmbedding\) is not a plain lookup .* ratio 8\b"):
        prepare_target({"source": str(tmp_path / "scaled")}, tmp_path / "out")
    assert not (tmp_path / "out" / "target.json").exists()


def test_the_timing_lock_is_one_for_the_cpu_and_one_per_physical_gpu(monkeypatch):
    from dpace.locks import NAME, timing_lock

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert timing_lock("cpu") == "timing-cpu"
    names = []
    for gpus in ("0", "3", "1,2"):  # what dpace.gpus.gpu_slot sets for the job
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
        names.append(timing_lock("cuda"))
    assert names == ["timing-cuda-0", "timing-cuda-3", "timing-cuda-1-2"] and all(NAME.match(n) for n in names)
