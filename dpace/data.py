"""Benchmark prompts and training prompts, from the Hugging Face hub or a local mirror.

A mirror is a folder of jsonl files in the hub data sets' own row schemas
(``benchmarks/<name>.jsonl``, ``train/<name>.jsonl``), so one formatter serves both sources.
Prompts are formatted exactly as the DFlash benchmark formats them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpace.io import atomic_write_jsonl, read_jsonl

_REASON = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Benchmark:
    hub_args: tuple[str, ...]
    split: str
    required: tuple[str, ...]
    turns: Callable[[dict], list[str]]


def _alpaca(row: dict) -> list[str]:
    if row.get("input"):
        return [f"{row['instruction']}\n\nInput:\n{row['input']}"]
    return [row["instruction"]]


BENCHMARKS: dict[str, Benchmark] = {
    "gsm8k": Benchmark(("openai/gsm8k", "main"), "test", ("question",), lambda r: [r["question"] + _REASON]),
    "math500": Benchmark(("HuggingFaceH4/MATH-500",), "test", ("problem",), lambda r: [r["problem"] + _REASON]),
    "humaneval": Benchmark(
        ("openai/openai_humaneval",),
        "test",
        ("prompt",),
        lambda r: [
            "Write a solution to the following problem and make sure that it passes the tests:\n"
            f"```python\n{r['prompt']}\n```"
        ],
    ),
    "mbpp": Benchmark(("google-research-datasets/mbpp", "sanitized"), "test", ("prompt",), lambda r: [r["prompt"]]),
    # Its prompt is a list of turns; checked as given (list() would split a string into one-character turns).
    "mt_bench": Benchmark(("HuggingFaceH4/mt_bench_prompts",), "train", ("prompt",), lambda r: r["prompt"]),
    "alpaca": Benchmark(("tatsu-lab/alpaca",), "train", ("instruction",), _alpaca),
}

TRAIN_SETS: dict[str, tuple[tuple[str, ...], str]] = {
    # The id SpecForge's scripts/prepare_data.py loads for --dataset sharegpt (DFlash trains with SpecForge).
    "sharegpt": (("Aeala/ShareGPT_Vicuna_unfiltered",), "train"),
    "codealpaca": (("sahil280114/codealpaca",), "train"),
}


def check_turns(turns, where: str) -> list[str]:
    """``turns`` when it is a non-empty list of non-empty strings; else an error naming ``where`` (file and row).
    An empty turn would be decoded from the chat template alone, a string split into characters."""
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{where}: turns must be a non-empty list of strings, not {type(turns).__name__} "
                         f"{str(turns)[:60]!r}; fix that row")
    bad = [index for index, turn in enumerate(turns) if not isinstance(turn, str) or not turn.strip()]
    if bad:
        raise ValueError(f"{where}: turn(s) {bad} empty or not strings; fix that row")
    return turns


def _row_where(kind: str, name: str, mirror: str | None, index: int) -> str:
    """A row as an error names it: file:line in the mirror, else its index in the hub data set."""
    return f"{Path(mirror) / kind / name}.jsonl:{index + 1}" if mirror else f"hub data set {name!r} row {index}"


def _load_rows(kind: str, name: str, hub_args: tuple[str, ...], split: str, mirror: str | None) -> list[dict]:
    if mirror:
        path = Path(mirror) / kind / f"{name}.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"data mirror {mirror!r} has no {kind}/{name}.jsonl (expected {path})")
        rows = list(read_jsonl(path, fix="fix that row or restore the mirror file"))
    else:
        try:
            import datasets

            rows = list(datasets.load_dataset(*hub_args, split=split))
        except Exception as error:  # network, auth or a missing data set: say which setting to change
            raise RuntimeError(
                f"could not load {'/'.join(hub_args)} from the Hugging Face hub ({type(error).__name__}: "
                f"{error}); set data.mirror in the config to a local mirror folder (e.g. ../shared/data)"
            ) from None
    if not rows:
        raise ValueError(f"{kind} data set {name!r} is empty")
    return rows


def benchmark_prompts(name: str, num_prompts: int, seed: int, mirror: str | None = None) -> list[dict]:
    """``num_prompts`` rows ``{"id", "benchmark", "turns"}``: the ones DFlash's benchmark selects with this seed."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; valid: {sorted(BENCHMARKS)}")
    spec = BENCHMARKS[name]
    rows = _load_rows("benchmarks", name, spec.hub_args, spec.split, mirror)
    for index, row in enumerate(rows):
        missing = [key for key in spec.required if key not in row]
        if missing:
            raise ValueError(f"benchmark {name!r} row {index} lacks required field(s) {missing}")
    if num_prompts > len(rows):  # refused, never silently fewer: every table and claim would count them
        source = f"{Path(mirror) / 'benchmarks' / name}.jsonl" if mirror else f"hub data set {'/'.join(spec.hub_args)}"
        raise ValueError(f"data.prompts_per_benchmark: {num_prompts} prompts of benchmark {name!r} asked for, but "
                         f"{source} has {len(rows)} rows; ask for at most {len(rows)}")
    chosen = dflash_benchmark_rows(len(rows), num_prompts, seed)
    return [{"id": f"{name}-{i}", "benchmark": name,
             "turns": check_turns(spec.turns(rows[i]), _row_where("benchmarks", name, mirror, i))} for i in chosen]


