"""evaluate_drafter on a tiny random target with SmolLM2's tokenizer: summary fields, lossless greedy
check, multi-turn prompts, and resuming from a (torn) records file without redoing finished prompts."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
from eval_calls import evaluate as evaluate_drafter
from eval_calls import measure as measure_baseline
from transformers import AutoConfig

import dpace.evaluation.evaluate as evaluation
from dpace.evaluation.evaluate import BLOCK_COLUMNS, load_benchmark, summarize
from dpace.io import atomic_write_jsonl, record_checksums
from dpace.targets import prepare_target, target_checksum
from dpace.training.drafter import drafter_config, save_drafter

TEMPERATURES = [0.0, 1.0]
MAX_NEW = 8


# Tiny models gain nothing from threads (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from dflash.model import DFlashDraftModel

    root = tmp_path_factory.mktemp("eval")
    target_json = prepare_target(
        {"source": "random", "hidden_size": 64, "intermediate_size": 128, "num_layers": 4, "logit_scale": 30.0},
        root / "target",
    )
    config = drafter_config(
        AutoConfig.from_pretrained(root / "target" / "model"), depth=1, block_size=4,
        target_layer_ids=[1, 2], mask_token_id=0,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    save_drafter(DFlashDraftModel(config), root / "drafter")
    files = {"gsm8k": root / "gsm8k.jsonl", "mt-bench": root / "mt.jsonl"}
    atomic_write_jsonl(files["gsm8k"], [
        {"id": "g0", "benchmark": "gsm8k", "turns": ["What is 2 + 3?"]},
        {"id": "g1", "benchmark": "gsm8k", "turns": ["A train leaves at noon. When does it arrive?"]},
    ])
    atomic_write_jsonl(files["mt-bench"], [
        {"id": "m0", "benchmark": "mt-bench", "turns": ["Write a haiku.", "Now explain it."]},
        {"id": "m1", "benchmark": "mt-bench", "turns": ["Name a color.", "Why that one?"]},
    ])
    return root, target_json, root / "drafter", files


def run(setup, out):
    root, target_json, drafter_dir, files = setup
    return evaluate_drafter(
        target_json, drafter_dir, files, temperatures=TEMPERATURES, verification="hard-match",
        max_new_tokens=MAX_NEW, seed=7, records_path=out / "records.jsonl",
        summary_path=out / "summary.json", blocks_path=out / "blocks.csv",
    )


def count_calls(monkeypatch, name):
    """Calls of ``name`` from the evaluation, and from the baseline's answers (``dpace.evaluation.replay.reference_turn``)."""
    import dpace.evaluation.replay as replay

    calls = []

    def counted(original):
        def wrapper(*args, **kwargs):
            calls.append(kwargs.get("temperature"))
            return original(*args, **kwargs)
        return wrapper

    for module in (evaluation, replay):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, counted(getattr(module, name)))
    return calls


