"""GPU backends on a CPU machine: engines replaced only where a process boundary allows it.

* GPU locks: real ``flock`` files, a second process holding one.
* SGLang evaluation: a fake server *process* on 127.0.0.1 speaking SGLang's native ``/generate``
  (``meta_info.spec_accept_length`` etc.), started and stopped by the backend itself.
* SGLang generation: SGLang's offline ``Engine`` is an in-process API, so a stand-in ``sglang``
  module is the nearest boundary; the real engine is exercised when SGLang and CUDA are present.
* SpecForge: the real SpecForge 0.2.0 (schema, registry, launch planner, model providers, train
  step) on CPU; only the ``train``/``export`` processes are replaced by a fake executable that
  records its argv and config and writes SpecForge's checkpoint layout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from dpace.features import FeatureSettings, compute_features
from dpace.io import atomic_write_jsonl, read_jsonl

REPO = Path(__file__).resolve().parents[1]
MIRROR = REPO.parent / "shared" / "data"

CONVERSATIONS = [
    {"id": str(i), "conversations": [
        {"role": "user", "content": f"Question {i}: say something about {i * 3}."},
        {"role": "assistant", "content": " ".join(["answer", str(i)] * (4 + i % 3))},
    ]}
    for i in range(10)
]


@pytest.fixture(scope="module")
def features_dir(tmp_path_factory, tiny_target_json):
    folder = tmp_path_factory.mktemp("gpu-features")
    atomic_write_jsonl(folder / "conversations.jsonl", CONVERSATIONS)
    compute_features(tiny_target_json, folder / "conversations.jsonl", folder / "f",
                     FeatureSettings(target_layer_ids=[1, 3], max_seq_length=256))
    return folder / "f"


@pytest.fixture
def gpu_env(lock_env):
    """Two pretend GPUs and a private lock folder (conftest's lock_env)."""
    return lock_env


# ---------------------------------------------------------------------------------------------
# GPU locks


def test_gpu_slots_never_share_a_gpu(gpu_env):
    from dpace.gpus import gpu_slot

    with gpu_slot(1, log=lambda *_: None) as first:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == first[0]
        with gpu_slot(1, log=lambda *_: None) as second:
            assert second != first and os.environ["CUDA_VISIBLE_DEVICES"] == second[0]
            with pytest.raises(RuntimeError, match=rf"no 1 free GPU.*GPU 0: pid {os.getpid()} "), gpu_slot(1, timeout_s=0.2, poll_s=0.05,
                                                                              log=lambda *_: None):
                pass
        assert os.environ["CUDA_VISIBLE_DEVICES"] == first[0]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    with gpu_slot(2, log=lambda *_: None) as both:
        assert both == ["0", "1"] and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    with gpu_slot(0) as none:
        assert none == [] and "CUDA_VISIBLE_DEVICES" not in os.environ
    with pytest.raises(RuntimeError, match="needs 3 GPU"), gpu_slot(3):
        pass


def test_a_torch_job_gets_a_locked_gpu_when_it_asks_and_the_machine_has_one(gpu_env, monkeypatch):
    """torch_device_slot: the device choice every in-process stage makes (features, responses, baseline,
    evaluation, training)."""
    import torch

    from dpace.gpus import gpu_slot, torch_device_slot

    quiet = {"log": lambda *_: None}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with torch_device_slot(1, **quiet) as device:
        assert device == "cuda" and os.environ["CUDA_VISIBLE_DEVICES"] == "0"
        with torch_device_slot("1", **quiet) as second:  # a resource may arrive as a string
            assert second == "cuda" and os.environ["CUDA_VISIBLE_DEVICES"] == "1"  # never the same GPU
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    with torch_device_slot(0, **quiet) as device:  # the rule asked for none: the CPU, no lock
        assert device == "cpu" and "CUDA_VISIBLE_DEVICES" not in os.environ
        with gpu_slot(2, **quiet):
            pass  # both GPUs were free
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with torch_device_slot(1, **quiet) as device:  # a GPU id without a usable CUDA (a CPU-only torch)
        assert device == "cpu"
    monkeypatch.setenv("DPACE_GPUS", "")
    monkeypatch.setattr("dpace.gpus._proc_gpu_count", lambda: 0)
    monkeypatch.setattr("dpace.gpus._nvidia_smi_ids", lambda: [])
    with torch_device_slot(1, **quiet) as device:  # asked, but the machine has no GPU
        assert device == "cpu" and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_gpu_held_by_another_process_is_skipped_and_freed_when_it_dies(gpu_env):
    from dpace.gpus import gpu_slot

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys,time; from dpace.gpus import gpu_slot\n"
         "with gpu_slot(1, log=lambda *_: None) as ids:\n print(ids[0], flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        taken = holder.stdout.readline().strip()
        with gpu_slot(1, log=lambda *_: None) as ids:
            assert taken == "0" and ids == ["1"]
    finally:
        holder.kill()
        holder.wait()
    with gpu_slot(2, timeout_s=5, poll_s=0.05, log=lambda *_: None) as ids:  # the dead holder's lock is gone
        assert ids == ["0", "1"]


def test_scheduler_assigned_gpus_are_used_as_given(gpu_env, monkeypatch):
    import dpace.gpus
    import dpace.locks
    from dpace.gpus import gpu_slot

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr(dpace.locks.fcntl, "flock", lambda *a: pytest.fail("a lock was taken under a scheduler"))
    with gpu_slot(1, log=lambda *_: None) as ids:
        assert ids == ["3"] and os.environ["CUDA_VISIBLE_DEVICES"] == "3"
        assert not gpu_env.exists()  # no lock folder, no lock file


# ---------------------------------------------------------------------------------------------
# SGLang evaluation against a fake server process

FAKE_SERVER = textwrap.dedent('''
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    args = sys.argv[1:]
    def arg(name, default=None):
        return args[args.index(name) + 1] if name in args else default
    port = int(arg("--port"))
    spec = arg("--speculative-algorithm") == "DFLASH"
    block = int(arg("--speculative-num-draft-tokens", 0) or 0)
    with open(os.environ["FAKE_SGLANG_RECORD"], "a") as out:
        out.write(json.dumps(args) + "\\n")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self._send(200 if self.path == "/health" else 404, {})
        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids, sampling = request["input_ids"], request["sampling_params"]
            n = min(sampling["max_new_tokens"], 6)
            output = [(sum(ids) + 7 * i) % 50 + 10 for i in range(n)]
            # 3x faster per token with the drafter; sleeps long enough (60-180 ms a request) that HTTP and
            # scheduling overhead on a loaded 2-core machine cannot pull the measured ratio below 1.5.
            time.sleep(0.01 * n if spec else 0.03 * n)
            meta = {"completion_tokens": n, "prompt_tokens": len(ids), "e2e_latency": 0.0}
            if spec:  # 2 verify steps: one accepted 2 drafts (3 emitted), one accepted 2 (3 emitted)
                meta.update(spec_verify_ct=2, spec_accept_length=n / 2, spec_accept_histogram=[0, 0, 2])
            self._send(200, {"text": " ".join(map(str, output)), "output_ids": output, "meta_info": meta})

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
''')


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    script = tmp_path / "fake_sglang_server.py"
    script.write_text(FAKE_SERVER)
    record = tmp_path / "server_argv.jsonl"
    monkeypatch.setenv("DPACE_SGLANG_LAUNCH", f"{sys.executable} {script}")
    monkeypatch.setenv("FAKE_SGLANG_RECORD", str(record))
    monkeypatch.delenv("DPACE_SGLANG_ARGS", raising=False)
    return record


def _benchmarks(tmp_path) -> dict:
    rows = {
        "gsm8k": [{"id": "g1", "benchmark": "gsm8k", "turns": ["What is 2 + 2?"]},
                  {"id": "g2", "benchmark": "gsm8k", "turns": ["What is 3 + 5?"]}],
        "mt_bench": [{"id": "m1", "benchmark": "mt_bench", "turns": ["Write a haiku.", "Now a limerick."]}],
    }
    files = {}
    for name, items in rows.items():
        atomic_write_jsonl(tmp_path / f"{name}.jsonl", items)
        files[name] = tmp_path / f"{name}.jsonl"
    return files


def _fake_drafter(tmp_path, block_size=4) -> Path:
    folder = tmp_path / "drafter" / "epoch-1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"block_size": block_size, "dflash_config": {"block_size": block_size}}))
    return folder


def test_sglang_evaluation_writes_the_local_summary_schema(tmp_path, tiny_target_json, fake_sglang):
    from eval_calls import sglang as evaluate_sglang

    from dpace.evaluation.evaluate import BLOCK_COLUMNS, summarize

    drafter = _fake_drafter(tmp_path)
    out = tmp_path / "eval"
    kwargs = dict(temperatures=[0.0, 1.0], verification="hard-match", max_new_tokens=8, seed=0,
                  records_path=out / "records.jsonl", summary_path=out / "summary.json",
                  blocks_path=out / "blocks.csv", log_dir=out / "logs", startup_timeout_s=60)
    summary = evaluate_sglang(tiny_target_json, drafter, _benchmarks(tmp_path), **kwargs)

    servers = [json.loads(line) for line in fake_sglang.read_text().splitlines()]
    assert len(servers) == 2
    spec_args, ar_args = servers
    assert spec_args[spec_args.index("--speculative-algorithm") + 1] == "DFLASH"
    assert spec_args[spec_args.index("--speculative-draft-model-path") + 1] == str(drafter)
    assert spec_args[spec_args.index("--speculative-num-draft-tokens") + 1] == "4"
    assert "--speculative-algorithm" not in ar_args and ar_args[ar_args.index("--host") + 1] == "127.0.0.1"

    # Same keys as the in-process backend's summary rows, one row per (benchmark, temperature).
    local_keys = set(summarize([{
        "benchmark": "b", "id": "0", "temperature": 0.0, "verification": "hard-match", "prompt_index": 0,
        "block_size": 4, "turns": [{"turn": 0, "ar": {"time_per_output_token_s": 1.0}, "spec": {"time_per_output_token_s": 1.0,
                                                                  "num_output_tokens": 1},
                   "acceptance_lengths": [1], "greedy": None}],
    }])[0])
    assert json.loads((out / "summary.json").read_text()) == summary
    assert len(summary) == 4 and all(local_keys <= set(row) for row in summary)
    for row in summary:
        assert row["tau"] == pytest.approx(3.0)  # spec_accept_length = 6 tokens / 2 verify steps
        assert [r["tau"] for r in row["requests"]] == pytest.approx([3.0] * row["num_requests"])
        assert row["speedup"] > 1.5  # the fake drafter server is 3x faster per token
        assert row["acceptance_histogram"] == [0.0, 0.0, 0.0, 1.0, 0.0]  # every step emitted 3 tokens
        assert row["engine"] == "sglang"
        assert row["greedy_mismatches"] == (0 if row["temperature"] == 0 else None)
    mt = next(r for r in summary if r["benchmark"] == "mt_bench" and r["temperature"] == 0)
    assert mt["num_prompts"] == 1 and mt["num_requests"] == 2
    assert (out / "blocks.csv").read_text() == ",".join(BLOCK_COLUMNS) + "\n"  # SGLang exposes no per-block q

    # Resumed: every prompt is recorded, so no server is started at all.
    os.environ["DPACE_SGLANG_LAUNCH"] = "/nonexistent/sglang-must-not-start"
    assert evaluate_sglang(tiny_target_json, drafter, _benchmarks(tmp_path), **kwargs) == summary


def _evaluate_twice(tmp_path, target_json, fake_sglang, change):
    """Evaluate a fake drafter at T=0, apply ``change(out, drafter)``, evaluate again: the second
    run's summary and the argv of every server it started."""
    from eval_calls import sglang as evaluate_sglang

    drafter = _fake_drafter(tmp_path)
    out = tmp_path / "eval"
    kwargs = dict(temperatures=[0.0], verification="hard-match", max_new_tokens=8, seed=0,
                  records_path=out / "records.jsonl", summary_path=out / "summary.json",
                  blocks_path=out / "blocks.csv", log_dir=out / "logs", startup_timeout_s=60)
    benchmarks = _benchmarks(tmp_path)
    evaluate_sglang(target_json, drafter, benchmarks, **kwargs)
    change(out, drafter)
    fake_sglang.write_text("")
    summary = evaluate_sglang(target_json, drafter, benchmarks, **kwargs)
    return summary, [json.loads(line) for line in fake_sglang.read_text().splitlines()]


def test_sglang_evaluation_resumes_between_the_two_servers(tmp_path, tiny_target_json, fake_sglang):
    def die_after_one_autoregressive_record(out, drafter):  # the speculative phase had finished
        atomic_write_jsonl(out / "records.jsonl", list(read_jsonl(out / "records.jsonl"))[:1])

    summary, servers = _evaluate_twice(tmp_path, tiny_target_json, fake_sglang, die_after_one_autoregressive_record)
    assert len(servers) == 1 and "--speculative-algorithm" not in servers[0]  # only the baseline reran
    assert sum(r["num_prompts"] for r in summary) == 3


def test_sglang_evaluation_of_a_retrained_drafter_starts_over(tmp_path, tiny_target_json, fake_sglang):
    """The job reruns because its drafter changed: the old drafter's records must not stand for it."""
    def retrain(out, drafter):
        (drafter / "model.safetensors").write_bytes(b"retrained weights")

    summary, servers = _evaluate_twice(tmp_path, tiny_target_json, fake_sglang, retrain)
    assert len(servers) == 2 and "--speculative-algorithm" in servers[0]  # both phases ran again
    assert sum(r["num_prompts"] for r in summary) == 3
    assert len(list(read_jsonl(tmp_path / "eval" / "records.jsonl"))) == 3  # the old drafter's records are gone


def test_sglang_evaluation_of_a_reworded_prompt_decodes_it_again(tmp_path, tiny_target_json, fake_sglang):
    """One prompt's text changed between two runs with the same records: that prompt goes through both
    servers again, and its record is of the new text."""
    from dpace.evaluation.eval_records import prompt_checksum

    new_row = {"id": "g1", "benchmark": "gsm8k", "turns": ["What is 2 + 2 + 2?"]}

    def reword(out, drafter):
        atomic_write_jsonl(tmp_path / "gsm8k.jsonl", [new_row, {"id": "g2", "benchmark": "gsm8k",
                                                               "turns": ["What is 3 + 5?"]}])

    summary, servers = _evaluate_twice(tmp_path, tiny_target_json, fake_sglang, reword)
    assert len(servers) == 2 and "--speculative-algorithm" in servers[0]
    records = {r["id"]: r for r in read_jsonl(tmp_path / "eval" / "records.jsonl")}
    assert len(records) == 3 and records["g1"]["prompt_checksum"] == prompt_checksum(new_row)
    assert sum(r["num_prompts"] for r in summary) == 3


def test_sglang_server_that_dies_or_never_answers_fails_clearly(tmp_path):
    from dpace.evaluation.sglang_backend import free_port, sglang_server

    port = free_port()
    with pytest.raises(RuntimeError, match="exited with code 3.*boom"), sglang_server(
            [sys.executable, "-c", "print('boom'); raise SystemExit(3)"], port, tmp_path / "a.log", poll_s=0.05):
        pass
    with pytest.raises(RuntimeError, match="did not answer"), sglang_server(
            [sys.executable, "-c", "import time; time.sleep(30)"], port, tmp_path / "b.log", startup_timeout_s=0.5,
            poll_s=0.05):
        pass


def test_sglang_missing_gives_an_install_hint(monkeypatch):
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here")
    from dpace.evaluation.sglang_backend import launch_prefix
    from dpace.gpus import require_sglang

    monkeypatch.delenv("DPACE_SGLANG_LAUNCH", raising=False)
    with pytest.raises(RuntimeError, match=r"pip install -e \.\[gpu\]"):
        require_sglang()
    with pytest.raises(RuntimeError, match=r"pip install -e \.\[gpu\]"):
        launch_prefix()


# ---------------------------------------------------------------------------------------------
# SGLang generation


class _FakeEngine:
    calls: list = []

    def __init__(self, **kwargs):
        type(self).calls.append(("init", kwargs))

    def generate(self, input_ids, sampling_params):
        type(self).calls.append(("generate", len(input_ids), dict(sampling_params)))
        # SGLang's meta_info.finish_reason: "length" when max_new_tokens cut the answer
        reasons = ["length" if i % 2 == 0 else "stop" for i in range(len(input_ids))]
        return [{"text": f"{reason} answer with {len(ids)} prompt tokens", "meta_info": {"finish_reason": {"type": reason}}}
                for ids, reason in zip(input_ids, reasons, strict=True)]

    def shutdown(self):
        type(self).calls.append(("shutdown",))


def test_sglang_generation_is_batched_resumable_and_same_format(tmp_path, tiny_target_json, gpu_env, monkeypatch):
    from dpace.responses.generation import ResponseSettings, generate_responses

    fake = type(sys)("sglang")
    fake.Engine = _FakeEngine
    _FakeEngine.calls = []
    monkeypatch.setitem(sys.modules, "sglang", fake)
    prompts = [{"id": f"p{i}", "prompt": f"Tell me about {i}."} for i in range(5)]
    atomic_write_jsonl(tmp_path / "prompts.jsonl", prompts)
    scratch = tmp_path / "partial.jsonl"
    settings = ResponseSettings(backend="sglang", max_new_tokens=7, temperature=1.0, batch_size=3, seed=5,
                                dtype="bfloat16")
    import dpace.responses.generation as generation

    class Killed(generation.JsonlAppender):  # the job dies after its first answer is written
        def write(self, row):
            if self.path.exists() and self.path.read_text():
                raise KeyboardInterrupt
            super().write(row)

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(generation, "JsonlAppender", Killed)
        generate_responses(tiny_target_json, tmp_path / "prompts.jsonl", tmp_path / "out.jsonl", settings,
                           scratch_path=scratch)
    (resumed,) = read_jsonl(scratch)
    resumed["conversations"][1]["content"] = "earlier"  # marked, to see it kept
    scratch.write_text(json.dumps(resumed) + "\n")
    _FakeEngine.calls = []
    counts = generate_responses(tiny_target_json, tmp_path / "prompts.jsonl", tmp_path / "out.jsonl", settings,
                                scratch_path=scratch)
    assert counts == {"prompts": 5, "resumed": 1, "generated": 4, "skipped_too_long": 0, "dtype": "bfloat16"}
    rows = list(read_jsonl(tmp_path / "out.jsonl"))
    assert [r["id"] for r in rows] == [p["id"] for p in prompts]  # the prompts' order
    assert next(r for r in rows if r["id"] == resumed["id"]) == resumed
    assert rows[0]["conversations"][0] == {"role": "user", "content": "Tell me about 0."}
    answers = [row for row in rows if row["id"] != resumed["id"]]  # resumed from the scratch file
    assert {row.get("truncated", False) for row in answers} == {True, False}
    for row in answers:
        assert row.get("truncated", False) == row["conversations"][1]["content"].startswith("length")
    generates = [c for c in _FakeEngine.calls if c[0] == "generate"]
    assert [c[1] for c in generates] == [3, 1]
    assert generates[0][2]["temperature"] == 1.0 and generates[0][2]["max_new_tokens"] == 7
    assert _FakeEngine.calls[0][1]["random_seed"] == 5 and _FakeEngine.calls[-1] == ("shutdown",)
    assert _FakeEngine.calls[0][1]["dtype"] == "bfloat16"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # restored after the job's GPU slot


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None or not torch.cuda.is_available(),
                    reason="needs SGLang and a CUDA GPU")
