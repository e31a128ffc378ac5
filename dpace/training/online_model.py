"""Any ``dpace.training.objectives`` objective inside SpecForge's own DFlash training wrapper.

``ObjectiveDFlashModel`` subclasses SpecForge's ``OnlineDFlashModel`` and keeps everything
that defines DFlash training (anchor sampling, noise embedding, block attention mask,
same-position labels: block position k predicts token anchor+k, position 0 is the clean
anchor) and replaces only the per-chunk objective, ``_dflash_objective_chunk_terms``, by
``dpace.training.objectives.objective_terms``. The chunk terms are additive, so SpecForge's
``checkpointed_chunk_reduce`` still bounds the memory of the [blocks, B, V] logits.
"""

from __future__ import annotations

import torch
from specforge.algorithms.common.dflash_family_model import (
    FLEX_ATTENTION_AVAILABLE,
    OnlineDFlashModel,
)
from specforge.core.chunking import checkpointed_chunk_reduce
from torch import Tensor, nn

from dpace.training.draft_vocab import DraftVocabHead
from dpace.training.objectives import ObjectiveTerms, normalize_terms, objective_record, objective_terms
from dpace.training.specforge_run import ObjectiveSpec


class ObjectiveDFlashModel(OnlineDFlashModel):
    """SpecForge DFlash training wrapper whose loss is any objective of ``dpace.training.objectives``.

    ``objective`` names the objective with its hyper-parameters (``gamma`` for dflash, ``alpha`` for the
    D-PACE family and dpakl, ``k`` for topk-prefix) and normalization, validated and defaulted once here
    (``ObjectiveSpec.resolved``); None is dflash with its defaults. ``draft_vocab`` (target token ids) scores the
    draft vocabulary only (``dpace.training.draft_vocab``): block positions whose target token lies outside
    it are unsupervised, and objectives that read the target's distribution see it restricted to it.
    """

    def __init__(
        self,
        draft_model: nn.Module,
        target_lm_head: nn.Module,
        target_embed_tokens: nn.Module,
        mask_token_id: int,
        block_size: int,
        *,
        objective: ObjectiveSpec | None = None,
        attention_backend: str = "sdpa",
        num_anchors: int = 512,
        objective_chunk_blocks: int = 128,
        draft_vocab: list[int] | None = None,
    ):
        spec = (objective or ObjectiveSpec()).resolved(block_size)
        # The parent's loss_type selects its own objective, which this class never calls;
        # "dflash" only satisfies its constructor's validation.
        super().__init__(
            draft_model=draft_model,
            target_lm_head=target_lm_head,
            target_embed_tokens=target_embed_tokens,
            mask_token_id=mask_token_id,
            block_size=block_size,
            attention_backend=attention_backend,
            num_anchors=num_anchors,
            objective_chunk_blocks=objective_chunk_blocks,
            loss_type="dflash",
        )
        self.loss_type = spec.objective  # what actually trains, for logs that read loss_type
        self.objective = spec.objective
        self.objective_hparams = spec.hparams
        self.normalization = spec.normalization
        if draft_vocab is not None:
            self.lm_head = DraftVocabHead(target_lm_head, draft_vocab)

    @property
    def needs_target_logits(self) -> bool:
        return objective_record(self.objective).needs_target_logits

    def _same_position_labels(
        self, input_ids: Tensor, loss_mask: Tensor, anchor_positions: Tensor, block_keep_mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """z* and validity per block position, plus the sequence index each position predicts.

        Block position k of an anchor a predicts token a+k; it is supervised when k >= 1, the
        block was kept, a+k is inside the sequence and loss_mask[a+k] is set (and, with a draft
        vocabulary, the token is in it; z* is then its index there).
        """
        batch_size, seq_len = input_ids.shape
        offsets = torch.arange(self.block_size, device=input_ids.device)
        label_indices = anchor_positions.unsqueeze(-1) + offsets  # [batch, blocks, B]
        safe_indices = label_indices.clamp(max=seq_len - 1)
        flat = safe_indices.reshape(batch_size, -1)
        target_ids = input_ids.gather(1, flat).view_as(safe_indices)
        supervised = loss_mask.gather(1, flat).view_as(safe_indices) > 0.5
        valid = block_keep_mask.unsqueeze(-1) & (label_indices < seq_len) & (offsets > 0) & supervised
        if isinstance(self.lm_head, DraftVocabHead):
            target_ids, in_vocab = self.lm_head.draft_index(target_ids)
            valid = valid & in_vocab
        return target_ids, valid, safe_indices

    @staticmethod
    def _aligned_target_hidden(target_last_hidden_states: Tensor, label_indices: Tensor) -> Tensor:
        """Target last hidden state that predicts each label: index (anchor + k) - 1.

        HF's last hidden state is post-norm, so lm_head of it is the target's logits for the
        next token. The anchor position (k=0) may index -1; it is clamped and never valid.
        """
        batch_size, hidden_size = target_last_hidden_states.shape[0], target_last_hidden_states.shape[-1]
        predictor = (label_indices - 1).clamp(min=0).reshape(batch_size, -1, 1).expand(-1, -1, hidden_size)
        return target_last_hidden_states.gather(1, predictor).view(*label_indices.shape, hidden_size)

    def _dflash_objective_chunk_terms(
        self,
        hidden: Tensor,
        target_ids: Tensor,
        valid: Tensor,
        aligned_target_hidden: Tensor | None = None,
    ) -> tuple[Tensor, ...]:
        """Additive ``ObjectiveTerms`` (as a plain tuple) for one slice of blocks."""
        batch_size, num_blocks, block_size, hidden_size = hidden.shape
        draft_logits = self.lm_head(hidden.reshape(batch_size, num_blocks * block_size, hidden_size))
        draft_logits = draft_logits.view(batch_size, num_blocks, block_size, -1)
        target_logits = None
        if aligned_target_hidden is not None:
            with torch.no_grad():  # the target distribution is a constant of the objective
                target_logits = self.lm_head(
                    aligned_target_hidden.reshape(batch_size, num_blocks * block_size, -1)
                ).view_as(draft_logits)
        terms = objective_terms(
            self.objective,
            draft_logits=draft_logits,
            target_ids=target_ids,
            valid=valid,
            target_logits=target_logits,
            **self.objective_hparams,
        )
        return tuple(terms)

    def forward(
        self,
        input_ids: Tensor,
        hidden_states: Tensor,
        loss_mask: Tensor,
        target_last_hidden_states: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, dict]:
        """Parallel block-wise training step; returns (loss, accuracy, metrics).

        ``target_last_hidden_states`` [batch, seq, target hidden] is required by objectives
        that need the target's distribution (``Objective.needs_target_logits``) and ignored otherwise.
        """
        if self.attention_backend == "flex_attention" and not FLEX_ATTENTION_AVAILABLE:
            raise ValueError("flex_attention is not available on this device; use sdpa/eager.")
        if self.needs_target_logits and target_last_hidden_states is None:
            raise ValueError(
                f"objective {self.objective!r} needs target_last_hidden_states (the target's "
                "post-norm last hidden states, [batch, seq, hidden]) to form target logits"
            )
        batch_size = input_ids.shape[0]
        anchor_positions, block_keep_mask, output_hidden = self._forward_draft_blocks(
            input_ids=input_ids, hidden_states=hidden_states, loss_mask=loss_mask
        )
        target_ids, valid, label_indices = self._same_position_labels(
            input_ids, loss_mask, anchor_positions, block_keep_mask
        )
        hidden_4d = output_hidden.reshape(*target_ids.shape, -1)
        aligned_target_hidden = None
        if self.needs_target_logits:
            aligned_target_hidden = self._aligned_target_hidden(target_last_hidden_states, label_indices)

        totals = checkpointed_chunk_reduce(
            self._dflash_objective_chunk_terms,
            hidden_4d,
            target_ids,
            valid,
            aligned_target_hidden,
            chunk_size=self.objective_chunk_blocks,
            dim=1,
        )
        terms = ObjectiveTerms(*totals)
        loss, diagnostics = normalize_terms(terms, self.objective, self.normalization, batch_size=batch_size)

        detached = {name: value.detach() for name, value in terms._asdict().items()}
        metrics = {
            **diagnostics,
            "accuracy_denom": detached["token_count"],
            # (numerator, denominator) pairs SpecForge's controller sums across steps/ranks.
            "ratio_metrics": {
                "acc": (detached["correct_count"], detached["token_count"]),
                "surrogate": (detached["surrogate_sum"], detached["block_count"]),
                "expected_emitted_length": (detached["emitted_length_sum"], detached["block_count"]),
                "weight_per_position": (detached["weight_position_sum"], detached["position_count"]),
                "q_per_position": (detached["q_position_sum"], detached["position_count"]),
            },
            "loss_terms": (terms.loss_sum, diagnostics["loss_denominator"]),
        }
        return loss, diagnostics["accuracy"], metrics


__all__ = ["ObjectiveDFlashModel"]
