"""Atomic outputs: a writer that fails or is killed mid-write leaves nothing where the next stage reads.

Each writer is made to fail after it has written part of its artifact; the artifact's path must then
hold nothing (or what it held before), never the partial write.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from dpace.io import atomic_file, atomic_folder, atomic_write_text, remove_killed_writes


class Interrupted(Exception):
    pass


def test_a_failed_file_writer_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    with pytest.raises(Interrupted), atomic_file(path) as tmp:
        tmp.write_text('{"half":')
        raise Interrupted
    assert not path.exists() and list(tmp_path.iterdir()) == []
    atomic_write_text(path, "old\n")
    with pytest.raises(Interrupted), atomic_file(path) as tmp:
        tmp.write_text("new, half")
        raise Interrupted
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.json"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())  # as a plain open() makes it


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_failed_folder_writer_leaves_the_previous_folder_whole(tmp_path):
    path = tmp_path / "epoch-1"
    with pytest.raises(Interrupted), atomic_folder(path) as tmp:
        (tmp / "config.json").write_text("{}")
        raise Interrupted
    assert not path.exists() and list(tmp_path.iterdir()) == []
    with atomic_folder(path) as tmp:
        (tmp / "config.json").write_text("first")
        (tmp / "stale.bin").write_text("only in the first attempt")
    with pytest.raises(Interrupted), atomic_folder(path) as tmp:
        (tmp / "config.json").write_text("second, half")
        raise Interrupted
    assert (path / "config.json").read_text() == "first"
    with atomic_folder(path) as tmp:  # a complete rewrite replaces the folder as a whole, never merges
        (tmp / "config.json").write_text("third")
    assert sorted(p.name for p in path.iterdir()) == ["config.json"]
    assert (path / "config.json").read_text() == "third" and [p.name for p in tmp_path.iterdir()] == ["epoch-1"]


KILLED_WRITER = """
import os, signal, sys
from dpace.io import atomic_file, atomic_folder
kind, path = sys.argv[1], sys.argv[2]
with (atomic_file if kind == "file" else atomic_folder)(path) as tmp:
    target = tmp if kind == "file" else tmp / "model.safetensors"
    with open(target, "w") as handle:
        handle.write("part of the weights")
        handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup: as a preempted job
