"""Emitted length tau and wall-clock speedup SR of a drafter on benchmark prompts, as DFlash measures them.

For every benchmark, temperature and prompt, the target decodes speculatively with the drafter and
autoregressively on its own (after one short warm-up). Every turn of a prompt is one request:

* SR  = mean autoregressive time per output token / mean speculative time per output token,
* tau = mean over requests of the request's mean emitted length per step (bonus included),
* acceptance histogram = fraction of all verification steps that emitted 0, 1, ..., B tokens.

Two choices follow DFlash's benchmark by default and are named settings (``TAU_COUNTS``,
``dpace.evaluation.decoding.DECODE_CLOCKS``) because dflash 0.1.0 on PyPI changed both: what a step's length is
when a stop token ends the output inside it, and whether the first draft call is decode time.

MT-Bench style rows have several turns: each turn is appended after the model's own (speculative)
answer to the previous one, as DFlash's benchmark does. At T = 0 the speculative output is compared
token for token with the greedy one. Generated text (HumanEval/MBPP code included) is only ever
decoded to text for the next turn's prompt, never executed.

The autoregressive half does not depend on the drafter. ``measure_baseline`` runs it once per target
and every drafter's evaluation reads it (``baseline_path``), so all drafters are compared against the
same baseline times: their SR differences then come from their own decoding only, not from the
baseline's run-to-run jitter, and each evaluation skips about a third of its work. Without a
baseline file each evaluation times the target itself, prompt by prompt, in the same process.

With ``tau="replay"`` (``eval.tau``, the default) tau comes from every prompt without decoding it:
the target's answers and features (``measure_baseline``, once per target) are replayed by each drafter
(``dpace.evaluation.replay``), and only the first ``decoded_prompts_per_benchmark`` prompts of each benchmark are decoded for
real, each at one temperature (``EvalConfig.decodes``; SR comes from the timing jobs), and their steps are compared
with the replayed ones, a difference beyond a near-tie failing the job (``ReplayMismatch``). At T > 0 hard-match samples the target keyed by
request and position, so the decoded and the replayed answer are the same sample.

The job is resumable (``dpace.evaluation.requests.run_requests``): one record per finished prompt is
appended to ``records_path``, keyed by the prompt's text and the job's settings and inputs, and prompts
already recorded are skipped on a rerun; a prompt that could run past the target's context is skipped and
counted (``skipped_too_long``). The summary (JSON) and per-block table (CSV) are written atomically from
all records at the end. Each measurement is one handler (``_Decode``, ``_Replay``, ``_Baseline``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import zlib
from collections.abc import Iterable
from dataclasses import asdict
from functools import partial
from itertools import groupby
from pathlib import Path

import torch
from tqdm import tqdm

from dpace.evaluation.decoding import (
    autoregressive_generate,
    compare_to_greedy,
    speculative_generate,
    surrogate,
)
from dpace.evaluation.eval_config import (  # noqa: F401 (re-exported: the evaluation's public names)
    GREEDY_TIE_MARGIN,
    TAU_COUNTS,
    TAU_SOURCES,
    EvalConfig,
    ReferenceSettings,
)
from dpace.evaluation.eval_records import (  # noqa: F401 (re-exported: the evaluation's public names)
    BLOCK_COLUMNS,
    TOO_LONG,
    WARMUP_TOKENS,
    Request,
    divergence_verdict,
    evaluation_plan,
    exceeds_context,
    keyed_by,
    load_benchmark,
    prompt_checksum,
    summarize,
)
from dpace.evaluation.replay import (
    batched_answers,
    compare_replay,
    needed_context_start,
    reference_turn,
    replay_turn,
    target_features,
)
from dpace.evaluation.requests import (
    BaselineTurn,
    Conversation,
    DecodedTurn,
    Records,
    ReplayedTurn,
    RequestHandler,
    RequestRecord,
    converse,
    run_requests,
)
from dpace.evaluation.target_answers import (  # noqa: F401 (re-exported)
    TargetAnswers,
    atomic_save_torch,
    baseline_key,
    feature_key,
    load_baseline,
    load_features,
    shared_answers,
)
from dpace.features import default_target_layer_ids
from dpace.io import (
    atomic_write_json,
    atomic_write_jsonl,
    atomic_write_text,
    input_checksum,
    record_checksums,
)
from dpace.targets import chat_prompt_ids, load_target, stop_token_ids, target_checksum
from dpace.training.drafter import check_drafter_matches_target, load_drafter

# The baseline's records are keyed like an evaluation's, with this in place of a verification rule.
BASELINE = "autoregressive"


def _seed_for(seed: int, *parts) -> int:
    """A per-request seed, the same whether a run is fresh or resumed."""
    return zlib.crc32(repr((seed, *parts)).encode()) & 0x7FFFFFFF


def _request_seed(seed: int, request: Request, turn_index: int) -> int:
    return _seed_for(seed, request.benchmark, str(request.row["id"]), turn_index, float(request.temperature))


def _generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _timing(result) -> dict:
    return {
        "num_input_tokens": result.num_input_tokens,
        "num_output_tokens": result.num_output_tokens,
        "time_to_first_token_s": result.time_to_first_token_s,
        "decode_time_s": result.decode_time_s,
        "time_per_output_token_s": result.time_per_output_token_s,
    }


def _blocks(result) -> list[dict]:
    return [{"accepted": b.accepted, "emitted": b.emitted, "q": b.q} for b in result.blocks]


def _prompt_fingerprint(prompt_ids) -> int:
    """Identifies a turn's prompt tokens, so that a baseline turn is only compared with the same prompt."""
    return zlib.crc32(repr([int(t) for t in prompt_ids]).encode())


