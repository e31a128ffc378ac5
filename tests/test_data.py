"""Benchmark and training prompts: DFlash's formatting, seeded sampling, clear errors on bad data."""

import json
import re
from pathlib import Path

import pytest
import yaml

from dpace.data import (
    benchmark_prompts,
    mixed_training_prompts,
    training_prompts,
    write_benchmark,
    write_training_prompts,
)
from dpace.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]


def _mirror_with(tmp_path, kind, name, lines):
    folder = tmp_path / kind
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))
    return tmp_path


def test_math_prompts_follow_dflash_format(mirror):
    rows = benchmark_prompts("math500", 3, seed=0, mirror=str(mirror))
    source = {json.dumps(r["problem"]) for r in read_jsonl(mirror / "benchmarks" / "math500.jsonl")}
    assert len(rows) == 3
    for row in rows:
        problem, suffix = row["turns"][0].rsplit("\nPlease reason step by step", 1)
        assert json.dumps(problem) in source
        assert suffix == ", and put your final answer within \\boxed{}."


def test_humaneval_wraps_prompt_in_python_fence(mirror):
    (row,) = benchmark_prompts("humaneval", 1, seed=1, mirror=str(mirror))
    text = row["turns"][0]
    assert text.startswith("Write a solution to the following problem and make sure that it passes the tests:\n```python\n")
    assert text.endswith("\n```")


def test_mt_bench_keeps_every_turn(mirror):
    rows = benchmark_prompts("mt_bench", 5, seed=0, mirror=str(mirror))
    assert all(len(row["turns"]) == 2 for row in rows)


def test_alpaca_appends_input_only_when_present(tmp_path):
    mirror = _mirror_with(tmp_path, "benchmarks", "alpaca", [
        json.dumps({"instruction": "Sort these.", "input": "3 1 2", "output": ""}),
        json.dumps({"instruction": "Say hi.", "input": "", "output": ""}),
    ])
    rows = benchmark_prompts("alpaca", 2, seed=0, mirror=str(mirror))
    assert sorted(r["turns"][0] for r in rows) == ["Say hi.", "Sort these.\n\nInput:\n3 1 2"]


def test_sampling_is_seeded(mirror):
    first = benchmark_prompts("gsm8k", 4, seed=7, mirror=str(mirror))
    again = benchmark_prompts("gsm8k", 4, seed=7, mirror=str(mirror))
    other = benchmark_prompts("gsm8k", 4, seed=8, mirror=str(mirror))
    assert first == again
    assert [r["id"] for r in first] != [r["id"] for r in other]


def test_math500_prompts_are_the_ones_dflash_selects(mirror):
    # datasets.Dataset.shuffle(seed=0).select(range(5)) over HuggingFaceH4/MATH-500 (test), as DFlash's
    # benchmark.py does; pinned by unique_id so a change of sampler or of the mirror's row order fails here.
    rows = benchmark_prompts("math500", 5, seed=0, mirror=str(mirror))
    hub = list(read_jsonl(mirror / "benchmarks" / "math500.jsonl"))
    assert [hub[int(r["id"].split("-")[1])]["unique_id"] for r in rows] == [
        "test/number_theory/89.json",
        "test/prealgebra/1640.json",
        "test/precalculus/44.json",
        "test/algebra/1457.json",
        "test/number_theory/427.json",
    ]
    assert [r["id"] for r in rows] == ["math500-221", "math500-434", "math500-109", "math500-334", "math500-375"]


def test_asking_for_every_prompt_keeps_the_hub_order(mirror):
    rows = benchmark_prompts("mt_bench", 80, seed=0, mirror=str(mirror))
    assert [r["id"] for r in rows] == [f"mt_bench-{i}" for i in range(80)]


def test_malformed_json_names_file_and_line(tmp_path):
    mirror = _mirror_with(tmp_path, "benchmarks", "gsm8k", [json.dumps({"question": "q", "answer": "a"}), "{oops"])
    with pytest.raises(ValueError, match=r"gsm8k\.jsonl:2: malformed JSON"):
        benchmark_prompts("gsm8k", 2, seed=0, mirror=str(mirror))


