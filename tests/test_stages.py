"""Target loading, response generation and feature caching on a tiny random target."""

import json

import pytest
import torch

from dpace.features import FeatureSettings, compute_features, load_features, tokenize_conversation
from dpace.io import atomic_write_jsonl, read_jsonl
from dpace.responses.generation import ResponseSettings, generate_responses
from dpace.targets import chat_prompt_ids, load_target, resolve_dtype, stop_token_ids

PROMPTS = [
    {"id": "p0", "prompt": "What is the capital of France?"},
    {"id": "p1", "prompt": "Write a haiku about the sea, please, with many words in it."},
    {"id": "p2", "prompt": "2+2?"},
]


def _greedy_one(model, ids, max_new_tokens, stops):
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=stops, pad_token_id=stops[0])
    new = out[0, len(ids):].tolist()
    cut = next((i for i, t in enumerate(new) if t in stops), len(new))
    return new[:cut]


def test_batched_generation_equals_one_at_a_time(tmp_path, tiny_target_json):
    prompts = tmp_path / "prompts.jsonl"
    atomic_write_jsonl(prompts, PROMPTS)
    out = tmp_path / "responses.jsonl"
    counts = generate_responses(tiny_target_json, prompts, out, ResponseSettings(max_new_tokens=12, batch_size=3))
    assert counts == {"prompts": 3, "resumed": 0, "generated": 3, "skipped_too_long": 0, "dtype": "float32"}
    rows = list(read_jsonl(out))
    assert [r["id"] for r in rows] == ["p0", "p1", "p2"]  # the prompts' order, whatever the batching
    model, tokenizer = load_target(tiny_target_json)
    stops = stop_token_ids(tokenizer)
    for prompt, row in zip(PROMPTS, rows, strict=True):
        ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": prompt["prompt"]}])
        greedy = _greedy_one(model, ids, 12, stops)
        expected = tokenizer.decode(greedy, skip_special_tokens=True)
        assert row["conversations"][0] == {"role": "user", "content": prompt["prompt"]}
        assert row["conversations"][1] == {"role": "assistant", "content": expected}
        # an answer that max_new_tokens cut (no stop token in its 12) is marked as such
        assert row.get("truncated", False) == (len(greedy) == 12)