@pytest.fixture(scope="module")
def first_run(setup, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as patch:
        prompts = []
        original = evaluation.chat_prompt_ids
        patch.setattr(evaluation, "chat_prompt_ids", lambda tok, messages: prompts.append(list(messages)) or original(tok, messages))
        summary = run(setup, out)
    return out, summary, prompts


def test_an_evaluation_records_the_checksums_the_metrics_job_verifies(first_run):
    """Issue 56: summary.json and blocks.csv are checked by content when the metrics job reads them."""
    from dpace.io import verify_recorded

    out = first_run[0]
    for name in ("summary.json", "blocks.csv"):
        verify_recorded(out / name, what="the evaluation")


def test_summary_fields(first_run):
    out, summary, _ = first_run
    assert json.loads((out / "summary.json").read_text()) == summary
    assert [(r["benchmark"], r["temperature"]) for r in summary] == [
        ("gsm8k", 0.0), ("gsm8k", 1.0), ("mt-bench", 0.0), ("mt-bench", 1.0)
    ]
    for row in summary:
        assert row["verification"] == "hard-match" and row["block_size"] == 4
        assert row["num_prompts"] == 2
        assert row["num_requests"] == (4 if row["benchmark"] == "mt-bench" else 2)
        assert 1.0 <= row["tau"] <= 4.0
        assert row["speedup"] > 0 and row["ar_tpot_s"] > 0 and row["spec_tpot_s"] > 0
        assert row["speedup"] == pytest.approx(row["ar_tpot_s"] / row["spec_tpot_s"])
        assert 0 < row["num_output_tokens"] <= MAX_NEW * row["num_requests"]
        assert len(row["acceptance_histogram"]) == 5 and sum(row["acceptance_histogram"]) == pytest.approx(1.0)
        assert row["acceptance_histogram"][0] == 0
        if row["temperature"] == 0:
            assert row["greedy_mismatches"] == 0 and row["first_mismatch"] is None
            assert row["greedy_diverged_requests"] == 0
        else:
            assert row["greedy_mismatches"] is None


def test_blocks_table(first_run):
    out, _, _ = first_run
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    with (out / "blocks.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == BLOCK_COLUMNS
    assert len(rows) == sum(len(t["blocks"]) for r in records for t in r["turns"])
    for row in rows:
        assert 1 <= int(row["tau_block"]) <= 4
        assert 0 <= float(row["surrogate"]) <= float(row["sum_q"]) + 1e-12 <= 3 + 1e-9
    m0 = [r for r in rows if r["benchmark"] == "mt-bench" and r["prompt_index"] == "0" and r["temperature"] == "0.0"]
    assert [int(r["block_index"]) for r in m0] == list(range(len(m0)))  # numbered across both turns
    assert {r["turn"] for r in m0} == {"0", "1"}


def test_second_turn_follows_the_models_answer(first_run):
    _, _, prompts = first_run
    second_turns = [m for m in prompts if len(m) == 3]
    assert second_turns, "MT-Bench second turns were not built"
    for messages in second_turns:
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        assert messages[0]["content"] in ("Write a haiku.", "Name a color.")


def test_resume_skips_finished_prompts(setup, first_run, tmp_path, monkeypatch):
    out, summary, _ = first_run
    lines = (out / "records.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 8  # 2 benchmarks x 2 prompts x 2 temperatures
    kept = lines[:3]
    (tmp_path / "records.jsonl").write_text("".join(kept) + lines[3][:40])  # a killed writer's torn line
    remaining = sum(len(json.loads(line)["turns"]) for line in lines[3:])
    spec_calls = count_calls(monkeypatch, "speculative_generate")
    ar_calls = count_calls(monkeypatch, "autoregressive_generate")
    resumed = run(setup, tmp_path)
    warmups = len(TEMPERATURES)
    assert len(spec_calls) == remaining + warmups and len(ar_calls) == remaining + warmups
    # per-request seeds: a resumed run reproduces the outputs of an uninterrupted one
    for a, b in zip(summary, resumed, strict=True):
        for key in ("benchmark", "temperature", "tau", "num_output_tokens", "acceptance_histogram",
                    "greedy_mismatches", "num_prompts"):
            assert a[key] == b[key], key
    assert (tmp_path / "blocks.csv").read_text() == (out / "blocks.csv").read_text()

    # everything recorded: a rerun loads no model and decodes nothing
    (tmp_path / "summary.json").unlink()
    spec_calls.clear()
    monkeypatch.setattr(evaluation, "load_target", lambda *a, **k: pytest.fail("model loaded on a finished run"))
    again = run(setup, tmp_path)
    assert spec_calls == [] and [r["tau"] for r in again] == [r["tau"] for r in resumed]


def evaluate_into(setup, out, drafter_dir=None, **overrides):
    root, target_json, default_drafter, files = setup
    files = overrides.pop("files", files)
    kwargs = dict(temperatures=TEMPERATURES, verification="hard-match", max_new_tokens=MAX_NEW, seed=7,
                  records_path=out / "records.jsonl", summary_path=out / "summary.json", blocks_path=out / "blocks.csv")
    return evaluate_drafter(target_json, drafter_dir or default_drafter, files, **(kwargs | overrides))


def read_records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_of_other_settings_are_decoded_again(setup, first_run, tmp_path, monkeypatch):
    """A job that reruns because a setting changed decodes every prompt again, keeping only new records."""
    out, _, _ = first_run
    (tmp_path / "records.jsonl").write_text((out / "records.jsonl").read_text())
    spec_calls = count_calls(monkeypatch, "speculative_generate")
    summary = evaluate_into(setup, tmp_path, max_new_tokens=MAX_NEW + 1)
    requests = sum(len(r["turns"]) for r in read_records(out / "records.jsonl"))
    assert len(spec_calls) == len(TEMPERATURES) + requests
    records = read_records(tmp_path / "records.jsonl")
    assert len(records) == 8 and {r["max_new_tokens"] for r in records} == {MAX_NEW + 1}
    assert sum(r["num_output_tokens"] for r in summary) > sum(r["num_output_tokens"] for r in first_run[1])


@pytest.mark.parametrize("setting, value", [("dtype", "bfloat16"), ("decode_clock", "after-prefill")])
def test_records_of_another_dtype_or_clock_are_decoded_again(setup, first_run, tmp_path, monkeypatch, setting, value):
    out, _, _ = first_run
    (tmp_path / "records.jsonl").write_text((out / "records.jsonl").read_text())
    spec_calls = count_calls(monkeypatch, "speculative_generate")
    evaluate_into(setup, tmp_path, **{setting: value})
    assert len(spec_calls) == len(TEMPERATURES) + sum(len(r["turns"]) for r in read_records(out / "records.jsonl"))
    assert {r[setting] for r in read_records(tmp_path / "records.jsonl")} == {value}


def test_a_retrained_drafter_is_decoded_again(setup, first_run, tmp_path, monkeypatch):
    """Snakemake reruns an evaluation when its drafter was retrained (same folder, new weights): the
    records of the old weights must not stand for the new ones."""
    from dflash.model import DFlashDraftModel

    from dpace.training.drafter import load_drafter

    out, first, _ = first_run
    root, target_json, drafter_dir, files = setup
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "records.jsonl").write_text((out / "records.jsonl").read_text())
    spec_calls = count_calls(monkeypatch, "speculative_generate")
    shutil.copytree(drafter_dir, tmp_path / "drafter")
    evaluate_into(setup, tmp_path / "run", tmp_path / "drafter")
    assert spec_calls == []  # the same weights in another folder: the records stand

    config = load_drafter(drafter_dir).config
    torch.manual_seed(1)
    save_drafter(DFlashDraftModel(config), tmp_path / "drafter")
    retrained = evaluate_into(setup, tmp_path / "run", tmp_path / "drafter")
    requests = sum(len(r["turns"]) for r in read_records(out / "records.jsonl"))
    assert len(spec_calls) == len(TEMPERATURES) + requests
    (tmp_path / "fresh").mkdir()
    fresh = evaluate_into(setup, tmp_path / "fresh", tmp_path / "drafter")
    for a, b in zip(retrained, fresh, strict=True):
        for key in ("tau", "acceptance_histogram", "num_output_tokens"):
            assert a[key] == b[key], key
    assert len(read_records(tmp_path / "run" / "records.jsonl")) == 8


def test_target_checksum_follows_the_weights_not_the_folder(setup, tmp_path):
    root, target_json, _, _ = setup
    shutil.copytree(root / "target", tmp_path / "target")
    copy = tmp_path / "target" / "target.json"

    assert target_checksum(copy) == target_checksum(target_json)
    weights = tmp_path / "target" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    # other weights in the same folder are refused (issue 56): prepare_target recorded the files' checksums
    with pytest.raises(ValueError, match=rf"{weights}: changed since the target was prepared"):
        target_checksum(copy)


def test_drafter_of_another_target_is_refused_by_evaluate(setup, tmp_path):
    """Through evaluate_drafter itself: a drafter built for a narrower target never decodes."""
    from dflash.model import DFlashDraftModel

    root, target_json, _, files = setup
    narrower = AutoConfig.from_pretrained(root / "target" / "model")
    narrower.hidden_size, narrower.intermediate_size, narrower.head_dim = 32, 64, 8
    config = drafter_config(narrower, depth=1, block_size=4, target_layer_ids=[1, 2], mask_token_id=0)
    config._attn_implementation = "sdpa"
    save_drafter(DFlashDraftModel(config), tmp_path / "drafter")
    with pytest.raises(ValueError, match="drafter hidden_size=32 does not match the target's hidden_size=64"):
        evaluate_drafter(
            target_json, tmp_path / "drafter", files, temperatures=TEMPERATURES, verification="hard-match",
            max_new_tokens=MAX_NEW, seed=7, records_path=tmp_path / "records.jsonl",
            summary_path=tmp_path / "summary.json", blocks_path=tmp_path / "blocks.csv",
        )
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "blocks.csv").exists()
    assert not (tmp_path / "records.jsonl").exists() or not (tmp_path / "records.jsonl").read_text()


def test_malformed_benchmark_rows_are_rejected(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "x", "benchmark": "b", "turns": []}) + "\n")
    with pytest.raises(ValueError, match="turns"):
        load_benchmark(path, "b")


