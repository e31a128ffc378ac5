"""DFlash draft models: build one for a target, save it, load it for decoding.

Training uses SpecForge 0.2.0's ``DFlashDraftModel``; decoding uses the DFlash authors'
``dflash.model.DFlashDraftModel``. Both share the same parameter names, so a checkpoint saved
from the first loads into the second with ``from_pretrained``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import PretrainedConfig, Qwen3Config

from dpace.io import atomic_folder, verify_checksums, write_checksums
from dpace.targets import GROUPED_KV_SDPA


def drafter_config(
    target_config: PretrainedConfig,
    *,
    depth: int,
    block_size: int,
    target_layer_ids: list[int],
    mask_token_id: int,
    draft_vocab: list[int] | None = None,
    sliding_window: int = 0,
) -> Qwen3Config:
    """A Qwen3-style block drafter that shares the target's width, vocabulary and RoPE.

    The drafter reads the target's token embeddings and LM head, so its hidden size and
    vocabulary must equal the target's; its depth is the paper's "3L"/"5L". ``draft_vocab``
    (``dpace.training.draft_vocab``) restricts the tokens it proposes; it travels in the checkpoint's config.
    ``sliding_window`` > 0 makes every layer a DFlash ``sliding_attention`` layer: a block token at
    position p sees the context positions after p - sliding_window only (and the block causally), as
    both SpecForge's trainer and the ``dflash`` decoder implement it; 0 is the paper's full attention.
    """
    if sliding_window < 0:
        raise ValueError(f"sliding_window must be >= 0 (0: full attention), got {sliding_window}")
    if depth < 1:
        raise ValueError(f"drafter depth must be >= 1, got {depth}")
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    num_target_layers = target_config.num_hidden_layers
    bad = [i for i in target_layer_ids if not 0 <= i < num_target_layers]
    if bad:
        raise ValueError(
            f"target_layer_ids {bad} are outside the target's layers 0..{num_target_layers - 1}"
        )
    hidden = target_config.hidden_size
    heads = target_config.num_attention_heads
    rope = getattr(target_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    config = Qwen3Config(
        vocab_size=target_config.vocab_size,
        hidden_size=hidden,
        intermediate_size=target_config.intermediate_size,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", heads),
        head_dim=getattr(target_config, "head_dim", None) or hidden // heads,
        rms_norm_eps=target_config.rms_norm_eps,
        max_position_embeddings=target_config.max_position_embeddings,
        rope_parameters=dict(rope),
        tie_word_embeddings=False,
        attention_bias=False,
        layer_types=["sliding_attention" if sliding_window else "full_attention"] * depth,
        # Qwen3Config keeps sliding_window only with use_sliding_window; layer_types says which layers use it.
        **({"use_sliding_window": True, "sliding_window": sliding_window} if sliding_window else {}),
    )
    config.num_target_layers = num_target_layers
    config.block_size = block_size
    config.dflash_config = {
        "target_layer_ids": list(target_layer_ids),
        "block_size": block_size,
        "mask_token_id": int(mask_token_id),
    }
    config.architectures = ["DFlashDraftModel"]
    if draft_vocab is not None:
        bad = [i for i in draft_vocab if not 0 <= i < target_config.vocab_size]
        if bad or not draft_vocab:
            raise ValueError(f"draft_vocab must be ids in 0..{target_config.vocab_size - 1}; got {bad[:5] or 'none'}")
        config.draft_vocab = [int(i) for i in draft_vocab]
    return config


def draft_vocab_of(config: PretrainedConfig) -> list[int] | None:
    """The drafter's draft vocabulary, or None when it proposes from the target's whole vocabulary."""
    return getattr(config, "draft_vocab", None)


def draft_output_head(config: PretrainedConfig, target_head):
    """The head that turns the drafter's hidden states into logits over the target's vocabulary."""
    vocab = draft_vocab_of(config)
    if vocab is None:
        return target_head
    from dpace.training.draft_vocab import FullVocabDraftHead

    return FullVocabDraftHead(target_head, vocab)


def build_drafter(config: Qwen3Config, seed: int = 0, attention_backend: str = "sdpa"):
    """A freshly initialised SpecForge ``DFlashDraftModel`` (the training-side class).

    ``attention_backend`` must match the ``OnlineDFlashModel`` wrapping it: that wrapper builds a
    flex_attention ``BlockMask`` or a dense SDPA mask, and the layers consume whichever it built.
    """
    from specforge.modeling.draft.dflash import DFlashDraftModel

    # SDPA without per-head key/value copies on a CPU (dpace.targets.grouped_kv_sdpa; plain SDPA elsewhere):
    # the dense DFlash mask made transformers copy them three times per step, in the backward pass too.
    config._attn_implementation = GROUPED_KV_SDPA if attention_backend == "sdpa" else attention_backend
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return DFlashDraftModel(config).float()


def with_raw_feature_input(drafter, feature_scale: torch.Tensor):
    """A copy of ``drafter`` that takes raw target features, for one trained on features / ``feature_scale``.

    ``train.feature_scaling: rms`` (a named deviation) trains on each target feature dimension divided
    by its RMS: SmolLM2's states hold over half their energy in 5 of 576 dimensions, so raw features
    make every context position look alike to ``fc`` (mean pairwise cosine 0.57; 0.05 once scaled).
    Dividing the inputs, not just ``fc``'s initial columns, keeps AdamW's per-weight steps the same
    size for every dimension. fc(x / s) = (W / s) x, so the checkpoint is an ordinary DFlash drafter
    whose ``fc`` columns are divided by s: decoding feeds it the target's raw states.
    """
    if feature_scale.shape != (drafter.fc.weight.shape[1],):
        raise ValueError(f"feature_scale has shape {tuple(feature_scale.shape)}; fc takes {drafter.fc.weight.shape[1]} features")
    raw_input = copy.deepcopy(drafter)
    with torch.no_grad():
        raw_input.fc.weight.div_(feature_scale.to(raw_input.fc.weight))
    return raw_input


def initialise_from_target(drafter, target) -> None:
    """``drafter_init: target``, a named deviation from the paper (which initialises at random).

    The drafter's layers start as copies of the target's last ``depth`` decoder layers and its final
    norm as the target's, and ``fc`` starts by passing through the deepest captured target feature,
    so the first step already maps context states the way the target's top layers do. Only the
    Qwen3 per-head q/k norms, which a Llama target lacks, keep their default (identity) weights.
    """
    target_layers = target.model.layers[-len(drafter.layers):]
    for ours, theirs in zip(drafter.layers, target_layers, strict=True):
        missing, unexpected = ours.load_state_dict(theirs.state_dict(), strict=False)
        if unexpected or any(not key.startswith(("self_attn.q_norm", "self_attn.k_norm")) for key in missing):
            raise ValueError(f"target layer does not fit the drafter layer: missing {missing}, unexpected {unexpected}")
    drafter.norm.load_state_dict(target.model.norm.state_dict())
    hidden = drafter.fc.weight.shape[0]
    with torch.no_grad():
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, -hidden:] = torch.eye(hidden)
        if drafter.fc.bias is not None:
            drafter.fc.bias.zero_()


def save_drafter(model, path: str | Path) -> None:
    """Save in the HF layout that ``dflash.model.DFlashDraftModel.from_pretrained`` reads (atomically:
    the folder appears complete or not at all)."""
    with atomic_folder(path) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        write_checksums(tmp)


def load_drafter(path: str | Path, dtype: torch.dtype = torch.float32):
    """Load a checkpoint into the DFlash authors' decoding class; fail clearly if it is not one."""
    from dflash.model import DFlashDraftModel

    path = Path(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise ValueError(f"{path} is not a DFlash drafter checkpoint: no config.json")
    config = Qwen3Config.from_pretrained(str(path))
    dflash_config = getattr(config, "dflash_config", None) or {}
    missing = [k for k in ("target_layer_ids", "block_size", "mask_token_id") if k not in dflash_config]
    if missing:
        raise ValueError(f"{path} is not a DFlash drafter checkpoint: dflash_config lacks {missing}")
    verify_checksums(path, fix=f"delete {path.parent} and rerun its training")  # a truncated or edited file
    model = DFlashDraftModel.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def check_drafter_matches_target(drafter_config_: PretrainedConfig, target_config: PretrainedConfig) -> None:
    """A drafter reuses its target's embeddings and LM head: width and vocabulary must agree."""
    for key in ("hidden_size", "vocab_size"):
        ours, theirs = getattr(drafter_config_, key), getattr(target_config, key)
        if ours != theirs:
            raise ValueError(f"drafter {key}={ours} does not match the target's {key}={theirs}")
    layer_ids = (getattr(drafter_config_, "dflash_config", None) or {}).get("target_layer_ids", [])
    if any(i >= target_config.num_hidden_layers for i in layer_ids):
        raise ValueError(
            f"drafter target_layer_ids {layer_ids} exceed the target's {target_config.num_hidden_layers} layers"
        )
