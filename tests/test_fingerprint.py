"""Code fingerprints follow the import graph: an edit to any dpace module a job runs reruns the job,
and an edit to a module it does not run leaves it alone."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpace.fingerprint import module_path, script_fingerprint, script_modules

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "workflow" / "scripts").glob("*.py"))


def _module_name(path: Path) -> str:
    """dpace/report/tables/main.py -> dpace.report.tables.main; a package's __init__.py -> the package."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Every module and package of dpace, at any depth.
MODULES = sorted(_module_name(path) for path in (REPO / "dpace").rglob("*.py") if "__pycache__" not in path.parts)


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("pkg") / "dpace"
    shutil.copytree(REPO / "dpace", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_editing_a_module_changes_exactly_the_fingerprints_of_the_scripts_that_run_it(script, package_copy):
    runs = set(script_modules(script, package_copy))
    before = script_fingerprint(script, package_copy)
    for module in MODULES:
        path = module_path(module, package_copy)
        source = path.read_text()
        path.write_text(source + "\n# an edit\n")
        try:
            changed = script_fingerprint(script, package_copy) != before
        finally:
            path.write_text(source)
        assert changed == (module in runs), f"{script.name}: edit to {module} changed={changed}"


def _named_modules(script: Path) -> list[str]:
    """The dpace modules a script's import statements name (a docstring may mention others it never imports)."""
    return sorted(set(re.findall(r"(?m)^\s*(?:from|import)\s+(dpace(?:\.\w+)+)", script.read_text())))


# Third-party packages the scripts import, loaded once before the per-script forks so that each fork only
# imports dpace code; none of them imports dpace, so what a fork loads of dpace is what the script would.
SHARED_IMPORTS = ("torch", "transformers", "transformers.models.llama", "transformers.models.qwen3",
                  "transformers.models.auto", "specforge.modeling.draft.dflash", "dflash.model", "pandas",
                  "matplotlib.pyplot", "yaml", "jsonschema", "safetensors.torch")


@pytest.fixture(scope="module")
def loaded_by_script() -> dict[str, list[str]]:
    """Ground truth from the interpreter, one fresh fork per script: import what the script names (every
    branch) and list the dpace modules that got loaded."""
    plan = {script.name: _named_modules(script) for script in SCRIPTS}
    code = f"""
import importlib, json, os, sys
for name in {SHARED_IMPORTS!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
assert not any(m == "dpace" or m.startswith("dpace.") for m in sys.modules)
loaded = {{}}
for script, named in {plan!r}.items():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        for name in named:
            importlib.import_module(name)
        os.write(write, json.dumps(sorted(m for m in sys.modules if m == "dpace" or m.startswith("dpace."))).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        loaded[script] = json.loads(pipe.read())
    assert os.waitpid(pid, 0)[1] == 0, script
print(json.dumps(loaded))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_module_loaded_by_a_script_imports_is_in_its_fingerprint(script, loaded_by_script):
    """The old hand-written lists failed this for features (drafter), training (specforge_backend) and
    evaluation (sglang_backend)."""
    loaded = set(loaded_by_script[script.name])
    assert set(_named_modules(script)) <= loaded  # the fork imported what the script names
    assert loaded <= set(script_modules(script)), sorted(loaded - set(script_modules(script)))


def test_lazily_imported_backends_are_part_of_their_stage():
    """Imports inside functions count: the GPU backends are imported only when configured."""
    scripts = REPO / "workflow" / "scripts"
    assert not [m for m in script_modules(scripts / "features.py") if m.startswith("dpace.training")]  # down the DAG
    assert {"dpace.gpus", "dpace.responses.generation"} <= set(script_modules(scripts / "generate_responses.py"))
    assert "dpace.training.specforge_backend" in script_modules(scripts / "train_drafter.py")
    assert "dpace.evaluation.sglang_backend" in script_modules(scripts / "evaluate.py")
    assert "dpace.training.loop" not in script_modules(scripts / "render_artifact.py")
    # Generation's SGLang engine needs only the install check (dpace.gpus), none of the evaluation code.
    assert not [m for m in script_modules(scripts / "generate_responses.py") if m.startswith("dpace.evaluation")]


def test_nested_modules_and_the_packages_above_them_are_followed():
    """A module in a sub-package is found by its dotted name, and importing it runs every package's
    __init__.py above it: an edit to one of those reruns the job, an edit to a sibling package's does not."""
    render = REPO / "workflow" / "scripts" / "render_artifact.py"
    runs = set(script_modules(render))
    assert {"dpace", "dpace.report", "dpace.report.tables", "dpace.report.tables.main",
            "dpace.report.latex", "dpace.objective_records"} <= runs
    assert module_path("dpace.report.tables", REPO / "dpace") == REPO / "dpace" / "report" / "tables" / "__init__.py"
    assert module_path("dpace.report.tables.main", REPO / "dpace") == REPO / "dpace" / "report" / "tables" / "main.py"
    assert module_path("dpace.report.tables.main.table_main", REPO / "dpace") is None  # a function, not a module
    assert not {"dpace.evaluation", "dpace.responses", "dpace.training"} & runs  # the report never runs the loss


def test_collecting_metrics_does_not_run_the_table_or_figure_code():
    """The metrics and training CSVs (dpace.report.collect) are apart from rendering (dpace.report.render):
    an edit to a table or a figure reruns the renderers only."""
    scripts = REPO / "workflow" / "scripts"
    for script in ("experiment_metrics.py", "experiment_training.py"):
        runs = script_modules(scripts / script)
        assert not [m for m in runs if m.startswith("dpace.report.tables") or m in
                    {"dpace.report.figures", "dpace.report.latex", "dpace.report.render"}], (script, runs)


def test_every_rule_fingerprints_the_script_it_runs():
    rules = 0
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"(?m)^(?=rule )", smk.read_text()):
            script = re.search(r'script:\n\s+"\.\./scripts/([\w.]+)"', block)
            if not script:
                continue
            rules += 1
            fingerprints = re.findall(r'code=(?:lambda wildcards: )?script_fingerprint\("([\w.]+)"[,)]', block)
            assert fingerprints == [script.group(1)], f"{smk.name}: {block.split(':')[0]}"
    assert rules >= 12