def test_row_missing_required_field(tmp_path):
    mirror = _mirror_with(tmp_path, "benchmarks", "gsm8k", [json.dumps({"answer": "a"})])
    with pytest.raises(ValueError, match=r"row 0 lacks required field\(s\) \['question'\]"):
        benchmark_prompts("gsm8k", 1, seed=0, mirror=str(mirror))


def test_empty_data_set(tmp_path):
    mirror = _mirror_with(tmp_path, "benchmarks", "mbpp", [])
    with pytest.raises(ValueError, match="'mbpp' is empty"):
        benchmark_prompts("mbpp", 1, seed=0, mirror=str(mirror))


def test_mirror_missing_a_benchmark_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"benchmarks/math500\.jsonl"):
        benchmark_prompts("math500", 1, seed=0, mirror=str(tmp_path))


def test_no_hub_and_no_mirror_names_the_setting(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="set data.mirror"):
        benchmark_prompts("gsm8k", 1, seed=0, mirror=None)


def test_unknown_benchmark_lists_valid_names():
    with pytest.raises(ValueError, match="unknown benchmark 'gsm9k'.*math500"):
        benchmark_prompts("gsm9k", 1, seed=0, mirror=None)


def test_training_prompts_take_first_human_turn_and_count_skips(tmp_path):
    mirror = _mirror_with(tmp_path, "train", "sharegpt", [
        json.dumps({"id": "a", "conversations": [{"from": "human", "value": "short question"}, {"from": "gpt", "value": "x"}]}),
        json.dumps({"id": "b", "conversations": [{"from": "gpt", "value": "no human here"}]}),
        json.dumps({"id": "c", "conversations": [{"from": "human", "value": "y" * 500}]}),
    ])
    rows, skipped = training_prompts("sharegpt", 10, seed=0, mirror=str(mirror), max_chars=100)
    assert rows == [{"id": "a", "prompt": "short question"}]
    assert skipped == {"no_user_turn": 1, "too_long": 1}


def test_a_mixture_draws_each_sets_count_and_mixes_them(tmp_path):
    sharegpt = [json.dumps({"id": f"s{i}", "conversations": [{"from": "human", "value": f"chat {i}"}]}) for i in range(30)]
    codealpaca = [json.dumps({"instruction": f"code {i}", "input": "", "output": "x"}) for i in range(30)]
    mirror = _mirror_with(tmp_path, "train", "sharegpt", sharegpt)
    _mirror_with(tmp_path, "train", "codealpaca", codealpaca)
    out = tmp_path / "mix.jsonl"
    counts = write_training_prompts({"sharegpt": 12, "codealpaca": 6}, out, seed=0, mirror=str(mirror), max_chars=None)
    rows = list(read_jsonl(out))
    assert counts == {"sharegpt": {"written": 12, "no_user_turn": 0, "too_long": 0},
                      "codealpaca": {"written": 6, "no_user_turn": 0, "too_long": 0}}
    # each set contributes exactly the prompts it gives alone, and the two are interleaved
    for name, count in (("sharegpt", 12), ("codealpaca", 6)):
        alone, _ = training_prompts(name, count, seed=0, mirror=str(mirror))
        assert sorted(r["id"] for r in rows if r["id"] in {a["id"] for a in alone}) == sorted(a["id"] for a in alone)
    sources = ["code" in row["prompt"] for row in rows]
    assert len(rows) == 18 and sum(sources) == 6 and sources != sorted(sources)


def test_a_mixture_refuses_sets_that_share_ids(tmp_path):
    rows = [json.dumps({"id": "same", "conversations": [{"from": "human", "value": "hi"}]})]
    mirror = _mirror_with(tmp_path, "train", "sharegpt", rows)
    _mirror_with(tmp_path, "train", "codealpaca", [json.dumps({"id": "same", "instruction": "code", "output": "x"})])
    with pytest.raises(ValueError, match=r"training sets 'sharegpt' and 'codealpaca' share prompt id\(s\) \['same'\]"):
        mixed_training_prompts({"sharegpt": 1, "codealpaca": 1}, seed=0, mirror=str(mirror))


