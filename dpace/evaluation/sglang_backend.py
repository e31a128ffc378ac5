"""SGLang backends: DFlash speculative decoding served by SGLang, measured over HTTP.

``evaluate_sglang`` is the GPU counterpart of ``dpace.evaluation.evaluate.evaluate_drafter`` and writes the
same ``summary.json`` / ``blocks.csv`` schema:

1. a loopback SGLang server with the trained drafter (``--speculative-algorithm DFLASH
   --speculative-draft-model-path <epoch dir> --speculative-num-draft-tokens B``) answers every
   benchmark request; emitted length per request is SGLang's ``meta_info.spec_accept_length``
   (tokens per verification step, bonus token included: DFlash's tau), with ``spec_verify_ct``
   and, when the server reports it, ``spec_accept_histogram``;
2. the same server without a drafter answers the same token ids (multi-turn prompts carry the
   speculative answers, as in the local backend), for the autoregressive time per token;
3. SR = mean autoregressive time per output token / mean speculative time per output token, with
   wall-clock time around each (sequential, batch size 1) request, as DFlash's benchmark does.

Differences from the in-process backend, all visible in the output: ``blocks.csv`` has its header
only (SGLang does not expose per-block draft confidences, so the surrogate-vs-tau records of
Fig. 1a need the local backend); ``acceptance_histogram`` is ``null`` unless every request
reported ``spec_accept_histogram``; at T = 0 the greedy check compares the two servers' token ids
(``top2_margin`` stays ``null``); at T > 0 SGLang applies its own DFLASH verification rule.

Both phases are resumable: finished prompts are appended to ``<records>.spec`` and ``<records>``
and skipped on a rerun; each phase starts its server only if it has work left.

The server is started as ``python -m sglang.launch_server`` (override the command with
``DPACE_SGLANG_LAUNCH``, append flags with ``DPACE_SGLANG_ARGS``, e.g. ``--attention-backend fa3
--mem-fraction-static 0.8``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dpace.evaluation.eval_config import GREEDY_TIE_MARGIN, EvalConfig
from dpace.evaluation.eval_records import (
    BLOCK_COLUMNS,
    TOO_LONG,
    WARMUP_TOKENS,
    Request,
    evaluation_plan,
    exceeds_context,
    key_of,
    keyed_by,
    load_benchmark,
    summarize,
)
from dpace.evaluation.requests import Records, RequestHandler, RequestRecord, converse, run_requests
from dpace.gpus import INSTALL_HINT
from dpace.io import atomic_write_json, atomic_write_text, input_checksum, record_checksums


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_prefix() -> list[str]:
    if os.environ.get("DPACE_SGLANG_LAUNCH"):
        return shlex.split(os.environ["DPACE_SGLANG_LAUNCH"])
    if importlib.util.find_spec("sglang") is None:
        raise RuntimeError(f"eval.backend=sglang needs SGLang, which is not installed. {INSTALL_HINT}")
    return [sys.executable, "-m", "sglang.launch_server"]


def server_command(
    model_path: str, port: int, *, drafter: str | None = None, block_size: int | None = None,
    seed: int = 0, trust_remote_code: bool = False,
) -> list[str]:
    """The ``sglang.launch_server`` argv for the target alone or with a DFlash drafter."""
    command = [*launch_prefix(), "--model-path", str(model_path), "--host", "127.0.0.1", "--port", str(port),
               "--random-seed", str(seed)]
    if trust_remote_code:
        command.append("--trust-remote-code")
    if drafter is not None:
        if not block_size:
            raise ValueError("a DFLASH server needs the drafter's block size")
        command += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter),
                    "--speculative-num-draft-tokens", str(block_size)]
    command += shlex.split(os.environ.get("DPACE_SGLANG_ARGS", ""))
    return command


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def _get(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path

    def generate(self, input_ids: list[int], sampling_params: dict, timeout_s: float = 3600.0) -> tuple[dict, float]:
        """One native ``/generate`` request; returns (response, wall seconds)."""
        body = json.dumps({"input_ids": input_ids, "sampling_params": sampling_params}).encode()
        request = urllib.request.Request(f"{self.url}/generate", data=body, headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise RuntimeError(
                f"SGLang /generate answered HTTP {error.code}: {error.read()[:2000]!r}\nserver log tail:\n{_tail(self.log_path)}"
            ) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            raise RuntimeError(f"SGLang /generate failed: {error}\nserver log tail:\n{_tail(self.log_path)}") from None
        return payload, time.perf_counter() - started


@contextlib.contextmanager
def sglang_server(command_args: list[str], port: int, log_path: str | Path, *, startup_timeout_s: float = 1800.0,
                  poll_s: float = 0.5) -> Iterator[Server]:
    """Start ``command_args`` (a server listening on 127.0.0.1:``port``), wait for ``/health``,
    yield it, and stop its whole process group on exit, error or not."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        log.write(f"\n$ {shlex.join(command_args)}\n".encode())
        log.flush()
        process = subprocess.Popen(command_args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(url, process, log_path)
    try:
        started = time.monotonic()
        while _get(f"{url}/health") != 200:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the SGLang server exited with code {process.returncode} before it was healthy "
                    f"(command: {shlex.join(command_args)})\nserver log tail ({log_path}):\n{_tail(log_path)}"
                )
            if time.monotonic() - started > startup_timeout_s:
                raise RuntimeError(
                    f"the SGLang server did not answer {url}/health within {startup_timeout_s:.0f} s\n"
                    f"server log tail ({log_path}):\n{_tail(log_path)}"
                )
            time.sleep(poll_s)
        yield server
    finally:
        _stop(process)


