"""The Snakemake DAG: one real end-to-end run of the smoke config, its caching and determinism."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from workflow_runs import (
    BENCHMARKS,
    REPO,
    SECRET,
    SMOKE,
    TEMPERATURES,
    planned_jobs,
    shared_smoke_all,
    snakemake,
    snakemake_command,
    with_lindecay,
    write_config,
)

# Every test here runs Snakemake (a real run of the smoke DAG, or dry runs): `-m "not slow"` leaves them out.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, mirror):
    """One real run of the whole smoke DAG: every table and figure (tiny random target), shared with
    tests/test_cluster.py's comparison (``shared_smoke_all``)."""
    workdir, config, _ = shared_smoke_all(tmp_path_factory)
    return workdir, config


def tau_cells(latex: str) -> dict[tuple, str]:
    """The printed tau of each (temperature, depth, method label, benchmark label) cell of table_main
    (checked against a table rendered from tests/data/metrics.csv in tests/test_tables.py)."""
    lines = [line.strip() for line in latex.splitlines()]
    header = next(line for line in lines if "Avg." in line and "multicolumn{2}" in line)
    labels = re.findall(r"\\multicolumn\{2\}\{c\|?\}\{([^}]*)\}", header)
    cells, temperature, depth = {}, None, None
    for line in lines:
        found = re.search(r"\$T = ([\d.]+)\$", line)
        if found:
            temperature = float(found.group(1))
            continue
        if "&" not in line or "Method" in line or "multicolumn" in line:
            continue
        row = [re.sub(r"\\textbf\{(.*)\}", r"\1", c.strip()) for c in line.rstrip("\\").split("&")]
        found = re.search(r"\{(\d+)L\}", row[0])
        depth = int(found.group(1)) if found else depth
        for i, label in enumerate(labels):
            cells[(temperature, depth, row[1], label)] = row[3 + 2 * i]
    return cells


def test_smoke_table_holds_every_measured_cell(smoke_run):
    workdir, _ = smoke_run
    table = (workdir / "results" / "table_main.tex").read_text()
    metrics = pd.read_csv(workdir / "results" / "metrics" / "main.csv")
    assert set(metrics["objective"]) == {"dflash", "topk-prefix", "accept-rate", "dpace"}
    assert len(metrics) == 4 * len(BENCHMARKS) * len(TEMPERATURES)
    # Every measured tau is printed in its own cell (temperature, depth, method, benchmark), rounded.
    from dpace.report.latex import benchmark_label, objective_label
    from dpace.report.metrics_frame import k_of

    cells = tau_cells(table)
    for row in metrics.itertuples():
        key = (row.temperature, row.depth, objective_label(row.objective, k_of(metrics, row.objective)),
               benchmark_label(row.benchmark))
        assert cells[key] == f"{row.tau:.2f}", key
    rows = [line for line in table.splitlines() if "&" in line and ("DFlash" in line or "D-PACE" in line
            or "Top-" in line or "Accept-rate" in line)]
    assert len(rows) == 4 * len(TEMPERATURES)
    columns = 2 + 2 * (len(BENCHMARKS) + 1)  # depth, method, SR and tau per benchmark and average
    assert all(row.count("&") == columns - 1 for row in rows)


def test_smoke_decoding_is_lossless_at_t0(smoke_run):
    workdir, _ = smoke_run
    metrics = pd.read_csv(workdir / "results" / "metrics" / "main.csv")
    greedy = metrics[metrics["temperature"] == 0.0]
    assert len(greedy) == 4 * len(BENCHMARKS)
    # The exactness check decodes N prompts a benchmark, the temperatures in turn: exactly those greedy cells
    # carry a mismatch count, and it is zero (a cell with no decode has none to report).
    from dpace.evaluation.eval_config import EvalConfig

    config = EvalConfig.from_config(SMOKE["eval"], seed=0, tau="replay")
    ranks = {name: rank for rank, name in enumerate(sorted(BENCHMARKS))}
    decoded = {name for name in BENCHMARKS
               if any(config.decodes(ranks[name], index, 0.0) for index in range(config.decoded_prompts_per_benchmark))}
    assert decoded, "the smoke run checks no greedy cell"
    checked = greedy[greedy["greedy_mismatches"].notna()]
    assert set(checked["benchmark"]) == decoded and len(checked) == 4 * len(decoded)
    assert (checked["greedy_mismatches"] == 0).all()
    assert (metrics["tau"] >= 1.0).all() and (metrics["speedup"] > 0).all()


