"""Train one DFlash drafter with one objective — a single loop you can read top to bottom.

SpecForge's own CLI needs an SGLang server, so this loop drives SpecForge 0.2.0's model classes
directly: ``DFlashDraftModel`` inside our ``ObjectiveDFlashModel`` (SpecForge's ``OnlineDFlashModel``
with every objective of ``dpace.training.objectives``). AdamW, linear warmup then cosine decay, gradient
clipping, gradient accumulation, as in the paper (App. "Training details").

Outputs: one HF checkpoint per epoch (``epoch-<e>/``, loadable by ``dflash``'s
``DFlashDraftModel.from_pretrained``), ``steps.jsonl`` (per-step loss, accuracy, per-position mean
weights, wall time) and ``summary.json``. A resumable state (model, optimiser, scheduler, RNG, data
position) is written to a scratch folder at every epoch end and every ``save_every_steps`` steps,
so a killed job resumes where it stopped and ends with the same weights as an uninterrupted run.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from dpace.features import FeatureSet, answer_feature_rms, load_features, target_hidden_states
from dpace.gpus import device_clock
from dpace.io import (
    JsonlAppender,
    atomic_file,
    atomic_write_jsonl,
    input_checksum,
    read_partial_jsonl,
    remove_killed_writes,
)
from dpace.paths import EPOCH_DIR
from dpace.targets import load_target, native_bf16, target_checksum
from dpace.training.draft_vocab import select_draft_vocab
from dpace.training.drafter import (
    build_drafter,
    drafter_config,
    initialise_from_target,
    save_drafter,
    with_raw_feature_input,
)
from dpace.training.objectives import canonical_objective, objective_record, resolve_hparams
from dpace.training.online_model import ObjectiveDFlashModel
from dpace.training.specforge_run import ObjectiveSpec
from dpace.training.train_config import TrainConfig, check_train_config
from dpace.training.training_records import (
    STEPS_FILE,
    RunSchedule,
    RunTiming,
    StepMetrics,
    run_summary,
    step_row,
    write_records,
)


def padded_micro_batches(features: FeatureSet, order: list[int], micro_batch_size: int,
                         feature_dtype: torch.dtype = torch.float32, with_last_hidden: bool = True):
    """Right-padded micro-batches; padding has loss mask 0, so no anchor ever lands on it. The target's
    features come in ``feature_dtype`` (the loop keeps bf16 features bf16 where autocast would cast
    their float32 copy back to bf16 anyway: ``_feature_dtype``); its last hidden states only
    ``with_last_hidden`` (the loop: only for objectives that read them)."""
    keys = ("hidden", "last_hidden") if with_last_hidden else ("hidden",)
    for start in range(0, len(order), micro_batch_size):
        items = [features.sequence(i) for i in order[start : start + micro_batch_size]]
        width = max(len(item["input_ids"]) for item in items)
        batch = {
            "input_ids": torch.zeros((len(items), width), dtype=torch.long),
            "loss_mask": torch.zeros((len(items), width)),
        }
        for key in keys:
            if key in items[0]:
                batch[key] = torch.zeros((len(items), width, items[0][key].shape[-1]), dtype=feature_dtype)
        for row, item in enumerate(items):
            length = len(item["input_ids"])
            batch["input_ids"][row, :length] = item["input_ids"]
            batch["loss_mask"][row, :length] = item["loss_mask"]
            for key in keys:
                if key in batch:
                    batch[key][row, :length] = item[key].to(feature_dtype)
        yield batch


def _lr_factor(step: int, total_steps: int, warmup_steps: int) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# The autocast dtype of each precision the schema allows (train.precision), once "auto" is resolved.
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """``auto`` is bf16 where bf16 matrix products are native (a CUDA GPU, a CPU with AMX or AVX512-BF16),
    else fp32: on an AVX2-only CPU PyTorch emulates bf16, and autocast would only add casts."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


def _first_non_finite(model: torch.nn.Module) -> str | None:
    """Name of the first parameter whose gradient holds a NaN or an infinity (a slow per-tensor scan: run it
    only when the total gradient norm, which any non-finite entry makes non-finite, is not finite)."""
    for name, parameter in model.named_parameters():
        if parameter.grad is not None and not torch.isfinite(parameter.grad).all():
            return f"gradient of {name}"
    return None