def _stop(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# ---------------------------------------------------------------------------------------------
# Evaluation


def _sampling(temperature: float, max_new_tokens: int, stops: list[int]) -> dict:
    return {"temperature": float(temperature), "top_p": 1.0, "top_k": -1, "max_new_tokens": int(max_new_tokens),
            "stop_token_ids": list(stops), "skip_special_tokens": True}


def _output_ids(response: dict, tokenizer) -> list[int]:
    ids = response.get("output_ids")
    if ids is None:  # older servers: re-tokenise the text (only used for the T=0 comparison)
        ids = tokenizer(response.get("text", ""), add_special_tokens=False)["input_ids"]
    return [int(t) for t in ids]


def _timing(num_input: int, num_output: int, seconds: float, meta: dict) -> dict:
    return {
        "num_input_tokens": num_input,
        "num_output_tokens": num_output,
        "time_to_first_token_s": None,
        "decode_time_s": seconds,
        "time_per_output_token_s": seconds / max(num_output, 1),
        "e2e_latency_s": meta.get("e2e_latency"),
    }


def _acceptance(meta: dict) -> dict:
    """SGLang's speculative counters for one request, and per-step emitted lengths if derivable.

    ``spec_accept_histogram[n]`` counts verification steps that accepted ``n`` draft tokens; each
    such step emitted ``n + 1`` tokens (the bonus token), which is what tau counts.
    """
    histogram = meta.get("spec_accept_histogram")
    lengths = []
    if isinstance(histogram, list) and histogram:
        lengths = [n + 1 for n, count in enumerate(histogram) for _ in range(int(count))]
    verify = meta.get("spec_verify_ct")
    accept_length = meta.get("spec_accept_length")
    if accept_length is None and verify:
        accept_length = int(meta.get("completion_tokens", 0)) / int(verify)
    return {
        "spec_accept_length": None if accept_length is None else float(accept_length),
        "spec_verify_ct": None if verify is None else int(verify),
        "acceptance_lengths": lengths,
        "has_histogram": bool(lengths),
    }


def _greedy(spec_ids: list[int], ar_ids: list[int]) -> dict:
    common = min(len(spec_ids), len(ar_ids))
    differing = [i for i in range(common) if spec_ids[i] != ar_ids[i]]
    first = differing[0] if differing else (common if len(spec_ids) != len(ar_ids) else None)
    return {
        "mismatches": len(differing) + abs(len(spec_ids) - len(ar_ids)),
        "compared": common,
        "first_mismatch": first,
        "top2_margin": None,
        "spec_token": spec_ids[first] if first is not None and first < len(spec_ids) else None,
        "greedy_token": ar_ids[first] if first is not None and first < len(ar_ids) else None,
    }


def drafter_block_size(drafter_dir: str | Path) -> int:
    config = json.loads((Path(drafter_dir) / "config.json").read_text())
    size = config.get("block_size") or (config.get("dflash_config") or {}).get("block_size")
    if not size:
        raise ValueError(f"{drafter_dir}/config.json has no block_size: not a DFlash drafter")
    if config.get("draft_vocab") is not None:
        # SGLang's DFLASH worker scores the target's whole vocabulary with the target's LM head.
        raise ValueError(
            f"{drafter_dir} proposes from a pruned draft vocabulary (train.draft_vocab_size), which SGLang's "
            "DFLASH worker does not read; evaluate it with eval.backend local, or train with draft_vocab_size 0"
        )
    return int(size)


def _context_length(model_path: str, trust_remote_code: bool) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code).max_position_embeddings)