def _sampling_key(temperature, verification, request_seed) -> int | None:
    """Hard-match at T > 0 samples the target keyed by (request, position) (``dpace.evaluation.decoding.keyed_gumbel``):
    the speculative output then equals the autoregressive one token for token, which replay needs."""
    return request_seed if temperature > 0 and verification in ("hard-match", BASELINE) else None


def _autoregressive(target, prompt_ids, temperature, request_seed, *, stops, max_new_tokens, device):
    return autoregressive_generate(
        target, prompt_ids, max_new_tokens=max_new_tokens, stop_token_ids=stops,
        temperature=temperature, generator=_generator(device, request_seed),
        sampling_key=_sampling_key(temperature, BASELINE, request_seed),
    )


class _Local(RequestHandler):
    """What the in-process handlers share: the target (and drafter) loaded once a request is pending, the
    context check, the warm-up and the multi-turn loop."""

    def __init__(self, target_json, config: EvalConfig, device: str, drafter_dir=None):
        self.target_json, self.config, self.device, self.drafter_dir = target_json, config, device, drafter_dir
        self.target = self.tokenizer = self.stops = self.drafter = None

    def load(self) -> None:
        if self.target is not None:
            return
        dtype = getattr(torch, self.config.dtype)
        self.target, self.tokenizer = load_target(self.target_json, device=self.device, dtype=dtype)
        if self.drafter_dir is not None:
            self.drafter = load_drafter(self.drafter_dir, dtype=dtype).to(self.device)
            check_drafter_matches_target(self.drafter.config, self.target.config)
        self.stops = stop_token_ids(self.tokenizer)

    def block_size(self) -> int | None:
        return None if self.drafter is None else int(self.drafter.block_size)

    def fits(self, request: Request) -> bool:
        self.load()
        return not exceeds_context(self.tokenizer, request.row, max_new_tokens=self.config.max_new_tokens,
                                   block_size=self.block_size() or 0,
                                   context=int(self.target.config.max_position_embeddings))

    def skipped(self, request: Request) -> RequestRecord:
        return RequestRecord.of(request, self.verification, [], block_size=self.block_size(), skipped=TOO_LONG)

    def warm_up(self, text: str, *, autoregressive: bool = True) -> None:
        """One short untimed run per temperature, so first-call costs stay out of the measurements."""
        prompt_ids = chat_prompt_ids(self.tokenizer, [{"role": "user", "content": text}])
        for temperature in sorted(set(self.config.temperatures)):
            generator = _generator(self.device, 0)
            if autoregressive:
                autoregressive_generate(self.target, prompt_ids, max_new_tokens=WARMUP_TOKENS, stop_token_ids=self.stops,
                                        temperature=temperature, generator=generator)
            if self.drafter is not None:
                speculative_generate(self.drafter, self.target, prompt_ids, max_new_tokens=WARMUP_TOKENS,
                                     stop_token_ids=self.stops, temperature=temperature,
                                     verification=self.verification, generator=generator)

    def converse(self, request: Request, answer) -> list:
        return converse(self.tokenizer, request.row["turns"], answer, chat_prompt_ids)


