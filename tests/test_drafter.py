"""Drafters: built to match their target, saved by SpecForge's class, loaded by dflash's, refused when wrong."""

import json

import pytest
import torch
from transformers import LlamaConfig

from dpace.features import default_target_layer_ids
from dpace.training.drafter import (
    build_drafter,
    check_drafter_matches_target,
    drafter_config,
    load_drafter,
    save_drafter,
)

TARGET = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                     num_attention_heads=4, num_key_value_heads=2)


def test_default_layers_follow_specforge():
    from specforge.modeling.draft.dflash import build_target_layer_ids

    for layers, features in [(36, 3), (32, 3), (30, 3), (6, 2), (28, 1)]:
        assert default_target_layer_ids(layers, features) == build_target_layer_ids(layers, features)


def test_specforge_checkpoint_loads_into_dflash_with_identical_weights(tmp_path):
    config = drafter_config(TARGET, depth=2, block_size=4, target_layer_ids=[1, 3, 4], mask_token_id=95)
    trained = build_drafter(config, seed=1)
    save_drafter(trained, tmp_path / "drafter")
    loaded = load_drafter(tmp_path / "drafter")
    assert type(loaded).__module__ == "dflash.model"
    assert loaded.block_size == 4 and loaded.mask_token_id == 95 and loaded.target_layer_ids == [1, 3, 4]
    ours, theirs = trained.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def test_config_rejects_impossible_drafters():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        drafter_config(TARGET, depth=0, block_size=4, target_layer_ids=[1], mask_token_id=0)
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        drafter_config(TARGET, depth=1, block_size=1, target_layer_ids=[1], mask_token_id=0)
    with pytest.raises(ValueError, match=r"target_layer_ids \[6\] are outside the target's layers 0..5"):
        drafter_config(TARGET, depth=1, block_size=4, target_layer_ids=[1, 6], mask_token_id=0)


def test_drafter_of_another_target_is_refused():
    config = drafter_config(TARGET, depth=1, block_size=4, target_layer_ids=[1], mask_token_id=0)
    wider = LlamaConfig(**{**TARGET.to_dict(), "hidden_size": 64})
    with pytest.raises(ValueError, match="drafter hidden_size=32 does not match the target's hidden_size=64"):
        check_drafter_matches_target(config, wider)
    other_vocab = LlamaConfig(**{**TARGET.to_dict(), "vocab_size": 100})
    with pytest.raises(ValueError, match="drafter vocab_size=96 does not match the target's vocab_size=100"):
        check_drafter_matches_target(config, other_vocab)


def test_folder_that_is_not_a_drafter_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not a DFlash drafter checkpoint: no config.json"):
        load_drafter(tmp_path)
    TARGET.save_pretrained(tmp_path)  # a plain Llama config, no dflash_config
    with pytest.raises(ValueError, match=r"dflash_config lacks \['target_layer_ids', 'block_size', 'mask_token_id'\]"):
        load_drafter(tmp_path)
    assert "dflash_config" not in json.loads((tmp_path / "config.json").read_text())


def test_drafter_init_from_target_copies_its_top_layers_and_passes_the_deepest_feature():
    from transformers import LlamaForCausalLM

    from dpace.training.drafter import initialise_from_target

    torch.manual_seed(0)
    target = LlamaForCausalLM(TARGET)
    drafter = build_drafter(drafter_config(TARGET, depth=2, block_size=4, target_layer_ids=[1, 3, 4], mask_token_id=95))
    untouched_q_norm = drafter.layers[0].self_attn.q_norm.weight.clone()
    initialise_from_target(drafter, target)
    for ours, theirs in zip(drafter.layers, target.model.layers[-2:], strict=True):
        for name, tensor in theirs.state_dict().items():
            assert torch.equal(ours.state_dict()[name], tensor), name
    assert torch.equal(drafter.norm.weight, target.model.norm.weight)
    assert torch.equal(drafter.layers[0].self_attn.q_norm.weight, untouched_q_norm)  # Llama has no q/k norm
    features = torch.randn(3, 3 * TARGET.hidden_size)
    torch.testing.assert_close(drafter.fc(features), features[:, -TARGET.hidden_size:])


