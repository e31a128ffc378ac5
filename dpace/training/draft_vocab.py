"""A pruned draft vocabulary: the drafter scores only the tokens the target answers with most often.

A named deviation from the paper (``train.draft_vocab_size``; 0 keeps the target's whole vocabulary,
as DFlash does), in the spirit of EAGLE-3's draft vocabulary. On a CPU the drafter's output layer is
most of a training step (SmolLM2: 49,152 x 576 against one 576-wide decoder layer); scoring the
4,096 most frequent tokens (96% of the embedded run's training responses) makes a step ~4x cheaper, and the drafter
can never propose a token outside them, which costs little when it would rarely guess one.

The head keeps the target's own output rows (frozen, as the full head is). Training scores the draft
vocabulary only, and a block position whose target token lies outside it is left out of the
objective, like any other unsupervised position. Decoding and scoring use ``FullVocabDraftHead``:
logits over the whole vocabulary with -inf outside the draft vocabulary, so argmax, sampling,
rejection sampling and the recorded q see exactly the distribution the drafter proposes from.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def select_draft_vocab(response_ids: Tensor, size: int, vocab_size: int) -> list[int]:
    """The ``size`` token ids most frequent in ``response_ids`` (ties: smaller id first), ascending.

    Fewer when the responses hold fewer distinct tokens: tokens the target never answered with
    in training are never kept.
    """
    if size < 1:
        raise ValueError(f"draft vocabulary size must be >= 1, got {size}")
    counts = torch.bincount(response_ids.long().flatten(), minlength=vocab_size)
    # A stable sort on -count keeps ascending ids among equal counts: the choice is deterministic.
    by_count = torch.sort(-counts, stable=True).indices
    kept = by_count[: min(size, int((counts > 0).sum()))]
    return sorted(kept.tolist())


class DraftVocabHead(nn.Module):
    """The target's output rows of the draft vocabulary: logits over the draft vocabulary only."""

    def __init__(self, target_head: nn.Module, draft_vocab: list[int] | Tensor):
        super().__init__()
        ids = torch.as_tensor(draft_vocab, dtype=torch.long, device=target_head.weight.device)
        full_size = target_head.weight.shape[0]
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= full_size:
            raise ValueError(f"draft vocabulary ids must lie in 0..{full_size - 1}")
        if ids.unique().numel() != ids.numel():
            raise ValueError("draft vocabulary ids must be distinct")
        self.register_buffer("weight", target_head.weight.detach()[ids].clone(), persistent=False)
        self.register_buffer("draft_ids", ids, persistent=False)
        # target id -> position in the draft vocabulary, -1 outside it
        to_draft = torch.full((full_size,), -1, dtype=torch.long, device=ids.device)
        to_draft[ids] = torch.arange(ids.numel(), device=ids.device)
        self.register_buffer("to_draft", to_draft, persistent=False)

    def forward(self, hidden: Tensor) -> Tensor:
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        return nn.functional.linear(hidden, self._weight_in(dtype))

    def _weight_in(self, dtype: torch.dtype) -> Tensor:
        """The frozen rows in ``dtype``, cast once: under autocast the product runs in its dtype, and
        autocast casts only trained weights once per region, so this buffer was cast again at every call
        (twice a step, in training). The values are those of the per-call cast."""
        if self.weight.dtype == dtype:
            return self.weight
        cached = getattr(self, "_cast", None)
        if cached is None or cached[0] is not self.weight or cached[1].dtype != dtype:
            cached = (self.weight, self.weight.to(dtype))
            self._cast = cached
        return cached[1]

    def draft_index(self, target_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Each target id's index in the draft vocabulary (0 where outside) and whether it is inside."""
        index = self.to_draft[target_ids]
        return index.clamp(min=0), index >= 0


class FullVocabDraftHead(nn.Module):
    """Logits over the target's whole vocabulary, -inf outside the draft vocabulary, computed from
    the draft vocabulary's rows only."""

    def __init__(self, target_head: nn.Module, draft_vocab: list[int] | Tensor):
        super().__init__()
        self.draft_head = DraftVocabHead(target_head, draft_vocab)
        self.vocab_size = target_head.weight.shape[0]

    def forward(self, hidden: Tensor) -> Tensor:
        draft_logits = self.draft_head(hidden)
        logits = draft_logits.new_full((*draft_logits.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.draft_head.draft_ids, draft_logits)
