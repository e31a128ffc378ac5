"""The training loop: it learns, it resumes bit-for-bit after SIGKILL, and it refuses NaNs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dpace.features import FeatureSettings, compute_features
from dpace.io import atomic_write_jsonl
from dpace.training.loop import TrainConfig, train_drafter

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
    compute_features(tiny_target_json, folder / "conversations.jsonl", folder / "f",
                     FeatureSettings(target_layer_ids=[1, 3], max_seq_length=256))
    return folder / "f"


def small_config(**overrides) -> TrainConfig:
    settings = dict(objective="dpace", objective_hparams={"alpha": 0.5}, depth=1, block_size=4, num_anchors=6,
                    epochs=2, learning_rate=3e-3, micro_batch_size=2, grad_accumulation=2, save_every_steps=2,
                    seed=3, threads=1)
    settings.update(overrides)
    return TrainConfig.from_config({}, **settings)  # the schema's defaults for the rest


def weights(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


def test_training_lowers_the_loss_and_writes_loadable_epochs(tmp_path, tiny_target_json, features_dir):
    from dpace.training.drafter import load_drafter

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
from dpace.training.loop import TrainConfig, train_drafter
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


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def count_optimizer_steps(monkeypatch) -> list[int]:
    taken, original = [], torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        taken.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    return taken


@pytest.mark.slow  # a training subprocess and two full runs per thread count
@pytest.mark.parametrize("threads", [1, 2])
def test_sigkilled_training_resumes_where_it_stopped_to_identical_weights(
    tmp_path, tiny_target_json, features_dir, monkeypatch, restore_threads, threads
):
    config = small_config(threads=threads)  # 3 steps per epoch, 6 in all; state saved every 2 steps
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
    assert torch.load(scratch / "state.pt", weights_only=True)["global_step"] == 4  # saved after step 4
    assert (interrupted / "epoch-1").exists() and not (interrupted / "epoch-2").exists()
    # Nothing the next stage reads looks finished: the step log is still in the scratch folder.
    assert not (interrupted / "steps.jsonl").exists() and not (interrupted / "summary.json").exists()
    epoch_1_written = (interrupted / "epoch-1" / "model.safetensors").stat().st_mtime_ns
    # What a kill during a checkpoint's write leaves (a cluster's time limit can land there): the rerun removes it.
    killed_write = interrupted / ".epoch-2.k1ll3d.tmp"
    killed_write.mkdir()
    (killed_write / "model.safetensors").write_bytes(b"part of the weights")

    taken = count_optimizer_steps(monkeypatch)
    summary = train_drafter(config, target_json=tiny_target_json, features_dir=features_dir, out_dir=interrupted,
                            scratch_dir=scratch)
    # The rerun continued from the saved step: it took only the 2 steps after it, and left epoch 1 alone.
    assert len(taken) == summary["steps"] - 4 == 2
    assert (interrupted / "epoch-1" / "model.safetensors").stat().st_mtime_ns == epoch_1_written
    assert sorted(p.name for p in interrupted.iterdir()) == sorted(p.name for p in reference.iterdir())
    for epoch in ("epoch-1", "epoch-2"):
        final_reference, final_resumed = weights(reference / epoch), weights(interrupted / epoch)
        assert final_reference.keys() == final_resumed.keys()
        for name in final_reference:
            assert torch.equal(final_reference[name], final_resumed[name]), (epoch, name)
    rows = lambda run: [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]  # noqa: E731
    assert [r["global_step"] for r in rows(interrupted)] == list(range(6))
    assert [r["loss"] for r in rows(reference)] == [r["loss"] for r in rows(interrupted)]


def copy_features(source: Path, destination: Path, change) -> Path:
    """A copy of a features folder with ``change(tensors)`` applied to every shard, as compute_features would
    have written it (with the checksums load_features verifies)."""
    from dpace.io import write_checksums

    destination.mkdir()
    for path in source.iterdir():
        if path.suffix == ".safetensors":
            tensors = load_file(str(path))
            change(tensors)
            save_file(tensors, str(destination / path.name))
        else:
            (destination / path.name).write_bytes(path.read_bytes())
    write_checksums(destination)
    return destination


def test_non_finite_loss_stops_training_without_a_checkpoint(tmp_path, tiny_target_json, features_dir):
    corrupted = copy_features(features_dir, tmp_path / "features", lambda t: t["hidden"].fill_(float("nan")))
    with pytest.raises(FloatingPointError, match=r"non-finite loss nan at step 0 \(objective dflash\)"):
        train_drafter(small_config(objective="dflash", objective_hparams={"gamma": 2.0}), target_json=tiny_target_json,
                      features_dir=corrupted, out_dir=tmp_path / "run", scratch_dir=tmp_path / "scratch")
    assert not list((tmp_path / "run").glob("epoch-*"))


class PoisonedGradient(torch.autograd.Function):
    """The identity on the loss, NaN on its way back: a finite loss with non-finite gradients."""

    @staticmethod
    def forward(ctx, loss):
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def test_non_finite_gradient_stops_training_and_keeps_the_last_good_checkpoint(
    tmp_path, tiny_target_json, features_dir, monkeypatch
):
    import dpace.training.loop as training

    config = small_config()  # 3 steps per epoch; state saved after steps 2 and 4, epoch 1 after step 3
    kwargs = dict(target_json=tiny_target_json, features_dir=features_dir)
    clean = tmp_path / "clean"
    train_drafter(config, out_dir=clean, scratch_dir=clean / "scratch", stop_after_steps=4, **kwargs)

    run, scratch = tmp_path / "run", tmp_path / "scratch"
    poisoned_call = 4 * config.grad_accumulation + 1  # the first micro-batch of step 4 (0-based)
    calls, saved = [], {}

    class Poisoned(training.ObjectiveDFlashModel):
        def forward(self, **inputs):
            loss, accuracy, metrics = super().forward(**inputs)
            calls.append(1)
            if len(calls) == poisoned_call:
                for name in ("state", "epoch"):  # what is on disk when the bad step starts
                    path = scratch / "state.pt" if name == "state" else run / "epoch-1" / "model.safetensors"
                    saved[name] = (path.stat().st_mtime_ns, path.read_bytes())
                loss = PoisonedGradient.apply(loss)
                assert torch.isfinite(loss)
            return loss, accuracy, metrics

    monkeypatch.setattr(training, "ObjectiveDFlashModel", Poisoned)
    with pytest.raises(FloatingPointError, match=r"non-finite gradient of \S+ at step 4 \(objective dpace\)"):
        train_drafter(config, out_dir=run, scratch_dir=scratch, **kwargs)
    assert len(calls) == poisoned_call + 1  # the step's second micro-batch ran, then the check stopped it
    # The last good checkpoint is untouched (not rewritten) and is the clean run's state after step 4.
    assert (scratch / "state.pt").stat().st_mtime_ns == saved["state"][0]
    assert (scratch / "state.pt").read_bytes() == saved["state"][1]
    assert (run / "epoch-1" / "model.safetensors").stat().st_mtime_ns == saved["epoch"][0]
    state, reference = (torch.load(path, weights_only=True) for path in (scratch / "state.pt", clean / "scratch" / "state.pt"))
    assert state["global_step"] == reference["global_step"] == 4
    assert all(torch.equal(state["model"][k], reference["model"][k]) for k in reference["model"])
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert not (run / "epoch-2").exists() and not (run / "steps.jsonl").exists() and not (run / "summary.json").exists()


def test_an_interrupted_run_does_not_resume_on_other_features(tmp_path, tiny_target_json, features_dir, monkeypatch):
    """Training reruns because its features were recomputed (new answers): the saved state of the old
    features' run must not be continued."""
    config = small_config()  # 3 steps per epoch, 6 in all; state saved after step 4
    scratch = tmp_path / "scratch"
    train_drafter(config, target_json=tiny_target_json, features_dir=features_dir, out_dir=tmp_path / "old",
                  scratch_dir=scratch, stop_after_steps=4)
    new = copy_features(features_dir, tmp_path / "new", lambda t: t["hidden"].mul_(0.5))
    taken = count_optimizer_steps(monkeypatch)
    train_drafter(config, target_json=tiny_target_json, features_dir=new, out_dir=tmp_path / "run", scratch_dir=scratch)
    assert len(taken) == 6  # from step 0
    train_drafter(config, target_json=tiny_target_json, features_dir=new, out_dir=tmp_path / "fresh",
                  scratch_dir=tmp_path / "fresh-scratch")
    run, fresh = weights(tmp_path / "run" / "epoch-2"), weights(tmp_path / "fresh" / "epoch-2")
    assert all(torch.equal(run[k], fresh[k]) for k in fresh)