def _check_features_match_target(features: FeatureSet, target_config, features_dir) -> None:
    """Features cached from another target would train a drafter for the wrong width or vocabulary."""
    if features.hidden is not None:
        width = len(features.layer_ids) * target_config.hidden_size
        if features.hidden.shape[-1] != width:
            raise ValueError(
                f"features {features_dir} hold hidden states of width {features.hidden.shape[-1]}, but "
                f"{len(features.layer_ids)} layers of this target (hidden_size={target_config.hidden_size}) "
                f"give {width}: they were computed for another target"
            )
    largest = int(features.input_ids.max())
    if largest >= target_config.vocab_size:
        raise ValueError(
            f"features {features_dir} hold token id {largest}, outside this target's vocabulary of "
            f"{target_config.vocab_size}: they were computed for another target"
        )


def _load_state(path: Path) -> dict:
    """A saved training state: tensors and plain containers only (``weights_only``), so a planted or
    damaged file can run no code and fails naming itself."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as error:  # pickle refusals and truncation arrive as many types
        raise ValueError(f"{path}: damaged or not a training state ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}); delete it and rerun") from None


def _save_state(path: Path, state: dict) -> None:
    with atomic_file(path) as tmp:
        torch.save(state, tmp)


@dataclass
class TrainingRun:
    """One run once set up: what the loop reads (features, target, model, optimiser, schedule) and where
    it stands (epoch, step), which ``save_state`` writes so that a killed job resumes there."""

    config: TrainConfig
    objective: str
    hparams: dict
    device: torch.device
    features: FeatureSet
    target: torch.nn.Module
    online: bool  # features mode "online": the target runs every step
    needs_target: bool  # the objective reads the target's last hidden states
    drafter: torch.nn.Module
    model: ObjectiveDFlashModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    feature_scale: torch.Tensor | None  # the batches' features are divided by it; the saved fc has it folded in
    steps_per_epoch: int
    total_steps: int
    state_path: Path
    running_log: Path
    fingerprint: str  # the config and inputs a saved state belongs to
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0

    def save_state(self) -> None:
        _save_state(self.state_path, {
            "fingerprint": self.fingerprint, "model": self.drafter.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
        })

    @property
    def schedule(self) -> RunSchedule:
        return RunSchedule(epochs=self.config.epochs, steps=self.total_steps, steps_per_epoch=self.steps_per_epoch)

    def autocast(self):
        precision = self.config.precision
        return torch.autocast(self.device.type, dtype=PRECISIONS[precision], enabled=precision != "fp32")


def train_drafter(
    config: TrainConfig,
    *,
    target_json: str | Path,
    features_dir: str | Path | FeatureSet,
    out_dir: str | Path,
    scratch_dir: str | Path,
    stop_after_steps: int | None = None,
) -> dict:
    """Train and write ``out_dir/epoch-<e>/``, ``steps.jsonl``, ``summary.json``.

    ``stop_after_steps`` ends the run early after saving a resumable state (used by tests that
    interrupt training deterministically).

    Four phases: check the settings (before anything loads), set the run up (or resume it), the loop,
    save the records.
    """
    config, objective, hparams = _checked_settings(config)
    out_dir, scratch_dir = Path(out_dir), Path(scratch_dir)
    run = _set_up(config, objective, hparams, target_json=target_json, features_dir=features_dir,
                  out_dir=out_dir, scratch_dir=scratch_dir)
    if not _train(run, out_dir, stop_after_steps):
        return {"stopped_at_step": run.global_step}
    return _save_records(run, out_dir)


def _checked_settings(config: TrainConfig) -> tuple[TrainConfig, str, dict]:
    """Check: the settings on their own, before any input is loaded; returns the config with its precision
    resolved, the canonical objective and its resolved hyperparameters."""
    objective = canonical_objective(config.objective)
    check_train_config(config)
    # Resolved before the resume fingerprint and the summary, which record the precision that trained.
    config = replace(config, precision=resolve_precision(config.precision, config.device))
    if config.feature_scaling != "none" and config.drafter_init == "target":
        raise ValueError("drafter_init target passes the target's raw deepest feature through fc; "
                         "it cannot start from scaled features (feature_scaling: none)")
    if config.attention_backend == "flex_attention" and torch.device(config.device).type != "cuda":
        raise ValueError(
            f"attention_backend flex_attention trains on CUDA only (PyTorch has no {torch.device(config.device).type} "
            "backward for it); use sdpa here"
        )
    hparams = resolve_hparams(objective, config.block_size, **config.objective_hparams)
    return config, objective, hparams


def _set_up(config: TrainConfig, objective: str, hparams: dict, *, target_json, features_dir, out_dir: Path,
            scratch_dir: Path) -> TrainingRun:
    """Set-up: load the features and the target, check them against each other and the objective, build
    the drafter, its training wrapper, optimiser and schedule, and resume from the run's last saved state."""
    device = torch.device(config.device)
    if config.threads:
        torch.set_num_threads(config.threads)
    # Products of small probabilities (accept-rate, prefix weights) underflow into subnormal floats,
    # which x86 CPUs handle ~4x slower (benchmarks/bench_objectives.py); flushing them changes
    # values below 1e-38 only.
    torch.set_flush_denormal(True)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch_dir.mkdir(parents=True, exist_ok=True)
    # A previous attempt killed while writing a checkpoint (a cluster's time limit) left its temporary.
    remove_killed_writes(out_dir)

    features, target, mask_token_id, online, needs_target = _load_inputs(config, objective, target_json, features_dir)
    drafter, model, feature_scale = _build_model(config, objective, hparams, features, target, mask_token_id, online)
    # fused: one kernel over all parameters instead of a dozen ops per tensor (7% of a CPU step)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay,
                                  fused=True)
    micro_steps_per_epoch = math.ceil(len(features) / config.micro_batch_size)
    steps_per_epoch = math.ceil(micro_steps_per_epoch / config.grad_accumulation)
    total_steps = steps_per_epoch * config.epochs
    warmup_steps = max(1, round(config.warmup_ratio * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _lr_factor(step, total_steps, warmup_steps)
    )

    # Resume from the last saved state, if any: same config, features and target only (a job that
    # reruns because its answers or features changed must not continue the old ones' run).
    inputs = {"features": None if isinstance(features_dir, FeatureSet) else input_checksum(features_dir),
              "target": target_checksum(target_json)}
    run = TrainingRun(
        config=config, objective=objective, hparams=hparams, device=device, features=features, target=target,
        online=online, needs_target=needs_target, drafter=drafter, model=model, optimizer=optimizer,
        scheduler=scheduler, feature_scale=feature_scale, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
        state_path=scratch_dir / "state.pt", running_log=scratch_dir / STEPS_FILE,
        fingerprint=json.dumps({"config": asdict(config), "inputs": inputs}, sort_keys=True),
    )
    torch.manual_seed(config.seed)
    if run.state_path.exists():
        state = _load_state(run.state_path)
        if state["fingerprint"] == run.fingerprint:
            drafter.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["rng"])
            if device.type == "cuda":  # SpecForge samples anchors on the device: its RNG resumes too
                torch.cuda.set_rng_state(state["cuda_rng"], device)
            run.epoch, run.step_in_epoch, run.global_step = state["epoch"], state["step_in_epoch"], state["global_step"]
    # The per-step log grows in the scratch folder next to the state it belongs to (Snakemake deletes a
    # failed job's declared outputs; an in-place steps.jsonl would also look complete before it is);
    # out_dir/steps.jsonl is written once, atomically, at the end. Keep only rows up to the resumed
    # step, so a resumed log equals an uninterrupted one.
    kept = [row for row in read_partial_jsonl(run.running_log) if row["global_step"] < run.global_step]
    atomic_write_jsonl(run.running_log, kept)
    return run