"""


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_sigkilled_writer_leaves_only_a_hidden_temporary(tmp_path, kind):
    path = tmp_path / "artifact"
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED_WRITER), kind, str(path)],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not path.exists()
    (leftover,) = tmp_path.iterdir()
    assert leftover.name.startswith(".artifact.") and leftover.name.endswith(".tmp")
    # The job owning the folder, started again, removes the leftover and nothing else.
    for name in ("artifact-2", ".snakemake_timestamp"):
        (tmp_path / name).write_text("kept")
    assert remove_killed_writes(tmp_path) == [leftover]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".snakemake_timestamp", "artifact-2"]


def test_a_figure_whose_png_fails_leaves_no_png_and_a_complete_pdf(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from dpace.report.figures import save_figure

    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    original = Figure.savefig

    def failing_png(self, fname, *args, **kwargs):
        if kwargs.get("format") == "png":
            with open(fname, "wb") as handle:
                handle.write(b"\x89PNG\r\n")  # the first bytes, then the writer dies
            raise Interrupted
        return original(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", failing_png)
    with pytest.raises(Interrupted):
        save_figure(fig, tmp_path / "fig.pdf", tmp_path / "fig.png")
    assert (tmp_path / "fig.pdf").read_bytes().rstrip().endswith(b"%%EOF")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.pdf"]


class HalfSavingModel:
    """save_pretrained writes the config, then dies before the weights (as a full disk or a kill would)."""

    def save_pretrained(self, path, **kwargs):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as handle:
            handle.write("{}")
        raise Interrupted


def test_a_drafter_epoch_that_fails_mid_save_is_not_there(tmp_path):
    from dpace.training.drafter import save_drafter

    with pytest.raises(Interrupted):
        save_drafter(HalfSavingModel(), tmp_path / "epoch-1")
    assert list(tmp_path.iterdir()) == []  # load_drafter would otherwise find a config without weights


def test_features_that_fail_at_the_second_shard_leave_no_folder(tmp_path, tiny_target_json, monkeypatch):
    import dpace.features as features
    from dpace.io import atomic_write_jsonl

    conversations = [{"id": str(i), "conversations": [{"role": "user", "content": f"question {i}"},
                                                      {"role": "assistant", "content": f"answer {i} " * 4}]}
                     for i in range(4)]
    atomic_write_jsonl(tmp_path / "c.jsonl", conversations)
    written, original = [], features.save_file

    def save_file(tensors, path):
        if written:
            raise Interrupted
        written.append(path)
        return original(tensors, path)

    monkeypatch.setattr(features, "save_file", save_file)
    with pytest.raises(Interrupted):
        features.compute_features(tiny_target_json, tmp_path / "c.jsonl", tmp_path / "features",
                                  features.FeatureSettings(target_layer_ids=[1], max_seq_length=256, batch_size=1),
                                  shard_tokens=1)
    assert len(written) == 1  # one shard had been written when the writer died
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_a_target_whose_tokenizer_fails_to_save_leaves_no_model_folder(tmp_path, monkeypatch):
    import dpace.targets as targets

    tokenizer = targets.embedded_tokenizer()

    def failing_save(path, *args, **kwargs):
        with open(os.path.join(path, "tokenizer.json"), "w") as handle:
            handle.write("{")  # part of the tokenizer, then the writer dies
        raise Interrupted

    monkeypatch.setattr(tokenizer, "save_pretrained", failing_save)
    monkeypatch.setattr(targets, "embedded_tokenizer", lambda: tokenizer)
    with pytest.raises(Interrupted):
        targets.prepare_target({"source": "random", "num_layers": 2, "hidden_size": 32, "intermediate_size": 64},
                               tmp_path / "tiny")
    assert list((tmp_path / "tiny").iterdir()) == []  # neither model/ nor target.json


def test_input_checksum_follows_names_and_bytes_not_hidden_leftovers(tmp_path):
    from dpace.io import input_checksum

    folder = tmp_path / "drafter"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "weights.bin").write_bytes(b"\x00\x01")
    before = input_checksum(folder)
    (folder / ".weights.bin.abc.tmp").write_bytes(b"a killed writer's leftover")
    assert input_checksum(folder) == before
    (folder / "sub" / "weights.bin").write_bytes(b"\x00\x02")
    assert input_checksum(folder) != before
    (folder / "sub" / "weights.bin").write_bytes(b"\x00\x01")
    (folder / "sub" / "weights.bin").rename(folder / "sub" / "other.bin")
    assert input_checksum(folder) != before  # same bytes under another name
    assert input_checksum(folder / "config.json") != input_checksum(folder)


def test_a_full_disk_while_saving_a_checkpoint_names_the_path(tmp_path, monkeypatch):
    """safetensors' ``SafetensorError: Error while serializing: IoError(... No space left on device ...)`` names no
    file; the error a user sees names the checkpoint, says the disk is full, and nothing is left at the path."""
    import transformers.modeling_utils
    from safetensors import SafetensorError
    from transformers import LlamaConfig

    from dpace.io import WriteFailed
    from dpace.training.drafter import build_drafter, drafter_config, save_drafter

    def full_disk(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_disk)
    target = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2)
    drafter = build_drafter(drafter_config(target, depth=1, block_size=4, target_layer_ids=[1], mask_token_id=95))
    path = tmp_path / "drafters" / "epoch-1"
    with pytest.raises(WriteFailed, match=f"could not write {path}: SafetensorError: .*No space left on device.*"
                                          r"\(its file system is full: free space there and rerun\)") as failed:
        save_drafter(drafter, path)
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(path)
    assert list(path.parent.iterdir()) == []


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter "
                                                "failed writing file data/0: file write failed")])
def test_a_failed_write_of_a_file_names_its_path(tmp_path, error):
    """torch.save's and a plain write's errors on a full disk: the atomic writer names the file it was writing."""
    from dpace.io import WriteFailed

    path = tmp_path / "scratch" / "state.pt"
    with pytest.raises(WriteFailed, match=f"could not write {path}: {type(error).__name__}: "):
        with atomic_file(path):
            raise error
    assert list(path.parent.iterdir()) == []


def test_an_error_reading_an_input_elsewhere_is_not_called_a_write_failure(tmp_path):
    with pytest.raises(FileNotFoundError):
        with atomic_file(tmp_path / "out" / "x.txt"):
            (tmp_path / "in" / "missing.txt").read_text()
