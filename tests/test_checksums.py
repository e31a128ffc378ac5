"""Issue 56, item 2: what the pipeline trusts is checked by its content, not its modification time. A damaged
file that still parses (4 KiB of weights or of a feature shard flipped, a blocks.csv cut short) is refused
when read, naming the file and what to delete. (Item 6, versions in the fingerprints: tests/test_fingerprint.py;
edits whose modification time lies: tests/test_tracking.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def flip_4_kib(path: Path) -> None:
    """Flip every bit of 4 KiB in the middle of ``path``: the header is intact, so the file still loads."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(b ^ 0xFF for b in data[middle:middle + 4096])
    path.write_bytes(bytes(data))


def test_a_target_whose_weights_have_4_kib_flipped_is_refused_naming_the_file(tiny_target_json, tmp_path):
    """Before: training ran on it to a final loss of 1.65e+29, and an evaluation failed on a records-key
    mismatch that did not say the target changed."""
    from dpace.io import DamagedFile
    from dpace.targets import load_target, target_checksum

    shutil.copytree(tiny_target_json.parent, tmp_path / "tiny")
    target_json = tmp_path / "tiny" / "target.json"
    load_target(target_json)  # intact: loads
    weights = tmp_path / "tiny" / "model" / "model.safetensors"
    flip_4_kib(weights)
    message = rf"{weights}: changed since the target was prepared \({target_json}\); delete {tmp_path / 'tiny'} and rerun"
    with pytest.raises(DamagedFile, match=message):
        load_target(target_json)  # what training, features, responses and evaluation load
    with pytest.raises(DamagedFile, match=message):
        target_checksum(target_json)  # what every resumable job's records are keyed by


def test_a_local_target_folder_changed_after_it_was_prepared_is_refused(tiny_target_json, tmp_path):
    """A target read from a folder outside results/ (a local HF folder): its files' checksums are recorded
    when it is prepared, and a file changed since is refused until it is prepared again."""
    from dpace.io import DamagedFile
    from dpace.targets import load_tokenizer, prepare_target

    shutil.copytree(tiny_target_json.parent / "model", tmp_path / "local")
    target_json = prepare_target({"source": str(tmp_path / "local")}, tmp_path / "prepared")
    load_tokenizer(target_json)
    config = tmp_path / "local" / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{", "{ ", 1))
    with pytest.raises(DamagedFile, match=rf"{config}: changed since the target was prepared"):
        load_tokenizer(target_json)


def test_a_feature_shard_with_4_kib_flipped_is_refused_naming_it(tiny_target_json, tmp_path):
    """Before: training read it and ended with rc 0; shards carried no checksum."""
    from dpace.features import FeatureSettings, compute_features, load_features
    from dpace.io import DamagedFile, atomic_write_jsonl

    conversations = tmp_path / "conv.jsonl"
    atomic_write_jsonl(conversations, [
        {"id": str(i), "conversations": [{"role": "user", "content": f"question {i} " * 8},
                                         {"role": "assistant", "content": f"an answer to {i} " * 8}]}
        for i in range(4)])
    features = tmp_path / "features"
    compute_features(tiny_target_json, conversations, features,
                     FeatureSettings(target_layer_ids=[1, 3], max_seq_length=256, batch_size=2))
    assert len(load_features(features)) == 4
    shard = next(features.glob("shard-*.safetensors"))
    flip_4_kib(shard)
    with pytest.raises(DamagedFile, match=rf"{shard}: changed since the feature folder was written .*delete {features} and rerun"):
        load_features(features)


def evaluation_outputs(folder: Path) -> tuple[Path, Path]:
    """An evaluation's summary.json and a blocks.csv of 10 rows, with the checksums the evaluation records."""
    import json

    from dpace.io import atomic_write_text, record_checksums

    summary, blocks = folder / "summary.json", folder / "blocks.csv"
    folder.mkdir(parents=True)
    atomic_write_text(summary, json.dumps([{"benchmark": "math500", "temperature": 0.0, "tau": 1.5}]))
    atomic_write_text(blocks, "benchmark,temperature,position,accepted\n"
                      + "".join(f"math500,0.0,{i},{i % 3}\n" for i in range(10)))
    record_checksums(summary, blocks)
    return summary, blocks


VARIANTS = [{"target": "tiny", "variant": "dflash-d1-b4-e2", "experiment": "main", "objective": "dflash",
             "depth": 1, "block_size": 4}]


def test_a_blocks_csv_cut_to_3_rows_is_refused_by_the_metrics_naming_it(tmp_path):
    """Before: the metrics job ended with rc 0 and the report silently used 3 rows."""
    from dpace.io import DamagedFile
    from dpace.report.collect import experiment_metrics

    summary, blocks = evaluation_outputs(tmp_path / "eval" / "tiny" / "dflash-d1-b4-e2" / "epoch-2" / "full")
    _, frame, _ = experiment_metrics(VARIANTS, [str(summary)])
    assert len(frame) == 10
    blocks.write_text("".join(blocks.read_text().splitlines(keepends=True)[:4]))  # the header and 3 rows
    with pytest.raises(DamagedFile, match=rf"{blocks}: changed since the evaluation wrote it .*delete {summary.parent} and rerun"):
        experiment_metrics(VARIANTS, [str(summary)])


def test_an_evaluation_summary_edited_after_its_job_is_refused(tmp_path):
    from dpace.io import DamagedFile
    from dpace.report.collect import experiment_metrics

    summary, _ = evaluation_outputs(tmp_path / "eval" / "tiny" / "dflash-d1-b4-e2" / "epoch-2" / "full")
    summary.write_text(summary.read_text().replace("1.5", "2.5"))
    with pytest.raises(DamagedFile, match=rf"{summary}: changed since the evaluation wrote it"):
        experiment_metrics(VARIANTS, [str(summary)])
    (summary.parent / "checksums.json").unlink()
    with pytest.raises(DamagedFile, match=rf"{summary}: no checksums.json beside it"):
        experiment_metrics(VARIANTS, [str(summary)])



def test_a_training_steps_jsonl_cut_short_is_refused_by_the_training_tables(tmp_path):
    """The drafter's steps.jsonl and summary.json, as training writes them, are verified by the training tables' job."""
    from dpace.io import DamagedFile
    from dpace.report.collect import training_frames
    from dpace.training.training_records import write_records

    folder = tmp_path / "drafters" / "tiny" / "dflash-d1-b4-e2"
    rows = [{"step": i, "global_step": i, "epoch": 1, "loss": 1.0 / (i + 1), "weight_per_position": [1.0, 0.5]}
            for i in range(10)]
    write_records(folder, rows, {"epochs": 1, "steps": 10, "time_per_epoch_s": 1.0, "time_per_step_s": 0.1})
    variants = [{**VARIANTS[0], "variant": folder.name}]
    steps, _ = training_frames(variants, [str(folder)])
    assert len(steps) == 10
    lines = (folder / "steps.jsonl").read_text().splitlines(keepends=True)
    (folder / "steps.jsonl").write_text("".join(lines[:3]))
    with pytest.raises(DamagedFile, match=rf"{folder / 'steps.jsonl'}: changed since the training wrote it .*delete {folder} and rerun its training"):
        training_frames(variants, [str(folder)])