class _Decode(_Local):
    """Every turn decoded speculatively; the autoregressive times and greedy tokens from ``baseline`` (the
    request's ``measure_baseline`` record) when given, else decoded here, prompt by prompt."""

    def __init__(self, target_json, drafter_dir, config: EvalConfig, device: str, baseline: dict | None):
        super().__init__(target_json, config, device, drafter_dir)
        self.verification, self.baseline = config.verification, baseline

    @contextlib.contextmanager
    def session(self, pending):
        self.load()
        self.warm_up(pending[0].row["turns"][0], autoregressive=self.baseline is None)
        yield

    def __call__(self, batch):
        return [self.decode(request) for request in batch]

    def decode(self, request: Request) -> RequestRecord:
        base = None if self.baseline is None else self.baseline[baseline_key(*request[:2], request.row)]
        turns = self.converse(request, partial(self._turn, request, base))
        return RequestRecord.of(request, self.verification, turns, block_size=self.block_size())

    def _turn(self, request: Request, base: dict | None, turn_index: int, prompt_ids) -> tuple[DecodedTurn, list]:
        config, temperature = self.config, request.temperature
        request_seed = _request_seed(config.seed, request, turn_index)
        run_ar = partial(_autoregressive, self.target, prompt_ids, temperature, request_seed, stops=self.stops,
                         max_new_tokens=config.max_new_tokens, device=self.device)
        ar_timing, greedy_ids = self._autoregressive_half(request, base, turn_index, prompt_ids, run_ar)
        spec = speculative_generate(
            self.drafter, self.target, prompt_ids, max_new_tokens=config.max_new_tokens, stop_token_ids=self.stops,
            temperature=temperature, verification=self.verification,
            generator=_generator(self.device, request_seed + 1), decode_clock=config.decode_clock,
            sampling_key=_sampling_key(temperature, self.verification, request_seed))
        turn = DecodedTurn(turn=turn_index, ar=ar_timing, spec=_timing(spec), acceptance_lengths=spec.acceptance_lengths,
                           block_lengths=spec.block_lengths, blocks=_blocks(spec), greedy=None,
                           new_token_ids=spec.new_token_ids, prompt_fingerprint=_prompt_fingerprint(prompt_ids))
        if temperature == 0:
            if greedy_ids is None:  # this prompt is not the baseline's: its greedy answer is decoded here
                greedy_ids = run_ar().new_token_ids
            turn.greedy = compare_to_greedy(spec.new_token_ids, greedy_ids, self.target, prompt_ids)
        return turn, spec.new_token_ids

    @staticmethod
    def _autoregressive_half(request, base, turn_index, prompt_ids, run_ar) -> tuple[dict, list | None]:
        """(timing, greedy tokens or None) of the target alone: decoded here, or the baseline's."""
        if base is None:
            ar = run_ar()
            return _timing(ar), ar.new_token_ids
        base_turn, fingerprint = base["turns"][turn_index], _prompt_fingerprint(prompt_ids)
        if turn_index == 0 and base_turn["prompt_fingerprint"] != fingerprint:
            raise ValueError(f"the shared baseline timed another prompt for {request.benchmark} {request.row['id']}")
        if base_turn["ar"] is None:
            raise ValueError(f"the shared baseline did not time {request.benchmark} {request.row['id']} "
                             "(its timed_prompts)")
        # A later turn's prompt holds the speculative answer to the one before; it is the baseline's
        # own answer unless the two parted (a near-tie in bf16), and only then the tokens differ.
        return base_turn["ar"], base_turn["new_token_ids"] if base_turn["prompt_fingerprint"] == fingerprint else None