def _snakemake(repo: Path, workdir: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-d", str(workdir),
               "--configfile", str(config), "--replace-workflow-config", "--cores", "2", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


def test_editing_a_module_features_imports_plans_features_again(tmp_path, mirror):
    """Through Snakemake: build the features, edit dpace/features.py or a module it imports: the features job is
    planned again; an edit to table rendering, or to the drafter of a later stage, plans nothing."""
    from workflow_runs import planned_jobs, write_config

    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns(".git", "results", ".snakemake", "__pycache__", "tests"))
    workdir = tmp_path / "work"
    workdir.mkdir()
    config = write_config(workdir)
    target = "results/features/tiny/sharegpt+codealpaca"
    built = _snakemake(repo, workdir, config, target)
    assert built.returncode == 0, built.stderr[-3000:]
    assert planned_jobs(_snakemake(repo, workdir, config, "-n", target)) == {}

    for module, planned in (("report/tables/main", {}), ("training/drafter", {}), ("features", {"features": 1}),
                            ("io", {"features": 1})):
        path = repo / "dpace" / f"{module}.py"
        source = path.read_text()
        path.write_text(source + "\n# an edit\n")
        try:
            jobs = planned_jobs(_snakemake(repo, workdir, config, "-n", target))
        finally:
            path.write_text(source)
        # io is imported by every stage, so everything upstream of the features reruns as well.
        assert (jobs.get("features", 0), bool(jobs)) == (planned.get("features", 0), bool(planned)), (module, jobs)



