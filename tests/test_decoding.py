"""Speculative decoding: exact agreement with dflash_generate and greedy decoding at T = 0, measured
acceptance, and a statistical losslessness check at T > 0 (which a broken verifier fails)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

import dpace.evaluation.decoding as decoding
from dpace.evaluation.decoding import (
    DecodeResult,
    autoregressive_generate,
    compare_to_greedy,
    speculative_generate,
    surrogate,
)
from dpace.training.drafter import drafter_config

VOCAB, MASK, BLOCK = 128, 127, 4
STOPS = [2]


def tiny_target(seed: int = 0, logit_scale: float = 6.0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    model.lm_head.weight.data.mul_(logit_scale)  # peaky logits: clear greedy choices
    return model


def tiny_drafter(target, seed: int = 1):
    from dflash.model import DFlashDraftModel

    config = drafter_config(target.config, depth=1, block_size=BLOCK, target_layer_ids=[1, 2], mask_token_id=MASK)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return DFlashDraftModel(config).float().eval()


class ScriptedDrafter(torch.nn.Module):
    """A stand-in drafter with the DFlash interface whose logits come from a script.

    ``script(positions) -> logits [len(positions), V]`` gets the absolute positions of the block's
    draft slots. It never touches its cache (the context is implied by the positions).
    """

    def __init__(self, real, script):
        super().__init__()
        self.config = real.config
        self.block_size = real.block_size
        self.mask_token_id = real.mask_token_id
        self.target_layer_ids = real.target_layer_ids
        self.script = script
        self.calls = 0

    def forward(self, *, target_hidden, noise_embedding, position_ids, past_key_values=None, use_cache=False):
        self.calls += 1
        return position_ids[..., None].float()  # the "hidden state" carries each slot's position

    def compute_logits(self, hidden, output_head):
        rows = hidden.reshape(-1, hidden.shape[-1])  # [n, 1] from us, [1, n, 1] from dflash
        return self.script(rows[:, 0].long().tolist()).reshape(*hidden.shape[:-1], VOCAB)


def one_hot_logits(tokens: list[int]) -> torch.Tensor:
    logits = torch.full((len(tokens), VOCAB), -20.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 20.0
    return logits


# Tiny models gain nothing from threads (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models():
    target = tiny_target()
    return target, tiny_drafter(target)


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, MASK, (n,), generator=gen).tolist() for n in (5, 9, 14, 21)]


def greedy(target, prompt, n=24, stops=STOPS) -> DecodeResult:
    return autoregressive_generate(target, prompt, max_new_tokens=n, stop_token_ids=stops)


def test_surrogate_is_sum_of_prefix_products():
    assert surrogate([0.5, 0.5, 1.0]) == pytest.approx(0.5 + 0.25 + 0.25)
    assert surrogate([]) == 0.0
    assert surrogate([1.0] * 3) == 3.0


@pytest.mark.parametrize("stops", [STOPS, None])
def test_t0_matches_dflash_generate_and_greedy(models, prompts, monkeypatch, stops):
    import dflash.model as dm

    monkeypatch.setattr(dm, "_cuda_time", time.perf_counter)
    target, drafter = models
    for prompt in prompts:
        ours = speculative_generate(drafter, target, prompt, max_new_tokens=24, stop_token_ids=stops)
        theirs = dm.dflash_generate(
            drafter, target, torch.tensor([prompt]), 24, stops, return_stats=True
        )
        assert ours.new_token_ids == theirs.output_ids[0, len(prompt) :].tolist()
        assert ours.acceptance_lengths == theirs.acceptance_lengths
        assert ours.num_output_tokens == theirs.num_output_tokens
        ref = greedy(target, prompt, stops=stops)
        assert compare_to_greedy(ours.new_token_ids, ref.new_token_ids, target, prompt)["mismatches"] == 0
        assert sum(ours.acceptance_lengths) + 1 == ours.num_output_tokens
        assert len(ours.blocks) == len(ours.acceptance_lengths)


def test_t0_partially_right_drafter_matches_dflash_with_varied_acceptance(models, prompts, monkeypatch):
    """A drafter that is right at most positions gives acceptance lengths of all sizes."""
    import dflash.model as dm

    monkeypatch.setattr(dm, "_cuda_time", time.perf_counter)
    target, real = models
    wrong = set(np.flatnonzero(np.random.default_rng(0).random(100) < 0.3).tolist())
    seen = set()
    for prompt in prompts:
        ref = greedy(target, prompt, n=40, stops=None).new_token_ids
        sequence = prompt + ref

        def script(positions, sequence=sequence):
            # the target's greedy token, except at ~30% of positions
            return one_hot_logits([
                (sequence[p] + 1) % MASK if p in wrong or p >= len(sequence) else sequence[p] for p in positions
            ])

        drafter = ScriptedDrafter(real, script)
        ours = speculative_generate(drafter, target, prompt, max_new_tokens=40, stop_token_ids=None)
        theirs = dm.dflash_generate(drafter, target, torch.tensor([prompt]), 40, None, return_stats=True)
        assert ours.new_token_ids == theirs.output_ids[0, len(prompt) :].tolist() == ref
        assert ours.acceptance_lengths == theirs.acceptance_lengths
        seen |= set(ours.acceptance_lengths)
    assert {1, 2, 3, 4} <= seen


def test_copying_drafter_is_fully_accepted(models, prompts):
    target, real = models
    prompt = prompts[1]
    ref = greedy(target, prompt, n=33, stops=None).new_token_ids
    sequence = prompt + ref
    drafter = ScriptedDrafter(real, lambda ps: one_hot_logits([sequence[p] if p < len(sequence) else 0 for p in ps]))
    out = speculative_generate(drafter, target, prompt, max_new_tokens=33, stop_token_ids=None)
    assert out.new_token_ids == ref
    # 1 prefill token + 8 full blocks of 4 = 33 tokens
    assert out.acceptance_lengths == [BLOCK] * 8
    assert out.tau == BLOCK
    assert all(b.accepted == BLOCK - 1 and b.emitted == BLOCK for b in out.blocks)
    assert all(b.q == pytest.approx([1.0] * (BLOCK - 1)) for b in out.blocks)
    assert out.blocks[0].surrogate == pytest.approx(BLOCK - 1)


def test_random_drafter_gives_tau_near_one(models, prompts):
    target, real = models
    gen = torch.Generator().manual_seed(0)
    drafter = ScriptedDrafter(real, lambda ps: torch.randn(len(ps), VOCAB, generator=gen))
    taus = []
    for prompt in prompts:
        out = speculative_generate(drafter, target, prompt, max_new_tokens=30, stop_token_ids=None)
        assert out.new_token_ids == greedy(target, prompt, n=30, stops=None).new_token_ids
        taus.append(out.tau)
        # blocks shrink only at the max_new_tokens cap
        assert [len(b.q) for b in out.blocks][-3:] == [BLOCK - 1, 2, 1]
        assert all(0 <= x <= 1 for b in out.blocks for x in b.q)
        assert all(b.surrogate < 0.2 for b in out.blocks)
    assert 1.0 <= np.mean(taus) < 1.15


def test_block_size_and_length_cap(models, prompts, monkeypatch):
    target, drafter = models
    prompt = prompts[0]
    for n in (1, 2, 5):
        out = speculative_generate(drafter, target, prompt, max_new_tokens=n, stop_token_ids=None)
        assert out.num_output_tokens == n == len(out.new_token_ids)
    monkeypatch.setattr(drafter, "block_size", 1)  # blocks of one: the target decoding alone
    out = speculative_generate(drafter, target, prompt, max_new_tokens=10, stop_token_ids=None)
    assert out.acceptance_lengths == [1] * 9 and out.blocks == []
    assert out.new_token_ids == greedy(target, prompt, n=10, stops=None).new_token_ids


def test_stop_token_ends_output(models, prompts):
    target, real = models
    prompt = prompts[2]
    ref = greedy(target, prompt, n=20, stops=None).new_token_ids
    stop = ref[6]
    cut = ref.index(stop) + 1
    for drafter in (real, ScriptedDrafter(real, lambda ps: one_hot_logits([(prompt + ref + [0] * 9)[p] for p in ps]))):
        out = speculative_generate(drafter, target, prompt, max_new_tokens=20, stop_token_ids=[stop])
        assert out.new_token_ids == ref[:cut] and out.stopped
        assert greedy(target, prompt, n=20, stops=[stop]).new_token_ids == ref[:cut]


def test_stop_inside_a_block_counts_accepted_plus_bonus_as_dflash_benchmark(models, prompts):
    """A fully accepted block in which the stop token comes second: the output ends there, the
    emitted count is 2, and DFlash's benchmark count (block_lengths) is still accepted + 1 = B."""
    target, real = models
    prompt = prompts[2]
    ref = greedy(target, prompt, n=20, stops=None).new_token_ids
    # new token i > 0 ends a block when i % B == 0 (token 0 comes from the prefill): stop inside one
    at = next(i for i in range(2, 20) if ref.index(ref[i]) == i and i % BLOCK != 0)
    stop, cut = ref[at], at + 1
    sequence = prompt + ref + [0] * 9
    drafter = ScriptedDrafter(real, lambda ps: one_hot_logits([sequence[p] for p in ps]))
    out = speculative_generate(drafter, target, prompt, max_new_tokens=20, stop_token_ids=[stop])
    assert out.new_token_ids == ref[:cut] and out.stopped
    assert sum(out.acceptance_lengths) + 1 == cut  # emitted: cut at the stop token
    assert out.block_lengths == [BLOCK] * len(out.acceptance_lengths)  # accepted + 1, never cut
    assert out.acceptance_lengths[-1] < BLOCK