def dflash_benchmark_rows(num_rows: int, num_prompts: int, seed: int) -> list[int]:
    """The hub row indices DFlash's benchmark evaluates, in its order.

    DFlash's ``benchmark.py`` (z-lab/dflash at the paper's release, Feb 2026) keeps every row when
    ``num_prompts`` covers the set, and otherwise takes ``dataset.shuffle(seed=0).select(range(n))``.
    ``datasets`` shuffles a ``Dataset`` built from the row indices exactly as it shuffles the hub copy
    (the permutation depends only on the length and the seed), so the mirror, which keeps the hub's
    row order, yields the paper's prompts.
    """
    if num_prompts >= num_rows:
        return list(range(num_rows))
    import datasets

    rows = datasets.Dataset.from_dict({"row": list(range(num_rows))})
    return list(rows.shuffle(seed=seed).select(range(num_prompts))["row"])


def _first_user_turn(row: dict, where: str) -> str | None:
    """ShareGPT (``from``/``value``), OpenAI-style (``role``/``content``) or instruction rows."""
    if "conversations" in row:
        turns = row["conversations"]
        if not isinstance(turns, list) or not all(isinstance(turn, dict) for turn in turns):
            raise ValueError(f"{where}: 'conversations' is a {type(turns).__name__}, not a list of turns; fix that row")
        for turn in turns:
            speaker = turn.get("from", turn.get("role"))
            if speaker in ("human", "user"):
                return turn.get("value", turn.get("content"))
        return None
    if "instruction" in row:
        return _alpaca(row)[0]
    return None


def training_prompts(
    name: str, num_prompts: int, seed: int, mirror: str | None = None, max_chars: int | None = None
) -> tuple[list[dict], dict]:
    """The first user turn of ``num_prompts`` conversations, and counts of what was skipped."""
    if name not in TRAIN_SETS:
        raise ValueError(f"unknown training set {name!r}; valid: {sorted(TRAIN_SETS)}")
    hub_args, split = TRAIN_SETS[name]
    rows = _load_rows("train", name, hub_args, split, mirror)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    prompts, skipped = [], {"no_user_turn": 0, "too_long": 0}
    first_row = {}  # prompt id -> the row it came from: ids key the answers, features and mixtures downstream
    for index in order:
        text = _first_user_turn(rows[index], _row_where("train", name, mirror, index))
        if not isinstance(text, str) or not text.strip():
            skipped["no_user_turn"] += 1
            continue
        if max_chars is not None and len(text) > max_chars:
            skipped["too_long"] += 1  # skipped and counted, never silently truncated
            continue
        prompt_id = str(rows[index].get("id", f"{name}-{index}"))
        if prompt_id in first_row:
            raise ValueError(
                f"{_row_where('train', name, mirror, index)}: prompt id {prompt_id!r} appears twice in training set "
                f"{name!r} (also at {_row_where('train', name, mirror, first_row[prompt_id])}); ids must be unique "
                "within a set: fix that row")
        first_row[prompt_id] = index
        prompts.append({"id": prompt_id, "prompt": text})
        if len(prompts) == num_prompts:
            break
    if not prompts:
        raise ValueError(f"training set {name!r} gave no usable prompts: {skipped['too_long']} longer than "
                         f"data.max_prompt_chars={max_chars}, {skipped['no_user_turn']} without a user turn")
    return prompts, skipped


def write_benchmark(name: str, out_path: str | Path, num_prompts: int, seed: int, mirror: str | None) -> int:
    rows = benchmark_prompts(name, num_prompts, seed, mirror)
    atomic_write_jsonl(out_path, rows)
    return len(rows)


MIX_SEPARATOR = "+"


def mixture_name(sets) -> str:
    """The data set name of ``data.train_set``: the set itself, or a mixture's sets joined by ``+``."""
    return sets if isinstance(sets, str) else MIX_SEPARATOR.join(sets)


def mixed_training_prompts(
    counts: dict[str, int], seed: int, mirror: str | None = None, max_chars: int | None = None
) -> tuple[list[dict], dict]:
    """``counts[name]`` prompts of each training set, drawn as ``training_prompts`` draws them, then
    shuffled together (response generation and feature batches then see every set throughout).

    The paper's main drafters train on such a mixture (Nemotron-Post-Training-Dataset-v2 and
    CodeAlpaca); skipped counts are reported per set.
    """
    prompts, skipped, set_of = [], {}, {}
    for name, count in counts.items():
        rows, set_skipped = training_prompts(name, count, seed, mirror, max_chars)  # ids unique within the set
        shared = sorted(row["id"] for row in rows if row["id"] in set_of)
        if shared:
            raise ValueError(f"training sets {set_of[shared[0]]!r} and {name!r} share prompt id(s) {shared[:5]}"
                             f"{' ...' if len(shared) > 5 else ''}; a mixture needs distinct ids")
        set_of.update((row["id"], name) for row in rows)
        prompts += rows
        skipped[name] = {"written": len(rows), **set_skipped}
    random.Random(seed).shuffle(prompts)
    return prompts, skipped


def write_training_prompts(
    counts: dict[str, int], out_path: str | Path, seed: int, mirror: str | None, max_chars: int | None
) -> dict:
    """Write the prompts of one training set (``{name: count}``) or of a mixture of several."""
    if len(counts) == 1:
        (name, count), = counts.items()
        rows, skipped = training_prompts(name, count, seed, mirror, max_chars)
        skipped = {"written": len(rows), **skipped}
    else:
        rows, skipped = mixed_training_prompts(counts, seed, mirror, max_chars)
    atomic_write_jsonl(out_path, rows)
    return skipped