class _Replay(_Decode):
    """Every turn's steps replayed over the target's answer (``references``); the requests
    ``config.decodes`` names (one temperature each) also decoded for real (speculatively only, untimed: SR is the timing
    job's) and checked step for step."""

    def __init__(self, target_json, drafter_dir, config, device, baseline, references: dict, features_path,
                 compare_steps, benchmarks):
        super().__init__(target_json, drafter_dir, config, device, baseline)
        self.references, self.features_path, self.compare_steps = references, features_path, compare_steps
        self.features = {}
        self.benchmark_ranks = {name: rank for rank, name in enumerate(sorted(benchmarks))}

    def decodes(self, request: Request) -> bool:
        return self.config.decodes(self.benchmark_ranks[request.benchmark], request.index, request.temperature)

    @contextlib.contextmanager
    def session(self, pending):
        self.load()
        if any(self.decodes(request) for request in pending):
            self.warm_up(pending[0].row["turns"][0], autoregressive=False)
        self.features = load_features(self.features_path, self.drafter)
        yield

    def _autoregressive_half(self, request, base, turn_index, prompt_ids, run_ar) -> tuple[None, list | None]:
        """Nothing is timed here (SR: ``dpace.evaluation.timing_run``): the greedy reference of the lossless check
        is the target's reference answer (batch-1, as decoding's) where the turn's prompt is the reference's."""
        reference = self.references[baseline_key(*request[:2], request.row)]["turns"][turn_index]
        same = reference["prompt_fingerprint"] == _prompt_fingerprint(prompt_ids)
        return None, reference["new_token_ids"] if same and request.temperature == 0 else None

    def __call__(self, batch):
        return [self.replay(request) for request in batch]

    def replay(self, request: Request) -> RequestRecord:
        reference = self.references[baseline_key(*request[:2], request.row)]
        first = chat_prompt_ids(self.tokenizer, [{"role": "user", "content": request.row["turns"][0]}])
        if reference["turns"][0]["prompt_ids"] != first:
            raise ValueError(f"the reference answers were made for another prompt of {request.benchmark} "
                             f"{request.row['id']}")
        replays = [self._replay_turn(reference, ref_turn) for ref_turn in reference["turns"]]
        turns = [turn for turn, _ in replays]
        if self.decodes(request):
            self._check(request, reference, replays, self.decode(request).turns)
        return RequestRecord.of(request, self.verification, turns, block_size=self.block_size())

    def _replay_turn(self, reference: dict, ref_turn: dict):
        prompt_ids, answer_ids = ref_turn["prompt_ids"], ref_turn["new_token_ids"]
        stored = self.features.get(feature_key(reference, ref_turn["turn"]))
        needed = needed_context_start(self.drafter, len(prompt_ids))
        if stored is not None and stored[0] <= needed:
            start, feats = stored[0], stored[1].to(device=self.device, dtype=self.target.dtype)
        else:
            start = needed
            feats = target_features(self.target, prompt_ids + answer_ids, self.drafter.target_layer_ids, start)
        replayed = replay_turn(self.drafter, self.target, feats, start, prompt_ids, answer_ids,
                               ref_turn.get("continuation_ids", []), max_new_tokens=self.config.max_new_tokens,
                               stop_token_ids=self.stops)
        turn = ReplayedTurn(turn=ref_turn["turn"], ar=None, spec=None, acceptance_lengths=replayed.acceptance_lengths,
                            block_lengths=replayed.block_lengths, blocks=_blocks(replayed), greedy=None)
        return turn, replayed

    def _check(self, request: Request, reference: dict, replays: list, decoded: list[DecodedTurn]) -> None:
        """The decoded turns' times and lossless check, and each one's exactness check against its replay."""
        previous = None
        for (turn, replayed), ref_turn, real in zip(replays, reference["turns"], decoded, strict=True):
            turn.ar, turn.spec, turn.greedy = real.ar, real.spec, real.greedy
            if real.prompt_fingerprint != ref_turn["prompt_fingerprint"]:
                # the previous turn's answer parted from the reference: this turn's prompt is another one
                check = {**previous, "cause": "previous turn"}
            else:
                key = _sampling_key(request.temperature, self.verification,
                                    _request_seed(self.config.seed, request, ref_turn["turn"]))
                divergence = compare_to_greedy(real.new_token_ids, ref_turn["new_token_ids"], self.target,
                                               ref_turn["prompt_ids"], temperature=request.temperature, sampling_key=key)
                check = self.compare_steps(asdict(turn), asdict(real), greedy_tie_margin=self.config.greedy_tie_margin,
                                           target_divergence=divergence, drafter_margins=replayed.margins)
            turn.replay_check = previous = check


