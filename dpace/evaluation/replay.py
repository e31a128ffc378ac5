"""Replayed tau: what speculative decoding would measure, from the target's own answers.

With hard-match verification the tokens speculative decoding emits are the target's own picks
given the emitted prefix: at T = 0 its greedy answer, at T > 0 (with the picks keyed by position,
``dpace.evaluation.decoding.keyed_gumbel``) its keyed sample. Neither depends on the drafter. So a drafter's
acceptance lengths follow from one drafter pass over that answer:

1. ``reference_turn`` (once per target and request, shared by every drafter): the answer,
   decoded autoregressively with decoding's stop rule and length cap, then continued past a stop
   token by up to ``overrun`` tokens (a block may draft, and have accepted, tokens after the stop:
   DFlash's benchmark counts accepted + 1 for that step too), and the target's context features
   (``_context_features``) of prompt + answer from one forward pass.
2. ``draft_blocks`` scores a block anchored at every answer position in one batched drafter pass:
   each block's tokens attend to the context features before its anchor and to its own block (the
   decoder's attention, causal and windowed for ``sliding_attention`` layers, bidirectional in the
   block otherwise), with the block cut at ``max_new_tokens`` exactly where decoding cuts it.
3. ``replay_turn`` walks decoding's anchors (anchor -> anchor + emitted), with decoding's stop rule,
   length cap and both step counts (``block_lengths``, ``acceptance_lengths``), and writes the same
   ``BlockRecord``s.

One difference from decoding is named: ``q`` at a block's draft positions after its first mismatch
is the draft's probability of the answer's token there; decoding records the target's pick after
the draft's rejected prefix, which only a verification pass over the drafted block gives. Positions
up to and including the first mismatch (all that ``surrogate`` weighs most) are the same.

``compare_replay`` is the exactness check: a decoded request's step lengths against the replayed
ones; a difference is a near-tie when the target's (or, when the token streams agree, the
drafter's) top-2 margin where they part is below the tie margin, a failure otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from dpace.evaluation.decoding import (
    BlockRecord,
    _as_batch,
    _context_features,
    _draft_value,
    _output_head,
    autoregressive_generate,
    keyed_gumbel,
    new_kv_cache,
)
from dpace.training.draft_vocab import DraftVocabHead
from dpace.training.drafter import draft_output_head, draft_vocab_of

# Anchors scored per drafter pass: bounds the [anchors, B, vocabulary] logits (49152 x 7 x 32 fp32: 44 MB).
ANCHORS_PER_PASS = 32


@dataclass
class ReplayResult:
    acceptance_lengths: list[int]
    block_lengths: list[int]
    blocks: list[BlockRecord] = field(default_factory=list)
    anchors: list[int] = field(default_factory=list)  # answer index of each step's anchor token
    # per step: the drafter's smallest top-2 logit margin over the positions that decided its acceptance
    margins: list[float] = field(default_factory=list)


@torch.inference_mode()
def target_features(target, sequence_ids, layer_ids, start: int = 0) -> torch.Tensor:
    """The drafter's context features [positions, features] of ``sequence_ids`` from position ``start``."""
    ids = _as_batch(sequence_ids, target.device)
    hidden_states = target(ids, output_hidden_states=True, logits_to_keep=1).hidden_states
    return _context_features(hidden_states, list(layer_ids))[0, start:].contiguous()


def reference_turn(target, prompt_ids, *, temperature: float, sampling_key: int | None, stop_token_ids,
                   max_new_tokens: int, overrun: int, generator=None):
    """The target's answer to one turn (timed, as the autoregressive baseline) and its continuation past a stop.

    Returns (``DecodeResult`` of the answer, the continuation's token ids). The continuation is what
    the target picks after the stop token, up to ``overrun`` tokens and never past ``max_new_tokens``:
    the tokens a block anchored before the stop can still have accepted.
    """
    answer = autoregressive_generate(target, prompt_ids, max_new_tokens=max_new_tokens,
                                     stop_token_ids=stop_token_ids, temperature=temperature,
                                     generator=generator, sampling_key=sampling_key)
    extra = min(overrun, max_new_tokens - len(answer.new_token_ids))
    continuation = []
    if answer.stopped and extra > 0:
        continuation = autoregressive_generate(
            target, list(prompt_ids) + answer.new_token_ids, max_new_tokens=extra, stop_token_ids=None,
            temperature=temperature, generator=generator, sampling_key=sampling_key).new_token_ids
    return answer, continuation


def _attention_shape(drafter) -> tuple[bool, int | None]:
    """(causal, sliding window) of the drafter's attention, which every layer must share."""
    shapes = {(bool(layer.self_attn.is_causal), layer.self_attn.sliding_window) for layer in drafter.layers}
    if len(shapes) != 1:
        raise ValueError(f"replay needs one attention shape for all drafter layers, got {sorted(shapes, key=str)}")
    return shapes.pop()


