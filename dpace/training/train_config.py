"""One drafter's training settings (``TrainConfig``), built from the config's ``train`` section.

The schema (workflow/schemas/config.schema.yaml) is the one home of every training knob's default and
allowed values; this module reads both from there. It imports no torch, so the workflow's rules can
build a training job's cache key from it (``train_knobs``) without loading the training stack.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from dpace.schema import load_schema, schema_defaults


@dataclass(kw_only=True)
class TrainConfig:
    """One drafter's training settings. Every field named like a key of the config's ``train`` section
    takes its value, and its default, from there (``from_config``; the schema holds the defaults):
    a new training knob is a key in workflow/schemas/config.schema.yaml and a field here, nothing more."""

    objective: str
    objective_hparams: dict = field(default_factory=dict)  # alpha / gamma / k, of this objective only
    normalization: str | None = None  # None: as the released code (see dpace.training.objectives)
    depth: int
    block_size: int
    mask_token: str  # an unused special token fills the block's masked slots
    mask_token_id: int | None = None  # overrides mask_token (Qwen3's 151669 has no token string)
    num_anchors: int
    epochs: int
    learning_rate: float
    warmup_ratio: float
    max_grad_norm: float
    micro_batch_size: int
    grad_accumulation: int
    weight_decay: float
    seed: int  # the drafter's own training seed (the workflow resolves train.seed: Variant.seed)
    objective_chunk_blocks: int  # >0 bounds logits memory with activation checkpointing
    save_every_steps: int  # resumable state cadence (optimizer steps)
    threads: int = 0  # torch CPU threads; 0 keeps torch's default
    device: str = "cpu"
    # The paper's single-GPU setting is bf16 + flex_attention (SpecForge's defaults). bf16 autocasts
    # the forward (weights, gradients and AdamW stay fp32); flex_attention builds SpecForge's block
    # mask instead of a dense SDPA mask, which is what keeps 512 anchors x 2048 tokens in memory.
    precision: str  # fp32 | bf16 | auto (bf16 where the device computes it natively: resolve_precision)
    attention_backend: str  # sdpa | flex_attention
    # "random" as the paper; "target" starts the layers from the target's top layers (a named
    # deviation for short CPU runs, applied to every objective alike: dpace.training.drafter.initialise_from_target).
    drafter_init: str
    # 0: the drafter proposes from the target's whole vocabulary (the paper). N > 0: from the N tokens
    # most frequent in the training responses only, a named deviation that makes a CPU step ~4x
    # cheaper (dpace.training.draft_vocab); applied to every objective alike.
    draft_vocab_size: int
    # 0: every drafter layer attends to the whole context (the paper). W > 0: to the last W positions only
    # (DFlash's sliding_attention layers), a named deviation (dpace.training.drafter.drafter_config).
    sliding_window: int
    # "none": the drafter's fc reads the target's raw hidden states (the paper). "rms": it trains on each
    # feature dimension divided by its RMS over the answers, and saves fc with the scale folded in, so the
    # checkpoint decodes from raw states (a named deviation: dpace.training.drafter.with_raw_feature_input).
    feature_scaling: str

    @classmethod
    def from_config(cls, train: dict, **overrides) -> TrainConfig:
        """The settings of ``train`` (a config's ``train`` section, or part of one: the schema's defaults
        fill the rest) that are passed as they are, with ``overrides`` (the variant's and the job's own:
        objective, depth, seed, device, ...) on top."""
        return cls(**{**train_knobs(train, with_variant_defaults=True), **overrides})


# TrainConfig fields that the workflow resolves per drafter variant (dpace.config.Variant.train_settings)
# rather than taking them from the train section as they are; the section's key objective_hparams maps
# every objective to its hyperparameters, the field holds one objective's.
VARIANT_FIELDS = ("objective", "objective_hparams", "normalization", "depth", "block_size", "epochs")
# Keys of the train section that are no TrainConfig field: the trainer (backend) and how many seeds of each
# variant are trained (seeds); seed is the field's source but null there means the config's top-level seed.
WORKFLOW_KEYS = ("backend", "seed", "seeds")


def train_knobs(train: dict, *, with_variant_defaults: bool = False) -> dict:
    """The TrainConfig fields that ``train`` (a train section; the schema's defaults fill what it lacks)
    sets for every drafter alike: what a training job's cache key holds besides its variant's settings,
    so that a changed knob retrains, and a knob that no variant of it reads (another objective's
    hyperparameters, the number of seeds) does not. ``with_variant_defaults`` adds the section's depth,
    block size and epochs (what a variant that sets none of its own trains with)."""
    section = {**schema_defaults("train"), **train}
    skipped = {*WORKFLOW_KEYS, "objective_hparams", *(() if with_variant_defaults else VARIANT_FIELDS)}
    return {f.name: section[f.name] for f in fields(TrainConfig) if f.name in section and f.name not in skipped}


def check_train_config(config: TrainConfig) -> None:
    """The schema's checks of every field that is a train-section key (enums, ranges), for a TrainConfig
    built without a validated config: the schema is the one place they are written."""
    import jsonschema

    properties = load_schema()["properties"]["train"]["properties"]
    for name, value in asdict(config).items():
        if name not in properties or name in WORKFLOW_KEYS + ("objective_hparams",):
            continue
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(properties[name]).iter_errors(value))
        if error is not None:
            allowed = properties[name].get("enum")
            raise ValueError(f"{name} {value!r}; valid: {', '.join(map(str, allowed))}" if allowed
                             else f"{name} {value!r}: {error.message}")
