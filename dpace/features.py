"""Target features for drafter training: token ids, assistant loss mask, and the target's hidden
states at the drafter's ``target_layer_ids`` (plus its last hidden state, for objectives that need
the target's distribution).

Computed once per (target, dataset) and shared by every drafter trained on them, stored compactly
(bf16 safetensors shards). For targets too large to cache, ``mode: online`` makes the trainer call
``target_hidden_states`` per step instead, with the same tokenisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from dpace.io import (
    atomic_folder,
    atomic_write_json,
    load_safetensors,
    read_json,
    read_jsonl,
    verify_checksums,
    write_checksums,
)
from dpace.schema import schema_defaults, schema_enum
from dpace.targets import chat_prompt_ids, load_target, resolve_dtype, stop_token_ids

STORE_DTYPE = torch.bfloat16
SORT_WINDOW_BATCHES = 8
# SpecForge's DFlash recipe drops a sequence with fewer response tokens than this after truncation
# (specforge.algorithms.model_providers.dflash_min_loss_tokens).
MIN_LOSS_TOKENS = 2
DEFAULTS = schema_defaults("features")


def default_target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """SpecForge's ``build_target_layer_ids``: features spread from layer 1 to L-3."""
    if num_features == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_features - 1)) for i in range(num_features)]


def tokenize_conversation(tokenizer, conversation: dict, end_token_id: int) -> tuple[list[int], list[int]]:
    """Prompt ids + response ids + end token, and a loss mask that is 1 on the assistant's tokens.

    Built from the same ``chat_prompt_ids`` the target was prompted with, so the response tokens
    sit exactly where the target produced them. A response that ``max_new_tokens`` cut
    (``"truncated": true``, written by ``dpace.responses.generation``) gets no end token: the target did not
    end its turn there.
    """
    turns = conversation.get("conversations") or []
    user = next((t for t in turns if t.get("role") == "user"), None)
    assistant = next((t for t in turns if t.get("role") == "assistant"), None)
    if user is None or assistant is None:
        raise ValueError(f"conversation {conversation.get('id')!r} has no user and assistant turn")
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": user["content"]}])
    response = tokenizer(assistant["content"], add_special_tokens=False)["input_ids"]
    if not conversation.get("truncated"):
        response = response + [end_token_id]
    return prompt + response, [0] * len(prompt) + [1] * len(response)


def target_hidden_states(target, input_ids, attention_mask, layer_ids: list[int], with_last: bool):
    """Concatenated hidden states of ``layer_ids`` (DFlash's +1 offset: index 0 is the embeddings)
    and, optionally, the final (post-norm) hidden state whose LM head gives the target's logits."""
    output = target.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    hidden = torch.cat([output.hidden_states[i + 1] for i in layer_ids], dim=-1)
    last = output.last_hidden_state if with_last else None
    return hidden, last


@dataclass
class FeatureSet:
    """All sequences of one (target, dataset), flattened; ``offsets`` delimit the sequences."""

    input_ids: torch.Tensor  # [T] int32
    loss_mask: torch.Tensor  # [T] uint8
    offsets: torch.Tensor  # [N + 1] int64
    hidden: torch.Tensor | None  # [T, len(layer_ids) * H] bf16 (None in online mode)
    last_hidden: torch.Tensor | None  # [T, H] bf16
    layer_ids: list[int]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def select(self, indices) -> FeatureSet:
        """The sequences ``indices``, in that order, as a new set (e.g. a held-out split)."""
        return self.slices([(int(self.offsets[i]), int(self.offsets[i + 1])) for i in indices])

    def slices(self, spans: list[tuple[int, int]]) -> FeatureSet:
        """A new set whose sequences are the token ranges ``spans`` ([start, end) of the flat tensors)."""
        lengths = torch.tensor([0] + [end - start for start, end in spans])

        def take(tensor):
            return None if tensor is None else torch.cat([tensor[start:end] for start, end in spans])

        return FeatureSet(
            input_ids=take(self.input_ids), loss_mask=take(self.loss_mask), offsets=lengths.cumsum(0),
            hidden=take(self.hidden), last_hidden=take(self.last_hidden), layer_ids=list(self.layer_ids),
        )

    @classmethod
    def concatenate(cls, sets: list[FeatureSet]) -> FeatureSet:
        """One set of the sequences of ``sets``, in order (shards of one directory, or several data sets)."""
        if not sets:
            raise ValueError("nothing to concatenate")
        if any(list(s.layer_ids) != list(sets[0].layer_ids) for s in sets):
            raise ValueError("feature sets captured different target layers")
        lengths = torch.cat([torch.zeros(1, dtype=torch.long)] + [s.offsets[1:] - s.offsets[:-1] for s in sets])

        def cat(name):
            parts = [getattr(s, name) for s in sets]
            if all(part is None for part in parts):
                return None
            if any(part is None for part in parts):
                raise ValueError(f"some feature sets have no {name!r}")
            return torch.cat(parts)

        return cls(
            input_ids=cat("input_ids"), loss_mask=cat("loss_mask"), offsets=lengths.cumsum(0),
            hidden=cat("hidden"), last_hidden=cat("last_hidden"), layer_ids=list(sets[0].layer_ids),
        )

    def without_unseen_context(self, sliding_window: int) -> FeatureSet:
        """Each sequence without the leading positions that no block of a ``sliding_window`` drafter sees.

        Anchors lie on supervised tokens, and a block anchored at ``a`` attends to the context
        positions ``a - sliding_window + 1 .. a - 1`` only (SpecForge's ``create_dflash_sdpa_mask``),
        so nothing before ``first supervised - sliding_window + 1`` reaches a loss term. RoPE is
        relative, so dropping those positions shifts every position alike and changes no logit; it
        halves the embedded default's padded context (prompts are most of a sequence). Sequences
        without a supervised token are kept whole.
        """
        if sliding_window < 1:
            raise ValueError(f"only a sliding-window drafter ignores early context (got {sliding_window})")
        spans = []
        for index in range(len(self)):
            start, end = int(self.offsets[index]), int(self.offsets[index + 1])
            supervised = (self.loss_mask[start:end] > 0).nonzero()
            first_visible = int(supervised[0]) - sliding_window + 1 if len(supervised) else 0
            spans.append((start + max(0, first_visible), end))
        return self.slices(spans)

    def sequence(self, index: int) -> dict:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        item = {
            "input_ids": self.input_ids[start:end].long(),
            "loss_mask": self.loss_mask[start:end].float(),
        }
        if self.hidden is not None:
            item["hidden"] = self.hidden[start:end]
        if self.last_hidden is not None:
            item["last_hidden"] = self.last_hidden[start:end]
        return item