def test_write_benchmark_is_atomic_and_complete(tmp_path, mirror):
    out = tmp_path / "b" / "gsm8k.jsonl"
    assert write_benchmark("gsm8k", out, 3, seed=0, mirror=str(mirror)) == 3
    assert len(list(read_jsonl(out))) == 3
    assert not list(out.parent.glob(".*tmp"))


@pytest.mark.parametrize("ci", ["true", None])
def test_a_missing_mirror_fails_in_ci_and_skips_elsewhere(tmp_path, monkeypatch, ci):
    from conftest import require_mirror

    if ci:
        monkeypatch.setenv("CI", ci)
    else:
        monkeypatch.delenv("CI", raising=False)
    with pytest.raises(BaseException, match="data mirror not found") as outcome:  # a skip must not skip this test
        require_mirror(tmp_path)
    assert outcome.type is (pytest.fail.Exception if ci else pytest.skip.Exception)
    (tmp_path / "benchmarks").mkdir()
    assert require_mirror(tmp_path) == tmp_path


def test_a_duplicate_prompt_id_inside_one_set_is_refused_naming_the_file_and_the_id(tmp_path):
    """Two rows of sharegpt with one id: the error names that file, both rows and the id, not a pair of sets."""
    sharegpt = [json.dumps({"id": "dup" if i in (1, 3) else f"s{i}", "conversations": [{"from": "human", "value": f"q{i}"}]})
                for i in range(4)]
    mirror = _mirror_with(tmp_path, "train", "sharegpt", sharegpt)
    _mirror_with(tmp_path, "train", "codealpaca", [json.dumps({"instruction": "code", "output": "x"})])
    path = mirror / "train" / "sharegpt.jsonl"
    message = (rf"{path}:[24]: prompt id 'dup' appears twice in training set 'sharegpt' \(also at {path}:[24]\); "
               r"ids must be unique within a set")
    with pytest.raises(ValueError, match=message):
        mixed_training_prompts({"sharegpt": 4, "codealpaca": 1}, seed=0, mirror=str(mirror))
    with pytest.raises(ValueError, match=message):
        training_prompts("sharegpt", 4, seed=0, mirror=str(mirror))


def test_asking_for_more_prompts_than_a_benchmark_has_is_refused(mirror):
    """``prompts_per_benchmark: 100000`` on the 80-row Alpaca file used to give 80 prompts without a word."""
    path = mirror / "benchmarks" / "alpaca.jsonl"
    with pytest.raises(ValueError, match=re.escape(
            f"data.prompts_per_benchmark: 100000 prompts of benchmark 'alpaca' asked for, but {path} has 80 rows; "
            "ask for at most 80")):
        benchmark_prompts("alpaca", 100000, seed=0, mirror=str(mirror))
    assert len(benchmark_prompts("alpaca", 80, seed=0, mirror=str(mirror))) == 80


@pytest.mark.parametrize("config", ["config.yaml", *(f"workflow/configs/{p.name}" for p in sorted(
    (REPO / "workflow" / "configs").glob("*.yaml")))])
def test_the_shipped_configs_ask_no_more_prompts_than_the_mirror_has(mirror, config):
    """Every shipped config, with its data read from the mirror (paper.yaml reads the hub; the mirror's Alpaca is an
    80-row sample, so it is held to the mirror's rows except where it names the hub's full sets)."""
    data = yaml.safe_load((REPO / config).read_text())["data"]
    counts = data["prompts_per_benchmark"]
    for name in data["benchmarks"]:
        asked = counts if isinstance(counts, int) else counts[name]
        rows = sum(1 for _ in (mirror / "benchmarks" / f"{name}.jsonl").open())
        if data.get("mirror") is None and name == "alpaca":  # the hub's tatsu-lab/alpaca has 52002 rows
            continue
        assert asked <= rows, f"{config}: data.prompts_per_benchmark asks {asked} of {name}, the mirror has {rows}"
