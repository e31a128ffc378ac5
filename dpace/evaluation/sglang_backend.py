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
    evaluation_plan,
    exceeds_context,
    key_of,
    load_benchmark,
    prompt_checksum,
    request_key,
    select_records,
    summarize,
)
from dpace.gpus import INSTALL_HINT
from dpace.io import JsonlAppender, atomic_write_json, atomic_write_text, current_records, input_checksum


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


def evaluate_sglang(
    target_json, drafter_dir, benchmark_files: dict[str, str | Path], config: EvalConfig, *, records_path,
    summary_path, blocks_path, log_dir, startup_timeout_s: float = 1800.0,
) -> list[dict]:
    """Evaluate a drafter with SGLang's DFLASH speculative decoding; the arguments and outputs of
    ``dpace.evaluation.evaluate.evaluate_drafter`` (the local backend), plus SGLang's log folder.
    SGLang decodes every request (``config.tau`` "decode") and applies its own verification rule."""
    from dpace.targets import chat_prompt_ids, load_tokenizer, model_location, stop_token_ids, target_checksum

    config.check()
    if config.tau != "decode":
        raise ValueError(f"eval.backend sglang decodes every request: tau must be 'decode', got {config.tau!r}")
    verification, max_new_tokens, seed = config.verification, config.max_new_tokens, config.seed
    benchmarks = {name: load_benchmark(path, name) for name, path in benchmark_files.items()}
    temperatures = list(config.temperatures)
    block_size = drafter_block_size(drafter_dir)
    model_path, trust = model_location(target_json)
    tokenizer = load_tokenizer(target_json)
    stops = stop_token_ids(tokenizer)
    records_path, log_dir = Path(records_path), Path(log_dir)
    spec_path = Path(f"{records_path}.spec")
    wanted = evaluation_plan(benchmarks, temperatures, config.sampled_prompts_per_benchmark)

    # Records of another drafter, target or setting are stale (the job reran because one changed).
    made = {**config.key(), "block_size": block_size,
            "drafter": input_checksum(drafter_dir), "target": target_checksum(target_json)}
    finals = current_records(records_path, **made)
    spec_rows = current_records(spec_path, **made)
    final_done = {key_of(r) for r in finals}
    spec_done = {key_of(r): r for r in spec_rows}

    def warm_up(server, text):
        ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])
        for temperature in sorted(set(temperatures)):
            server.generate(ids, _sampling(temperature, WARMUP_TOKENS, stops))

    # Phase 1: the drafter server, every turn of every pending prompt.
    todo = [w for w in wanted if request_key(w[0], w[1], verification, w[3]) not in final_done
            and request_key(w[0], w[1], verification, w[3]) not in spec_done]
    context = _context_length(model_path, trust) if todo else 0
    for name, temperature, index, row in [w for w in todo if exceeds_context(
            tokenizer, w[3], max_new_tokens=max_new_tokens, block_size=block_size, context=context)]:
        spec_done[request_key(name, temperature, verification, row)] = {
            "benchmark": name, "id": str(row["id"]), "prompt_checksum": prompt_checksum(row), "prompt_index": index,
            "temperature": temperature, "verification": verification, **made, "skipped": TOO_LONG, "turns": []}
    todo = [w for w in todo if request_key(w[0], w[1], verification, w[3]) not in spec_done]
    if todo:
        port = free_port()
        command = server_command(model_path, port, drafter=str(drafter_dir), block_size=block_size, seed=seed,
                                 trust_remote_code=trust)
        with sglang_server(command, port, log_dir / "sglang-dflash.log", startup_timeout_s=startup_timeout_s) as server, \
                JsonlAppender(spec_path) as out:
            warm_up(server, todo[0][3]["turns"][0])
            for name, temperature, index, row in todo:
                messages, turns = [], []
                for turn_index, text in enumerate(row["turns"]):
                    messages.append({"role": "user", "content": text})
                    prompt_ids = chat_prompt_ids(tokenizer, messages)
                    response, seconds = server.generate(prompt_ids, _sampling(temperature, max_new_tokens, stops))
                    meta = response.get("meta_info") or {}
                    output_ids = _output_ids(response, tokenizer)
                    turns.append({
                        "turn": turn_index,
                        "prompt_ids": prompt_ids,
                        "output_ids": output_ids,
                        "spec": _timing(len(prompt_ids), len(output_ids), seconds, meta),
                        **_acceptance(meta),
                    })
                    messages.append({"role": "assistant", "content": response.get("text", "")})
                record = {"benchmark": name, "id": str(row["id"]), "prompt_checksum": prompt_checksum(row),
                          "prompt_index": index, "temperature": temperature, "verification": verification, **made,
                          "turns": turns}
                out.write(record)
                spec_done[request_key(name, temperature, verification, row)] = record

    # Phase 2: the same server without a drafter, on the very same token ids.
    todo = [spec_done[k] for k in (request_key(w[0], w[1], verification, w[3]) for w in wanted)
            if k not in final_done and k in spec_done]
    finals += [record for record in todo if record.get("skipped")]  # nothing to time
    todo = [record for record in todo if not record.get("skipped")]
    if todo:
        port = free_port()
        command = server_command(model_path, port, seed=seed, trust_remote_code=trust)
        with sglang_server(command, port, log_dir / "sglang-autoregressive.log",
                           startup_timeout_s=startup_timeout_s) as server, JsonlAppender(records_path) as out:
            warm_up(server, tokenizer.decode(todo[0]["turns"][0]["prompt_ids"][-64:]))
            for spec_record in todo:
                turns = []
                for turn in spec_record["turns"]:
                    response, seconds = server.generate(
                        turn["prompt_ids"], _sampling(spec_record["temperature"], max_new_tokens, stops))
                    ar_ids = _output_ids(response, tokenizer)
                    final_turn = {k: v for k, v in turn.items() if k not in ("prompt_ids", "output_ids")}
                    final_turn.update(
                        ar=_timing(len(turn["prompt_ids"]), len(ar_ids), seconds, response.get("meta_info") or {}),
                        blocks=[],
                        greedy=_greedy(turn["output_ids"], ar_ids) if spec_record["temperature"] == 0 else None,
                    )
                    turns.append(final_turn)
                record = {**spec_record, "turns": turns, "engine": "sglang"}
                out.write(record)
                finals.append(record)

    rows = select_records(finals, wanted, verification)
    summary = summarize_sglang(rows, greedy_tie_margin=config.greedy_tie_margin)
    atomic_write_json(summary_path, summary)
    atomic_write_text(blocks_path, ",".join(BLOCK_COLUMNS) + "\n")
    return summary


__all__ = [
    "Server", "drafter_block_size", "evaluate_sglang", "free_port",
    "server_command", "sglang_server", "summarize_sglang",
]