def needed_context_start(drafter, num_input: int) -> int:
    """The first context position any block anchored in the answer can see (0 with full attention)."""
    _, window = _attention_shape(drafter)
    return 0 if window is None else max(0, num_input - int(window) + 1)


def _replay_head(drafter, target, draft_vocab_only: bool):
    """(head, its vocabulary's token ids or None for the whole vocabulary).

    Decoding's head gives -inf outside a draft vocabulary; replay may score the draft vocabulary
    alone (the same argmax and softmax, ~12x fewer logits with SmolLM2's 4096 of 49152), unless a
    logit softcap would turn those -inf into finite logits.
    """
    vocab = draft_vocab_of(drafter.config)
    if draft_vocab_only and vocab is not None and not _draft_value(drafter.config, "final_logit_softcapping"):
        head = DraftVocabHead(_output_head(target), vocab)
        return head, head.draft_ids
    return draft_output_head(drafter.config, _output_head(target)), None


def block_logits(drafter, target, features: torch.Tensor, feature_start: int, sequence: torch.Tensor,
                 anchors: torch.Tensor, num_input: int, max_new_tokens: int, *, head=None):
    """Draft logits [anchors, B - 1, vocabulary] of blocks anchored at ``anchors`` (absolute positions),
    the sequence's tokens there ([anchors, B - 1], -1 beyond ``sequence``) and decoding's block size per anchor.
    ``head``: the output head (default: decoding's, over the target's whole vocabulary).

    One drafter pass with block attention, as decoding's drafter sees each block: the context
    features before its anchor (within the sliding window, if any) and its own block, causally for
    causal layers; keys past the block size decoding verifies there (cut at ``max_new_tokens``) are
    masked, so a cut block equals decoding's shorter one. Differentiable (no inference mode).
    """
    block_size, mask_id = int(drafter.block_size), int(drafter.mask_token_id)
    causal, window = _attention_shape(drafter)
    device, count = features.device, anchors.numel()
    head = head if head is not None else _replay_head(drafter, target, False)[0]
    embed_weight = target.get_input_embeddings().weight
    embed_scale = float(_draft_value(drafter.config, "input_embedding_scale", 1.0))
    offsets = torch.arange(block_size, device=device)
    verify = (max_new_tokens - (anchors - num_input)).clamp(max=block_size)  # decoding's verify_size
    if window is None and feature_start > 0:
        raise ValueError("full-attention drafters need the prompt's features from position 0")
    context_start = feature_start if window is None else max(feature_start, int(anchors.min()) - int(window) + 1)
    context_end = int(anchors.max())
    context = features[context_start - feature_start : context_end - feature_start][None]
    context_positions = torch.arange(context_start, context_end, device=device)
    block = torch.full((count, block_size), mask_id, dtype=torch.long, device=device)
    block[:, 0] = sequence[anchors]
    query = (anchors[:, None] + offsets).reshape(-1)
    query_block = torch.arange(count, device=device).repeat_interleave(block_size)
    query_offset = offsets.repeat(count)
    key_offset = query_offset[None]
    sees_context = context_positions[None] < anchors[query_block][:, None]
    sees_block = (query_block[:, None] == query_block[None]) & (key_offset < verify[query_block][None])
    if causal:
        sees_block &= key_offset <= query_offset[:, None]
    if window is not None:
        sees_context &= query[:, None] - context_positions[None] < window
        sees_block &= (query_offset[:, None] - key_offset < window) & (causal | (key_offset - query_offset[:, None] < window))
    hidden = drafter(
        target_hidden=context,
        noise_embedding=F.embedding(block.view(1, -1), embed_weight) * embed_scale,
        position_ids=torch.cat([context_positions, query])[None],
        attention_mask=torch.cat([sees_context, sees_block], dim=1)[None, None],
        past_key_values=None,
        use_cache=False,
    )[0].view(count, block_size, -1)[:, 1:].reshape(count * (block_size - 1), -1)  # 2-D rows (decoding.py)
    logits = drafter.compute_logits(hidden, head).float().view(count, block_size - 1, -1)
    label_index = (anchors[:, None] + offsets[1:]).clamp(max=sequence.numel())
    targets = torch.cat([sequence, sequence.new_full((1,), -1)])[label_index]
    return logits, targets, verify