def test_training_fingerprints_cover_only_the_objective_they_train(package_copy):
    """Training's fingerprint covers the shared code of dpace.objective_records and dpace.training.objectives and its
    own objective's record and weight function: a new objective, or an edit to another one's formula or record,
    leaves it alone. The report reads the records, not the loss."""
    from workflow_runs import with_lindecay

    from dpace.objective_records import OBJECTIVES

    script = REPO / "workflow" / "scripts" / "train_drafter.py"
    report = REPO / "workflow" / "scripts" / "render_artifact.py"
    records_path, loss_path = package_copy / "objective_records.py", package_copy / "training" / "objectives.py"
    records, loss = records_path.read_text(), loss_path.read_text()

    def fingerprints(edited_records: str, edited_loss: str) -> dict[str, str]:
        records_path.write_text(edited_records)
        loss_path.write_text(edited_loss)
        try:
            prints = {o: script_fingerprint(script, package_copy, objective=o) for o in OBJECTIVES}
            if "lindecay" in edited_records:
                prints["lindecay"] = script_fingerprint(script, package_copy, objective="lindecay")
            return {**prints, "report": script_fingerprint(report, package_copy)}
        finally:
            records_path.write_text(records)
            loss_path.write_text(loss)

    before = fingerprints(records, loss)
    assert len(set(before.values())) == len(before)  # one fingerprint per objective

    def changed(edited_records: str = records, edited_loss: str = loss) -> set[str]:
        after = fingerprints(edited_records, edited_loss)
        return {name for name in before if after[name] != before[name]} | (set(after) - set(before))

    assert changed(*with_lindecay(records, loss)) == {"lindecay", "report"}
    dflash_formula = 'return torch.exp(-(positions - 1).clamp(min=0) / hparams["gamma"])'
    assert changed(edited_loss=loss.replace(dflash_formula, dflash_formula.replace('hparams["gamma"]',
                                                                                   '(2 * hparams["gamma"])'))) \
        == {"dflash"}
    # D-PACE's and D-PAKL's entries name the same weight function.
    full = 'return _dpace_weights(confidence, valid, hparams["alpha"], "full")'
    assert changed(edited_loss=loss.replace(full, full.replace('hparams["alpha"]', 'hparams["alpha"] / 2'))) \
        == {"dpace", "dpakl"}
    # A record's own fields are its code too; the code every objective shares reruns every drafter.
    assert changed(records.replace('aliases=("dpace-cumulative-confidence-only",), ', "")) \
        == {"dpace-cumulative", "report"}
    assert changed(edited_loss=loss.replace('"dpakl": _dpace_full_weights', '"dpakl": _dpace_cumulative_weights')) \
        == {"dpakl"}
    shared = "smoothed = (1.0 - alpha) * confidence + alpha"
    assert changed(edited_loss=loss.replace(shared, "smoothed = (1.0 - alpha) * confidence + alpha * 1.0")) \
        == set(before) - {"report"}
    shared_record = 'if "k" in resolved:'
    assert changed(records.replace(shared_record, 'if "k" in resolved.keys():')) == set(before)
    # A comment is not code: it reruns nothing that is fingerprinted per objective.
    assert changed(records.replace("# Views of the registry", "# Views (all of them) of the registry")) == {"report"}


def test_a_weight_function_that_calls_another_objectives_owns_it_too():
    from dpace.fingerprint import objective_sources

    source = """
def _helper(x):
    return x


def _a_weights(x):
    return _helper(x)


def _b_weights(x):
    return 2 * _a_weights(x)


REGISTRY = (Objective("a", "A", {}, "weight", _a_weights), Objective("b", "B", {}, "weight", weights=_b_weights))
"""
    shared, own = objective_sources(source)
    edited_a = objective_sources(source.replace("return _helper(x)", "return _helper(x) + 1"))
    assert edited_a[0] == shared and edited_a[1]["a"] != own["a"] and edited_a[1]["b"] != own["b"]
    edited_b = objective_sources(source.replace("return 2 * _a_weights(x)", "return 3 * _a_weights(x)"))
    assert edited_b[0] == shared and edited_b[1]["a"] == own["a"] and edited_b[1]["b"] != own["b"]
    edited_helper = objective_sources(source.replace("    return x\n", "    return -x\n"))
    assert edited_helper[0] != shared


@pytest.mark.parametrize("package", ["torch", "transformers", "specforge", "dflash", "sglang"])
def test_an_upgrade_of_a_package_that_shapes_the_numbers_changes_the_fingerprints_of_the_jobs_that_run_it(
        package, monkeypatch):
    """Issue 56, item 6: a job made with torch 2.x is not kept once torch is 2.y (nor transformers, specforge,
    dflash, sglang); a job that never imports the package (the data and report jobs) keeps its fingerprint."""
    from importlib import metadata

    scripts = {name: REPO / "workflow" / "scripts" / name for name in ("train_drafter.py", "evaluate.py",
                                                                      "benchmark_prompts.py", "render_artifact.py")}
    before = {name: script_fingerprint(path) for name, path in scripts.items()}
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "99.0" if name == package else real(name))
    after = {name: script_fingerprint(path) for name, path in scripts.items()}
    assert after["train_drafter.py"] != before["train_drafter.py"]
    assert after["evaluate.py"] != before["evaluate.py"]
    assert after["benchmark_prompts.py"] == before["benchmark_prompts.py"]
    assert after["render_artifact.py"] == before["render_artifact.py"]
