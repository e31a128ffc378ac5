"""Speculative decoding with a DFlash block drafter, the autoregressive baseline, and per-block records.

``speculative_generate`` follows ``dflash.model.dflash_generate`` (DFlash 0.1.0) step for step: the
same caches, positions, stop rule and length cap, so at temperature 0 it emits exactly the same
tokens and acceptance lengths. On top of it, it

* offers two verification rules at T > 0 (``"hard-match"``, what the paper evaluates, and
  ``"rejection"``, the speculative sampling of dflash 0.1.0),
* records, per verification block, the draft's probability ``q_i`` of the token the target chose at
  each draft position (D-PACE's surrogate ``sum_k prod_{i<=k} q_i`` is computed from them),
* draws every random number from one ``torch.Generator`` so runs are reproducible,
* times prefill and decoding the way DFlash's benchmark does (``time_per_output_token_s`` is the
  decode time divided by all output tokens, the prefill's first token included), with the decode
  clock started where ``decode_clock`` says (see ``DECODE_CLOCKS``),
* records both DFlash counts of a step's length: ``block_lengths`` (accepted + 1, what DFlash's
  benchmark appends, even for the step a stop token or the length cap cuts short) and
  ``acceptance_lengths`` (the tokens the step actually added, what dflash 0.1.0 on PyPI appends).

Verification rules (both lossless; identical at T = 0, where every choice is an argmax):

``hard-match``
    draft tokens are the draft's argmax; at each block position the target picks its own token
    (argmax at T = 0, a sample from ``softmax(logits / T)`` at T > 0); draft tokens are accepted
    while they equal the target's picks, and the target's pick at the first mismatch is the bonus.
    Every emitted token is the target's own pick given a prefix of target picks, so the output is
    distributed exactly as sampling from the target.
``rejection``
    draft tokens are sampled from ``softmax(draft_logits / T)``; token ``x`` is accepted with
    probability ``min(1, p(x) / q(x))``; on rejection the bonus is sampled from ``max(p - q, 0)``
    renormalized; after a fully accepted block it is sampled from the target's last position.

The recorded ``q_i`` is the draft's confidence in the sense of the paper: the probability under the
draft's plain softmax (temperature 1, what D-PACE trains) of the token chosen by the target's
decoding policy at draft position ``i``: the target's argmax at T = 0, its sampled token at T > 0
with hard-match. Rejection sampling has no per-position target pick, so at T > 0 it records the
draft probability of an extra, independent sample from the target's ``softmax(logits / T)`` at each
position (drawn after the verification draws, from the same generator): the statistic hard-match
would have recorded on the same block. Positions after the first mismatch are recorded too (the
target's pick there is conditioned on the draft's rejected prefix); ``surrogate`` discounts them
through the product anyway.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F
from transformers import DynamicCache

from dpace.evaluation.eval_config import DECODE_CLOCKS, VERIFICATIONS
from dpace.gpus import device_clock
from dpace.training.drafter import draft_output_head

# The verification rules are VERIFICATIONS (the schema's eval.verification), described above.
# Where the decode-time clock starts (DECODE_CLOCKS, the schema's eval.decode_clock) (the prefill is never in it):
# "after-first-draft": DFlash's benchmark as released with the paper era's code (z-lab/dflash,
#   Jan-Apr 2026: benchmark.py, then dflash/model.py) restarts the clock after the first draft call,
#   which drafts from the whole prompt's context (the drafter's own prefill);
# "after-prefill": dflash 0.1.0 on PyPI starts it right after the target's prefill, so the first
#   draft call counts as decode time.
# The autoregressive baseline has no draft call: both start after its prefill.


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


def surrogate(q: list[float]) -> float:
    """D-PACE's per-block surrogate ``sum_k prod_{i<=k} q_i`` (Eq. S of the paper)."""
    total, prefix = 0.0, 1.0
    for value in q:
        prefix *= value
        total += prefix
    return total