def _load_inputs(config: TrainConfig, objective: str, target_json, features_dir):
    """The features and the target, checked against each other and against what the objective reads:
    (features, target, mask token id, whether the target runs every step, whether the objective reads its
    last hidden states)."""
    features = features_dir if isinstance(features_dir, FeatureSet) else load_features(features_dir)
    target, tokenizer = load_target(target_json, device=config.device)
    mask_token_id = config.mask_token_id
    if mask_token_id is None:
        mask_token_id = tokenizer.convert_tokens_to_ids(config.mask_token)
        if not isinstance(mask_token_id, int) or mask_token_id == tokenizer.unk_token_id:
            raise ValueError(f"mask_token {config.mask_token!r} is not a token of the target's tokenizer")
    elif not 0 <= mask_token_id < target.config.vocab_size:
        raise ValueError(f"mask_token_id {mask_token_id} is outside the target's vocabulary")
    _check_features_match_target(features, target.config,
                                 "(in memory)" if isinstance(features_dir, FeatureSet) else features_dir)
    needs_target = objective_record(objective).needs_target_logits
    online = features.hidden is None  # features mode "online": the target runs every step
    if needs_target and not online and features.last_hidden is None:
        raise ValueError(f"objective {objective!r} needs the target's last hidden states; features lack them")
    if config.sliding_window and not online:
        # Positions no block sees cost steps (fc, keys, padding) and change no loss term.
        features = features.without_unseen_context(config.sliding_window)
    return features, target, mask_token_id, online, needs_target