def answer_feature_rms(features: FeatureSet, rows_per_chunk: int = 16384) -> torch.Tensor:
    """Each target feature dimension's RMS over the answer (loss-mask) positions, float32 [len(layer_ids) * H].

    Answer positions only: the first token of every sequence carries the target's attention-sink
    activations (SmolLM2: up to 25,000, where no dimension's RMS over the answers exceeds 450), which
    would set a few dimensions' scale by one position per sequence that a drafter rarely attends to.
    """
    if features.hidden is None:
        raise ValueError("feature RMS needs cached features (features.mode: cached)")
    answer = features.loss_mask > 0
    if not answer.any():
        raise ValueError("the features hold no answer positions")
    squares = torch.zeros(features.hidden.shape[-1], dtype=torch.float64)
    for start in range(0, len(answer), rows_per_chunk):
        rows = features.hidden[start : start + rows_per_chunk][answer[start : start + rows_per_chunk]]
        squares += rows.double().pow(2).sum(0)
    return (squares / int(answer.sum())).sqrt().clamp_min(1e-6).float()


@dataclass(frozen=True, kw_only=True)
class FeatureSettings:
    """How one (target, dataset)'s features are computed: the config's ``features`` section, each field named
    as the schema (workflow/schemas/config.schema.yaml) names its key, and resolved per target by the workflow
    (a target's own ``target_layer_ids`` first)."""

    target_layer_ids: list[int] | None  # None: num_target_features layers spread as SpecForge's (default_target_layer_ids)
    max_seq_length: int
    num_target_features: int = 3
    mode: str = "cached"  # "online": only tokens are stored, the trainer runs the target every step
    batch_size: int = 8
    # the target's precision in this forward pass (bfloat16 is SpecForge's, and ~2x faster on CPUs with AMX;
    # ``auto`` takes it where it is native, see ``targets.resolve_dtype``); features are stored in bf16 either
    # way, and the index records the precision they were captured in.
    dtype: str = DEFAULTS["dtype"]


def compute_features(
    target_json: str | Path,
    conversations_path: str | Path,
    out_dir: str | Path,
    settings: FeatureSettings,
    *,
    device: str = "cpu",
    with_last_hidden: bool = True,
    shard_tokens: int = 2_000_000,
) -> dict:
    """Write ``out_dir/index.json`` and shards; returns counts. ``mode="online"`` stores only tokens."""
    mode, max_seq_length = settings.mode, settings.max_seq_length
    if mode not in schema_enum("features", "mode"):
        raise ValueError(f"features.mode {mode!r}; valid: {', '.join(schema_enum('features', 'mode'))}")
    target, tokenizer = load_target(target_json, device=device,
                                    dtype=getattr(torch, resolve_dtype(settings.dtype, device)))
    layer_ids = settings.target_layer_ids
    if layer_ids is None:
        layer_ids = default_target_layer_ids(target.config.num_hidden_layers, settings.num_target_features)
    bad = [i for i in layer_ids if not 0 <= i < target.config.num_hidden_layers]
    if bad:
        raise ValueError(f"target_layer_ids {bad} are outside the target's {target.config.num_hidden_layers} layers")
    end_token = stop_token_ids(tokenizer)[0] if tokenizer.eos_token_id is None else tokenizer.eos_token_id
    sequences, truncated, too_few_loss_tokens = [], 0, 0
    for conversation in read_jsonl(conversations_path):
        ids, mask = tokenize_conversation(tokenizer, conversation, end_token)
        if len(ids) > max_seq_length:
            # SpecForge keeps the first max_length tokens (data/prompt_builder.py); dropping instead
            # would remove exactly the long math and code answers the paper trained on.
            truncated += 1
            ids, mask = ids[:max_seq_length], mask[:max_seq_length]
        if sum(mask) < MIN_LOSS_TOKENS:
            too_few_loss_tokens += 1  # a prompt that fills the window leaves nothing to learn
            continue
        sequences.append((ids, mask))
    if not sequences:
        raise ValueError(
            f"{conversations_path}: no conversation keeps {MIN_LOSS_TOKENS} response tokens within "
            f"max_seq_length={max_seq_length}"
        )

    with atomic_folder(out_dir) as tmp_dir:  # shards and index appear together, or not at all
        return _write_shards(target, sequences, tmp_dir, mode=mode, layer_ids=layer_ids,
                             with_last_hidden=with_last_hidden, batch_size=settings.batch_size,
                             shard_tokens=shard_tokens, device=device,
                             counts={"truncated": truncated, "skipped_too_few_loss_tokens": too_few_loss_tokens})


