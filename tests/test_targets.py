"""How ``load_target`` runs a target on the CPU: grouped key/value heads without copies, same answers."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from dpace.targets import GROUPED_KV_SDPA, grouped_kv_sdpa, load_target, model_location


class _Attention(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _padded_causal_mask(batch: int, queries: int, keys: int) -> torch.Tensor:
    """Left padding (row r starts at key r) plus the causal rule of the last ``queries`` positions."""
    key_position = torch.arange(keys)
    causal = key_position[None, :] <= (keys - queries + torch.arange(queries))[:, None]
    not_padding = key_position[None, :] >= torch.arange(batch)[:, None]
    return causal[None, None] & not_padding[:, None, None, :]


def test_grouped_kv_sdpa_attends_as_if_every_query_head_had_its_own_copy_of_the_keys():
    generator = torch.Generator().manual_seed(0)
    batch, kv_heads, groups, keys, dim = 3, 2, 3, 11, 8
    for queries in (1, 4, keys):  # a decode step, a verification block, a prefill
        query = torch.randn(batch, kv_heads * groups, queries, dim, generator=generator)
        key = torch.randn(batch, kv_heads, keys, dim, generator=generator)
        value = torch.randn(batch, kv_heads, keys, dim, generator=generator)
        mask = _padded_causal_mask(batch, queries, keys)
        ours, _ = grouped_kv_sdpa(_Attention(groups), query, key, value, mask, scaling=dim ** -0.5)

        # Query head h reads key/value head h // groups (transformers' repeat_kv order).
        copied_key, copied_value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        scores = (query @ copied_key.transpose(-1, -2)) * dim ** -0.5
        expected = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ copied_value
        assert ours.shape == (batch, queries, kv_heads * groups, dim)
        sees_a_key = mask.any(-1)[:, 0]  # a padding query that sees no key has no defined output
        torch.testing.assert_close(ours[sees_a_key], expected.transpose(1, 2)[sees_a_key], rtol=1e-5, atol=1e-5)


def test_cpu_targets_attend_without_kv_copies_and_logits_are_those_of_plain_sdpa(tiny_target_json):
    ours, _ = load_target(tiny_target_json)
    assert ours.config._attn_implementation == GROUPED_KV_SDPA
    path, trust = model_location(tiny_target_json)
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    # A left-padded batch, as generation sends it; the last position alone (logits_to_keep=1) is the
    # strided slice the LM head's hook makes contiguous.
    input_ids = torch.randint(3, ours.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
    attention_mask = (torch.arange(9)[None, :] >= torch.tensor([[0], [2], [5]])).long()
    with torch.no_grad():
        for keep in (0, 1):
            got = ours(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits
            want = plain(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits
            real = attention_mask[:, -got.shape[1]:].bool()
            torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