@dataclass
class BlockRecord:
    """One verification step of speculative decoding.

    ``accepted``: draft tokens that matched/passed verification; ``emitted``: tokens this step
    added to the output (accepted + bonus, cut at a stop token or at ``max_new_tokens``);
    ``q``: the draft's probability of the target's chosen token at each draft position.
    """

    accepted: int
    emitted: int
    q: list[float]

    @property
    def sum_q(self) -> float:
        return float(sum(self.q))

    @property
    def surrogate(self) -> float:
        return surrogate(self.q)


@dataclass
class DecodeResult:
    new_token_ids: list[int]
    acceptance_lengths: list[int]  # tokens each step added (cut at a stop token / the length cap)
    blocks: list[BlockRecord] = field(default_factory=list)
    block_lengths: list[int] = field(default_factory=list)  # accepted + 1 per step, never cut
    decode_clock: str = "after-prefill"
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    time_to_first_token_s: float = 0.0
    decode_time_s: float = 0.0
    time_per_output_token_s: float = 0.0
    stopped: bool = False

    @property
    def tau(self) -> float:
        """Mean emitted length per verification step (bonus included); NaN with no step."""
        return statistics.fmean(self.acceptance_lengths) if self.acceptance_lengths else math.nan


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def new_kv_cache(config) -> DynamicCache:
    """An empty KV cache for a model of `config` that speculative decoding can roll back."""
    cache = DynamicCache(config=config)
    cache.activate_past_recording()  # lets sliding-window layers be rolled back, as dflash does
    return cache


def _crop_to(cache, length: int) -> None:
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def _output_head(target):
    head = getattr(target, "lm_head", None)
    return head if head is not None else target.get_output_embeddings()


def _draft_value(config, name, default=None):
    return (getattr(config, "dflash_config", None) or {}).get(name, getattr(config, name, default))


def _context_features(hidden_states, layer_ids, length: int | None = None) -> torch.Tensor:
    """The drafter's conditioning: chosen target layers' outputs, concatenated (dflash's rule).

    Slicing before the concatenation gives a fresh tensor with plain strides: a 3-D slice keeps its
    parent's batch stride, and CPU bf16 matmuls on such inputs take a ~25x slower oneDNN path.
    """
    return torch.cat([hidden_states[i + 1][:, :length] for i in layer_ids], dim=-1)


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


def _sample(probs: torch.Tensor, generator) -> torch.Tensor:
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def keyed_gumbel(key: int, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise [len(positions), vocab] that depends only on (``key``, absolute position).

    ``argmax(logits / T + noise)`` is an exact sample from ``softmax(logits / T)`` (the Gumbel-max
    trick); with the noise keyed by position, the token sampled at position p is a function of the
    prefix before p alone, whichever call (autoregressive step, verification block, replay) asks.
    """
    rows = []
    for position in positions.tolist():  # one generator per position: the noise may not depend on the call
        generator = torch.Generator().manual_seed((int(key) * 1_000_003 + int(position)) & 0x7FFFFFFFFFFFFFFF)
        rows.append(torch.rand(vocab_size, generator=generator, dtype=torch.float64))
    uniform = torch.stack(rows).clamp_(min=1e-300)
    return (-torch.log(-torch.log(uniform))).to(torch.float32)


def _pick(logits: torch.Tensor, temperature: float, generator, *, sampling_key: int | None = None,
          first_position: int = 0) -> torch.Tensor:
    """The target's token at each position: argmax at T = 0, a sample from softmax(logits/T) above.

    With ``sampling_key`` the sample at T > 0 is keyed (``keyed_gumbel``): ``logits`` is [1, n, V]
    (or [1, V]) for the tokens of absolute positions ``first_position``, ``first_position + 1``, ...
    """
    if temperature <= 0:
        return torch.argmax(logits, dim=-1)
    if sampling_key is None:
        return _sample(_probs(logits, temperature), generator)
    rows = logits.reshape(-1, logits.shape[-1]).float()
    positions = torch.arange(first_position, first_position + rows.shape[0])
    noise = keyed_gumbel(sampling_key, positions, rows.shape[-1]).to(rows.device)
    return torch.argmax(rows / temperature + noise, dim=-1).view(logits.shape[:-1])


def _rejection_sample(draft_tokens, target_probs, draft_probs, generator) -> tuple[int, torch.Tensor]:
    """Speculative sampling for one block, as ``dflash.model._rejection_sample`` (no top-k)."""
    gamma = draft_tokens.shape[1]
    p = target_probs[:, :gamma].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    u = torch.rand(q.shape, generator=generator, device=q.device, dtype=q.dtype)
    accepted = int((u * q < p).to(torch.int32).cumprod(-1).sum(-1)[0].item())
    if accepted == gamma:
        return accepted, _sample(target_probs[:, -1], generator)[0]
    residual = (target_probs[0, accepted] - draft_probs[0, accepted]).clamp_min(0)
    total = residual.sum()
    if total > 0:
        residual = residual / total
    else:  # p <= q everywhere can only happen through rounding: fall back to p
        residual = target_probs[0, accepted]
    return accepted, _sample(residual[None], generator)[0]


def _hard_match(draft_tokens: torch.Tensor, picks: torch.Tensor) -> int:
    """Accepted draft tokens: the longest prefix equal to the target's picks at the same positions."""
    return int((draft_tokens == picks[:, : draft_tokens.shape[1]]).cumprod(dim=1).sum(dim=1)[0].item())


def _check_args(max_new_tokens: int, temperature: float, verification: str, decode_clock: str = "after-prefill") -> None:
    if decode_clock not in DECODE_CLOCKS:
        raise ValueError(f"decode_clock must be one of {DECODE_CLOCKS}, got {decode_clock!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if verification not in VERIFICATIONS:
        raise ValueError(f"verification must be one of {VERIFICATIONS}, got {verification!r}")


def _as_batch(input_ids, device) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=device)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"input_ids must be one sequence (shape [n] or [1, n]), got {tuple(ids.shape)}")
    if ids.shape[1] == 0:
        raise ValueError("input_ids is empty")
    return ids


