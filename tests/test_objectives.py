"""dpace.training.objectives against naive transcriptions of the paper's formulas.

The naive reference works block by block in plain Python: it drops the block's invalid
positions (no-ops in products, excluded from sums) and then applies the paper's formula
literally with O(B^2) loops; only dflash keeps absolute block positions, like the released
code. CE_j is built per position with autograd so gradients can be compared as well.

Every test here reads what it needs of an objective from its registry record (hyper-parameters,
denominator, loss kind): a new record runs through all of them unedited. The one exception is
the naive weight formula itself, an independent transcription of the paper kept in
``NAIVE_WEIGHTS``; a record without one fails ``test_every_objective_has_a_naive_reference`` only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F

from dpace.training.objectives import (
    DEFAULT_NORMALIZATION,
    NEEDS_TARGET_LOGITS,
    OBJECTIVES,
    REGISTRY,
    ObjectiveTerms,
    block_loss,
    canonical_objective,
    default_gamma,
    normalize_terms,
    objective_terms,
    position_weights,
    resolve_hparams,
)

DTYPE = torch.float64
VOCAB = 7

# A valid value away from the default of each hyper-parameter a record may take.
TRIAL_HPARAMS = {"alpha": 0.3, "gamma": 3.0, "k": 2}


def make_inputs(block_size, batch=2, blocks=3, seed=0, empty_block=True):
    """Random logits/targets/masks; z* is the draft argmax half the time so accept lengths > 0."""
    generator = torch.Generator().manual_seed(seed)
    draft_logits = 2.0 * torch.randn(batch, blocks, block_size, VOCAB, generator=generator, dtype=DTYPE)
    target_logits = 2.0 * torch.randn(batch, blocks, block_size, VOCAB, generator=generator, dtype=DTYPE)
    random_ids = torch.randint(0, VOCAB, (batch, blocks, block_size), generator=generator)
    use_argmax = torch.rand(batch, blocks, block_size, generator=generator) < 0.5
    target_ids = torch.where(use_argmax, draft_logits.argmax(-1), random_ids)
    valid = torch.rand(batch, blocks, block_size, generator=generator) < 0.75
    valid[..., 0] = False  # the anchor is never supervised
    valid[0, 0, 1] = True
    if empty_block:
        valid[1, 0] = False
    return draft_logits.requires_grad_(True), target_ids, valid, target_logits


def hparams_for(objective):
    """Only the hyper-parameters without a default (dflash's gamma has none at every B)."""
    return {name: TRIAL_HPARAMS[name] for name, default in REGISTRY[objective].hparams.items() if default is None}


def trial_hparams(objective):
    """A non-default value of every hyper-parameter the objective's record takes."""
    return {name: TRIAL_HPARAMS[name] for name in REGISTRY[objective].hparams}


# --------------------------------------------------------------------------- naive reference


def prod(values):
    result = 1.0
    for value in values:
        result = result * value
    return result


class NaiveBlock(NamedTuple):
    """One block's valid positions, as the paper's formulas see it."""

    positions: list  # absolute block positions j of the valid entries
    z: list  # z*_j
    q: list  # sg(q_j) = exp(-loss_j), the draft confidence (exp(-C_j) for D-PAKL)
    target_probs: list  # p_theta(.) at each valid position, as a list over the vocabulary
    ranked: list  # the draft's tokens by decreasing logit at each valid position


def dpace_weights(conf, alpha):
    """(cumulative, continuation, full) D-PACE weights of Eq. dpace-coef, with O(B^2) products."""
    count = len(conf)
    smooth = [(1 - alpha) * c + alpha for c in conf]
    cumulative = [prod(smooth[: t + 1]) for t in range(count)]
    continuation = [1 + sum(prod(smooth[t + 1 : m + 1]) for m in range(t + 1, count)) for t in range(count)]
    full = [sum(prod(smooth[: m + 1]) for m in range(t, count)) for t in range(count)]
    return cumulative, continuation, full


def target_gold_probs(block):
    return [p[zj] for p, zj in zip(block.target_probs, block.z, strict=True)]


# The paper's weight w_j of each objective, transcribed literally: (block, hparams) -> [w_j per valid position].
NAIVE_WEIGHTS = {
    "dflash": lambda b, h: [math.exp(-(j - 1) / h["gamma"]) for j in b.positions],
    "dpace": lambda b, h: dpace_weights(b.q, h["alpha"])[2],
    "dpakl": lambda b, h: dpace_weights(b.q, h["alpha"])[2],  # q = exp(-C_j)
    "dpace-cumulative": lambda b, h: dpace_weights(b.q, h["alpha"])[0],
    "dpace-continuation": lambda b, h: dpace_weights(b.q, h["alpha"])[1],
    "dpace-target-prob": lambda b, h: dpace_weights(target_gold_probs(b), h["alpha"])[2],
    "topk-prefix": lambda b, h: [prod(1.0 if b.z[i] in b.ranked[i][: h["k"]] else 0.0 for i in range(t))
                                 for t in range(len(b.z))],
    "pard2-cat": lambda b, h: [prod(target_gold_probs(b)[:t]) for t in range(len(b.z))],
    # Not used in its loss: the implicit gradient weights, sum_{m>=j} prod_{i<=m} q_i (alpha = 0).
    "accept-rate": lambda b, h: dpace_weights(b.q, 0.0)[2],
}


def naive_block(objective, logits, ids, valid, target_logits, **hparams):
    """Per-block (loss numerator tensor, weights {j: w_j}, q {j: q_j}) straight from the paper."""
    record = REGISTRY[objective]
    hparams = {**record.hparams, **hparams}
    positions = [j for j in range(len(ids)) if valid[j]]
    z = [int(ids[j]) for j in positions]
    draft_log_probs = [torch.log_softmax(logits[j], dim=0) for j in positions]
    target_probs = [torch.softmax(target_logits[j], dim=0).tolist() for j in positions]
    if record.loss == "target-ce":  # C_j = -sum_x p_j(x) log q(x)
        ce = [
            -sum(p[x] * lq[x] for x in range(VOCAB))
            for p, lq in zip(target_probs, draft_log_probs, strict=True)
        ]
    else:  # CE_j = -log q_j
        ce = [-lq[zj] for lq, zj in zip(draft_log_probs, z, strict=True)]
    q = [math.exp(-float(c.detach())) for c in ce]  # sg(q_j)
    ranked = [sorted(range(VOCAB), key=lambda x, j=j: -float(logits[j, x].detach())) for j in positions]
    weights = NAIVE_WEIGHTS[objective](NaiveBlock(positions, z, q, target_probs, ranked), hparams)
    by_position = dict(zip(positions, weights, strict=True)), dict(zip(positions, q, strict=True))
    if record.loss == "surrogate":
        q_grad = [torch.exp(-c) for c in ce]
        surrogate = sum(prod(q_grad[: m + 1]) for m in range(len(positions)))  # S~, with gradient
        return (-surrogate if positions else 0.0), *by_position
    numerator = sum(w * c for w, c in zip(weights, ce, strict=True))
    return numerator, *by_position


def naive_loss(objective, draft_logits, target_ids, valid, target_logits, normalization=None, **hparams):
    """Naive loss and diagnostics over a batch, normalized as the released code does."""
    batch, blocks, block_size, _ = draft_logits.shape
    numerator, weight_total, token_total, block_total = 0.0, 0.0, 0, 0
    weight_pos, q_pos, count_pos = [0.0] * block_size, [0.0] * block_size, [0] * block_size
    surrogate, emitted, correct = 0.0, 0.0, 0
    for b in range(batch):
        for n in range(blocks):
            block_num, weights, q = naive_block(
                objective, draft_logits[b, n], target_ids[b, n], valid[b, n], target_logits[b, n], **hparams
            )
            numerator = numerator + block_num
            for j, w in weights.items():
                weight_total += w
                token_total += 1
                weight_pos[j] += w
                q_pos[j] += q[j]
                count_pos[j] += 1
            if not weights:
                continue
            block_total += 1
            ordered = sorted(q)
            surrogate += sum(prod(q[i] for i in ordered[: m + 1]) for m in range(len(ordered)))
            hits = [int(draft_logits[b, n, j].argmax()) == int(target_ids[b, n, j]) for j in ordered]
            correct += sum(hits)
            leading = 0
            while leading < len(hits) and hits[leading]:
                leading += 1
            emitted += 1 + leading
    mode = normalization or DEFAULT_NORMALIZATION[objective]
    denominator = {"batch": batch, "weight": weight_total, "token": token_total, "anchor": block_total}[mode]
    diagnostics = {
        "weight_per_position": [w / c if c else 0.0 for w, c in zip(weight_pos, count_pos, strict=True)],
        "q_per_position": [s / c if c else 0.0 for s, c in zip(q_pos, count_pos, strict=True)],
        "accuracy": correct / token_total,
        "surrogate": surrogate / block_total,
        "expected_emitted_length": emitted / block_total,
    }
    return numerator / denominator, diagnostics


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=DTYPE), torch.as_tensor(expected, dtype=DTYPE), atol=tol, rtol=0
    )


