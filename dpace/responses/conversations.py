"""Training conversations whose answers the target already wrote: imported instead of generated.

The DFlash authors released Qwen3-4B's own answers to 100k prompts (``z-lab/qwen3-4b-instruct-100k``,
thinking off); the paper trains its Qwen3-4B drafters on them and regenerates ShareGPT for the
other targets. ``import_conversations`` turns such a data set, from the hub or a local jsonl /
json / parquet file, into the same conversations jsonl that ``dpace.responses.generation`` writes:
``{"id", "conversations": [user, assistant]}``.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from dpace.io import DamagedFile, atomic_write_jsonl, read_json, read_jsonl

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
FIX_IMPORT = "fix the file or point targets.<name>.responses at another"
_SPEAKERS = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system"}


def dataset_name(source: str) -> str:
    """The name an imported data set has in ``results/`` paths: its last path component, without
    a file suffix (``z-lab/qwen3-4b-instruct-100k`` -> ``qwen3-4b-instruct-100k``)."""
    name = source.rstrip("/").rsplit("/", 1)[-1]
    for suffix in LOCAL_SUFFIXES:
        name = name.removesuffix(suffix)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    if not name:
        raise ValueError(f"responses source {source!r} gives no data set name")
    return name


def is_local(source: str) -> bool:
    return source.endswith(LOCAL_SUFFIXES)


def load_rows(source: str, split: str = "train") -> list[dict]:
    """Rows of a local file (by suffix) or of a hub data set's ``split``."""
    if is_local(source):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"responses file {source!r} does not exist")
        if path.suffix == ".parquet":
            import pyarrow.parquet

            return pyarrow.parquet.read_table(path).to_pylist()  # plain lists, not numpy arrays
        if path.suffix == ".json":
            rows = read_json(path, fix=FIX_IMPORT)
            if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
                raise DamagedFile(f"{path}: expected a JSON list of objects (one per conversation); {FIX_IMPORT}")
            return rows
        return list(read_jsonl(path, fix=FIX_IMPORT))
    try:
        import datasets

        return list(datasets.load_dataset(source, split=split))
    except Exception as error:  # network, auth or a missing data set: say which setting to change
        raise RuntimeError(
            f"could not load {source} from the Hugging Face hub ({type(error).__name__}: {error}); "
            "download it and set targets.<name>.responses to the local .jsonl or .parquet file"
        ) from None


def first_exchange(turns) -> list[dict] | None:
    """The first user turn and the assistant answer right after it, as ``role``/``content``; turns
    may be OpenAI-style (``role``/``content``) or ShareGPT-style (``from``/``value``)."""
    turns = [
        {"role": _SPEAKERS.get(turn.get("role", turn.get("from"))), "content": turn.get("content", turn.get("value"))}
        for turn in (turns or [])
    ]
    for index, turn in enumerate(turns[:-1]):
        answer = turns[index + 1]
        if turn["role"] == "user" and answer["role"] == "assistant":
            if isinstance(turn["content"], str) and isinstance(answer["content"], str) and answer["content"].strip():
                return [turn, answer]
            return None
    return None


def import_conversations(source: str, out_path: str | Path, *, num_conversations: int, seed: int,
                         split: str = "train") -> dict:
    """Write ``num_conversations`` conversations sampled with ``seed`` (all if fewer), in the order of
    the source, and return counts of what was written and skipped.

    Skipped and counted, never silently kept: rows whose generation did not succeed (a ``status``
    other than ``success``), rows generated with thinking on (the targets run without it), and rows
    with no user turn followed by a non-empty answer.
    """
    rows = load_rows(source, split)
    if not rows:
        raise ValueError(f"responses source {source!r} is empty")
    name = dataset_name(source)
    skipped = {"failed": 0, "thinking": 0, "no_exchange": 0}
    usable = []
    for index, row in enumerate(rows):
        if row.get("status") not in (None, "success"):
            skipped["failed"] += 1
            continue
        if row.get("thinking") not in (None, False, "off", "false", 0):
            skipped["thinking"] += 1
            continue
        turns = row.get("conversations", row.get("messages"))
        if turns is not None and not (isinstance(turns, list) and all(isinstance(turn, dict) for turn in turns)):
            raise DamagedFile(f"{source} row {index}: 'conversations' is a {type(turns).__name__}, not a list "
                              f"of turns ({{'role', 'content'}} or {{'from', 'value'}} objects); {FIX_IMPORT}")
        exchange = first_exchange(turns)
        if exchange is None:
            skipped["no_exchange"] += 1
            continue
        usable.append({"id": str(row.get("id", f"{name}-{index}")), "conversations": exchange})
    if not usable:
        raise ValueError(f"responses source {source!r} has no usable conversation ({skipped})")
    chosen = sorted(random.Random(seed).sample(range(len(usable)), min(num_conversations, len(usable))))
    atomic_write_jsonl(out_path, [usable[i] for i in chosen])
    return {"written": len(chosen), "usable": len(usable), **skipped}