def _cut_at_stop(tokens: list[int], stops: set[int]) -> int | None:
    for index, token in enumerate(tokens):
        if token in stops:
            return index
    return None


def optimize_for_cpu(*models) -> None:
    """Store every float32 CPU ``nn.Linear`` weight column-major (its transpose contiguous), in place.

    ``F.linear(x, W)`` multiplies by ``W.T``; with ``W`` row-major, MKL runs a transposed-B SGEMM
    that is slow for a few rows. With ``W.T`` contiguous the same call takes MKL's plain path:
    measured on one thread of this project's Xeon, SmolLM2's 211 matmuls take 77 instead of 89 ms
    for one row and 145 instead of 195 ms for 8 rows; the drafter's 7-row LM head 25 instead of
    45 ms (on two idle threads the two layouts tie). bf16 weights are left alone: oneDNN's
    one-row bf16 path is slower column-major. Values, parameter names and tied weights are
    unchanged (only strides differ); results may differ from the row-major layout in the last
    bits. Apply it to the target and the drafter before timing, so the autoregressive baseline
    gets the same layout. A no-op off the CPU.
    """
    for model in models:
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.weight.device.type == "cpu":
                weight = module.weight.data
                if weight.dtype == torch.float32 and weight.dim() == 2 and weight.is_contiguous():
                    module.weight.data = weight.t().contiguous().t()


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------