def test_smoke_checkpoints_load_into_dflash(smoke_run):
    from dpace.training.drafter import load_drafter

    workdir, _ = smoke_run
    drafters = sorted(path for path in (workdir / "results" / "drafters" / "tiny").iterdir() if path.is_dir())
    assert len(drafters) == 13  # distinct variants across all experiments (shared ones trained once)
    for drafter in drafters:
        model = load_drafter(drafter / "epoch-2")
        assert model.block_size == int(drafter.name.split("-b")[1].split("-")[0])
        steps = [json.loads(line) for line in (drafter / "steps.jsonl").read_text().splitlines()]
        assert steps and all(len(row["weight_per_position"]) == model.block_size for row in steps)
        assert steps[0]["weight_per_position"][0] == 0.0  # the anchor is never supervised


def test_second_run_does_nothing(smoke_run):
    workdir, config = smoke_run
    assert planned_jobs(snakemake(workdir, config, "-n", "all")) == {}


def test_changing_one_hyperparameter_plans_only_that_variant(smoke_run):
    workdir, _ = smoke_run
    hparams = dict(SMOKE["train"]["objective_hparams"], **{"topk-prefix": {"k": 2}})
    changed = write_config(workdir, **{"train.objective_hparams": hparams})
    result = snakemake(workdir, changed, "-n", "results/table_main.tex")
    jobs = planned_jobs(result)
    # SR: Table 1's timing job times its drafters together, the new one among them
    assert jobs == {"train_drafter": 1, "evaluate": 1, "speedup_timing": 1, "experiment_metrics": 1, "render_table": 1}
    assert "topk-prefix-k2" in result.stdout


EXPECTED_ARTIFACTS = [
    "table_main.tex", "table_cross_model.tex", "table_ablation.tex", "table_block_size.tex", "table_smoothing.tex",
    "table_target_prob.tex", "table_training_time.tex", "table_correlation.tex", "table_objectives_extra.tex",
    "table_normalization.tex", "fig_motivation.pdf", "fig_weight_dynamics.pdf", "fig_tau_trajectory.pdf",
]


def is_number(cell: str) -> bool:
    """A printed measurement: 1.05, $1.05$, \\textbf{1.05}, $\\mathbf{-2.3\\%}$, +4.1%, 173~ms, 2:24, 1.80 / 2.60."""
    bare = re.sub(r"\\(textbf|mathbf)\{|\\%|[${}]", lambda m: "%" if m.group(0) == "\\%" else "", cell).strip()
    number = r"[+-]?\d+(\.\d+)?(%|~?ms|~?s)?|\d+:\d\d"  # 1.05, -2.3%, 173~ms, 2:24 (m:ss)
    return all(re.fullmatch(number, part.strip()) for part in bare.split(" / "))  # "SR / tau"


def test_every_table_and_figure_is_built(smoke_run):
    import matplotlib.image

    workdir, _ = smoke_run
    for name in EXPECTED_ARTIFACTS:
        path = workdir / "results" / name
        if name.endswith(".tex"):
            text = path.read_text()
            assert "\\begin{tabular}" in text and "\\bottomrule" in text, name
            columns = len(re.sub(r"[^lcr]", "", re.search(r"\\begin\{tabular\}\{([^}]*)\}", text).group(1)))
            body = text.split("\\midrule", 1)[1].split("\\bottomrule")[0]
            rows = [line for line in body.splitlines() if "&" in line and "multicolumn" not in line]
            assert rows, name
            # Spearman's rho is undefined when every smoke block emitted the same length: then, and only
            # then, Table 8's rows may hold no number.
            if name == "table_correlation.tex":
                blocks = pd.read_csv(workdir / "results" / "metrics" / "main_blocks.csv")
                undefined_rho = blocks[blocks["objective"] == "dflash"]["tau_block"].nunique() < 2
            else:
                undefined_rho = False
            for row in rows:  # every data row is complete and carries measured numbers, not placeholders only
                cells = row.rstrip().rstrip("\\").split("&")
                assert len(cells) == columns, (name, row)
                assert undefined_rho or any(is_number(c) for c in cells), (name, row)
        else:
            assert path.read_bytes().startswith(b"%PDF"), name
            image = matplotlib.image.imread(path.with_suffix(".png"))
            assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0, name


