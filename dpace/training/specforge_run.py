"""The SpecForge run of one variant, as data: the objective's settings that travel with it (``ObjectiveSpec``),
the split of GPUs (``plan_topology``), the run YAML (``run_config``) and its inputs on disk (our tokenisation as
SpecForge's prompts, the drafter's config). ``dpace.training.specforge_backend`` registers the objective with
SpecForge, launches the run and turns its checkpoints into the workflow's drafters; its docstring tells why.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dpace.io import atomic_file, atomic_write_text

ALGORITHM_NAME = "dpace"
OBJECTIVE_KEY = "dpace_objective"
MIN_GPUS = 2


@dataclass(frozen=True)
class ObjectiveSpec:
    """Everything ``ObjectiveDFlashModel`` needs beyond SpecForge's own DFlash knobs."""

    objective: str = "dflash"
    hparams: dict = field(default_factory=dict)
    normalization: str | None = None

    def resolved(self, block_size: int) -> ObjectiveSpec:
        from dpace.training.objectives import canonical_objective, resolve_hparams, resolve_normalization

        objective = canonical_objective(self.objective)
        hparams = resolve_hparams(objective, block_size, **self.hparams)
        resolve_normalization(objective, self.normalization)
        return ObjectiveSpec(objective, dict(hparams), self.normalization)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ObjectiveSpec:
        return cls(data["objective"], dict(data.get("hparams") or {}), data.get("normalization"))

    @property
    def needs_target_logits(self) -> bool:
        from dpace.training.objectives import objective_record

        return objective_record(self.objective).needs_target_logits


@dataclass(frozen=True)
class Topology:
    capture_gpus: tuple[str, ...]
    trainer_gpus: tuple[str, ...]
    micro_batch_size: int
    grad_accumulation: int

    @property
    def quantum(self) -> int:
        """Samples per optimizer step, over all trainer ranks."""
        return len(self.trainer_gpus) * self.micro_batch_size * self.grad_accumulation