def test_features_of_another_target_are_refused_before_training(tmp_path, tiny_target_json, features_dir):
    kwargs = dict(target_json=tiny_target_json, scratch_dir=tmp_path / "scratch")

    def narrower(tensors):
        tensors["hidden"] = tensors["hidden"][..., :-8].contiguous()

    def other_vocabulary(tensors):
        tensors["input_ids"][0] = 10 ** 6

    narrow = copy_features(features_dir, tmp_path / "narrow", narrower)
    with pytest.raises(ValueError, match=r"hidden states of width 120, but 2 layers of this target \(hidden_size=64\) give 128"):
        train_drafter(small_config(), features_dir=narrow, out_dir=tmp_path / "a", **kwargs)
    other = copy_features(features_dir, tmp_path / "other", other_vocabulary)
    with pytest.raises(ValueError, match=r"token id 1000000, outside this target's vocabulary"):
        train_drafter(small_config(), features_dir=other, out_dir=tmp_path / "b", **kwargs)
    assert not list(tmp_path.glob("[ab]/epoch-*")) and not list(tmp_path.glob("[ab]/steps.jsonl"))


def test_objectives_needing_the_target_train_from_cached_last_hidden(tmp_path, tiny_target_json, features_dir):
    def train(features, name):
        return train_drafter(small_config(objective="dpakl", epochs=1), target_json=tiny_target_json,
                             features_dir=features, out_dir=tmp_path / name, scratch_dir=tmp_path / f"s-{name}")

    summary = train(features_dir, "run")
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert summary["objective"] == "dpakl" and summary["final_loss"] == losses[-1] and len(losses) == 3
    assert all(math.isfinite(loss) for loss in losses)
    # The target's distribution comes from the cached last hidden states: changing them changes the loss.
    flipped = copy_features(features_dir, tmp_path / "flipped", lambda t: t["last_hidden"].mul_(-1))
    assert train(flipped, "flipped")["final_loss"] != pytest.approx(summary["final_loss"], rel=1e-3)