# --------------------------------------------------------------------------- formulas


def test_every_objective_has_a_naive_reference():
    missing = sorted(set(OBJECTIVES) - set(NAIVE_WEIGHTS))
    assert not missing, (f"no naive transcription of the weights of {missing}: add the paper's formula to "
                         f"NAIVE_WEIGHTS in {__file__}; every other test here already covers them")


@pytest.mark.parametrize("block_size", [2, 8, 16])
@pytest.mark.parametrize("objective", [name for name in OBJECTIVES if name in NAIVE_WEIGHTS])
def test_matches_naive_transcription(objective, block_size):
    draft_logits, target_ids, valid, target_logits = make_inputs(block_size, seed=block_size)
    hparams = trial_hparams(objective)
    loss, diagnostics = block_loss(
        objective,
        draft_logits=draft_logits,
        target_ids=target_ids,
        valid=valid,
        target_logits=target_logits,
        **hparams,
    )
    (grad,) = torch.autograd.grad(loss, draft_logits)

    expected, expected_diagnostics = naive_loss(objective, draft_logits, target_ids, valid, target_logits, **hparams)
    (expected_grad,) = torch.autograd.grad(expected, draft_logits)

    close(loss, expected)
    close(grad, expected_grad)
    for name, value in expected_diagnostics.items():
        close(diagnostics[name], value)
        assert not torch.as_tensor(diagnostics[name]).requires_grad