def test_ablation_table_has_every_epoch(smoke_run):
    workdir, _ = smoke_run
    table = (workdir / "results" / "table_ablation.tex").read_text()
    assert "Epoch & 1 & 2" in table
    for label in ("DFlash", "continuation-only", "cumulative-only", "D-PACE"):
        assert label in table


def test_same_config_gives_identical_metrics(smoke_run, tmp_path):
    """Determinism: a fresh run of the main experiment reproduces every measured metric but time (for two
    of its objectives: the others run the same code and would only lengthen the test)."""
    workdir, _ = smoke_run
    objectives = ["dflash", "dpace"]
    config = write_config(tmp_path, **{"experiments": {"main": dict(SMOKE["experiments"]["main"], objectives=objectives)}})
    result = snakemake(tmp_path, config, "results/metrics/main.csv")
    assert result.returncode == 0, result.stderr[-3000:]
    timing = ["speedup", "ar_tpot_s", "spec_tpot_s"]
    first = pd.read_csv(workdir / "results" / "metrics" / "main.csv").drop(columns=timing)
    first = first[first["objective"].isin(objectives)].reset_index(drop=True)
    second = pd.read_csv(tmp_path / "results" / "metrics" / "main.csv").drop(columns=timing)
    assert sorted(second["objective"].unique()) == objectives
    pd.testing.assert_frame_equal(first, second)
    for name in ("responses/tiny/sharegpt+codealpaca.jsonl",):
        assert (workdir / "results" / name).read_text() == (tmp_path / "results" / name).read_text()
    for drafter in (workdir / "results" / "drafters" / "tiny").iterdir():
        other = tmp_path / "results" / "drafters" / "tiny" / drafter.name
        if other.exists():
            losses = [[json.loads(line)["loss"] for line in (run / "steps.jsonl").read_text().splitlines()]
                      for run in (drafter, other)]
            assert losses[0] == losses[1], drafter.name


def test_no_secret_in_params_logs_or_results(smoke_run):
    """Snakemake keeps params in clear text under .snakemake/metadata: nothing secret may get there."""
    workdir, _ = smoke_run
    leaked = []
    for folder in (workdir / "results", workdir / ".snakemake"):
        for path in folder.rglob("*"):
            if path.is_file() and path.stat().st_size < 50_000_000 and SECRET.encode() in path.read_bytes():
                leaked.append(str(path))
    assert not leaked




def test_a_training_seed_trains_the_drafters_again_on_the_same_answers(smoke_run):
    """train.seed: a second training run of Table 1's drafters, named apart, from the cached features."""
    from dpace.config import experiments

    workdir, _ = smoke_run
    main = experiments(SMOKE)["main"].variants
    seeded = write_config(workdir, **{"train.seed": SMOKE["seed"] + 1})
    # No new prompts, answers or features: only the drafters, their evaluations and the table.
    assert planned_jobs(snakemake(workdir, seeded, "-n", "results/table_main.tex")) == {
        "train_drafter": len(main), "evaluate": len(main), "speedup_timing": 1, "experiment_metrics": 1,
        "render_table": 1}
    first = main[0]
    drafters = workdir / "results" / "drafters" / first.target
    before = (drafters / first.id / "steps.jsonl").stat().st_mtime_ns
    result = snakemake(workdir, seeded, f"results/drafters/{first.target}/{first.id}-s{SMOKE['seed'] + 1}/summary.json")
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((drafters / f"{first.id}-s{SMOKE['seed'] + 1}" / "summary.json").read_text())
    assert summary["config"]["seed"] == SMOKE["seed"] + 1
    losses = [[json.loads(line)["loss"] for line in (drafters / name / "steps.jsonl").read_text().splitlines()]
              for name in (first.id, f"{first.id}-s{SMOKE['seed'] + 1}")]
    assert len(losses[0]) == len(losses[1]) and losses[0] != losses[1]  # same schedule, another initialisation
    assert (drafters / first.id / "steps.jsonl").stat().st_mtime_ns == before  # the first run is kept
    # Setting it to the run's own seed names nothing new.
    assert planned_jobs(snakemake(workdir, write_config(workdir, **{"train.seed": SMOKE["seed"]}), "-n", "all")) == {}