def test_summarize_definitions_and_first_mismatch():
    """SR from mean TPOTs, tau as a mean of per-request means, and the first greedy mismatch."""
    from dpace.evaluation.evaluate import summarize

    def turn(i, ar, spec, lengths, greedy):
        timing = lambda tpot: {"time_per_output_token_s": tpot, "num_output_tokens": sum(lengths) + 1}  # noqa: E731
        return {"turn": i, "ar": timing(ar), "spec": timing(spec), "acceptance_lengths": lengths, "blocks": [],
                "greedy": greedy}

    ok = {"mismatches": 0, "first_mismatch": None, "top2_margin": None}
    bad = {"mismatches": 3, "first_mismatch": 5, "top2_margin": 0.01}
    records = [
        {"benchmark": "b", "id": "0", "prompt_index": 0, "temperature": 0.0, "verification": "hard-match",
         "block_size": 4, "turns": [turn(0, 0.3, 0.1, [4, 4], ok)]},
        {"benchmark": "b", "id": "1", "prompt_index": 1, "temperature": 0.0, "verification": "hard-match",
         "block_size": 4, "turns": [turn(0, 0.1, 0.1, [1, 2, 3], ok), turn(1, 0.2, 0.2, [2], bad)]},
    ]
    (row,) = summarize(records)
    assert row["speedup"] == pytest.approx((0.6 / 3) / (0.4 / 3))
    assert row["tau"] == pytest.approx((4 + 2 + 2) / 3)
    assert row["acceptance_histogram"] == pytest.approx([0, 1 / 6, 2 / 6, 1 / 6, 2 / 6])
    assert row["greedy_mismatches"] == 3 and row["greedy_diverged_requests"] == 1
    assert row["first_mismatch"]["id"] == "1" and row["first_mismatch"]["turn"] == 1
    assert row["first_mismatch"]["first_mismatch"] == 5 and row["num_requests"] == 3


def test_summary_rows_carry_each_request_for_paired_intervals(first_run):
    out, summary, _ = first_run
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    for row in summary:
        requests = row["requests"]
        assert len(requests) == row["num_requests"]
        assert row["tau"] == pytest.approx(sum(r["tau"] for r in requests) / len(requests))
        ar = sum(r["ar_tpot_s"] for r in requests) / len(requests)
        spec = sum(r["spec_tpot_s"] for r in requests) / len(requests)
        assert row["speedup"] == pytest.approx(ar / spec)
        turns = {(r["id"], t["turn"]): t for r in records if (r["benchmark"], r["temperature"]) == (row["benchmark"], row["temperature"])
                 for t in r["turns"]}
        for request in requests:
            turn = turns[(request["id"], request["turn"])]
            lengths = turn["block_lengths"]  # DFlash's count: accepted + 1 per step (tau_counts default)
            assert request["tau"] == pytest.approx(sum(lengths) / len(lengths))