def test_dflash_default_gamma_from_block_size():
    assert [default_gamma(b) for b in (16, 10, 8, 12)] == [7.0, 5.0, 4.0, 6.0]
    for block_size, gamma in ((8, 4.0), (16, 7.0)):
        inputs = make_inputs(block_size)
        kwargs = dict(draft_logits=inputs[0], target_ids=inputs[1], valid=inputs[2])
        close(block_loss("dflash", **kwargs)[0], block_loss("dflash", gamma=gamma, **kwargs)[0], tol=1e-12)
        weights = position_weights("dflash", **kwargs)
        position = int(inputs[2][0, 0].nonzero()[-1])
        close(weights[0, 0, position], math.exp(-(position - 1) / gamma), tol=1e-12)


@pytest.mark.parametrize("k", [1, 3])
def test_topk_prefix_mask_boundary(k):
    """m_j = prod_{i<j} 1[z*_i in TopK]: a target ranked k-th (0-based k-1) passes, (k+1)-th fails."""
    shape = (1, 2, 4)
    draft_logits = torch.arange(VOCAB, 0, -1, dtype=DTYPE).expand(*shape, VOCAB).clone()  # rank of x is x
    target_ids = torch.zeros(shape, dtype=torch.long)
    target_ids[0, 0, 1] = k - 1  # last token inside the top k
    target_ids[0, 1, 1] = k  # first token outside it
    valid = torch.ones(shape, dtype=torch.bool)
    valid[..., 0] = False
    weights = position_weights(
        "topk-prefix", draft_logits=draft_logits, target_ids=target_ids, valid=valid, k=k
    )
    close(weights[0], [[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]], tol=0)


def test_aliases_are_the_same_objective():
    assert canonical_objective("dpace-cumulative-confidence-only") == "dpace-cumulative"
    assert canonical_objective("dpace-continuation-value-only") == "dpace-continuation"
    draft_logits, target_ids, valid, _ = make_inputs(8)
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid)
    assert (
        block_loss("dpace-continuation-value-only", **kwargs)[0]
        == block_loss("dpace-continuation", **kwargs)[0]
    )


# --------------------------------------------------------------------------- gradient identities


def masked_ce(objective, draft_logits, target_ids, valid, target_logits):
    """The per-position loss the record's weights multiply, 0 at invalid positions."""
    if REGISTRY[objective].loss == "target-ce":
        per_position = -(torch.softmax(target_logits, -1) * torch.log_softmax(draft_logits, -1)).sum(-1)
    else:
        per_position = F.cross_entropy(draft_logits.flatten(0, 2), target_ids.flatten(), reduction="none")
        per_position = per_position.view_as(target_ids)
    return per_position * valid


def released_denominator(objective, valid, weights):
    """The denominator of the record's released-code normalization, computed from its definition."""
    return {"batch": valid.shape[0], "anchor": valid.any(-1).sum(), "token": valid.sum(),
            "weight": weights.sum()}[REGISTRY[objective].normalization]


