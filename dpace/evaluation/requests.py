"""Evaluation as plan -> resumable requests -> summary, shared by every measurement (decoded and replayed
evaluation, the autoregressive baseline, both SGLang phases).

``run_requests`` takes the plan (``eval_records.evaluation_plan``), the job's records file (``Records``: the
records made with this job's settings and inputs), the key of a request, and a handler holding only what
differs between measurements (``RequestHandler``). It resumes (requests already recorded are skipped),
shows progress, appends each finished record (flushed: a killed job keeps it) and returns the plan's
records in the plan's order. ``converse`` is the multi-turn loop every handler shares: each turn is
asked after the model's own answer to the one before, as DFlash's benchmark does. No torch here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from dpace.evaluation.eval_records import TOO_LONG, Request, key_of, prompt_checksum, select_records
from dpace.io import JsonlAppender, current_records


@dataclass
class RequestRecord:
    """One finished request (a benchmark row at one temperature, every turn of it), as the records file
    holds it with the job's cache key (``Records.made``); ``turns`` are one of the turn records below."""

    benchmark: str
    id: str
    prompt_checksum: int
    prompt_index: int
    temperature: float
    verification: str
    turns: list = field(default_factory=list)
    block_size: int | None = None  # the drafter's (evaluations)
    skipped: str | None = None  # TOO_LONG: past the target's context (eval_records.exceeds_context), not scored
    engine: str | None = None  # "sglang"

    @classmethod
    def of(cls, request: Request, verification: str, turns: list, **extra) -> RequestRecord:
        return cls(benchmark=request.benchmark, id=str(request.row["id"]), prompt_checksum=prompt_checksum(request.row),
                   prompt_index=request.index, temperature=float(request.temperature), verification=verification,
                   turns=turns, **extra)

    def to_json(self, made: dict) -> dict:
        """The record as JSON: its fields, the job's settings and inputs (``made``), then its turns."""
        fields_ = {key: value for key, value in asdict(self).items()
                   if value is not None or key not in ("block_size", "skipped", "engine")}
        turns = fields_.pop("turns")
        return {**fields_, **made, "verification": self.verification, "turns": turns}


@dataclass
class StepsTurn:
    """One turn's verification steps: its timings (``ar``, ``spec``: ``decoding.DecodeResult``'s, None
    where not measured), both step counts, per-block records and the T = 0 lossless check."""

    turn: int
    ar: dict | None
    spec: dict | None
    acceptance_lengths: list[int]
    block_lengths: list[int] | None
    blocks: list[dict]
    greedy: dict | None = None


@dataclass
class DecodedTurn(StepsTurn):
    """A turn decoded speculatively: its tokens, and its prompt's fingerprint."""

    new_token_ids: list[int] = field(default_factory=list)
    prompt_fingerprint: int = 0


@dataclass
class ReplayedTurn(StepsTurn):
    """A turn whose steps were replayed over the target's answer; ``replay_check`` where also decoded."""

    replay_check: dict | None = None


@dataclass
class BaselineTurn:
    """The target's own answer to one turn (``measure_baseline``): timed (``ar``) or batched (None)."""

    turn: int
    prompt_fingerprint: int
    ar: dict | None
    new_token_ids: list[int]
    prompt_ids: list[int]
    continuation_ids: list[int]


class Conversation:
    """One request's messages: each user turn, then the model's own answer to it."""

    def __init__(self, tokenizer, prompt_ids: Callable):
        self.tokenizer, self.prompt_ids, self.messages = tokenizer, prompt_ids, []

    def ask(self, text: str) -> list[int]:
        """The chat prompt's token ids after the user says ``text``."""
        self.messages.append({"role": "user", "content": text})
        return self.prompt_ids(self.tokenizer, self.messages)

    def answered(self, token_ids: list[int] | None = None, text: str | None = None) -> None:
        """The model's answer, as token ids (decoded here) or as the engine's text."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True) if text is None else text
        self.messages.append({"role": "assistant", "content": text})


def converse(tokenizer, turns: list[str], answer: Callable, prompt_ids: Callable) -> list:
    """The multi-turn loop: ``answer(turn_index, prompt_ids)`` -> (turn record, answer token ids or text)
    for every turn, each asked after the answer to the one before; returns the turn records."""
    conversation, records = Conversation(tokenizer, prompt_ids), []
    for turn_index, text in enumerate(turns):
        record, reply = answer(turn_index, conversation.ask(text))
        records.append(record)
        conversation.answered(**({"text": reply} if isinstance(reply, str) else {"token_ids": reply}))
    return records


class Records:
    """A resumable job's records file: its records made with exactly ``made`` (the job's settings and input
    checksums; the others are dropped, ``dpace.io.current_records``), appended to as requests finish."""

    def __init__(self, path, made: dict):
        self.path, self.made = Path(path), made
        self.items = current_records(path, **made)

    def add(self, record: RequestRecord, appender: JsonlAppender) -> dict:
        row = record.to_json(self.made)
        appender.write(row)
        self.items.append(row)
        return row


class RequestHandler:
    """What one kind of measurement does with its pending requests; ``run_requests`` does the rest."""

    verification: str

    def fits(self, request: Request) -> bool:
        """Whether the request fits the target's context (else it is recorded as skipped)."""
        return True

    def skipped(self, request: Request) -> RequestRecord:
        return RequestRecord.of(request, self.verification, [], skipped=TOO_LONG)

    @contextlib.contextmanager
    def session(self, pending: list[Request]) -> Iterator[None]:
        """Models loaded (or a server started) and warmed up, only when some request is pending."""
        yield

    def batches(self, pending: list[Request]) -> Iterable[list[Request]]:
        return ([request] for request in pending)

    def __call__(self, batch: list[Request]) -> list[RequestRecord]:
        raise NotImplementedError


def run_requests(plan: list[Request], records: Records, key: Callable[[Request], tuple],
                 handle: RequestHandler) -> list[dict]:
    """Measure every request of ``plan`` not yet in ``records`` with ``handle``, appending each record as it
    finishes; return the plan's records (``select_records``), in the plan's order."""
    done = {key_of(record) for record in records.items}
    pending = [request for request in plan if key(request) not in done]
    if pending:
        with JsonlAppender(records.path) as appender:
            fitting = []
            for request in pending:
                if handle.fits(request):
                    fitting.append(request)
                else:
                    records.add(handle.skipped(request), appender)
                    print(f"{request.benchmark} {request.row['id']}: past the target's context, skipped", flush=True)
            if fitting:
                with handle.session(fitting), tqdm(total=len(plan), initial=len(plan) - len(fitting),
                                                   unit="prompt") as progress:
                    for batch in handle.batches(fitting):
                        for record in handle(batch):
                            records.add(record, appender)
                        progress.update(len(batch))
    return select_records(records.items, plan, key)
