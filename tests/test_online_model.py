"""ObjectiveDFlashModel inside SpecForge's DFlash wrapper, against SpecForge's own objectives.

A real ``DFlashDraftModel`` on a tiny random Qwen3 config, float64, CPU, sdpa attention.
Both wrappers sample anchors with ``torch.rand``; reseeding before each forward makes them
see the same anchors, so losses and gradients must agree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
from specforge.modeling.draft.dflash import DFlashDraftModel
from torch import nn
from transformers import Qwen3Config

from dpace.training.objectives import OBJECTIVES
from dpace.training.online_model import ObjectiveDFlashModel
from dpace.training.specforge_run import ObjectiveSpec

DTYPE = torch.float64
HIDDEN, VOCAB, MASK_TOKEN, BLOCK_SIZE = 32, 97, 96, 4
BATCH, SEQ_LEN = 2, 24


def tiny_modules(seed=0, sliding_window=0, depth=1):
    torch.manual_seed(seed)
    config = Qwen3Config(
        hidden_size=HIDDEN,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        num_hidden_layers=depth,
        vocab_size=VOCAB,
        layer_types=["sliding_attention" if sliding_window else "full_attention"] * depth,
        **({"use_sliding_window": True, "sliding_window": sliding_window} if sliding_window else {}),
    )
    config.num_target_layers = 4
    config.block_size = BLOCK_SIZE
    config.dflash_config = {"target_layer_ids": [1, 2], "mask_token_id": MASK_TOKEN}
    config._attn_implementation = "sdpa"
    draft = DFlashDraftModel(config).to(DTYPE)
    embed = nn.Embedding(VOCAB, HIDDEN).to(DTYPE)
    lm_head = nn.Linear(HIDDEN, VOCAB, bias=False).to(DTYPE)
    return draft, lm_head, embed


def batch(seed=1):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, MASK_TOKEN, (BATCH, SEQ_LEN), generator=generator)
    hidden_states = torch.randn(BATCH, SEQ_LEN, 2 * HIDDEN, generator=generator, dtype=DTYPE)
    loss_mask = torch.ones(BATCH, SEQ_LEN)
    loss_mask[:, :5] = 0  # prompt
    loss_mask[1, 12] = 0  # a hole inside a response: invalid mid-block positions
    return input_ids, hidden_states, loss_mask


def run(model, inputs, seed=5, **kwargs):
    """(loss, accuracy, metrics, grads of the draft parameters) with anchors fixed by the seed."""
    model.draft_model.zero_grad()
    torch.manual_seed(seed)
    loss, accuracy, metrics = model(*inputs, **kwargs)
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.draft_model.parameters()]
    model.draft_model.zero_grad()
    return loss.detach(), accuracy, metrics, grads


def assert_same(first, second, tol=1e-6):
    loss_a, accuracy_a, _, grads_a = first
    loss_b, accuracy_b, _, grads_b = second
    torch.testing.assert_close(loss_a, loss_b, atol=tol, rtol=0)
    torch.testing.assert_close(accuracy_a.to(DTYPE), accuracy_b.to(DTYPE), atol=tol, rtol=0)
    for grad_a, grad_b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(grad_a, grad_b, atol=tol, rtol=0)


SPECFORGE_PAIRS = [
    ("dflash", "dflash", {"gamma": 2.0}),
    ("dpace", "dpace", {}),
    ("dpace-cumulative", "dpace-cumulative-confidence-only", {}),
    ("dpace-continuation", "dpace-continuation-value-only", {}),
]


@pytest.mark.parametrize("objective,loss_type,hparams", SPECFORGE_PAIRS)
def test_parity_with_specforge(objective, loss_type, hparams):
    draft, lm_head, embed = tiny_modules()
    inputs = batch()
    common = dict(
        draft_model=draft,
        target_lm_head=lm_head,
        target_embed_tokens=embed,
        mask_token_id=MASK_TOKEN,
        block_size=BLOCK_SIZE,
        attention_backend="sdpa",
        num_anchors=6,  # fewer than the supervised positions: sampling matters
        objective_chunk_blocks=2,
    )
    ours = ObjectiveDFlashModel(objective=ObjectiveSpec(objective, hparams), **common)
    theirs = OnlineDFlashModel(
        loss_type=loss_type, loss_decay_gamma=hparams.get("gamma"), dpace_alpha=0.5, **common
    )
    ours_result, theirs_result = run(ours, inputs), run(theirs, inputs)
    assert_same(ours_result, theirs_result)
    torch.testing.assert_close(ours_result[2]["loss_terms"][1], theirs_result[2]["loss_terms"][1].to(DTYPE))
    # A different seed samples other anchors: the comparison above is not vacuous.
    assert abs(float(run(ours, inputs, seed=6)[0]) - float(ours_result[0])) > 1e-6
    # SpecForge's spelling selects the same objective.
    if loss_type != objective:
        assert_same(run(ObjectiveDFlashModel(objective=ObjectiveSpec(loss_type), **common), inputs), ours_result, tol=0)


def one_hot_target_states(lm_head, input_ids, scale=1e4):
    """Target last hidden states whose lm_head logits at t are one-hot on input_ids[t+1].

    The lm_head rows are made unit vectors in random directions, so h = scale * W[y] puts a
    logit margin of scale * (1 - max cosine) on y: softmax is exactly one-hot in float64.
    """
    with torch.no_grad():
        lm_head.weight.copy_(nn.functional.normalize(lm_head.weight, dim=-1))
        cosines = lm_head.weight @ lm_head.weight.T - torch.eye(VOCAB, dtype=DTYPE)
        assert scale * (1 - cosines.max()) > 800  # exp(-800) == 0 in float64
        next_tokens = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)  # last one: never used
        return scale * lm_head.weight[next_tokens]


def test_target_logits_are_aligned_with_labels():
    """dpakl with a target that is one-hot on the true next token equals dpace exactly.

    This holds only if block position k reads target_last_hidden_states[anchor + k - 1].
    """
    draft, lm_head, embed = tiny_modules()
    inputs = batch()
    target_states = one_hot_target_states(lm_head, inputs[0])
    common = dict(draft_model=draft, target_lm_head=lm_head, target_embed_tokens=embed)
    common.update(mask_token_id=MASK_TOKEN, block_size=BLOCK_SIZE, num_anchors=8)
    dpakl = run(
        ObjectiveDFlashModel(objective=ObjectiveSpec("dpakl"), **common), inputs, target_last_hidden_states=target_states
    )
    dpace = run(ObjectiveDFlashModel(objective=ObjectiveSpec("dpace"), **common), inputs)
    assert_same(dpakl, dpace, tol=1e-10)
    # Off by one position, the same states are not one-hot on the labels any more.
    shifted = torch.roll(target_states, shifts=1, dims=1)
    misaligned = run(
        ObjectiveDFlashModel(objective=ObjectiveSpec("dpakl"), **common), inputs, target_last_hidden_states=shifted
    )
    assert abs(float(misaligned[0]) - float(dpace[0])) > 1e-3


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_every_objective_trains_in_the_wrapper(objective):
    draft, lm_head, embed = tiny_modules()
    inputs = batch()
    target_states = torch.randn(BATCH, SEQ_LEN, HIDDEN, dtype=DTYPE)
    hparams = {"gamma": 2.0} if objective == "dflash" else {}  # B=4 has no default gamma
    model = ObjectiveDFlashModel(
        draft, lm_head, embed, MASK_TOKEN, BLOCK_SIZE, num_anchors=8, objective=ObjectiveSpec(objective, hparams)
    )
    loss, accuracy, metrics, grads = run(model, inputs, target_last_hidden_states=target_states)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    for name in ("weight_per_position", "q_per_position"):
        assert metrics[name].shape == (BLOCK_SIZE,) and not metrics[name].requires_grad
        assert metrics[name][0] == 0  # the anchor is never supervised
    for name in ("accuracy", "surrogate", "expected_emitted_length"):
        assert metrics[name].dim() == 0 and not metrics[name].requires_grad
    assert 1.0 <= float(metrics["expected_emitted_length"]) <= BLOCK_SIZE
    for numerator, denominator in metrics["ratio_metrics"].values():
        assert numerator.shape == denominator.shape and not numerator.requires_grad
    assert metrics["accuracy_denom"] == metrics["token_count"]


def test_chunking_does_not_change_the_result():
    draft, lm_head, embed = tiny_modules()
    inputs = batch()
    common = dict(mask_token_id=MASK_TOKEN, block_size=BLOCK_SIZE, num_anchors=8, objective=ObjectiveSpec("dpace"))
    whole = ObjectiveDFlashModel(draft, lm_head, embed, objective_chunk_blocks=0, **common)
    chunked = ObjectiveDFlashModel(draft, lm_head, embed, objective_chunk_blocks=3, **common)
    assert_same(run(whole, inputs), run(chunked, inputs), tol=1e-10)


def test_dropping_the_context_a_sliding_window_never_sees_changes_no_loss_or_gradient():
    """``FeatureSet.without_unseen_context``, which training applies to sliding-window drafters.

    With more anchors than supervised positions every block is drafted, so the cropped and whole
    sequences (other positions, other padding) must give the same loss and gradients. Two layers: the
    earliest visible position reaches the loss only through the anchor's own slot in the second layer."""
    from dpace.features import FeatureSet
    from dpace.training.loop import padded_micro_batches

    window, prompts, answer = 3, (9, 14), 10
    draft, lm_head, embed = tiny_modules(sliding_window=window, depth=2)
    assert [layer.self_attn.sliding_window for layer in draft.layers] == [window] * 2
    generator = torch.Generator().manual_seed(2)
    lengths = [prompt + answer for prompt in prompts]
    masks = [torch.cat([torch.zeros(prompt), torch.ones(answer)]).to(torch.uint8) for prompt in prompts]
    features = FeatureSet(
        input_ids=torch.randint(0, MASK_TOKEN, (sum(lengths),), generator=generator),
        loss_mask=torch.cat(masks),
        offsets=torch.tensor([0, lengths[0], sum(lengths)]),
        hidden=torch.randn(sum(lengths), 2 * HIDDEN, generator=generator, dtype=DTYPE),
        last_hidden=None,
        layer_ids=[1, 2],
    )
    cropped = features.without_unseen_context(window)
    # Each sequence keeps window - 1 prompt positions: what its first block sees.
    assert (cropped.offsets[1:] - cropped.offsets[:-1]).tolist() == [window - 1 + answer] * 2

    def result(drafter, feature_set):
        model = ObjectiveDFlashModel(drafter, lm_head, embed, MASK_TOKEN, BLOCK_SIZE, num_anchors=4 * answer,
                                     objective=ObjectiveSpec("dpace"))
        (micro_batch,) = padded_micro_batches(feature_set, [0, 1], micro_batch_size=2)
        return run(model, (micro_batch["input_ids"], micro_batch["hidden"].to(DTYPE), micro_batch["loss_mask"]))

    assert_same(result(draft, cropped), result(draft, features), tol=1e-8)  # RoPE rounds at other positions
    # The window does hide context: the same weights with full attention read the dropped positions.
    full_attention, _, _ = tiny_modules(depth=2)
    full_attention.load_state_dict(draft.state_dict())
    assert abs(float(result(full_attention, cropped)[0]) - float(result(full_attention, features)[0])) > 1e-6