def test_a_sliding_window_drafter_sees_the_same_context_in_training_and_in_decoding(tmp_path):
    """``sliding_window`` (a named deviation, benchmarks/learning_curve.py --sliding-window): SpecForge's
    training mask and the dflash decoder's mask must give a block the same last-W context positions."""
    from specforge.algorithms.common.dflash_family_model import create_dflash_sdpa_mask

    window, block_size, context = 6, 4, 12
    config = drafter_config(TARGET, depth=1, block_size=block_size, target_layer_ids=[1, 3, 4], mask_token_id=95,
                            sliding_window=window)
    with pytest.raises(ValueError, match="sliding_window"):
        drafter_config(TARGET, depth=1, block_size=4, target_layer_ids=[1], mask_token_id=95, sliding_window=-1)
    trained = build_drafter(config, seed=3).eval()
    save_drafter(trained, tmp_path / "drafter")
    loaded = load_drafter(tmp_path / "drafter")
    full = build_drafter(drafter_config(TARGET, depth=1, block_size=block_size, target_layer_ids=[1, 3, 4],
                                        mask_token_id=95), seed=3).eval()
    full.load_state_dict(trained.state_dict())

    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, context + 1, 3 * TARGET.hidden_size, generator=generator)
    noise = torch.randn(1, block_size, TARGET.hidden_size, generator=generator)
    positions = torch.arange(context + 1 + block_size)[None]
    positions[0, context + 1:] = torch.arange(context, context + block_size)  # the block at anchor = context
    anchor, keep = torch.tensor([[context]]), torch.tensor([[True]])
    with torch.no_grad():
        trained_mask = create_dflash_sdpa_mask(anchor, keep, context + 1, block_size, "cpu", sliding_window=window)
        training_side = trained(position_ids=positions, noise_embedding=noise, target_hidden=hidden,
                                attention_mask={"full_attention": trained_mask, "sliding_attention": trained_mask})
        decoding_side = loaded(position_ids=torch.arange(context + block_size)[None], noise_embedding=noise,
                               target_hidden=hidden[:, :context])
        full_mask = create_dflash_sdpa_mask(anchor, keep, context + 1, block_size, "cpu")
        full_attention = full(position_ids=positions, noise_embedding=noise, target_hidden=hidden,
                              attention_mask=full_mask)
    assert loaded.layers[0].self_attn.sliding_window == window
    torch.testing.assert_close(training_side[0, -block_size:], decoding_side[0, -block_size:], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(training_side, full_attention, atol=1e-3)  # the window does hide context


def test_a_drafter_trained_on_scaled_features_decodes_the_targets_raw_ones(tmp_path):
    """``train.feature_scaling: rms``: training feeds fc the features divided by a scale; the checkpoint, with
    the scale folded into fc, is loaded by dflash's class and fed the target's raw states, and must give the
    block exactly what the training drafter gave it."""
    from specforge.algorithms.common.dflash_family_model import create_dflash_sdpa_mask

    from dpace.training.drafter import with_raw_feature_input

    block_size, context, width = 4, 10, 3 * TARGET.hidden_size
    trained = build_drafter(drafter_config(TARGET, depth=1, block_size=block_size, target_layer_ids=[1, 3, 4],
                                           mask_token_id=95), seed=5).eval()
    generator = torch.Generator().manual_seed(1)
    scale = torch.rand(width, generator=generator) * 300 + 0.5  # a few dimensions hundreds of times the others
    raw = torch.randn(1, context + 1, width, generator=generator) * scale
    noise = torch.randn(1, block_size, TARGET.hidden_size, generator=generator)
    fc_before = trained.fc.weight.clone()
    save_drafter(with_raw_feature_input(trained, scale), tmp_path / "folded")
    save_drafter(trained, tmp_path / "unfolded")
    assert torch.equal(trained.fc.weight, fc_before)  # the copy is folded; training goes on with its own fc

    positions = torch.arange(context + 1 + block_size)[None]
    positions[0, context + 1:] = torch.arange(context, context + block_size)
    mask = create_dflash_sdpa_mask(torch.tensor([[context]]), torch.tensor([[True]]), context + 1, block_size, "cpu")
    with torch.no_grad():
        training_side = trained(position_ids=positions, noise_embedding=noise, target_hidden=raw / scale,
                                attention_mask=mask)[0, -block_size:]
        decode = lambda folder: load_drafter(folder)(  # noqa: E731
            position_ids=torch.arange(context + block_size)[None], noise_embedding=noise,
            target_hidden=raw[:, :context])[0, -block_size:]
        folded = decode(tmp_path / "folded")
        # What the block attends to: the context states fc and its norm make of the features.
        context_states = {name: (lambda d: d.hidden_norm(d.fc(raw)))(load_drafter(tmp_path / name))
                          for name in ("folded", "unfolded")}
        trained_context_states = trained.hidden_norm(trained.fc(raw / scale))
    torch.testing.assert_close(folded, training_side, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(context_states["folded"], trained_context_states, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(context_states["unfolded"], trained_context_states, atol=0.1)  # raw states, unfolded fc
    with pytest.raises(ValueError, match=r"feature_scale has shape \(95,\); fc takes 96 features"):
        with_raw_feature_input(trained, scale[:-1])