def test_real_sglang_engine_generates(tmp_path, tiny_target_json, monkeypatch):
    from dpace.responses.generation import ResponseSettings, generate_responses

    monkeypatch.setenv("DPACE_LOCK_DIR", str(tmp_path / "locks"))
    atomic_write_jsonl(tmp_path / "prompts.jsonl", [{"id": "a", "prompt": "Hello"}])
    counts = generate_responses(tiny_target_json, tmp_path / "prompts.jsonl", tmp_path / "out.jsonl",
                                ResponseSettings(backend="sglang", max_new_tokens=4, batch_size=1))
    assert counts["generated"] == 1


def test_sglang_generation_without_sglang_says_how_to_install(tmp_path, tiny_target_json, monkeypatch):
    from dpace.responses.generation import ResponseSettings, generate_responses

    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang -> ImportError
    atomic_write_jsonl(tmp_path / "prompts.jsonl", [{"id": "a", "prompt": "Hello"}])
    with pytest.raises(RuntimeError, match=r"pip install -e \.\[gpu\]"):
        generate_responses(tiny_target_json, tmp_path / "prompts.jsonl", tmp_path / "out.jsonl",
                           ResponseSettings(backend="sglang"))


# ---------------------------------------------------------------------------------------------
# SpecForge


def paper_config() -> dict:
    return yaml.safe_load((REPO / "workflow" / "configs" / "paper.yaml").read_text())


