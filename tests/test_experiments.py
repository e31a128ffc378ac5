"""One registry of the paper's tables and figures (dpace.experiments): every artifact in it has a renderer
and a Snakemake target, every table and figure function is in it, and Table 1's reference drafters are
chosen in one place for the rules and the renderers."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
import yaml
from workflow_runs import snakemake, write_config

from dpace.config import Variant, all_variants, with_schema_defaults
from dpace.experiments import ARTIFACTS, FIGURES, RENDERER_INPUTS, TABLES, reference_drafter
from dpace.fingerprint import script_modules
from dpace.paths import EVAL_SUMMARY, eval_location
from dpace.report import figures, tables
from dpace.report.render import render_artifact, renderer

RENDER_SCRIPT = Path(__file__).resolve().parents[1] / "workflow" / "scripts" / "render_artifact.py"


@pytest.mark.parametrize("name", ARTIFACTS)
def test_every_artifact_names_a_renderer_that_takes_its_inputs(name):
    """The record's renderer exists, is fingerprinted with the rendering job, and accepts what the record passes."""
    artifact = ARTIFACTS[name]
    assert artifact.module in script_modules(RENDER_SCRIPT)
    arguments = [a.rpartition("=") for a in artifact.arguments]
    assert all(source in RENDERER_INPUTS or source.startswith("reference:") for _, _, source in arguments)
    positional = [None] * sum(not keyword for keyword, _, _ in arguments)
    inspect.signature(renderer(name)).bind(*positional, **{k: None for k, _, _ in arguments if k})


def test_tables_come_before_figures():
    assert TABLES + FIGURES == list(ARTIFACTS)


def test_every_table_and_figure_function_is_a_registered_artifact():
    table_modules = [importlib.import_module(f"{tables.__name__}.{info.name}") for info in pkgutil.iter_modules(tables.__path__)]
    functions = [name for module in (*table_modules, figures) for name, member in inspect.getmembers(module, inspect.isfunction)
                 if re.match(r"(table|fig)_", name) and member.__module__ == module.__name__]
    assert sorted(functions) == sorted(ARTIFACTS)


def test_an_unknown_artifact_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"unknown artifact 'table_nothing'; valid: table_main, "):
        render_artifact("table_nothing", out=tmp_path / "x.tex")


def test_every_artifact_is_a_snakemake_target(tmp_path, mirror):
    """A dry run of `all` with the smoke config (every experiment) plans each registered file once, by
    render_table or render_figure."""
    result = snakemake(tmp_path, write_config(tmp_path), "-n", "all")
    text = result.stdout + result.stderr
    assert result.returncode == 0, text
    planned = set(re.findall(r"output: results/((?:table|fig)_\w+)\.(?:tex|pdf)", text))
    assert planned == set(ARTIFACTS)
    # Rule evaluate writes its summaries where the metrics parse them back from (EVAL_SUMMARY).
    summaries = re.findall(r"output: (results/eval/\S+/summary\.json)", text)
    variants = all_variants(with_schema_defaults(yaml.safe_load(write_config(tmp_path).read_text())))
    assert summaries and all(eval_location(path)[:2] in variants for path in summaries)


def test_an_evaluation_path_is_parsed_back_into_what_built_it():
    path = "/run/results/" + EVAL_SUMMARY.format(target="qwen3-4b", variant="dpace-alpha0.5-d3-b16-e6", epoch=6,
                                                 suite="full")
    assert eval_location(path) == ("qwen3-4b", "dpace-alpha0.5-d3-b16-e6", 6, "full")
    with pytest.raises(ValueError, match="is not an evaluation summary"):
        eval_location("/run/results/eval/qwen3-4b/autoregressive-baseline.jsonl")


def variant(objective: str, depth: int, block_size: int) -> Variant:
    return Variant(target="t", objective=objective, depth=depth, block_size=block_size, hparams=(),
                   normalization=None, epochs=1)


def test_the_reference_drafter_is_the_shallowest_for_the_rules_and_the_renderers():
    variants = [variant("dpace", 1, 8), variant("dflash", 3, 4), variant("dflash", 2, 16), variant("dflash", 2, 8)]
    assert reference_drafter(variants, "dflash").id == "dflash-d2-b8-e1"
    assert reference_drafter(variants, "dpace").id == "dpace-d1-b8-e1"
    # Metrics rows (report.ArtifactInputs.reference) pick the same drafter.
    rows = [{"variant": v.id, "objective": v.objective, "depth": v.depth, "block_size": v.block_size} for v in variants]
    assert reference_drafter(rows[::-1], "dflash")["variant"] == "dflash-d2-b8-e1"
    with pytest.raises(ValueError, match=r"no 'dpakl' drafter in experiment 'main'"):
        reference_drafter(variants, "dpakl")


def test_a_new_experiment_is_one_record_and_its_config_entry(monkeypatch, tmp_path):
    """docs/objectives.md's "Adding an experiment": a record, a schema entry and a config entry give the new
    experiment its drafters (shared with another experiment's where they train the same thing), its objectives'
    default from the schema, and the config's checks."""
    from dpace import experiments as registry
    from dpace.config import ConfigError, experiments, validate_config
    from dpace.experiments import ExperimentSpec, Request
    from dpace.schema import SCHEMA

    spec = ExperimentSpec("depth_sweep", lambda entry, config: [
        Request(objective, "experiments.depth_sweep.depths", depth=int(depth))
        for depth in entry["depths"] for objective in entry["objectives"]])
    monkeypatch.setitem(registry.EXPERIMENT_SPECS, "depth_sweep", spec)
    schema = yaml.safe_load(SCHEMA.read_text())
    schema["properties"]["experiments"]["properties"]["depth_sweep"] = {
        "type": "object", "additionalProperties": False, "required": ["depths"],
        "properties": {"depths": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}},
                       "objectives": {"type": "array", "items": {"type": "string"}, "default": ["dflash", "dpace"]}}}
    schema_path = tmp_path / "schema.yaml"
    schema_path.write_text(yaml.safe_dump(schema))

    config = with_schema_defaults(yaml.safe_load(write_config(tmp_path).read_text()))
    config["experiments"] = {"main": config["experiments"]["main"], "depth_sweep": {"depths": [1, 2]}}
    validate_config(config, schema_path)
    expanded = experiments(config)
    sweep = [(v.objective, v.depth) for v in expanded["depth_sweep"].variants]
    assert sweep == [("dflash", 1), ("dpace", 1), ("dflash", 2), ("dpace", 2)]
    main_ids = {v.id for v in expanded["main"].variants}
    depth = config["train"]["depth"]
    assert {v.id for v in expanded["depth_sweep"].variants if v.depth == depth} <= main_ids  # one training job each

    config["experiments"]["depth_sweep"] = {"depths": [1], "objectives": ["nothing"]}
    with pytest.raises(ConfigError, match="experiments.depth_sweep.depths: unknown objective 'nothing'"):
        experiments(config)