class _Baseline(_Local):
    """The target decoding alone: its answers (greedy at T = 0, keyed samples above), each turn's prompt
    and the continuation past a stop token; timed batch-1 for the first ``reference.timed_prompts``
    prompts, answered in batches (untimed) for the others."""

    verification = BASELINE

    def __init__(self, target_json, config: EvalConfig, reference: ReferenceSettings, device: str):
        super().__init__(target_json, config, device)
        self.reference = reference

    @contextlib.contextmanager
    def session(self, pending):
        self.load()
        self.warm_up(pending[0].row["turns"][0])
        yield

    def timed(self, request: Request) -> bool:
        return self.reference.timed_prompts is None or request.index < self.reference.timed_prompts

    def batches(self, pending):
        """Per benchmark and temperature: the untimed prompts in batches, then the timed ones one by one."""
        size = self.reference.batch_size
        for _, group in groupby(pending, key=lambda request: request[:2]):
            group = list(group)
            untimed = [request for request in group if not self.timed(request)]
            yield from (untimed[start : start + size] for start in range(0, len(untimed), size))
            yield from ([request] for request in group if self.timed(request))

    def __call__(self, batch):
        return [self._timed(batch[0])] if self.timed(batch[0]) else self._batched(batch)

    def _timed(self, request: Request) -> RequestRecord:
        def answer(turn_index, prompt_ids):
            request_seed = _request_seed(self.config.seed, request, turn_index)
            ar, continuation = reference_turn(
                self.target, prompt_ids, temperature=request.temperature, stop_token_ids=self.stops,
                sampling_key=_sampling_key(request.temperature, BASELINE, request_seed),
                max_new_tokens=self.config.max_new_tokens, overrun=self.reference.overrun,
                generator=_generator(self.device, request_seed))
            return BaselineTurn(turn=turn_index, prompt_fingerprint=_prompt_fingerprint(prompt_ids), ar=_timing(ar),
                                new_token_ids=ar.new_token_ids, prompt_ids=[int(t) for t in prompt_ids],
                                continuation_ids=continuation), ar.new_token_ids

        return RequestRecord.of(request, BASELINE, self.converse(request, answer))

    def _batched(self, batch: list[Request]) -> list[RequestRecord]:
        """The batch's answers, turn by turn (every conversation's turn t in one batch), untimed."""
        conversations = [Conversation(self.tokenizer, chat_prompt_ids) for _ in batch]
        turns = [[] for _ in batch]
        temperature = batch[0].temperature
        for turn_index in range(max(len(request.row["turns"]) for request in batch)):
            rows = [i for i, request in enumerate(batch) if turn_index < len(request.row["turns"])]
            prompts = [conversations[i].ask(batch[i].row["turns"][turn_index]) for i in rows]
            keys = [_sampling_key(temperature, BASELINE, _request_seed(self.config.seed, batch[i], turn_index))
                    for i in rows]
            answers = batched_answers(self.target, prompts, temperature=temperature, sampling_keys=keys,
                                      stop_token_ids=self.stops, max_new_tokens=self.config.max_new_tokens,
                                      overrun=self.reference.overrun)
            for i, prompt_ids, (answer, continuation) in zip(rows, prompts, answers, strict=True):
                turns[i].append(BaselineTurn(turn=turn_index, prompt_fingerprint=_prompt_fingerprint(prompt_ids),
                                             ar=None, new_token_ids=answer, prompt_ids=[int(t) for t in prompt_ids],
                                             continuation_ids=continuation))
                conversations[i].answered(token_ids=answer)
        return [RequestRecord.of(request, BASELINE, turns[i]) for i, request in enumerate(batch)]


def measure_baseline(
    target_json,
    benchmark_files: dict[str, str | Path],
    config: EvalConfig,
    *,
    records_path,
    out_path,
    device: str = "cpu",
    features_path=None,
    reference: ReferenceSettings | None = None,
) -> list[dict]:
    """Time the target decoding alone on every request of the evaluation plan; write ``out_path``.

    One record per (benchmark, temperature, prompt), as ``evaluate_drafter`` plans them, each turn
    after the target's own answer to the one before. Per turn: its prompt's tokens and fingerprint,
    the timing and the new tokens (the greedy reference of the lossless check at T = 0; at T > 0 the
    target's sample keyed by request and position, ``_sampling_key``), and the ``overrun`` tokens the
    target picks after a stop token (``dpace.evaluation.replay.reference_turn``): the reference answers replayed
    tau reads. Request seeds are the ones ``evaluate_drafter`` gives its in-process baseline, so both
    sample the same answers. Resumable through ``records_path`` like ``evaluate_drafter``.

    ``config``: the evaluation's settings (its temperatures, max_new_tokens, seed, dtype,
    sampled_prompts_per_benchmark and shared_features are read); ``reference``: how the answers are made.
    ``reference.timed_prompts``: only the first N prompts of each benchmark and temperature are decoded
    batch-1 and timed (the ones an evaluation decodes for real, whose answers its exactness check compares
    with); the others' answers come from ``dpace.evaluation.replay.batched_answers`` in batches of
    ``batch_size``, with ``"ar": None`` (None: every prompt timed).

    ``features_path``: also write the target's context features of every turn's prompt + answer, once for
    every drafter's replay (``_write_features``); ``shared_features=False`` writes it empty.
    """
    reference = reference or ReferenceSettings()
    plan = evaluation_plan(_benchmarks(benchmark_files), config.temperatures, config.sampled_prompts_per_benchmark)
    # Records of another target or other settings are stale: answered again.
    made = {**config.key(), **reference.key(), "verification": BASELINE, "target": target_checksum(target_json),
            "sampling": "keyed"}
    handler = _Baseline(target_json, config, reference, device)
    selected = run_requests(plan, Records(records_path, made), keyed_by(BASELINE), handler)
    if features_path is not None:
        _write_features(features_path, selected, handler, config.shared_features)
    atomic_write_jsonl(out_path, selected)
    # every evaluation verifies both before it reads them (dpace.evaluation.target_answers)
    record_checksums(out_path, *([features_path] if features_path is not None else []))
    return selected