def test_sampled_prompts_limit_only_the_sampled_temperatures(setup, tmp_path, monkeypatch):
    root, target_json, drafter_dir, files = setup
    decoded = []
    original = evaluation._Decode.decode
    monkeypatch.setattr(evaluation._Decode, "decode", lambda self, request: decoded.append(
        (request.benchmark, request.temperature, request.row["id"])) or original(self, request))
    summary = evaluate_drafter(
        target_json, drafter_dir, files, temperatures=TEMPERATURES, verification="hard-match", max_new_tokens=4,
        seed=7, records_path=tmp_path / "records.jsonl", summary_path=tmp_path / "summary.json",
        blocks_path=tmp_path / "blocks.csv", sampled_prompts_per_benchmark=1,
    )
    assert sorted(decoded) == sorted([("gsm8k", 0.0, "g0"), ("gsm8k", 0.0, "g1"), ("gsm8k", 1.0, "g0"),
                                      ("mt-bench", 0.0, "m0"), ("mt-bench", 0.0, "m1"), ("mt-bench", 1.0, "m0")])
    assert {(r["benchmark"], r["temperature"]): r["num_prompts"] for r in summary} == {
        ("gsm8k", 0.0): 2, ("gsm8k", 1.0): 1, ("mt-bench", 0.0): 2, ("mt-bench", 1.0): 1}


@pytest.mark.parametrize("per_benchmark", [1, 2, 3])
@pytest.mark.parametrize("temperatures", [(0.0,), (0.0, 1.0), (1.0, 0.0, 0.7)])
def test_replays_exactness_check_decodes_n_prompts_a_benchmark_the_temperatures_in_turn(per_benchmark, temperatures):
    """Issue 55: a decode is most of a replayed evaluation's time, so the check decodes N prompts a benchmark (not
    N a temperature): the first N prompts, each at one temperature, taken in turn so every temperature is checked."""
    from dpace.evaluation.eval_config import EvalConfig

    config = EvalConfig.from_config({"temperatures": list(temperatures), "decoded_prompts_per_benchmark": per_benchmark,
                                     "max_new_tokens": 8}, seed=0)
    ranks = range(6)
    decoded = {(rank, index, t) for rank in ranks for index in range(10) for t in temperatures
               if config.decodes(rank, index, t)}
    for rank in ranks:
        mine = sorted((index, t) for r, index, t in decoded if r == rank)
        assert [index for index, _ in mine] == list(range(per_benchmark))  # the first N prompts, each once
    at = {t: sum(1 for *_, u in decoded if u == t) for t in temperatures}
    assert sum(at.values()) == len(ranks) * per_benchmark
    assert max(at.values()) - min(at.values()) <= 1 or len(ranks) * per_benchmark < len(temperatures)
    assert all(at.values()) or len(ranks) * per_benchmark < len(temperatures)  # every temperature is checked


def test_tau_counts_and_greedy_divergence_verdicts():
    """tau per DFlash's benchmark (accepted + 1, the stop token's step too) or per emitted tokens;
    T=0 divergences below the tie margin are ties, the others failures, each with its margin."""
    from dpace.evaluation.evaluate import summarize

    def turn(i, emitted, proposed, greedy):
        timing = {"time_per_output_token_s": 0.1, "num_output_tokens": sum(emitted) + 1}
        return {"turn": i, "ar": timing, "spec": timing, "acceptance_lengths": emitted,
                "block_lengths": proposed, "blocks": [], "greedy": greedy}

    tie = {"mismatches": 2, "first_mismatch": 7, "top2_margin": 0.125}
    wrong = {"mismatches": 5, "first_mismatch": 3, "top2_margin": 4.0}
    same = {"mismatches": 0, "first_mismatch": None, "top2_margin": None}
    records = [
        {"benchmark": "b", "id": "0", "prompt_index": 0, "temperature": 0.0, "verification": "hard-match",
         "block_size": 4, "turns": [turn(0, [4, 1], [4, 4], tie)]},
        {"benchmark": "b", "id": "1", "prompt_index": 1, "temperature": 0.0, "verification": "hard-match",
         "block_size": 4, "turns": [turn(0, [2, 3], [2, 3], wrong), turn(1, [4], [4], same)]},
    ]
    (dflash,) = summarize(records)
    assert dflash["tau_counts"] == "accepted-plus-bonus"
    assert dflash["tau"] == pytest.approx((4 + 2.5 + 4) / 3)
    assert dflash["acceptance_histogram"] == pytest.approx([0, 0, 1 / 5, 1 / 5, 3 / 5])
    (emitted,) = summarize(records, tau_counts="emitted")
    assert emitted["tau"] == pytest.approx((2.5 + 2.5 + 4) / 3)
    assert dflash["greedy_ties"] == 1 and dflash["greedy_failures"] == 1 and dflash["greedy_tie_margin"] == 0.5
    assert [(d["id"], d["first_mismatch"], d["top2_margin"], d["verdict"]) for d in dflash["greedy_divergences"]] == [
        ("0", 7, 0.125, "tie"), ("1", 3, 4.0, "failure")]
    (strict,) = summarize(records, greedy_tie_margin=0.1)
    assert strict["greedy_ties"] == 0 and strict["greedy_failures"] == 2
    with pytest.raises(ValueError, match="tau_counts"):
        summarize(records, tau_counts="accepted")


