"""The training loop: it learns, it resumes bit-for-bit after SIGKILL, and it refuses NaNs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dpace.features import compute_features
from dpace.io import atomic_write_jsonl
from dpace.training import TrainConfig, train_drafter

CONVERSATIONS = [
    {"id": str(i), "conversations": [
        {"role": "user", "content": f"Question number {i}: tell me about topic {i * 7}."},
        {"role": "assistant", "content": " ".join(["the answer is", str(i)] * (3 + i % 4))},
    ]}
    for i in range(12)
]


@pytest.fixture(scope="module")
def features_dir(tmp_path_factory, tiny_target_json):
    folder = tmp_path_factory.mktemp("features")
    atomic_write_jsonl(folder / "conversations.jsonl", CONVERSATIONS)
    compute_features(tiny_target_json, folder / "conversations.jsonl", folder / "f", layer_ids=[1, 3], max_seq_length=256)
    return folder / "f"


def small_config(**overrides) -> TrainConfig:
    settings = dict(objective="dpace", objective_hparams={"alpha": 0.5}, depth=1, block_size=4, num_anchors=6,
                    epochs=2, learning_rate=3e-3, micro_batch_size=2, grad_accumulation=2, save_every_steps=2,
                    seed=3, threads=1)
    settings.update(overrides)
    return TrainConfig(**settings)


def weights(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


def test_training_lowers_the_loss_and_writes_loadable_epochs(tmp_path, tiny_target_json, features_dir):
    from dpace.drafter import load_drafter

    summary = train_drafter(small_config(epochs=3), target_json=tiny_target_json, features_dir=features_dir,
                            out_dir=tmp_path / "run", scratch_dir=tmp_path / "scratch")
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == summary["steps"] == 3 * 3  # 12 sequences / (2 x 2) per step, 3 epochs
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert [s["global_step"] for s in steps] == list(range(9))
    lrs = [s["lr"] for s in steps]
    assert max(lrs) == pytest.approx(3e-3, rel=1e-6) and lrs[-1] < lrs[1]  # warmup then cosine decay
    for epoch in (1, 2, 3):
        model = load_drafter(tmp_path / "run" / f"epoch-{epoch}")
        assert model.block_size == 4 and model.target_layer_ids == [1, 3]
    assert not (tmp_path / "scratch" / "state.pt").exists()  # a finished run leaves no resumable state


KILLER = """
import os, signal, sys, torch
from dpace.training import TrainConfig, train_drafter
kill_after, config = int(sys.argv[1]), TrainConfig(**__import__("json").loads(sys.argv[2]))
original, done = torch.optim.AdamW.step, [0]
def step(self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    done[0] += 1
    if done[0] == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no atexit: as a cluster preemption
    return result
torch.optim.AdamW.step = step
train_drafter(config, target_json=sys.argv[3], features_dir=sys.argv[4], out_dir=sys.argv[5], scratch_dir=sys.argv[6])
"""


def test_sigkilled_training_resumes_to_identical_weights(tmp_path, tiny_target_json, features_dir):
    config = small_config()
    reference = tmp_path / "reference"
    train_drafter(config, target_json=tiny_target_json, features_dir=features_dir, out_dir=reference,
                  scratch_dir=tmp_path / "scratch-reference")

    interrupted, scratch = tmp_path / "interrupted", tmp_path / "scratch"
    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLER), "5", json.dumps(asdict(config)), str(tiny_target_json),
         str(features_dir), str(interrupted), str(scratch)],
        capture_output=True, text=True, timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (scratch / "state.pt").exists()  # saved at step 4 (every 2 steps)
    assert (interrupted / "epoch-1").exists() and not (interrupted / "epoch-2").exists()

    train_drafter(config, target_json=tiny_target_json, features_dir=features_dir, out_dir=interrupted,
                  scratch_dir=scratch)
    final_reference, final_resumed = weights(reference / "epoch-2"), weights(interrupted / "epoch-2")
    assert final_reference.keys() == final_resumed.keys()
    for name in final_reference:
        assert torch.equal(final_reference[name], final_resumed[name]), name
    losses = lambda run: [json.loads(line)["loss"] for line in (run / "steps.jsonl").read_text().splitlines()]  # noqa: E731
    assert losses(reference) == losses(interrupted)


def test_non_finite_loss_stops_training_without_a_checkpoint(tmp_path, tiny_target_json, features_dir):
    corrupted = tmp_path / "features"
    corrupted.mkdir()
    for path in features_dir.iterdir():
        if path.suffix == ".safetensors":
            tensors = load_file(str(path))
            tensors["hidden"][:] = float("nan")
            save_file(tensors, str(corrupted / path.name))
        else:
            (corrupted / path.name).write_bytes(path.read_bytes())
    with pytest.raises(FloatingPointError, match=r"non-finite loss nan at step 0 \(objective dflash\)"):
        train_drafter(small_config(objective="dflash", objective_hparams={"gamma": 2.0}), target_json=tiny_target_json,
                      features_dir=corrupted, out_dir=tmp_path / "run", scratch_dir=tmp_path / "scratch")
    assert not list((tmp_path / "run").glob("epoch-*"))


def test_objectives_needing_the_target_train_from_cached_last_hidden(tmp_path, tiny_target_json, features_dir):
    summary = train_drafter(small_config(objective="dpakl", epochs=1), target_json=tiny_target_json,
                            features_dir=features_dir, out_dir=tmp_path / "run", scratch_dir=tmp_path / "scratch")
    assert summary["objective"] == "dpakl" and summary["final_loss"] > 0


def test_online_features_train_like_cached_ones(tmp_path, tiny_target_json, features_dir):
    online = tmp_path / "online"
    atomic_write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS)
    compute_features(tiny_target_json, tmp_path / "c.jsonl", online, layer_ids=[1, 3], max_seq_length=256, mode="online")
    config = small_config(epochs=1)
    cached = train_drafter(config, target_json=tiny_target_json, features_dir=features_dir, out_dir=tmp_path / "a",
                           scratch_dir=tmp_path / "sa")
    live = train_drafter(config, target_json=tiny_target_json, features_dir=online, out_dir=tmp_path / "b",
                         scratch_dir=tmp_path / "sb")
    # Cached features are bf16, online ones full precision: same run up to storage rounding.
    assert live["final_loss"] == pytest.approx(cached["final_loss"], rel=5e-2)


def test_bf16_autocast_trains_like_fp32_with_fp32_master_weights(tmp_path, tiny_target_json, features_dir):
    """The paper's GPU precision, run here with CPU autocast: the same run up to bf16 rounding."""
    runs = {}
    for precision in ("fp32", "bf16"):
        train_drafter(small_config(epochs=1, precision=precision), target_json=tiny_target_json,
                      features_dir=features_dir, out_dir=tmp_path / precision, scratch_dir=tmp_path / f"s{precision}")
        runs[precision] = [json.loads(line)["loss"] for line in (tmp_path / precision / "steps.jsonl").read_text().splitlines()]
    assert runs["bf16"] == pytest.approx(runs["fp32"], rel=2e-2)
    assert runs["bf16"] != runs["fp32"]  # autocast really ran the matmuls in bf16
    assert all(t.dtype == torch.float32 for t in weights(tmp_path / "bf16" / "epoch-1").values())


def test_unsupported_precision_or_attention_is_refused_before_training(tmp_path, tiny_target_json, features_dir):
    kwargs = dict(target_json=tiny_target_json, features_dir=features_dir, out_dir=tmp_path / "run",
                  scratch_dir=tmp_path / "scratch")
    with pytest.raises(ValueError, match=r"precision 'fp16'; valid: fp32, bf16"):
        train_drafter(small_config(precision="fp16"), **kwargs)
    with pytest.raises(ValueError, match=r"flex_attention trains on CUDA only .* use sdpa here"):
        train_drafter(small_config(attention_backend="flex_attention"), **kwargs)
    assert not (tmp_path / "run" / "steps.jsonl").exists()


def test_drafter_init_target_starts_training_from_the_targets_top_layer(tmp_path, tiny_target_json, features_dir):
    from dpace.targets import load_target

    target, _ = load_target(tiny_target_json)
    top = target.model.layers[-1].state_dict()
    trained = {}
    for init in ("random", "target"):
        # A learning rate so small that one epoch leaves the weights where they started.
        train_drafter(small_config(epochs=1, learning_rate=1e-12, drafter_init=init), target_json=tiny_target_json,
                      features_dir=features_dir, out_dir=tmp_path / init, scratch_dir=tmp_path / f"scratch-{init}")
        trained[init] = weights(tmp_path / init / "epoch-1")
    for name, tensor in top.items():
        torch.testing.assert_close(trained["target"][f"layers.0.{name}"], tensor, rtol=0, atol=1e-9)
        if name.endswith("proj.weight"):  # a random target's norms are ones, as a fresh drafter's
            assert not torch.allclose(trained["random"][f"layers.0.{name}"], tensor), name
    with pytest.raises(ValueError, match="drafter_init 'pretrained'"):
        train_drafter(small_config(drafter_init="pretrained"), target_json=tiny_target_json, features_dir=features_dir,
                      out_dir=tmp_path / "bad", scratch_dir=tmp_path / "scratch-bad")