def _write_shards(target, sequences, out_dir: Path, *, mode, layer_ids, with_last_hidden, batch_size,
                  shard_tokens, device, counts: dict) -> dict:
    """The shards and index of ``sequences``; ``counts``: how many conversations were truncated or skipped."""
    shards, pending, pending_tokens = [], [], 0

    def flush():
        nonlocal pending, pending_tokens
        if not pending:
            return
        lengths = torch.tensor([len(p["input_ids"]) for p in pending])
        tensors = {
            "input_ids": torch.cat([p["input_ids"] for p in pending]),
            "loss_mask": torch.cat([p["loss_mask"] for p in pending]),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        }
        for key in ("hidden", "last_hidden"):
            if key in pending[0]:
                tensors[key] = torch.cat([p[key] for p in pending]).contiguous()
        name = f"shard-{len(shards):05d}.safetensors"
        save_file(tensors, str(out_dir / name))
        shards.append(name)
        pending, pending_tokens = [], 0

    # Sequences of similar length share a batch (less padding to compute), within windows of a few
    # batches so that memory stays bounded; each window is stored in the conversations' order.
    window = batch_size * SORT_WINDOW_BATCHES
    progress = tqdm(total=len(sequences), desc="features", unit="seq")
    for window_start in range(0, len(sequences), window):
        chunk = sequences[window_start : window_start + window]
        records = [
            {"input_ids": torch.tensor(ids, dtype=torch.int32), "loss_mask": torch.tensor(mask, dtype=torch.uint8)}
            for ids, mask in chunk
        ]
        by_length = sorted(range(len(chunk)), key=lambda i: len(chunk[i][0]))
        for start in range(0, len(chunk), batch_size):
            batch = by_length[start : start + batch_size]
            if mode == "cached":
                width = max(len(chunk[i][0]) for i in batch)
                input_ids = torch.zeros((len(batch), width), dtype=torch.long)
                attention = torch.zeros((len(batch), width), dtype=torch.long)
                for row, i in enumerate(batch):
                    input_ids[row, : len(chunk[i][0])] = torch.tensor(chunk[i][0])
                    attention[row, : len(chunk[i][0])] = 1
                with torch.inference_mode():
                    hidden, last = target_hidden_states(
                        target, input_ids.to(device), attention.to(device), layer_ids, with_last_hidden
                    )
                for row, i in enumerate(batch):
                    length = len(chunk[i][0])
                    records[i]["hidden"] = hidden[row, :length].to("cpu", STORE_DTYPE)
                    if last is not None:
                        records[i]["last_hidden"] = last[row, :length].to("cpu", STORE_DTYPE)
            progress.update(len(batch))
        for record in records:
            pending.append(record)
            pending_tokens += len(record["input_ids"])
            if pending_tokens >= shard_tokens:
                flush()
    progress.close()
    flush()
    index = {
        "mode": mode,
        "layer_ids": list(layer_ids),
        "with_last_hidden": bool(with_last_hidden and mode == "cached"),
        "hidden_size": target.config.hidden_size,
        "capture_dtype": str(next(target.parameters()).dtype).removeprefix("torch."),
        "shards": shards,
        "num_sequences": len(sequences),
        "num_tokens": sum(len(ids) for ids, _ in sequences),
        **counts,
    }
    atomic_write_json(out_dir / "index.json", index)
    write_checksums(out_dir)  # load_features refuses a shard changed since (a flipped byte still loads)
    return index


def load_features(features_dir: str | Path) -> FeatureSet:
    features_dir = Path(features_dir)
    fix = f"delete {features_dir} and rerun"
    index = read_json(features_dir / "index.json", fix=fix)
    shards = [load_safetensors(features_dir / name, fix=fix) for name in index["shards"]]
    verify_checksums(features_dir, fix=fix, what="the feature folder")
    return FeatureSet.concatenate([
        FeatureSet(
            input_ids=shard["input_ids"], loss_mask=shard["loss_mask"], offsets=shard["offsets"],
            hidden=shard.get("hidden"), last_hidden=shard.get("last_hidden"), layer_ids=index["layer_ids"],
        )
        for shard in shards
    ])