def _benchmarks(benchmark_files: dict[str, str | Path]) -> dict[str, list[dict]]:
    return {name: load_benchmark(path, name) for name, path in benchmark_files.items()}


def _write_features(path, records: list[dict], handler: _Baseline, shared: bool) -> None:
    """The target's context features (``reference.feature_layer_ids``) of every turn's prompt + answer: a
    dict by ``feature_key`` of (first position, [positions, features] tensor in the evaluation's dtype);
    with ``feature_window`` W > 0 only from W positions before the answer (what a sliding-window drafter
    can see), else from position 0. Not ``shared``: an empty file (each evaluation computes its own, one
    target forward per request, for long answers of wide targets whose features would not fit on disk)."""
    dtype, reference = handler.config.dtype, handler.reference
    if not shared:
        atomic_save_torch(path, {"layer_ids": [], "dtype": dtype, "features": {}})
        return
    handler.load()
    layer_ids, window = reference.feature_layer_ids, reference.feature_window
    if layer_ids is None:  # the drafters' default (SpecForge's build_target_layer_ids)
        if reference.num_target_features is None:
            raise ValueError("shared features need feature_layer_ids or num_target_features")
        layer_ids = default_target_layer_ids(handler.target.config.num_hidden_layers, reference.num_target_features)
    features = {}
    for record in tqdm(records, desc="features", unit="prompt"):
        for turn in record["turns"]:
            prompt_ids = turn["prompt_ids"]
            start = 0 if not window else max(0, len(prompt_ids) - int(window) + 1)
            features[feature_key(record, turn["turn"])] = (
                start, target_features(handler.target, prompt_ids + turn["new_token_ids"], layer_ids, start).cpu())
    atomic_save_torch(path, {"layer_ids": list(layer_ids), "dtype": dtype, "features": features})