class _Speculation:
    """What every step of one speculative decoding call shares: the two models, the draft head and noise
    embedding, and the sampling (its rule, generator and key)."""

    def __init__(self, drafter, target, temperature: float, verification: str, generator, sampling_key: int | None):
        self.drafter, self.target, self.temperature = drafter, target, temperature
        self.generator, self.sampling_key = generator, sampling_key
        self.sampling_draft = verification == "rejection" and temperature > 0
        self.layer_ids = list(drafter.target_layer_ids)
        self.head = draft_output_head(drafter.config, _output_head(target))  # -inf outside a draft vocabulary
        self.embed_weight = target.get_input_embeddings().weight
        self.embed_scale = float(_draft_value(drafter.config, "input_embedding_scale", 1.0))

    def prefill(self, input_ids, output_ids, position_ids, target_cache, block_size: int):
        """The target's prefill: its first token into ``output_ids``; returns the drafter's context features."""
        num_input = input_ids.shape[1]
        output = self.target(
            input_ids,
            position_ids=position_ids[:, :num_input],
            past_key_values=target_cache,
            use_cache=True,
            logits_to_keep=1,
            output_hidden_states=block_size > 1,
        )
        output_ids[:, :num_input] = input_ids
        output_ids[:, num_input] = _pick(output.logits[:, -1], self.temperature, self.generator,
                                         sampling_key=self.sampling_key, first_position=num_input)
        return _context_features(output.hidden_states, self.layer_ids) if block_size > 1 else None

    def draft(self, block, target_hidden, position_ids, draft_cache, start: int, verify_size: int):
        """Fill ``block[:, 1:]`` with the draft's tokens; returns (draft logits, draft probabilities or None)."""
        noise_embedding = F.embedding(block, self.embed_weight) * self.embed_scale
        # 2-D rows for the LM head: a 3-D slice keeps its parent's batch stride (see above)
        draft_hidden = self.drafter(
            target_hidden=target_hidden,
            noise_embedding=noise_embedding,
            position_ids=position_ids[:, start - target_hidden.shape[1] : start + verify_size],
            past_key_values=draft_cache,
            use_cache=True,
        )[0, 1 - verify_size :, :]
        _crop_to(draft_cache, start)  # keep the context, drop the block's noise positions
        draft_logits = self.drafter.compute_logits(draft_hidden, self.head)[None]
        draft_probs = None
        if self.sampling_draft:
            draft_probs = _probs(draft_logits, self.temperature)
            block[:, 1:] = _sample(draft_probs, self.generator)
        else:
            block[:, 1:] = torch.argmax(draft_logits, dim=-1)
        return draft_logits, draft_probs

    def verify(self, logits, block, draft_probs, verify_size: int, start: int):
        """(accepted draft tokens, bonus token, the target's pick at each position or None) of one block."""
        if self.sampling_draft:
            target_probs = _probs(logits, self.temperature)
            if verify_size == 1:
                return 0, _sample(target_probs[:, -1], self.generator)[0], None
            accepted, bonus = _rejection_sample(block[:, 1:], target_probs, draft_probs, self.generator)
            return accepted, bonus, _sample(target_probs, self.generator)  # picks only for the q records (module doc)
        # chosen[:, i] is the token of absolute position start + 1 + i
        chosen = _pick(logits, self.temperature, self.generator, sampling_key=self.sampling_key,
                       first_position=start + 1)
        accepted = _hard_match(block[:, 1:], chosen)
        return accepted, chosen[0, accepted], chosen