class SlowFirstCall(ScriptedDrafter):
    """The first draft call (the drafter's prefill over the prompt's context) takes ``delay`` seconds
    of a virtual clock that nothing else advances, so the test does not depend on machine load."""

    def __init__(self, real, script, delay, clock):
        super().__init__(real, script)
        self.delay, self.clock = delay, clock

    def forward(self, **kwargs):
        if self.calls == 0:
            self.clock[0] += self.delay
        return super().forward(**kwargs)


def test_decode_clock_leaves_out_the_first_draft_call_as_dflash_benchmark(models, prompts, monkeypatch):
    target, real = models
    prompt = prompts[0]
    delay, clock = 5.0, [0.0]
    monkeypatch.setattr(decoding, "device_clock", lambda device: clock[0])
    script = lambda ps: one_hot_logits([0] * len(ps))  # noqa: E731
    runs = {
        name: speculative_generate(SlowFirstCall(real, script, delay, clock), target, prompt, max_new_tokens=12,
                                   stop_token_ids=None, decode_clock=name)
        for name in ("after-first-draft", "after-prefill")
    }
    assert runs["after-prefill"].decode_time_s == delay  # dflash 0.1.0: the first draft call is decode time
    assert runs["after-first-draft"].decode_time_s == 0.0  # DFlash's benchmark: it is not
    for out in runs.values():
        assert out.time_per_output_token_s == pytest.approx(out.decode_time_s / out.num_output_tokens)
    with pytest.raises(ValueError, match="decode_clock"):
        speculative_generate(real, target, prompt, max_new_tokens=4, stop_token_ids=None, decode_clock="never")