def _settings(variant, config) -> dict:
    train = config["train"]
    return {**variant.train_settings(), "num_anchors": train["num_anchors"], "learning_rate": train["learning_rate"],
            "warmup_ratio": train["warmup_ratio"], "max_grad_norm": train["max_grad_norm"],
            "micro_batch_size": train["micro_batch_size"], "grad_accumulation": train["grad_accumulation"],
            "objective_chunk_blocks": train["objective_chunk_blocks"], "weight_decay": train["weight_decay"],
            "seed": config["seed"]}


def test_every_paper_variant_gives_a_valid_specforge_run():
    from specforge.algorithms.contracts import FeatureMode
    from specforge.application.composition import bind_run

    from dpace.config import all_variants
    from dpace.training.specforge_backend import algorithm_registration
    from dpace.training.specforge_run import (
        ALGORITHM_NAME,
        ObjectiveSpec,
        RunPaths,
        plan_topology,
        run_config,
        validate_run_config,
    )

    config = paper_config()
    variants = all_variants(config)
    assert len(variants) >= 30
    topology = plan_topology(["0", "1"], config["train"]["micro_batch_size"], config["train"]["grad_accumulation"])
    for (target, variant_id), variant in variants.items():
        settings = _settings(variant, config)
        paths = RunPaths(run_id=variant_id, target_path=config["targets"][target]["source"],
                         draft_config_path="/x/draft.json", prompts_path="/x/prompts.jsonl", output_dir="/x/out",
                         control_dir="/x/control", cache_dir="/x/cache")
        run = run_config(
            paths=paths, settings={**settings, "precision": config["train"]["precision"],
                                   "attention_backend": config["train"]["attention_backend"]},
            num_prompts=100_000, topology=topology, mask_token_id=config["targets"][target]["mask_token_id"],
            ports=[30001, 30002, 30003, 30004], max_length=config["features"]["max_seq_length"],
        )
        cfg = validate_run_config(run)  # SpecForge 0.2.0's own strict schema
        assert cfg.training.strategy == ALGORITHM_NAME and cfg.mode == "online"
        assert (cfg.training.batch_size, cfg.training.accumulation_steps, cfg.deployment.trainer.nproc_per_node) \
            == (2, 2, 1)
        assert cfg.training.num_epochs == variant.epochs and cfg.training.learning_rate == 6e-4
        assert cfg.training.num_anchors == 512 and cfg.training.warmup_ratio == 0.04
        assert cfg.training.max_grad_norm == 1.0 and cfg.training.lr_scheduler == "cosine"
        assert cfg.training.attention_backend == "flex_attention" and cfg.model.torch_dtype == "bfloat16"
        assert cfg.training.save_interval == 100_000 // 4 and cfg.data.max_length == 2048
        assert cfg.model.mask_token_id == {"qwen3-4b": 151669, "qwen3-8b": 151669, "llama3.1-8b": 128002}[target]
        registration = algorithm_registration(ObjectiveSpec(variant.objective, dict(variant.hparams),
                                                            variant.normalization))
        bind_run(cfg, registration)  # SpecForge's algorithm-aware validation of the same run
        streaming = registration.spec.feature_contracts[1]
        assert streaming.mode is FeatureMode.STREAMING
        assert ("target_last_hidden_states" in streaming.required_tensors) == (
            variant.objective in ("dpace-target-prob", "dpakl", "pard2-cat"))