@torch.inference_mode()
def speculative_generate(
    drafter,
    target,
    input_ids,
    *,
    max_new_tokens: int,
    stop_token_ids,
    temperature: float = 0.0,
    verification: str = "hard-match",
    generator: torch.Generator | None = None,
    decode_clock: str = "after-first-draft",
    sampling_key: int | None = None,
) -> DecodeResult:
    """DFlash speculative decoding of one prompt with a ``dflash.model.DFlashDraftModel``, in blocks of its
    ``block_size`` (1 degenerates to target-only decoding). ``generator`` (on the target's device) drives
    every random draw; ``None`` uses torch's global RNG.
    ``decode_clock``: one of ``DECODE_CLOCKS``; the default is DFlash's benchmark.
    ``sampling_key`` (hard-match at T > 0): the target's picks use Gumbel noise keyed by this and the
    absolute position (``keyed_gumbel``), so the output equals ``autoregressive_generate`` with the same
    key token for token, whatever the drafter: it is what ``dpace.evaluation.replay`` replays.
    """
    _check_args(max_new_tokens, temperature, verification, decode_clock)
    if sampling_key is not None and verification != "hard-match":
        raise ValueError("sampling_key needs hard-match verification (rejection samples the drafts)")
    device = target.device
    block_size = int(drafter.block_size)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    input_ids = _as_batch(input_ids, device)
    stops = {int(t) for t in (stop_token_ids or ())}
    spec = _Speculation(drafter, target, temperature, verification, generator, sampling_key)

    num_input = input_ids.shape[1]
    max_length = num_input + max_new_tokens
    output_ids = torch.full((1, max_length + 1), int(drafter.mask_token_id), dtype=torch.long, device=device)
    position_ids = torch.arange(max_length + 1, device=device)[None]
    target_cache = new_kv_cache(target.config)
    draft_cache = new_kv_cache(drafter.config)

    prefill_start = device_clock(device)
    target_hidden = spec.prefill(input_ids, output_ids, position_ids, target_cache, block_size)
    first_token = int(output_ids[0, num_input].item())
    time_to_first_token = device_clock(device) - prefill_start

    decode_start = device_clock(device)
    restart_clock = decode_clock == "after-first-draft"
    result = DecodeResult(new_token_ids=[], acceptance_lengths=[], decode_clock=decode_clock, num_input_tokens=num_input)
    start = num_input
    stopped = first_token in stops
    while start + 1 < max_length and not stopped:
        verify_size = min(block_size, max_length - start)
        block = output_ids[:, start : start + verify_size].clone()
        if verify_size > 1:
            draft_logits, draft_probs = spec.draft(block, target_hidden, position_ids, draft_cache, start, verify_size)
            if restart_clock:  # DFlash's benchmark: the drafter's first (prefill-sized) call is not decode time
                decode_start, restart_clock = device_clock(device), False

        output = target(
            block,
            position_ids=position_ids[:, start : start + verify_size],
            past_key_values=target_cache,
            use_cache=True,
            output_hidden_states=verify_size > 1,
        )
        accepted, bonus, chosen = spec.verify(output.logits, block, draft_probs if verify_size > 1 else None,
                                              verify_size, start)
        produced, stopped = _emit(output_ids, block, accepted, bonus, start, max_length, stops)
        if verify_size > 1:
            q = torch.softmax(draft_logits[0].float(), dim=-1).gather(-1, chosen[0, :-1, None])[:, 0]
            result.blocks.append(BlockRecord(accepted=accepted, emitted=produced, q=q.tolist()))
            target_hidden = _context_features(output.hidden_states, spec.layer_ids, produced)
        del output
        start += produced
        _crop_to(target_cache, start)
        result.acceptance_lengths.append(produced)
        result.block_lengths.append(accepted + 1)

    end = min(start + 1, max_length)
    return _finished(result, output_ids[0, num_input:end].tolist(), time_to_first_token,
                     device_clock(device) - decode_start, stopped)


def _emit(output_ids, block, accepted: int, bonus, start: int, max_length: int, stops: set[int]) -> tuple[int, bool]:
    """Write a step's accepted drafts and bonus token; returns the tokens it emitted (cut at a stop token or
    the length cap) and whether a stop token ended the output."""
    output_ids[:, start : start + accepted + 1] = block[:, : accepted + 1]
    output_ids[:, start + accepted + 1] = bonus
    produced = min(accepted + 1, max_length - start - 1)
    if stops:
        cut = _cut_at_stop(output_ids[0, start + 1 : start + produced + 1].tolist(), stops)
        if cut is not None:
            return cut + 1, True
    return produced, False


def _finished(result: DecodeResult, new_tokens: list[int], time_to_first_token: float, decode_time: float,
              stopped: bool) -> DecodeResult:
    """``result`` with its tokens and DFlash's timings (time per output token: decode time over all of them)."""
    result.new_token_ids, result.num_output_tokens, result.stopped = new_tokens, len(new_tokens), stopped
    result.time_to_first_token_s, result.decode_time_s = time_to_first_token, decode_time
    result.time_per_output_token_s = decode_time / len(new_tokens)
    return result