def _build_model(config: TrainConfig, objective: str, hparams: dict, features: FeatureSet, target, mask_token_id: int,
                 online: bool):
    """The drafter (on the config's device), its objective-aware training wrapper and the feature scale."""
    device = torch.device(config.device)
    draft_vocab = None
    if config.draft_vocab_size:
        draft_vocab = select_draft_vocab(features.input_ids[features.loss_mask > 0], config.draft_vocab_size,
                                         target.config.vocab_size)
    draft_config = drafter_config(
        target.config,
        depth=config.depth,
        block_size=config.block_size,
        target_layer_ids=features.layer_ids,
        mask_token_id=mask_token_id,
        draft_vocab=draft_vocab,
        sliding_window=config.sliding_window,
    )
    drafter = build_drafter(draft_config, seed=config.seed, attention_backend=config.attention_backend)
    if config.drafter_init == "target":
        initialise_from_target(drafter, target)
    drafter.to(device)
    feature_scale = None
    if config.feature_scaling == "rms":
        if online:
            raise ValueError("feature_scaling rms needs cached features (features.mode: cached)")
        feature_scale = answer_feature_rms(features).to(device)
    model = ObjectiveDFlashModel(
        draft_model=drafter,
        target_lm_head=target.lm_head,
        target_embed_tokens=target.get_input_embeddings(),
        mask_token_id=mask_token_id,
        block_size=config.block_size,
        objective=ObjectiveSpec(objective, dict(hparams), config.normalization),
        attention_backend=config.attention_backend,
        num_anchors=config.num_anchors,
        objective_chunk_blocks=config.objective_chunk_blocks,
        draft_vocab=draft_vocab,
    )
    return drafter, model, feature_scale


def _train(run: TrainingRun, out_dir: Path, stop_after_steps: int | None) -> bool:
    """The loop: optimizer steps from where the run stands to its last epoch; every epoch's end writes its
    checkpoint and the resumable state. False when ``stop_after_steps`` stopped it early (state saved)."""
    config, features = run.config, run.features
    run.drafter.train()
    log = JsonlAppender(run.running_log)
    progress = tqdm(total=run.total_steps, initial=run.global_step, desc=f"train {run.objective}", unit="step")
    try:
        while run.epoch < config.epochs:
            # The data order depends only on (seed, epoch): a resumed run sees the same batches.
            order = torch.randperm(len(features), generator=torch.Generator().manual_seed(config.seed * 1000 + run.epoch))
            micro_batches = list(padded_micro_batches(features, order.tolist(), config.micro_batch_size,
                                                      _feature_dtype(run), with_last_hidden=run.needs_target))
            while run.step_in_epoch < run.steps_per_epoch:
                started = device_clock(run.device)
                first = run.step_in_epoch * config.grad_accumulation
                loss, accuracy, grad_norm, weights = _optimizer_step(
                    run, micro_batches[first : first + config.grad_accumulation])
                step_time = device_clock(run.device) - started
                log.write(step_row(
                    run.schedule,
                    global_step=run.global_step,
                    epoch=run.epoch + 1,
                    step=run.step_in_epoch,
                    metrics=StepMetrics(
                        loss=loss,
                        accuracy=accuracy,
                        grad_norm=float(grad_norm),
                        lr=run.scheduler.get_last_lr()[0],
                        step_time_s=step_time,
                        weight_per_position=torch.stack(weights).mean(0).tolist(),
                    ),
                ))
                run.step_in_epoch += 1
                run.global_step += 1
                # Not refreshed here (a refresh per call ignores tqdm's mininterval: a line per step in the log).
                progress.set_postfix(loss=f"{loss:.3f}", acc=f"{accuracy:.3f}", refresh=False)
                progress.update(1)
                if run.global_step % config.save_every_steps == 0:
                    run.save_state()
                if stop_after_steps is not None and run.global_step >= stop_after_steps:
                    run.save_state()
                    return False
            run.epoch, run.step_in_epoch = run.epoch + 1, 0
            drafter = run.drafter
            save_drafter(drafter if run.feature_scale is None else with_raw_feature_input(drafter, run.feature_scale),
                         out_dir / EPOCH_DIR.format(epoch=run.epoch))
            run.save_state()
    finally:
        progress.close()
        log.close()
    return True