@pytest.mark.parametrize("objective", [name for name, record in REGISTRY.items() if record.loss != "surrogate"])
def test_gradient_is_detached_weights_times_per_position_loss(objective):
    draft_logits, target_ids, valid, target_logits = make_inputs(8, seed=3)
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid, target_logits=target_logits)
    hparams = trial_hparams(objective)
    loss, _ = block_loss(objective, **kwargs, **hparams)
    weights = position_weights(objective, **kwargs, **hparams)
    assert not weights.requires_grad
    ce = masked_ce(objective, draft_logits, target_ids, valid, target_logits)
    reference = (weights * ce).sum() / released_denominator(objective, valid, weights)  # sum_j sg(w_j) CE_j / den
    (grad,) = torch.autograd.grad(loss, draft_logits)
    (reference_grad,) = torch.autograd.grad(reference, draft_logits, retain_graph=True)
    close(loss, reference, tol=1e-10)
    close(grad, reference_grad, tol=1e-10)


def test_dpace_weights_are_detached():
    """Had gradient flowed through D-PACE's w_j, its gradient would differ: the check above can fail."""
    draft_logits, target_ids, valid, _ = make_inputs(8, seed=3)
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid)
    (grad,) = torch.autograd.grad(block_loss("dpace", **kwargs)[0], draft_logits)
    ce = masked_ce("dpace", draft_logits, target_ids, valid, None)
    q_with_grad = torch.exp(-ce)
    smooth = torch.where(valid, 0.5 * q_with_grad + 0.5, torch.ones_like(q_with_grad))
    prefix = torch.cumprod(smooth, -1)
    undetached = (prefix.flip(-1).cumsum(-1).flip(-1) * ce).sum() / draft_logits.shape[0]
    (undetached_grad,) = torch.autograd.grad(undetached, draft_logits)
    assert (undetached_grad - grad).abs().max() > 1e-3


def test_accept_rate_gradient_is_minus_surrogate_gradient():
    draft_logits, target_ids, valid, _ = make_inputs(8, seed=4)
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid)
    loss, diagnostics = block_loss("accept-rate", **kwargs)
    (grad,) = torch.autograd.grad(loss, draft_logits)

    q = torch.exp(-masked_ce("accept-rate", draft_logits, target_ids, valid, None))  # 1 where invalid
    surrogate = (torch.cumprod(q, -1) * valid).sum()  # sum over blocks of S~
    (surrogate_grad,) = torch.autograd.grad(-surrogate / draft_logits.shape[0], draft_logits)
    close(loss, -surrogate / draft_logits.shape[0], tol=1e-12)
    close(grad, surrogate_grad, tol=1e-12)

    # Its implicit weights d(-S~)/d(CE_j) are the D-PACE weights with alpha = 0, not detached.
    weights = position_weights("accept-rate", **kwargs)
    close(weights, position_weights("dpace", alpha=0.0, **kwargs), tol=1e-12)
    ce = masked_ce("accept-rate", draft_logits, target_ids, valid, None)
    (weighted_grad,) = torch.autograd.grad((weights * ce).sum() / draft_logits.shape[0], draft_logits)
    close(grad, weighted_grad, tol=1e-12)


def test_dpakl_with_one_hot_target_equals_dpace():
    draft_logits, target_ids, valid, _ = make_inputs(16, seed=5)
    one_hot_logits = 1000.0 * F.one_hot(target_ids, VOCAB).to(DTYPE)  # softmax is exactly one-hot
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid)
    dpakl, dpakl_diag = block_loss("dpakl", target_logits=one_hot_logits, alpha=0.3, **kwargs)
    dpace, dpace_diag = block_loss("dpace", alpha=0.3, **kwargs)
    close(dpakl, dpace, tol=1e-12)
    close(torch.autograd.grad(dpakl, draft_logits)[0], torch.autograd.grad(dpace, draft_logits)[0], tol=1e-12)
    close(dpakl_diag["weight_per_position"], dpace_diag["weight_per_position"], tol=1e-12)
    # A draft log-prob of -inf where the target has no mass contributes 0 * log 0 = 0.
    with torch.no_grad():
        draft_logits[..., 0] = torch.where(target_ids != 0, -math.inf, draft_logits[..., 0])
    dpakl, _ = block_loss("dpakl", target_logits=one_hot_logits, alpha=0.3, **kwargs)
    dpace, _ = block_loss("dpace", alpha=0.3, **kwargs)
    assert torch.isfinite(dpakl)
    close(dpakl, dpace, tol=1e-12)
    close(torch.autograd.grad(dpakl, draft_logits)[0], torch.autograd.grad(dpace, draft_logits)[0], tol=1e-12)
    # ...and a soft target really changes it (the comparison above can fail).
    soft, _ = block_loss("dpakl", target_logits=torch.randn_like(one_hot_logits), alpha=0.3, **kwargs)
    assert abs(float(soft) - float(dpace)) > 1e-3