def summarize_sglang(records: list[dict], greedy_tie_margin: float = GREEDY_TIE_MARGIN) -> list[dict]:
    """``dpace.evaluation.eval_records.summarize`` rows, with tau from SGLang's per-request accept lengths."""
    rows = summarize(records, request_tau=lambda turn: turn.get("spec_accept_length"),
                     greedy_tie_margin=greedy_tie_margin)
    for row in rows:
        turns = [t for r in records if (r["benchmark"], r["temperature"], r["verification"])
                 == (row["benchmark"], row["temperature"], row["verification"]) for t in r["turns"]]
        if not all(t.get("has_histogram") for t in turns):
            row["acceptance_histogram"] = None
        row["engine"] = "sglang"
    return rows


@dataclass
class SpeculativeTurn:
    """One turn answered by the DFLASH server (phase 1): its prompt and output ids, its timing and SGLang's
    speculative counters (``_acceptance``)."""

    turn: int
    prompt_ids: list[int]
    output_ids: list[int]
    spec: dict
    spec_accept_length: float | None
    spec_verify_ct: int | None
    acceptance_lengths: list[int]
    has_histogram: bool


@dataclass
class ServedTurn:
    """A turn's final record: phase 1's counters, the autoregressive server's time on the same prompt ids
    and, at T = 0, the two servers' token ids compared (``_greedy``); SGLang exposes no per-block q."""

    turn: int
    spec: dict
    spec_accept_length: float | None
    spec_verify_ct: int | None
    acceptance_lengths: list[int]
    has_histogram: bool
    ar: dict
    blocks: list
    greedy: dict | None


class _Served(RequestHandler):
    """What both SGLang phases share: the target's tokenizer, and a loopback server (with the drafter or
    without) started, and warmed up, only when a request of its phase is pending."""

    def __init__(self, target_json, config: EvalConfig, block_size: int, log_path: Path, startup_timeout_s: float,
                 drafter_dir=None):
        from dpace.targets import load_tokenizer, model_location, stop_token_ids

        self.model_path, self.trust = model_location(target_json)
        self.tokenizer = load_tokenizer(target_json)
        self.stops = stop_token_ids(self.tokenizer)
        self.config, self.verification, self.block_size = config, config.verification, block_size
        self.log_path, self.startup_timeout_s, self.drafter_dir = log_path, startup_timeout_s, drafter_dir
        self.server = None

    def sampling(self, temperature: float, max_new_tokens: int | None = None) -> dict:
        return _sampling(temperature, max_new_tokens or self.config.max_new_tokens, self.stops)

    def warm_up_text(self, pending: list[Request]) -> str:
        raise NotImplementedError

    @contextlib.contextmanager
    def session(self, pending):
        port = free_port()
        drafter = {} if self.drafter_dir is None else {"drafter": str(self.drafter_dir), "block_size": self.block_size}
        command = server_command(self.model_path, port, seed=self.config.seed, trust_remote_code=self.trust, **drafter)
        with sglang_server(command, port, self.log_path, startup_timeout_s=self.startup_timeout_s) as server:
            from dpace.targets import chat_prompt_ids

            self.server = server
            ids = chat_prompt_ids(self.tokenizer, [{"role": "user", "content": self.warm_up_text(pending)}])
            for temperature in sorted(set(self.config.temperatures)):
                server.generate(ids, self.sampling(temperature, WARMUP_TOKENS))
            yield