def test_bad_configuration_raises():
    draft, lm_head, embed = tiny_modules()
    args = (draft, lm_head, embed, MASK_TOKEN, BLOCK_SIZE)
    with pytest.raises(ValueError, match=r"unknown objective 'dpace2'.*valid objectives"):
        ObjectiveDFlashModel(*args, objective=ObjectiveSpec("dpace2"))
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\]"):
        ObjectiveDFlashModel(*args, objective=ObjectiveSpec("dpace", {"alpha": 2.0}))
    with pytest.raises(ValueError, match=r"no default gamma for block size B=4"):
        ObjectiveDFlashModel(*args, objective=ObjectiveSpec("dflash"))
    with pytest.raises(ValueError, match=r"unknown normalization='sum'"):
        ObjectiveDFlashModel(*args, objective=ObjectiveSpec("dpace", normalization="sum"))
    model = ObjectiveDFlashModel(*args, objective=ObjectiveSpec("pard2-cat"))
    with pytest.raises(ValueError, match=r"objective 'pard2-cat' needs target_last_hidden_states"):
        model(*batch())


def test_dpace_training_lowers_the_loss():
    draft, lm_head, embed = tiny_modules()
    lm_head.requires_grad_(False)  # the target's head is frozen, as in SpecForge
    embed.requires_grad_(False)
    inputs = batch()
    model = ObjectiveDFlashModel(
        draft, lm_head, embed, MASK_TOKEN, BLOCK_SIZE, num_anchors=64, objective=ObjectiveSpec("dpace")
    )
    optimizer = torch.optim.Adam(draft.parameters(), lr=3e-2)
    losses, surrogates = [], []
    for _ in range(12):
        torch.manual_seed(0)  # same anchors every step: a fixed batch
        loss, _, metrics = model(*inputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        surrogates.append(float(metrics["surrogate"]))
    assert losses[-1] < 0.9 * losses[0], losses
    assert surrogates[-1] > 2 * surrogates[0], surrogates  # S~ (accepted-length proxy) grows


# PyTorch's compiled CPU flex_attention gave a different loss from run to run on an AVX2-only CPU (41.60,
# 44.88, 48.04 against SDPA's and eager's constant 48.04); with AVX-512 it matched SDPA every time.
@pytest.mark.skipif(not torch.cpu._is_avx512_supported(),
                    reason="CPU flex_attention is nondeterministic without AVX-512 (PyTorch 2.13); the GPU check compares on CUDA")
def test_flex_attention_gives_the_sdpa_loss(tmp_path):
    """The paper's GPU setting builds SpecForge's flex_attention BlockMask instead of the dense SDPA
    mask; both must describe the same attention. PyTorch has no CPU backward for flex_attention, so
    the forward is compared here (training with it runs on CUDA: the GPU check script).

    It runs in a fresh process with its own inductor cache: a second CPU flex_attention compile in one
    process (tests/test_benchmarks.py compiles one too, and xdist may put both files in one worker) emits
    C++ that does not compile (CppCompileError, 'cur_kvSplitSize5', CI at 7cc08a1 and c4f6dfa)."""
    script = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); " \
             "import test_online_model; test_online_model.compare_flex_attention_with_sdpa()"
    environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "flex_attention equals sdpa" in result.stdout