# --------------------------------------------------------------------------- edge cases


def constant_q_logits(q, shape):
    """Logits whose softmax puts probability q on token 0 (the target) and spreads the rest."""
    logits = torch.full((*shape, VOCAB), math.log((1 - q) / (VOCAB - 1)), dtype=DTYPE)
    logits[..., 0] = math.log(q)
    return logits


def test_alpha_zero_lets_weights_collapse_and_alpha_half_does_not():
    shape = (1, 1, 16)
    draft_logits = constant_q_logits(0.01, shape)
    target_ids = torch.zeros(shape, dtype=torch.long)
    valid = torch.ones(shape, dtype=torch.bool)
    valid[..., 0] = False
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid)
    collapsed = position_weights("dpace", alpha=0.0, **kwargs)[0, 0]
    assert collapsed[-1] < 1e-25  # q^15
    assert torch.all(collapsed[2:] < collapsed[1:-1])
    smoothed = position_weights("dpace", alpha=0.5, **kwargs)[0, 0]
    assert smoothed[-1] >= 0.5**15  # q~ >= alpha: cannot vanish
    close(position_weights("accept-rate", **kwargs), position_weights("dpace", alpha=0.0, **kwargs), tol=0)


def test_alpha_one_gives_count_of_remaining_valid_positions():
    draft_logits, target_ids, valid, _ = make_inputs(16, seed=6)
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid)
    remaining = valid.to(DTYPE).flip(-1).cumsum(-1).flip(-1) * valid
    close(position_weights("dpace", alpha=1.0, **kwargs), remaining, tol=1e-12)
    close(position_weights("dpace-continuation", alpha=1.0, **kwargs), remaining, tol=1e-12)
    close(position_weights("dpace-cumulative", alpha=1.0, **kwargs), valid.to(DTYPE), tol=1e-12)


@pytest.mark.parametrize("normalization", [None, "batch", "anchor", "weight", "token"])
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_empty_block_contributes_nothing(objective, normalization):
    draft_logits, target_ids, valid, target_logits = make_inputs(8, seed=7, empty_block=False)
    valid[1, 2] = False  # block (1, 2) has nothing valid; give it a q of exactly 0 and -inf logits
    with torch.no_grad():
        draft_logits[1, 2, :, :] = -math.inf
        draft_logits[1, 2, :, 1] = 0.0
    target_ids[1, 2] = 0
    hparams = hparams_for(objective)
    loss, _ = block_loss(
        objective,
        draft_logits=draft_logits,
        target_ids=target_ids,
        valid=valid,
        target_logits=target_logits,
        normalization=normalization,
        **hparams,
    )
    (grad,) = torch.autograd.grad(loss, draft_logits)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert torch.all(grad[1, 2] == 0)

    # Same loss as with that block's logits replaced by anything else.
    other_logits = draft_logits.detach().clone()
    other_logits[1, 2] = torch.randn_like(other_logits[1, 2])
    other, _ = block_loss(
        objective,
        draft_logits=other_logits,
        target_ids=target_ids,
        valid=valid,
        target_logits=target_logits,
        normalization=normalization,
        **hparams,
    )
    close(loss, other, tol=1e-12)