def test_timing_fields(models, prompts):
    target, drafter = models
    out = speculative_generate(drafter, target, prompts[0], max_new_tokens=8, stop_token_ids=None)
    assert out.time_to_first_token_s > 0 and out.decode_time_s > 0
    assert out.time_per_output_token_s == pytest.approx(out.decode_time_s / out.num_output_tokens)


def test_compare_to_greedy_reports_first_mismatch(models, prompts):
    target, _ = models
    prompt = prompts[0]
    ref = greedy(target, prompt, n=10, stops=None).new_token_ids
    bad = list(ref)
    bad[4] = (bad[4] + 1) % VOCAB
    report = compare_to_greedy(bad, ref, target, prompt)
    assert report["mismatches"] == 1 and report["first_mismatch"] == 4
    assert report["top2_margin"] > 0 and report["greedy_token"] == ref[4]
    assert compare_to_greedy(ref[:7], ref, target, prompt)["first_mismatch"] == 7


def test_invalid_arguments(models):
    target, drafter = models
    with pytest.raises(ValueError, match="verification"):
        speculative_generate(drafter, target, [5, 6], max_new_tokens=3, stop_token_ids=None, verification="x")
    with pytest.raises(ValueError, match="one sequence"):
        speculative_generate(drafter, target, [[5, 6], [7, 8]], max_new_tokens=3, stop_token_ids=None)