def test_bf16_evaluation_loads_bf16_models_and_keeps_greedy_lossless(setup, tmp_path, monkeypatch):
    """eval.dtype bfloat16 reaches the models; at T=0 every divergence from greedy is a near-tie."""
    root, target_json, drafter_dir, files = setup
    loaded = []
    original = evaluation.load_target

    def spy(*args, **kwargs):
        model, tokenizer = original(*args, **kwargs)
        loaded.append(next(model.parameters()).dtype)
        return model, tokenizer

    monkeypatch.setattr(evaluation, "load_target", spy)
    drafters = count_calls(monkeypatch, "speculative_generate")
    summary = evaluate_drafter(
        target_json, drafter_dir, files, temperatures=[0.0], verification="hard-match", max_new_tokens=16, seed=7,
        records_path=tmp_path / "records.jsonl", summary_path=tmp_path / "s.json", blocks_path=tmp_path / "b.csv",
        dtype="bfloat16",
    )
    assert loaded == [torch.bfloat16] and drafters
    for row in summary:
        assert row["greedy_failures"] == 0, row["greedy_divergences"]
        assert row["greedy_ties"] == len(row["greedy_divergences"])


# ---------------------------------------------------------------------------
# The shared autoregressive baseline (eval.baseline: shared)
# ---------------------------------------------------------------------------


def measure(setup, out, **overrides):
    root, target_json, _, files = setup
    kwargs = dict(temperatures=TEMPERATURES, max_new_tokens=MAX_NEW, seed=7, records_path=out / "baseline.records.jsonl",
                  out_path=out / "baseline.jsonl") | overrides
    return measure_baseline(target_json, files, **kwargs)


def run_with_baseline(setup, out, baseline_path):
    root, target_json, drafter_dir, files = setup
    return evaluate_drafter(
        target_json, drafter_dir, files, temperatures=TEMPERATURES, verification="hard-match",
        max_new_tokens=MAX_NEW, seed=7, records_path=out / "records.jsonl",
        summary_path=out / "summary.json", blocks_path=out / "blocks.csv", baseline_path=baseline_path,
    )


def rewrite_baseline(path, change):
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        change(record)
    atomic_write_jsonl(path, records)
    record_checksums(path)  # as if the baseline job had written it so (an edit after it is refused)


@pytest.fixture(scope="module")
def baseline(setup, tmp_path_factory):
    out = tmp_path_factory.mktemp("baseline")
    return out / "baseline.jsonl", measure(setup, out)


def test_baseline_times_every_planned_request_after_its_own_answers(setup, baseline, first_run):
    path, records = baseline
    _, _, prompts = first_run
    assert [(r["benchmark"], r["temperature"], r["id"]) for r in records] == [
        (b, t, i) for b, ids in (("gsm8k", ("g0", "g1")), ("mt-bench", ("m0", "m1"))) for t in TEMPERATURES for i in ids]
    for record in records:
        assert len(record["turns"]) == (2 if record["benchmark"] == "mt-bench" else 1)
        for turn in record["turns"]:
            assert 1 <= len(turn["new_token_ids"]) <= MAX_NEW
            assert turn["ar"]["time_per_output_token_s"] > 0
    # at T=0 the target's own greedy answer is the speculative one, so the second-turn prompts agree
    root, target_json, drafter_dir, files = setup
    from dpace.targets import chat_prompt_ids, load_target

    _, tokenizer = load_target(target_json)
    first_turn = {m[0]["content"] for m in prompts if len(m) == 1}
    assert first_turn == {"What is 2 + 3?", "A train leaves at noon. When does it arrive?", "Write a haiku.", "Name a color."}
    for record in records:
        assert record["turns"][0]["prompt_fingerprint"] == evaluation._prompt_fingerprint(
            chat_prompt_ids(tokenizer, [{"role": "user", "content": setup_turns(files, record)[0]}]))


def setup_turns(files, record):
    rows = {row["id"]: row for row in load_benchmark(files[record["benchmark"]], record["benchmark"])}
    return rows[record["id"]]["turns"]


def test_evaluation_with_the_shared_baseline_decodes_only_the_drafter(setup, baseline, first_run, tmp_path, monkeypatch):
    path, records = baseline
    _, alone, _ = first_run
    ar_calls = count_calls(monkeypatch, "autoregressive_generate")
    spec_calls = count_calls(monkeypatch, "speculative_generate")
    shared = run_with_baseline(setup, tmp_path, path)
    assert ar_calls == []  # no baseline decoding, not even a warm-up
    assert len(spec_calls) == len(TEMPERATURES) + sum(len(r["turns"]) for r in records)
    for with_baseline, without in zip(shared, alone, strict=True):
        # the drafter's side is the same decoding, seed for seed
        for key in ("benchmark", "temperature", "tau", "acceptance_histogram", "num_output_tokens"):
            assert with_baseline[key] == without[key], key
        cell = [r for r in records if (r["benchmark"], r["temperature"]) == (with_baseline["benchmark"], with_baseline["temperature"])]
        times = [t["ar"]["time_per_output_token_s"] for r in cell for t in r["turns"]]
        assert with_baseline["ar_tpot_s"] == pytest.approx(sum(times) / len(times))
        assert [q["ar_tpot_s"] for q in with_baseline["requests"]] == times
        if with_baseline["temperature"] == 0:
            assert with_baseline["greedy_mismatches"] == 0 and with_baseline["greedy_diverged_requests"] == 0