@pytest.mark.parametrize("normalization", [None, "batch", "anchor", "weight", "token"])
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_nothing_valid_gives_zero_not_nan(objective, normalization):
    draft_logits, target_ids, _, target_logits = make_inputs(4)
    valid = torch.zeros(target_ids.shape, dtype=torch.bool)
    loss, diagnostics = block_loss(
        objective,
        draft_logits=draft_logits,
        target_ids=target_ids,
        valid=valid,
        target_logits=target_logits,
        normalization=normalization,
        **hparams_for(objective),
    )
    (grad,) = torch.autograd.grad(loss, draft_logits)
    assert float(loss) == 0.0 and torch.all(grad == 0)
    for name in ("weight_per_position", "q_per_position", "accuracy", "surrogate", "expected_emitted_length"):
        assert torch.isfinite(torch.as_tensor(diagnostics[name])).all()


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_q_exactly_one_is_safe(objective):
    shape = (2, 2, 8)
    draft_logits = torch.zeros(*shape, VOCAB, dtype=DTYPE)
    draft_logits[..., 0] = 1e4  # q = 1 to the last bit
    draft_logits.requires_grad_(True)
    target_ids = torch.zeros(shape, dtype=torch.long)
    valid = torch.ones(shape, dtype=torch.bool)
    valid[..., 0] = False
    target_logits = draft_logits.detach().clone()
    loss, diagnostics = block_loss(
        objective,
        draft_logits=draft_logits,
        target_ids=target_ids,
        valid=valid,
        target_logits=target_logits,
        **hparams_for(objective),
    )
    (grad,) = torch.autograd.grad(loss, draft_logits)
    assert torch.isfinite(grad).all()
    close(diagnostics["q_per_position"][1:], torch.ones(7), tol=0)
    close(diagnostics["surrogate"], 7.0, tol=1e-12)
    close(diagnostics["expected_emitted_length"], 8.0, tol=0)
    # q = 1: every CE_j is 0, and the surrogate ascended instead is S~ = 7 per block (two blocks per sequence).
    close(loss, -7.0 * 2 if REGISTRY[objective].loss == "surrogate" else 0.0, tol=1e-12)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_q_exactly_zero_is_safe(objective):
    draft_logits, target_ids, valid, target_logits = make_inputs(8, seed=8)
    valid[0, 1, 1:] = True
    with torch.no_grad():
        draft_logits[0, 1, 3, target_ids[0, 1, 3]] = -math.inf  # q = 0 at a valid position
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid, target_logits=target_logits)
    hparams = hparams_for(objective)
    weights = position_weights(objective, **kwargs, **hparams)
    assert torch.isfinite(weights).all()
    loss, diagnostics = block_loss(objective, **kwargs, **hparams)
    assert not torch.isnan(loss)
    assert all(
        torch.isfinite(torch.as_tensor(value)).all()
        for value in diagnostics.values()
        if torch.is_tensor(value)
    )
    if REGISTRY[objective].loss == "surrogate":  # no -log q_j term: stays finite
        (grad,) = torch.autograd.grad(loss, draft_logits)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
    elif weights[0, 1, 3] > 0:
        assert loss == math.inf  # -log 0 under a positive weight


def test_continuation_value_survives_exact_zero_confidence():
    """f~_j does not depend on q~_{i<=j}; a zero there must not zero it (division would)."""
    shape = (1, 1, 6)
    draft_logits = constant_q_logits(0.5, shape)
    draft_logits[0, 0, 2, 0] = -math.inf  # q_2 = 0, with alpha = 0 also q~_2 = 0
    target_ids = torch.zeros(shape, dtype=torch.long)
    valid = torch.ones(shape, dtype=torch.bool)
    valid[..., 0] = False
    weights = position_weights(
        "dpace-continuation", draft_logits=draft_logits, target_ids=target_ids, valid=valid, alpha=0.0
    )
    # f~_1 = 1 + q~_2 (1 + ...) = 1; f~_j for j >= 2: 1 + 0.5 + 0.25 + ... over what remains.
    close(weights[0, 0], [0.0, 1.0, 1.875, 1.75, 1.5, 1.0], tol=1e-12)


# --------------------------------------------------------------------------- normalization


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_normalization_denominators(objective):
    draft_logits, target_ids, valid, target_logits = make_inputs(8, seed=9)
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid, target_logits=target_logits)
    hparams = hparams_for(objective)
    terms = objective_terms(objective, **kwargs, **hparams)
    weights = position_weights(objective, **kwargs, **hparams)
    expected = {
        "batch": draft_logits.shape[0],
        "anchor": int(valid.any(-1).sum()),  # valid blocks
        "token": int(valid.sum()),
        "weight": float(weights.sum()),
    }
    assert expected["anchor"] < valid.shape[0] * valid.shape[1]  # the empty block is not counted
    for mode, denominator in expected.items():
        loss, diagnostics = block_loss(objective, normalization=mode, **kwargs, **hparams)
        close(loss, terms.loss_sum / denominator, tol=1e-12)
        close(diagnostics["loss_denominator"], denominator, tol=1e-12)
    default, diagnostics = block_loss(objective, **kwargs, **hparams)
    released = REGISTRY[objective].normalization
    assert diagnostics["normalization"] == released
    close(default, terms.loss_sum / expected[released], tol=1e-12)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_chunked_terms_add_up_to_the_whole(objective):
    draft_logits, target_ids, valid, target_logits = make_inputs(8, blocks=5, seed=10)
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid, target_logits=target_logits)
    hparams = hparams_for(objective)
    whole = objective_terms(objective, **kwargs, **hparams)
    chunks = [
        objective_terms(objective, **{name: t[:, start : start + 2] for name, t in kwargs.items()}, **hparams)
        for start in range(0, 5, 2)
    ]
    summed = ObjectiveTerms(*(sum(parts) for parts in zip(*chunks, strict=True)))
    for name, value in whole._asdict().items():
        close(getattr(summed, name), value, tol=1e-10)
    loss_whole, _ = normalize_terms(whole, objective, batch_size=2)
    loss_chunked, _ = normalize_terms(summed, objective, batch_size=2)
    close(loss_whole, loss_chunked, tol=1e-10)