# ---------------------------------------------------------------------------
# T > 0: the first two emitted tokens follow the target's own distribution
# ---------------------------------------------------------------------------

TEMPERATURE = 1.0
SAMPLES = 200


def exact_pair_distribution(target, prompt) -> np.ndarray:
    """p(t1, t2) of sampling two tokens from the target at TEMPERATURE."""
    with torch.inference_mode():
        first = torch.softmax(target(torch.tensor([prompt])).logits[0, -1] / TEMPERATURE, -1)
        batch = torch.cat([torch.tensor([prompt]).repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
        second = torch.softmax(target(batch).logits[:, -1] / TEMPERATURE, -1)
    return (first[:, None] * second).double().numpy()


def target_scripted_drafter(target, real, prompt, scale):
    """Draft logits = scale * the target's own logits given prompt + the block's first token."""

    def script(positions):
        assert positions == [len(prompt) + 1]  # max_new_tokens=2: one draft slot, after t1
        return script.next_logits

    drafter = ScriptedDrafter(real, script)
    embed = target.get_input_embeddings().weight
    cache = {}

    def forward(*, target_hidden, noise_embedding, position_ids, past_key_values=None, use_cache=False):
        t1 = int(torch.cdist(noise_embedding[0, :1], embed).argmin())  # the block's first, real token
        if t1 not in cache:
            with torch.inference_mode():
                cache[t1] = scale * target(torch.tensor([prompt + [t1]])).logits[0, -1:]
        script.next_logits = cache[t1]
        return position_ids[..., None].float()

    drafter.forward = forward
    return drafter


def chi_square_p(target, drafter, prompt, verification) -> float:
    expected = exact_pair_distribution(target, prompt)
    gen = torch.Generator().manual_seed(1234)
    counts = np.zeros_like(expected)
    for _ in range(SAMPLES):
        out = speculative_generate(
            drafter, target, prompt, max_new_tokens=2, stop_token_ids=None,
            temperature=TEMPERATURE, verification=verification, generator=gen,
        )
        counts[out.new_token_ids[0], out.new_token_ids[1]] += 1
    expected = expected * SAMPLES
    big = expected >= 5  # pool the sparse cells into one
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    assert big.sum() >= 4, "the test distribution is too peaky to be informative"
    return chisquare(observed, wanted * observed.sum() / wanted.sum()).pvalue


@pytest.fixture(scope="module")
def sampling_setup(models):
    target = tiny_target(seed=5, logit_scale=30.0)  # a few likely tokens per step, ~10 likely pairs
    real = tiny_drafter(target)
    return target, real, [50, 60, 70]


@pytest.mark.parametrize("verification,scale", [("hard-match", 1.0), ("rejection", 0.5)])
def test_sampling_is_lossless(sampling_setup, verification, scale):
    target, real, prompt = sampling_setup
    drafter = target_scripted_drafter(target, real, prompt, scale)
    assert chi_square_p(target, drafter, prompt, verification) > 1e-3


@pytest.mark.parametrize("verification,scale", [("hard-match", 1.0), ("rejection", 0.5)])
def test_broken_verifier_is_caught(sampling_setup, monkeypatch, verification, scale):
    target, real, prompt = sampling_setup
    drafter = target_scripted_drafter(target, real, prompt, scale)

    def always_accept_rejection(draft_tokens, target_probs, draft_probs, generator):
        return draft_tokens.shape[1], decoding._sample(target_probs[:, -1], generator)[0]

    monkeypatch.setattr(decoding, "_hard_match", lambda draft_tokens, picks: draft_tokens.shape[1])
    monkeypatch.setattr(decoding, "_rejection_sample", always_accept_rejection)
    assert chi_square_p(target, drafter, prompt, verification) < 1e-6


def test_sampling_is_reproducible_with_a_generator(sampling_setup):
    target, real, prompt = sampling_setup
    runs = [
        speculative_generate(
            real, target, prompt, max_new_tokens=12, stop_token_ids=None, temperature=1.0,
            verification="rejection", generator=torch.Generator().manual_seed(9),
        ).new_token_ids
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    ar = [
        autoregressive_generate(
            target, prompt, max_new_tokens=12, stop_token_ids=None, temperature=1.0,
            generator=torch.Generator().manual_seed(9),
        ).new_token_ids
        for _ in range(2)
    ]
    assert ar[0] == ar[1]


def test_optimize_for_cpu_keeps_values_ties_and_outputs(prompts, monkeypatch):
    import dflash.model as dm

    from dpace.evaluation.decoding import optimize_for_cpu

    monkeypatch.setattr(dm, "_cuda_time", time.perf_counter)
    target, drafter = tiny_target(seed=2), None
    target.config.tie_word_embeddings = True
    target.tie_weights()
    drafter = tiny_drafter(target)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    reference = [greedy(target, p, stops=None).new_token_ids for p in prompts]
    optimize_for_cpu(target, drafter)
    assert not target.lm_head.weight.is_contiguous() and target.lm_head.weight.t().is_contiguous()
    assert target.lm_head.weight is target.get_input_embeddings().weight
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    for prompt, ref in zip(prompts, reference, strict=True):
        ours = speculative_generate(drafter, target, prompt, max_new_tokens=24, stop_token_ids=None)
        theirs = dm.dflash_generate(drafter, target, torch.tensor([prompt]), 24, None, return_stats=True)
        assert ours.new_token_ids == ref == theirs.output_ids[0, len(prompt) :].tolist()
        assert ours.acceptance_lengths == theirs.acceptance_lengths


# ---------------------------------------------------------------------------
# T > 0, the full block: every draft position and the bonus token after a fully accepted block
# ---------------------------------------------------------------------------

FULL = BLOCK + 1  # the prefill's token, then one block: 3 draft positions and the bonus
BLOCK_SAMPLES = 1000  # broken verifiers reach p < 1e-120 (always-accept, wrong-ratio) or 0 here; correct ones 0.02 and 0.89


def exact_sequence_distribution(target, prompt, length=FULL, floor=1e-5) -> dict[tuple, float]:
    """p(t1..t_length) of sampling from the target at TEMPERATURE, for every sequence whose prefixes
    all have probability >= floor (the rest is the pooled remainder)."""
    prefixes = {(): 1.0}
    for _ in range(length):
        keys = list(prefixes)
        with torch.inference_mode():
            batch = torch.tensor([prompt + list(k) for k in keys])
            probs = torch.softmax(target(batch).logits[:, -1].double() / TEMPERATURE, -1).numpy()
        grown = {}
        for key, row in zip(keys, probs, strict=True):
            for token in np.flatnonzero(prefixes[key] * row >= floor):
                grown[key + (int(token),)] = prefixes[key] * row[token]
        prefixes = grown
    return prefixes


def block_scripted_drafter(target, real, prompt, scale):
    """Draft logits at every slot of a block = scale * the target's logits along its own greedy path
    from prompt + the block's first token: a parallel drafter that is often, not always, right."""
    embed = target.get_input_embeddings().weight
    cache = {}

    def path_logits(first):
        if first not in cache:
            context, rows = prompt + [first], []
            with torch.inference_mode():
                for _ in range(BLOCK - 1):
                    logits = target(torch.tensor([context])).logits[0, -1]
                    rows.append(scale * logits)
                    context = context + [int(logits.argmax())]
            cache[first] = torch.stack(rows)
        return cache[first]

    drafter = ScriptedDrafter(real, lambda positions: drafter.next_logits[: len(positions)])

    def forward(*, target_hidden, noise_embedding, position_ids, past_key_values=None, use_cache=False):
        first = int(torch.cdist(noise_embedding[0, :1], embed).argmin())  # the block's first, real token
        drafter.next_logits = path_logits(first)
        return position_ids[..., None].float()

    drafter.forward = forward
    return drafter


def full_block_chi_square(target, drafter, prompt, verification) -> tuple[float, float]:
    """(p-value of the 5-token sequences against the target's exact distribution, fraction of samples
    whose first block was fully accepted, i.e. whose 5th token is the bonus after a full block)."""
    exact = exact_sequence_distribution(target, prompt)
    cells = {seq: i for i, seq in enumerate(s for s, p in exact.items() if p * BLOCK_SAMPLES >= 5)}
    assert len(cells) >= 10, "the test distribution is too peaky to be informative"
    expected = np.zeros(len(cells) + 1)
    for seq, p in exact.items():
        expected[cells.get(seq, len(cells))] += p
    expected[-1] += 1.0 - sum(exact.values())  # sequences below the floor
    observed, full_blocks = np.zeros_like(expected), 0
    gen = torch.Generator().manual_seed(4321)
    for _ in range(BLOCK_SAMPLES):
        out = speculative_generate(
            drafter, target, prompt, max_new_tokens=FULL, stop_token_ids=None,
            temperature=TEMPERATURE, verification=verification, generator=gen,
        )
        observed[cells.get(tuple(out.new_token_ids), len(cells))] += 1
        full_blocks += out.blocks[0].accepted == BLOCK - 1
    return chisquare(observed, expected * BLOCK_SAMPLES).pvalue, full_blocks / BLOCK_SAMPLES


def always_accept_hard_match(draft_tokens, picks):
    return draft_tokens.shape[1]


def one_too_many_hard_match(draft_tokens, picks):
    """Off by one: the first mismatching draft token is accepted too."""
    matched = int((draft_tokens == picks[:, : draft_tokens.shape[1]]).cumprod(dim=1).sum(dim=1)[0].item())
    return min(matched + 1, draft_tokens.shape[1])


def always_accept_rejection(draft_tokens, target_probs, draft_probs, generator):
    return draft_tokens.shape[1], decoding._sample(target_probs[:, -1], generator)[0]


def wrong_ratio_rejection(draft_tokens, target_probs, draft_probs, generator):
    """Accepts x with probability p(x) instead of min(1, p(x) / q(x)): the draft probability is not divided out."""
    gamma = draft_tokens.shape[1]
    p = target_probs[:, :gamma].gather(-1, draft_tokens[..., None])[..., 0]
    u = torch.rand(p.shape, generator=generator, dtype=p.dtype)
    accepted = int((u < p).to(torch.int32).cumprod(-1).sum(-1)[0].item())
    if accepted == gamma:
        return accepted, decoding._sample(target_probs[:, -1], generator)[0]
    residual = (target_probs[0, accepted] - draft_probs[0, accepted]).clamp_min(0)
    return accepted, decoding._sample((residual / residual.sum())[None], generator)[0]


FULL_BLOCK_CASES = {"hard-match": 1.0, "rejection": 0.8}  # draft scale: rejection needs q != p to test p/q
BROKEN = {
    "hard-match": {"always-accept": always_accept_hard_match, "one-too-many": one_too_many_hard_match},
    "rejection": {"always-accept": always_accept_rejection, "wrong-ratio": wrong_ratio_rejection},
}
VERIFIER = {"hard-match": "_hard_match", "rejection": "_rejection_sample"}


@pytest.mark.slow  # BLOCK_SAMPLES decodes of a full block per case
@pytest.mark.parametrize("verification,broken", [(v, b) for v in FULL_BLOCK_CASES for b in (None, *BROKEN[v])],
                         ids=lambda x: x or "correct")
def test_full_block_sampling_is_lossless_and_broken_verifiers_are_caught(sampling_setup, monkeypatch, verification,
                                                                          broken):
    target, real, prompt = sampling_setup
    drafter = block_scripted_drafter(target, real, prompt, FULL_BLOCK_CASES[verification])
    if broken:
        monkeypatch.setattr(decoding, VERIFIER[verification], BROKEN[verification][broken])
    p_value, full_blocks = full_block_chi_square(target, drafter, prompt, verification)
    if broken:
        assert p_value < 1e-6, f"{verification} verifier {broken} not detected (p = {p_value:.3g})"
    else:
        assert p_value > 1e-3, p_value
        assert full_blocks >= 0.2, f"too few fully accepted blocks ({full_blocks:.2f}) to test the bonus token"