@torch.inference_mode()
def draft_blocks(drafter, target, features: torch.Tensor, feature_start: int, sequence_ids: list[int],
                 num_input: int, num_anchors: int, max_new_tokens: int, *, anchors_per_pass: int = ANCHORS_PER_PASS):
    """Drafts of a block anchored at each of the first ``num_anchors`` answer positions (``block_logits``).

    ``features``: context features of ``sequence_ids`` from position ``feature_start`` on;
    ``sequence_ids``: prompt + answer (+ continuation). Returns per anchor and draft position
    (tensors [anchors, B - 1]): ``targets`` (the sequence's token there, -1 beyond it), ``matches``
    (draft == target, within the block decoding would verify), ``q`` (draft probability of the
    target token; NaN where unknown), ``margins`` (draft top-2 logit margin) and ``verify`` [anchors].
    """
    device = features.device
    sequence = torch.tensor(sequence_ids, dtype=torch.long, device=device)
    head, vocab_ids = _replay_head(drafter, target, True)
    results = {"targets": [], "matches": [], "q": [], "margins": [], "verify": []}
    for first in range(0, num_anchors, anchors_per_pass):
        anchors = num_input + torch.arange(first, min(first + anchors_per_pass, num_anchors), device=device)
        logits, targets, verify = block_logits(drafter, target, features, feature_start, sequence, anchors,
                                               num_input, max_new_tokens, head=head)
        # A draft vocabulary of one token (answers that repeat one token) has no runner-up: margin +inf.
        top2 = torch.topk(logits, min(2, logits.shape[-1]), dim=-1)
        in_block = torch.arange(1, logits.shape[1] + 1, device=device)[None] < verify[:, None]
        drafts, column, in_vocab = top2.indices[..., 0], targets.clamp(min=0), targets >= 0
        if vocab_ids is not None:  # logits over the draft vocabulary: back to token ids
            drafts, (column, in_vocab) = vocab_ids[drafts], head.draft_index(column)
            in_vocab &= targets >= 0
        q = torch.softmax(logits, dim=-1).gather(-1, column[..., None])[..., 0]
        q = torch.where(in_vocab, q, 0.0)  # decoding's head gives tokens outside the draft vocabulary -inf
        results["targets"].append(targets)
        results["matches"].append((drafts == targets) & in_block)
        results["q"].append(torch.where(targets >= 0, q, torch.nan))
        results["margins"].append(top2.values[..., 0] - top2.values[..., 1] if logits.shape[-1] > 1
                                  else torch.full_like(top2.values[..., 0], torch.inf))
        results["verify"].append(verify)
    return {name: torch.cat(parts) for name, parts in results.items()}


def replay_turn(drafter, target, features: torch.Tensor, feature_start: int, prompt_ids, answer_ids, continuation_ids,
                *, max_new_tokens: int, stop_token_ids, anchors_per_pass: int = ANCHORS_PER_PASS) -> ReplayResult:
    """The steps speculative decoding takes on this turn, replayed over the target's answer.

    Mirrors ``speculative_generate``'s loop: anchors at the answer's first token, then moves by each
    step's emitted tokens; a step verifies min(B, tokens left) positions, accepts the leading drafts
    equal to the answer, and emits accepted + 1 cut at a stop token or the length cap.
    """
    prompt_ids, answer_ids = [int(t) for t in prompt_ids], [int(t) for t in answer_ids]
    num_input, stops = len(prompt_ids), {int(t) for t in (stop_token_ids or ())}
    sequence = prompt_ids + answer_ids + [int(t) for t in continuation_ids]
    result = ReplayResult([], [])
    if len(answer_ids) < 2:
        return result
    drafts = draft_blocks(drafter, target, features, feature_start, sequence, num_input, len(answer_ids) - 1,
                          max_new_tokens, anchors_per_pass=anchors_per_pass)
    accepted_all = drafts["matches"].int().cumprod(dim=1).sum(dim=1).tolist()
    index, stopped = 0, answer_ids[0] in stops
    while index + 1 < max_new_tokens and not stopped:
        verify = int(drafts["verify"][index])
        accepted = accepted_all[index]
        if accepted < verify - 1 and int(drafts["targets"][index, accepted]) < 0:
            raise ValueError(f"the answer's continuation past its stop token is too short to replay the step at "
                             f"answer position {index}: give the reference answers a longer overrun")
        produced = min(accepted + 1, max_new_tokens - index - 1)
        emitted = sequence[num_input + index + 1 : num_input + index + 1 + produced]
        cut = next((i for i, token in enumerate(emitted) if token in stops), None)
        if cut is not None:
            produced, stopped = cut + 1, True
        decided = min(accepted + 1, verify - 1)  # drafts whose match (or mismatch) fixed the acceptance
        result.blocks.append(BlockRecord(accepted=accepted, emitted=produced,
                                         q=drafts["q"][index, : verify - 1].tolist()))
        result.margins.append(float(drafts["margins"][index, :decided].min()))
        result.anchors.append(index)
        result.acceptance_lengths.append(produced)
        result.block_lengths.append(accepted + 1)
        index += produced
    if index != len(answer_ids) - 1:
        raise ValueError(f"replay ended at answer position {index}, the answer has {len(answer_ids)} tokens: "
                         "the answer does not follow decoding's stop rule and length cap")
    return result


