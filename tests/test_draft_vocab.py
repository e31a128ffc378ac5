"""The pruned draft vocabulary (``train.draft_vocab_size``): which tokens it keeps, that training scores
only them, that a checkpoint carries them, and that decoding proposes nothing else and stays lossless."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpace.training.draft_vocab import DraftVocabHead, FullVocabDraftHead, select_draft_vocab


def test_the_most_frequent_response_tokens_are_kept_ties_by_smaller_id():
    responses = torch.tensor([7, 7, 7, 3, 3, 9, 9, 5, 1])  # counts: 7:3, 3:2, 9:2, 5:1, 1:1
    assert select_draft_vocab(responses, 1, 12) == [7]
    assert select_draft_vocab(responses, 2, 12) == [3, 7]
    assert select_draft_vocab(responses, 3, 12) == [3, 7, 9]
    assert select_draft_vocab(responses, 4, 12) == [1, 3, 7, 9]  # 1 and 5 tie: the smaller id
    # never a token the responses do not hold, however large the size
    assert select_draft_vocab(responses, 100, 12) == [1, 3, 5, 7, 9]
    with pytest.raises(ValueError, match="size must be >= 1"):
        select_draft_vocab(responses, 0, 12)


def test_heads_give_the_targets_logits_on_the_draft_vocabulary_and_nothing_elsewhere():
    torch.manual_seed(0)
    target_head = nn.Linear(8, 20, bias=False)
    vocab = [2, 5, 11, 19]
    hidden = torch.randn(3, 4, 8)
    full = target_head(hidden)
    pruned = DraftVocabHead(target_head, vocab)
    torch.testing.assert_close(pruned(hidden), full[..., vocab])
    index, inside = pruned.draft_index(torch.tensor([5, 6, 19, 2]))
    assert index[inside].tolist() == [1, 3, 0] and inside.tolist() == [True, False, True, True]

    scattered = FullVocabDraftHead(target_head, vocab)(hidden)
    torch.testing.assert_close(scattered[..., vocab], full[..., vocab])
    outside = [i for i in range(20) if i not in vocab]
    assert torch.isneginf(scattered[..., outside]).all()
    assert set(scattered.argmax(-1).flatten().tolist()) <= set(vocab)
    with pytest.raises(ValueError, match="distinct"):
        DraftVocabHead(target_head, [1, 1])
    with pytest.raises(ValueError, match="0..19"):
        DraftVocabHead(target_head, [20])


def test_objective_scores_the_draft_vocabulary_and_leaves_out_tokens_outside_it():
    from dpace.training.online_model import ObjectiveDFlashModel
    from dpace.training.specforge_run import ObjectiveSpec
    from tests.test_online_model import MASK_TOKEN, VOCAB, batch, run, tiny_modules

    def wrapper(draft_vocab):
        draft, lm_head, embed = tiny_modules()
        return ObjectiveDFlashModel(draft, lm_head, embed, mask_token_id=MASK_TOKEN, block_size=4, num_anchors=5,
                                    objective=ObjectiveSpec("dflash", {"gamma": 2.0}), draft_vocab=draft_vocab)

    inputs = batch()
    whole = run(wrapper(None), inputs)
    # A draft vocabulary of every token changes nothing: same loss, accuracy and gradients.
    every = run(wrapper(list(range(VOCAB))), inputs)
    torch.testing.assert_close(every[0], whole[0])
    for ours, theirs in zip(every[3], whole[3], strict=True):
        torch.testing.assert_close(ours, theirs)

    # With the odd ids only: the objective sees the odd columns of the same logits, each target as
    # its index among them, and positions whose target is even as unsupervised.
    import dpace.training.online_model as online_model

    seen = []  # the first call of each run (the backward pass recomputes the chunk: a second call)
    real_terms = online_model.objective_terms

    def spy(objective, *, draft_logits, target_ids, valid, **kwargs):
        seen.append((draft_logits.detach(), target_ids, valid))
        return real_terms(objective, draft_logits=draft_logits, target_ids=target_ids, valid=valid, **kwargs)

    online_model.objective_terms = spy
    try:
        run(wrapper(None), inputs)
        first_run = seen[0]
        seen.clear()
        run(wrapper(list(range(1, VOCAB, 2))), inputs)
    finally:
        online_model.objective_terms = real_terms
    (full_logits, full_ids, full_valid), (odd_logits, odd_ids, odd_valid) = first_run, seen[0]
    torch.testing.assert_close(odd_logits, full_logits[..., 1::2])
    assert torch.equal(odd_valid, full_valid & (full_ids % 2 == 1))
    assert torch.equal(odd_ids[odd_valid], full_ids[odd_valid] // 2)
    assert 0 < odd_valid.sum() < full_valid.sum()


def test_trained_checkpoint_carries_its_draft_vocabulary(tmp_path, tiny_target_json):
    from dpace.features import FeatureSettings, compute_features, load_features
    from dpace.io import atomic_write_jsonl
    from dpace.training.drafter import draft_vocab_of, load_drafter
    from dpace.training.loop import train_drafter
    from tests.test_training import CONVERSATIONS, small_config

    atomic_write_jsonl(tmp_path / "conversations.jsonl", CONVERSATIONS)
    compute_features(tiny_target_json, tmp_path / "conversations.jsonl", tmp_path / "features",
                     FeatureSettings(target_layer_ids=[1, 3], max_seq_length=256))
    features = load_features(tmp_path / "features")
    responses = features.input_ids[features.loss_mask > 0]
    summary = train_drafter(small_config(draft_vocab_size=6, epochs=1), target_json=tiny_target_json,
                            features_dir=tmp_path / "features", out_dir=tmp_path / "run", scratch_dir=tmp_path / "s")
    saved = load_drafter(tmp_path / "run" / "epoch-1").config
    vocab = draft_vocab_of(saved)
    assert vocab == select_draft_vocab(responses, 6, saved.vocab_size)
    counts = torch.bincount(responses.long())
    assert min(counts[vocab]) >= max(c for i, c in enumerate(counts.tolist()) if i not in vocab)
    assert summary["config"]["draft_vocab_size"] == 6
    with pytest.raises(ValueError, match="draft_vocab_size -1: -1 is less than the minimum of 0"):
        train_drafter(small_config(draft_vocab_size=-1), target_json=tiny_target_json,
                      features_dir=tmp_path / "features", out_dir=tmp_path / "bad", scratch_dir=tmp_path / "s2")


def test_decoding_proposes_only_draft_vocabulary_tokens_and_stays_lossless(monkeypatch):
    import dpace.evaluation.decoding as decoding
    from dpace.training.drafter import drafter_config
    from tests.test_decoding import BLOCK, MASK, STOPS, greedy, tiny_drafter, tiny_target

    target = tiny_target()
    torch.set_num_threads(1)
    prompt = [5, 17, 33, 60, 81, 9, 44]
    reference = greedy(target, prompt, n=30, stops=STOPS).new_token_ids
    # The draft vocabulary: all but one of the tokens the target answers with, plus unrelated ones.
    left_out = reference[2]
    vocab = sorted((set(reference) - {left_out}) | {3, 4, 100})
    drafter = tiny_drafter(target)
    config = drafter_config(target.config, depth=1, block_size=BLOCK, target_layer_ids=[1, 2], mask_token_id=MASK,
                            draft_vocab=vocab)
    drafter.config.draft_vocab = config.draft_vocab
    proposed = []
    real_match = decoding._hard_match

    def spy(draft_tokens, picks):
        proposed.extend(draft_tokens.flatten().tolist())
        return real_match(draft_tokens, picks)

    monkeypatch.setattr(decoding, "_hard_match", spy)
    out = decoding.speculative_generate(drafter, target, prompt, max_new_tokens=30, stop_token_ids=STOPS)
    assert out.new_token_ids == reference
    assert proposed and set(proposed) <= set(vocab)
    assert left_out not in proposed and left_out in out.new_token_ids
    # the target's token outside the draft vocabulary has draft probability exactly 0
    assert any(q == 0.0 for block in out.blocks for q in block.q)


def test_engines_that_score_the_whole_vocabulary_refuse_a_draft_vocabulary(tmp_path):
    import json

    from dpace.evaluation.sglang_backend import drafter_block_size

    (tmp_path / "config.json").write_text(json.dumps({"block_size": 8, "draft_vocab": [1, 2, 3]}))
    with pytest.raises(ValueError, match="eval.backend local"):
        drafter_block_size(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"block_size": 8}))
    assert drafter_block_size(tmp_path) == 8
