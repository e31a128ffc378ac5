"""Issue 50, item 1: every file a job reads is tracked by Snakemake, so an edit reruns what depends on it
and nothing else. On the smoke DAG with a local target folder, imported answers and a copy of the data
mirror; its outputs are stand-ins (``--touch``), so each probe is a dry run of seconds, not a pipeline run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from workflow_runs import MIRROR, planned_jobs, snakemake, write_config

pytestmark = pytest.mark.slow


def outputs_of_the_dag(workdir: Path, config: Path) -> list[tuple[str, str]]:
    """(output path, rule) of every job of ``all``, from ``--summary``."""
    result = snakemake(workdir, config, "--summary", "all")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("\t") for line in result.stdout.splitlines()[1:] if "\t" in line]
    return [(row[0], row[2]) for row in rows]


@pytest.fixture(scope="module")
def built(tmp_path_factory, mirror):
    """A workdir whose every output of ``all`` exists and is up to date (Snakemake's metadata included)."""
    root = tmp_path_factory.mktemp("tracking")
    shutil.copytree(MIRROR, root / "mirror")
    (root / "target").mkdir()
    (root / "target" / "config.json").write_text('{"model_type": "llama"}\n')
    (root / "answers.jsonl").write_text('{"conversations": [{"from": "human", "value": "hi"}, '
                                        '{"from": "gpt", "value": "hello"}]}\n')
    workdir = root / "work"
    workdir.mkdir()
    config = write_config(workdir, **{"data.mirror": str(root / "mirror"), "targets.tiny.source": str(root / "target"),
                                      "targets.tiny.responses": str(root / "answers.jsonl")})
    for path, rule in outputs_of_the_dag(workdir, config):
        if rule == "features":  # a directory output
            (workdir / path).mkdir(parents=True, exist_ok=True)
        else:
            (workdir / path).parent.mkdir(parents=True, exist_ok=True)
            (workdir / path).touch()
    touched = snakemake(workdir, config, "--touch", "all")
    assert touched.returncode == 0, touched.stderr[-3000:]
    assert planned_jobs(snakemake(workdir, config, "-n", "all")) == {}
    return root, workdir, config


def plan_after_edit(built, path: Path) -> dict[str, int]:
    """The jobs ``all`` plans once a line is appended to ``path``; ``path`` is restored afterwards."""
    _, workdir, config = built
    before = path.read_bytes()
    path.write_bytes(before + b'{"edited": true}\n')
    try:
        return planned_jobs(snakemake(workdir, config, "-n", "all"))
    finally:
        path.write_bytes(before)
        # A restored source file is still newer than the outputs (--touch recorded no input checksums to
        # compare its content with): mark them up to date again for the next probe.
        assert snakemake(workdir, config, "--touch", "all").returncode == 0
        assert planned_jobs(snakemake(workdir, config, "-n", "all")) == {}


def test_an_edited_mirror_row_reruns_its_benchmark_and_what_reads_it(built):
    root = built[0]
    jobs = plan_after_edit(built, root / "mirror" / "benchmarks" / "mt_bench.jsonl")
    assert jobs["benchmark_prompts"] == 1 and jobs["evaluate"] > 0 and jobs["autoregressive_baseline"] == 1
    assert not {"prepare_target", "import_responses", "features", "train_drafter"} & set(jobs)


def test_an_edited_imported_answers_file_retrains(built):
    root = built[0]
    jobs = plan_after_edit(built, root / "answers.jsonl")
    assert jobs["import_responses"] == 1 and jobs["features"] == 1 and jobs["train_drafter"] > 0
    assert not {"prepare_target", "benchmark_prompts", "autoregressive_baseline"} & set(jobs)


def test_an_edited_file_of_a_local_target_folder_prepares_it_again(built):
    root = built[0]
    jobs = plan_after_edit(built, root / "target" / "config.json")
    assert jobs["prepare_target"] == 1 and jobs["train_drafter"] > 0
    assert "benchmark_prompts" not in jobs


def test_an_edited_blocks_csv_remakes_the_metrics_not_the_evaluation(built):
    workdir = built[1]
    blocks = next((workdir / "results" / "eval").glob("*/*/epoch-*/full/blocks.csv"))
    jobs = plan_after_edit(built, blocks)
    assert jobs["experiment_metrics"] >= 1 and jobs["render_table"] >= 1
    assert not {"evaluate", "train_drafter", "experiment_training"} & set(jobs)


def test_an_edited_steps_jsonl_remakes_the_training_tables_not_the_training(built):
    workdir = built[1]
    steps = next((workdir / "results" / "drafters").glob("*/dflash-*-d1-b4-e2/steps.jsonl"))  # one of Table 1's
    jobs = plan_after_edit(built, steps)
    # every experiment whose training table the DAG makes and that trained this drafter (main; smoothing's
    # weight-shift claim reads its own): remade, and only those
    from dpace.config import experiments

    config = yaml.safe_load(built[2].read_text())
    tabled = {path.name.removesuffix("_train_steps.csv") for path in (workdir / "results" / "metrics").glob("*_train_steps.csv")}
    readers = [name for name, experiment in experiments(config).items()
               if name in tabled and steps.parent.name in {v.id for v in experiment.variants}]
    assert "main" in readers
    assert jobs["experiment_training"] == len(readers), (jobs, readers)
    assert not {"train_drafter", "evaluate", "experiment_metrics"} & set(jobs)



def test_an_edit_whose_modification_time_lies_still_reruns_what_reads_it(built):
    """Issue 56, item 2: files are trusted by their content, not their modification time. A mirror row edited
    and its time set back (as ``cp -p`` and ``rsync -t`` do), and a local target's file edited while the
    prepared ``target.json`` has a time in the future, each rerun what reads them (their digest is a param)."""
    import os
    import time

    root, workdir, config = built
    # --touch records no params for the jobs whose outputs it found up to date (the readers of these files): force it.
    forced = snakemake(workdir, config, "--touch", "--forcerun", "benchmark_prompts", "prepare_target", "--", "all")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert planned_jobs(snakemake(workdir, config, "-n", "all")) == {}
    mirror = root / "mirror" / "benchmarks" / "mt_bench.jsonl"
    target_file = root / "target" / "config.json"
    target_json = workdir / "results" / "targets" / "tiny" / "target.json"
    saved = {path: (path.read_bytes(), path.stat()) for path in (mirror, target_file, target_json)}
    try:
        mirror.write_bytes(saved[mirror][0] + b'{"edited": true}\n')
        os.utime(mirror, ns=(saved[mirror][1].st_atime_ns, saved[mirror][1].st_mtime_ns))
        jobs = planned_jobs(snakemake(workdir, config, "-n", "all"))
        assert jobs.get("benchmark_prompts") == 1 and jobs.get("evaluate", 0) > 0, jobs
        assert "prepare_target" not in jobs
        mirror.write_bytes(saved[mirror][0])
        os.utime(mirror, ns=(saved[mirror][1].st_atime_ns, saved[mirror][1].st_mtime_ns))

        future = time.time() + 3600
        os.utime(target_json, (future, future))
        target_file.write_bytes(saved[target_file][0].replace(b"llama", b"qwen3"))
        jobs = planned_jobs(snakemake(workdir, config, "-n", "all"))
        assert jobs.get("prepare_target") == 1 and jobs.get("train_drafter", 0) > 0, jobs
    finally:
        for path, (data, stat) in saved.items():
            path.write_bytes(data)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert planned_jobs(snakemake(workdir, config, "-n", "all")) == {}


def test_a_mirror_copied_again_with_new_times_reruns_nothing(tmp_path, mirror):
    """A data mirror copied anew (a re-synced or re-provisioned ../shared/data: same content, every file newer
    than the outputs) must not rerun the DAG. Snakemake compares such a file with the checksum it recorded when
    the job ran, but only for files up to ``max-checksum-file-size`` (default 1 MB; the ShareGPT mirror is
    18 MB): the profiles raise it. A real ``training_prompts`` job, so that Snakemake records the checksums."""
    import os
    import time

    copy = tmp_path / "mirror"
    shutil.copytree(MIRROR, copy)
    sharegpt = copy / "train" / "sharegpt.jsonl"
    assert sharegpt.stat().st_size > 1_000_000  # above Snakemake's default checksum limit
    workdir = tmp_path / "work"
    workdir.mkdir()
    config = write_config(workdir, **{"data.mirror": str(copy)})
    target = next(path for path, rule in outputs_of_the_dag(workdir, config) if rule == "training_prompts")
    ran = snakemake(workdir, config, target)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert planned_jobs(snakemake(workdir, config, "-n", target)) == {}
    later = time.time() + 3600
    for path in copy.rglob("*.jsonl"):
        os.utime(path, (later, later))
    assert planned_jobs(snakemake(workdir, config, "-n", target)) == {}
    sharegpt.write_bytes(sharegpt.read_bytes() + b"\n")  # a real change still reruns it
    assert planned_jobs(snakemake(workdir, config, "-n", target)) == {"training_prompts": 1}