def test_online_features_train_like_cached_ones(tmp_path, tiny_target_json, features_dir):
    online = tmp_path / "online"
    atomic_write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS)
    compute_features(tiny_target_json, tmp_path / "c.jsonl", online,
                     FeatureSettings(target_layer_ids=[1, 3], max_seq_length=256, mode="online"))
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


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_trains_in_bf16_only_where_the_cpu_computes_it_natively(tmp_path, tiny_target_json,
                                                                               features_dir, monkeypatch, native):
    """``auto`` resolves before training: the run is the explicit precision's, and its summary says which."""
    import dpace.training.loop

    monkeypatch.setattr(dpace.training.loop, "native_bf16", lambda device="cpu": native)
    resolved = "bf16" if native else "fp32"
    runs = {}
    for precision in ("auto", resolved):
        out = tmp_path / precision
        summary = train_drafter(small_config(epochs=1, precision=precision), target_json=tiny_target_json,
                                features_dir=features_dir, out_dir=out, scratch_dir=tmp_path / f"s{precision}")
        assert summary["config"]["precision"] == resolved
        runs[precision] = [json.loads(line)["loss"] for line in (out / "steps.jsonl").read_text().splitlines()]
    assert runs["auto"] == runs[resolved]


def test_unsupported_precision_or_attention_is_refused_before_training(tmp_path, tiny_target_json, features_dir):
    kwargs = dict(target_json=tiny_target_json, features_dir=features_dir, out_dir=tmp_path / "run",
                  scratch_dir=tmp_path / "scratch")
    with pytest.raises(ValueError, match=r"precision 'fp16'; valid: fp32, bf16, auto"):
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


def test_feature_rms_is_taken_over_the_answer_positions_only():
    from dpace.features import FeatureSet, answer_feature_rms

    hidden = torch.tensor([[5000.0, 1.0], [3.0, 4.0], [4.0, -3.0], [0.0, 2.0]]).bfloat16()
    features = FeatureSet(input_ids=torch.arange(4, dtype=torch.int32), loss_mask=torch.tensor([0, 1, 1, 0], dtype=torch.uint8),
                          offsets=torch.tensor([0, 4]), hidden=hidden, last_hidden=None, layer_ids=[1])
    # The first (prompt) row's sink-sized value does not count; rows 1 and 2 do, in chunks of one row.
    torch.testing.assert_close(answer_feature_rms(features, rows_per_chunk=1), torch.tensor([12.5, 12.5]).sqrt())
    with pytest.raises(ValueError, match="no answer positions"):
        answer_feature_rms(FeatureSet(input_ids=features.input_ids, loss_mask=torch.zeros(4, dtype=torch.uint8),
                                      offsets=features.offsets, hidden=hidden, last_hidden=None, layer_ids=[1]))