class _Speculative(_Served):
    """Phase 1: the drafter server answers every turn of a request, each after its answer to the one before."""

    context = None

    def fits(self, request: Request) -> bool:
        self.context = self.context or _context_length(self.model_path, self.trust)
        return not exceeds_context(self.tokenizer, request.row, max_new_tokens=self.config.max_new_tokens,
                                   block_size=self.block_size, context=self.context)

    def skipped(self, request: Request) -> RequestRecord:
        return RequestRecord.of(request, self.verification, [], skipped=TOO_LONG)

    def warm_up_text(self, pending):
        return pending[0].row["turns"][0]

    def __call__(self, batch):
        from dpace.targets import chat_prompt_ids

        def answer(request, turn_index, prompt_ids):
            response, seconds = self.server.generate(prompt_ids, self.sampling(request.temperature))
            meta, output_ids = response.get("meta_info") or {}, _output_ids(response, self.tokenizer)
            return SpeculativeTurn(turn=turn_index, prompt_ids=prompt_ids, output_ids=output_ids,
                                   spec=_timing(len(prompt_ids), len(output_ids), seconds, meta),
                                   **_acceptance(meta)), response.get("text", "")

        return [RequestRecord.of(request, self.verification, converse(
            self.tokenizer, request.row["turns"], lambda *turn, request=request: answer(request, *turn),
            chat_prompt_ids)) for request in batch]


class _Autoregressive(_Served):
    """Phase 2: the same server without a drafter, on the very same token ids as phase 1's (``spec``)."""

    def __init__(self, *args, spec: dict[tuple, dict], key, **kwargs):
        super().__init__(*args, **kwargs)
        self.spec, self.key = spec, key

    def fits(self, request: Request) -> bool:
        return not self.spec[self.key(request)].get("skipped")

    def warm_up_text(self, pending):
        return self.tokenizer.decode(self.spec[self.key(pending[0])]["turns"][0]["prompt_ids"][-64:])

    def __call__(self, batch):
        return [self._timed(request, self.spec[self.key(request)]) for request in batch]

    def _timed(self, request: Request, spec: dict) -> RequestRecord:
        turns = []
        for turn in spec["turns"]:
            response, seconds = self.server.generate(turn["prompt_ids"], self.sampling(request.temperature))
            ar_ids = _output_ids(response, self.tokenizer)
            counters = {k: v for k, v in turn.items() if k not in ("prompt_ids", "output_ids")}
            turns.append(ServedTurn(
                **counters, ar=_timing(len(turn["prompt_ids"]), len(ar_ids), seconds, response.get("meta_info") or {}),
                blocks=[], greedy=_greedy(turn["output_ids"], ar_ids) if request.temperature == 0 else None))
        return RequestRecord.of(request, self.verification, turns, engine="sglang")


def evaluate_sglang(
    target_json, drafter_dir, benchmark_files: dict[str, str | Path], config: EvalConfig, *, records_path,
    summary_path, blocks_path, log_dir, startup_timeout_s: float = 1800.0,
) -> list[dict]:
    """Evaluate a drafter with SGLang's DFLASH speculative decoding; the arguments and outputs of
    ``dpace.evaluation.evaluate.evaluate_drafter`` (the local backend), plus SGLang's log folder.
    SGLang decodes every request (``config.tau`` "decode") and applies its own verification rule."""
    from dpace.targets import target_checksum

    config.check()
    if config.tau != "decode":
        raise ValueError(f"eval.backend sglang decodes every request: tau must be 'decode', got {config.tau!r}")
    benchmarks = {name: load_benchmark(path, name) for name, path in benchmark_files.items()}
    plan = evaluation_plan(benchmarks, config.temperatures, config.sampled_prompts_per_benchmark)
    block_size, log_dir = drafter_block_size(drafter_dir), Path(log_dir)
    # Records of another drafter, target or setting are stale (the job reran because one changed).
    made = {**config.key(), "block_size": block_size, "drafter": input_checksum(drafter_dir),
            "target": target_checksum(target_json)}
    key, finals = keyed_by(config.verification), Records(records_path, made)
    done = {key_of(record) for record in finals.items}
    served = (target_json, config, block_size)
    spec = run_requests([request for request in plan if key(request) not in done],
                        Records(f"{records_path}.spec", made), key,
                        _Speculative(*served, log_dir / "sglang-dflash.log", startup_timeout_s, drafter_dir))
    rows = run_requests(plan, finals, key, _Autoregressive(
        *served, log_dir / "sglang-autoregressive.log", startup_timeout_s, key=key,
        spec={key_of(record): record for record in spec}))
    summary = summarize_sglang(rows, greedy_tie_margin=config.greedy_tie_margin)
    atomic_write_json(summary_path, summary)
    atomic_write_text(blocks_path, ",".join(BLOCK_COLUMNS) + "\n")
    record_checksums(summary_path, blocks_path)
    return summary


__all__ = [
    "Server", "drafter_block_size", "evaluate_sglang", "free_port",
    "server_command", "sglang_server", "summarize_sglang",
]