def test_lossless_check_compares_with_the_baselines_tokens(setup, baseline, tmp_path):
    path, _ = baseline
    changed = tmp_path / "changed.jsonl"
    changed.write_text(path.read_text())

    def flip_first_greedy_token(record):
        if record["id"] == "g0" and record["temperature"] == 0:
            record["turns"][0]["new_token_ids"][0] += 1

    rewrite_baseline(changed, flip_first_greedy_token)
    summary = run_with_baseline(setup, tmp_path, changed)
    (gsm8k,) = [r for r in summary if r["benchmark"] == "gsm8k" and r["temperature"] == 0]
    assert gsm8k["greedy_diverged_requests"] == 1 and gsm8k["first_mismatch"]["id"] == "g0"
    assert gsm8k["first_mismatch"]["first_mismatch"] == 0


def test_a_prompt_the_baseline_did_not_see_is_checked_against_fresh_greedy_decoding(setup, baseline, tmp_path, monkeypatch):
    """Second turns whose prompt is not the baseline's (the answers parted) get their greedy reference decoded."""
    path, _ = baseline
    changed = tmp_path / "changed.jsonl"
    changed.write_text(path.read_text())

    def forget_second_turn_prompts(record):
        for turn in record["turns"][1:]:
            turn["prompt_fingerprint"] += 1

    rewrite_baseline(changed, forget_second_turn_prompts)
    ar_calls = count_calls(monkeypatch, "autoregressive_generate")
    summary = run_with_baseline(setup, tmp_path, changed)
    assert ar_calls == [0.0, 0.0]  # the two MT-Bench second turns at T=0; at T=1 nothing is compared
    assert all(r["greedy_mismatches"] == 0 for r in summary if r["temperature"] == 0)


def test_records_timed_against_another_baseline_are_decoded_again(setup, baseline, tmp_path, monkeypatch):
    path, records = baseline
    first = run_with_baseline(setup, tmp_path, path)
    changed = tmp_path / "changed.jsonl"
    changed.write_text(path.read_text())
    rewrite_baseline(changed, lambda r: [t["ar"].update(time_per_output_token_s=1.0) for t in r["turns"]])
    spec_calls = count_calls(monkeypatch, "speculative_generate")
    again = run_with_baseline(setup, tmp_path, changed)
    assert len(spec_calls) == len(TEMPERATURES) + sum(len(r["turns"]) for r in records)
    assert all(row["ar_tpot_s"] == 1.0 for row in again)
    assert [r["tau"] for r in again] == [r["tau"] for r in first]
    # and back to in-process timing: the baseline's records are stale too
    spec_calls.clear()
    run_with_baseline(setup, tmp_path, None)
    assert len(spec_calls) == len(TEMPERATURES) + sum(len(r["turns"]) for r in records)


def test_a_baseline_of_other_settings_or_requests_is_refused(setup, baseline, tmp_path):
    path, _ = baseline
    root, target_json, drafter_dir, files = setup
    with pytest.raises(ValueError, match="max_new_tokens"):
        evaluate_drafter(
            target_json, drafter_dir, files, temperatures=TEMPERATURES, verification="hard-match",
            max_new_tokens=MAX_NEW + 1, seed=7, records_path=tmp_path / "records.jsonl",
            summary_path=tmp_path / "s.json", blocks_path=tmp_path / "b.csv", baseline_path=path,
        )
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    record_checksums(partial)
    with pytest.raises(ValueError, match="lacks 1 request"):
        run_with_baseline(setup, tmp_path, partial)
    assert not (tmp_path / "summary.json").exists()