def test_a_later_training_seed_replays_without_the_exactness_checks_decodes(smoke_run):
    """eval.decoded_seeds first (the default): a drafter's first seed decodes a prompt per benchmark for the
    replay's exactness check, its later seeds replay only; every: each seed decodes. The first seed's
    evaluation is not planned again by train.seeds (its settings did not change)."""
    from dpace.config import experiments

    workdir, _ = smoke_run
    first = experiments(SMOKE)["main"].variants[0]
    epoch = SMOKE["train"]["epochs"]

    def evaluation(variant: str) -> str:
        return f"results/eval/{first.target}/{variant}/epoch-{epoch}/full/summary.json"

    def compared(variant: str) -> int:
        rows = json.loads((workdir / evaluation(variant)).read_text())
        return sum((row.get("replay_check") or {}).get("requests_compared", 0) for row in rows)

    seeds = write_config(workdir, **{"train.seeds": 2})
    assert planned_jobs(snakemake(workdir, seeds, "-n", evaluation(first.id))) == {}
    later = evaluation(f"{first.id}-s1")
    result = snakemake(workdir, seeds, later)
    assert result.returncode == 0, result.stderr[-4000:]
    assert compared(first.id) > 0 and compared(f"{first.id}-s1") == 0
    every = write_config(workdir, **{"train.seeds": 2, "eval.decoded_seeds": "every"})
    assert planned_jobs(snakemake(workdir, every, "-n", later)).get("evaluate") == 1
    result = snakemake(workdir, every, later)
    assert result.returncode == 0, result.stderr[-4000:]
    assert compared(f"{first.id}-s1") == compared(first.id)


def test_smoke_scorecard_lists_every_claim(smoke_run):
    """`all` builds results/findings.md: every measurable claim of workflow/claims.yaml has a row and one
    verdict, every other claim is listed as not measurable here."""
    from dpace.report.findings import BEYOND, VERDICTS, not_measurable, read_claims, real_claims

    workdir, _ = smoke_run
    page = (workdir / "results" / "findings.md").read_text()
    claims = read_claims(REPO / "workflow" / "claims.yaml")
    for claim in real_claims(claims):
        row = next(line for line in page.splitlines() if line.startswith(f"| `{claim['id']}`"))
        assert sum(f"**{verdict}**" in row for verdict in (*VERDICTS, BEYOND)) == 1, row
    for claim in not_measurable(claims):
        assert any(line.startswith(f"- `{claim['id']}`") for line in page.splitlines()), claim["id"]
    assert "**not run**" in page  # the smoke config has no other target: Table 2's claims


def readme_recovery_steps() -> list[list[str]]:
    """The commands of the README's "After a crash" section, as argument lists."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## After a crash", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_readmes_unlock_runs_as_written_on_the_default_config(tmp_path):
    """The README's first recovery step exactly as written (no --cores) on config.yaml, whose heavy jobs
    take every core: it removes a killed run's lock (it once failed asking for --cores)."""
    unlock = next(step for step in readme_recovery_steps() if step[:2] == ["snakemake", "--unlock"])
    config = write_config(tmp_path, "config.yaml")
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text(str(tmp_path / "results"))
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
               "--configfile", str(config), "--replace-workflow-config", *unlock[1:]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not locks.exists() or not list(locks.iterdir())