def test_topology_keeps_the_effective_batch():
    from dpace.training.specforge_run import plan_topology

    assert plan_topology(["0", "1"], 2, 2).quantum == 4
    eight = plan_topology([str(i) for i in range(8)], 2, 2)
    assert eight.capture_gpus == ("0", "1") and len(eight.trainer_gpus) == 4 and eight.quantum == 4
    assert plan_topology(["5", "7", "9"], 2, 2).trainer_gpus == ("7", "9")
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        plan_topology(["0"], 2, 2)


def _write_run(tmp_path, tiny_target_json, features_dir, objective="topk-prefix", hparams=None, gpus=("0", "1")):
    from transformers import AutoConfig

    from dpace.features import load_features
    from dpace.targets import model_location
    from dpace.training.specforge_run import (
        ObjectiveSpec,
        RunPaths,
        accepted_prompts,
        plan_topology,
        run_config,
        write_draft_config,
        write_prompts,
    )

    path, _ = model_location(tiny_target_json)
    spec = ObjectiveSpec(objective, hparams or {}, None).resolved(4)
    draft = write_draft_config(tmp_path / "draft.json", AutoConfig.from_pretrained(path), depth=2, block_size=4,
                               layer_ids=load_features(features_dir).layer_ids, mask_token_id=0, spec=spec)
    written = write_prompts(features_dir, tmp_path / "prompts.jsonl")
    num = accepted_prompts(tmp_path / "prompts.jsonl", 256)
    settings = {"objective": objective, "objective_hparams": hparams or {}, "normalization": None, "depth": 2,
                "block_size": 4, "epochs": 2, "num_anchors": 8, "learning_rate": 1e-3, "warmup_ratio": 0.04,
                "max_grad_norm": 1.0, "objective_chunk_blocks": 0, "seed": 0}
    paths = RunPaths(run_id="v", target_path=path, draft_config_path=str(draft),
                     prompts_path=str(tmp_path / "prompts.jsonl"), output_dir=str(tmp_path / "out"),
                     control_dir=str(tmp_path / "control"), cache_dir=str(tmp_path / "cache"))
    run = run_config(paths=paths, settings=settings, num_prompts=num, topology=plan_topology(list(gpus), 2, 2),
                     mask_token_id=0, max_length=256)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    return tmp_path / "run.yaml", written, num


