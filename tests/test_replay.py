"""Replayed tau (dpace.evaluation.replay) against real speculative decoding, on a tiny random target.

A random drafter accepts nothing (every step 1), which would make equality trivial, so the drafter
here is trained for a few steps on the target's own keyed samples with ``block_logits`` (the same
block attention replay scores with): it then accepts 0 to B - 1 drafts per step, and replay must
reproduce every step of decoding, at T = 0 and T = 1, causal-windowed and full attention, with the
last block cut at ``max_new_tokens``. The evaluation's exactness check must catch a replay whose
features are shifted by one position or whose length cap is off by one.
"""

from __future__ import annotations

import json

import pytest
import torch
from eval_calls import evaluate as evaluate_drafter
from eval_calls import measure

import dpace.evaluation.evaluate as evaluation
import dpace.evaluation.timing_run as timing_run
from dpace.evaluation.decoding import speculative_generate
from dpace.evaluation.eval_config import EvalConfig
from dpace.evaluation.evaluate import ReplayMismatch
from dpace.evaluation.replay import (
    block_logits,
    compare_replay,
    needed_context_start,
    reference_turn,
    replay_turn,
    target_features,
)
from dpace.evaluation.timing_run import TimingSettings, time_interleaved
from dpace.io import DamagedFile, atomic_write_jsonl, record_checksums
from dpace.targets import chat_prompt_ids, load_target, prepare_target, stop_token_ids
from dpace.training.drafter import drafter_config, load_drafter, save_drafter

MAX_NEW = 14  # not a multiple of the block's step: the last block is cut at the cap
BLOCK = 4
PROMPTS = ["What is 2 + 3?", "Write a haiku.", "Name a color please."]


# Tiny models gain nothing from threads (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def references(target, tokenizer, drafter, temperature):
    stops = stop_token_ids(tokenizer)
    out = []
    for i, text in enumerate(PROMPTS):
        prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])
        # the keys the evaluation below samples gsm8k's T = 1 answers with (seed 3): the drafter learns those
        key = evaluation._seed_for(3, "gsm8k", f"g{i}", 0, 1.0) if temperature > 0 else None
        answer, continuation = reference_turn(target, prompt, temperature=temperature, sampling_key=key,
                                              stop_token_ids=stops, max_new_tokens=MAX_NEW, overrun=BLOCK - 1)
        start = needed_context_start(drafter, len(prompt))
        features = target_features(target, prompt + answer.new_token_ids, drafter.target_layer_ids, start).clone()
        out.append((key, prompt, answer.new_token_ids, continuation, features, start))
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target and a windowed drafter trained to partly predict the target's samples."""
    from dflash.model import DFlashDraftModel

    root = tmp_path_factory.mktemp("replay")
    target_json = prepare_target({"source": "random", "hidden_size": 64, "intermediate_size": 128, "num_layers": 4,
                                  "logit_scale": 4.0}, root / "target")
    target, tokenizer = load_target(target_json)
    config = drafter_config(target.config, depth=1, block_size=BLOCK, target_layer_ids=[1, 2], mask_token_id=0,
                            sliding_window=3)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    drafter = DFlashDraftModel(config)
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    data = references(target, tokenizer, drafter, 1.0)
    optimizer = torch.optim.Adam(drafter.parameters(), lr=2e-2)
    for _ in range(20):
        loss = 0.0
        for _, prompt, answer, continuation, features, start in data:
            sequence = torch.tensor(prompt + answer + continuation)
            anchors = len(prompt) + torch.arange(len(answer) - 1)
            logits, targets, _ = block_logits(drafter, target, features, start, sequence, anchors, len(prompt), MAX_NEW)
            known = targets >= 0
            loss = loss + torch.nn.functional.cross_entropy(logits[known], targets[known])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_drafter(drafter, root / "drafter")
    # the same drafter proposing from a draft vocabulary: its answer tokens and every third other token
    seen = {token for _, _, answer, continuation, _, _ in data for token in answer + continuation}
    drafter.config.draft_vocab = sorted(seen | set(range(0, target.config.vocab_size, 3)))
    save_drafter(drafter, root / "drafter-vocab")
    # a draft vocabulary of one token, as answers that repeat one token build: no runner-up logit
    answers = [token for _, _, answer, _, _, _ in data for token in answer]
    drafter.config.draft_vocab = [max(set(answers), key=answers.count)]
    save_drafter(drafter, root / "drafter-one-token")
    return root, target_json, root / "drafter"