def compare_flex_attention_with_sdpa() -> None:
    draft, lm_head, embed = (module.float() for module in tiny_modules())  # CPU flex: no float64
    input_ids, hidden_states, loss_mask = batch()
    inputs = (input_ids, hidden_states.float(), loss_mask)
    common = dict(mask_token_id=MASK_TOKEN, block_size=BLOCK_SIZE, num_anchors=8, objective=ObjectiveSpec("dpace"))
    losses = {}
    for backend in ("sdpa", "flex_attention"):
        draft.config._attn_implementation = backend
        model = ObjectiveDFlashModel(draft, lm_head, embed, attention_backend=backend, **common)
        torch.manual_seed(5)
        with torch.no_grad():
            losses[backend], _, metrics = model(*inputs)
        losses[backend + " q"] = metrics["q_per_position"]
    torch.testing.assert_close(losses["sdpa"], losses["flex_attention"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(losses["sdpa q"], losses["flex_attention q"], atol=1e-5, rtol=1e-5)
    print("flex_attention equals sdpa:", float(losses["sdpa"]), float(losses["flex_attention"]))


@pytest.mark.parametrize("sliding_window", [0, 3])
def test_drafters_train_on_grouped_kv_attention_with_the_losses_and_gradients_of_plain_sdpa(sliding_window):
    """``build_drafter`` trains its SDPA drafters on ``dpace.targets.grouped_kv_sdpa`` (no per-head key/value
    copies on a CPU): the dense DFlash mask must give the same loss and gradients as transformers' SDPA."""
    from dpace.targets import GROUPED_KV_SDPA
    from dpace.training.drafter import build_drafter

    draft, lm_head, embed = tiny_modules(sliding_window=sliding_window)
    assert draft.config.num_attention_heads // draft.config.num_key_value_heads == 2  # a grouped layer
    assert build_drafter(draft.config.__class__(**draft.config.to_dict())).config._attn_implementation == GROUPED_KV_SDPA
    results = {}
    for implementation in ("sdpa", GROUPED_KV_SDPA):
        draft.config._attn_implementation = implementation
        model = ObjectiveDFlashModel(draft, lm_head, embed, MASK_TOKEN, BLOCK_SIZE, num_anchors=8,
                                     objective=ObjectiveSpec("dflash", {"gamma": 2.0}))
        results[implementation] = run(model, batch())
    assert_same(results["sdpa"], results[GROUPED_KV_SDPA], tol=1e-10)
    assert float(results["sdpa"][0]) > 0 and any(grad.abs().sum() > 0 for grad in results["sdpa"][3])
