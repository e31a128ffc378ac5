"""Small, careful file helpers: atomic writes, jsonl with line-numbered errors, resumable appends.

Every artifact a later stage reads is written through ``atomic_file`` (one file) or ``atomic_folder``
(a folder of files): the writer fills a hidden temporary sibling (``.<name>.<random>.tmp``) and it
is renamed into place only when the writer returned. A writer that fails or is killed mid-way leaves
nothing at the artifact's path (a failed writer also removes its temporary; a SIGKILLed one leaves a
hidden ``.tmp`` sibling that no stage reads, and that the job owning the folder removes when it starts
again: ``remove_killed_writes``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _as_created(path: Path, mode: int) -> None:
    """mkstemp/mkdtemp create owner-only entries; give the artifact the mode a plain open would."""
    os.chmod(path, mode & ~_umask())


class WriteFailed(OSError):
    """A write the operating system refused (a full disk, a quota, permissions, a read-only file system): the
    message names the artifact's path, which the writer's own error (safetensors', torch's) often does not.
    ``errno`` and ``filename`` are set as an OSError's; the message is the one line given."""

    def __str__(self) -> str:
        return str(self.args[0])


def _is_os_failure(error: BaseException, folder: Path) -> bool:
    """An error of the file system under a writer into ``folder``: an OSError about no file or a file there (not
    an input the writer reads elsewhere), or a library's wrapping of one (safetensors' ``SafetensorError: ...
    IoError(Os { code: 28 ...``, torch's ``PytorchStreamWriter failed writing file``)."""
    if isinstance(error, OSError):
        return error.filename is None or Path(os.fsdecode(error.filename)).resolve().is_relative_to(folder.resolve())
    text = str(error)
    return type(error).__name__ == "SafetensorError" and ("IoError" in text or "os error" in text.lower()) or (
        isinstance(error, RuntimeError) and ("failed writing" in text or "file write failed" in text))


def _write_failed(path: Path, error: BaseException) -> WriteFailed:
    text = str(error)
    full = getattr(error, "errno", None) == errno.ENOSPC or "No space left" in text or "StorageFull" in text
    hint = "its file system is full: free space there and rerun" if full else "check the folder and rerun"
    failed = WriteFailed(f"could not write {path}: {type(error).__name__}: {text} ({hint})")
    failed.errno = errno.ENOSPC if full else getattr(error, "errno", None)
    failed.filename = str(path)
    return failed