def test_a_run_killed_during_training_finishes_after_the_readmes_steps(smoke_run, tmp_path):
    """SIGKILL a real run's whole process group while a drafter trains (a crash, an OOM kill, a closed
    laptop), then do exactly what the README says: the run finishes, equal to the uninterrupted one."""
    workdir, _ = smoke_run
    steps = readme_recovery_steps()
    main_command = ["snakemake", "--cores", "all", "results/table_main.tex"]
    status_command = ["python", "-m", "dpace.locks", "status"]
    assert steps == [status_command, ["snakemake", "--unlock"], main_command], steps
    drafter = next(v for v in sorted((workdir / "results" / "drafters" / "tiny").iterdir())
                   if v.name.startswith("dflash-") and "-b4-" in v.name).name
    # One drafter's evaluation: every stage up to evaluation, and the smallest DAG that trains.
    target = f"results/eval/tiny/{drafter}/epoch-{SMOKE['train']['epochs']}/full/summary.json"
    config = write_config(tmp_path)
    command, env = snakemake_command(tmp_path, config, target)
    run = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)  # its own process group: Snakemake and its jobs
    training_log = tmp_path / "results" / "logs" / "train" / "tiny" / f"{drafter}.log"
    deadline = time.monotonic() + 600
    while not training_log.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    assert training_log.exists(), "the run ended before training started"
    assert not (tmp_path / "results" / "drafters" / "tiny" / drafter / "summary.json").exists()
    # Without the README's first step the same command stops on the killed run's lock.
    locked = snakemake(tmp_path, config, target)
    assert locked.returncode != 0 and "--unlock" in locked.stdout + locked.stderr, locked.stderr[-3000:]
    # The README's steps: each README command is the killed command with the README's arguments instead
    # of `--cores all results/table_main.tex` (the test's own config, workdir and target stay).
    for step in steps:
        if step == status_command:  # the killed run's jobs are gone: none of them is listed
            status = subprocess.run([sys.executable, *step[1:]], capture_output=True, text=True, timeout=60,
                                    env={**env, "PYTHONPATH": str(REPO)})
            assert status.returncode == 0 and str(tmp_path) not in status.stdout, status.stdout + status.stderr
            continue
        args = [target] if step == main_command else step[1:]
        result = snakemake(tmp_path, config, *args)
        assert result.returncode == 0, (step, result.stderr[-3000:])
    evaluations = [json.loads((run_dir / "results" / target.removeprefix("results/")).read_text())
                   for run_dir in (workdir, tmp_path)]
    timing = ("speedup", "ar_tpot_s", "spec_tpot_s")
    for first, second in zip(*evaluations, strict=True):
        assert {k: v for k, v in first.items() if k not in (*timing, "requests")} == \
            {k: v for k, v in second.items() if k not in (*timing, "requests")}
        assert [r["tau"] for r in first["requests"]] == [r["tau"] for r in second["requests"]]
    losses = [[json.loads(line)["loss"] for line in (run_dir / "results" / "drafters" / "tiny" / drafter /
                                                    "steps.jsonl").read_text().splitlines()]
              for run_dir in (workdir, tmp_path)]
    assert losses[0] == losses[1]
def planned_variants(result: subprocess.CompletedProcess) -> dict[str, set[str]]:
    """{rule: the variants its planned jobs are for} of a dry run (jobs without a variant are left out)."""
    planned: dict[str, set[str]] = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", result.stdout + result.stderr):
        rule = re.match(r"(?:local)?rule (\w+):", block)
        variant = re.search(r"^\s+wildcards:.*\bvariant=([^,\s]+)", block, re.M)
        if rule and variant:
            planned.setdefault(rule.group(1), set()).add(variant.group(1))
    return planned


REPORT_RULES = {"experiment_metrics", "experiment_training", "local_blocks", "render_table", "render_figure", "findings"}