def plan_topology(gpus: list[str], micro_batch_size: int, grad_accumulation: int,
                  capture_gpus: int | None = None) -> Topology:
    """Split GPUs between capture servers and trainer ranks, keeping the effective batch."""
    gpus = [str(g) for g in gpus]
    if len(gpus) < MIN_GPUS:
        raise ValueError(
            f"train.backend=specforge needs at least {MIN_GPUS} GPUs (SpecForge's managed capture server and "
            f"its trainer run on disjoint GPUs); this job has {len(gpus)} ({gpus}). On one GPU use train.backend=local."
        )
    if capture_gpus is None:
        capture_gpus = int(os.environ.get("DPACE_SPECFORGE_CAPTURE_GPUS", 0)) or max(1, len(gpus) // 4)
    capture_gpus = min(max(1, capture_gpus), len(gpus) - 1)
    effective = micro_batch_size * grad_accumulation
    available = len(gpus) - capture_gpus
    ranks = max(d for d in range(1, effective + 1) if effective % d == 0 and d <= available)
    per_rank = effective // ranks
    micro = max(d for d in range(1, min(micro_batch_size, per_rank) + 1) if per_rank % d == 0)
    return Topology(tuple(gpus[:capture_gpus]), tuple(gpus[capture_gpus:capture_gpus + ranks]), micro,
                    per_rank // micro)


def free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
            ports.append(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return ports


@dataclass(frozen=True)
class RunPaths:
    """Where a SpecForge run reads and writes (strings, as the run YAML holds them)."""

    run_id: str
    target_path: str
    draft_config_path: str
    prompts_path: str
    output_dir: str
    control_dir: str
    cache_dir: str


def run_config(
    *,
    paths: RunPaths,
    settings: dict,
    num_prompts: int,
    topology: Topology,
    mask_token_id: int,
    ports: list[int] | None = None,
    trust_remote_code: bool = False,
    max_length: int = 2048,
    mem_fraction_static: float = 0.7,
) -> dict:
    """A SpecForge 0.2.0 run config (validated by ``specforge.config.schema.Config``) for one variant.

    Depth, block size and target layers come from the draft config alone: SpecForge's
    ``model.draft_num_hidden_layers`` override would also reset ``target_layer_ids`` to one feature
    per draft layer, while the paper uses three target features at every depth.

    ``settings`` holds the workflow's train settings: objective, objective_hparams, normalization,
    depth, block_size, epochs, num_anchors, learning_rate, warmup_ratio, max_grad_norm,
    objective_chunk_blocks, seed, weight_decay (SpecForge's AdamW has none: it must be 0), and optionally
    precision (default bf16) and attention_backend (default flex_attention).
    """
    precision = settings.get("precision", "bf16")
    return {
        "run_id": paths.run_id,
        "output_dir": paths.output_dir,
        "model": {
            "target_model_path": paths.target_path,
            "draft_model_config": paths.draft_config_path,
            "trust_remote_code": bool(trust_remote_code),
            # SpecForge trains on GPUs, where bf16 is native: "auto" is bf16 there.
            "torch_dtype": {"bf16": "bfloat16", "fp32": "float32", "auto": "bfloat16"}[precision],
            "mask_token_id": int(mask_token_id),
            "sglang_mem_fraction_static": mem_fraction_static,
        },
        "data": {"prompts_path": paths.prompts_path, "max_length": int(max_length), "cache_dir": paths.cache_dir},
        "training": _training_section(settings, num_prompts, topology),
        "tracking": {"report_to": "none"},
        "deployment": _deployment_section(paths, topology, ports or free_ports(3 + len(topology.capture_gpus))),
    }


def _training_section(settings: dict, num_prompts: int, topology: Topology) -> dict:
    """The run's ``training`` block: the optimizer, the schedule and one checkpoint per epoch."""
    if float(settings.get("weight_decay", 0.0) or 0.0) != 0.0:
        raise ValueError("train.backend=specforge: SpecForge 0.2.0's optimizer has no weight decay; set "
                         "train.weight_decay: 0")
    spec = ObjectiveSpec(settings["objective"], settings.get("objective_hparams") or {},
                         settings.get("normalization")).resolved(int(settings["block_size"]))
    steps_per_epoch = num_prompts // topology.quantum
    if steps_per_epoch < 1:
        raise ValueError(f"{num_prompts} training sequences give no optimizer step per epoch at "
                         f"{topology.quantum} sequences per step")
    training = {
        "strategy": ALGORITHM_NAME,
        "num_epochs": int(settings["epochs"]),
        "batch_size": topology.micro_batch_size,
        "accumulation_steps": topology.grad_accumulation,
        "learning_rate": float(settings["learning_rate"]),
        "lr_scheduler": "cosine",
        "warmup_ratio": float(settings["warmup_ratio"]),
        "max_grad_norm": float(settings["max_grad_norm"]),
        "attention_backend": settings.get("attention_backend", "flex_attention"),
        "num_anchors": int(settings["num_anchors"]),
        "objective_chunk_blocks": int(settings.get("objective_chunk_blocks") or 0),
        "save_interval": steps_per_epoch,
        "log_interval": 1,
        "max_checkpoints": 0,
        "seed": int(settings.get("seed", 0)),
        "role": "auto",
    }
    # Informational only (the registered provider trains ``spec``), but SpecForge checks their ranges.
    if "gamma" in spec.hparams:
        training["loss_decay_gamma"] = float(spec.hparams["gamma"])
    if "alpha" in spec.hparams:
        training["dpace_alpha"] = float(spec.hparams["alpha"])
    return training


def _deployment_section(paths: RunPaths, topology: Topology, ports: list[int]) -> dict:
    """The run's ``deployment`` block: SpecForge's managed single-node stack on the topology's GPUs."""
    return {
        "mode": "disaggregated",
        "trainer": {"nnodes": 1, "nproc_per_node": len(topology.trainer_gpus)},
        "disaggregated": {
            "control_dir": paths.control_dir,
            "backend": "mooncake",
            "managed_local": {
                "trainer_cuda_visible_devices": list(topology.trainer_gpus),
                "mooncake": {"rpc_port": ports[0], "metadata_port": ports[1], "metrics_port": ports[2]},
                "capture_servers": [
                    {"port": port, "cuda_visible_devices": [gpu], "tp_size": 1}
                    for port, gpu in zip(ports[3:], topology.capture_gpus, strict=True)
                ],
            },
        },
    }


def validate_run_config(run: dict):
    """SpecForge's own schema check of a run config; returns the parsed ``Config``."""
    from specforge.config.schema import Config, migrate_legacy_config

    return Config.model_validate(migrate_legacy_config(run))


def epoch_steps(run: dict, num_prompts: int) -> dict[int, int]:
    """Optimizer step at the end of each epoch (the last one is where SpecForge's run ends)."""
    from specforge.training.schedule import resolve_online_total_steps

    training = run["training"]
    epochs = int(training["num_epochs"])
    total = resolve_online_total_steps(
        num_prompts=num_prompts, prompt_epochs=epochs, dp_size=int(run["deployment"]["trainer"]["nproc_per_node"]),
        batch_size=int(training["batch_size"]), accumulation_steps=int(training["accumulation_steps"]),
    )
    steps = {e: e * int(training["save_interval"]) for e in range(1, epochs)}
    steps[epochs] = total
    return steps


# ---------------------------------------------------------------------------------------------
# Inputs on disk


def write_prompts(features_dir: str | Path, out_path: str | Path) -> int:
    """Our tokenisation as SpecForge's pre-tokenised prompts; returns how many SpecForge accepts."""
    from dpace.features import load_features

    features = load_features(features_dir)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out_path) as tmp, open(tmp, "w") as out:
        for i in range(len(features)):
            item = features.sequence(i)
            out.write(json.dumps({"input_ids": [int(t) for t in item["input_ids"]],
                                  "loss_mask": [int(m) for m in item["loss_mask"]]}) + "\n")
    return len(features)


def accepted_prompts(prompts_path: str | Path, max_length: int) -> int:
    """How many pre-tokenised prompts SpecForge's own prompt builder keeps (length, DFlash's
    minimum of 2 supervised tokens, consecutive supervised tokens)."""
    from specforge.data.loss_mask import has_consecutive_supervised_tokens
    from specforge.data.prompt_builder import prepare_prompt_tasks

    return len(prepare_prompt_tasks(
        str(prompts_path), None, chat_template=None, max_length=max_length, is_preformatted=False,
        train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=None, min_loss_tokens=2,
        loss_mask_filter=has_consecutive_supervised_tokens,
    ))


def write_draft_config(path: str | Path, target_config, *, depth: int, block_size: int, layer_ids: list[int],
                       mask_token_id: int, spec: ObjectiveSpec) -> Path:
    """The drafter's HF config (as the local backend builds it) plus the ``dpace_objective`` block."""
    from dpace.training.drafter import drafter_config

    config = drafter_config(target_config, depth=depth, block_size=block_size, target_layer_ids=layer_ids,
                            mask_token_id=mask_token_id)
    data = config.to_dict()
    data["architectures"] = ["DFlashDraftModel"]
    data["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    data[OBJECTIVE_KEY] = spec.to_dict()
    path = Path(path)
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True))
    return path
