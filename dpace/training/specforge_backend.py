"""Multi-GPU training through SpecForge 0.2.0's own trainer (FSDP, torchrun, SGLang capture).

What this module adds to SpecForge, without copying any of it:

* ``algorithm_registration``: our objectives as one more SpecForge *algorithm* (strategy
  ``dpace``), built from SpecForge's DFlash registration with the training model swapped for
  ``dpace.training.online_model.ObjectiveDFlashModel``. SpecForge's run schema is strict (no field for an
  objective name, ``k`` or a normalization), so the objective travels inside the registered
  provider: ``ObjectiveSpec`` is stored as ``dpace_objective`` in the draft-config JSON that the
  run YAML names (``model.draft_model_config``), and every process rebuilds the same registration
  from it.
* ``run_config``: the SpecForge run YAML for one variant, from our settings. Target features are
  captured online by SpecForge's managed SGLang capture server(s) (``deployment.mode:
  disaggregated`` with ``managed_local``, one node), from our own tokenisation (``data.prompts_path``
  = pre-tokenised ``input_ids``/``loss_mask``, exactly what the local backend trains on).
* ``main``: ``python -m dpace.training.specforge_backend train --config run.yaml`` is ``specforge train``
  with the registry above. The stock ``specforge`` executable cannot train a non-builtin algorithm
  (``specforge.cli.main`` resolves the strategy in ``builtin_algorithm_registry()`` and re-executes
  ``-m specforge.cli`` for torchrun workers), so this entry point calls SpecForge's own launch
  planner (``build_launch_plan``/``run_commands``) with itself as the worker command. Every other
  sub-command (``export``, ``benchmark``) is passed to ``specforge.cli.main`` unchanged.
* ``train_with_specforge``: what ``workflow/scripts/train_drafter.py`` runs for
  ``train.backend: specforge``: write the run, launch it, turn SpecForge's checkpoints into the
  workflow's ``epoch-<e>/`` drafters (``specforge export --to hf``), ``steps.jsonl`` (parsed from
  SpecForge's per-step console metrics) and ``summary.json``.

Topology. SpecForge's managed single-node stack needs the capture server(s) and the trainer on
disjoint GPUs, so this backend needs at least 2 GPUs: ``max(1, n // 4)`` capture servers (one GPU
each) and the rest trainer ranks. The paper's effective batch (micro-batch x accumulation = 4 on
one GPU) is kept: trainer ranks are the largest divisor of it that fits, and the per-rank
micro-batch and accumulation are rescaled so that ranks x micro x accumulation stays 4.

Epoch checkpoints. SpecForge saves every ``save_interval`` optimizer steps and at the end; with an
online prompt stream it runs ``N * epochs // (ranks * micro * accumulation)`` steps in all, so
``save_interval = N // (ranks * micro * accumulation)`` puts one checkpoint at every epoch
boundary (exactly when N is a multiple of that quantum, within one step otherwise).

Resume. SpecForge's managed stack does not resume (``managed_local does not support resume``): a
killed job reruns the variant from the start.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import yaml

from dpace.io import atomic_folder, atomic_write_text, remove_killed_writes, write_checksums
from dpace.paths import EPOCH_DIR
from dpace.training.specforge_run import (
    ALGORITHM_NAME,
    OBJECTIVE_KEY,
    ObjectiveSpec,
    RunPaths,
    Topology,
    accepted_prompts,
    epoch_steps,
    plan_topology,
    run_config,
    validate_run_config,
    write_draft_config,
    write_prompts,
)
from dpace.training.training_records import (
    BackendRun,
    RunSchedule,
    RunTiming,
    StepMetrics,
    run_summary,
    step_row,
    write_records,
)

# ---------------------------------------------------------------------------------------------
# The objective as a SpecForge algorithm


def algorithm_registration(spec: ObjectiveSpec):
    """SpecForge's DFlash registration, renamed ``dpace``, training ``ObjectiveDFlashModel``.

    Objectives that need the target's distribution also capture the target's last hidden state
    (SpecForge's DSpark capture layout and collator, ``target_last_hidden_states``).
    """
    from specforge.algorithms.common.providers import make_registration
    from specforge.algorithms.dflash import providers as dflash

    needs_target = spec.needs_target_logits

    def build_training_model(config, draft_model, draft_config, target_config, tokenizer):
        from specforge.algorithms.model_providers import _build_dflash_family_model

        from dpace.training.online_model import ObjectiveDFlashModel

        resolved = spec.resolved(int(draft_model.block_size))

        def factory(common):
            common = {k: v for k, v in common.items() if k != "loss_decay_gamma"}  # gamma is in hparams
            return ObjectiveDFlashModel(**common, objective=resolved)

        return _build_dflash_family_model(config, draft_model, tokenizer, factory)

    def build_step(wrapped_model, *, target_head=None, **_options):
        del target_head
        from specforge.training.strategies.base import DFlashTrainStrategy, DSparkTrainStrategy

        # DSpark's step is DFlash's plus target_last_hidden_states, which these objectives read.
        return DSparkTrainStrategy(wrapped_model) if needs_target else DFlashTrainStrategy(wrapped_model)

    def resume_contract(_config, draft_model, training_model):
        return {
            "dpace_draft_num_hidden_layers": int(draft_model.config.num_hidden_layers),
            "dpace_target_layer_ids": tuple(int(i) for i in draft_model.target_layer_ids),
            "dpace_block_size": int(training_model.block_size),
            "dpace_mask_token_id": int(training_model.mask_token_id),
            "dpace_num_anchors": int(training_model.num_anchors),
            "dpace_objective": json.dumps(
                {"objective": training_model.objective, "hparams": training_model.objective_hparams,
                 "normalization": training_model.normalization}, sort_keys=True),
        }

    spec_ = replace(dflash.algorithm_spec(), name=ALGORITHM_NAME)
    if needs_target:
        spec_ = replace(spec_, feature_contracts=tuple(_with_last_hidden(c) for c in spec_.feature_contracts))
    base = dflash.algorithm_providers()
    providers = replace(
        base,
        algorithm_name=ALGORITHM_NAME,
        step=replace(base.step, build=build_step, resume_contract=resume_contract),
        model=replace(base.model, build_training_model=build_training_model),
        **(_dspark_capture(base) if needs_target else {}),
    )
    return make_registration(spec_, providers)


def _with_last_hidden(contract):
    """A DFlash feature contract that also captures the target's last hidden state."""
    from specforge.algorithms.contracts import FeatureContract

    tensors = set(contract.required_tensors) | {"target_last_hidden_states"}
    storage = contract.storage
    if storage is not None:
        storage = replace(storage, required_tensors=tensors)
    return FeatureContract(
        mode=contract.mode, modality=contract.modality, required_tensors=tensors,
        allowed_target_representations={"hidden_state"}, default_target_representation="hidden_state",
        storage=storage,
    )


def _dspark_capture(base) -> dict:
    """DFlash's streaming and offline providers with DSpark's capture layout and collator (the last hidden state)."""
    from specforge.algorithms.common.dflash_family_data import build_dspark_collator

    streaming = tuple(
        replace(s, capture_method="dspark", target_representation="hidden_state",
                layout=replace(s.layout, last_hidden_feature="target_last_hidden_states"),
                build_collator=build_dspark_collator)
        for s in base.server_streaming
    )
    offline = tuple(
        replace(o, build_collator=build_dspark_collator,
                capture_layout=replace(o.capture_layout, capture_method="dspark",
                                       last_hidden_feature="target_last_hidden_states"))
        for o in base.offline
    )
    return {"server_streaming": streaming, "offline": offline}


def registry(spec: ObjectiveSpec):
    """SpecForge's built-in catalog plus ``dpace``."""
    from specforge.algorithms.builtin import builtin_algorithm_registry

    return builtin_algorithm_registry().with_registration(algorithm_registration(spec))


def objective_of_run(config_path: str | Path) -> ObjectiveSpec:
    """The ``dpace_objective`` block of the draft config a run YAML names."""
    run = yaml.safe_load(Path(config_path).read_text())
    draft = (run.get("model") or {}).get("draft_model_config")
    if not draft:
        raise ValueError(f"{config_path}: model.draft_model_config is not set; no dpace objective to train")
    draft_path = Path(draft)
    if draft_path.is_dir():
        draft_path = draft_path / "config.json"
    data = json.loads(draft_path.read_text())
    if OBJECTIVE_KEY not in data:
        raise ValueError(f"{draft_path} has no {OBJECTIVE_KEY!r} block (written by dpace.training.specforge_backend)")
    return ObjectiveSpec.from_dict(data[OBJECTIVE_KEY])


# ---------------------------------------------------------------------------------------------
# The CLI (``specforge train`` with the dpace registry)


def cli_prefix() -> list[str]:
    """How to invoke this entry point (``DPACE_SPECFORGE_CLI`` replaces it, e.g. in tests)."""
    if os.environ.get("DPACE_SPECFORGE_CLI"):
        return shlex.split(os.environ["DPACE_SPECFORGE_CLI"])
    return [sys.executable, "-m", "dpace.training.specforge_backend"]


def _train_main(args) -> int:
    from specforge.application import bind_run, resolve_run
    from specforge.cli import _config_for_role, _train, _worker_signal_unwind, _WorkerTermination
    from specforge.config import load_config
    from specforge.launch_plan import build_launch_plan, run_commands

    cfg = load_config(args.config, args.overrides)
    resolved = resolve_run(cfg, registry(objective_of_run(args.config)))
    worker = (sys.executable, "-m", "dpace.training.specforge_backend")
    plan = build_launch_plan(
        resolved.config, algorithm=resolved.algorithm, config_path=args.config, overrides=args.overrides,
        requested_role=args.role, node_rank=args.node_rank, worker_prefix=worker,
        # torchrun runs the worker command as given (no ``python`` prepended): ranks re-enter here.
        torchrun_prefix=(sys.executable, "-m", "torch.distributed.run", "--no-python"),
    )
    if args.plan:
        print(plan.render())
        return 0
    if plan.kind == "worker":
        for key, value in plan.worker_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        role_config = _config_for_role(resolved.config, plan.role)
        try:
            with _worker_signal_unwind():
                _train(bind_run(role_config, resolved.algorithm))
        except _WorkerTermination as received:
            return 128 + received.signum
        return 0
    return run_commands(plan)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "train":
        from specforge.cli import main as specforge_main

        return specforge_main(argv)
    parser = argparse.ArgumentParser(prog="python -m dpace.training.specforge_backend train",
                                     description="specforge train, with the dpace objectives registered")
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--role", choices=("auto", "all", "producer", "consumer", "both"), default="auto")
    parser.add_argument("--node-rank", type=int, default=None)
    parser.add_argument("--plan", action="store_true")
    parser.add_argument("overrides", nargs="*")
    return _train_main(parser.parse_args(argv[1:]))


# ---------------------------------------------------------------------------------------------
# One workflow training job


STEP_LINE = re.compile(r"^step (\d+): (\{.*\})\s*$")


def parse_step_metrics(log_text: str) -> list[dict]:
    """SpecForge's console metric lines (``step N: {...}``) as rows ``{"global_step", ...}``."""
    rows = {}
    for line in log_text.splitlines():
        match = STEP_LINE.match(line.strip())
        if not match:
            continue
        try:
            metrics = ast.literal_eval(match.group(2))
        except (ValueError, SyntaxError):
            continue
        if isinstance(metrics, dict):
            rows[int(match.group(1))] = {"global_step": int(match.group(1)), **metrics}
    return [rows[k] for k in sorted(rows)]


def _first(row: dict, *suffixes, numeric: bool = True):
    """The value of the first key whose last ``/`` part is one of ``suffixes`` (e.g. ``train/loss``)."""
    for suffix in suffixes:
        for key, value in row.items():
            if key.split("/")[-1] != suffix:
                continue
            if not numeric:
                return value
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
    return None


def _step_row(metrics: dict, schedule: RunSchedule) -> dict:
    """One SpecForge console row in the local backend's ``steps.jsonl`` layout (0-based steps)."""
    global_step = metrics["global_step"] - 1  # SpecForge prints the count of finished optimizer steps
    epoch = min(schedule.epochs, global_step // schedule.steps_per_epoch + 1)
    step = global_step - (epoch - 1) * schedule.steps_per_epoch
    weights = _first(metrics, "weight_per_position", numeric=False)
    return step_row(
        schedule,
        global_step=global_step,
        epoch=epoch,
        step=step,
        metrics=StepMetrics(
            loss=_first(metrics, "loss"),
            accuracy=_first(metrics, "accuracy", "acc"),
            grad_norm=_first(metrics, "grad_norm"),
            lr=_first(metrics, "lr", "learning_rate"),
            step_time_s=_first(metrics, "step_time", "step_time_s", "time_per_step"),
            weight_per_position=list(weights) if isinstance(weights, list) else [],
        ),
        extra={f"specforge/{k}": v for k, v in metrics.items() if k != "global_step"},
    )


def _run(command: list[str], log) -> tuple[int, str]:
    """Run ``command``, copying its output into ``log`` as it comes; returns (exit code, output)."""
    log.write(f"$ {shlex.join(command)}\n")
    log.flush()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    captured = []
    for line in process.stdout:
        log.write(line)
        captured.append(line)
    log.flush()
    return process.wait(), "".join(captured)


def train_with_specforge(
    settings: dict,
    *,
    target_json: str | Path,
    features_dir: str | Path,
    out_dir: str | Path,
    scratch_dir: str | Path,
    gpus: list[str],
    mask_token: str | None = None,
    mask_token_id: int | None = None,
    max_length: int = 2048,
    log=None,
) -> dict:
    """Train one variant with SpecForge and write the workflow's drafter folder. ``settings``: the variant's and the
    train section's settings (``run_config``; precision and attention_backend among them)."""
    log = log or sys.stdout
    topology = plan_topology(gpus, int(settings["micro_batch_size"]), int(settings["grad_accumulation"]))
    out_dir, scratch_dir = Path(out_dir), Path(scratch_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch_dir.mkdir(parents=True, exist_ok=True)
    remove_killed_writes(out_dir)  # a previous attempt killed while writing an epoch's checkpoint left its temporary
    if mask_token_id is None:
        mask_token_id = _mask_token_id(target_json, mask_token)
    spec = ObjectiveSpec(settings["objective"], settings.get("objective_hparams") or {},
                         settings.get("normalization")).resolved(int(settings["block_size"]))
    run_yaml, run, num_prompts = _write_run(settings, target_json, features_dir, out_dir.name, scratch_dir, topology,
                                            spec, int(mask_token_id), max_length)
    log.write(f"specforge: {num_prompts} sequences, capture GPUs {list(topology.capture_gpus)}, trainer GPUs "
              f"{list(topology.trainer_gpus)}, micro-batch {topology.micro_batch_size} x accumulation "
              f"{topology.grad_accumulation} x ranks {len(topology.trainer_gpus)}\n")

    started = time.perf_counter()
    code, output = _run([*cli_prefix(), "train", "--config", str(run_yaml)], log)
    wall = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"SpecForge training exited with code {code}; see the log above and "
                           f"{run['deployment']['disaggregated']['control_dir']}/logs")
    steps = epoch_steps(run, num_prompts)
    _export_epochs(run, steps, out_dir, log)

    epochs = int(settings["epochs"])
    total = steps[epochs]
    schedule = RunSchedule(epochs=epochs, steps=total, steps_per_epoch=int(run["training"]["save_interval"]))
    step_rows = [_step_row(row, schedule) for row in parse_step_metrics(output)]
    step_times = [r["step_time_s"] for r in step_rows if r["step_time_s"] is not None]
    time_per_step = sum(step_times) / len(step_times) if step_times else wall / total
    summary = run_summary(
        step_rows,
        objective=spec.objective,
        hparams=spec.hparams,
        normalization=spec.normalization,
        schedule=schedule,
        # SpecForge's step time if it logs one, else wall time / steps
        timing=RunTiming(time_per_step_s=time_per_step, time_per_epoch_s=time_per_step * total / epochs,
                         wall_time_s=wall),
        num_sequences=num_prompts,
        config={**settings, "mask_token_id": int(mask_token_id), "max_length": max_length},
        backend_run=BackendRun(backend="specforge", epoch_end_steps={str(k): v for k, v in steps.items()},
                               topology=asdict(topology), specforge_run=str(run_yaml)),
    )
    write_records(out_dir, step_rows, summary)
    return summary


def _mask_token_id(target_json: str | Path, mask_token: str | None) -> int:
    from dpace.targets import load_tokenizer

    tokenizer = load_tokenizer(target_json)
    mask_token_id = tokenizer.convert_tokens_to_ids(mask_token)
    if not isinstance(mask_token_id, int) or mask_token_id == tokenizer.unk_token_id:
        raise ValueError(f"mask_token {mask_token!r} is not a token of the target's tokenizer; "
                         "give the target a mask_token_id")
    return mask_token_id


def _write_run(settings: dict, target_json, features_dir, run_id: str, scratch_dir: Path, topology: Topology,
               spec: ObjectiveSpec, mask_token_id: int, max_length: int) -> tuple[Path, dict, int]:
    """The run's inputs in ``scratch_dir`` (draft config, prompts) and its YAML: (its path, the run, the number
    of sequences SpecForge trains on)."""
    from transformers import AutoConfig

    from dpace.features import load_features
    from dpace.targets import model_location

    target_path, trust = model_location(target_json)
    features = load_features(features_dir)
    target_config = AutoConfig.from_pretrained(target_path, trust_remote_code=trust)
    draft_config = write_draft_config(scratch_dir / "draft_config.json", target_config,
                                      depth=int(settings["depth"]), block_size=int(settings["block_size"]),
                                      layer_ids=list(features.layer_ids), mask_token_id=mask_token_id,
                                      spec=spec)
    prompts = scratch_dir / "prompts.jsonl"
    write_prompts(features_dir, prompts)
    num_prompts = accepted_prompts(prompts, max_length)
    attempt = time.strftime("%Y%m%d-%H%M%S")
    paths = RunPaths(run_id=run_id, target_path=str(target_path), draft_config_path=str(draft_config),
                     prompts_path=str(prompts), output_dir=str(scratch_dir / "specforge"),
                     control_dir=str(scratch_dir / f"control-{attempt}"), cache_dir=str(scratch_dir / "cache"))
    run = run_config(paths=paths, settings=settings, num_prompts=num_prompts, topology=topology,
                     mask_token_id=mask_token_id, trust_remote_code=trust, max_length=max_length)
    validate_run_config(run)
    run_yaml = scratch_dir / "run.yaml"
    atomic_write_text(run_yaml, yaml.safe_dump(run, sort_keys=False))
    return run_yaml, run, num_prompts


def _export_epochs(run: dict, steps: dict[int, int], out_dir: Path, log) -> None:
    """Each epoch's SpecForge checkpoint exported as the workflow's ``epoch-<e>/`` drafter; then the checkpoints
    (fp32 masters and Adam moments, GBs each) are dropped."""
    output_dir = Path(run["output_dir"])
    draft_config = run["model"]["draft_model_config"]
    for epoch, step in steps.items():
        checkpoint = output_dir / f"{run['run_id']}-step{step}"
        if not checkpoint.exists():
            raise RuntimeError(f"SpecForge wrote no checkpoint for epoch {epoch} (expected {checkpoint})")
        # Exported into a temporary folder that replaces a previous attempt's export only when complete.
        with atomic_folder(out_dir / EPOCH_DIR.format(epoch=epoch)) as target:
            target.rmdir()  # the exporter makes its output folder itself
            code, _ = _run([*cli_prefix(), "export", "--to", "hf", "--checkpoint", str(checkpoint),
                            "--draft-config", str(draft_config), "--output-dir", str(target)], log)
            if code != 0:
                raise RuntimeError(f"specforge export of {checkpoint} exited with code {code}")
            write_checksums(target)
    for checkpoint in output_dir.glob(f"{run['run_id']}-step*"):
        shutil.rmtree(checkpoint, ignore_errors=True)


__all__ = ["algorithm_registration", "cli_prefix", "main", "objective_of_run", "parse_step_metrics", "registry",
           "train_with_specforge"]


if __name__ == "__main__":
    raise SystemExit(main())