def test_rms_feature_scaling_trains_on_scaled_features_and_saves_fc_folded(tmp_path, tiny_target_json, features_dir):
    """feature_scaling rms must train exactly as the paper's loop on features divided by their RMS, and save
    a checkpoint that takes the raw features: its fc is that run's fc divided by the RMS."""
    from dpace.features import answer_feature_rms, load_features

    rms = answer_feature_rms(load_features(features_dir))
    assert rms.max() / rms.min() > 2  # the tiny target's feature dimensions do differ in scale
    divided = copy_features(features_dir, tmp_path / "divided",
                            lambda t: t.__setitem__("hidden", (t["hidden"].float() / rms).bfloat16()))
    runs = {}
    for name, folder, scaling in (("scaled", features_dir, "rms"), ("divided", divided, "none"),
                                  ("raw", features_dir, "none")):
        train_drafter(small_config(epochs=1, feature_scaling=scaling), target_json=tiny_target_json,
                      features_dir=folder, out_dir=tmp_path / name, scratch_dir=tmp_path / f"s-{name}")
        losses = [json.loads(line)["loss"] for line in (tmp_path / name / "steps.jsonl").read_text().splitlines()]
        runs[name] = losses, weights(tmp_path / name / "epoch-1")
    # Up to the bf16 rounding of the divided copy, the same run, whose fc the checkpoint holds divided by the RMS.
    assert runs["scaled"][0] == pytest.approx(runs["divided"][0], rel=2e-2)
    scaled_fc, divided_fc, raw_fc = (runs[name][1]["fc.weight"] for name in ("scaled", "divided", "raw"))
    # Both end where the paper's loop on raw features does not: the distance to the divided run is what bf16
    # rounding of the copy leaves, a small fraction of what training on raw features moves fc by.
    folding_error, raw_distance = (scaled_fc * rms - divided_fc).norm(), (raw_fc - divided_fc).norm()
    assert folding_error < 0.25 * raw_distance
    with pytest.raises(ValueError, match="feature_scaling 'std'; valid: none, rms"):
        train_drafter(small_config(feature_scaling="std"), target_json=tiny_target_json, features_dir=features_dir,
                      out_dir=tmp_path / "bad", scratch_dir=tmp_path / "s-bad")
    with pytest.raises(ValueError, match=r"drafter_init target .*\(feature_scaling: none\)"):
        train_drafter(small_config(feature_scaling="rms", drafter_init="target"), target_json=tiny_target_json,
                      features_dir=features_dir, out_dir=tmp_path / "bad", scratch_dir=tmp_path / "s-bad")


def _reference_step(run, accumulated: list[dict]) -> list[float]:
    """The optimizer step as it was before the step shared one autocast region: an autocast region per
    micro-batch around its forward pass, the features in float32, the backward pass outside."""
    run.optimizer.zero_grad(set_to_none=True)
    losses = []
    for batch in accumulated:
        with run.autocast():
            loss, _, _ = run.model(input_ids=batch["input_ids"], hidden_states=batch["hidden"].float(),
                                   loss_mask=batch["loss_mask"])
        (loss / len(accumulated)).backward()
        losses.append(loss.item())
    gradients = [p.grad for p in run.drafter.parameters() if p.grad is not None]
    torch.nn.utils.clip_grads_with_norm_(gradients, run.config.max_grad_norm, torch.nn.utils.get_total_norm(gradients))
    run.optimizer.step()
    run.scheduler.step()
    return losses


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_steps_shared_autocast_and_bf16_features_change_no_value(tmp_path, tiny_target_json, features_dir,
                                                                        restore_threads, precision):
    """The step's speed-ups (one autocast region per step, so one cast of each weight; the cached bf16
    features kept bf16 under bf16 autocast; the draft vocabulary's head cast once) give the very losses and
    weights of the step they replaced, bit for bit, over several steps and with a draft vocabulary."""
    from dpace.training import loop

    config = small_config(precision=precision, draft_vocab_size=64, objective="dpace", epochs=1)
    config, objective, hparams = loop._checked_settings(config)
    runs, losses = {}, {}
    for name in ("loop", "reference"):
        run = loop._set_up(config, objective, hparams, target_json=tiny_target_json, features_dir=features_dir,
                           out_dir=tmp_path / name, scratch_dir=tmp_path / f"scratch-{name}")
        micro = list(loop.padded_micro_batches(run.features, list(range(len(run.features))), 2,
                                               loop._feature_dtype(run)))
        steps = [micro[i : i + 2] for i in range(0, len(micro) - 1, 2)]
        assert {b["hidden"].dtype for b in micro} == {torch.bfloat16 if precision == "bf16" else torch.float32}
        torch.manual_seed(11)
        if name == "loop":
            losses[name] = [loop._optimizer_step(run, step)[0] for step in steps]
        else:
            losses[name] = [sum(value / 2 for value in _reference_step(run, step)) for step in steps]
        runs[name] = run
    assert losses["loop"] == losses["reference"]
    for (name, ours), (_, theirs) in zip(runs["loop"].drafter.state_dict().items(),
                                         runs["reference"].drafter.state_dict().items(), strict=True):
        assert torch.equal(ours, theirs), name