@contextmanager
def _naming_the_path(path: Path) -> Iterator[None]:
    """Re-raise a file-system error of the block as ``WriteFailed`` naming ``path``."""
    try:
        yield
    except WriteFailed:
        raise
    except Exception as error:
        if _is_os_failure(error, path.parent):
            raise _write_failed(path, error) from error
        raise


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it to ``path`` when the block ends normally.

    The writer inside the block writes the whole file to the yielded path (e.g. ``savefig(tmp)``);
    on an exception the temporary is removed and ``path`` keeps whatever it held before.
    """
    path = Path(path)
    with _naming_the_path(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
    tmp = Path(tmp)
    try:
        with _naming_the_path(path):
            yield tmp
            _as_created(tmp, 0o666)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder next to ``path``; it becomes ``path`` when the block ends normally.

    An older folder at ``path`` (a previous attempt's) is replaced as a whole, never merged. On an
    exception the temporary folder is removed and ``path`` is left as it was.
    """
    path = Path(path)
    with _naming_the_path(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        with _naming_the_path(path):
            yield tmp
            _as_created(tmp, 0o777)
            if path.exists():
                # Two renames: in between, path is absent, never partial.
                old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
                os.replace(path, old / "previous")
                os.replace(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_killed_writes(folder: str | Path) -> list[Path]:
    """Remove the hidden temporaries (``.<name>.<random>.tmp`` and ``.old``) that writers killed mid-way
    (SIGKILL, a cluster's time limit) left directly in ``folder``, and return them. Only the job that owns
    ``folder`` may call it, at its start: another writer's temporary there would be in use."""
    folder = Path(folder)
    debris = sorted(entry for entry in folder.glob(".*") if entry.name.endswith((".tmp", ".old")))
    for entry in debris:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    return debris


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary file in the same folder, then rename: a killed job leaves no half file."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: str | Path, data) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def atomic_write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


REMAKE = "delete it and rerun (the job that made it makes it again)"


class DamagedFile(ValueError):
    """A file that cannot be what it should be (torn, truncated, not UTF-8, of the wrong shape). Its
    message names the path and what to do."""


def read_json(path: str | Path, *, fix: str = REMAKE):
    """The JSON value in ``path``; a damaged file fails naming its path, line and ``fix``."""
    path = Path(path)
    text = _utf8(path.read_bytes(), path, fix)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DamagedFile(f"{path}:{error.lineno}: malformed JSON ({error.msg}); {fix}") from None


def _utf8(data: bytes, where, fix: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DamagedFile(f"{where}: not UTF-8 (byte {data[error.start:error.start + 1]!r} at position "
                          f"{error.start}); {fix}") from None


def read_jsonl(path: str | Path, *, fix: str = REMAKE) -> Iterator[dict]:
    """Rows of a jsonl file; a malformed or non-UTF-8 line is an error naming the file, line and ``fix``."""
    path = Path(path)
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            where = f"{path}:{line_number}"
            line = _utf8(raw, where, fix)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DamagedFile(f"{where}: malformed JSON ({error.msg}); {fix}") from None
            if not isinstance(row, dict):
                raise DamagedFile(f"{where}: expected a JSON object per line; {fix}")
            yield row


def load_safetensors(path: str | Path, *, fix: str = REMAKE) -> dict:
    """The tensors of a safetensors file; a truncated or damaged one fails naming its path and ``fix``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise DamagedFile(f"{path}: damaged safetensors file ({error}); {fix}") from None


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


def current_records(records_path, **made) -> list[dict]:
    """The records of a resumable job's ``records_path`` made with exactly ``made`` (settings and
    input checksums).

    The others are stale: the job runs again because an input changed (a retrained drafter, another
    dtype, length or baseline), so their work is done again. They are dropped from the file
    too, so that it never holds two runs' records.
    """
    records = read_partial_jsonl(records_path)
    current = [record for record in records if {key: record.get(key) for key in made} == made]
    if len(current) < len(records):
        print(f"{records_path}: {len(records) - len(current)} record(s) made with other inputs or settings "
              f"are done again")
        atomic_write_jsonl(records_path, current)
    return current


def input_checksum(path: str | Path) -> int:
    """CRC32 of a file, or of a folder's files (names and bytes, in sorted order; hidden ones, such as
    a killed writer's ``.tmp``, left out): a drafter checkpoint or a target's weights. Records carry
    it, so a resumed job never reuses another input's."""
    path = Path(path)
    files = [path] if path.is_file() else [
        file for file in path.rglob("*")
        if file.is_file() and not any(part.startswith(".") for part in file.relative_to(path).parts)]
    checksum = 0
    for file in sorted(files):
        name = file.name if file == path else file.relative_to(path).as_posix()
        checksum = zlib.crc32(name.encode(), checksum)
        with file.open("rb") as handle:
            while chunk := handle.read(1 << 24):
                checksum = zlib.crc32(chunk, checksum)
    return checksum


def content_digest(paths: Iterable[str | Path]) -> str:
    """One hex digest of the files' names and bytes (``input_checksum`` of each, in the order given).

    A rule passes it as a param for the files it reads from outside ``results/`` (the data mirror, a local
    target, imported answers): a params change reruns the job, so an edit is seen whatever the file's
    modification time says (``cp -p`` and ``rsync -t`` keep an old one; a clock can put an output in the future).
    """
    digest = 0
    for path in paths:
        digest = zlib.crc32(f"{path}\0{input_checksum(path)}\0".encode(), digest)
    return f"{digest:08x}"


CHECKSUMS = "checksums.json"


def _file_checksums(folder: Path) -> dict[str, int]:
    return {file.relative_to(folder).as_posix(): input_checksum(file) for file in sorted(folder.rglob("*"))
            if file.is_file() and file.name != CHECKSUMS and not file.name.startswith(".")}


def write_checksums(folder: str | Path) -> None:
    """A sidecar ``checksums.json`` (CRC32 per file) for a folder a later job reads without Snakemake
    tracking its content (a drafter checkpoint): ``verify_checksums`` refuses it once a file changed."""
    folder = Path(folder)
    atomic_write_json(folder / CHECKSUMS, _file_checksums(folder))


def verify_checksums(folder: str | Path, *, fix: str = REMAKE, what: str = "the checkpoint") -> None:
    """Fail naming the first file of ``folder`` that is missing, added or changed since ``write_checksums``
    (``what``: the artifact, as the message names it)."""
    folder = Path(folder)
    if not (folder / CHECKSUMS).is_file():
        raise DamagedFile(f"{folder}: no {CHECKSUMS} (written with {what}); {fix}")
    expected = read_json(folder / CHECKSUMS, fix=fix)
    verify_files(folder, expected, since=f"{what} was written (its {CHECKSUMS})", fix=fix)


def record_checksums(*paths: str | Path) -> None:
    """Record each file's CRC32 in the ``checksums.json`` beside it (kept with the other files it lists), for
    ``verify_recorded`` when a later job reads it: an evaluation's ``summary.json`` and ``blocks.csv``."""
    by_folder: dict[Path, list[Path]] = {}
    for path in map(Path, paths):
        by_folder.setdefault(path.parent, []).append(path)
    for folder, files in by_folder.items():
        sidecar = folder / CHECKSUMS
        try:
            recorded = read_json(sidecar) if sidecar.is_file() else {}
        except DamagedFile:
            recorded = {}
        atomic_write_json(sidecar, {**recorded, **{file.name: input_checksum(file) for file in files}})


def verify_recorded(path: str | Path, *, what: str, fix: str = REMAKE) -> None:
    """Fail, naming ``path`` and ``fix``, unless its bytes are those ``record_checksums`` recorded when ``what``
    wrote it (a flipped byte, a file cut short or edited after the job that made it)."""
    path = Path(path)
    sidecar = path.parent / CHECKSUMS
    if not sidecar.is_file():
        raise DamagedFile(f"{path}: no {CHECKSUMS} beside it (written with {what}); {fix}")
    expected = read_json(sidecar, fix=fix).get(path.name)
    if expected is None:
        raise DamagedFile(f"{path}: not in {sidecar} (written with {what}); {fix}")
    if input_checksum(path) != expected:
        raise DamagedFile(f"{path}: changed since {what} wrote it (its {CHECKSUMS}); {fix}")


def folder_checksums(folder: str | Path) -> dict[str, int]:
    """CRC32 per file of ``folder`` (relative names; hidden files and ``checksums.json`` left out)."""
    return _file_checksums(Path(folder))


def verify_files(folder: str | Path, expected: dict[str, int], *, since: str, fix: str = REMAKE) -> None:
    """Fail naming the first file of ``folder`` that is missing, added or changed against ``expected``
    (``folder_checksums`` taken when it was made: ``since`` says when)."""
    folder = Path(folder)
    found = _file_checksums(folder)
    for name in sorted(set(expected) | set(found)):
        if expected.get(name) != found.get(name):
            state = "missing" if name not in found else "added" if name not in expected else "changed"
            raise DamagedFile(f"{folder / name}: {state} since {since}; {fix}")


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