@pytest.mark.parametrize("shape", ["sliding-causal", "full-bidirectional", "draft-vocab", "one-token"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_replayed_steps_equal_speculative_decoding(trained, temperature, shape):
    root, target_json, drafter_dir = trained
    target, tokenizer = load_target(target_json)
    folders = {"draft-vocab": "drafter-vocab", "one-token": "drafter-one-token"}
    drafter = load_drafter(drafter_dir.with_name(folders.get(shape, drafter_dir.name)))
    if shape == "full-bidirectional":  # the same weights as a full-attention drafter: bidirectional inside the block
        config = drafter.config
        config.layer_types = ["full_attention"] * config.num_hidden_layers
        config.use_sliding_window, config.sliding_window = False, None
        save_drafter(drafter.__class__(config), root / "full")
        full = load_drafter(root / "full")
        full.load_state_dict(drafter.state_dict())
        drafter = full
    stops = stop_token_ids(tokenizer)
    accepted = []
    for key, prompt, answer, continuation, features, start in references(target, tokenizer, drafter, temperature):
        replayed = replay_turn(drafter, target, features, start, prompt, answer, continuation,
                               max_new_tokens=MAX_NEW, stop_token_ids=stops)
        decoded = speculative_generate(drafter, target, prompt, max_new_tokens=MAX_NEW, stop_token_ids=stops,
                                       temperature=temperature, sampling_key=key)
        assert decoded.new_token_ids == answer  # keyed sampling: the output does not depend on the drafter
        assert replayed.block_lengths == decoded.block_lengths
        assert replayed.acceptance_lengths == decoded.acceptance_lengths
        assert [b.emitted for b in replayed.blocks] == [b.emitted for b in decoded.blocks]
        for ours, theirs in zip(replayed.blocks, decoded.blocks, strict=True):
            assert len(ours.q) == len(theirs.q)  # the cut last block has fewer draft positions
            # up to the first mismatch the target's pick is the answer's token: the same q
            decided = min(ours.accepted + 1, len(ours.q))
            assert ours.q[:decided] == pytest.approx(theirs.q[:decided], rel=1e-4, abs=1e-6)
        accepted += [b.accepted for b in decoded.blocks]
    if temperature > 0 and shape not in ("full-bidirectional", "one-token"):
        # the check is only worth something if steps accept a varying number of drafts
        assert max(accepted) >= 2 and len(set(accepted)) >= 2


def test_compare_replay_verdicts():
    steps = {"block_lengths": [3, 1, 2], "acceptance_lengths": [3, 1, 2]}
    same = compare_replay(steps, dict(steps), greedy_tie_margin=0.5, drafter_margins=[2.0, 2.0, 2.0])
    assert same["verdict"] == "equal"
    other = {"block_lengths": [3, 2, 1], "acceptance_lengths": [3, 2, 1]}
    assert compare_replay(steps, other, greedy_tie_margin=0.5, drafter_margins=[2.0, 2.0, 2.0]) == {
        "verdict": "failure", "step": 1, "position": 3, "margin": 2.0, "cause": "drafter"}
    assert compare_replay(steps, other, greedy_tie_margin=0.5, drafter_margins=[2.0, 0.1, 2.0])["verdict"] == "tie"
    parted = {"first_mismatch": 2, "top2_margin": 0.01}
    assert compare_replay(steps, other, greedy_tie_margin=0.5, target_divergence=parted)["cause"] == "target"


@pytest.fixture(scope="module")
def evaluation_setup(trained):
    root, target_json, drafter_dir = trained
    files = {"gsm8k": root / "gsm8k.jsonl", "mt-bench": root / "mt.jsonl"}
    atomic_write_jsonl(files["gsm8k"], [{"id": f"g{i}", "benchmark": "gsm8k", "turns": [text]}
                                        for i, text in enumerate(PROMPTS)])
    atomic_write_jsonl(files["mt-bench"], [{"id": "m0", "benchmark": "mt-bench",
                                            "turns": ["Write a haiku.", "Now explain it."]}])
    common = dict(temperatures=[0.0, 1.0], max_new_tokens=MAX_NEW, seed=3)
    measure(target_json, files, records_path=root / "base.records.jsonl", out_path=root / "base.jsonl",
                     overrun=BLOCK - 1, features_path=root / "features.pt", feature_layer_ids=[1, 2],
                     feature_window=3, timed_prompts=2, batch_size=2, **common)
    return root, target_json, drafter_dir, files, common


def test_batched_answers_equal_batch_one_answers(evaluation_setup):
    """Prompts past timed_prompts are answered in batches (untimed): the same tokens as batch-1 decoding."""
    root, target_json, _, files, common = evaluation_setup
    batched = [json.loads(line) for line in (root / "base.jsonl").read_text().splitlines()]
    assert [r["turns"][0]["ar"] is None for r in batched if r["benchmark"] == "gsm8k"] == [False, False, True] * 2
    one = measure(target_json, files, records_path=root / "one.records.jsonl", out_path=root / "one.jsonl",
                           overrun=BLOCK - 1, **common)
    def answers(records):
        return [[(t["new_token_ids"], t["continuation_ids"]) for t in r["turns"]] for r in records]
    assert answers(batched) == answers(one)


def evaluate(setup, out, **kwargs):
    root, target_json, drafter_dir, files, common = setup
    kwargs = {"features_path": root / "features.pt", **kwargs}
    return evaluate_drafter(target_json, drafter_dir, files, verification="hard-match", records_path=out / "r.jsonl",
                            summary_path=out / "summary.json", blocks_path=out / "blocks.csv", tau="replay",
                            reference_path=root / "base.jsonl", decoded_prompts_per_benchmark=2, **common, **kwargs)


def test_replayed_evaluation_checks_every_decoded_request(evaluation_setup, tmp_path):
    summary = evaluate(evaluation_setup, tmp_path)
    # decoded: the first 2 prompts of each benchmark, each at one temperature taken in turn (EvalConfig.decodes):
    # gsm8k (ranked 0) prompt 0 at T = 0 and prompt 1 at T = 1; mt-bench (ranked 1) its one prompt (two turns) at T = 1
    decoded = {("gsm8k", 0.0): 1, ("gsm8k", 1.0): 1, ("mt-bench", 0.0): 0, ("mt-bench", 1.0): 2}  # decoded turns
    assert {(row["benchmark"], row["temperature"]) for row in summary} == set(decoded)
    for row in summary:
        turns = decoded[row["benchmark"], row["temperature"]]
        check = row["replay_check"]
        if turns == 0:
            assert check is None
        else:
            assert check["requests_compared"] == turns and check["failures"] == 0
            assert check["equal"] == turns  # fp32: not even a near-tie
        # the decoded requests are the exactness check only: nothing timed against the target (SR: timing_run)
        assert row["tau_source"] == "replay" and row["num_timed_requests"] == 0 and row["speedup"] is None
        assert row["num_requests"] == (3 if row["benchmark"] == "gsm8k" else 2)  # MT-Bench: one prompt's two turns
        assert [r["spec_tpot_s"] is None for r in row["requests"]].count(True) == row["num_requests"] - turns
        assert all(r["ar_tpot_s"] is None for r in row["requests"])
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert any(b["accepted"] > 0 for r in records for t in r["turns"] for b in t["blocks"])
    assert (tmp_path / "blocks.csv").read_text().count("\n") == 1 + sum(
        len(t["blocks"]) for r in records for t in r["turns"])


def test_features_recomputed_without_a_shared_file_give_the_same_records(evaluation_setup, tmp_path, monkeypatch):
    calls = []
    original = evaluation.target_features
    monkeypatch.setattr(evaluation, "target_features", lambda *a, **k: calls.append(1) or original(*a, **k))
    shared = evaluate(evaluation_setup, tmp_path / "shared")
    assert not calls  # every request's features came from the baseline job's file
    empty = tmp_path / "empty.pt"
    torch.save({"layer_ids": [], "dtype": "float32", "features": {}}, empty)  # share_features=False writes this
    record_checksums(empty)
    recomputed = evaluate(evaluation_setup, tmp_path / "recomputed", features_path=empty)
    assert len(calls) == 2 * 3 + 2 * 2  # gsm8k's 3 prompts and MT-Bench's 2 turns, at T = 0 and 1
    assert [r["tau"] for r in recomputed] == [r["tau"] for r in shared]
    assert (tmp_path / "shared" / "blocks.csv").read_text() == (tmp_path / "recomputed" / "blocks.csv").read_text()


def test_a_baseline_or_features_file_changed_after_its_job_is_refused_naming_it(evaluation_setup, tmp_path):
    """Issue 56: the baseline's answers and its shared features are read by content: a flipped byte after the
    baseline job wrote them is refused, naming the file and what to delete; so is a file no job recorded."""
    root, target_json, drafter_dir, files, common = evaluation_setup
    copies = {name: tmp_path / "answers" / name for name in ("base.jsonl", "features.pt")}
    copies["base.jsonl"].parent.mkdir()
    for name, copy in copies.items():
        copy.write_bytes((root / name).read_bytes())
    record_checksums(*copies.values())

    def run(out: str):
        return evaluate_drafter(target_json, drafter_dir, files, verification="hard-match", tau="replay",
                                records_path=tmp_path / out / "r.jsonl", summary_path=tmp_path / out / "summary.json",
                                blocks_path=tmp_path / out / "blocks.csv", reference_path=copies["base.jsonl"],
                                features_path=copies["features.pt"], decoded_prompts_per_benchmark=2, **common)

    assert [r["tau"] for r in run("intact")] == [r["tau"] for r in evaluate(evaluation_setup, tmp_path / "original")]
    for name, copy in copies.items():
        intact = copy.read_bytes()
        flipped = bytearray(intact)
        flipped[len(flipped) // 2] ^= 1
        copy.write_bytes(bytes(flipped))
        with pytest.raises(DamagedFile, match=rf"{name}: changed since the autoregressive baseline wrote it.*"
                                              rf"delete \S*{name} and rerun"):
            run(f"flipped-{name}")
        assert not (tmp_path / f"flipped-{name}" / "summary.json").exists()
        copy.write_bytes(intact)
    (tmp_path / "answers" / "checksums.json").unlink()
    with pytest.raises(DamagedFile, match="base.jsonl: no checksums.json beside it"):
        run("unrecorded")


def shifted_features(replay):
    def broken(drafter, target, features, start, *args, **kwargs):
        return replay(drafter, target, features[1:], start, *args, **kwargs)  # feature j read as j - 1's
    return broken


def anchors_off_by_one(replay):
    def broken(drafter, target, features, start, prompt, answer, continuation, *, max_new_tokens, **kwargs):
        # the walk starts one token late: every anchor is the next answer position
        return replay(drafter, target, features, start, list(prompt) + list(answer[:1]), answer[1:], continuation,
                      max_new_tokens=max_new_tokens - 1, **kwargs)
    return broken


@pytest.mark.parametrize("mutation", [shifted_features, anchors_off_by_one])
def test_exactness_check_catches_a_broken_replay(evaluation_setup, tmp_path, monkeypatch, mutation):
    monkeypatch.setattr(evaluation, "replay_turn", mutation(evaluation.replay_turn))
    with pytest.raises(ReplayMismatch, match=r"gsm8k T=\d g\d turn 0, step \d+ at answer position \d+"):
        evaluate(evaluation_setup, tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_speedup_interval_resamples_the_decoded_prompts_only():
    """Replayed tau: every prompt has a tau, only the decoded ones a time; SR and its interval come from those."""
    from dpace.report.intervals import paired_bootstrap

    def requests(taus, times):
        return [{"id": f"p{i}", "tau": tau, "ar_tpot_s": None if i >= len(times) else 1.0,
                 "spec_tpot_s": None if i >= len(times) else times[i]} for i, tau in enumerate(taus)]

    ours = {"b": requests([1.5, 1.6, 1.4, 1.7, 1.5, 1.5], [0.5, 0.7])}
    theirs = {"b": requests([1.4, 1.5, 1.4, 1.5, 1.5, 1.5], [0.6, 0.8])}
    rows = {(r["benchmark"], r["metric"]): r for r in paired_bootstrap(ours, theirs, resamples=400)}
    tau, speedup = rows[("b", "tau")], rows[("b", "speedup")]
    assert tau["num_prompts"] == 6 and speedup["num_prompts"] == 2
    assert tau["value"] == pytest.approx(9.2 / 6)
    assert speedup["value"] == pytest.approx(2 / 1.2) and speedup["reference_value"] == pytest.approx(2 / 1.4)
    # resampling all six prompts would often draw none of the two timed ones: no interval at all
    assert speedup["ci_low"] <= speedup["difference"] <= speedup["ci_high"]


def test_the_timing_job_times_in_its_own_precision_and_else_in_the_evaluations(evaluation_setup, monkeypatch):
    """timing.dtype: the target and every drafter of the SR timing job load in it (bfloat16 here, as the
    paper times), while tau stays replayed in eval.dtype; unset, the timing job takes eval.dtype."""
    root, target_json, drafter_dir, files, common = evaluation_setup
    loaded = []
    for name in ("load_target", "load_drafter"):
        original = getattr(timing_run, name)
        monkeypatch.setattr(timing_run, name, lambda *a, _f=original, _n=name, **k: loaded.append((_n, k["dtype"]))
                            or _f(*a, **k))
    config = EvalConfig.from_config({"temperatures": [0.0], "max_new_tokens": MAX_NEW, "dtype": "float32",
                                    "verification": "hard-match"}, seed=3)
    for setting, expected in ((None, torch.float32), ("bfloat16", torch.bfloat16)):
        loaded.clear()
        frame = time_interleaved(target_json, {"d": drafter_dir}, files, config,
                                 TimingSettings(prompts_per_benchmark=1, repeats=1, dtype=setting), log=lambda _: None)
        assert loaded == [("load_target", expected), ("load_drafter", expected)]
        # the target alone and the drafter, on gsm8k's first prompt and MT-Bench's two turns
        assert sorted(frame.groupby("drafter").size().items()) == [("autoregressive", 3), ("d", 3)]
        assert (frame["num_output_tokens"] > 0).all()
