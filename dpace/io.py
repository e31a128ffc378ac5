"""Small, careful file helpers: atomic writes, jsonl with line-numbered errors, resumable appends."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary file in the same folder, then rename: a killed job leaves no half file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, data) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def atomic_write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """Rows of a jsonl file; a malformed line is an error naming the file and line number."""
    path = Path(path)
    with path.open() as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: malformed JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_number}: expected a JSON object per line")
            yield row


def read_partial_jsonl(path: str | Path) -> list[dict]:
    """Complete rows of a file being appended to; a torn last line (killed writer) is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with path.open() as handle:
        for line in handle:
            if not line.endswith("\n"):
                break
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    # Rewrite without the torn tail so later appends start on a clean line.
    atomic_write_jsonl(path, rows)
    return rows


class JsonlAppender:
    """Append rows and flush each one, so an interrupted job keeps every finished record."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("a")

    def write(self, row: dict) -> None:
        self._handle.write(json.dumps(row) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
