"""One home for each default and enum: the config schema. TrainConfig is built from the train section
with the schema's defaults, a new training knob is a schema key and a TrainConfig field only, a training
job's cache key moves with exactly the knobs it trains with, and Python's enum lists are the schema's."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

import dpace.config as config_module
import dpace.schema as schema_module
import dpace.training.train_config as train_config_module
from dpace.config import all_variants, validate_config
from dpace.data import BENCHMARKS, TRAIN_SETS
from dpace.schema import load_schema, schema_defaults, schema_enum
from dpace.training.objectives import NORMALIZATIONS
from dpace.training.train_config import (
    VARIANT_FIELDS,
    WORKFLOW_KEYS,
    TrainConfig,
    check_train_config,
    train_knobs,
)

REPO = Path(__file__).resolve().parents[1]
TRAIN_SCHEMA = load_schema()["properties"]["train"]
# TrainConfig fields that are no key of the train section: what one job knows (the target's mask token id,
# its threads and device) and what the variant names (its objective and, optionally, denominator).
JOB_FIELDS = {"objective", "normalization", "mask_token_id", "threads", "device"}


def smoke_config() -> dict:
    config = yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())
    validate_config(config)
    return config


def other_value(name: str, value, spec: dict):
    """A valid value of train-section key ``name`` other than ``value``."""
    if "enum" in spec:
        return next(option for option in spec["enum"] if option != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.1
    return value + "-other"


def test_every_training_knob_has_its_default_in_the_schema_only():
    properties, required = TRAIN_SCHEMA["properties"], set(TRAIN_SCHEMA["required"])
    field_defaults = {f.name: f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                      for f in dataclasses.fields(TrainConfig)}
    # Every key of the section reaches TrainConfig, but those the workflow resolves itself ...
    assert set(properties) - set(field_defaults) == set(WORKFLOW_KEYS) - {"seed"}
    # ... and every field is a key of the section, or the job's or the variant's own.
    assert set(field_defaults) - set(properties) == JOB_FIELDS
    # No field that the section sets keeps a default of its own (objective_hparams: the variant's, {} if none).
    assert [name for name, has_default in field_defaults.items()
            if has_default and name in properties and name != "objective_hparams"] == []
    # Each optional key of the section has its default in the schema (objective_hparams: per objective, none).
    assert [name for name in properties
            if name not in required and "default" not in properties[name] and name != "objective_hparams"] == []
    assert set(VARIANT_FIELDS) <= set(field_defaults)
    assert set(all_variants(smoke_config()).popitem()[1].train_settings()) == set(VARIANT_FIELDS)


def test_train_config_takes_every_knob_and_its_defaults_from_the_train_section():
    config = smoke_config()
    variant = next(iter(all_variants(config).values()))
    built = TrainConfig.from_config(config["train"], **variant.train_settings(), seed=0)
    for name, value in train_knobs(config["train"]).items():
        assert getattr(built, name) == value, name
    # Knobs the smoke config does not set are the schema's defaults (the SmolLM2 mask token, AdamW's settings).
    bare = TrainConfig.from_config({}, objective="dflash", depth=1, block_size=4, num_anchors=8, epochs=1,
                                   micro_batch_size=2, grad_accumulation=2, seed=0)
    defaults = schema_defaults("train")
    assert {name: getattr(bare, name) for name in train_knobs({})} == {
        name: defaults[name] for name in train_knobs({})}
    for name, value in train_knobs(config["train"]).items():  # each knob of the section reaches its field
        changed = TrainConfig.from_config({**config["train"], name: other_value(name, value, TRAIN_SCHEMA["properties"][name])},
                                          **variant.train_settings(), seed=0)
        assert getattr(changed, name) != value, name
    with pytest.raises(TypeError, match="depth"):  # a knob without a default must be given
        TrainConfig.from_config({}, objective="dflash", block_size=4, num_anchors=8, epochs=1,
                                micro_batch_size=2, grad_accumulation=2, seed=0)


def test_a_training_jobs_cache_key_moves_with_the_knobs_it_trains_with_only():
    """The rule train_drafter's params: train_knobs of the section, the variant's settings and its seed."""
    config = smoke_config()

    def keys(config: dict) -> dict:
        return {key: (train_knobs(config["train"]), v.train_settings(), v.seed(config["seed"]))
                for key, v in all_variants(config).items()}

    before = keys(config)
    for name, value in train_knobs(config["train"]).items():
        changed = copy.deepcopy(config)
        changed["train"][name] = other_value(name, value, TRAIN_SCHEMA["properties"][name])
        after = keys(changed)
        assert all(after[key] != before[key] for key in before), f"train.{name} leaves a drafter's cache key"
    # Another objective's hyperparameters, or a second seed, leave the existing drafters' keys alone.
    changed = copy.deepcopy(config)
    changed["train"]["objective_hparams"]["topk-prefix"]["k"] = 4
    changed["train"]["seeds"] = 2
    after = keys(changed)
    untouched = [key for key, v in all_variants(config).items() if v.objective != "topk-prefix"]
    assert untouched and all(after[key] == before[key] for key in untouched)
    rules = (REPO / "workflow" / "rules" / "train.smk").read_text().split("\nrule ")
    train_rule = next(rule for rule in rules if rule.startswith("train_drafter:"))
    assert train_rule.count('train=train_knobs(config["train"])') == 1


def test_a_new_training_knob_is_a_schema_key_and_a_train_config_field_only(monkeypatch):
    schema = copy.deepcopy(load_schema())
    schema["properties"]["train"]["properties"]["new_knob"] = {"type": "integer", "minimum": 0, "default": 5}
    for module in (schema_module, config_module, train_config_module):
        monkeypatch.setattr(module, "load_schema", lambda *args: schema)

    @dataclasses.dataclass(kw_only=True)
    class WithNewKnob(TrainConfig):
        new_knob: int

    monkeypatch.setattr(train_config_module, "TrainConfig", WithNewKnob)
    config = smoke_config()
    assert config["train"]["new_knob"] == 5  # the schema's default fills the config
    assert train_knobs(config["train"])["new_knob"] == 5  # the rule's params carry it
    settings = next(iter(all_variants(config).values())).train_settings()
    assert WithNewKnob.from_config({**config["train"], "new_knob": 7}, **settings, seed=0).new_knob == 7
    with pytest.raises(ValueError, match=r"new_knob -1: -1 is less than the minimum of 0"):
        check_train_config(WithNewKnob.from_config({**config["train"], "new_knob": -1}, **settings, seed=0))


def test_python_enum_lists_are_the_schemas():
    data = load_schema()["properties"]["data"]["properties"]
    # One list each in the schema (prompts_per_benchmark and train_prompts name theirs by YAML anchors) ...
    assert data["prompts_per_benchmark"]["oneOf"][1]["propertyNames"]["enum"] is data["benchmarks"]["items"]["enum"]
    assert data["train_prompts"]["oneOf"][1]["propertyNames"]["enum"] is data["train_set"]["oneOf"][0]["enum"]
    # ... and it is what the package loads.
    assert sorted(data["benchmarks"]["items"]["enum"]) == sorted(BENCHMARKS)

    assert sorted(data["train_set"]["oneOf"][0]["enum"]) == sorted(TRAIN_SETS)
    modes = load_schema()["properties"]["experiments"]["properties"]["normalization"]["properties"]["modes"]
    assert tuple(modes["items"]["enum"]) == tuple(modes["default"]) == NORMALIZATIONS
    from dpace.responses.generation import BACKENDS
    from dpace.training.loop import PRECISIONS

    assert set(schema_enum("train", "precision")) == {*PRECISIONS, "auto"}  # autocast's dtype of each
    assert set(schema_enum("responses", "backend")) == set(BACKENDS)  # the function that answers with each
    # the evaluation branches on the schema's own lists (dpace.evaluation.eval_config), under the schema's names
    from dpace.evaluation import decoding, eval_records, evaluate

    assert decoding.VERIFICATIONS == schema_enum("eval", "verification")
    assert decoding.DECODE_CLOCKS == schema_enum("eval", "decode_clock")
    assert eval_records.TAU_COUNTS == schema_enum("eval", "tau_counts")
    assert evaluate.TAU_SOURCES == schema_enum("eval", "tau")
    assert evaluate.GREEDY_TIE_MARGIN == schema_defaults("eval")["greedy_tie_margin"]


def test_train_config_enums_are_checked_against_the_schema():
    config = TrainConfig.from_config({}, objective="dflash", depth=1, block_size=4, num_anchors=8, epochs=1,
                                     micro_batch_size=2, grad_accumulation=2, seed=0)
    check_train_config(config)
    for name in ("precision", "attention_backend", "drafter_init", "feature_scaling"):
        valid = ", ".join(schema_enum("train", name))
        with pytest.raises(ValueError, match=rf"^{name} 'nonsense'; valid: {valid}$"):
            check_train_config(dataclasses.replace(config, **{name: "nonsense"}))


def test_random_targets_take_logit_scale_from_the_schema(monkeypatch):
    from dpace.targets import _random_model

    assert schema_defaults("targets", "*") == {"logit_scale": 8.0, "trust_remote_code": False}
    spec = {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}
    default = _random_model(64, spec, 0).lm_head.weight
    explicit = _random_model(64, {**spec, "logit_scale": 8.0}, 0).lm_head.weight
    assert default.equal(explicit)
    schema = copy.deepcopy(load_schema())
    schema["properties"]["targets"]["additionalProperties"]["properties"]["logit_scale"]["default"] = 2.0
    for module in (schema_module, config_module):
        monkeypatch.setattr(module, "load_schema", lambda *args: schema)
    assert _random_model(64, spec, 0).lm_head.weight.mul(4).allclose(default)
    config = smoke_config()
    assert config["targets"]["tiny"]["logit_scale"] == 2.0 and config["targets"]["tiny"]["trust_remote_code"] is False


def test_experiments_take_their_default_objectives_from_the_schema(monkeypatch):
    from dpace.config import experiments

    config = yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())  # not validated
    config["experiments"]["extras"] = {}
    assert [v.objective for v in experiments(config)["extras"].variants] == ["dflash", "dpace", "dpakl", "pard2-cat"]
    assert "objectives" not in config["experiments"]["extras"]  # the caller's config is left as it was
    schema = copy.deepcopy(load_schema())
    schema["properties"]["experiments"]["properties"]["extras"]["properties"]["objectives"]["default"] = ["dflash", "dpakl"]
    monkeypatch.setattr(config_module, "load_schema", lambda *args: schema)
    assert [v.objective for v in experiments(config)["extras"].variants] == ["dflash", "dpakl"]