@torch.inference_mode()
def autoregressive_generate(
    target,
    input_ids,
    *,
    max_new_tokens: int,
    stop_token_ids,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    sampling_key: int | None = None,
) -> DecodeResult:
    """The baseline: one target forward per token, timed exactly like ``speculative_generate``.

    Every step emits one token, so ``acceptance_lengths`` is all ones and there are no blocks.
    ``sampling_key``: keyed sampling at T > 0, as ``speculative_generate`` takes it.
    """
    _check_args(max_new_tokens, temperature, "hard-match")
    device = target.device
    input_ids = _as_batch(input_ids, device)
    stops = {int(t) for t in (stop_token_ids or ())}
    num_input = input_ids.shape[1]
    cache = new_kv_cache(target.config)

    prefill_start = device_clock(device)
    output = target(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    token = _pick(output.logits[:, -1], temperature, generator, sampling_key=sampling_key, first_position=num_input)
    del output
    tokens = [int(token[0].item())]
    time_to_first_token = device_clock(device) - prefill_start

    decode_start = device_clock(device)
    position = num_input
    stopped = tokens[0] in stops
    while len(tokens) < max_new_tokens and not stopped:
        output = target(
            token[:, None],
            position_ids=torch.tensor([[position]], device=device),
            past_key_values=cache,
            use_cache=True,
        )
        token = _pick(output.logits[:, -1], temperature, generator, sampling_key=sampling_key,
                      first_position=position + 1)
        del output
        tokens.append(int(token[0].item()))
        position += 1
        stopped = tokens[-1] in stops
    decode_time = device_clock(device) - decode_start
    return DecodeResult(
        new_token_ids=tokens,
        acceptance_lengths=[1] * (len(tokens) - 1),
        block_lengths=[1] * (len(tokens) - 1),
        num_input_tokens=num_input,
        num_output_tokens=len(tokens),
        time_to_first_token_s=time_to_first_token,
        decode_time_s=decode_time,
        time_per_output_token_s=decode_time / len(tokens),
        stopped=stopped,
    )


# ---------------------------------------------------------------------------
# Lossless check
# ---------------------------------------------------------------------------


@torch.inference_mode()
def compare_to_greedy(spec_ids, greedy_ids, target, prompt_ids, *, temperature: float = 0.0,
                      sampling_key: int | None = None) -> dict:
    """Compare a speculative output with the target's greedy output token for token.

    Returns ``mismatches`` (positions where the two differ, plus any length difference),
    ``compared`` (the common length) and, for the first mismatch, its ``first_mismatch``
    position with the target's ``top2_margin`` there (top-1 minus top-2 logit, computed by one
    forward over the prompt and the shared prefix). A margin near 0 is a numerical near-tie, where
    batched and one-token forwards may legitimately disagree; a large margin means a bug.
    With ``sampling_key`` at T > 0 the outputs are keyed samples and the margin is that of the
    scores the sample maximises (logits / T + the position's keyed Gumbel noise).
    """
    spec_ids, greedy_ids = [int(t) for t in spec_ids], [int(t) for t in greedy_ids]
    common = min(len(spec_ids), len(greedy_ids))
    differing = [i for i in range(common) if spec_ids[i] != greedy_ids[i]]
    result = {
        "mismatches": len(differing) + abs(len(spec_ids) - len(greedy_ids)),
        "compared": common,
        "first_mismatch": None,
        "top2_margin": None,
        "spec_token": None,
        "greedy_token": None,
    }
    if differing:
        first = differing[0]
    elif len(spec_ids) != len(greedy_ids):
        first = common  # one output stopped earlier than the other
    else:
        return result
    prompt = _as_batch(prompt_ids, target.device)
    prefix = torch.tensor([greedy_ids[:first]], dtype=torch.long, device=target.device)
    logits = target(torch.cat([prompt, prefix], dim=1), logits_to_keep=1).logits[0, -1].float()
    if temperature > 0 and sampling_key is not None:
        position = torch.tensor([prompt.shape[1] + first])
        logits = logits / temperature + keyed_gumbel(sampling_key, position, logits.shape[-1])[0].to(logits.device)
    top2 = torch.topk(logits, 2).values
    result.update(
        first_mismatch=first,
        top2_margin=float(top2[0] - top2[1]),
        spec_token=spec_ids[first] if first < len(spec_ids) else None,
        greedy_token=greedy_ids[first] if first < len(greedy_ids) else None,
    )
    return result