def test_a_new_objective_reruns_only_itself(smoke_run, tmp_path):
    """Issue 44: on a finished results/, a new objective (docs/objectives.md's recipe: one record, one weight
    function and its entry, one config line) in a scratch copy of the code plans its own drafter and evaluations plus the
    reports, and nothing of the other objectives; an edit to DFlash's formula retrains DFlash's drafters only."""
    from dpace.config import all_variants

    workdir, _ = smoke_run
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns(".git", "results", ".snakemake", "__pycache__", "tests"))
    records, objectives = repo / "dpace" / "objective_records.py", repo / "dpace" / "training" / "objectives.py"
    record_source, source = records.read_text(), objectives.read_text()

    def dry_run(code: str, record_code: str = record_source, **overrides) -> subprocess.CompletedProcess:
        records.write_text(record_code)
        objectives.write_text(code)
        command = [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-d", str(workdir),
                   "--configfile", str(write_config(tmp_path, **overrides)), "--replace-workflow-config",
                   "--cores", "2", "-n", "all"]
        return subprocess.run(command, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(repo)})

    # The scratch copy itself changes nothing but the scorecard, whose input workflow/claims.yaml is now
    # another file (the copy's): Snakemake sees a new set of input files.
    assert set(planned_jobs(dry_run(source))) <= {"findings", "all"}

    extras = [*SMOKE["experiments"]["extras"]["objectives"], "lindecay"]
    new_records, new_source = with_lindecay(record_source, source)
    added = dry_run(new_source, new_records, **{"experiments.extras.objectives": extras})
    jobs = planned_jobs(added)
    assert jobs["train_drafter"] == 1 and jobs["evaluate"] >= 1 and set(jobs) <= {"train_drafter", "evaluate",
                                                                                     "all", *REPORT_RULES}, jobs
    variants = planned_variants(added)
    (new,) = variants["train_drafter"]
    assert new.startswith("lindecay-") and variants["evaluate"] == {new}, variants

    dflash = {v.id for v in all_variants(SMOKE).values() if v.objective == "dflash"}
    formula = 'return torch.exp(-(positions - 1).clamp(min=0) / hparams["gamma"])'
    assert formula in source
    edited = dry_run(source.replace(formula, formula.replace('hparams["gamma"]', '(2 * hparams["gamma"])')))
    jobs = planned_jobs(edited)
    # DFlash's drafters are also timed: Table 7's step time and the speedup timing job time them again
    assert jobs["train_drafter"] == len(dflash) and set(jobs) <= {"train_drafter", "evaluate", "all", "step_timing",
                                                                   "speedup_timing", *REPORT_RULES}
    variants = planned_variants(edited)
    assert variants["train_drafter"] == dflash and variants["evaluate"] <= dflash, variants


def test_per_target_timing_times_each_drafter_once_for_every_timed_experiment(smoke_run, tmp_path):
    """timing.jobs per-target: one timing job for the target decodes the drafters of every experiment that claims
    SR, a drafter they share once; each experiment's timing file is that job's rows of the target alone and of its
    own drafters, and its SR comparisons are built from them."""
    from dpace.config import experiments
    from dpace.experiments import EXPERIMENT_SPECS
    from dpace.timing_records import AUTOREGRESSIVE

    workdir, _ = smoke_run
    copy = tmp_path / "run"
    shutil.copytree(workdir, copy, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    config = write_config(copy, **{"timing.jobs": "per-target"})
    timed = {name: {v.id for v in e.variants} for name, e in experiments(SMOKE).items()
             if EXPERIMENT_SPECS[name].times_speedup}
    union = set().union(*timed.values())
    assert len(union) < sum(map(len, timed.values()))  # the block-size sweep shares Table 1's drafters
    jobs = planned_jobs(snakemake(copy, config, "-n", "all"))
    assert jobs["speedup_timing"] == 1 and jobs["experiment_timing"] == len(timed), jobs
    result = snakemake(copy, config, "all")
    assert result.returncode == 0, result.stderr[-4000:]

    eval_dir = copy / "results" / "eval" / SMOKE["main_target"]
    shared = pd.read_csv(eval_dir / "timing-shared.csv")
    per_request = shared.groupby(["temperature", "id", "turn", "repeat"])["drafter"]
    assert per_request.apply(sorted).map(tuple).nunique() == 1  # every request decoded by the same decoders...
    assert sorted(per_request.get_group(next(iter(per_request.groups)))) == sorted({*union, AUTOREGRESSIVE})  # once
    for name, drafters in timed.items():
        rows = pd.read_csv(eval_dir / f"timing-{name}.csv")
        expected = shared[shared["drafter"].isin({*drafters, AUTOREGRESSIVE})]
        pd.testing.assert_frame_equal(rows, expected.reset_index(drop=True))
    comparisons = pd.read_csv(copy / "results" / "metrics" / "main_comparisons.csv")
    speedups = comparisons[(comparisons["metric"] == "speedup") & (comparisons["benchmark"] == "avg")]
    assert len(speedups) and speedups["value"].notna().all()