# --------------------------------------------------------------------------- bad input


def test_bad_inputs_raise_clear_errors():
    draft_logits, target_ids, valid, target_logits = make_inputs(8)
    kwargs = dict(draft_logits=draft_logits, target_ids=target_ids, valid=valid)
    with pytest.raises(ValueError, match=r"unknown objective 'dpce'.*dflash, dpace, dpace-cumulative"):
        block_loss("dpce", **kwargs)
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\].*1.5"):
        block_loss("dpace", alpha=1.5, **kwargs)
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\]"):
        block_loss("dpakl", alpha=-0.1, target_logits=target_logits, **kwargs)
    with pytest.raises(ValueError, match=r"k must be an integer >= 1"):
        block_loss("topk-prefix", k=0, **kwargs)
    with pytest.raises(ValueError, match=r"gamma must be a positive number"):
        block_loss("dflash", gamma=0.0, **kwargs)
    for objective in sorted(NEEDS_TARGET_LOGITS):
        with pytest.raises(ValueError, match=rf"objective '{objective}' needs target_logits"):
            block_loss(objective, **kwargs)
    with pytest.raises(ValueError, match=r"shape mismatch: target_ids"):
        block_loss("dpace", draft_logits=draft_logits, target_ids=target_ids[:, :2], valid=valid)
    with pytest.raises(ValueError, match=r"shape mismatch: valid"):
        block_loss("dpace", draft_logits=draft_logits, target_ids=target_ids, valid=valid[..., :4])
    with pytest.raises(ValueError, match=r"shape mismatch: target_logits"):
        block_loss("dpakl", target_logits=target_logits[..., :3], **kwargs)
    with pytest.raises(ValueError, match=r"draft_logits must be \[batch, blocks, B, V\]"):
        block_loss("dpace", draft_logits=draft_logits[0], target_ids=target_ids[0], valid=valid[0])
    short = make_inputs(5)
    with pytest.raises(ValueError, match=r"no default gamma for block size B=5.*pass gamma explicitly"):
        block_loss("dflash", draft_logits=short[0], target_ids=short[1], valid=short[2])
    with pytest.raises(ValueError, match=r"unknown normalization='mean'"):
        block_loss("dpace", normalization="mean", **kwargs)
    with pytest.raises(ValueError, match=r"objective 'dflash' takes \['gamma'\]; got unexpected \['alpha'\]"):
        block_loss("dflash", alpha=0.5, gamma=2.0, **kwargs)


def test_resolve_hparams_fills_defaults():
    assert resolve_hparams("dflash", 16) == {"gamma": 7.0}
    assert resolve_hparams("dflash", 5, gamma=2) == {"gamma": 2.0}
    assert resolve_hparams("dpace-cumulative-confidence-only", 16) == {"alpha": 0.5}
    assert resolve_hparams("dpace", 16, alpha=None) == {"alpha": 0.5}
    assert resolve_hparams("topk-prefix", 16) == {"k": 3}
    assert resolve_hparams("accept-rate", 16) == {}
    with pytest.raises(ValueError, match="no default gamma for block size B=5"):
        resolve_hparams("dflash", 5)


# --------------------------------------------------------------------------- the registry