def blocks_csv(records: Iterable[dict]) -> str:
    """Per verification block: emitted length, sum of q and D-PACE's surrogate (paper's Fig. 1a)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(BLOCK_COLUMNS)
    for record in records:
        block_index = 0
        for turn in record["turns"]:
            for block in turn["blocks"]:
                writer.writerow([
                    record["benchmark"], record["temperature"], record["prompt_index"], block_index,
                    block["emitted"], repr(float(sum(block["q"]))), repr(surrogate(block["q"])), turn["turn"],
                ])
                block_index += 1
    return out.getvalue()


class ReplayMismatch(RuntimeError):
    """Replayed step lengths differ from real speculative decoding beyond a near-tie."""


def evaluate_drafter(
    target_json,
    drafter_dir,
    benchmark_files: dict[str, str | Path],
    config: EvalConfig,
    *,
    records_path,
    summary_path,
    blocks_path,
    device: str = "cpu",
    answers: TargetAnswers | None = None,
    compare_steps=compare_replay,
) -> list[dict]:
    """Evaluate a drafter on every benchmark and temperature of ``config``; return (and write) the summary rows.

    ``config.tau``: "decode" (every request decoded speculatively, as DFlash's benchmark) or "replay":
    every request's steps are replayed over the target's answer (``dpace.evaluation.replay``) from
    ``answers.reference`` (a ``measure_baseline`` file made with an overrun; ``answers.features`` its
    features, recomputed here when absent or made for other layers), and only the first
    ``decoded_prompts_per_benchmark`` prompts of each benchmark, each at one temperature taken in turn
    (``EvalConfig.decodes``), are decoded for real (untimed: SR is the timing jobs'), and their step lengths
    are compared with the replayed ones (``compare_steps``,
    ``dpace.evaluation.replay.compare_replay``). A difference that is not a near-tie fails the evaluation
    (``ReplayMismatch``, naming the request and answer position) after the records are written.

    ``answers.baseline``: a ``measure_baseline`` file with the same plan, ``max_new_tokens``, seed and
    dtype, whose times and greedy tokens stand for the autoregressive half (None: decode it here).

    Target and drafter run in ``config.dtype`` ("float32" or "bfloat16"; in bf16, batched and one-token
    forwards round differently, so greedy outputs can part at near-ties: divergences below
    ``greedy_tie_margin`` are counted as ties, others as failures, see ``divergence_verdict``).
    """
    config.check()
    answers = answers or TargetAnswers()
    if config.tau == "replay" and (answers.reference is None or config.verification != "hard-match"):
        raise ValueError("tau='replay' needs reference answers (answers.reference) and hard-match verification")
    plan = evaluation_plan(_benchmarks(benchmark_files), config.temperatures, config.sampled_prompts_per_benchmark)
    target = target_checksum(target_json)
    baseline_id, baseline = shared_answers(answers.baseline, plan, config, target)
    references_id, references = shared_answers(answers.reference if config.tau == "replay" else None, plan,
                                                config, target)
    # Records of another drafter, target, setting or baseline (or none) are stale: decoded again.
    made = {**config.key(), "drafter": input_checksum(drafter_dir), "target": target, "ar_baseline": baseline_id,
            "references": references_id, "sampling": "keyed"}
    if config.tau == "replay":
        handler = _Replay(target_json, drafter_dir, config, device, baseline, references, answers.features,
                          compare_steps, benchmarks=benchmark_files)
    else:
        handler = _Decode(target_json, drafter_dir, config, device, baseline)
    selected = run_requests(plan, Records(records_path, made), keyed_by(config.verification), handler)
    summary = summarize(selected, tau_counts=config.tau_counts, greedy_tie_margin=config.greedy_tie_margin)
    _report(summary, config.greedy_tie_margin)
    atomic_write_json(summary_path, summary)
    atomic_write_text(blocks_path, blocks_csv(selected))
    record_checksums(summary_path, blocks_path)  # the metrics job verifies both (dpace.report.collect)
    return summary


def _report(summary: list[dict], tie_margin: float) -> None:
    """Print every greedy divergence and replay check; raise ``ReplayMismatch`` on a replay failure."""
    for row in summary:
        for divergence in row["greedy_divergences"] or []:
            margin = divergence["top2_margin"]
            print(
                f"greedy divergence ({divergence['verdict']}): {row['benchmark']} {divergence['id']} turn "
                f"{divergence['turn']} at token {divergence['first_mismatch']}, target top-2 margin "
                f"{'unmeasured' if margin is None else format(margin, '.4g')} (tie below {tie_margin:g})"
            )
        if row["greedy_failures"]:
            print(f"LOSSLESS CHECK FAILED: {row['greedy_failures']} divergence(s) in {row['benchmark']} at margins "
                  f">= {tie_margin:g} logits; speculative decoding changed the greedy output")
        check = row.get("replay_check")
        if check:
            print(f"replay check {row['benchmark']} T={row['temperature']:g}: {check['requests_compared']} request(s) "
                  f"compared, {check['equal']} equal, {check['ties']} near-tie(s), {check['failures']} failure(s)")
        if row.get("skipped_too_long"):
            print(f"{row['benchmark']} T={row['temperature']:g}: {row['skipped_too_long']} request(s) past the "
                  "target's context skipped (skipped_too_long)")
    failures = [f for row in summary for f in (row.get("replay_check") or {}).get("failed", [])]
    if failures:
        first = failures[0]
        raise ReplayMismatch(
            f"replayed tau differs from speculative decoding in {len(failures)} request(s) beyond a near-tie "
            f"(margin >= {tie_margin:g}); first: {first['benchmark']} T={first['temperature']:g} {first['id']} turn "
            f"{first['turn']}, step {first['step']} at answer position {first['position']} ({first['cause']}, margin "
            f"{first['margin']})")