def _optimizer_step(run: TrainingRun, accumulated: list[dict]) -> tuple[float, float, torch.Tensor, list[torch.Tensor]]:
    """One optimizer step over ``accumulated`` micro-batches: (mean loss, mean accuracy, gradient norm before
    clipping, each micro-batch's weight per block position), the tensors left on the device for the caller to
    read after the step's clock stops. A non-finite loss or gradient stops the run before any
    checkpoint is written from it."""
    run.optimizer.zero_grad(set_to_none=True)
    loss_sum, accuracy_sum, weights = 0.0, 0.0, []
    # One autocast region for the whole step: autocast caches its bf16 copy of every trained weight until
    # the outermost region exits, so the micro-batches share one cast of each instead of making their
    # own (the weights change only at the optimizer step; the values are the same). The backward passes
    # run with autocast off, as they did outside the region.
    with run.autocast():
        for batch in accumulated:
            loss, accuracy, metrics = _micro_batch_loss(run, batch)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"non-finite loss {loss.item()} at step {run.global_step} (objective {run.objective}); "
                    "no checkpoint was written from it"
                )
            with torch.autocast(run.device.type, enabled=False):
                (loss / len(accumulated)).backward()
            loss_sum += loss.item() / len(accumulated)
            accuracy_sum += float(accuracy) / len(accumulated)
            weights.append(metrics["weight_per_position"])
    gradients = [p.grad for p in run.drafter.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.get_total_norm(gradients)
    # A norm can also overflow from finite gradients; those are clipped, as before.
    bad = None if torch.isfinite(grad_norm) else _first_non_finite(run.drafter)
    if bad:
        raise FloatingPointError(
            f"non-finite {bad} at step {run.global_step} (objective {run.objective}); no checkpoint was written"
        )
    torch.nn.utils.clip_grads_with_norm_(gradients, run.config.max_grad_norm, grad_norm)
    run.optimizer.step()
    run.scheduler.step()
    return loss_sum, accuracy_sum, grad_norm, weights


def _micro_batch_loss(run: TrainingRun, batch: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One micro-batch's forward pass (inside the step's autocast region): (loss, accuracy, metrics)."""
    batch = {key: value.to(run.device) for key, value in batch.items()}
    if run.online:
        with torch.no_grad():
            hidden, last = target_hidden_states(
                run.target, batch["input_ids"], (batch["input_ids"] >= 0).long(),
                run.features.layer_ids, run.needs_target,
            )
        batch["hidden"], batch["last_hidden"] = hidden, last
    return run.model(
        input_ids=batch["input_ids"],
        hidden_states=batch["hidden"] if run.feature_scale is None else batch["hidden"] / run.feature_scale,
        loss_mask=batch["loss_mask"],
        target_last_hidden_states=batch.get("last_hidden") if run.needs_target else None,
    )


def _feature_dtype(run: TrainingRun) -> torch.dtype:
    """The dtype the micro-batches carry the cached features in: bf16 where they are stored in bf16 and
    the run trains under bf16 autocast on unscaled features, since the drafter's first use of them (``fc``,
    and the head for the target's logits) casts them to bf16 anyway: their float32 copy (4 bytes per
    value, and a cast back per micro-batch) changes no value. float32 otherwise."""
    stored = {t.dtype for t in (run.features.hidden, run.features.last_hidden) if t is not None}
    if run.config.precision == "bf16" and run.feature_scale is None and stored == {torch.bfloat16}:
        return torch.bfloat16
    return torch.float32


def _save_records(run: TrainingRun, out_dir: Path) -> dict:
    """Save: steps.jsonl and summary.json next to the epochs' checkpoints, then drop the scratch state."""
    config = run.config
    rows = read_partial_jsonl(run.running_log)
    step_times = [row["step_time_s"] for row in rows]
    summary = run_summary(
        rows,
        objective=run.objective,
        hparams=run.hparams,
        normalization=config.normalization,
        schedule=run.schedule,
        timing=RunTiming(time_per_step_s=sum(step_times) / len(step_times),
                         time_per_epoch_s=sum(step_times) / config.epochs),
        num_sequences=len(run.features),
        config=asdict(config),
    )
    write_records(out_dir, rows, summary)
    run.state_path.unlink(missing_ok=True)
    run.running_log.unlink(missing_ok=True)
    return summary