def compare_replay(replayed: dict, decoded: dict, *, greedy_tie_margin: float, target_divergence: dict | None = None,
                   drafter_margins: list[float] | None = None) -> dict:
    """The exactness check of one request: decoded step lengths against replayed ones.

    ``replayed`` / ``decoded``: turn records (``block_lengths``, ``acceptance_lengths``);
    ``target_divergence``: ``compare_to_greedy`` of the decoded tokens against the reference answer
    (its ``first_mismatch`` and ``top2_margin``); ``drafter_margins``: per replayed step
    (``ReplayResult.margins``). Returns ``verdict`` ("equal", "tie" or "failure"), the first differing
    ``step`` and its anchor's answer ``position``, and the ``margin`` that decided the verdict.
    """
    ours = list(zip(replayed["block_lengths"], replayed["acceptance_lengths"], strict=True))
    theirs = list(zip(decoded["block_lengths"], decoded["acceptance_lengths"], strict=True))
    step = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if step is None and len(ours) != len(theirs):
        step = min(len(ours), len(theirs))
    if step is None and (target_divergence is None or target_divergence["first_mismatch"] is None):
        return {"verdict": "equal", "step": None, "position": None, "margin": None, "cause": None}
    position = sum(length for _, length in ours[: step or 0])
    if target_divergence is not None and target_divergence["first_mismatch"] is not None:
        # The target's own picks parted (a near-tie between batched and one-token forwards, or a bug):
        # the steps differ because the answers do, and the target's margin there decides.
        margin, cause, position = target_divergence["top2_margin"], "target", target_divergence["first_mismatch"]
    else:
        margin = None if drafter_margins is None or step >= len(drafter_margins) else drafter_margins[step]
        cause = "drafter"
    verdict = "tie" if margin is not None and margin < greedy_tie_margin else "failure"
    return {"verdict": verdict, "step": step, "position": position, "margin": margin, "cause": cause}


@torch.inference_mode()
def batched_answers(target, prompts: list[list[int]], *, temperature: float, sampling_keys: list[int | None],
                    stop_token_ids, max_new_tokens: int, overrun: int) -> list[tuple[list[int], list[int]]]:
    """``reference_turn``'s answers and continuations for several prompts in one left-padded batch, untimed.

    The same picks as batch-1 autoregressive decoding (argmax, or keyed samples at T > 0 at each
    row's own absolute positions); batched and one-token forwards round differently, so an answer
    can part from the batch-1 one where the target's top two logits nearly tie. Every row runs
    until it has its answer and continuation (or ``max_new_tokens``).
    """
    device, stops = target.device, {int(t) for t in (stop_token_ids or ())}
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    width = int(lengths.max())
    ids = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):  # left padding: every row's next token is the last column
        ids[row, width - len(prompt):] = torch.tensor(prompt, device=device)
        mask[row, width - len(prompt):] = 1
    cache = new_kv_cache(target.config)
    output = target(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
    tokens: list[list[int]] = [[] for _ in prompts]
    wanted = [max_new_tokens] * len(prompts)  # tokens each row still needs: all, until its stop
    for step in range(max_new_tokens):
        logits = output.logits[:, -1].float()
        if temperature > 0:
            noise = torch.stack([keyed_gumbel(key, (lengths[row] + step).view(1).cpu(), logits.shape[-1])[0]
                                 for row, key in enumerate(sampling_keys)]).to(device)
            picks = torch.argmax(logits / temperature + noise, dim=-1)
        else:
            picks = torch.argmax(logits, dim=-1)
        for row, token in enumerate(picks.tolist()):
            if len(tokens[row]) < wanted[row]:
                tokens[row].append(token)
                if token in stops and wanted[row] == max_new_tokens:
                    wanted[row] = min(max_new_tokens, len(tokens[row]) + overrun)
        if all(len(t) >= w for t, w in zip(tokens, wanted, strict=True)):
            break
        mask = torch.cat([mask, mask.new_ones((len(prompts), 1))], dim=1)
        output = target(picks[:, None], attention_mask=mask, position_ids=(lengths + step)[:, None],
                        past_key_values=cache, use_cache=True)
    results = []
    for row_tokens in tokens:
        end = next((i + 1 for i, token in enumerate(row_tokens) if token in stops), len(row_tokens))
        results.append((row_tokens[:end], row_tokens[end:]))
    return results