def test_one_registry_record_is_all_a_new_objective_needs(monkeypatch):
    """A record plus its weight formula: the loss, the hyper-parameter defaults, the default
    denominator, the config's variants, SpecForge's spec and the table label all pick it up."""
    from dpace.config import experiments
    from dpace.report.latex import objective_label
    from dpace.training import objectives
    from dpace.training.specforge_run import ObjectiveSpec

    def squared_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits):
        return (confidence**2 + hparams["alpha"]) * valid.to(confidence.dtype)

    record = objectives.Objective("squared-q", "Squared q", {"alpha": 0.25}, "token", aliases=("sq",), table_rank=7)
    monkeypatch.setitem(objectives.REGISTRY, "squared-q", record)
    monkeypatch.setitem(objectives.WEIGHTS, "squared-q", squared_weights)

    draft_logits, target_ids, valid, _ = make_inputs(5)
    loss, diagnostics = block_loss("sq", draft_logits=draft_logits, target_ids=target_ids, valid=valid)
    ce = F.cross_entropy(draft_logits.detach().flatten(0, 2), target_ids.flatten(), reduction="none").view_as(valid)
    weights = (torch.exp(-ce) ** 2 + 0.25) * valid
    expected = (weights * ce).sum() / valid.sum()  # "token": valid positions
    assert diagnostics["normalization"] == "token"
    assert loss.item() == pytest.approx(expected.item(), rel=1e-9)
    assert resolve_hparams("squared-q", 8) == {"alpha": 0.25}
    with pytest.raises(ValueError, match="takes \\['alpha'\\]"):
        resolve_hparams("squared-q", 8, k=2)

    config = {"main_target": "t", "train": {"block_size": 8, "depth": 1, "epochs": 2},
              "experiments": {"main": {"objectives": ["sq"]}}}
    assert [v.id for v in experiments(config)["main"].variants] == ["squared-q-alpha0.25-d1-b8-e2"]
    assert ObjectiveSpec("sq").resolved(8).hparams == {"alpha": 0.25}
    assert not ObjectiveSpec("sq").needs_target_logits
    assert objective_label("squared-q") == "Squared q"


def test_registry_views_agree_with_the_records():
    from dpace.training import objectives
    from dpace.training.objectives import OBJECTIVE_ALIASES

    assert OBJECTIVES == tuple(REGISTRY) == tuple(objectives.WEIGHTS)  # every record has its weight function
    assert NEEDS_TARGET_LOGITS == {name for name, record in REGISTRY.items() if record.needs_target_logits}
    assert {name: canonical_objective(alias) for alias, name in OBJECTIVE_ALIASES.items()} == {
        name: name for name in OBJECTIVE_ALIASES.values()}
    assert all(DEFAULT_NORMALIZATION[name] == record.normalization for name, record in REGISTRY.items())


def test_accuracy_of_bf16_logits_takes_the_first_of_tied_maxima():
    """bf16 logits tie often; a position counts as correct only where z* is the first maximum (argmax's rule
    in bf16 and float32 alike), so the float32 argmax the terms use changes no accuracy or emitted length."""
    generator = torch.Generator().manual_seed(0)
    batch, blocks, block_size, vocab = 2, 3, 8, 64
    draft_logits = torch.randn(batch, blocks, block_size, vocab, generator=generator).to(torch.bfloat16)
    target_ids = torch.randint(0, vocab, (batch, blocks, block_size), generator=generator)
    valid = torch.ones(batch, blocks, block_size, dtype=torch.bool)
    valid[..., 0] = False
    # Half the positions: z* ties with an earlier token for the maximum (not a hit); the rest: z* ties with a
    # later token (a hit).
    top = draft_logits.max(dim=-1).values + 1
    earlier = (target_ids - 1).clamp(min=0)
    later = (target_ids + 1).clamp(max=vocab - 1)
    tie_before = torch.rand(target_ids.shape, generator=generator) < 0.5
    tie_before &= target_ids > 0
    other = torch.where(tie_before, earlier, later)
    draft_logits.scatter_(-1, target_ids.unsqueeze(-1), top.unsqueeze(-1))
    draft_logits.scatter_(-1, other.unsqueeze(-1), top.unsqueeze(-1))
    hits = (draft_logits.argmax(dim=-1) == target_ids) & valid  # PyTorch's own bf16 argmax
    assert 0 < int(hits.sum()) < int(valid.sum())  # both kinds of tie are present
    terms = objective_terms("dflash", draft_logits=draft_logits, target_ids=target_ids, valid=valid,
                            **resolve_hparams("dflash", block_size))
    assert float(terms.correct_count) == float(hits.sum())
    accepted = (torch.cumprod((hits | ~valid).long(), dim=-1) * valid).sum(dim=-1)
    assert float(terms.emitted_length_sum) == float((1 + accepted).sum())
