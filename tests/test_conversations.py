"""Importing a data set that already holds the target's answers (z-lab/qwen3-4b-instruct-100k style)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dpace.config import ConfigError, check_config, training_data
from dpace.io import read_jsonl
from dpace.responses.conversations import dataset_name, import_conversations

QUESTION, ANSWER = "What is 2 + 2?", "2 + 2 = 4."
ROWS = [
    # z-lab's schema: OpenAI-style turns plus source / split / thinking / status columns
    {"conversations": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}],
     "source": "nemotron", "split": "chat", "thinking": False, "status": "success"},
    {"conversations": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}],
     "source": "nemotron", "split": "chat", "thinking": False, "status": "failed"},
    {"conversations": [{"role": "user", "content": "Prove it."}, {"role": "assistant", "content": "<think>..."}],
     "source": "openr1_math", "split": "stem", "thinking": True, "status": "success"},
    # ShareGPT-style turns, a system turn first, and a second exchange that is not imported
    {"id": "sg-7", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Name a colour."},
                                     {"from": "gpt", "value": "Blue."}, {"from": "human", "value": "Another?"},
                                     {"from": "gpt", "value": "Red."}]},
    {"conversations": [{"role": "user", "content": "No answer here."}]},
    {"conversations": [{"role": "user", "content": "Empty answer."}, {"role": "assistant", "content": "  "}]},
    {"messages": [{"role": "user", "content": "Messages column."}, {"role": "assistant", "content": "Works."}]},
]


@pytest.fixture()
def responses_file(tmp_path):
    path = tmp_path / "qwen3-4b-instruct-100k.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def test_usable_rows_become_generation_shaped_conversations_and_the_rest_is_counted(tmp_path, responses_file):
    out = tmp_path / "out.jsonl"
    counts = import_conversations(str(responses_file), out, num_conversations=100, seed=0)
    assert counts == {"written": 3, "usable": 3, "failed": 1, "thinking": 1, "no_exchange": 2}
    rows = list(read_jsonl(out))
    assert rows == [
        {"id": "qwen3-4b-instruct-100k-0", "conversations": [
            {"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}]},
        {"id": "sg-7", "conversations": [
            {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]},
        {"id": "qwen3-4b-instruct-100k-6", "conversations": [
            {"role": "user", "content": "Messages column."}, {"role": "assistant", "content": "Works."}]},
    ]


def test_sampling_is_seeded_keeps_source_order_and_features_read_it(tmp_path, tiny_target_json):
    from dpace.features import tokenize_conversation
    from dpace.targets import load_tokenizer

    many = tmp_path / "many.jsonl"
    many.write_text("".join(
        json.dumps({"conversations": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]})
        + "\n" for i in range(50)))
    picked = {}
    for seed in (0, 0, 1):
        import_conversations(str(many), tmp_path / f"s{seed}.jsonl", num_conversations=10, seed=seed)
        picked.setdefault(seed, []).append([row["id"] for row in read_jsonl(tmp_path / f"s{seed}.jsonl")])
    assert picked[0][0] == picked[0][1] and picked[0][0] != picked[1][0]
    indices = [int(i.rsplit("-", 1)[1]) for i in picked[0][0]]
    assert len(indices) == 10 and indices == sorted(indices)
    tokenizer = load_tokenizer(tiny_target_json)
    conversation = next(iter(read_jsonl(tmp_path / "s0.jsonl")))
    ids, mask = tokenize_conversation(tokenizer, conversation, tokenizer.eos_token_id)
    answer = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=True)
    assert answer == conversation["conversations"][1]["content"]  # the loss falls on the imported answer


def test_parquet_imports_like_jsonl(tmp_path, responses_file):
    parquet = tmp_path / "qwen3-4b-instruct-100k.parquet"
    pd.DataFrame(ROWS[:3]).to_parquet(parquet)
    import_conversations(str(parquet), tmp_path / "p.jsonl", num_conversations=5, seed=0)
    import_conversations(str(responses_file), tmp_path / "j.jsonl", num_conversations=5, seed=0)
    from_parquet, from_jsonl = list(read_jsonl(tmp_path / "p.jsonl")), list(read_jsonl(tmp_path / "j.jsonl"))
    assert from_parquet == from_jsonl[:1] and from_parquet[0]["conversations"][1]["content"] == ANSWER


def test_failures_name_the_setting(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="responses file .*missing.jsonl' does not exist"):
        import_conversations(str(tmp_path / "missing.jsonl"), tmp_path / "o.jsonl", num_conversations=1, seed=0)
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text(json.dumps(ROWS[1]) + "\n")
    with pytest.raises(ValueError, match=r"no usable conversation \(\{'failed': 1"):
        import_conversations(str(only_bad), tmp_path / "o.jsonl", num_conversations=1, seed=0)
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match=r"could not load z-lab/qwen3-4b-instruct-100k .*targets.<name>.responses"):
        import_conversations("z-lab/qwen3-4b-instruct-100k", tmp_path / "o.jsonl", num_conversations=1, seed=0)
    assert not (tmp_path / "o.jsonl").exists()


def test_each_target_trains_on_its_own_data_set():
    assert dataset_name("z-lab/qwen3-4b-instruct-100k") == "qwen3-4b-instruct-100k"
    assert dataset_name("/data/z lab/answers.parquet") == "answers"
    data = {"benchmarks": [], "prompts_per_benchmark": 1, "train_set": "sharegpt", "train_prompts": 1}
    config = {"main_target": "a", "data": data,
              "train": {}, "features": {}, "experiments": {},
              "targets": {"a": {"source": "x", "responses": "z-lab/qwen3-4b-instruct-100k"}, "b": {"source": "y"}}}
    assert training_data(config, "a") == "qwen3-4b-instruct-100k" and training_data(config, "b") == "sharegpt"
    check_config(config)
    config["targets"]["a"]["responses"] = "/data/sharegpt.jsonl"  # would collide with b's generated set
    with pytest.raises(ConfigError, match=r"targets.a.responses: .* named like the generated set 'sharegpt'"):
        check_config(config)
