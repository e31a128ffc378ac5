"""workflow/configs/gpu-embedded.yaml (Table 1 of the embedded default on one GPU): its plan, its CPU
miniature run to Table 1, and targets loaded from local files (no network)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpace.config import validate_config

REPO = Path(__file__).resolve().parents[1]
GPU_EMBEDDED = REPO / "workflow" / "configs" / "gpu-embedded.yaml"


def _load(path: Path) -> dict:
    config = yaml.safe_load(path.read_text())
    validate_config(config)
    return config


def test_gpu_embedded_spends_the_gpu_on_what_the_cpu_default_cut():
    gpu, cpu = _load(GPU_EMBEDDED), _load(REPO / "config.yaml")
    train = gpu["train"]
    assert (train["draft_vocab_size"], train["sliding_window"], train["depth"]) == (0, 0, 3)  # the paper's
    assert (train["precision"], train["attention_backend"], gpu["eval"]["dtype"]) == ("bf16", "flex_attention", "bfloat16")
    assert cpu["train"]["draft_vocab_size"] > 0 and cpu["train"]["sliding_window"] > 0 and cpu["train"]["depth"] < 3
    assert train["num_anchors"] > cpu["train"]["num_anchors"]
    assert sum(gpu["data"]["train_prompts"].values()) > sum(cpu["data"]["train_prompts"].values())  # more answers
    assert gpu["data"]["prompts_per_benchmark"] > cpu["data"]["prompts_per_benchmark"]  # more prompts
    assert gpu["data"]["benchmarks"] == cpu["data"]["benchmarks"]
    assert gpu["experiments"]["main"]["objectives"] == cpu["experiments"]["main"]["objectives"]  # Table 1's rows
    assert gpu["targets"][gpu["main_target"]]["source"] == "embedded"  # the package's GGUF: no network
    # the effective batch stays the paper's 4 sequences per optimizer step
    assert train["micro_batch_size"] * train["grad_accumulation"] == 4


@pytest.mark.slow
def test_gpu_embedded_plans_table_1_with_every_gpu_job_on_the_gpu(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--configfile",
         str(GPU_EMBEDDED), "--replace-workflow-config", "-n", "--cores", "16", "--resources", "gpu=1", "--",
         "results/table_main.tex"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out, re.MULTILINE))
    # one timing job: Table 1's SR, the target and the four drafters decoded interleaved on the one GPU
    assert {rule: int(counts[rule]) for rule in ("train_drafter", "evaluate", "autoregressive_baseline",
                                                  "generate_responses", "features", "speedup_timing", "total")} == {
        "train_drafter": 4, "evaluate": 4, "autoregressive_baseline": 1, "generate_responses": 1, "features": 1,
        "speedup_timing": 1, "total": 22}
    jobs = re.split(r"\n(?=\[.*\]\nrule |rule )", out)
    for rule in ("train_drafter", "evaluate", "generate_responses", "features", "autoregressive_baseline",
                 "speedup_timing"):
        planned = [job for job in jobs if re.search(rf"^rule {rule}:", job, re.MULTILINE)]
        assert planned and all("gpu=1" in job for job in planned), rule
    variants = set(re.findall(r"variant=(\S+?)(?:,|\n)", out))
    assert variants == {f"{o}-d3-b8-e3" for o in ("dflash-gamma4", "topk-prefix-k3", "accept-rate",
                                                  "dpace-alpha0.5")}, variants


@pytest.mark.slow
def test_gpu_embedded_cpu_miniature_runs_to_table_1(tmp_path, mirror):
    from dpace.gpu_check import EMBEDDED_MINIATURE, embedded_config, main

    config = yaml.safe_load(embedded_config(tmp_path, mirror, cpu=True).read_text())
    validate_config(config)
    # the miniature keeps what the GPU config changes, except what a CPU cannot run (flex_attention, bf16)
    assert (config["train"]["draft_vocab_size"], config["train"]["sliding_window"], config["train"]["depth"]) == (0, 0, 3)
    assert config["eval"]["baseline"] == "shared"
    assert main(["--embedded", "--cpu", "--cores", "2", "--workdir", str(tmp_path), "--mirror", str(mirror)]) == 0
    assert "D-PACE" in (tmp_path / "results" / "table_main.tex").read_text()
    drafters = sorted(p.name for p in (tmp_path / "results" / "drafters" / config["main_target"]).iterdir())
    objectives = EMBEDDED_MINIATURE["experiments"]["main"]["objectives"]
    assert len(drafters) == len(objectives) and all("-d3-" in name for name in drafters)


def test_a_local_gguf_file_is_a_target_without_the_network(tmp_path, monkeypatch):
    """``source: /path/model.gguf`` is dequantised and saved like the embedded target (the GGUF's own
    tokenizer and chat template), and loads from the saved folder; the dequantisation itself is
    tests/test_embedded_target.py's (here a tiny model stands in for it)."""
    from dpace import targets
    from dpace.targets import _embedded_dir, _random_model, load_target, model_location, prepare_target

    gguf = Path(_embedded_dir()) / targets.EMBEDDED_GGUF
    link = tmp_path / "copy" / "SmolLM2.gguf"
    link.parent.mkdir()
    link.symlink_to(gguf)
    calls = []

    def dequantised(folder, name):
        calls.append((folder, name))
        return _random_model(49152, {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}, 0)

    monkeypatch.setattr(targets, "_gguf_model", dequantised)
    monkeypatch.chdir(tmp_path)
    target_json = prepare_target({"source": "copy/SmolLM2.gguf"}, tmp_path / "out")
    assert calls == [(str(link.parent), "SmolLM2.gguf")]
    record = json.loads(target_json.read_text())
    assert record["source"] == str(link) and record["path"] == "model"
    assert model_location(target_json)[0] == str(tmp_path / "out" / "model")
    model, tokenizer = load_target(target_json)
    assert model.config.num_hidden_layers == 2 and tokenizer.chat_template  # SmolLM2's, from the GGUF


def test_a_local_hf_folder_is_recorded_by_its_absolute_path(tmp_path, monkeypatch, tiny_target_json):
    from dpace.targets import model_location, prepare_target

    monkeypatch.chdir(tiny_target_json.parent)
    target_json = prepare_target({"source": "model"}, tmp_path / "out")  # a relative folder
    assert model_location(target_json)[0] == str(tiny_target_json.parent / "model")