def test_baseline_resumes_without_decoding_again(setup, baseline, tmp_path, monkeypatch):
    path, records = baseline
    lines = (path.parent / "baseline.records.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "baseline.records.jsonl").write_text("".join(lines[:5]) + lines[5][:30])
    ar_calls = count_calls(monkeypatch, "autoregressive_generate")
    resumed = measure(setup, tmp_path)
    remaining = sum(len(r["turns"]) for r in records[5:])
    assert len(ar_calls) == remaining + len(TEMPERATURES)
    # per-request seeds: the resumed baseline samples the same answers
    assert [[t["new_token_ids"] for t in r["turns"]] for r in resumed] == [[t["new_token_ids"] for t in r["turns"]] for r in records]


def test_baseline_records_of_another_dtype_are_timed_again(setup, baseline, tmp_path, monkeypatch):
    path, records = baseline
    (tmp_path / "baseline.records.jsonl").write_text((path.parent / "baseline.records.jsonl").read_text())
    ar_calls = count_calls(monkeypatch, "autoregressive_generate")
    again = measure(setup, tmp_path, dtype="bfloat16")
    assert len(ar_calls) == len(TEMPERATURES) + sum(len(r["turns"]) for r in records)
    assert {r["dtype"] for r in again} == {"bfloat16"}
    assert read_records(tmp_path / "baseline.records.jsonl") == again


def test_a_baseline_of_another_target_is_refused(setup, baseline, tmp_path):
    path, _ = baseline
    changed = tmp_path / "changed.jsonl"
    changed.write_text(path.read_text())
    rewrite_baseline(changed, lambda record: record.update(target=record["target"] + 1))
    with pytest.raises(ValueError, match="target="):
        run_with_baseline(setup, tmp_path, changed)


# ---------------------------------------------------------------------------
# Records are keyed by the prompt text they were computed from (issue 50)
# ---------------------------------------------------------------------------


def reworded(setup, tmp_path) -> dict:
    """The setup's benchmark files with one gsm8k prompt (g1) reworded and everything else as it was."""
    root, _, _, files = setup
    changed = {}
    for name, path in files.items():
        rows = load_benchmark(path, name)
        for row in rows:
            if row["id"] == "g1":
                row["turns"] = ["A bus leaves at nine in the morning and drives for three hours. When does it get there?"]
        changed[name] = tmp_path / f"{name}.jsonl"
        atomic_write_jsonl(changed[name], rows)
    return changed


def test_a_reworded_prompt_is_decoded_again(setup, first_run, tmp_path, monkeypatch):
    """The same records file, one prompt's text changed: that prompt is decoded again (at each
    temperature) and the summary is that of its new text; the untouched prompts are reused."""
    out, first, _ = first_run
    files = reworded(setup, tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "records.jsonl").write_text((out / "records.jsonl").read_text())
    spec_calls = count_calls(monkeypatch, "speculative_generate")
    summary = evaluate_into(setup, tmp_path / "run", files=files)
    assert len(spec_calls) == len(TEMPERATURES) + len(TEMPERATURES)  # warm-ups + g1 at each temperature
    (tmp_path / "fresh").mkdir()
    fresh = evaluate_into(setup, tmp_path / "fresh", files=files)
    for a, b in zip(summary, fresh, strict=True):
        for key in ("tau", "acceptance_histogram", "num_output_tokens", "num_prompts"):
            assert a[key] == b[key], key
    prompt_lengths = {(r["temperature"], r["id"]): r["turns"][0]["spec"]["num_input_tokens"]
                      for r in read_records(tmp_path / "run" / "records.jsonl") if r["benchmark"] == "gsm8k"}
    old_lengths = {(r["temperature"], r["id"]): r["turns"][0]["spec"]["num_input_tokens"]
                   for r in read_records(out / "records.jsonl") if r["benchmark"] == "gsm8k"}
    assert {key for key in old_lengths if prompt_lengths[key] != old_lengths[key]} == {(t, "g1") for t in TEMPERATURES}


def test_a_baseline_of_a_reworded_prompt_is_recomputed_and_not_used(setup, baseline, tmp_path, monkeypatch):
    """The baseline's records follow the prompt text too, and an evaluation refuses a baseline that
    answered another text of one of its prompts instead of timing against it."""
    path, records = baseline
    files = reworded(setup, tmp_path)
    root, target_json, drafter_dir, _ = setup
    (tmp_path / "baseline.records.jsonl").write_text((path.parent / "baseline.records.jsonl").read_text())
    ar_calls = count_calls(monkeypatch, "autoregressive_generate")
    again = measure_baseline(target_json, files, temperatures=TEMPERATURES, max_new_tokens=MAX_NEW, seed=7,
                                        records_path=tmp_path / "baseline.records.jsonl",
                                        out_path=tmp_path / "baseline.jsonl")
    assert len(ar_calls) == len(TEMPERATURES) + len(TEMPERATURES)  # warm-ups + g1 at each temperature
    changed = [r for r in again if r["id"] == "g1"]
    assert all(r["turns"][0]["prompt_ids"] != old["turns"][0]["prompt_ids"]
               for r, old in zip(changed, [r for r in records if r["id"] == "g1"], strict=True))
    with pytest.raises(ValueError, match="lacks 2 request"):
        evaluate_drafter(target_json, drafter_dir, files, temperatures=TEMPERATURES, verification="hard-match",
                         max_new_tokens=MAX_NEW, seed=7, records_path=tmp_path / "records.jsonl",
                         summary_path=tmp_path / "s.json", blocks_path=tmp_path / "b.csv", baseline_path=path)


def test_a_request_past_the_targets_context_is_skipped_and_counted(setup, tmp_path, monkeypatch):
    """A prompt whose tokens + max_new_tokens + a block exceed max_position_embeddings is not decoded:
    its cell counts it in skipped_too_long and scores the others."""
    root, target_json, drafter_dir, files = setup
    context = json.loads((root / "target" / "model" / "config.json").read_text())["max_position_embeddings"]
    rows = load_benchmark(files["gsm8k"], "gsm8k")
    rows[1]["turns"] = [" ".join(["word"] * context)]
    long_files = {"gsm8k": tmp_path / "gsm8k.jsonl"}
    atomic_write_jsonl(long_files["gsm8k"], rows)
    spec_calls = count_calls(monkeypatch, "speculative_generate")
    summary = evaluate_into(setup, tmp_path, files=long_files)
    assert len(spec_calls) == len(TEMPERATURES) + len(TEMPERATURES)  # warm-ups + g0 at each temperature
    assert [(row["num_prompts"], row["skipped_too_long"], row["num_requests"]) for row in summary] == [(1, 1, 1)] * 2
    again = evaluate_into(setup, tmp_path, files=long_files)  # resumed: still counted, nothing decoded
    assert len(spec_calls) == 2 * len(TEMPERATURES) and [r["skipped_too_long"] for r in again] == [1, 1]


# ---------------------------------------------------------------------------
# EvalConfig: the eval section, its defaults and enums from the schema (issue 51)
# ---------------------------------------------------------------------------


def test_eval_config_takes_every_eval_key_its_default_and_its_enum_from_the_schema():
    import dataclasses

    from dpace.evaluation.decoding import _check_args
    from dpace.evaluation.eval_config import EvalConfig
    from dpace.schema import load_schema, schema_defaults

    section = load_schema()["properties"]["eval"]
    required = {"backend": "local", "temperatures": [0.0], "verification": "hard-match", "max_new_tokens": 4}
    config = EvalConfig.from_config(required, seed=0)
    fields = {f.name for f in dataclasses.fields(EvalConfig)}
    assert set(section["properties"]) <= fields and fields - set(section["properties"]) == {"seed"}
    assert {key: getattr(config, key) for key in schema_defaults("eval")} == schema_defaults("eval")
    assert config.key()["greedy_tie_margin"] == section["properties"]["greedy_tie_margin"]["default"]
    for name, spec in section["properties"].items():
        for value in spec.get("enum", []):  # every value the schema allows is taken ...
            EvalConfig.from_config({**required, name: value}, seed=0)
        if "enum" in spec:  # ... and any other refused, by the key's name
            with pytest.raises(ValueError, match=rf"eval\.{name} must be one of"):
                EvalConfig.from_config({**required, name: "nonsense"}, seed=0)
    for verification in section["properties"]["verification"]["enum"]:  # the decoder knows each of them
        for clock in section["properties"]["decode_clock"]["enum"]:
            _check_args(4, 1.0, verification, clock)
    records = [{"benchmark": "b", "id": "0", "temperature": 0.0, "verification": "hard-match", "prompt_index": 0,
                "block_size": 2, "turns": [{"turn": 0, "ar": None, "spec": None, "acceptance_lengths": [1],
                                            "block_lengths": [2], "greedy": None}]}]
    assert [summarize(records, tau_counts=t)[0]["tau"] for t in section["properties"]["tau_counts"]["enum"]] == [2, 1]
    with pytest.raises(ValueError, match="unknown evaluation setting"):
        EvalConfig.from_config({**required, "tie_margin": 0.5}, seed=0)  # the schema's names only


def test_run_requests_resumes_appends_skips_and_selects_in_the_plans_order(tmp_path):
    """The one skeleton every measurement runs on: a killed run keeps what it finished, a rerun handles only
    the rest (a session opened only when something is pending), a request that does not fit is recorded
    as skipped without being handled, and the records come back in the plan's order with the job's key."""
    import contextlib

    from dpace.evaluation.eval_records import evaluation_plan, keyed_by
    from dpace.evaluation.requests import Records, RequestHandler, RequestRecord, run_requests

    benchmarks = {"a": [{"id": "0", "turns": ["x"]}, {"id": "1", "turns": ["y", "w"]}], "b": [{"id": "0", "turns": ["z"]}]}
    plan = evaluation_plan(benchmarks, [0.0, 1.0])

    class Handler(RequestHandler):
        verification = "v"

        def __init__(self, die_after=None):
            self.handled, self.sessions, self.die_after = [], 0, die_after

        def fits(self, request):
            return request.row["turns"] != ["z"]

        @contextlib.contextmanager
        def session(self, pending):
            self.sessions += 1
            yield

        def __call__(self, batch):
            if self.die_after is not None and len(self.handled) == self.die_after:
                raise KeyboardInterrupt
            self.handled += [(r.benchmark, r.temperature, r.row["id"]) for r in batch]
            return [RequestRecord.of(r, "v", [{"turn": i} for i in range(len(r.row["turns"]))]) for r in batch]

    path, made, key = tmp_path / "records.jsonl", {"setting": 1}, keyed_by("v")
    killed = Handler(die_after=2)
    with pytest.raises(KeyboardInterrupt):
        run_requests(plan, Records(path, made), key, killed)
    resumed = Handler()
    records = run_requests(plan, Records(path, made), key, resumed)
    assert killed.handled == [("a", 0.0, "0"), ("a", 0.0, "1")]
    assert resumed.handled == [("a", 1.0, "0"), ("a", 1.0, "1")] and resumed.sessions == 1
    assert [(r["benchmark"], r["temperature"], r["id"], r.get("skipped")) for r in records] == [
        ("a", 0.0, "0", None), ("a", 0.0, "1", None), ("a", 1.0, "0", None), ("a", 1.0, "1", None),
        ("b", 0.0, "0", "too_long"), ("b", 1.0, "0", "too_long")]
    assert all(r["setting"] == 1 and r["verification"] == "v" for r in records)
    assert [len(r["turns"]) for r in records] == [1, 2, 1, 2, 0, 0]
    again = Handler()
    assert run_requests(plan, Records(path, made), key, again) == records and again.sessions == 0
    stale = Handler()  # another setting: every record is stale, every request measured again
    run_requests(plan, Records(path, {"setting": 2}), key, stale)
    assert len(stale.handled) == 4
