"""Every block-drafter training objective of D-PACE (arXiv 2605.18810) as one loss library.

Notation follows the paper (Sec. 2-3, App. "Loss formulations", App. "D-PAKL"):

- a training example is a block of ``B`` positions; block position 0 is the clean anchor
  (never supervised, as in SpecForge's ``OnlineDFlashModel``) and block position ``j >= 1``
  is the paper's position ``j``;
- ``z*_j`` (``target_ids``) is the token the target's decoding policy chose;
- ``CE_j = -log q_j`` with ``q_j = q_psi(z*_j | prefix)`` the draft confidence on ``z*_j``;
- ``q~_i = (1 - alpha) q_i + alpha`` is the smoothed confidence used inside weights only;
- ``P_m = prod_{i<=m} q~_i`` (prefix product), ``w_j = sg(.)`` a detached per-position weight.

Positions that are not ``valid`` (anchor, padding, unsupervised tokens) are multiplicative
no-ops inside prefix products and excluded from every sum, exactly like SpecForge's
``OnlineDFlashModel._dpace_weight``; a naive implementation is therefore "drop the invalid
positions of a block, then apply the paper's formula" (only ``dflash`` keeps absolute block
positions, like the released code).

``objective_terms`` returns additive sums over the blocks it is given, so a caller can
process blocks in chunks (SpecForge's ``checkpointed_chunk_reduce``) and normalize once at
the end with ``normalize_terms``; ``block_loss`` is the two together.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

# The torch-free half of every objective (its record), re-exported: callers of the loss read both from here.
from dpace.objective_records import (
    DEFAULT_ALPHA,
    DEFAULT_NORMALIZATION,
    DFLASH_DEFAULT_GAMMA,
    LOSSES,
    NEEDS_TARGET_LOGITS,
    NORMALIZATIONS,
    OBJECTIVE_ALIASES,
    OBJECTIVES,
    REGISTRY,
    Objective,
    canonical_objective,
    default_gamma,
    objective_record,
    resolve_hparams,
    resolve_normalization,
)


class ObjectiveTerms(NamedTuple):
    """Additive sums over a set of blocks; add two of them field by field to merge chunks.

    Every field is a tensor (a tuple of tensors is what ``checkpointed_chunk_reduce`` sums).
    Only ``loss_sum`` carries gradient.
    """

    loss_sum: Tensor  # sum_j w_j * CE_j over valid positions (accept-rate: -sum of S~)
    weight_sum: Tensor  # sum of w_j over valid positions
    token_count: Tensor  # number of valid positions
    block_count: Tensor  # number of blocks with at least one valid position
    correct_count: Tensor  # valid positions whose draft argmax is z*
    surrogate_sum: Tensor  # sum over blocks of S~ = sum_k prod_{i<=k} q_i
    emitted_length_sum: Tensor  # sum over valid blocks of 1 + leading correct valid positions
    weight_position_sum: Tensor  # [B] sum of w_j over valid positions at block position j
    q_position_sum: Tensor  # [B] sum of q_j over valid positions at block position j
    position_count: Tensor  # [B] number of valid positions at block position j


# --------------------------------------------------------------------------- validation


def _check_inputs(objective, draft_logits, target_ids, valid, target_logits) -> None:
    if draft_logits.dim() != 4:
        raise ValueError(f"draft_logits must be [batch, blocks, B, V], got shape {tuple(draft_logits.shape)}")
    positions = tuple(draft_logits.shape[:3])
    if tuple(target_ids.shape) != positions:
        raise ValueError(
            f"shape mismatch: target_ids {tuple(target_ids.shape)} vs draft_logits "
            f"{tuple(draft_logits.shape)} (target_ids must be draft_logits.shape[:3])"
        )
    if tuple(valid.shape) != positions:
        raise ValueError(
            f"shape mismatch: valid {tuple(valid.shape)} vs draft_logits "
            f"{tuple(draft_logits.shape)} (valid must be draft_logits.shape[:3])"
        )
    if target_ids.is_floating_point() or target_ids.is_complex():
        raise ValueError(f"target_ids must be integer token ids, got dtype {target_ids.dtype}")
    if target_logits is None:
        if REGISTRY[objective].needs_target_logits:
            raise ValueError(
                f"objective {objective!r} needs target_logits (the target's logits at the same positions)"
            )
    elif tuple(target_logits.shape) != tuple(draft_logits.shape):
        raise ValueError(
            f"shape mismatch: target_logits {tuple(target_logits.shape)} vs draft_logits "
            f"{tuple(draft_logits.shape)} (they must be equal)"
        )


# --------------------------------------------------------------------------- closed forms


def _prefix_product(factors: Tensor, valid: Tensor) -> Tensor:
    """P_m = prod_{i<=m, i valid} factors_i: invalid positions multiply by 1 (no-op)."""
    return torch.cumprod(torch.where(valid, factors, torch.ones_like(factors)), dim=-1)


def _exclusive_prefix_product(factors: Tensor, valid: Tensor) -> Tensor:
    """prod_{i<j, i valid} factors_i, = 1 at the first valid position.

    Shifting the factors right by one keeps it division-free (factors may be exactly 0).
    """
    factors = torch.where(valid, factors, torch.ones_like(factors))
    shifted = torch.cat([torch.ones_like(factors[..., :1]), factors[..., :-1]], dim=-1)
    return torch.cumprod(shifted, dim=-1)


def _suffix_sum(values: Tensor) -> Tensor:
    """sum_{m>=j} values_m as one reversed cumulative sum (O(B) instead of O(B^2))."""
    return torch.flip(torch.cumsum(torch.flip(values, dims=[-1]), dim=-1), dims=[-1])


def _dpace_weights(confidence: Tensor, valid: Tensor, alpha: float, variant: str) -> Tensor:
    """Detached D-PACE weights (Eq. dpace-coef) from per-position acceptance proxies.

    ``confidence`` is q_i for D-PACE, p_theta(z*_i) for the target-prob variant and
    a^_i = exp(-C_i) for D-PAKL; the closed forms are the same.
    """
    smoothed = (1.0 - alpha) * confidence + alpha  # q~_i >= alpha: later weights cannot vanish
    fvalid = valid.to(smoothed.dtype)
    prefix = _prefix_product(smoothed, valid)  # P_j = prod_{i<=j} q~_i: cumulative confidence
    if variant == "cumulative":
        return prefix * fvalid
    if variant == "full":
        # w_j = sum_{m>=j} P_m = P_j * f~_j: prefix confidence times continuation value.
        return _suffix_sum(prefix * fvalid) * fvalid
    if variant == "continuation":
        # f~_j = 1 + sum_{m>j} prod_{j<i<=m} q~_i = sum_{m>=j} P_m / P_j. Dividing by P_j
        # breaks when P_j is 0 or underflows (alpha=0 and some q~_i=0 with i<=j), although
        # f~_j does not depend on q~_{i<=j} at all; in log space the ratio is a difference
        # of log-prefix sums. The floor at log(tiny) keeps -inf - (-inf) out and changes a
        # term only by a factor ~tiny, i.e. not at all next to f~_j >= 1.
        log_floor = math.log(torch.finfo(smoothed.dtype).tiny)
        log_smoothed = torch.where(valid, torch.log(smoothed).clamp_min(log_floor), 0.0)
        log_prefix = torch.cumsum(log_smoothed, dim=-1)  # log P_j
        log_prefix_valid = torch.where(valid, log_prefix, -math.inf)  # sums exclude invalid m
        log_suffix = torch.flip(
            torch.logcumsumexp(torch.flip(log_prefix_valid, dims=[-1]), dim=-1), dims=[-1]
        )
        return torch.exp(log_suffix - log_prefix) * fvalid
    raise ValueError(f"unknown D-PACE variant {variant!r}")


def _token_probability(logits: Tensor, token_ids: Tensor) -> Tensor:
    """p(z*) = softmax(logits)[z*], detached, via the same cross-entropy kernel."""
    nll = F.cross_entropy(logits.detach().flatten(0, -2), token_ids.flatten(), reduction="none")
    return torch.exp(-nll).view_as(token_ids)


def _per_position_loss(loss, draft_logits, target_ids, target_logits) -> Tensor:
    """The quantity each weight multiplies (see ``LOSSES``): CE_j = -log q_j, or C_j for "target-ce"."""
    if loss == "target-ce":
        # C_j = -sum_x p_j(x) log q_psi(x), p_j = softmax(target logits) (App. D-PAKL), with
        # the soft-label cross-entropy kernel. It returns NaN for 0 * log 0 (a draft logit of
        # -inf where p_j(x) = 0); only then recompute those rows with that term set to 0.
        # (The check costs one host sync per call on GPU; the soft kernel saves ~2 passes over V.)
        target_probs = torch.softmax(target_logits.detach(), dim=-1)
        vocab_size = draft_logits.shape[-1]
        soft_ce = F.cross_entropy(
            draft_logits.reshape(-1, vocab_size), target_probs.reshape(-1, vocab_size), reduction="none"
        ).view(draft_logits.shape[:-1])
        if torch.isnan(soft_ce).any():
            draft_log_probs = torch.log_softmax(draft_logits, dim=-1)
            exact = -torch.where(target_probs > 0, target_probs * draft_log_probs, 0.0).sum(dim=-1)
            soft_ce = torch.where(torch.isnan(soft_ce), exact, soft_ce)
        return soft_ce
    vocab_size = draft_logits.shape[-1]
    return F.cross_entropy(
        draft_logits.reshape(-1, vocab_size), target_ids.reshape(-1), reduction="none"
    ).view_as(target_ids)


# Per-objective weight functions: (hparams, confidence q, valid, draft_logits, target_ids,
# target_logits) -> detached per-position weights w_j, 0 at invalid positions.


def _dflash_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits) -> Tensor:
    # exp(-(j-1)/gamma): fixed decay; j is the absolute block position, anchor j=0 masked.
    positions = torch.arange(valid.shape[-1], device=valid.device, dtype=confidence.dtype)
    return torch.exp(-(positions - 1).clamp(min=0) / hparams["gamma"]) * valid.to(confidence.dtype)


def _dpace_full_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits) -> Tensor:
    return _dpace_weights(confidence, valid, hparams["alpha"], "full")


def _dpace_cumulative_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits) -> Tensor:
    return _dpace_weights(confidence, valid, hparams["alpha"], "cumulative")


def _dpace_continuation_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits) -> Tensor:
    return _dpace_weights(confidence, valid, hparams["alpha"], "continuation")


def _target_prob_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits) -> Tensor:
    # Same closed form with the target's p_theta(z*_i) in place of the draft's q_i.
    target_prob = _token_probability(target_logits, target_ids).to(confidence.dtype)
    return _dpace_weights(target_prob, valid, hparams["alpha"], "full")


def _accept_rate_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits) -> Tensor:
    # Not used in the loss; these are its implicit gradient weights
    # d(-S~)/d(CE_j) = sum_{m>=j} prod_{i<=m} q_i (D-PACE with alpha=0), for diagnostics.
    return _dpace_weights(confidence, valid, 0.0, "full")


def _topk_prefix_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits) -> Tensor:
    # GRIFFIN mask m_j = prod_{i<j} 1[z*_i in TopK(q_i)]; z*_i is in the top k iff its
    # draft logit reaches the k-th largest one (ties count in its favour). softmax is
    # monotone, so logits rank like q. A partial top-k beats comparing against all V.
    logits = draft_logits.detach()
    target_logit = logits.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    kth_largest = torch.topk(logits, min(hparams["k"], logits.shape[-1]), dim=-1).values[..., -1]
    in_top_k = target_logit >= kth_largest
    return _exclusive_prefix_product(in_top_k.to(confidence.dtype), valid) * valid.to(confidence.dtype)


def _pard2_cat_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits) -> Tensor:
    # PARD-2 confidence-adaptive token weight: product of the target's gold-token
    # probabilities over the preceding in-block valid positions (1 at the first one).
    target_prob = _token_probability(target_logits, target_ids).to(confidence.dtype)
    return _exclusive_prefix_product(target_prob, valid) * valid.to(confidence.dtype)


# --------------------------------------------------------------------------- the registry


# Each objective's weight function (the loss half of its record in ``dpace.objective_records.REGISTRY``).
WEIGHTS: dict[str, Callable[..., Tensor]] = {
    "dflash": _dflash_weights,
    "dpace": _dpace_full_weights,
    "dpace-cumulative": _dpace_cumulative_weights,
    "dpace-continuation": _dpace_continuation_weights,
    "topk-prefix": _topk_prefix_weights,
    "accept-rate": _accept_rate_weights,
    "dpace-target-prob": _target_prob_weights,
    "dpakl": _dpace_full_weights,
    "pard2-cat": _pard2_cat_weights,
}


def weight_function(objective: str) -> Callable[..., Tensor]:
    """The weight function of the canonical ``objective``; an objective with a record but none is named."""
    if objective not in WEIGHTS:
        raise ValueError(f"objective {objective!r} has a record but no weight function in "
                         "dpace.training.objectives.WEIGHTS")
    return WEIGHTS[objective]


def _prepare(objective, draft_logits, target_ids, valid, target_logits, hparams):
    objective = canonical_objective(objective)
    _check_inputs(objective, draft_logits, target_ids, valid, target_logits)
    hparams = resolve_hparams(objective, draft_logits.shape[2], **hparams)
    valid = valid if valid.dtype == torch.bool else valid != 0
    # Ids at invalid positions may be padding (e.g. -100); any in-range id will do there.
    target_ids = torch.where(valid, target_ids.long(), 0)
    loss_per_position = _per_position_loss(REGISTRY[objective].loss, draft_logits, target_ids, target_logits)
    # Invalid positions may hold any logits (even -inf at z*): zero their loss so 0*inf
    # never reaches a sum. Then q = exp(-CE) = 1 there, the no-op of prefix products.
    loss_per_position = torch.where(valid, loss_per_position, 0.0)
    # q_j = exp(-CE_j) reuses the cross-entropy's log-softmax (no second softmax). Weights
    # are built in at least float32 so a bf16 CE does not quantise them.
    weight_dtype = torch.promote_types(loss_per_position.dtype, torch.float32)
    confidence = torch.exp(-loss_per_position.detach().to(weight_dtype))
    weights = weight_function(objective)(hparams, confidence, valid, draft_logits, target_ids, target_logits)
    return objective, hparams, valid, target_ids, loss_per_position, confidence, weights


# --------------------------------------------------------------------------- public API


def position_weights(
    objective: str,
    *,
    draft_logits: Tensor,
    target_ids: Tensor,
    valid: Tensor,
    target_logits: Tensor | None = None,
    **hparams,
) -> Tensor:
    """Detached per-position weights w_j, [batch, blocks, B], 0 at invalid positions."""
    return _prepare(objective, draft_logits, target_ids, valid, target_logits, hparams)[-1]


def objective_terms(
    objective: str,
    *,
    draft_logits: Tensor,
    target_ids: Tensor,
    valid: Tensor,
    target_logits: Tensor | None = None,
    **hparams,
) -> ObjectiveTerms:
    """Additive loss and diagnostic sums for a set of blocks (see ``ObjectiveTerms``)."""
    objective, _, valid, target_ids, loss_per_position, q, weights = _prepare(
        objective, draft_logits, target_ids, valid, target_logits, hparams
    )
    fvalid = valid.to(q.dtype)
    # S~ = sum_k prod_{i<=k} q_i per block (Eq. S): the accepted-length surrogate.
    if REGISTRY[objective].loss == "surrogate":
        # Ascend S~ directly: q keeps its gradient, no smoothing, no detach (it collapses).
        q_with_grad = torch.exp(-loss_per_position)  # = 1 at invalid positions (no-op)
        surrogate = (torch.cumprod(q_with_grad, dim=-1) * valid).sum(dim=-1)
        loss_sum = -surrogate.sum()
        surrogate = surrogate.detach()
    else:
        # sum_j sg(w_j) CE_j; where(): a zero weight must silence CE_j = inf (q_j = 0) too.
        loss_sum = torch.where(weights > 0, weights * loss_per_position, 0.0).sum()
        surrogate = (torch.cumprod(q, dim=-1) * fvalid).sum(dim=-1)

    with torch.no_grad():
        block_valid = valid.any(dim=-1)
        # argmax in float32: the same index (bf16 -> float32 is exact; both take the first maximum), and
        # PyTorch's CPU argmax over bf16 is unvectorised: 1.9 ms against 0.6 ms for a default micro-batch.
        correct = (draft_logits.float().argmax(dim=-1) == target_ids) & valid
        # Training-time accept length (SpecForge's compute_accept_len): leading valid positions
        # whose argmax is z*, skipping invalid ones; +1 for the token the target emits itself.
        accepted = (torch.cumprod((correct | ~valid).long(), dim=-1) * valid).sum(dim=-1)
        emitted_length = (1 + accepted).to(q.dtype) * block_valid
        return ObjectiveTerms(
            loss_sum=loss_sum,
            weight_sum=weights.sum(),
            token_count=fvalid.sum(),
            block_count=block_valid.to(q.dtype).sum(),
            correct_count=correct.to(q.dtype).sum(),
            surrogate_sum=surrogate.sum(),
            emitted_length_sum=emitted_length.sum(),
            weight_position_sum=weights.sum(dim=(0, 1)),
            q_position_sum=(q * fvalid).sum(dim=(0, 1)),
            position_count=fvalid.sum(dim=(0, 1)),
        )


def _ratio(numerator: Tensor, denominator: Tensor) -> Tensor:
    """numerator / denominator with 0 where the denominator is 0 (no NaN, even in backward)."""
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return numerator / safe


def normalize_terms(
    terms: ObjectiveTerms, objective: str, normalization: str | None = None, *, batch_size: int
) -> tuple[Tensor, dict]:
    """Scalar loss and detached diagnostics from (possibly chunk-summed) terms.

    normalization: None = released code (see DEFAULT_NORMALIZATION); "batch" = batch size,
    "anchor" = number of valid blocks, "weight" = sum of weights, "token" = valid positions.
    A denominator of 0 (nothing valid) gives a loss of 0, not NaN.
    """
    mode = resolve_normalization(objective, normalization)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    terms = ObjectiveTerms(*terms)
    denominator = {
        "batch": terms.token_count.new_tensor(float(batch_size)),
        "anchor": terms.block_count,
        "weight": terms.weight_sum,
        "token": terms.token_count,
    }[mode].detach()
    loss = _ratio(terms.loss_sum, denominator)
    diagnostics = {
        "weight_per_position": _ratio(terms.weight_position_sum, terms.position_count).detach(),
        "q_per_position": _ratio(terms.q_position_sum, terms.position_count).detach(),
        "accuracy": _ratio(terms.correct_count, terms.token_count).detach(),
        "surrogate": _ratio(terms.surrogate_sum, terms.block_count).detach(),
        "expected_emitted_length": _ratio(terms.emitted_length_sum, terms.block_count).detach(),
        "normalization": mode,
        "loss_denominator": denominator,
        "weight_sum": terms.weight_sum.detach(),
        "token_count": terms.token_count.detach(),
        "block_count": terms.block_count.detach(),
    }
    return loss, diagnostics


def block_loss(
    objective: str,
    *,
    draft_logits: Tensor,
    target_ids: Tensor,
    valid: Tensor,
    target_logits: Tensor | None = None,
    normalization: str | None = None,
    **hparams,
) -> tuple[Tensor, dict]:
    """Scalar loss of ``objective`` over [batch, blocks, B] positions and detached diagnostics.

    draft_logits [batch, blocks, B, V]; target_ids [batch, blocks, B] (z*); valid [batch,
    blocks, B] (nonzero = supervised; block position 0 is the anchor); target_logits
    [batch, blocks, B, V] for objectives in NEEDS_TARGET_LOGITS. Hyper-parameters: gamma
    (dflash), alpha (D-PACE family, dpakl), k (topk-prefix); see ``resolve_hparams``.
    """
    objective = canonical_objective(objective)
    resolve_normalization(objective, normalization)  # fail before any compute
    terms = objective_terms(
        objective,
        draft_logits=draft_logits,
        target_ids=target_ids,
        valid=valid,
        target_logits=target_logits,
        **hparams,
    )
    return normalize_terms(terms, objective, normalization, batch_size=draft_logits.shape[0])


__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_NORMALIZATION",
    "DFLASH_DEFAULT_GAMMA",
    "LOSSES",
    "NEEDS_TARGET_LOGITS",
    "NORMALIZATIONS",
    "OBJECTIVES",
    "OBJECTIVE_ALIASES",
    "REGISTRY",
    "WEIGHTS",
    "Objective",
    "ObjectiveTerms",
    "block_loss",
    "canonical_objective",
    "default_gamma",
    "normalize_terms",
    "objective_record",
    "objective_terms",
    "position_weights",
    "resolve_hparams",
    "resolve_normalization",
    "weight_function",
]