def test_a_cut_answer_gets_no_end_token_a_finished_one_does(tiny_target_json):
    _, tokenizer = load_target(tiny_target_json)
    end = tokenizer.eos_token_id
    finished = {"id": "f", "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
    cut = {**finished, "truncated": True}
    answer = tokenizer("hello there", add_special_tokens=False)["input_ids"]
    finished_ids, finished_mask = tokenize_conversation(tokenizer, finished, end)
    cut_ids, cut_mask = tokenize_conversation(tokenizer, cut, end)
    assert finished_ids[-len(answer) - 1:] == answer + [end] and sum(finished_mask) == len(answer) + 1
    assert cut_ids == finished_ids[:-1] and cut_ids[-len(answer):] == answer and sum(cut_mask) == len(answer)


def _interrupted_generation(tmp_path, target_json, monkeypatch, **settings):
    """Generate until the second answer is written, then fail like a killed job; the scratch path."""
    import dpace.responses.generation as generation

    class Killed(generation.JsonlAppender):
        def write(self, row):
            if row["id"] != PROMPTS[1]["id"]:
                raise KeyboardInterrupt
            super().write(row)

    prompts = tmp_path / "prompts.jsonl"
    atomic_write_jsonl(prompts, PROMPTS)
    scratch = tmp_path / "scratch.partial"
    with monkeypatch.context() as patch:
        patch.setattr(generation, "JsonlAppender", Killed)
        with pytest.raises(KeyboardInterrupt):
            generate_responses(target_json, prompts, tmp_path / "responses.jsonl", ResponseSettings(batch_size=1, **settings),
                               scratch_path=scratch)
    assert [row["id"] for row in read_jsonl(scratch)] == [PROMPTS[1]["id"]]
    return prompts, scratch


def test_generation_resumes_from_scratch_file(tmp_path, tiny_target_json, monkeypatch):
    prompts, scratch = _interrupted_generation(tmp_path, tiny_target_json, monkeypatch, max_new_tokens=4)
    finished = {"id": "p1", "conversations": [{"role": "user", "content": PROMPTS[1]["prompt"]},
                                              {"role": "assistant", "content": "kept from before"}]}
    # The finished record (marked, to see it kept), then a torn line from a killed writer.
    scratch.write_text(json.dumps(finished) + "\n" + '{"id": "p2", "conv')
    out = tmp_path / "responses.jsonl"
    counts = generate_responses(tiny_target_json, prompts, out, ResponseSettings(max_new_tokens=4), scratch_path=scratch)
    assert counts["resumed"] == 1 and counts["generated"] == 2
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert rows["p1"] == finished
    assert set(rows) == {"p0", "p1", "p2"}
    assert not scratch.exists() and not list(tmp_path.glob("scratch.partial*"))


def test_an_answer_to_a_reworded_prompt_is_not_reused(tmp_path, tiny_target_json, monkeypatch):
    """The scratch file holds an answer to p1's former text: p1 is answered again, and the answer kept
    for an unchanged prompt still is."""
    prompts, scratch = _interrupted_generation(tmp_path, tiny_target_json, monkeypatch, max_new_tokens=4)
    kept = {"id": "p0", "conversations": [{"role": "user", "content": PROMPTS[0]["prompt"]},
                                          {"role": "assistant", "content": "kept from before"}]}
    stale = {"id": "p1", "conversations": [{"role": "user", "content": PROMPTS[1]["prompt"]},
                                           {"role": "assistant", "content": "an answer to the old text"}]}
    scratch.write_text(json.dumps(kept) + "\n" + json.dumps(stale) + "\n")
    reworded = [dict(row, prompt="Name three rivers.") if row["id"] == "p1" else row for row in PROMPTS]
    atomic_write_jsonl(prompts, reworded)
    counts = generate_responses(tiny_target_json, prompts, tmp_path / "responses.jsonl", ResponseSettings(max_new_tokens=4),
                                scratch_path=scratch)
    assert counts["resumed"] == 1 and counts["generated"] == 2
    rows = {r["id"]: r for r in read_jsonl(tmp_path / "responses.jsonl")}
    assert rows["p0"] == kept
    assert rows["p1"]["conversations"][0]["content"] == "Name three rivers."
    assert rows["p1"]["conversations"][1]["content"] != "an answer to the old text"


def test_generation_of_other_settings_starts_over(tmp_path, tiny_target_json, monkeypatch):
    """A responses job that reruns because a setting changed must not keep answers of the old one."""
    prompts, scratch = _interrupted_generation(tmp_path, tiny_target_json, monkeypatch, max_new_tokens=4)
    (scratch_row,) = read_jsonl(scratch)
    out = tmp_path / "responses.jsonl"
    counts = generate_responses(tiny_target_json, prompts, out, ResponseSettings(max_new_tokens=6), scratch_path=scratch)
    assert counts["resumed"] == 0 and counts["generated"] == 3
    fresh = tmp_path / "fresh.jsonl"
    generate_responses(tiny_target_json, prompts, fresh, ResponseSettings(max_new_tokens=6))
    assert list(read_jsonl(out)) == list(read_jsonl(fresh))
    assert scratch_row != next(r for r in read_jsonl(out) if r["id"] == scratch_row["id"])


def test_too_long_prompts_are_skipped_and_counted(tmp_path, tiny_target_json):
    prompts = tmp_path / "prompts.jsonl"
    atomic_write_jsonl(prompts, PROMPTS)
    out = tmp_path / "responses.jsonl"
    counts = generate_responses(tiny_target_json, prompts, out, ResponseSettings(max_new_tokens=2, max_prompt_tokens=36))
    assert counts["skipped_too_long"] >= 1
    assert len(list(read_jsonl(out))) == 3 - counts["skipped_too_long"]


def test_features_mask_the_assistant_tokens_and_match_a_direct_forward(tmp_path, tiny_target_json):
    model, tokenizer = load_target(tiny_target_json)
    conversations = [
        {"id": "a", "conversations": [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi! how are you"}]},
        {"id": "b", "conversations": [{"role": "user", "content": "a much longer question " * 5}, {"role": "assistant", "content": "ok"}]},
    ]
    path = tmp_path / "conv.jsonl"
    atomic_write_jsonl(path, conversations)
    index = compute_features(tiny_target_json, path, tmp_path / "features",
                             FeatureSettings(target_layer_ids=[1, 3], max_seq_length=256, batch_size=2))
    assert index["num_sequences"] == 2 and index["layer_ids"] == [1, 3]
    features = load_features(tmp_path / "features")
    for i, conversation in enumerate(conversations):
        item = features.sequence(i)
        response_ids = tokenizer(conversation["conversations"][1]["content"], add_special_tokens=False)["input_ids"]
        mask = item["loss_mask"]
        assert int(mask.sum()) == len(response_ids) + 1  # the response and its end token
        assert mask[-len(response_ids) - 1:].eq(1).all() and mask[: -len(response_ids) - 1].eq(0).all()
        assert item["input_ids"][-len(response_ids) - 1 : -1].tolist() == response_ids
        with torch.no_grad():
            out = model.model(item["input_ids"][None], output_hidden_states=True)
        direct = torch.cat([out.hidden_states[2], out.hidden_states[4]], dim=-1)[0]
        torch.testing.assert_close(item["hidden"].float(), direct, rtol=2e-2, atol=2e-2)  # bf16 storage
        torch.testing.assert_close(item["last_hidden"].float(), out.last_hidden_state[0], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_features_batched_by_length_keep_the_conversations_order(tmp_path, tiny_target_json, monkeypatch, dtype):
    """Batches group similar lengths; every stored sequence is still its own conversation's forward."""
    import dpace.features as features_module

    model, tokenizer = load_target(tiny_target_json)
    # longest first, so that length order is the reverse of the file's order
    conversations = [
        {"id": str(i), "conversations": [{"role": "user", "content": "question " * (12 - 2 * i)},
                                         {"role": "assistant", "content": "answer " * (1 + i)}]}
        for i in range(7)
    ]
    path = tmp_path / "conv.jsonl"
    atomic_write_jsonl(path, conversations)
    loaded, widths = [], []
    original_load, original_forward = features_module.load_target, features_module.target_hidden_states
    monkeypatch.setattr(features_module, "load_target", lambda *a, **k: loaded.append(k["dtype"]) or original_load(*a, **k))
    monkeypatch.setattr(features_module, "target_hidden_states",
                        lambda target, ids, *a: widths.append(ids.shape[1]) or original_forward(target, ids, *a))
    compute_features(tiny_target_json, path, tmp_path / "f",
                     FeatureSettings(target_layer_ids=[1, 3], max_seq_length=256, batch_size=2, dtype=dtype),
                     shard_tokens=40)
    assert loaded == [getattr(torch, dtype)]
    lengths = [len(tokenize_conversation(tokenizer, c, tokenizer.eos_token_id)[0]) for c in conversations]
    assert widths == [max(pair) for pair in zip(*[iter(sorted(lengths) + [0])] * 2, strict=True)]
    features = load_features(tmp_path / "f")
    assert len(list((tmp_path / "f").glob("shard-*"))) > 1
    tolerance = 2e-2 if dtype == "float32" else 1e-1
    for i, conversation in enumerate(conversations):
        item = features.sequence(i)
        assert item["input_ids"].tolist() == tokenize_conversation(tokenizer, conversation, tokenizer.eos_token_id)[0]
        with torch.no_grad():
            out = model.model(item["input_ids"][None], output_hidden_states=True)
        direct = torch.cat([out.hidden_states[2], out.hidden_states[4]], dim=-1)[0]
        torch.testing.assert_close(item["hidden"].float(), direct, rtol=tolerance, atol=tolerance)


def test_long_conversations_are_truncated_and_counted_not_dropped(tmp_path, tiny_target_json):
    _, tokenizer = load_target(tiny_target_json)
    short = {"id": "s", "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    long = {"id": "l", "conversations": [{"role": "user", "content": "count"}, {"role": "assistant", "content": "one two " * 200}]}
    no_room = {"id": "p", "conversations": [{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": "ok"}]}
    path = tmp_path / "conv.jsonl"
    atomic_write_jsonl(path, [short, long, no_room])
    index = compute_features(tiny_target_json, path, tmp_path / "f",
                             FeatureSettings(target_layer_ids=[1], max_seq_length=64, mode="online"))
    assert index["num_sequences"] == 2 and index["truncated"] == 2 and index["skipped_too_few_loss_tokens"] == 1
    features = load_features(tmp_path / "f")
    full_ids, full_mask = tokenize_conversation(tokenizer, long, tokenizer.eos_token_id)
    kept = features.sequence(1)
    assert len(full_ids) > 64 and kept["input_ids"].tolist() == full_ids[:64]  # the head, as SpecForge keeps
    assert kept["loss_mask"].tolist() == full_mask[:64]


def test_online_features_store_tokens_only(tmp_path, tiny_target_json):
    path = tmp_path / "conv.jsonl"
    atomic_write_jsonl(path, [{"id": "a", "conversations": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}])
    compute_features(tiny_target_json, path, tmp_path / "f",
                     FeatureSettings(target_layer_ids=[1], max_seq_length=256, mode="online"))
    features = load_features(tmp_path / "f")
    assert features.hidden is None and features.last_hidden is None and len(features) == 1


def test_features_reject_layers_outside_the_target(tmp_path, tiny_target_json):
    path = tmp_path / "conv.jsonl"
    atomic_write_jsonl(path, [{"id": "a", "conversations": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}])
    with pytest.raises(ValueError, match=r"target_layer_ids \[9\] are outside the target's 6 layers"):
        compute_features(tiny_target_json, path, tmp_path / "f", FeatureSettings(target_layer_ids=[1, 9], max_seq_length=256))


def test_conversation_without_assistant_turn_is_an_error(tiny_target_json):
    _, tokenizer = load_target(tiny_target_json)
    with pytest.raises(ValueError, match="has no user and assistant turn"):
        tokenize_conversation(tokenizer, {"id": "z", "conversations": [{"role": "user", "content": "x"}]}, 2)


def test_target_without_chat_template_is_rejected(tmp_path, tiny_target_json):
    import shutil

    copy = tmp_path / "target"
    shutil.copytree(tiny_target_json.parent, copy)
    config = copy / "model" / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data.pop("chat_template", None)
    config.write_text(json.dumps(data))
    (copy / "model" / "chat_template.jinja").unlink(missing_ok=True)
    # prepared that way (its record's checksums are of the folder as it now is), not damaged afterwards
    from dpace.io import folder_checksums

    record = json.loads((copy / "target.json").read_text())
    (copy / "target.json").write_text(json.dumps({**record, "checksums": folder_checksums(copy / "model")}))
    with pytest.raises(ValueError, match="no chat template"):
        load_target(copy / "target.json")


def test_bf16_generation_is_the_bf16_targets_greedy_answer(tmp_path, tiny_target_json, monkeypatch):
    import dpace.responses.generation

    answered_in = []

    def recording_load_target(*args, **kwargs):  # which precision the answering model really has
        model, tokenizer = load_target(*args, **kwargs)
        answered_in.append(next(model.parameters()).dtype)
        return model, tokenizer

    monkeypatch.setattr(dpace.responses.generation, "load_target", recording_load_target)
    prompts = tmp_path / "prompts.jsonl"
    atomic_write_jsonl(prompts, PROMPTS)
    out = tmp_path / "responses.jsonl"
    generate_responses(tiny_target_json, prompts, out, ResponseSettings(max_new_tokens=12, batch_size=1, dtype="bfloat16"))
    assert answered_in == [torch.bfloat16]
    model, tokenizer = load_target(tiny_target_json, dtype=torch.bfloat16)
    stops = stop_token_ids(tokenizer)
    for prompt, row in zip(PROMPTS, read_jsonl(out), strict=True):
        ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": prompt["prompt"]}])
        expected = tokenizer.decode(_greedy_one(model, ids, 12, stops), skip_special_tokens=True)
        assert row["conversations"][1] == {"role": "assistant", "content": expected}
    with pytest.raises(ValueError, match=r"unknown generation dtype 'float16'; valid: float32, bfloat16"):
        generate_responses(tiny_target_json, prompts, tmp_path / "x.jsonl", ResponseSettings(dtype="float16"))


@pytest.mark.parametrize(("amx", "avx512_bf16", "expected"),
                         [(True, False, "bfloat16"), (False, True, "bfloat16"), (False, False, "float32")])
def test_auto_dtype_is_bf16_only_where_the_cpu_computes_it_natively(tmp_path, tiny_target_json, monkeypatch, amx,
                                                                    avx512_bf16, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert resolve_dtype("auto") == expected
    assert resolve_dtype("auto", "cuda:0") == "bfloat16"
    assert (resolve_dtype("float32", "cuda"), resolve_dtype("bfloat16")) == ("float32", "bfloat16")
    # Both stages run in the resolved precision and say which in their outputs.
    prompts, answers = tmp_path / "prompts.jsonl", tmp_path / "answers.jsonl"
    atomic_write_jsonl(prompts, PROMPTS[:2])
    assert generate_responses(tiny_target_json, prompts, answers, ResponseSettings(max_new_tokens=6, dtype="auto"))["dtype"] == expected
    index = compute_features(tiny_target_json, answers, tmp_path / "f",
                             FeatureSettings(target_layer_ids=[1, 3], max_seq_length=256, dtype="auto"))
    assert json.loads((tmp_path / "f" / "index.json").read_text())["capture_dtype"] == index["capture_dtype"] == expected


def test_random_target_takes_a_saved_tokenizer_folder_without_the_gguf_package(tmp_path, monkeypatch):
    import dpace.targets as targets

    folder = targets.save_embedded_tokenizer(tmp_path / "tokenizer")
    assert sum(f.stat().st_size for f in folder.iterdir()) < 10_000_000  # carried to a GPU machine
    reference = targets.embedded_tokenizer()
    monkeypatch.setattr(targets, "embedded_tokenizer", lambda: pytest.fail("the GGUF tokenizer was loaded"))
    spec = {"source": "random", "num_layers": 2, "hidden_size": 32, "intermediate_size": 64, "tokenizer": str(folder)}
    target_json = targets.prepare_target(spec, tmp_path / "target")
    _, tokenizer = load_target(target_json)
    messages = [{"role": "user", "content": "Hello there, how are you?"}]
    assert chat_prompt_ids(tokenizer, messages) == chat_prompt_ids(reference, messages)


def _feature_set(lengths, first_token, layer_ids=(1,), with_hidden=True):
    from dpace.features import FeatureSet

    total = sum(lengths)
    ids = torch.arange(first_token, first_token + total, dtype=torch.int32)
    return FeatureSet(
        input_ids=ids, loss_mask=(ids % 2).to(torch.uint8), offsets=torch.tensor([0, *lengths]).cumsum(0),
        hidden=ids[:, None].float().repeat(1, 2) if with_hidden else None, last_hidden=None, layer_ids=list(layer_ids),
    )


def test_concatenated_feature_sets_keep_every_sequence_whole_and_in_order():
    from dpace.features import FeatureSet

    first, second = _feature_set([3, 5], 0), _feature_set([2, 4, 1], 100)
    joined = FeatureSet.concatenate([first, second])
    assert len(joined) == 5 and joined.offsets.tolist() == [0, 3, 8, 10, 14, 15]
    expected = [first.sequence(0), first.sequence(1), *(second.sequence(i) for i in range(3))]
    for index, item in enumerate(expected):
        got = joined.sequence(index)
        assert got.keys() == item.keys()
        for key in item:
            assert torch.equal(got[key], item[key]), (index, key)
    back = joined.select(range(3, 5))
    assert back.offsets.tolist() == [0, 4, 5] and torch.equal(back.input_ids, second.input_ids[2:])


def test_feature_sets_from_different_captures_are_not_concatenated():
    from dpace.features import FeatureSet

    with pytest.raises(ValueError, match="different target layers"):
        FeatureSet.concatenate([_feature_set([2], 0), _feature_set([2], 9, layer_ids=(2,))])
    with pytest.raises(ValueError, match="no 'hidden'"):
        FeatureSet.concatenate([_feature_set([2], 0), _feature_set([2], 9, with_hidden=False)])