def test_specforge_launch_plan_reenters_dpace_with_three_features(tmp_path, tiny_target_json, features_dir, capsys):
    from dpace.training.specforge_backend import main

    run_yaml, _, _ = _write_run(tmp_path, tiny_target_json, features_dir, gpus=("0", "1", "2"))
    assert main(["train", "--config", str(run_yaml), "--plan"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["kind"] == "managed_supervisor"
    producer, consumer = (c["argv"] for c in plan["commands"])
    assert producer[1:4] == ["-m", "dpace.training.specforge_backend", "train"] and producer[-1] == "producer"
    # Two trainer ranks: torchrun runs this entry point again (the stock CLI would not know "dpace").
    assert consumer[1:4] == ["-m", "torch.distributed.run", "--no-python"]
    assert consumer[consumer.index("--nproc_per_node") + 1] == "2"
    assert consumer[-7:-4] == ["-m", "dpace.training.specforge_backend", "train"]
    capture = plan["services"][1]["command"]
    argv = capture["argv"]
    layers = argv[argv.index("--spec-capture-aux-layer-ids") + 1: argv.index("--host")]
    assert layers == ["1", "3"]  # the features' layers, not one per draft layer
    assert capture["env"]["CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.parametrize("objective,hparams", [("topk-prefix", {"k": 2}), ("dpakl", {"alpha": 0.3})])
def test_registered_provider_builds_and_steps_our_objective(tmp_path, tiny_target_json, features_dir, objective,
                                                            hparams):
    """SpecForge's own model providers and train step, on CPU, train exactly ObjectiveDFlashModel."""
    from specforge.application import resolve_run
    from specforge.config.schema import Config
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.model_loading import resolve_draft_config
    from transformers import AutoConfig, AutoTokenizer

    from dpace.features import load_features
    from dpace.training.online_model import ObjectiveDFlashModel
    from dpace.training.specforge_backend import objective_of_run, registry

    run_yaml, _, _ = _write_run(tmp_path, tiny_target_json, features_dir, objective, hparams)
    raw = yaml.safe_load(run_yaml.read_text())
    raw["model"]["torch_dtype"] = "float32"
    raw["training"]["attention_backend"] = "sdpa"
    cfg = Config.model_validate(raw)
    run = resolve_run(cfg, registry(objective_of_run(run_yaml)))
    providers = run.algorithm.providers
    draft_config = resolve_draft_config(cfg, provider=providers.model.draft_config)
    assert draft_config.num_hidden_layers == 2 and draft_config.dflash_config["target_layer_ids"] == [1, 3]
    draft = providers.model.build_draft(cfg, draft_config)
    path = cfg.model.target_model_path
    parts = providers.model.build_training_model(cfg, draft, draft_config, AutoConfig.from_pretrained(path),
                                                 AutoTokenizer.from_pretrained(path))
    model = parts.model
    assert isinstance(model, ObjectiveDFlashModel) and model.objective == objective
    assert all(model.objective_hparams[k] == v for k, v in hparams.items())
    contract = providers.step.resume_contract(cfg, draft, model)
    assert json.loads(contract["dpace_objective"])["objective"] == objective

    features = load_features(features_dir)
    item = features.sequence(0)
    tensors = {"input_ids": item["input_ids"].long()[None], "loss_mask": item["loss_mask"].float()[None],
               "hidden_states": item["hidden"].float()[None],
               "target_last_hidden_states": item["last_hidden"].float()[None]}
    step = providers.step.build(model)
    torch.manual_seed(0)
    output = step.forward_loss(TrainBatch(sample_ids=["0"], strategy="dpace", tensors=tensors))
    torch.manual_seed(0)
    direct, _, _ = model(input_ids=tensors["input_ids"], hidden_states=tensors["hidden_states"],
                         loss_mask=tensors["loss_mask"], target_last_hidden_states=tensors["target_last_hidden_states"])
    assert torch.isfinite(output.loss) and output.loss.item() == pytest.approx(direct.item())


FAKE_SPECFORGE = textwrap.dedent('''
    import json, os, shutil, sys
    import yaml
    args = sys.argv[1:]
    record = os.environ["FAKE_SPECFORGE_RECORD"]
    with open(record, "a") as out:
        out.write(json.dumps(args) + "\\n")
    if args[0] == "train":
        config = args[args.index("--config") + 1]
        shutil.copy(config, os.path.dirname(record) + "/seen_run.yaml")
        run = yaml.safe_load(open(config))
        t = run["training"]
        n = sum(1 for _ in open(run["data"]["prompts_path"]))
        quantum = t["batch_size"] * t["accumulation_steps"] * run["deployment"]["trainer"]["nproc_per_node"]
        total = n * t["num_epochs"] // quantum
        for step in range(1, total + 1):
            print(f"step {step}: {{'train/loss': {10.0 / step}, 'train/accuracy': {step / total}, "
                  f"'train/lr': 0.001, 'train/weight_per_position': [0.0, 0.5, 0.3, 0.2]}}", flush=True)
            if step % t["save_interval"] == 0 or step == total:
                os.makedirs(f"{run['output_dir']}/{run['run_id']}-step{step}")
    elif args[0] == "export":
        target = args[args.index("--output-dir") + 1]
        os.makedirs(target)
        shutil.copy(args[args.index("--draft-config") + 1], target + "/config.json")
        open(target + "/from_checkpoint", "w").write(args[args.index("--checkpoint") + 1])
''')


def test_train_with_specforge_launches_exports_and_summarises(tmp_path, tiny_target_json, features_dir, monkeypatch):
    from dpace.features import load_features
    from dpace.training.specforge_backend import train_with_specforge
    from dpace.training.specforge_run import OBJECTIVE_KEY

    script = tmp_path / "specforge"
    script.write_text(f"#!{sys.executable}\n" + FAKE_SPECFORGE)
    script.chmod(0o755)
    record = tmp_path / "argv.jsonl"
    monkeypatch.setenv("DPACE_SPECFORGE_CLI", str(script))
    monkeypatch.setenv("FAKE_SPECFORGE_RECORD", str(record))
    settings = {"objective": "dpace", "objective_hparams": {"alpha": 0.3}, "normalization": None, "depth": 2,
                "block_size": 4, "epochs": 2, "num_anchors": 8, "learning_rate": 1e-3, "warmup_ratio": 0.04,
                "max_grad_norm": 1.0, "micro_batch_size": 2, "grad_accumulation": 2, "objective_chunk_blocks": 0,
                "weight_decay": 0.0, "seed": 0}
    out = tmp_path / "drafters" / "dpace-alpha0.3-d2-b4-e2"
    log = open(tmp_path / "train.log", "w")
    summary = train_with_specforge(settings, target_json=tiny_target_json, features_dir=features_dir, out_dir=out,
                                   scratch_dir=tmp_path / "scratch", gpus=["4", "6"], mask_token="<empty_output>",
                                   max_length=256, log=log)
    log.close()
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls[0][:2] == ["train", "--config"]
    assert [c[0] for c in calls[1:]] == ["export", "export"] and all(c[1:3] == ["--to", "hf"] for c in calls[1:])
    run = yaml.safe_load((tmp_path / "seen_run.yaml").read_text())
    managed = run["deployment"]["disaggregated"]["managed_local"]
    assert managed["capture_servers"][0]["cuda_visible_devices"] == ["4"]
    assert managed["trainer_cuda_visible_devices"] == ["6"]  # the job's physical GPUs
    draft = json.loads(Path(run["model"]["draft_model_config"]).read_text())
    assert draft[OBJECTIVE_KEY] == {"objective": "dpace", "hparams": {"alpha": 0.3}, "normalization": None}
    prompts = list(read_jsonl(run["data"]["prompts_path"]))
    features = load_features(features_dir)
    assert len(prompts) == len(features) == 10
    assert prompts[3]["input_ids"] == features.sequence(3)["input_ids"].tolist()  # our tokenisation, as is

    steps_per_epoch = 10 // 4
    assert summary["steps_per_epoch"] == steps_per_epoch and summary["steps"] == 10 * 2 // 4
    for epoch, step in ((1, steps_per_epoch), (2, summary["steps"])):
        exported = out / f"epoch-{epoch}"
        assert (exported / "from_checkpoint").read_text().endswith(f"v-step{step}".replace("v", out.name))
    assert not list((tmp_path / "scratch" / "specforge").glob("*-step*"))  # checkpoints removed after export
    rows = list(read_jsonl(out / "steps.jsonl"))  # the local backend's layout: 0-based steps
    assert [r["global_step"] for r in rows] == list(range(summary["steps"]))
    assert [(r["epoch"], r["step"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    assert rows[-1]["loss"] == pytest.approx(10.0 / summary["steps"]) and rows[-1]["progress"] == 1.0
    assert rows[0]["weight_per_position"] == [0.0, 0.5, 0.3, 0.2] and rows[0]["lr"] == 0.001
    assert json.loads((out / "summary.json").read_text())["backend"] == "specforge"
    assert summary["final_accuracy"] == 1.0 and summary["hparams"] == {"alpha": 0.3}


def test_specforge_backend_refuses_one_gpu(tmp_path, tiny_target_json, features_dir):
    from dpace.training.specforge_backend import train_with_specforge

    settings = {"objective": "dpace", "objective_hparams": {}, "normalization": None, "depth": 1, "block_size": 4,
                "epochs": 1, "num_anchors": 8, "learning_rate": 1e-3, "warmup_ratio": 0.04, "max_grad_norm": 1.0,
                "micro_batch_size": 2, "grad_accumulation": 2, "objective_chunk_blocks": 0, "seed": 0}
    with pytest.raises(ValueError, match="train.backend=local"):
        train_with_specforge(settings, target_json=tiny_target_json, features_dir=features_dir,
                             out_dir=tmp_path / "o", scratch_dir=tmp_path / "s", gpus=["0"],
                             mask_token="<empty_output>", max_length=256)


def _gpu_check_module():
    from dpace import gpu_check

    return gpu_check


@pytest.mark.parametrize("cpu", [False, True])
def test_gpu_check_config_is_valid_and_trains_like_the_paper_on_a_gpu(tmp_path, monkeypatch, cpu):
    from dpace.config import validate_config

    gpu_check = _gpu_check_module()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # no SGLang, no Mooncake
    backends, notes = gpu_check.plan_backends(gpus=0 if cpu else 2, want_specforge=True, cpu=cpu)
    assert backends == {"responses": "transformers", "train": "local", "eval": "local"}
    assert any("SpecForge training skipped" in note for note in notes)
    config = yaml.safe_load(gpu_check.write_config(tmp_path, tmp_path / "mirror", backends, cpu=cpu).read_text())
    validate_config(config)  # the smoke config plus the check's overrides still passes the schema
    expected = ("fp32", "sdpa") if cpu else ("bf16", "flex_attention")
    assert (config["train"].get("precision", "fp32"), config["train"].get("attention_backend", "sdpa")) == expected
    assert config["eval"].get("dtype", "float32") == ("float32" if cpu else "bfloat16")  # the paper's protocol
    assert config["targets"][config["main_target"]]["hidden_size"] // config["targets"][config["main_target"]]["num_heads"] == 64


def test_gpu_check_config_with_the_engines_drops_the_local_only_window(tmp_path):
    from dpace.config import validate_config

    gpu_check = _gpu_check_module()
    engines = {"responses": "sglang", "train": "specforge", "eval": "sglang"}
    config = yaml.safe_load(gpu_check.write_config(tmp_path, MIRROR, engines).read_text())
    validate_config(config)
    assert config["train"]["sliding_window"] == 0
    local = {"responses": "transformers", "train": "local", "eval": "local"}
    assert yaml.safe_load(gpu_check.write_config(tmp_path, MIRROR, local).read_text())["train"]["sliding_window"] > 0


def test_gpu_check_quick_cut_takes_a_tokenizer_folder_and_plans_few_jobs(tmp_path):
    from dpace.config import validate_config

    gpu_check = _gpu_check_module()
    backends = {"responses": "transformers", "train": "local", "eval": "local"}
    path = gpu_check.write_config(tmp_path, MIRROR, backends, tokenizer=tmp_path / "tok")
    config = yaml.safe_load(path.read_text())
    validate_config(config)
    assert config["targets"][config["main_target"]]["tokenizer"] == str(tmp_path / "tok")
    assert config["data"]["benchmarks"] == ["gsm8k", "mt_bench"]  # single- and multi-turn prompts
    assert config["experiments"]["main"]["objectives"] == ["dpace"]  # DFlash trains in the training comparison
    assert len(config["experiments"]["main"]["depths"]) == 1
    # a target whose greedy answers a drafter can learn, and training long enough to learn them
    assert config["targets"][config["main_target"]]["logit_scale"] == 2.0
    steps = sum(config["data"]["train_prompts"].values()) // 4 * config["train"]["epochs"]
    assert steps >= 32
    (tmp_path / "full").mkdir()
    full = yaml.safe_load(gpu_check.write_config(tmp_path / "full", MIRROR, backends, full=True).read_text())
    smoke = yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())
    assert full["data"]["benchmarks"] == smoke["data"]["benchmarks"] and "tokenizer" not in full["targets"]["tiny"]
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--configfile",
         str(path), "--replace-workflow-config", "-n", "results/table_main.tex"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    total = re.search(r"^total\s+(\d+)$", result.stdout, re.MULTILINE)
    # 2 benchmarks, target, prompts, baseline, answers, features, train, evaluate, speedup timing, metrics, table
    assert total and int(total.group(1)) <= 12, result.stdout[-2000:]


def test_gpu_check_reads_evaluation_paths_like_the_report(tmp_path):
    from dpace.paths import eval_location

    gpu_check = _gpu_check_module()
    path = tmp_path / "results" / "eval" / "tiny" / "dpace-alpha0.5-d1-b4-e2" / "epoch-2" / "full" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([{"temperature": 0.0, "tau": 1.5, "speedup": 0.5, "greedy_failures": 0},
                                {"temperature": 0.0, "tau": 2.5, "speedup": 1.5, "greedy_failures": 1}]))
    assert eval_location(path) == ("tiny", "dpace-alpha0.5-d1-b4-e2", 2, "full")
    [row] = gpu_check.eval_results(tmp_path)
    assert (row["variant"], row["suite"], row["tau"], row["SR"], row["greedy_failures"]) == (
        "dpace-alpha0.5-d1-b4-e2", "full", 2.0, 1.0, 1)
    # a replayed evaluation (no speedup of its own) takes SR from the timing job's records, per temperature
    path.write_text(json.dumps([{"temperature": t, "tau": 2.0, "speedup": None} for t in (0.0, 1.0)]))
    timing = pd.DataFrame([
        {"target": "tiny", "temperature": t, "benchmark": b, "drafter": d, "time_per_output_token_s": s}
        for t, scale in ((0.0, 1.0), (1.0, 2.0)) for b in ("gsm8k", "mt_bench")
        for d, s in (("autoregressive", 0.3 * scale), ("dpace-alpha0.5-d1-b4-e2", 0.1 * scale * (b == "gsm8k" or 2)))])
    timing.to_csv(tmp_path / "results" / "eval" / "tiny" / "timing-main.csv", index=False)
    rows = gpu_check.eval_results(tmp_path)
    assert [(row["T"], row["SR"]) for row in rows] == [(0.0, pytest.approx(2.25)), (1.0, pytest.approx(2.25))]


def test_sglang_rows_take_tau_from_sglangs_accept_length_not_from_step_lengths():
    """SGLang's own accept length defines tau, for the row and for every request the intervals resample."""
    from dpace.evaluation.sglang_backend import summarize_sglang

    def turn(turn_index, accept_length, lengths):
        return {"turn": turn_index, "ar": {"time_per_output_token_s": 2.0},
                "spec": {"time_per_output_token_s": 1.0, "num_output_tokens": sum(lengths)},
                "acceptance_lengths": lengths, "spec_accept_length": accept_length, "has_histogram": True,
                "greedy": None}

    record = {"benchmark": "b", "id": "7", "temperature": 1.0, "verification": "hard-match", "prompt_index": 0,
              "block_size": 4, "turns": [turn(0, 2.5, [1, 1]), turn(1, 3.5, [4, 4])]}
    (row,) = summarize_sglang([record])
    assert [r["tau"] for r in row["requests"]] == [2.5, 3.5]  # not the step-length means 1 and 4
    assert row["tau"] == pytest.approx(3.0)
    assert row["engine"] == "sglang"
